"""The benchmark's run store: every unit's training, the instance records (target, smoothness), keyed by config.

Papers: experience-replay (docs/REFERENCES.md), Sec. 3, Thm 3.4, Thm 3.5 / App. C.3; McCandlish et al. 2018
(arXiv 1812.06162), Eq. 2.7; the forgetting-aware rule of ``theory/forgetting.py`` (docs/THEORY.md, "Forgetting").
Protocol: docs/SIMULATION.md, 'Does a design rule predict?'.

| code name | symbol | meaning |
|---|---|---|
| ``_key`` | -- | hash of a config and the code version |
| ``instance_record`` | J_0, J*, L | start and optimum objective, the target between them, smoothness |
"""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np

from ...simulate.envs import ENVIRONMENTS, BanditEnv, make_env
from ...simulate.envs.quadratic import QuadraticEnv
from ...simulate.store import RunStore, run_key
from .options import TARGET_FRACTION, Setting

# --------------------------------------------------------------------------- saved runs (resume)


Store = RunStore
"""OUT/runs/KEY.json, one file per training run or measurement: the sweep's store (``simulate.store.RunStore``:
config and code version in every file, never overwritten, safe under parallel workers). ``run_theory_test``
computes the runs units share before it dispatches them, so its parallel safety is a safety net, not the plan."""
_key = run_key
"""A run's key: hash of its config and the code version."""


# --------------------------------------------------------------------------- one unit: (setting, optimizer, instance)


Env = BanditEnv | QuadraticEnv
"""The settings' environments (the noisy-reward bandit is a BanditEnv)."""


def build_env(setting: Setting, instance: int) -> Env:
    """The setting's environment at ``instance`` (the quadratic's noise and the bandit's features from it; a noisy
    verifier's stream too, where its config has a ``noise_seed``)."""
    config = dict(setting.env_config, instance_seed=instance)
    if any(f.name == "noise_seed" for f in fields(ENVIRONMENTS[setting.env].config)):
        config["noise_seed"] = instance
    return make_env(setting.env, **config)


def exact_hessian(env, theta: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """H of the loss F = -J at theta (1, d), by central differences of the exact gradient, symmetrised."""
    d = theta.shape[1]
    g = env.exact_grad(np.concatenate([theta + h * np.eye(d), theta - h * np.eye(d)]))  # (2d, d) ascent
    hess = -(g[:d] - g[d:]) / (2 * h)
    return (hess + hess.T) / 2


def instance_record(store: Store, setting: Setting, instance: int) -> tuple[Env, dict]:
    """J*, J0, target and smoothness L of the instance (exact; the bandit's J* by noise-free ascent)."""
    env = build_env(setting, instance)
    payload = {"kind": "instance", "setting": asdict(setting), "instance": instance,
               "target_fraction": TARGET_FRACTION}
    found = store.get(payload)
    if found is not None:
        return env, found
    if isinstance(env, QuadraticEnv):
        result = {"j0": env.j0, "j_star": env.j_star, "target": env.target, "smoothness": env.smoothness}
    else:
        j_star, theta_star = env.sup_reward()
        j0 = float(env.evaluate(env.init_params(1))["reward"][0])
        points = [env.init_params(1)] + [theta_star * f for f in (0.25, 0.5, 0.75, 1.0)]
        smoothness = max(float(np.max(np.abs(np.linalg.eigvalsh(exact_hessian(env, p))))) for p in points)
        result = {"j0": j0, "j_star": j_star, "target": j0 + TARGET_FRACTION * (j_star - j0), "smoothness": smoothness}
    return env, store.put(payload, result)
