"""The rule's inputs as the benchmark measures them: per-sample gradients, the pilot's length, B_crit from its HVPs,
kappa from its curvature pairs, the policy's drift and sigma^2(s) by age, and the noise scale fitted to steps.

Papers: McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7-2.8 and App. D; the forgetting-aware rule's kappa
(``theory/forgetting.py``, docs/THEORY.md "Forgetting"); M2PO's M2 for the drift. ``measure.py`` runs them on a unit
(``measure_pilot``, ``measure_noise_scale``); these functions read arrays and an environment, not a unit.

| code name | symbol | meaning |
|---|---|---|
| ``b_crit`` | B_crit | tr(D H D Sigma) / (G^T D H D G), the noise scale that counts curvature |
| ``kappa`` | eta lambda_eff | the optimizer's memory at the pilot (1/kappa steps) |
| ``m2`` | M2(s) | E_behav[(log pi_T / pi_{T-s})^2], the staleness cost at age s |
| ``b_noise`` | B_noise | S(B) = S_min (1 + B_noise / B) fitted to steps |
"""

from __future__ import annotations

import math

import numpy as np

from ...core.designs import compute_loss
from ...core.pipeline import score
from ...simulate.config import config_from_dict
from ...simulate.envs.quadratic import QuadraticEnv
from ...theory import forgetting
from .options import (
    BATCH,
    BETA1,
    CURVATURE_EVERY,
    FORWARD_SAMPLE_UPDATES,
    GROUP,
    HVP_SAMPLE_UPDATES,
    HVP_SAMPLES,
    PILOT_FRACTION,
    RESCORE_SAMPLES,
    RESCORE_STEPS,
    STALENESS,
    Setting,
)
from .store import exact_hessian


def sample_grads(env, setting: Setting, theta: np.ndarray, behaviour: np.ndarray, groups: int,
                 rng: np.random.Generator) -> np.ndarray:
    """Per-sample LOSS gradients (M, d) at ``theta`` (1, d) on M = groups x 8 fresh responses of ``behaviour``
    (rollout settings: the trained loss's per-sample terms, whose batch mean is a step's gradient), or M noisy
    quadratic samples (behaviour ignored: a sample's noise does not depend on who drew it)."""
    if isinstance(env, QuadraticEnv):
        return env.sample_grads(theta, env.noise(rng, (1, groups * GROUP)))[0]
    assert setting.loss is not None  # only the quadratic's settings have no loss, and it returned above
    config = config_from_dict({"buffer": "on-policy", "pipeline": "sync", "capacity": BATCH,
                               "rollouts_per_step": BATCH, "batch_size": BATCH, "group_size": GROUP,
                               "loss": setting.loss[0], "advantage": setting.loss[1], "optimizer": "sgd", "seeds": 1})
    prompts = np.repeat(rng.integers(0, env.num_prompts, size=(1, groups)), GROUP, axis=1)  # (1, M)
    tokens, logp, mask = env.sample(behaviour, prompts, rng)
    reward = env.reward(prompts, tokens, mask)
    M = prompts.shape[1]
    batch = score(config, prompts, tokens, mask, logp, reward, np.zeros((1, M), np.int64),
                  np.repeat(np.arange(groups), GROUP)[None])
    logp_new = env.logp(theta, prompts, tokens, mask)
    coef = compute_loss(config, batch, logp_new).grad_logp[0, :, 0] * M  # (M,) undo the 1/M token mean
    pi = np.exp(env.log_policy(theta))[0, prompts[0]]  # (M, A)
    feats = env.features[prompts[0]]  # (M, A, d)
    centred = feats[np.arange(M), tokens[0, :, 0]] - np.einsum("ma,mad->md", pi, feats)
    return coef[:, None] * centred  # (M, d) d loss / d theta per sample


