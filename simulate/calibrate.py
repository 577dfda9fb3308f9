"""Measure the theory's inputs on the simulator: the noise profile sigma^2(s) and the correlation rho.

Paper: experience-replay (docs/REFERENCES.md), Assumption 3.3:
E||eps_{t,i}||^2 <= sigma^2(t - t_i) and corr(eps_{t,i}, eps_{t,j}) <= rho |t_i - t_j| / N,
with eps_{t,i} = G(theta_t, z_i) - grad F(theta_t) the per-sample gradient noise.

| code name            | paper symbol        | how it is measured here                                              |
|----------------------|---------------------|----------------------------------------------------------------------|
| ``per_sample_grads`` | G(theta_t, z)       | the loss's gradient on one response (its own batch of one)          |
| ``reference_grad``   | grad F(theta_t)     | mean per-sample gradient over many FRESH responses of pi_t          |
| ``sigma_sq[s]``      | sigma^2(s)          | mean ||G(theta_t, z) - grad F||^2 over z ~ pi_{t-s}                  |
| ``rho``              | rho                 | slope of pairwise noise correlation vs |t_i - t_j| / N in the buffer |

The probe is an ordinary run (``engine.run``) of the given config; at a few
checkpoint steps an observer regenerates responses from the stored policies
pi_{t-s} and measures the noise of the same loss the run trains with. The
fresh-sample variance sigma^2(0) is not zero (unlike the pure power law, see
docs/ERRATA.md E8), so two fits are reported: the pure power law
c s^(2 alpha) on s >= 1, and sigma0^2 (1 + (s/tau)^(2 alpha)) with a floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.designs import compute_loss
from replay_theory.simulate.engine import run
from replay_theory.simulate.pipeline import EnvBackend, generate
from replay_theory.simulate.rng import PerSeedGenerator
from replay_theory.simulate.rollouts import RolloutBatch

DEFAULT_STALENESS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass
class Calibration:
    staleness: np.ndarray  # (K,)
    sigma_sq: np.ndarray  # (K,) mean over seeds and checkpoints
    sigma_sq_per_seed: np.ndarray  # (S, K)
    rho: float
    correlation_by_gap: dict[int, float]
    kl_drift_per_step: float  # exact KL(pi_t || pi_{t-1}) averaged over checkpoints and seeds
    fits: dict = field(default_factory=dict)

    def profile_dict(self, source: str) -> dict:
        """The profile file `replay-theory optimal --profile` reads (measured table + fits)."""
        return {
            "kind": "table",
            "staleness": [float(s) for s in self.staleness],
            "sigma_sq": [float(v) for v in self.sigma_sq],
            "rho": float(self.rho),
            "fits": self.fits,
            "kl_drift_per_step": self.kl_drift_per_step,
            "correlation_by_gap": {str(k): v for k, v in self.correlation_by_gap.items()},
            "source": source,
        }


def _flatten(batch: RolloutBatch) -> RolloutBatch:
    """(S, M, ...) -> (S*M, 1, ...): every response becomes its own batch of one."""
    return RolloutBatch(**{f.name: _one(getattr(batch, f.name)) for f in fields(RolloutBatch)})


def _one(array: np.ndarray) -> np.ndarray:
    return array.reshape(array.shape[0] * array.shape[1], 1, *array.shape[2:])


def per_sample_grads(env, config: SimConfig, params: np.ndarray, batch: RolloutBatch) -> np.ndarray:
    """G(theta, z_i) for every response: (S, M, d), the loss gradient on a batch of one."""
    S, M = batch.prompt.shape
    flat = _flatten(batch)
    flat_params = np.repeat(params, M, axis=0)  # (S*M, d)
    logp_new = env.logp(flat_params, flat.prompt, flat.tokens, flat.mask)  # (S*M, 1, L)
    out = compute_loss(config, flat, logp_new)
    grads = env.grad_logp_contract(flat_params, flat.prompt, flat.tokens, flat.mask, out.grad_logp)  # (S*M, d)
    return grads.reshape(S, M, -1)


def calibrate(config: SimConfig, staleness: tuple[int, ...] = DEFAULT_STALENESS, checkpoints: int = 3,
              samples: int = 256) -> Calibration:
    """Run the probe ``config`` and measure sigma^2(s), rho and the KL drift rate at ``checkpoints`` steps."""
    config = config.validated()
    G = config.group_size
    if samples % G:
        raise ValueError(f"samples must be a multiple of group_size = {G}, got {samples}")
    max_s = max(staleness)
    if config.steps <= max_s + 1:
        raise ValueError(f"steps must exceed the largest staleness probed + 1 = {max_s + 1}, got {config.steps}")
    first = max_s + 1
    checkpoint_steps = set(np.linspace(first, config.steps - 1, checkpoints).astype(int).tolist())
    rng = PerSeedGenerator(config.seed + 7919, config.seeds)  # the probe's own stream: the run is unchanged
    sums = np.zeros((config.seeds, len(staleness)))
    corr_sum: dict[int, float] = {}
    corr_n: dict[int, int] = {}
    drift = []

    def observer(step, params, history, buffer, env):
        if step not in checkpoint_steps:
            return
        theta = history[-1]  # (S, d): the parameters after this step's update
        backend = EnvBackend(env, rng)  # the probe's own stream
        fresh = generate(backend, config, theta, samples // G, step, 0, rng)
        reference = per_sample_grads(env, config, theta, fresh).mean(axis=1)  # (S, d) ~ grad F(theta_t)
        for k, s in enumerate(staleness):
            behav = history[-1 - s]  # pi_{t-s}
            batch = fresh if s == 0 else generate(backend, config, behav, samples // G, step - s, 0, rng)
            noise = per_sample_grads(env, config, theta, batch) - reference[:, None, :]  # (S, M, d)
            sums[:, k] += (noise**2).sum(axis=-1).mean(axis=1)  # Assumption 3.3: E||eps||^2
        drift.append(env.exact_divergences(history[-1], history[-2])["kl_new_behav"].mean())
        if (buffer is not None and hasattr(buffer, "valid")
                and config.buffer in ("fifo", "positive-bias", "prioritized")):
            _buffer_correlations(env, config, theta, reference, buffer, corr_sum, corr_n)

    run(config, observer=observer)
    n_checkpoints = len(checkpoint_steps)
    per_seed = sums / n_checkpoints  # (S, K)
    sigma_sq = per_seed.mean(axis=0)  # (K,)
    by_gap = {gap: corr_sum[gap] / corr_n[gap] for gap in sorted(corr_sum)}
    rho = fit_rho(by_gap, config.capacity)
    calibration = Calibration(np.asarray(staleness, float), sigma_sq, per_seed, rho, by_gap,
                              float(np.mean(drift)) if drift else math.nan)
    calibration.fits = fit_profiles(calibration.staleness, sigma_sq)
    return calibration


def _buffer_correlations(env, config, theta, reference, buffer, corr_sum, corr_n) -> None:
    """Mean correlation of noise vectors of buffer items, grouped by the gap |t_i - t_j| in steps."""
    S, C = buffer.valid.shape
    slots = np.broadcast_to(np.arange(C), (S, C))
    batch = buffer._take(slots)  # (S, C, ...) every slot; invalid ones are masked out below
    noise = per_sample_grads(env, config, theta, batch) - reference[:, None, :]  # (S, C, d)
    unit = noise / np.maximum(np.linalg.norm(noise, axis=-1, keepdims=True), 1e-300)
    cos = np.einsum("scd,sed->sce", unit, unit)  # (S, C, C)
    created = batch.created  # (S, C)
    gap = np.abs(created[:, :, None] - created[:, None, :])  # (S, C, C)
    valid = buffer.valid[:, :, None] & buffer.valid[:, None, :] & ~np.eye(C, dtype=bool)[None]
    for g in np.unique(gap[valid]):
        sel = valid & (gap == g)
        corr_sum[int(g)] = corr_sum.get(int(g), 0.0) + float(cos[sel].sum())
        corr_n[int(g)] = corr_n.get(int(g), 0) + int(sel.sum())


def fit_rho(correlation_by_gap: dict[int, float], capacity: int) -> float:
    """rho from corr(eps_i, eps_j) = rho |t_i - t_j| / N (Assumption 3.3): least squares through 0.

    As in App. C.2 the gap is in steps and N in responses (so gamma-bar(H) <= rho / R).
    Clamped to [0, 1], the range the assumption allows.
    """
    gaps = np.array([g for g in correlation_by_gap if g > 0], float)
    if gaps.size == 0:
        return 0.0
    corr = np.array([correlation_by_gap[int(g)] for g in gaps])
    x = gaps / capacity
    slope = float((x * corr).sum() / (x * x).sum())
    return float(min(1.0, max(0.0, slope)))


def fit_profiles(staleness: np.ndarray, sigma_sq: np.ndarray) -> dict:
    """Fit the pure power law (s >= 1) and the floor profile sigma0^2 (1 + (s/tau)^(2 alpha))."""
    from scipy.optimize import curve_fit

    fits: dict = {}
    pos = staleness >= 1
    if pos.sum() >= 2:
        slope, intercept = np.polyfit(np.log(staleness[pos]), np.log(sigma_sq[pos]), 1)
        fits["power_law"] = {"kind": "power_law", "alpha": float(max(slope / 2, 0.0)), "tau": 1.0,
                             "scale": float(math.exp(intercept)), "floor": 0.0}
    sigma0 = float(sigma_sq[staleness == 0][0]) if np.any(staleness == 0) else float(sigma_sq.min())

    def floor_model(s, alpha, tau):
        return sigma0 * (1.0 + (s / tau) ** (2 * alpha))

    try:
        (alpha, tau), _ = curve_fit(floor_model, staleness, sigma_sq, p0=(0.5, 10.0),
                                    bounds=([0.0, 1e-3], [3.0, 1e6]), maxfev=20000)
        fits["floor_power_law"] = {"kind": "power_law", "alpha": float(alpha), "tau": float(tau),
                                   "scale": sigma0, "floor": 1.0}
    except (RuntimeError, ValueError):
        pass
    return fits
