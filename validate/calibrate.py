"""Calibrate the theory's inputs on the language model: mu, sigma^2(s), rho and the KL drift.

Paper: experience-replay (docs/REFERENCES.md), Assumption 3.3, Thm 3.5 and App. E; the same measurements as
``simulate/calibrate.py`` (the same fits, ``theory.profiles.fit_profiles``), but with per-sample gradients of the
transformer instead of analytic scores.

| code name          | paper symbol     | how it is measured on the LM                                           |
|--------------------|------------------|------------------------------------------------------------------------|
| ``mu_timing``      | mu (Table 1)     | generation seconds per completion / update seconds per completion      |
| ``mu_count``       | mu (App. E)      | (K_training / T) / (K_inference / W) in a fixed wall-clock window      |
| ``sigma_sq[s]``    | sigma^2(s)       | the form matching the loss (theory/noise.py): plain or signal-normalised |
| ``sigma_sq_ci[s]`` | (interval)       | prompt-group bootstrap interval of sigma^2(s) (``sigma_sq_level``)      |
| ``reference``      | grad F(theta_t)  | mean per-sample gradient of a large HELD-OUT batch of fresh completions |
| ``rho``            | rho              | slope of the norm-weighted FIFO noise correlation in gap / N (no clamp) |
| ``kl_by_lag``      | KL drift         | EXACT KL(pi_t || pi_{t-lag}) over the vocabulary, on completions of pi_t |
| ``kl_by_lag_k3``   | (estimator)      | sampled k3 estimate of the same KL on the same completions              |
| ``kl_by_lag_k1``   | (estimator)      | sampled k1 estimate (mean sequence log-ratio), can be negative          |
| ``memory``         | kappa (issue 30) | lr tr(D H D Sigma) / tr(D Sigma): curvature pairs, ``measure_lm_kappa`` |

The probe is an ordinary RL run (``validate.rl.train``, FIFO buffer, GRPO) whose last per-step weights are kept
(on the CPU), so completions of the stale policies pi_{t-s} can be regenerated after it.  The bootstrap units are
PROMPT GROUPS (one checkpoint, so no seeds); the noise is not centred per creation step, so rho is the uncentred
one.  The estimators, the exact KL, the noise scale, kappa and the coordinate subset of large models:
docs/VALIDATION.md, 'Calibration on the LM: the estimators'; the count window: 'Count-based mu (App. E)'.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from numpy.linalg import lapack_lite
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..advise.profile_files import save_profile
from ..checks import require_integer, require_number
from ..core.designs import BufferSpec, compute_loss, loss_form, make_design_buffer
from ..core.surrogate import surrogate
from ..theory import noise as noise_estimators
from ..theory.compute import estimate_mu
from ..theory.divergences import k3_terms
from ..theory.noise_scale import pooled_noise_scale
from ..theory.profiles import curvature_pairs_record, drift_line, fit_profiles, unmeasured_memory
from . import countdown
from .engines import HFSampler, Sampler
from .logprobs import encode_prompts, next_token_logprobs, sequence_logprobs
from .policy import Policy
from .rl import RLConfig, RLResult, generate_batch, make_generator, train, update_step

MAX_GRAD_COORDS = 1 << 22  # 4M float32 coordinates = 16 MB per per-sample gradient
GRAD_CHUNK = 128
"""Completions drawn at once for the gradient measurements (whole prompt groups; the draws depend on it)."""
GRAD_BLOCK = 32
"""About this many per-sample gradients are held at once (32 x 253K float64 = 65 MB for the tiny model): a chunk's
gradients are reduced block by block (``GradientProbe.blocks``), never stacked."""
KL_CHUNK_ELEMENTS = 1 << 24  # chunk x L x V log-probs per pass: 64 MB float32 (about 8 such float64 temporaries)


@dataclass
class LMCalibration:
    mu_timing: float
    staleness: list[float]
    sigma_sq: list[float]
    """sigma^2(s) in the form ``sigma_sq_form`` (the one the probe's loss needs; inf where no signal is left)."""
    rho: float
    """The fitted rho as measured (not clamped; see ``rho_fit``)."""
    correlation_by_gap: dict[int, float]
    kl_by_lag: dict[int, float]
    """Exact KL(pi_t || pi_{t-lag}) per sequence, over the vocabulary, mean over fresh completions of pi_t."""
    kl_drift_per_step: float
    """``kl_by_lag[1]``."""
    probe_metrics: list[dict]
    fits: dict
    mu_count: float = math.nan
    """App. E count-based mu: (K_training / T) / (K_inference / W) over ``count_window``."""
    count_window: dict = field(default_factory=dict)
    """seconds, k_inference, k_training, workers, trainers, generation_busy_s, training_busy_s."""
    grad_coords: int | None = None
    """Coordinates per per-sample gradient (None: all parameters, exact)."""
    sigma_sq_form: str = "plain"
    """plain or signal-normalised (``core.designs.loss_form`` of the probe's loss)."""
    loss: str = "grpo"
    sigma_sq_plain: list[float] = field(default_factory=list)
    sigma_sq_signal_normalised: list[float] = field(default_factory=list)
    retained_signal: list[float] = field(default_factory=list)
    rho_fit: dict = field(default_factory=dict)
    """theory.noise.RhoFit.to_dict(): value, ci, in_range, correlation by gap, within-group correlation."""
    reference_samples: int = 0
    reference_variance: float = math.nan
    """E||g_ref - grad F||^2 subtracted from every estimate (already scaled to all coordinates)."""
    sigma_sq_ci: list[list[float]] = field(default_factory=list)
    """[lo, hi] per staleness value: prompt-group bootstrap interval of ``sigma_sq`` (its form)."""
    sigma_sq_plain_ci: list[list[float]] = field(default_factory=list)
    sigma_sq_signal_normalised_ci: list[list[float]] = field(default_factory=list)
    retained_signal_ci: list[list[float]] = field(default_factory=list)
    sigma_sq_level: float = noise_estimators.DEFAULT_LEVEL
    """Coverage of every sigma^2, r(s) and rho interval (central percentile interval)."""
    sigma_sq_units: int = 0
    """Bootstrap units of sigma^2(s): prompt groups per staleness value (samples / group_size)."""
    kl_by_lag_se: dict[int, float] = field(default_factory=dict)
    """Standard error of ``kl_by_lag`` over prompt groups."""
    kl_by_lag_k3: dict[int, float] = field(default_factory=dict)
    """Sampled k3 estimate of the same KL on the same completions (sum over tokens of r - 1 - log r)."""
    kl_by_lag_k3_se: dict[int, float] = field(default_factory=dict)
    kl_by_lag_k1: dict[int, float] = field(default_factory=dict)
    """Sampled k1 estimate (mean sequence log pi_t - log pi_{t-lag}); unbiased, can be negative."""
    kl_by_lag_k1_se: dict[int, float] = field(default_factory=dict)
    noise_scale: dict = field(default_factory=dict)
    """The "noise_scale" record (PooledNoiseScale.to_dict() + batch, unit_size, source); empty: not measured."""
    memory: dict = field(default_factory=dict)
    """The optimizer's memory kappa (the profile's "memory" record, ``measure_lm_kappa``); empty: not measured."""
    memory_estimators: dict = field(default_factory=dict)
    """Other estimates of the same kappa (the same-micro-batch Hessian's), for comparison."""
    drift: dict = field(default_factory=dict)
    """The profile's "drift" record: M2(s) = token mean of (log pi_t - log pi_{t-s})^2 over the sigma^2(s) probe's
    completions of pi_{t-s} (their sampled log-probs) re-scored at the final policy, by staleness; empty: none."""

    def profile_dict(self, source: str) -> dict:
        """The file `replay-theory optimal --profile` reads: the finite prefix of the matched table, rho only if in
        [0, 1] (the fit itself always, under ``rho_fit``)."""
        values, form, note = np.asarray(self.sigma_sq, float), self.sigma_sq_form, None
        intervals = np.asarray(self.sigma_sq_ci, float).reshape(-1, 2)
        stop = _usable_prefix(values)
        if form == "signal-normalised":
            # sigma^2 / r(s)^2 means something only where the retained signal r(s) is resolved above 0: the table
            # stops at the first s whose r(s) interval reaches 0, and falls back to plain if that leaves < 3 points
            retained_low = np.asarray(self.retained_signal_ci, float).reshape(-1, 2)[:, 0]
            resolved = (retained_low > 0) if len(retained_low) == len(values) else np.zeros(len(values), bool)
            stop = min(stop, int(np.argmin(resolved)) if not resolved.all() else len(values))
            if stop < len(values):
                where = f"s = {self.staleness[stop]:g}"
                why = (f"the retained signal r(s)'s {self.sigma_sq_level:g} interval reaches 0 at {where} "
                       f"(||grad F||^2 is small against the per-sample noise with {self.sigma_sq_units} prompt "
                       "groups per staleness; use more --samples)")
                if stop >= 3:
                    note = f"the signal-normalised table stops before {where}: {why}"
                else:
                    note = (f"the signal-normalised sigma^2 is not resolved: {why}; the table is the plain "
                            "sigma^2(s) of Assumption 3.3, which does not charge a clipped loss for the signal stale "
                            "samples lose")
                    values = np.asarray(self.sigma_sq_plain, float)
                    intervals = np.asarray(self.sigma_sq_plain_ci, float).reshape(-1, 2)
                    form, stop = "plain", _usable_prefix(values)
        if stop < 2:  # the reference batch did not resolve the signal: say so and give the upper bound
            values = np.asarray(self.sigma_sq_plain, float) + self.reference_variance
            intervals = np.asarray(self.sigma_sq_plain_ci, float).reshape(-1, 2) + self.reference_variance
            form, stop = "plain", _usable_prefix(values)
            note = (f"the {self.sigma_sq_form} sigma^2 is not resolved (||g_ref||^2 does not exceed its own Monte "
                    f"Carlo error {self.reference_variance:.3g}): the table is the plain E||G - g_ref||^2 without the "
                    "reference correction, an upper bound; use more --samples")
        if stop < 2:
            raise ValueError("no sigma^2 form has 2 usable (finite, > 0) points: the probe measured no gradient noise")
        data = {"kind": "table", "staleness": self.staleness[:stop], "sigma_sq": [float(v) for v in values[:stop]],
                "sigma_sq_form": form, "loss": self.loss,
                "sigma_sq_ci": _json_intervals(intervals[:stop]),
                "forms": {"staleness": self.staleness, "plain": self.sigma_sq_plain,
                          "signal_normalised": [v if math.isfinite(v) else None
                                                for v in self.sigma_sq_signal_normalised],
                          "retained_signal": self.retained_signal,
                          "plain_ci": _json_intervals(self.sigma_sq_plain_ci),
                          "signal_normalised_ci": _json_intervals(self.sigma_sq_signal_normalised_ci),
                          "retained_signal_ci": _json_intervals(self.retained_signal_ci),
                          "level": self.sigma_sq_level, "units": self.sigma_sq_units,
                          "bootstrap_unit": "prompt group (the reference is not resampled)"},
                "rho_fit": {**self.rho_fit, "noise": "eps = G - g_ref (uncentred; reference error subtracted)"},
                "reference": f"sampled (n = {self.reference_samples}, its variance / n subtracted)",
                "fits": self.fits, "kl_drift_per_step": self.kl_drift_per_step, "source": source}
        if note:
            data["note"] = note
        if self.rho_fit.get("in_range"):
            data["rho"] = self.rho
        if self.noise_scale:  # without signal (b_noise null) the rule has no input: kept apart, said
            data["noise_scale" if self.noise_scale["b_noise"] is not None else "noise_scale_unresolved"] = \
                self.noise_scale
        if self.memory:  # beside b: kappa from curvature pairs (measure_lm_kappa)
            data["memory"] = self.memory
            if self.memory_estimators:
                data["memory_estimators"] = self.memory_estimators
        if self.drift:  # the staleness cost optimal --profile prices, r(s) = 1 + M2(s)
            data["drift"] = self.drift
        return data


def gram_rows(units: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
    """(U, U) rows with the inner products of ``units`` (U, k), k >= U: R^T of units^T = Q R.

    B_noise from units (``noise_scale_from_samples``) depends only on their Gram matrix (the mean's norm, the
    squared deviations), and so does every bootstrap resample (a sub-matrix of it): the estimate is unchanged and
    a resample costs O(U^2) instead of O(U k) (k = 253K coordinates for the tiny model).

    ``overwrite``: ``units`` (C-contiguous float64) is factored in place and left destroyed, so no copy is made.
    Why LAPACK's dgeqrf directly: ``np.linalg.qr`` copies its input twice (its own copy, then LAPACK's column-major
    one), 1.3 GB each for the 640 units of 253K coordinates at calibrate-model's defaults; this is the routine it
    calls, in the same library with the same workspace query, so R is the same bit for bit.
    """
    units = np.asarray(units, dtype=float)
    if units.shape[1] <= units.shape[0]:
        return units
    if not (overwrite and units.flags.c_contiguous and units.flags.writeable):
        units = np.array(units, dtype=float, order="C")
    count, dim = units.shape  # row-major (U, k) is column-major units^T (k, U): LAPACK's layout, leading dim k
    tau, work = np.empty(count), np.empty(1)
    lapack_lite.dgeqrf(dim, count, units, dim, tau, work, -1, 0)  # workspace query, as np.linalg.qr makes it
    work = np.empty(max(1, count, int(work[0])))
    info = lapack_lite.dgeqrf(dim, count, units, dim, tau, work, work.size, 0)["info"]
    if info:
        raise np.linalg.LinAlgError(f"dgeqrf failed (info {info}) on the {count} noise-scale units")
    return np.triu(units.T[:count]).T  # R in the upper triangle; units units^T = R^T Q^T Q R = R^T R


def noise_scale_line(record: dict) -> str:
    """The printed B_noise and b = B_noise / B with their intervals, from a "noise_scale" record."""
    b, (lo, hi), B = record["b_noise"], record["b_noise_interval"], record["batch"]

    def text(v) -> str:
        return "inf (no signal)" if v is None else f"{v:.4g}"

    def per_batch(v) -> str:
        return "inf" if v is None else f"{v / B:.4g}"

    line = (f"noise scale B_noise ({record['method']}) = {text(b)}, {record['level']:.0%} interval [{text(lo)}, "
            f"{text(hi)}]; b = B_noise / B = {per_batch(b)} [{per_batch(lo)}, {per_batch(hi)}] at B = {B}")
    if b is None:
        line += ("; no gradient signal at the median checkpoint: profile.json keeps the record as "
                 "noise_scale_unresolved (optimal cannot use it); measure with more completions")
    return line


def calibration_summary(calibration: dict, saved) -> list[str]:
    """What ``validate calibrate-model`` prints after the run: B_noise and kappa with what each was measured on, or
    why one is missing from ``saved`` (calibration.json, written before it was measured)."""
    lines = []
    for key, line, name in (("noise_scale", noise_scale_line, "noise scale"),
                            ("memory", kappa_line, "optimizer memory kappa")):  # kappa beside b (issue 30)
        record = calibration.get(key)
        lines += [line(record), f"  measured on {record['source']}"] if record else [
            f"no {name} in {saved} (measured before {'B_noise' if key == 'noise_scale' else 'kappa'} was; delete it "
            "to measure again)"]
    drift = calibration.get("drift")
    if drift:
        lines.append(drift_line(drift, f"{sum(drift['tokens'][1:])} tokens re-scored at the final policy"))
    return lines


def _json_intervals(intervals) -> list[list[float | None]]:
    """[lo, hi] pairs with NaN and inf as None (JSON has neither)."""
    pairs = np.asarray(intervals, float).reshape(-1, 2)
    return [[float(v) if math.isfinite(v) else None for v in pair] for pair in pairs]


def _usable_prefix(values: np.ndarray) -> int:
    """Length of the leading run of finite, positive values (a profile table must be positive)."""
    ok = np.isfinite(values) & (values > 0)
    return int(np.argmin(ok)) if not ok.all() else ok.size


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


def gradient_coordinates(num_params: int, max_coords: int | None, seed: int) -> torch.Tensor | None:
    """None (use every coordinate) when ``num_params <= max_coords``, else ``max_coords`` indices drawn
    uniformly WITH replacement (no O(P) permutation for a 0.5B model), sorted for memory locality."""
    if max_coords is None or num_params <= max_coords:
        return None
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, num_params, (max_coords,), generator=generator).sort().values  # (k,)


def per_sample_grads(policy: Policy, problems, batch, config: RLConfig,
                     coords: torch.Tensor | None = None) -> torch.Tensor:
    """G(theta, z_i) for each completion of a one-seed RolloutBatch: (n, num_params), the loss on a batch of one.

    With ``coords`` only those coordinates of each flat gradient are kept: (n, k). Float32, on the
    policy's device.
    """
    return torch.stack(list(iter_sample_grads(policy, problems, batch, config, coords)))  # (n, P) or (n, k)


def iter_sample_grads(policy: Policy, problems, batch, config: RLConfig,
                      coords: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
    """``per_sample_grads``'s rows one at a time, (P,) or (k,) float32 each: no (n, P) stack is made."""
    model = policy.model
    model.train()
    index = None if coords is None else coords.to(policy.device)
    for i in range(batch.size):
        prompt_ids, prompt_mask = encode_prompts(policy, [problems[batch.prompt[0, i]].prompt_text()])
        ids = torch.as_tensor(batch.tokens[0, i : i + 1], device=policy.device)
        mask = torch.as_tensor(batch.mask[0, i : i + 1].astype(np.int64), device=policy.device)
        logp = sequence_logprobs(policy, prompt_ids, prompt_mask, ids, mask, temperature=config.temperature)  # (1, L)
        out = compute_loss(config, batch.take(np.array([[i]])), logp.detach().cpu().double().numpy()[None])
        model.zero_grad(set_to_none=True)
        (torch.as_tensor(out.grad_logp[0], dtype=logp.dtype, device=logp.device) * logp).sum().backward()
        flat = _flat_grad(model).detach().float()  # (P,), a new tensor (torch.cat), not the model's .grad
        yield flat if index is None else flat[index]
    model.zero_grad(set_to_none=True)


def count_window(generate_once: Callable[[], int], update_once: Callable[[], int], window_seconds: float,
                 clock: Callable[[], float] = time.perf_counter,
                 on_call: Callable[[float], None] | None = None) -> dict:
    """Emulated W = T = 1 asynchronous pipeline on one device, counted over ``window_seconds`` (App. E).

    ``generate_once()`` produces rollouts and returns how many; ``update_once()`` trains on
    samples and returns how many. The two sides take turns (the one whose busy clock is behind
    goes next, generation first on a tie so the buffer has data), each call's duration is
    charged to its own side's clock, and a call's output counts only if it finished inside the
    window on that clock. Returns the counts, the busy times and ``mu`` = estimate_mu(K_training,
    K_inference, W=1, T=1).
    """
    require_number("count window", window_seconds, above=0, note=" seconds")
    gen_clock = train_clock = 0.0
    k_inference = k_training = 0
    while gen_clock < window_seconds or train_clock < window_seconds:
        generating = gen_clock < window_seconds and (gen_clock <= train_clock or train_clock >= window_seconds)
        start = clock()
        done = generate_once() if generating else update_once()
        elapsed = clock() - start
        if not elapsed > 0:  # a clock that does not advance would never close the window
            raise RuntimeError(f"the clock did not advance during a {'generation' if generating else 'update'} call")
        if generating:
            gen_clock += elapsed
            k_inference += done if gen_clock <= window_seconds else 0
        else:
            train_clock += elapsed
            k_training += done if train_clock <= window_seconds else 0
        if on_call is not None:  # progress: the slower side's clock, capped at the window
            on_call(min(gen_clock, train_clock, window_seconds))
    mu = estimate_mu(k_training, k_inference, 1, 1) if k_training > 0 and k_inference > 0 else math.nan
    return {"seconds": window_seconds, "k_inference": k_inference, "k_training": k_training, "workers": 1,
            "trainers": 1, "generation_busy_s": gen_clock, "training_busy_s": train_clock, "mu": mu}


def measure_mu_count(policy: Policy, problems: list[countdown.Problem], config: RLConfig, window_seconds: float,
                     sampler: Sampler | None = None, seed: int = 0,
                     on_call: Callable[[float], None] | None = None) -> dict:
    """``count_window`` on the real tiny pipeline: R fresh rollouts into the FIFO buffer vs one update on B.

    Runs on a copy of ``policy`` (the caller's weights are untouched) with a fresh AdamW, the same
    ``generate_batch`` and ``update_step`` as ``validate.rl.train``. The sampler is synced before every
    generation (the freshest weights an asynchronous worker could fetch), inside the generation
    side's clock (free for the HF loop, a bf16 copy of the weights for vLLM).
    """
    config = dataclasses.replace(config, buffer="fifo").validated()
    window_policy = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    sampler = HFSampler() if sampler is None else sampler
    optimizer = torch.optim.AdamW(window_policy.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    buffer = make_design_buffer(config, BufferSpec(1, config.max_new_tokens, len(problems), np.int32))
    assert buffer is not None  # buffer="fifo" above: a buffer, never on-policy's None
    rng = np.random.default_rng(seed + 104729)
    generator = make_generator(policy.device, seed + 104729)  # on the device on CUDA: the loop verify runs
    state = {"generated": 0}

    def generate_once() -> int:
        sampler.sync(window_policy)  # inside the generation side's clock: an async worker pays for its fetch
        window_policy.model.eval()
        index = rng.integers(0, len(problems), size=config.rollouts_per_step // config.group_size)
        fresh, _ = generate_batch(window_policy, problems, index, config, state["generated"], 0, generator, sampler)
        buffer.add(fresh, state["generated"])
        state["generated"] += 1
        return fresh.size

    def update_once() -> int:
        window_policy.model.train()
        sample = buffer.sample(config.batch_size, max(state["generated"] - 1, 0), rng)
        update_step(window_policy, optimizer, problems, config, sample.batch)
        return sample.batch.size

    generate_once()  # warm-up outside the window: first calls pay for allocator and kernel setup
    update_once()
    return count_window(generate_once, update_once, window_seconds, on_call=on_call)


# --------------------------------------------------------------------------- the optimizer's memory kappa (issue 30)

DEFAULT_KAPPA_PAIRS = 8
"""Curvature pairs per probe checkpoint that has an optimizer state (every noise checkpoint after the first update)."""
KAPPA_FD_STEP = 1e-4
"""|h w| / |theta| of the central difference H w = (grad(theta + h w) - grad(theta - h w)) / (2 h): on the tiny model
in float32 it agrees with autograd's Hessian-vector product to ~1e-3 (tests/integration/test_validate_kappa.py);
1e-2 is past the loss's curvature scale (a 90% error), 1e-6 reaches float32 rounding."""
KAPPA_BOOTSTRAP = 1000


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """The model's parameters as one detached flat float32 vector (P,), on their device (tied weights once)."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def load_flat(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Write the flat vector ``flat`` (P,) into the model's parameters, in ``model.parameters()`` order."""
    start = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()


def batch_gradient(policy: Policy, problems, batch, config: RLConfig, *, reweighted: bool = False) -> torch.Tensor:
    """The loss's gradient on a micro-batch (a one-seed RolloutBatch (1, n, ...)) at the policy's weights, formed as
    the probe's update forms it (the shared numpy loss with its aggregation over these rows, the surrogate
    backpropagated): flat float32 (P,). The model's ``.grad`` is left empty.

    ``reweighted``: rho g_on instead, g_on the loss's gradient with the behaviour log-probs set to the current ones
    (ratio 1: the on-policy per-completion gradient at these weights) and rho = pi_theta / pi_behav of each whole
    completion (a constant row weight). Its derivative at the behaviour weights is E[grad g + g S^T] (S the
    completion's score): the Jacobian of the on-policy gradient field, with the score cross terms between a
    completion's tokens that the loss's own Hessian (per-token ratios on fixed completions) lacks
    (``simulate.calibrate.minibatch_gradient``; measured on the token MDP)."""
    model = policy.model
    model.train()
    prompt_ids, prompt_mask = encode_prompts(policy, [problems[i].prompt_text() for i in batch.prompt[0]])
    ids = torch.as_tensor(batch.tokens[0], device=policy.device)
    mask = torch.as_tensor(batch.mask[0].astype(np.int64), device=policy.device)
    logp = sequence_logprobs(policy, prompt_ids, prompt_mask, ids, mask, temperature=config.temperature)  # (n, L)
    current = logp.detach().cpu().double().numpy()[None]  # (1, n, L)
    if reweighted:
        out = compute_loss(config, dataclasses.replace(batch, logp_behav=current), current)
        rho = np.exp(np.where(batch.mask, current - batch.logp_behav, 0.0).sum(axis=2))  # (1, n)
        grad_logp = out.grad_logp[0] * rho[0][:, None]
    else:
        grad_logp = compute_loss(config, batch, current).grad_logp[0]
    model.zero_grad(set_to_none=True)
    surrogate(grad_logp, logp).backward()
    grad = _flat_grad(model).detach().float().clone()
    model.zero_grad(set_to_none=True)
    return grad


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """a . b in float64 by numpy's pairwise sum on the CPU: the same number at any torch thread count (torch's CPU
    reductions split the sum over its threads, so its rounding moves with the count)."""
    return float(np.sum(a.detach().double().cpu().numpy() * b.detach().double().cpu().numpy()))


def central_hvp(scratch: Policy, problems, batch, config: RLConfig, theta: torch.Tensor, vector: torch.Tensor,
                step: float = KAPPA_FD_STEP, *, reweighted: bool = True) -> torch.Tensor:
    """H v of the micro-batch's loss at ``theta`` by central differences of ``batch_gradient``, h = ``step`` |theta|
    / |v|; ``scratch`` is a policy whose weights are overwritten (the caller's model is never touched): (P,).

    Why finite differences and not autograd's double backward: the loss is the shared numpy loss (its d loss /
    d logp enters as a constant, so autograd through the surrogate would drop d(d loss / d logp) / d theta, the
    importance ratio's part of the Hessian), and the attention kernel the model runs (SDPA) has no double
    backward on the CPU. Both sides re-score the same rows at theta +- h v with their stored behaviour log-probs
    (``reweighted``: the field's Jacobian, else the loss's own Hessian; ``batch_gradient``).
    """
    norm = math.sqrt(_dot(vector, vector))
    if norm == 0:
        return torch.zeros_like(vector)
    h = step * math.sqrt(_dot(theta, theta)) / norm
    load_flat(scratch.model, theta + h * vector)
    plus = batch_gradient(scratch, problems, batch, config, reweighted=reweighted)
    load_flat(scratch.model, theta - h * vector)
    minus = batch_gradient(scratch, problems, batch, config, reweighted=reweighted)
    return (plus - minus) / (2 * h)


def adamw_snapshot(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict:
    """What kappa reads from a probe's AdamW after an update: exp_avg_sq (CPU copies, ``model.parameters()`` order),
    the step count, lr, betas, eps and weight decay."""
    group = optimizer.param_groups[0]
    states = [optimizer.state.get(p, {}) for p in model.parameters()]
    if not all("exp_avg_sq" in s for s in states):
        raise ValueError("the optimizer has no exp_avg_sq for every parameter (not AdamW, or no step taken)")
    return {"exp_avg_sq": [s["exp_avg_sq"].detach().to("cpu", copy=True) for s in states],
            "step": int(float(states[0]["step"])), "lr": float(group["lr"]), "betas": tuple(group["betas"]),
            "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"])}


def adamw_preconditioner(snapshot: dict, device, gradient: torch.Tensor | None = None) -> torch.Tensor:
    """D = 1 / (sqrt(v_hat) + eps) of torch's AdamW (bias-corrected), flat float32 (P,) on ``device``: of the state
    in ``snapshot`` (v_hat = exp_avg_sq / (1 - beta2^step), the diagonal its last update applied), or, with
    ``gradient``, of the next update were its gradient that one (v = beta2 exp_avg_sq + (1 - beta2) g^2 at step + 1:
    finite where the state alone has v = 0, on a coordinate no update has reached, whose D would be 1 / eps)."""
    beta2 = snapshot["betas"][1]
    v = torch.cat([x.reshape(-1).double() for x in snapshot["exp_avg_sq"]]).to(device)
    step = snapshot["step"]
    if gradient is not None:
        v, step = beta2 * v + (1.0 - beta2) * gradient.double() ** 2, step + 1
    return (1.0 / ((v / (1.0 - beta2 ** step)).sqrt() + snapshot["eps"])).float()


def kappa_pairs_at(policy: Policy, scratch: Policy, problems, config: RLConfig, adam: dict, pairs: int,
                   rng: np.random.Generator, generator: torch.Generator, sampler: Sampler, version: int,
                   step: float = KAPPA_FD_STEP) -> dict[str, np.ndarray]:
    """Curvature pairs at the policy's weights: three fresh micro-batches of B/2 (whole prompt groups) per pair;
    xi = g_1 - g_2, w = D xi; numerators w^T H w with H w of the third micro-batch score-reweighted
    (``independent``: the field's Jacobian), its own loss Hessian (``surrogate``) and of the first micro-batch
    reweighted (``same``, which shares samples with xi), denominator xi^T D xi. D: AdamW's next update's diagonal
    from the state ``adam`` (``adamw_snapshot``) with the pair's mean gradient (g_1 + g_2) / 2, a batch of B, as its
    gradient (``adamw_preconditioner``). Arrays (pairs,) float64."""
    groups = max(1, config.batch_size // config.group_size // 2)
    theta = flat_parameters(policy.model)
    sampler.sync(policy)
    out = {"independent": [], "surrogate": [], "same": [], "den": []}
    for _ in range(pairs):
        batches = []
        for _ in range(3):
            index = rng.integers(0, len(problems), size=groups)
            batches.append(generate_batch(policy, problems, index, config, version, 0, generator, sampler)[0])
        g1, g2 = (batch_gradient(policy, problems, b, config) for b in batches[:2])
        xi = g1 - g2
        w = adamw_preconditioner(adam, policy.device, (g1 + g2) / 2) * xi
        out["den"].append(_dot(xi, w))
        for name, b, reweighted in (("independent", batches[2], True), ("surrogate", batches[2], False),
                                    ("same", batches[0], True)):
            hw = central_hvp(scratch, problems, b, config, theta, w, step, reweighted=reweighted)
            out[name].append(_dot(w, hw))
    return {k: np.asarray(v) for k, v in out.items()}


def measure_lm_kappa(policy: Policy, problems, config: RLConfig, weights: dict[int, dict], adam: dict[int, dict],
                     sampler: Sampler, seed: int, pairs: int = DEFAULT_KAPPA_PAIRS,
                     on_pair: Callable[[int, int], None] | None = None) -> tuple[dict, dict]:
    """kappa = lr tr(D H D Sigma) / tr(D Sigma) at the probe checkpoints ``adam`` has a state for (updates done ->
    ``adamw_snapshot``; ``weights``: updates done -> state dict), pooled over all pairs (ratio of sums) with a
    bootstrap over pairs (``theory.forgetting.kappa_from_curvature_pairs``). Returns (the profile's ``memory``
    record: H from an independent micro-batch; ``memory_estimators``: the same-micro-batch variant)."""
    steps = sorted(k for k in adam if k in weights)
    lr = {adam[k]["lr"] for k in steps}
    if not steps:
        reason = "no probe checkpoint after an update (AdamW has no second moment before its first step)"
        return unmeasured_memory(reason, method="curvature-pairs", optimizer="adam", beta1=0.9), {}
    if len(lr) != 1:
        raise ValueError(f"the probe's learning rate changed between checkpoints ({sorted(lr)}): kappa needs one eta")
    eta, beta1 = lr.pop(), float(adam[steps[0]]["betas"][0])
    rng = np.random.default_rng(seed + 49979687)  # its own streams: every other measurement's draws unchanged
    generator = make_generator(policy.device, seed + 49979687)
    checkpoint = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    scratch = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    parts = []
    for i, k in enumerate(steps):
        checkpoint.model.load_state_dict(weights[k])
        parts.append(kappa_pairs_at(checkpoint, scratch, problems, config, adam[k], pairs, rng, generator, sampler,
                                    k))
        if on_pair is not None:
            on_pair(i + 1, len(steps))
    den = np.concatenate([p["den"] for p in parts])
    micro = max(1, config.batch_size // config.group_size // 2) * config.group_size
    num_params = sum(p.numel() for p in policy.model.parameters())
    source = (f"validate calibrate-model: {num_params} parameters, loss {config.loss}, AdamW lr {eta:g} (weight decay "
              f"{adam[steps[0]]['weight_decay']:g}: a further lr x wd contraction per step, not in kappa); "
              f"{pairs} pairs at each of {len(steps)} probe checkpoints (after {', '.join(map(str, steps))} updates), "
              f"micro-batches of {micro} completions")
    records = {}
    for name, text in (("independent", "H xi by central differences of a third, independent micro-batch's "
                                        "on-policy gradient times its completions' ratio pi_theta' / pi_theta (the "
                                        "field's Jacobian), re-scored at theta +- h xi, h = "
                                        f"{KAPPA_FD_STEP:g} |theta| / |xi|"),
                       ("surrogate", "H xi of the third micro-batch's own loss (per-token ratios on fixed "
                                     "completions: no score cross terms between tokens)"),
                       ("same", "H xi of the pair's first micro-batch, reweighted (shares its completions with xi: "
                                "biased)")):
        num = np.concatenate([p[name] for p in parts])
        records[name] = {**curvature_pairs_record(num, den, eta, np.random.default_rng(seed + 104743), optimizer="adam",
                                                  beta1=beta1, pilot_batch=float(config.batch_size),
                                                  n_boot=KAPPA_BOOTSTRAP,
                                                  detail={"hvp": text, "preconditioner": "AdamW's next update: "
                                                          "exp_avg_sq with the pair's mean gradient, bias-corrected, "
                                                          "eps"}),
                         "source": source}
    return records["independent"], {"curvature-pairs-surrogate-hessian": records["surrogate"],
                                    "curvature-pairs-same-micro-batch": records["same"]}


def kappa_line(record: dict) -> str:
    """The printed kappa of a ``memory`` record, with its interval and the memory 1/kappa in steps."""
    if record.get("kappa") is None:
        return f"optimizer memory kappa: not measured: {record['reason']}"
    lo, hi = record["kappa_interval"]

    def text(v) -> str:
        return "nan" if v is None else f"{v:.4g}"

    return (f"optimizer memory kappa = lr tr(D H D Sigma) / tr(D Sigma) ({record['optimizer']}, beta1 "
            f"{record['beta1']:g}, curvature pairs) = {record['kappa']:.4g}, {record['level']:.0%} interval "
            f"[{text(lo)}, {text(hi)}] ({record['units']} pairs); memory 1/kappa = {1 / record['kappa']:.3g} steps")


KL_LAGS = (1, 2, 4, 8)


def _cpu_state(model: torch.nn.Module) -> dict:
    """A CPU copy of the weights: snapshots of a GPU model must not fill the GPU."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _check_calibration_sizes(config: RLConfig, staleness: tuple[int, ...], samples: int, reference_samples: int,
                             noise_samples: int, noise_checkpoints: int, kappa_pairs: int) -> None:
    """calibrate_lm's sizes, checked before the probe: whole prompt groups, at least two (the bootstrap units)."""
    require_integer("noise_checkpoints", noise_checkpoints, 1)
    require_integer("kappa_pairs", kappa_pairs, 0, note=" (0: kappa not measured)")
    if samples % config.group_size or samples < 2 * config.group_size:
        raise ValueError(f"samples must be a multiple of group_size = {config.group_size} and >= "
                         f"{2 * config.group_size} (the prompt groups are the bootstrap units), got {samples}")
    if reference_samples < 2 * config.group_size or reference_samples % config.group_size:
        raise ValueError(f"reference_samples must be a multiple of group_size = {config.group_size} and >= "
                         f"{2 * config.group_size}, got {reference_samples}")
    if config.steps <= max(staleness):
        raise ValueError(f"steps must exceed the largest staleness probed = {max(staleness)}, got {config.steps}")
    if noise_samples < 2 * config.group_size or noise_samples % config.group_size:
        raise ValueError(f"noise_samples must be a multiple of group_size = {config.group_size} and >= "
                         f"{2 * config.group_size} (prompt groups are the noise scale's units), got {noise_samples}")


@dataclass
class ProbeRun:
    """The calibration's probe run and the weights it kept on the way (CPU copies)."""

    result: RLResult  # the final buffer, the metrics, the timing mu
    snapshots: collections.deque  # theta before each of the last updates, newest last (pi_{t-s} for s < maxlen)
    noise_states: dict[int, dict]  # updates done -> weights at B_noise's earlier checkpoints (the final one excluded)
    kappa_weights: dict[int, dict]  # updates done -> weights at kappa's checkpoints
    kappa_adam: dict[int, dict]  # updates done -> the probe's AdamW state there (adamw_snapshot)


def run_probe(policy: Policy, problems, config: RLConfig, sampler: Sampler, staleness: tuple[int, ...],
              noise_steps: list[int], kappa_pairs: int, tick: Callable[[str, int, int], None]) -> ProbeRun:
    """Train the probe (``validate.rl.train``), keeping the weights every later measurement reads."""
    keep = max(max(staleness), max(KL_LAGS)) + 1  # only the last `keep` versions are ever read
    snapshots = collections.deque([_cpu_state(policy.model)], maxlen=keep)  # theta before each update, newest last
    noise_states = {0: snapshots[0]} if 0 in noise_steps else {}  # updates done -> weights (CPU), final excluded
    kappa_weights, kappa_adam, probe_optimizer = {}, {}, {}  # updates done -> weights, AdamW state (kappa)

    def keep_optimizer(optimizer, args, kwargs) -> None:  # train builds its AdamW inside: seen at its steps
        if optimizer.param_groups[0]["params"][0] is next(policy.model.parameters()):
            probe_optimizer["adamw"] = optimizer

    def after_probe_step(step: int, metrics: dict) -> None:
        snapshots.append(_cpu_state(policy.model))
        if step + 1 in noise_steps and step + 1 < config.steps:
            noise_states[step + 1] = snapshots[-1]
        if step + 1 in noise_steps and kappa_pairs and "adamw" in probe_optimizer:
            kappa_weights[step + 1] = snapshots[-1]
            kappa_adam[step + 1] = adamw_snapshot(probe_optimizer["adamw"], policy.model)
        tick("probe (RL steps)", step + 1, config.steps)

    hook = register_optimizer_step_post_hook(keep_optimizer)
    try:
        result = train(policy, problems, config, progress=after_probe_step, sampler=sampler)
    finally:
        hook.remove()
    return ProbeRun(result, snapshots, noise_states, kappa_weights, kappa_adam)


def _group_means(grads: np.ndarray, group_size: int) -> np.ndarray:
    """(n, k) in consecutive groups of G -> (n / G, k): the prompt groups, B_noise's units."""
    return grads.reshape(-1, group_size, grads.shape[1]).mean(axis=1)


def block_rows(group_size: int) -> int:
    """Rows of a per-sample gradient block: about ``GRAD_BLOCK``, whole prompt groups and a multiple of 4.

    Why 4: BLAS's matrix-vector kernel takes the rows of ``block @ g_ref`` four at a time, so blocks that start at
    multiples of 4 give each <G_i, g_ref> the same rounding as the whole chunk in one call (the numbers the
    calibration recorded before it reduced block by block; tests/golden's validate-fixed-b checks them)."""
    step = math.lcm(4, group_size)
    return max(step, GRAD_BLOCK // step * step)


class UnitRows:
    """One checkpoint's B_noise units (prompt-group mean gradients, (U, k) float64) written in place as they come,
    then reduced to ``gram_rows`` in place: no list of parts to concatenate, no copy to factor."""

    def __init__(self, units: int, dim: int):
        self.array: np.ndarray | None = np.empty((units, dim))  # pages are touched (resident) as rows are written
        self.count = 0

    def add(self, means: np.ndarray) -> None:
        assert self.array is not None, "add after gram_rows"
        self.array[self.count:self.count + means.shape[0]] = means
        self.count += means.shape[0]

    def gram_rows(self) -> np.ndarray:
        """``gram_rows`` of the units, (U, U); the units' memory is released."""
        array, self.array = self.array, None
        assert array is not None and self.count == array.shape[0], "gram_rows of units not all written"
        return gram_rows(array, overwrite=True)


class RowSums:
    """Running sum and sum of squares of rows given block by block: (k,) each.

    Row after row from zeros, the order numpy's ``chunk.sum(0)`` and ``(chunk**2).sum(0)`` add a whole chunk in, so
    the sums are the same bit for bit without the chunk ever being one array."""

    def __init__(self, dim: int):
        self.sum, self.sum_sq, self._square = np.zeros(dim), np.zeros(dim), np.empty(dim)

    def add(self, block: np.ndarray) -> None:
        for row in block:
            self.sum += row
            self.sum_sq += np.multiply(row, row, out=self._square)


class GradientProbe:
    """Per-sample gradients on the probe's policies, on ``coords`` random coordinates (all: ``coords`` None), each
    batch counted for the progress display; completions of pi_{t-lag} drawn from the probe's snapshots.

    One instance holds the random streams of the sigma^2(s) and rho completions (seed + 7919), so the order of its
    calls fixes the draws. Memory: a batch's gradients come in blocks of ``block_rows`` rows (``blocks``), each
    reduced at once to what the estimators sum (group means, running sums, inner products); what stays is the
    B_noise units of one checkpoint (``UnitRows``).
    """

    def __init__(self, policy: Policy, problems, config: RLConfig, sampler: Sampler, probe: ProbeRun, seed: int,
                 max_grad_coords: int | None, tick: Callable[[str, int, int], None], total_batches: int):
        self.policy, self.problems, self.config, self.sampler, self.probe = policy, problems, config, sampler, probe
        self.tick, self.total_batches, self.batches = tick, total_batches, 0
        self.generator = torch.Generator(device="cpu").manual_seed(seed + 7919)
        self.rng = np.random.default_rng(seed + 7919)
        self.behaviour = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        self.num_params = sum(p.numel() for p in policy.model.parameters())
        self.coords = gradient_coordinates(self.num_params, max_grad_coords, seed + 31)
        self.dim = self.num_params if self.coords is None else int(self.coords.numel())  # k: coordinates kept
        # E[sum over k random coords] = k/P ||v||^2
        self.scale = 1.0 if self.coords is None else self.num_params / self.coords.numel()
        self._block: np.ndarray | None = None  # the one (block_rows, k) buffer ``blocks`` fills
        self.drift_sums: dict[int, list] = {}  # staleness -> [sum of (log r)^2, tokens] (``staleness_moments``)

    def completions_of(self, lag: int, count: int):
        """``count`` completions of pi_{t-lag} (t: the probe's last step), on random problems."""
        config = self.config
        self.behaviour.model.load_state_dict(self.probe.snapshots[-1 - lag])
        index = self.rng.integers(0, len(self.problems), size=count // config.group_size)
        self.sampler.sync(self.behaviour)  # the engine samples from pi_{t-lag}
        batch, _ = generate_batch(self.behaviour, self.problems, index, config, config.steps - lag, 0, self.generator,
                                  self.sampler)
        return batch

    def blocks(self, batch, at: Policy | None = None) -> Iterator[np.ndarray]:
        """The per-sample gradients of ``at`` (default: the final policy) on ``batch``, float64, scaled so that sums
        over the k coords estimate all P: consecutive (b, k) row blocks, b = ``block_rows(G)`` (the last may be
        shorter). Each is a view of one reused buffer, overwritten by the next: reduce it before asking for more."""
        at = self.policy if at is None else at
        rows = block_rows(self.config.group_size)
        if self._block is None:
            self._block = np.empty((rows, self.dim))
        block, filled = self._block, 0
        for grad in iter_sample_grads(at, self.problems, batch, self.config, self.coords):
            block[filled] = grad.cpu().numpy()  # float32 -> float64, exact
            filled += 1
            if filled == rows:
                block *= math.sqrt(self.scale)
                yield block
                filled = 0
        if filled:
            block[:filled] *= math.sqrt(self.scale)
            yield block[:filled]
        self.batches += 1
        self.tick("noise (gradient batches)", self.batches, self.total_batches)

    def grads_of(self, batch, at: Policy | None = None) -> np.ndarray:
        """(n, k) float64 per-sample gradients of ``at`` (default: the final policy); sums over k coords estimate
        all P."""
        grads, start = np.empty((batch.size, self.dim)), 0
        for block in self.blocks(batch, at):
            grads[start:start + block.shape[0]] = block
            start += block.shape[0]
        return grads

    def earlier_noise_rows(self, noise_samples: int, chunk_size: int, seed: int) -> dict[int, np.ndarray]:
        """B_noise at the earlier checkpoints: fresh groups of each checkpoint's own weights, its own loss gradient;
        updates done -> ``gram_rows`` of its (U, k) group means, made before the next checkpoint's (one checkpoint's
        units held at a time; the final theta's are the later measurements' ``UnitRows``)."""
        config = self.config
        rows: dict[int, np.ndarray] = {}
        noise_generator = torch.Generator(device="cpu").manual_seed(seed + 15485863)  # own streams: the sigma^2(s)
        noise_rng = np.random.default_rng(seed + 15485863)  # and rho completions are those drawn without B_noise
        for done, state in sorted(self.probe.noise_states.items()):
            self.behaviour.model.load_state_dict(state)
            self.sampler.sync(self.behaviour)
            units = UnitRows(noise_samples // config.group_size, self.dim)
            for start in range(0, noise_samples, chunk_size):
                count = min(chunk_size, noise_samples - start) // config.group_size
                index = noise_rng.integers(0, len(self.problems), size=count)
                batch, _ = generate_batch(self.behaviour, self.problems, index, config, done, 0, noise_generator,
                                          self.sampler)
                for block in self.blocks(batch, self.behaviour):
                    units.add(_group_means(block, config.group_size))
            rows[done] = units.gram_rows()
        return rows

    def reference(self, reference_samples: int, chunk_size: int, fresh_units: UnitRows
                  ) -> tuple[np.ndarray, float, int]:
        """grad F: the mean gradient of a held-out batch, in chunks (only running sums are kept); its variance
        E||g_ref - grad F||^2 and size. Each chunk's prompt groups join ``fresh_units`` (the final theta's)."""
        total, total_sq, n_ref = 0.0, 0.0, 0
        while n_ref < reference_samples:
            batch = self.completions_of(0, min(chunk_size, reference_samples - n_ref))
            sums = RowSums(self.dim)  # the chunk's, added to the totals as a whole (the order of the sums kept)
            for block in self.blocks(batch):
                fresh_units.add(_group_means(block, self.config.group_size))  # fresh groups of the final theta
                sums.add(block)
            total, total_sq, n_ref = total + sums.sum, total_sq + sums.sum_sq, n_ref + batch.size
        reference = np.asarray(total / n_ref)  # (k,): a sum of (k,) chunks, at least one (reference_samples >= 2 G)
        ref_var = float(((total_sq - n_ref * reference**2) / (n_ref - 1)).sum() / n_ref)  # reference_variance's
        return reference, ref_var, n_ref

    def _add_drift(self, s: int, batch) -> None:
        """The completions of pi_{t-s} re-scored at the final policy: sum of (log pi_t - log pi_{t-s})^2 over their
        tokens (their sampled log-probs against one forward pass), what a trainer's drift log measures."""
        prompt_ids, prompt_mask = encode_prompts(self.policy, [self.problems[i].prompt_text() for i in batch.prompt[0]])
        ids = torch.as_tensor(batch.tokens[0], device=self.policy.device)
        mask = torch.as_tensor(batch.mask[0].astype(np.int64), device=self.policy.device)
        with torch.no_grad():
            now = sequence_logprobs(self.policy, prompt_ids, prompt_mask, ids, mask,
                                    temperature=self.config.temperature).double().cpu().numpy()  # (n, L)
        live = batch.mask[0]
        total = self.drift_sums.setdefault(s, [0.0, 0])
        total[0] += float(np.sum(((now - batch.logp_behav[0]) ** 2)[live]))
        total[1] += int(live.sum())

    def drift_record(self) -> dict:
        """The profile's "drift" record from ``staleness_moments``' completions: M2(s) by staleness, M2(0) = 0 by
        definition (the measured age-0 value, the sampler's own mismatch, kept beside it); empty with no age > 0."""
        ages = sorted(self.drift_sums)
        if not ages or ages[0] != 0 or len(ages) < 2:
            return {}
        m2 = [self.drift_sums[s][0] / max(self.drift_sums[s][1], 1) for s in ages]
        return {"staleness": [float(s) for s in ages], "m2": [0.0] + m2[1:], "m2_age0_measured": m2[0],
                "tokens": [self.drift_sums[s][1] for s in ages],
                "source": "validate calibrate-model: the sigma^2(s) probe's completions of pi_t-s (sampled log-probs) "
                          "re-scored at the final policy t, M2(s) = token mean of (log pi_t - log pi_t-s)^2"}

    def staleness_moments(self, staleness: tuple[int, ...], samples: int, chunk_size: int, reference: np.ndarray,
                          fresh_units: UnitRows):
        """sigma^2(s)'s sums: each block of gradients of completions of pi_{t-s} is reduced to its rows' ||G||^2 and
        <G, g_ref> at once, so ``samples`` is limited by time, not memory (1024 x 253K float64 gradients would be
        2 GB per staleness). (U, K) prompt-group means each, and the completions of pi_t (the KL by lag is measured
        on them)."""
        fresh = None
        group_sq, group_inner = [], []  # per staleness: (U,) arrays
        self.drift_sums = {}  # the drift M2(s)'s sums, afresh
        for s in staleness:
            sq_parts, inner_parts = [], []
            for start in range(0, samples, chunk_size):
                batch = self.completions_of(s, min(chunk_size, samples - start))
                self._add_drift(s, batch)
                if s == 0 and fresh is None:
                    fresh = batch
                moments = []
                for block in self.blocks(batch):
                    if s == 0:
                        fresh_units.add(_group_means(block, self.config.group_size))
                    moments.append(row_moments(block, reference))
                sq, inner = group_means_of_rows(*(np.concatenate(m) for m in zip(*moments)),
                                                group_size=self.config.group_size)
                sq_parts.append(sq)
                inner_parts.append(inner)
            group_sq.append(np.concatenate(sq_parts))
            group_inner.append(np.concatenate(inner_parts))
        return np.stack(group_sq, axis=1), np.stack(group_inner, axis=1), fresh


def calibrate_lm(policy: Policy, problems: list[countdown.Problem], config: RLConfig,
                 staleness: tuple[int, ...] = (0, 1, 2, 4, 8), samples: int = 32, seed: int = 0,
                 sampler: Sampler | None = None, mu_window_seconds: float = 0.0,
                 max_grad_coords: int | None = MAX_GRAD_COORDS,
                 reference_samples: int | None = None,
                 kl_chunk_elements: int = KL_CHUNK_ELEMENTS,
                 on_phase: Callable[[str, int, int], None] | None = None,
                 noise_checkpoints: int = 3, noise_samples: int | None = None,
                 kappa_pairs: int = DEFAULT_KAPPA_PAIRS) -> LMCalibration:
    """Probe run of ``config`` on ``problems``, then sigma^2(s), rho and KL(pi_t || pi_t-lag) at its last step.

    With ``mu_window_seconds > 0``, also the App. E count-based mu over a window of that length
    (``measure_mu_count``, on a copy of the final policy). ``sampler`` generates every completion
    (default: the HF loop). ``reference_samples`` (default 4 ``samples``) fresh completions, held out,
    estimate grad F; the gaps probed for rho are those the probe's buffer holds (capacity / R - 1).
    ``samples`` must be a multiple of ``group_size`` with at least 2 groups: the groups are the bootstrap units.
    ``on_phase(phase, done, total)`` is called after each unit of work (progress display).
    B_noise (module docstring): at ``noise_checkpoints`` probe steps from 0 to ``config.steps`` updates, each
    but the last with ``noise_samples`` (default ``reference_samples``) fresh completions of its own weights.
    kappa (the optimizer's memory, ``measure_lm_kappa``): ``kappa_pairs`` curvature pairs at each of those checkpoints
    that follows an update, preconditioned by the probe's AdamW state there (0: not measured).

    The steps: the probe (``run_probe``), the gradient measurements (``GradientProbe``: B_noise's earlier
    checkpoints, grad F, sigma^2(s)), the KL by lag, rho, the count mu, B_noise pooled, kappa, and the record
    (``lm_calibration``).
    """
    reference_samples = 4 * samples if reference_samples is None else reference_samples
    noise_samples = reference_samples if noise_samples is None else noise_samples
    _check_calibration_sizes(config, staleness, samples, reference_samples, noise_samples, noise_checkpoints,
                             kappa_pairs)
    noise_steps = sorted(set(np.linspace(0, config.steps, noise_checkpoints).round().astype(int).tolist())
                         | {config.steps})[-noise_checkpoints:]  # updates done; the last is the final theta
    sampler = HFSampler(stale_copy=config.sync_every > 1) if sampler is None else sampler
    tick = on_phase if on_phase is not None else (lambda phase, done, total: None)
    probe = run_probe(policy, problems, config, sampler, staleness, noise_steps, kappa_pairs, tick)
    chunk_size = max(config.group_size, GRAD_CHUNK // config.group_size * config.group_size)  # whole groups
    chunks = (-(-reference_samples // chunk_size) + len(staleness) * -(-samples // chunk_size)
              + (len(noise_steps) - 1) * -(-noise_samples // chunk_size))
    grads = GradientProbe(policy, problems, config, sampler, probe, seed, max_grad_coords, tick,
                          total_batches=chunks + 1)  # reference chunks, staleness chunks, the buffer
    noise_rows = grads.earlier_noise_rows(noise_samples, chunk_size, seed)  # updates done -> gram_rows
    final_units = UnitRows((reference_samples + samples) // config.group_size, grads.dim)  # the reference, s = 0
    reference, ref_var, n_ref = grads.reference(reference_samples, chunk_size, final_units)
    sq_norm, inner, fresh = grads.staleness_moments(staleness, samples, chunk_size, reference, final_units)
    noise_rows[config.steps] = final_units.gram_rows()  # its 1.3 GB (at the defaults) released before the rest
    units = sq_norm.shape[0]
    # ||grad F||^2 by einsum, not BLAS's dot: a threaded dot sums in an order set by the thread count (with BLAS,
    # golden validate-fixed-b's sigma^2 read 15.066522535399045 on one thread and 15.06652253539903 on two)
    true_sq = float(np.einsum("d,d->", reference, reference)) - ref_var
    moments = noise_estimators.StalenessMoments(sq_norm, inner, np.full(units, true_sq), np.ones(units))
    profile = noise_estimators.noise_profile(moments, staleness, seed=seed)
    kl = measure_kl_by_lag(policy, grads.behaviour, problems, fresh, probe.snapshots, config, kl_chunk_elements)
    rho_fit = _buffer_rho(probe.result.buffer, config, reference, ref_var, grads.grads_of, seed)
    tenths = int(math.ceil(10 * mu_window_seconds))
    count = (measure_mu_count(policy, problems, config, mu_window_seconds, sampler, seed,
                              on_call=lambda seconds: tick("App. E count window (0.1 s)", int(10 * seconds), tenths))
             if mu_window_seconds > 0 else {})
    pooled = pooled_noise_scale([noise_rows[k] for k in noise_steps], np.random.default_rng(seed + 104723),
                                unit_size=config.group_size)
    memory, memory_estimators = {}, {}
    if kappa_pairs:
        memory, memory_estimators = measure_lm_kappa(
            policy, problems, config, probe.kappa_weights, probe.kappa_adam, sampler, seed, kappa_pairs,
            on_pair=lambda done, total: tick("kappa (curvature pairs per checkpoint)", done, total))
        sampler.sync(policy)  # the engine back on the final weights
    noise_record = {**pooled.to_dict(), "batch": int(config.batch_size), "unit_size": int(config.group_size),
                    "source": _noise_source(policy, config, grads, {k: noise_rows[k] for k in noise_steps})}
    return LMCalibration(
        mu_timing=probe.result.mu_timing(), rho=rho_fit.value,
        correlation_by_gap={h: c for h, c in enumerate(rho_fit.correlation)},
        kl_by_lag=kl["exact"], kl_drift_per_step=kl["exact"].get(1, math.nan), probe_metrics=probe.result.metrics,
        mu_count=count.get("mu", math.nan), count_window=count,
        grad_coords=None if grads.coords is None else int(grads.coords.numel()),
        rho_fit={**rho_fit.to_dict(), "bootstrap_unit": "prompt group of the probe's final buffer"},
        reference_samples=n_ref, reference_variance=ref_var, kl_by_lag_se=kl["exact_se"], kl_by_lag_k3=kl["k3"],
        kl_by_lag_k3_se=kl["k3_se"], kl_by_lag_k1=kl["k1"], kl_by_lag_k1_se=kl["k1_se"],
        noise_scale=noise_record, memory=memory, memory_estimators=memory_estimators, drift=grads.drift_record(),
        **sigma_sq_fields(profile, staleness, config.loss),
    )


def _noise_source(policy: Policy, config: RLConfig, grads: GradientProbe, noise_rows: dict) -> str:
    """The noise_scale record's ``source``: the model, the probe's sizes, where the fresh groups came from
    (``noise_rows``: updates done -> ``gram_rows``, one row per group)."""
    model_config = policy.model.config
    counts = {k: rows.shape[0] for k, rows in noise_rows.items()}
    coords, num_params = grads.coords, grads.num_params
    return (f"validate calibrate-model: {getattr(model_config, 'name_or_path', '') or model_config.model_type} "
            f"({num_params} parameters, {model_config.model_type}), loss {config.loss}, B = "
            f"{config.batch_size}, R = {config.rollouts_per_step}, G = {config.group_size}, lr {config.lr:g}; "
            f"fresh groups after {', '.join(f'{k} ({counts[k]} groups)' for k in counts)} of "
            f"{config.steps} probe updates (plateau not checked); "
            + ("all coordinates" if coords is None else
               f"{coords.numel()} of {num_params} coordinates (the scale cancels in the ratio)"))


def sigma_sq_fields(profile: noise_estimators.NoiseProfile, staleness: tuple[int, ...], loss: str) -> dict:
    """LMCalibration's sigma^2(s) fields: both forms with their intervals, the one ``loss`` needs (``loss_form``)
    as ``sigma_sq``, and the power laws fitted to its finite positive values."""
    staleness_f = [float(s) for s in staleness]
    form = loss_form(loss)
    sigma_sq = list(profile.plain if form == "plain" else profile.signal_normalised)
    sigma_sq_ci = profile.plain_ci if form == "plain" else profile.signal_normalised_ci
    finite = [i for i, v in enumerate(sigma_sq) if math.isfinite(v) and v > 0]
    return dict(
        staleness=staleness_f, sigma_sq=sigma_sq,
        fits=fit_profiles(np.asarray(staleness_f)[finite], np.asarray(sigma_sq)[finite]) if len(finite) >= 2 else {},
        sigma_sq_form=form, loss=loss, sigma_sq_plain=list(profile.plain),
        sigma_sq_signal_normalised=list(profile.signal_normalised), retained_signal=list(profile.retained),
        sigma_sq_ci=[list(c) for c in sigma_sq_ci], sigma_sq_plain_ci=[list(c) for c in profile.plain_ci],
        sigma_sq_signal_normalised_ci=[list(c) for c in profile.signal_normalised_ci],
        retained_signal_ci=[list(c) for c in profile.retained_ci], sigma_sq_level=profile.level,
        sigma_sq_units=profile.units,
    )


def group_moments(grads: np.ndarray, reference: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt group of ``grads`` (n, d) (rows in consecutive groups of G): mean ||G_i||^2 and mean <G_i, g_ref>.

    What ``theory.noise.staleness_moments`` sums per unit, without keeping the gradients: (n / G,) each.
    """
    return group_means_of_rows(*row_moments(grads, reference), group_size=group_size)


def row_moments(grads: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """||G_i||^2 and <G_i, g_ref> of each row of ``grads`` (n, d): (n,) each. Row blocks whose sizes are multiples
    of 4 give the same numbers as the whole array (``block_rows``)."""
    return np.einsum("nd,nd->n", grads, grads), grads @ reference


def group_means_of_rows(sq: np.ndarray, inner: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``row_moments``' (n,) arrays -> their means per prompt group of G consecutive rows: (n / G,) each."""
    n = sq.shape[0]
    if n % group_size:
        raise ValueError(f"need whole prompt groups: {n} samples in groups of {group_size}")
    return sq.reshape(-1, group_size).mean(axis=1), inner.reshape(-1, group_size).mean(axis=1)


def staleness_profile(grads: np.ndarray, reference: np.ndarray, ref_var: float, group_size: int, staleness,
                      seed: int = 0) -> noise_estimators.NoiseProfile:
    """sigma^2(s) and r(s) with prompt-group bootstrap intervals from per-sample gradients ``grads`` (K, n, d).

    Row i of every staleness value belongs to prompt group i // ``group_size`` (completions come in
    consecutive groups of G, one prompt each); groups are independent given the policy, so unit u is
    group u of every staleness value: (K, n, d) -> (U = n / G, K, G, d). The reference is broadcast to
    every unit: its Monte Carlo error ``ref_var`` is subtracted but the reference is not resampled.
    """
    K, n, d = grads.shape
    if n % group_size or n < 2 * group_size:
        raise ValueError(f"need whole prompt groups, at least 2: {n} samples in groups of {group_size}")
    units = grads.reshape(K, n // group_size, group_size, d).transpose(1, 0, 2, 3)  # (U, K, G, d), a view
    U = units.shape[0]
    moments = noise_estimators.staleness_moments(units, np.broadcast_to(reference, (U, d)), ref_var)
    return noise_estimators.noise_profile(moments, staleness, seed=seed)


def sequence_kl_terms(current: Policy, old: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      ids: torch.Tensor, mask: torch.Tensor, temperature: float,
                      chunk_elements: int = KL_CHUNK_ELEMENTS) -> dict[str, np.ndarray]:
    """Per-sequence KL(pi_current || pi_old) of completions ``ids`` (n, L) sampled from pi_current: (n,) arrays.

    ``exact``: sum over unmasked positions of sum_v p_v (log p_v - log q_v) over the whole vocabulary
    (p = pi_current, q = pi_old given the prefix), each term written as q g(d) >= 0, g(d) = e^d (d - 1) + 1,
    d = log p - log q (``theory.divergences.kl_exact``'s form: float64, both rows renormalised), so it is
    never negative. ``k3``: sum over tokens of k3_terms(log q - log p) of the sampled token (the model's
    float32 token log-probs, as ``sequence_logprobs`` gives them); ``k1``: sum of (log p - log q).
    Completions go through in chunks of at most ``chunk_elements`` / (L V) rows (at least one).
    """
    n, L = ids.shape
    was_training = (current.model.training, old.model.training)
    current.model.eval()
    old.model.eval()
    out = {"exact": np.zeros(n), "k3": np.zeros(n), "k1": np.zeros(n)}
    chunk = max(1, chunk_elements // max(1, L * int(current.model.config.vocab_size)))  # rows per pass
    with torch.no_grad():
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            args = (prompt_ids[rows], prompt_mask[rows], ids[rows], mask[rows])
            lp = next_token_logprobs(current, *args, temperature=temperature).double()  # (c, L, V)
            lq = next_token_logprobs(old, *args, temperature=temperature).double()  # (c, L, V)
            live = mask[rows].to(torch.float64)  # (c, L)
            token = ids[rows].unsqueeze(-1)
            log_ratio = ((lq.gather(-1, token) - lp.gather(-1, token)).squeeze(-1) * live).cpu().numpy()  # (c, L)
            # renormalised in float64 (float32 rows sum to 1 only to ~1e-7): the Bregman form below needs
            # sum p = sum q exactly, else a tiny KL would carry a bias of that size
            lp, lq = lp - lp.logsumexp(-1, keepdim=True), lq - lq.logsumexp(-1, keepdim=True)
            d = lp - lq
            em = torch.expm1(d)
            # q g(d) = q (d e^d - e^d + 1) = q (d expm1(d) - (expm1(d) - d)) for |d| <= 1 (no cancellation of
            # the leading d^2 / 2), p (d - 1) + q beyond (no e^d overflow); clamped at 0 against rounding only
            term = torch.where(d.abs() <= 1.0, lq.exp() * (d * em - (em - d)), lp.exp() * (d - 1.0) + lq.exp())
            exact = (term.clamp_min(0.0).sum(-1) * live).sum(-1)  # (c,)
            stop = start + exact.shape[0]
            out["exact"][start:stop] = exact.cpu().numpy()
            out["k3"][start:stop] = (k3_terms(log_ratio) * live.cpu().numpy()).sum(-1)  # padding: log r = 0 -> 0
            out["k1"][start:stop] = -log_ratio.sum(-1)
    if was_training[0]:
        current.model.train()
    if was_training[1]:
        old.model.train()
    return out


def _group_mean_and_se(values: np.ndarray, group: np.ndarray) -> tuple[float, float]:
    """Mean of per-sequence ``values`` and its standard error over prompt groups (the independent units)."""
    _, gi = np.unique(group, return_inverse=True)
    means = np.bincount(gi, weights=values) / np.bincount(gi)  # (groups,)
    se = float(means.std(ddof=1) / math.sqrt(means.size)) if means.size >= 2 else math.nan
    return float(values.mean()), se


def measure_kl_by_lag(policy: Policy, behaviour: Policy, problems, fresh, snapshots, config: RLConfig,
                      chunk_elements: int = KL_CHUNK_ELEMENTS) -> dict[str, dict[int, float]]:
    """KL(pi_t || pi_{t-lag}) for each lag in ``KL_LAGS`` the snapshots reach, on fresh completions of pi_t.

    ``policy`` is pi_t; ``behaviour`` is loaded with ``snapshots[-1 - lag]`` (weights before each update,
    newest last). Returns dicts by lag: ``exact`` (``sequence_kl_terms``), ``k3``, ``k1`` (means over the
    completions) and their standard errors over prompt groups ``exact_se``, ``k3_se``, ``k1_se``.
    """
    prompt_ids, prompt_mask = encode_prompts(policy, [problems[i].prompt_text() for i in fresh.prompt[0]])
    ids = torch.as_tensor(fresh.tokens[0], device=policy.device)
    mask = torch.as_tensor(fresh.mask[0].astype(np.int64), device=policy.device)
    out: dict[str, dict[int, float]] = {k: {} for k in ("exact", "exact_se", "k3", "k3_se", "k1", "k1_se")}
    for lag in KL_LAGS:
        if lag < len(snapshots):
            behaviour.model.load_state_dict(snapshots[-1 - lag])
            terms = sequence_kl_terms(policy, behaviour, prompt_ids, prompt_mask, ids, mask, config.temperature,
                                      chunk_elements)
            for name, values in terms.items():
                out[name][lag], out[f"{name}_se"][lag] = _group_mean_and_se(values, fresh.group[0])
    return out


def _buffer_rho(buffer, config: RLConfig, reference: np.ndarray, ref_var: float, grads_of,
                seed: int = 0) -> noise_estimators.RhoFit:
    """rho from the FIFO items' noise against the held-out reference, gaps the buffer holds, with an interval
    from a bootstrap over the buffer's prompt groups (``theory.noise.fit_rho_group_bootstrap``)."""
    R = config.rollouts_per_step
    max_gap = max(config.capacity // R - 1, 1)
    if buffer is None or not hasattr(buffer, "valid") or not buffer.valid[0].any():
        empty = np.zeros((1, max_gap + 1))
        moments = noise_estimators.PairMoments(empty, empty, empty, np.zeros(1), np.zeros(1), np.zeros(1))
        return noise_estimators.fit_rho(moments, config.capacity)
    valid = np.nonzero(buffer.valid[0])[0]
    batch = buffer.stored(valid[None, :])  # (1, n, ...)
    eps = grads_of(batch)  # (n, k)
    eps -= reference  # in place: no second (n, k) array
    return noise_estimators.fit_rho_group_bootstrap(eps, batch.created[0], batch.group[0], max_gap, config.capacity,
                                                    reference_variance=ref_var, seed=seed)


def write_calibration(calibration: LMCalibration, out_dir: Path, source: str) -> None:
    """calibration.json (everything) and profile.json (what `optimal --profile` reads); never overwrites."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_profile(out_dir / "profile.json", calibration.profile_dict(source))
    with (out_dir / "calibration.json").open("x") as handle:
        json.dump(dataclasses.asdict(calibration), handle, indent=1, default=float)