def zero_share_of_grads(grads: np.ndarray, group_size: int = GROUP) -> float:
    """z [E8] of one batch: the share of its groups (``group_size`` consecutive rows of ``grads`` (M, d), as
    ``sample_grads`` draws them) whose every per-sample gradient is exactly 0. A group of equal rewards has a zero
    advantage, and the simulator's rewards (0 or 1 on the bandits) make it exactly 0; a group whose rewards differ has
    a nonzero gradient on some row (TRL's float32 logs need a tolerance instead: diagnose/calibrate_log.py)."""
    rows = np.asarray(grads)
    return float(np.mean(np.all(rows.reshape(rows.shape[0] // group_size, -1) == 0, axis=1)))


def pilot_steps(recipe_steps: float) -> int:
    """The pilot's length in steps: the most P whose steps, curvature steps and drift re-scorings fit in PILOT_FRACTION
    of the recipe's steps to the target, each curvature step counted as one more step (its three HVPs over 64 samples
    cost 384 sample-updates, one step of B = 256 at mu = 0.5 and less than one at any larger mu) and the two
    re-scorings (the pilot's own drift table and the logged run's, ``measure_drift``) as RESCORE_STEPS; one step when
    not even that fits (a run that reaches the target in under 25 steps: that pilot is not affordable at low mu,
    ``pilot_affordable``, which counts every part exactly)."""
    budget = int(PILOT_FRACTION * recipe_steps)
    fits = [p for p in range(1, budget + 1) if p + -(-p // CURVATURE_EVERY) + RESCORE_STEPS <= budget]
    return max(fits, default=1)


def pilot_compute(pilot: dict, mu: float, floor: float) -> float:
    """The pilot's compute in the cost model's unit: its steps of on-policy at B = 256 plus its HVPs
    (``HVP_SAMPLE_UPDATES`` x ``HVP_SAMPLES`` each), for its one run, and its drift table's re-scoring
    (``rescore_compute``)."""
    steps_and_hvps = (pilot["steps"] * forgetting.step_cost(BATCH, BATCH, mu, floor)
                      + pilot["hvps"] * HVP_SAMPLE_UPDATES * HVP_SAMPLES) * pilot.get("runs", 1)
    return steps_and_hvps + rescore_compute(pilot.get("drift"))


def rescore_compute(drift: dict | None) -> float:
    """One drift table's re-scoring (``measure_drift``): ``rescored`` forward passes (RESCORE_SAMPLES rollouts at each
    age s > 0, per run), FORWARD_SAMPLE_UPDATES each, in the cost model's unit; 0 without a table (the quadratic, a
    one-step run) and for a table read exactly before the re-scoring was simulated (no ``rescored``: the pilot's
    table was then not counted, and those readings are reproduced as they were)."""
    return float((drift or {}).get("rescored", 0)) * FORWARD_SAMPLE_UPDATES


def log_compute(pilot: dict) -> float:
    """The re-scoring that reads the drift table off the user's logged run (``measure.measure_recipe_log``): one
    forward pass over RESCORE_SAMPLES of the rollouts of each age s > 0 at the run's last policy, in the cost model's
    unit (FORWARD_SAMPLE_UPDATES each); 0 without a table (the quadratic, a record from before it). Spent once,
    whether or not the user runs the pilot."""
    drift = (pilot.get("recipe_log") or {}).get("drift") or {}
    return max(len(drift.get("staleness", [])) - 1, 0) * RESCORE_SAMPLES * FORWARD_SAMPLE_UPDATES


def drift_staleness(pilot: dict, piloted: bool) -> forgetting.Staleness:
    """The staleness cost r(s) = 1 + M2(s) the printed answer is priced at: the drift over the user's logged run
    (its last policy against each age's, ages up to the run's length), and where the pilot ran (``piloted``) and
    measured an age too, the larger of the two there (the pilot reads the drift early in the run, where the policy
    moves fastest). The quadratic has no policy (``NO_POLICY``: no cost at any age); a table with no age > 0 (a
    one-step pilot, no log's table) measures nothing beyond age 0 (``NO_STALENESS``)."""
    own = pilot.get("drift")
    if own is None and "m2" not in ((pilot.get("recipe_log") or {}).get("drift") or {}):
        return forgetting.NO_POLICY  # the quadratic: no policy, a stored sample's cost is known at every age
    early = (forgetting.staleness_of_drift(own["staleness"], own["m2"], "1 + M2(s) on the pilot")
             if piloted and own is not None and len(own["staleness"]) >= 2 else None)
    log = (pilot.get("recipe_log") or {}).get("drift")
    if log is None or len(log["staleness"]) < 2:
        return early or forgetting.NO_STALENESS
    logged = forgetting.staleness_of_drift(log["staleness"], log["m2"], "1 + M2(s) over the user's logged run")
    if early is None:
        return logged
    ages, cost = logged.ages, np.array(logged.ratio)  # (ages,)
    inside = np.array(ages) <= early.oldest_measured  # the pilot's table read only at the ages it measured
    cost = np.where(inside, np.maximum(cost, early.at(np.array(ages))), cost)
    return forgetting.Staleness(ages, tuple(cost.tolist()),
                                "1 + M2(s) over the user's logged run, the pilot's where larger")


def pilot_affordable(pilot: dict, mu: float, floor: float) -> bool:
    """Whether the user runs this pilot at (mu, floor): its compute, and the re-scoring of the logged run's drift that
    is spent in every cell (``log_compute``; reserved since the drift is sampled, ``measure_drift``'s ``rescored``),
    within PILOT_FRACTION of the recipe's to the target (``recipe_steps`` steps of on-policy at B), all known before
    any scored run. Otherwise the user asks optimal without the pilot's numbers (``measure.pilot_query``: the log's b
    and drift, no kappa) and spends nothing on it."""
    log = (pilot.get("recipe_log") or {}).get("drift") or {}
    reserved = log_compute(pilot) if "rescored" in log else 0.0  # spent in every cell; before the sampled table, not
    return pilot_compute(pilot, mu, floor) + reserved <= PILOT_FRACTION * pilot["recipe_steps"] * forgetting.step_cost(
        BATCH, BATCH, mu, floor)


def b_crit_record(num: list[float], ghg: list[float]) -> dict:
    """McCandlish's B_crit = tr(D H D Sigma) / (G^T D H D G) from the pilot's HVPs (App. D: the noise scale that
    counts curvature; D = 1 for SGD, Adam's preconditioner otherwise). Per curvature step, two quarter-batch pairs give
    E[(D xi)^T H (D xi)] = 8 tr(D H D Sigma) / B and the whole batch's gradient E[(D g)^T H (D g)] = G^T D H D G +
    tr(D H D Sigma) / B, so tr(D H D Sigma) = B/8 mean(num) and G^T D H D G = mean(ghg) - mean(num) / 8 (unbiased;
    pooled over the steps before dividing). None with the reason when the curvature along G is not resolved > 0."""
    if not num or not ghg:
        return {"b_noise": None, "reason": "no curvature step"}
    trace = BATCH / 8 * float(np.mean(num))
    signal = float(np.mean(ghg)) - float(np.mean(num)) / 8
    if not (trace > 0 and signal > 0):
        return {"b_noise": None, "trace_h_sigma": trace, "g_h_g": signal,
                "reason": "tr(H Sigma) or G^T H G estimated <= 0 (the noise swamps the curvature along G)"}
    return {"b_noise": trace / signal, "trace_h_sigma": trace, "g_h_g": signal, "pairs": len(num)}


def curvature_pairs_kappa(num: list[float], den: list[float], lr: float, rng: np.random.Generator,
                          optimizer: str) -> dict:
    """kappa from the curvature pairs (``forgetting.kappa_from_curvature_pairs``) as the pilot records it, with
    ``pairs_without_noise``: a pair whose two minibatch gradients are equal (xi = 0: every prompt group's rewards
    equal, so no advantage; a policy that has converged on an easy instance) adds 0 to both of the estimate's sums,
    so it is left out and counted, the estimate unchanged (as ``theory.profiles.curvature_pairs_record`` and
    calibrate-simulator do). Fewer than 2 pairs with noise: no kappa, and the reason (the rule then gives no pick)."""
    num_a, den_a = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    keep = den_a > 0
    without = int((~keep).sum())
    if keep.sum() < 2:
        return {"kappa": None, "kappa_interval": [None, None], "method": "curvature-pairs", "optimizer": optimizer,
                "units": int(keep.sum()), "pairs_without_noise": without,
                "reason": f"{int(keep.sum())} of {den_a.size} curvature pairs have a gradient difference xi != 0 (the "
                          f"minibatch gradients were equal: no reward variation within their prompt groups); need >= 2"}
    estimate = forgetting.kappa_from_curvature_pairs(num_a[keep], den_a[keep], lr, rng, optimizer=optimizer,
                                                     beta1=BETA1, pilot_batch=BATCH)
    return {**estimate.to_dict(), "pairs_without_noise": without}


def loss_hvp(env, theta: np.ndarray, v: np.ndarray) -> np.ndarray:
    """H v of the loss F = -J at theta: exact on the quadratic (H diagonal), central differences of the exact
    gradient on a rollout environment (the expected loss's Hessian, what a minibatch HVP estimates)."""
    if isinstance(env, QuadraticEnv):
        return env.curvature * v
    eps = 1e-4 / max(float(np.linalg.norm(v)), 1e-300)
    g = env.exact_grad(np.concatenate([theta + eps * v, theta - eps * v]))  # (2, d) ascent
    return -(g[0] - g[1]) / (2 * eps)


def kappa_parts(env, setting: Setting, theta: np.ndarray, d_vec: np.ndarray,
                 rng: np.random.Generator) -> tuple[float, float]:
    """(tr(D H D Sigma), tr(D Sigma)) at theta: exact on the quadratic (Sigma = diag(noise_var)); on a rollout
    environment H exact and Sigma from 512 groups (the group mean is the independent unit, scaled to one sample)."""
    if isinstance(env, QuadraticEnv):
        h, var = env.curvature, env.noise_var
        return float(np.sum(d_vec * h * d_vec * var)), float(np.sum(d_vec * var))
    grads = sample_grads(env, setting, theta, theta, 512, rng).reshape(512, GROUP, -1).mean(axis=1)
    sigma = GROUP * np.cov(grads, rowvar=False)  # (d, d) per sample, as the pairs' xi (B = 256 samples) scale
    hess = exact_hessian(env, theta)
    dm = np.diag(d_vec)
    return float(np.trace(dm @ hess @ dm @ sigma)), float(np.trace(dm @ sigma))


def measure_drift(env, trajectory: np.ndarray, rng: np.random.Generator) -> dict:
    """The drift of the policy at the run's last step T from itself s steps earlier, on its trajectory (T + 1, runs,
    d), at the ages s in STALENESS up to T and T itself (a run sees no older policy: the rule's ``Staleness`` extends
    the table beyond along its last slope, and says so): M2(s) = E_behav[(log pi_T / pi_{T-s})^2] (M2PO's statistic;
    about chi^2 and 2 KL for a small drift, without chi^2's heavy tail). 1 + M2(s) is the variance factor of an
    importance weight at age s that the forgetting rule's staleness cost reads.

    ``m2`` is what a user gets and what the rule reads: RESCORE_SAMPLES rollouts of pi_{T-s} (whole groups of GROUP
    on uniform prompts: the kept share of step T - s's batch) with their log-probs at generation, re-scored at pi_T
    (one forward pass each, ``log_compute``), the token mean of the squared log-ratio, as the TRL trainer's drift log
    and diagnose's m2 by age compute it. ``m2_exact`` (``env.exact_divergences``) beside it, with chi^2 and KL (exact).
    A one-step run has no age > 0: no table, and the reason."""
    T, runs = trajectory.shape[0] - 1, trajectory.shape[1]
    ages = forgetting.drift_ages(T, STALENESS)
    if len(ages) < 2:
        return {"staleness": ages, "m2": [0.0], "m2_exact": [0.0], "chi2": [0.0], "kl_new_behav": [0.0],
                "checkpoints": [T], "runs": runs, "rescored": 0,
                "reason": "the run is one step long: no older policy to measure the drift from"}
    rows = {"m2": [], "m2_exact": [], "chi2": [], "kl_new_behav": []}
    groups = RESCORE_SAMPLES // GROUP
    for s in ages:
        div = env.exact_divergences(trajectory[T], trajectory[T - s])  # each (runs,)
        rows["m2_exact"].append(float(np.mean(div["m2"])))
        for key in ("chi2", "kl_new_behav"):
            rows[key].append(float(np.mean(div[key])))
        prompts = np.repeat(rng.integers(0, env.num_prompts, size=(runs, groups)), GROUP, axis=1)  # (runs, 64)
        tokens, logp_behav, mask = env.sample(trajectory[T - s], prompts, rng)  # (runs, 64, L) each
        log_ratio = env.logp(trajectory[T], prompts, tokens, mask) - logp_behav  # (runs, 64, L), 0 on padding
        rows["m2"].append(float(np.sum(log_ratio**2 * mask) / np.sum(mask)))  # token mean over the runs' samples
    return {"staleness": ages, **rows, "checkpoints": [T], "runs": runs,
            "rescored": (len(ages) - 1) * RESCORE_SAMPLES * runs,
            "m2_what": f"{RESCORE_SAMPLES} rollouts of each age's policy re-scored at the last (the user's estimate); "
                       "m2_exact: the two policies' exact M2"}


def measure_staleness(env, setting: Setting, history: np.ndarray, instance: int) -> dict:
    """sigma^2(s) on the pilot's trajectory (T + 1, d) with behaviour theta_{t-s}, in both forms (plain E||G -
    grad F||^2 for the unbiased IS loss; signal-normalised Var / c(s)^2 for the clipped loss, c(s) the share of the
    fresh signal a stale sample keeps), and the stale gradients' bias (the paper's kappa, Assumption 3.2)."""
    rng = np.random.default_rng([instance, 104729])
    T = history.shape[0] - 1
    checkpoints = sorted({T // 3, 2 * T // 3, T})  # ages beyond a checkpoint read the pilot's start (said below)
    plain, normalised, retained, biases = [], [], [], []
    for t in checkpoints:
        theta = history[t][None]
        exact = -env.exact_grad(theta)[0]  # loss gradient
        fresh = sample_grads(env, setting, theta, theta, 512, rng)
        g0, var0 = fresh.mean(axis=0), float(((fresh - fresh.mean(axis=0)) ** 2).sum(axis=1).mean())
        if not g0 @ g0 > 0:
            continue
        row_p, row_n, row_c = [], [], []
        for s in STALENESS:
            behaviour = history[max(t - s, 0)][None]
            grads = fresh if s == 0 else sample_grads(env, setting, theta, behaviour, 512, rng)
            mean = grads.mean(axis=0)
            var = float(((grads - mean) ** 2).sum(axis=1).mean())
            row_p.append(float(((grads - exact) ** 2).sum(axis=1).mean()))
            c = float(mean @ g0 / (g0 @ g0))
            row_c.append(c)
            row_n.append(var / max(c, 0.05) ** 2)  # c -> 0: a stale sample carries nothing; capped at 1/0.05^2
            gap = float(np.linalg.norm(history[t] - behaviour[0]))
            if s >= 4 and gap > 0:
                bias_sq = float(((mean - g0) ** 2).sum()) - (var + var0) / grads.shape[0]
                biases.append(math.sqrt(max(bias_sq, 0.0)) / gap)
        plain.append(row_p)
        normalised.append(row_n)
        retained.append(row_c)
    if not plain:
        return {"staleness": list(STALENESS), "plain": None, "reason": "no checkpoint with a fresh signal"}
    return {"staleness": list(STALENESS), "plain": np.mean(plain, axis=0).tolist(),
            "normalised": np.mean(normalised, axis=0).tolist(), "retained": np.mean(retained, axis=0).tolist(),
            "bias": float(np.max(biases)) if biases else 0.0, "checkpoints": checkpoints,
            "ages_measured_up_to": T, "older": "an age beyond a checkpoint's step reads the pilot's first policy"}


def fit_noise_scale(steps: np.ndarray, batches: np.ndarray) -> tuple[float, float]:
    """(S_min, B_noise) of S(B) = S_min (1 + B_noise / B) over the finite entries (McCandlish Eq. 2.7): least squares
    in 1/B with weights 1/S (a step count's error grows with it, so the small batches' long runs would otherwise
    decide the fit); B_noise = inf when S_min <= 0 (steps fall at least as fast as 1/B); nan with fewer than 4
    finite batches."""
    ok = np.isfinite(steps)
    if ok.sum() < 4:
        return math.nan, math.nan
    slope, intercept = np.polyfit(1.0 / batches[ok], steps[ok], 1, w=1.0 / steps[ok])
    return float(intercept), float(slope / intercept) if intercept > 0 else math.inf


def b_noise_kind(value: float) -> str:
    """How a fitted B_noise is to be read (the JSON keeps inf and nan as null; this says which)."""
    if math.isnan(value):
        return "not measurable: fewer than 4 on-policy batches reached the target"
    if math.isinf(value):
        return "infinite: S_min <= 0, steps fall at least as fast as 1/B (every sample counts)"
    if not value > 0:
        return "not positive: the steps do not fall with the batch; the rules that read B_noise give no pick"
    return "finite"


def read_b_noise(noise: dict, exact: bool = False) -> float:
    """B_noise from a saved record: its value, inf or nan as its ``*_kind`` says (JSON keeps both as null)."""
    key = "exact_b_noise" if exact else "b_noise"
    if key not in noise:
        return math.nan
    kind = noise.get(f"{key}_kind", "finite")
    if kind.startswith("infinite"):
        return math.inf
    return math.nan if noise[key] is None else float(noise[key])


def measured_alpha(noise: dict) -> float | None:
    """The exponent of the tuned step's fall with the noise: eta_B ~ (1 + B_noise / B)^-alpha over the on-policy
    batches (least squares in logs); None when B_noise is not finite."""
    b_noise = read_b_noise(noise)
    if not math.isfinite(b_noise) or b_noise <= 0:
        return None
    batches = np.asarray(noise["batches"])
    lrs = np.array([math.nan if v is None else v for v in noise["tuned_lr"]], dtype=float)  # None: not reached
    ok = np.isfinite(np.asarray(noise["steps"]))
    if ok.sum() < 3:
        return None
    return float(-np.polyfit(np.log1p(b_noise / batches[ok]), np.log(lrs[ok]), 1)[0])
