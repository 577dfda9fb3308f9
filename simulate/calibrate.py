"""Measure the theory's inputs on the simulator: sigma^2(s) in two forms, rho, and the within-group correlation.

Paper: experience-replay (docs/REFERENCES.md), Assumption 3.3: E||eps_{t,i}||^2 <= sigma^2(t - t_i) and
corr(eps_{t,i}, eps_{t,j}) <= rho |t_i - t_j| / N; beside them B_noise (McCandlish et al. 2018, Eq. 2.11) and kappa
(theory/forgetting.py).  Estimators: ``theory/noise.py`` (shared with the LM validator).  grad F is the on-policy
gradient of the SAME (clipped) objective the run trains; the profile's ``sigma_sq`` is the form ``loss_form`` picks
(``sigma_sq_form``).  Exact gradients, the probe, B_noise and kappa: docs/SIMULATION.md, 'Calibrating the simulator'.

| code name                | paper symbol        | how it is measured here                                            |
|--------------------------|---------------------|--------------------------------------------------------------------|
| ``per_sample_grads``     | G(theta_t, z)       | the loss's gradient on one response (its own batch of one)         |
| ``exact_loss_gradient``  | grad F(theta_t)     | E over fresh on-policy groups of G(theta_t, z), enumerated exactly |
| ``profile.plain``        | sigma^2(s)          | E||G(theta_t, z) - grad F||^2 over z ~ pi_{t-s}                    |
| ``profile.retained``     | r(s)                | <E G_s, grad F> / ||grad F||^2                                     |
| ``profile.signal_normalised`` | sigma^2(s) / r(s)^2 | E||G_s / r(s) - grad F||^2                                   |
| ``rho_fit``              | rho                 | slope of the different-group correlation in gap / N (no clamp)     |
| ``rho_fit.within_group`` | (t_i = t_j term)    | correlation of two responses of one GRPO group, reported apart     |
| ``noise.estimate``       | B_noise             | per-sample: tr Sigma and |E G|^2 both from the group units        |
| ``noise.exact_grad``     | B_noise             | tr Sigma from the group units, |E G|^2 = ||grad F||^2 exact        |
| ``noise.unit_size``      | G                   | responses per unit: tr Sigma per sample = G tr Sigma_unit          |

| ``memory.estimators`` key | estimator                                                          | profile field      |
|---------------------------|--------------------------------------------------------------------|--------------------|
| (``memory.pairs``)        | curvature pairs xi = g_1 - g_2 of fresh minibatches, H xi of grad F | memory            |
| ``exact``                 | the whole Jacobian, Sigma from the noise scale's fresh groups      | memory_estimators  |
| ``independent``           | H xi of a third minibatch, score-reweighted (as the LM and TRL do) | memory_estimators  |
| ``surrogate``             | H xi of the third minibatch's own loss (no cross-token terms)      | memory_estimators  |
| ``same``                  | the pairs, H xi of the pair's first minibatch (biased)             | memory_estimators  |
| ``lag``                   | lag-1 autocorrelation of an on-policy run's update gradients       | memory_estimators  |
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..checks import Range, require_integer, require_one_of
from ..core.designs import LOSSES, compute_loss, loss_form, make_advantage
from ..core.memory import Estimate, Size, check_sizes, count
from ..core.pipeline import EnvBackend, generate
from ..core.rng import PerSeedGenerator
from ..core.rollouts import RolloutBatch
from ..theory import noise as noise_estimators
from ..theory.forgetting import KappaEstimate, drift_ages, kappa_from_curvature_pairs, kappa_from_gradient_series
from ..theory.noise import NoiseProfile, PairMoments, RhoFit
from ..theory.noise_scale import PooledNoiseScale, noise_scale_from_samples, pooled_noise_scale
from ..theory.profiles import drift_line, fit_profiles, memory_record, unmeasured_memory
from ..theory.resampling import central, quantile_interval, replicates
from .config import SimConfig, peak_bytes, policy_shape, response_bytes
from .engine import run

DEFAULT_STALENESS = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160)
DEFAULT_MAX_GAP = 64
DEFAULT_REFERENCE_SAMPLES = 4096
DEFAULT_NOISE_CHECKPOINTS = 8
DEFAULT_NOISE_GROUPS = 128
PLATEAU_FRACTION = 0.9
"""The reward plateau starts at the first evaluation reaching J0 + 0.9 (J_end - J0) (seed-mean curve)."""
NOISE_BOOTSTRAP = 1000
REFERENCES = ("auto", "exact", "sampled")
PROBE_ARGUMENTS = ("staleness", "samples", "max_gap", "reference", "reference_samples", "noise_checkpoints",
                   "noise_groups", "kappa_pairs")  # named in check_probe
RHO_BUFFERS = ("fifo", "positive-bias", "prioritized")  # buffers whose items the rho probe reads
FORMS = ("plain", "signal-normalised")
RHO_NOISE_TEXT = {
    "centred": "xi = G - E[G | creation step], exact (App. C.2: the proof bounds the correlation of the centred "
               "noise; the bias E[eps] is Assumption 3.2's)",
    "uncentred": "eps = G - grad F (includes products of the stale-sample biases)",
}



@dataclass(frozen=True)
class ProbeOptions:
    """``calibrate``'s probe arguments beside the config: ``replay-theory calibrate-simulator``'s options (a field's
    ``Range``: the range shown when the command line rejects a value; with ``at_parse``, the smallest it accepts)."""

    checkpoints: int = field(default=3, metadata=Range(1, integer=True, at_parse=True).field())
    """Training steps at which the noise is measured."""
    samples: int = field(default=256, metadata=Range(1, integer=True, note=", a multiple of --group-size",
                                                     at_parse=True).field())
    """Responses per staleness value and checkpoint (a multiple of --group-size)."""
    staleness: tuple[int, ...] = field(default=DEFAULT_STALENESS, metadata=Range(
        0, integer=True, noun="comma-separated integers").field())
    """Staleness values s of sigma^2(s), comma-separated increasing integers >= 0."""
    max_gap: int = DEFAULT_MAX_GAP
    """Largest creation-step gap for rho, >= 1 (the horizon x = N/R of a design grid); the probe's FIFO capacity is
    raised to (gap + 1) R if smaller."""
    reference: str = "auto"
    """grad F: exact (enumerated; bandit, or token-mdp except m2po), sampled (a held-out batch, its error subtracted)
    or auto."""
    reference_samples: int = DEFAULT_REFERENCE_SAMPLES
    """Responses in the sampled reference batch (a multiple of --group-size)."""
    noise_checkpoints: int = field(default=DEFAULT_NOISE_CHECKPOINTS, metadata=Range(1, integer=True).field())
    """Steps, evenly spread over the run, at which the noise scale B_noise is measured on fresh groups (those before
    the reward plateau are kept), >= 1."""
    noise_groups: int = field(default=DEFAULT_NOISE_GROUPS, metadata=Range(2, integer=True).field())
    """Fresh prompt groups per seed and noise-scale checkpoint, >= 2 (the units of B_noise)."""
    kappa_pairs: int | None = field(default=None, metadata=Range(0, integer=True, at_parse=True).field())
    """Curvature pairs per seed and kept noise-scale checkpoint for the optimizer's memory kappa, >= 0 (each: three
    fresh minibatches of B and Hessian-vector products; 0: kappa not measured). Default: the env's, 8 on the bandit
    and 2 on the token-mdp (DEFAULT_KAPPA_PAIRS)."""


_PROBE_DEFAULTS = {f.name: f.default for f in fields(ProbeOptions) if isinstance(f.default, int)}


def _add(acc: dict, name: str, value) -> None:
    """Sum a seed-unit measurement into ``acc[name]`` (checkpoints of one seed add up)."""
    acc[name] = value if name not in acc else acc[name] + value


def _clean(x: float):
    return None if not math.isfinite(x) else x


@dataclass
class Calibration:
    """What ``calibrate`` measured; ``profile_dict`` is the file ``optimal --profile`` reads."""

    staleness: np.ndarray  # (K,)
    sigma_sq: np.ndarray  # (K,) the form that matches the loss (``form``); inf where no signal is left
    form: str
    loss: str
    noise: NoiseProfile
    rho_fit: RhoFit | None  # the rho of the theorem (centred noise where exact); None: no FIFO items to correlate
    rho_fit_uncentred: RhoFit | None  # the same fit on eps = G - grad F (bias products included)
    rho_noise: str  # "centred" (xi = G - E[G | creation step], App. C.2) or "uncentred" (eps)
    kl_drift_per_step: float  # exact KL(pi_t || pi_{t-1}) averaged over checkpoints and seeds
    reference: str  # "exact" or "sampled (n = ...)"
    probe_capacity: int
    fits: dict = field(default_factory=dict)
    noise_scale: NoiseScaleMeasurement | None = None  # B_noise of the probe's own loss on fresh groups
    memory: KappaMeasurement | None = None  # kappa at the noise-scale checkpoints, three estimators
    drift: dict | None = None  # exact M2(s) of the run's last policy against its policy s updates earlier

    @property
    def rho(self) -> float:
        """The fitted rho as measured (NaN when not measured); may lie outside [0, 1]."""
        return math.nan if self.rho_fit is None else self.rho_fit.value

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The finite, positive prefix of (staleness, sigma_sq): where the matched form is defined."""
        ok = np.isfinite(self.sigma_sq) & (self.sigma_sq > 0)
        stop = int(np.argmin(ok)) if not ok.all() else ok.size
        return self.staleness[:stop], self.sigma_sq[:stop]

    def profile_dict(self, source: str) -> dict:
        """The profile file: the matched table, both forms, r(s), the rho fit (unclamped) and provenance.

        ``rho`` is written only when the fit lies in [0, 1]; otherwise ``rho_fit.in_range`` is false
        and ``optimal`` asks for an explicit ``--rho``.
        """
        s, v = self.table()
        if s.size < 2:
            raise ValueError(f"the {self.form} profile has fewer than 2 finite points (retained signal "
                             f"{', '.join(f'{r:.3g}' for r in self.noise.retained)}): no table to write")
        p = self.noise

        def series(values, cis):
            return {"value": [_clean(x) for x in values], "ci": [[_clean(a), _clean(b)] for a, b in cis]}

        data = {
            "kind": "table",
            "staleness": [float(x) for x in s],
            "sigma_sq": [float(x) for x in v],
            "sigma_sq_form": self.form,
            "loss": self.loss,
            "forms": {
                "staleness": list(p.staleness),
                "plain": series(p.plain, p.plain_ci),
                "signal_normalised": series(p.signal_normalised, p.signal_normalised_ci),
                "retained_signal": series(p.retained, p.retained_ci),
                "true_grad_sq": p.true_grad_sq,
                "level": p.level,
                "units": p.units,
            },
            "reference": self.reference,
            "probe_capacity": self.probe_capacity,
            "fits": self.fits,
            "kl_drift_per_step": self.kl_drift_per_step,
            "source": source,
        }
        if self.rho_fit is not None:
            data["rho_fit"] = {**self.rho_fit.to_dict(), "noise": RHO_NOISE_TEXT[self.rho_noise]}
            if self.rho_fit_uncentred is not None and self.rho_noise == "centred":
                data["rho_fit_uncentred"] = {**self.rho_fit_uncentred.to_dict(), "noise": RHO_NOISE_TEXT["uncentred"]}
            if self.rho_fit.in_range:
                data["rho"] = float(self.rho_fit.value)
        if self.noise_scale is not None:  # without signal (b_noise null) the rule has no input: kept apart, said
            record = self.noise_scale.record()
            data["noise_scale" if record["b_noise"] is not None else "noise_scale_unresolved"] = record
            if self.noise_scale.exact_grad is not None:
                data["noise_scale_exact_grad"] = self.noise_scale.record(exact=True)
        if self.memory is not None:  # beside b: the curvature-pairs kappa, the other estimators for comparison
            data["memory"], data["memory_estimators"] = self.memory.records()
        if self.drift is not None:  # the staleness cost optimal --profile prices, r(s) = 1 + M2(s)
            data["drift"] = self.drift
        return data


# --------------------------------------------------------------------------- per-sample and exact gradients


def _flatten(batch: RolloutBatch) -> RolloutBatch:
    """(S, M, ...) -> (S*M, 1, ...): every response becomes its own batch of one."""
    return RolloutBatch(**{f.name: _one(getattr(batch, f.name)) for f in fields(RolloutBatch)})


def _one(array: np.ndarray) -> np.ndarray:
    return array.reshape(array.shape[0] * array.shape[1], 1, *array.shape[2:])


def per_sample_grads(env, config: SimConfig, params: np.ndarray, batch: RolloutBatch) -> np.ndarray:
    """G(theta, z_i) for every response: (S, M, d), the loss gradient on a batch of one.

    On the bandit (one-token responses, features phi) the score phi[p, a] - E_pi phi[p, .] is formed
    directly; elsewhere every response gets its own copy of its seed's parameters (``_flatten``),
    which costs a full policy evaluation per response.
    """
    S, M = batch.prompt.shape
    if getattr(env, "seq_len", None) == 1 and hasattr(env, "features") and hasattr(env, "log_policy"):
        logp_new = env.logp(params, batch.prompt, batch.tokens, batch.mask)  # (S, M, 1)
        coef = compute_loss(config, _flatten(batch), logp_new.reshape(S * M, 1, 1)).grad_logp.reshape(S, M)
        coef = np.where(batch.mask[..., 0], coef, 0.0)
        pi = np.exp(env.log_policy(params))  # (S, P, A)
        expected = np.einsum("spa,pad->spd", pi, env.features)  # (S, P, d) E_pi phi[p, .]
        rows = np.arange(S)[:, None]
        score = env.features[batch.prompt, batch.tokens[..., 0]] - expected[rows, batch.prompt]  # (S, M, d)
        return coef[..., None] * score
    flat = _flatten(batch)
    flat_params = np.repeat(params, M, axis=0)  # (S*M, d)
    logp_new = env.logp(flat_params, flat.prompt, flat.tokens, flat.mask)  # (S*M, 1, L)
    out = compute_loss(config, flat, logp_new)
    grads = env.grad_logp_contract(flat_params, flat.prompt, flat.tokens, flat.mask, out.grad_logp)  # (S*M, d)
    return grads.reshape(S, M, -1)


def expected_advantage_parts(config: SimConfig, levels: np.ndarray, level_probs: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
    """E[max(A_i, 0) | r_i = levels[k]] and E[max(-A_i, 0) | r_i = levels[k]], exactly: (S, P, K) each.

    The expectation is over the other G - 1 responses of the group; ``level_probs`` (S, P, K) is
    each prompt's probability of each reward level under the policy that generated the group.
    Enumerates the multinomial counts of the others' levels (C(G + K - 2, K - 1) of them) and applies
    the config's own group advantage (``designs.make_advantage``) to each resulting group.
    """
    G, K = config.group_size, levels.size
    comps = np.array([np.bincount(c, minlength=K) for c in
                      itertools.combinations_with_replacement(range(K), G - 1)])  # (C, K) counts of others
    others = np.array([np.repeat(levels, c) for c in comps])  # (C, G - 1)
    groups = np.concatenate([np.broadcast_to(levels[None, :, None], (len(comps), K, 1)),
                             np.broadcast_to(others[:, None, :], (len(comps), K, G - 1))], axis=2)  # (C, K, G)
    own = make_advantage(config, groups.reshape(1, -1, G))[0, :, 0].reshape(len(comps), K)  # (C, K)
    coef = np.exp(math.lgamma(G) - np.array([sum(math.lgamma(x + 1) for x in c) for c in comps]))  # (C,)
    prob = coef * np.prod(level_probs[:, :, None, :] ** comps, axis=-1)  # (S, P, C); 0 ** 0 = 1
    return (np.einsum("spc,ck->spk", prob, np.maximum(own, 0.0)),
            np.einsum("spc,ck->spk", prob, np.maximum(-own, 0.0)))


def exact_gradient_problem(env_name: str, loss: str) -> str | None:
    """Why the exact gradient cannot be enumerated for ``env_name`` and ``loss`` (None: it can).

    The bandit (one-token responses) supports every loss. On the token MDP the expectation runs over
    (step, partial sum, token) states, which needs each token's d loss / d logp to depend only on that
    token's ratio and the response's advantage; M2PO's mask ranks a response's tokens by their M2 jointly.
    """
    if env_name == "bandit":
        return None
    if env_name == "token-mdp":
        if LOSSES[loss].sequence_coupled:  # the registry entry's reason (M2PO's mask, tis's sequence weight)
            return (f"loss {loss!r} {LOSSES[loss].sequence_coupled}, so its token gradients do not factor over "
                    "(step, partial sum) states")
        return None
    return f"no enumeration for env {env_name!r}"


def env_name(env) -> str | None:
    """The config name of an environment instance that has an exact enumeration, else None."""
    if getattr(env, "seq_len", None) == 1 and hasattr(env, "reward_table") and hasattr(env, "log_policy"):
        return "bandit"
    if all(hasattr(env, name) for name in ("final_sum_reward", "state_distributions", "backward_values",
                                            "state_token_contract", "token_log_policy")):
        return "token-mdp"
    return None


def supports_exact_gradient(env, loss: str | None = None) -> bool:
    """Whether the exact gradients can be enumerated for this environment (and ``loss``, when given)."""
    name = env_name(env)
    return name is not None and (loss is None or exact_gradient_problem(name, loss) is None)


def _loss_coefficient(config: SimConfig, items: RolloutBatch, logp_new: np.ndarray, advantage: float) -> np.ndarray:
    """d loss / d logp of every token of ``items`` (each its own batch of one) at one advantage: (n, L)."""
    batch = dataclasses.replace(items, advantage=np.full(items.advantage.shape, advantage))
    return compute_loss(config, batch, logp_new).grad_logp[:, 0, :]


def _check_kink_form(config: SimConfig, parts: tuple[np.ndarray, ...], at_two: tuple[np.ndarray, np.ndarray],
                     what: str) -> None:
    """Refuse a loss whose coef(+-2) is not coef(0) + 2 (coef(+-1) - coef(0)) (see ``_coefficient_parts``)."""
    c0, cp, cm = parts
    if not (np.allclose(at_two[0], c0 + 2 * (cp - c0), atol=1e-12)
            and np.allclose(at_two[1], c0 + 2 * (cm - c0), atol=1e-12)):
        raise ValueError(f"loss {config.loss}: {what}: no exact gradient; use the sampled reference")


def _coefficient_parts(config: SimConfig, items: RolloutBatch, logp_new: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d loss / d logp at A = 0, +1, -1 of every token of ``items`` (batches of one): each (n, L).

    The loss's d loss / d logp of a token is piecewise linear in the advantage with its only kink at
    0 for every loss here (clips and masks depend on the ratio and the SIGN of A: GRPO, M2PO, RLOO;
    the rest are affine), so E[coef(A)] = coef(0) + E[A+] (coef(1) - coef(0)) + E[A-] (coef(-1) - coef(0));
    checked at A = +-2 (a loss that breaks it is refused).
    """
    parts = tuple(_loss_coefficient(config, items, logp_new, a) for a in (0.0, 1.0, -1.0))
    at_two = (_loss_coefficient(config, items, logp_new, 2.0), _loss_coefficient(config, items, logp_new, -2.0))
    _check_kink_form(config, parts, at_two, "d loss / d logp is not piecewise linear in the advantage")
    return parts


def exact_sample_mean(env, config: SimConfig, params: np.ndarray, behaviour: np.ndarray) -> np.ndarray:
    """E[G(theta, z)] over z in fresh groups of pi_behaviour (uniform prompts), exactly: (S, d).

    Bandit: every (prompt, action) is one item with weight pi_b(a | p) / P, its behaviour log-prob and
    its ratio pi_theta / pi_b. Token MDP: ``token_mdp_sample_mean``. Both use the kink-at-0 form of
    the loss's coefficient (``_coefficient_parts``) and the exact expected advantage of a reward
    level (``expected_advantage_parts``). With ``behaviour = params`` this is grad F.
    """
    name = env_name(env)
    if name is None:
        raise ValueError("the exact gradient needs the bandit or the token MDP; use the sampled reference")
    problem = exact_gradient_problem(name, config.loss)
    if problem is not None:
        raise ValueError(f"no exact gradient: {problem}; use the sampled reference")
    if name == "token-mdp":
        return token_mdp_sample_mean(env, config, params, behaviour)
    S = params.shape[0]
    table = env.reward_table  # (P, A)
    P, A = table.shape
    n = P * A
    pi_b = np.exp(env.log_policy(behaviour)).reshape(S, n).copy()  # (S, PA): log_policy's cache is reused below
    levels, level_of = np.unique(table, return_inverse=True)
    onehot = np.eye(levels.size)[level_of.reshape(P, A)]  # (P, A, K)
    a_pos, a_neg = expected_advantage_parts(config, levels, np.einsum("spa,pak->spk", pi_b.reshape(S, P, A), onehot))
    level_idx = np.broadcast_to(level_of.reshape(1, P, A), (S, P, A))
    a_pos = np.take_along_axis(a_pos, level_idx, axis=2).reshape(S, n)
    a_neg = np.take_along_axis(a_neg, level_idx, axis=2).reshape(S, n)
    prompts = np.broadcast_to(np.repeat(np.arange(P), A), (S, n)).astype(np.int64)
    tokens = np.broadcast_to(np.tile(np.arange(A), P)[:, None], (S, n, 1)).astype(np.int64)
    mask = np.ones((S, n, 1), bool)
    logp_b = env.logp(behaviour, prompts, tokens, mask)  # (S, n, 1)
    logp_new = env.logp(params, prompts, tokens, mask).reshape(S * n, 1, 1)
    items = RolloutBatch(prompt=prompts.copy(), tokens=tokens.copy(), mask=mask, logp_behav=logp_b,
                         reward=np.broadcast_to(table.reshape(1, -1), (S, n)).copy(),
                         advantage=np.zeros((S, n)), created=np.zeros((S, n), np.int64),
                         group=np.broadcast_to(np.arange(n), (S, n)).copy())
    c0, cp, cm = (c.reshape(S, n) for c in _coefficient_parts(config, _flatten(items), logp_new))
    expected = c0 + a_pos * (cp - c0) + a_neg * (cm - c0)  # (S, n) E[d loss / d logp | item]
    return env.grad_logp_contract(params, prompts, tokens, mask, expected * pi_b / P)


def _pack(log_new: list[np.ndarray], log_behav: list[np.ndarray], seq_len: int, shift: int = 0):
    """Every (step, state, token) entry as one token of a pseudo-response of ``seq_len`` tokens.

    Entries of all steps are laid end to end after ``shift`` padding entries of ratio 1 and cut into
    pseudo-responses, each its own batch of one as in ``per_sample_grads``, so a token's aggregation
    weight (1 / L for token-mean) is the real one. Returns (items, logp_new (m, 1, L), unpack), where
    ``unpack`` maps a per-token array (m, L) back to arrays shaped like ``log_new``.
    """
    S = log_new[0].shape[0]
    sizes = [a[0].size for a in log_new]

    def flat(arrays):
        out = np.concatenate([np.zeros((S, shift))] + [x.reshape(S, -1) for x in arrays], axis=1)
        return np.pad(out, ((0, 0), (0, -out.shape[1] % seq_len)))

    flat_new, flat_behav = flat(log_new), flat(log_behav)
    m = S * flat_new.shape[1] // seq_len  # pseudo-responses
    items = RolloutBatch(prompt=np.zeros((m, 1), np.int64), tokens=np.zeros((m, 1, seq_len), np.int64),
                         mask=np.ones((m, 1, seq_len), bool), logp_behav=flat_behav.reshape(m, 1, seq_len),
                         reward=np.zeros((m, 1)), advantage=np.zeros((m, 1)), created=np.zeros((m, 1), np.int64),
                         group=np.zeros((m, 1), np.int64))
    starts = shift + np.cumsum([0] + sizes)

    def unpack(coef: np.ndarray) -> list[np.ndarray]:
        c = coef.reshape(S, -1)
        return [c[:, starts[t]:starts[t + 1]].reshape(x.shape) for t, x in enumerate(log_new)]

    return items, flat_new.reshape(m, 1, seq_len), unpack


def token_coefficients(config: SimConfig, log_new: list[np.ndarray], log_behav: list[np.ndarray], seq_len: int
                       ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(coef(0), coef(+1), coef(-1)) of every (step, state, token) entry, each shaped like its ``log_new[t]``.

    ``log_new[t]``, ``log_behav[t]`` (S, P, N_t, V): token log-probs of the current and the behaviour
    policy at step t. A token's coefficient must depend only on its own ratio and the response's
    advantage (the kink form of ``_coefficient_parts``); the check at A = +-2 runs on a layout shifted
    by one entry, so a loss that couples the tokens of a response (M2PO's mask) fails it as well.
    """
    items, logp_new, unpack = _pack(log_new, log_behav, seq_len)
    parts = [unpack(_loss_coefficient(config, items, logp_new, a)) for a in (0.0, 1.0, -1.0)]
    items, logp_new, unpack = _pack(log_new, log_behav, seq_len, shift=1)
    at_two = [unpack(_loss_coefficient(config, items, logp_new, a)) for a in (2.0, -2.0)]
    flat = [np.concatenate([x.ravel() for x in c]) for c in parts + at_two]
    _check_kink_form(config, tuple(flat[:3]), (flat[3], flat[4]),
                     "a token's d loss / d logp is not piecewise linear in the advantage or depends on the "
                     "response's other tokens")
    return list(zip(*parts))


def token_mdp_sample_mean(env, config: SimConfig, params: np.ndarray, behaviour: np.ndarray) -> np.ndarray:
    """E[G(theta, z)] over z in fresh groups of pi_behaviour on the token MDP, exactly: (S, d).

    G(theta, z) = sum_t c_t grad log pi_theta(token_t | p, t, s_t), where c_t is token t's
    d loss / d logp: a function of its own ratio pi_theta / pi_b at (p, t, s_t, token_t) and of
    the response's advantage A, with the kink at A = 0 (``token_coefficients``). So

        E[G] = (1/P) sum_{p, t, s, v} P_b(s_t = s | p) pi_b(v | p, t, s)
               [c0 + E_b[A+ | p, s_{t+1} = s + v] (c+ - c0) + E_b[A- | p, s_{t+1} = s + v] (c- - c0)]
               grad log pi_theta(v | p, t, s),

    where E_b[A+- | state] is a backward DP (``TokenMDPEnv.backward_values``) of the exact expected
    advantage of each final reward level (1 / 0.1 / 0, ``expected_advantage_parts``: the other G - 1
    responses of the group are drawn from pi_b too), and P_b(s_t = s) a forward DP. Cost: a few DPs
    over (L, L (V - 1) + 1) states and one loss evaluation on P sum_t N_t V entries per coefficient.
    """
    S, P, L = params.shape[0], env.num_prompts, env.seq_len
    reward = env.final_sum_reward()  # (P, N_L)
    levels, level_of = np.unique(reward, return_inverse=True)
    level_of = level_of.reshape(reward.shape)
    states = env.state_distributions(behaviour)  # t = 0 .. L, (S, P, N_t)
    level_probs = np.einsum("spn,pnk->spk", states[-1], np.eye(levels.size)[level_of])  # (S, P, K)
    a_pos, a_neg = expected_advantage_parts(config, levels, level_probs)
    level_idx = np.broadcast_to(level_of, (S,) + level_of.shape)  # (S, P, N_L)
    h_pos = env.backward_values(behaviour, np.take_along_axis(a_pos, level_idx, axis=2))  # E_b[A+ | s_t]
    h_neg = env.backward_values(behaviour, np.take_along_axis(a_neg, level_idx, axis=2))
    log_new = [env.token_log_policy(params, t) for t in range(L)]  # (S, P, N_t, V)
    log_behav = [env.token_log_policy(behaviour, t) for t in range(L)]
    coefs = token_coefficients(config, log_new, log_behav, L)
    total = np.zeros((S, env.param_dim))
    for t, (c0, cp, cm) in enumerate(coefs):
        expected = (c0 + env.next_state_values(h_pos[t + 1], t) * (cp - c0)
                    + env.next_state_values(h_neg[t + 1], t) * (cm - c0))  # (S, P, N_t, V) E[c_t | state, v]
        weight = states[t][..., None] * np.exp(log_behav[t]) * expected / P
        total += env.state_token_contract(params, t, weight)
    return total


def exact_loss_gradient(env, config: SimConfig, params: np.ndarray) -> np.ndarray:
    """grad F(theta): the on-policy expected per-sample gradient of the run's loss, exactly: (S, d)."""
    return exact_sample_mean(env, config, params, params)


# --------------------------------------------------------------------------- the noise scale


def group_units(grads: np.ndarray, group_size: int) -> np.ndarray:
    """Per-group mean gradients (..., M / G, d) of per-sample gradients (..., M, d) in consecutive groups of G.

    The mean of a group's G per-sample gradients is the loss's gradient on that group: the independent unit of a
    group-baseline loss (its responses are coupled through the baseline).
    """
    *lead, M, d = grads.shape
    if M % group_size:
        raise ValueError(f"need whole prompt groups: {M} samples in groups of {group_size}")
    return grads.reshape(*lead, M // group_size, group_size, d).mean(axis=-2)  # (..., U, d)


def pooled_exact_grad_sq(grads_by_checkpoint: list[np.ndarray], grad_sq: np.ndarray, rng: np.random.Generator, *,
                         unit_size: int = 1, n_boot: int = NOISE_BOOTSTRAP,
                         level: float = noise_estimators.DEFAULT_LEVEL) -> PooledNoiseScale:
    """``pooled_noise_scale`` with |E G|^2 known exactly: B_noise = tr Sigma (from the units) / ``grad_sq``.

    ``grad_sq`` (n,): the exact |E G|^2 of each checkpoint; tr Sigma per sample is ``noise_scale_from_samples``'s
    (unbiased, times ``unit_size``). Median over checkpoints; the bootstrap resamples the units of each checkpoint
    (|E G|^2 has no sampling error), with the same order-statistic quantiles as ``pooled_noise_scale``.
    """
    grad_sq = np.asarray(grad_sq, dtype=float)
    if len(grads_by_checkpoint) != grad_sq.size or grad_sq.size == 0:
        raise ValueError(f"need one exact |E G|^2 per checkpoint, got {grad_sq.size} for "
                         f"{len(grads_by_checkpoint)} checkpoints")

    def ratio(trace: float, sq: float) -> float:
        return trace / sq if sq > 0 else math.inf  # a zero gradient: no signal, said as inf

    units = [np.asarray(g, dtype=float) for g in grads_by_checkpoint]
    per = [ratio(noise_scale_from_samples(g, unit_size).trace_sigma, sq) for g, sq in zip(units, grad_sq)]

    def median_b_noise(*index: np.ndarray) -> np.ndarray:  # one replicate: (1, M_k) unit indices per checkpoint
        return np.array([np.median([ratio(noise_scale_from_samples(g[i[0]], unit_size).trace_sigma, sq)
                                    for g, sq, i in zip(units, grad_sq, index)])])

    boots = replicates(median_b_noise, [len(g) for g in units], n_boot, rng, one_at_a_time=True)
    lo, hi = quantile_interval(boots, central(level), "order")
    return PooledNoiseScale(float(np.median(per)), (lo, hi), level, tuple(float(v) for v in per), len(per),
                            "per-sample tr Sigma, exact |E G|^2")


def plateau_step(eval_steps: np.ndarray, reward: np.ndarray, fraction: float = PLATEAU_FRACTION) -> int | None:
    """First evaluation step whose seed-mean reward reaches J0 + ``fraction`` (J_end - J0); None if it never rose.

    ``reward`` (S, E) at ``eval_steps`` (E,) (``RunResult.evals``); J0 is the first evaluation, J_end the mean of
    the last 10% (``RunResult.summary``'s final reward).
    """
    curve = np.asarray(reward, dtype=float).mean(axis=0)  # (E,)
    j0, j_end = curve[0], curve[-max(1, curve.size // 10):].mean()
    if not j_end > j0:
        return None
    return int(np.asarray(eval_steps)[np.argmax(curve >= j0 + fraction * (j_end - j0))])


@dataclass(frozen=True)
class NoiseScaleMeasurement:
    """B_noise of the probe run's loss on fresh groups, per-sample and (where enumerable) with exact |E G|^2."""

    estimate: PooledNoiseScale  # per-sample: both parts from the group units
    exact_grad: PooledNoiseScale | None  # tr Sigma from the units, |E G|^2 exact; None: no enumeration
    batch: int  # B of the run
    unit_size: int  # G
    steps: tuple[int, ...]  # updates done at the checkpoints kept (theta_step)
    plateau: int | None  # the plateau step; None: the reward never rose
    source: str

    def record(self, exact: bool = False) -> dict:
        """The profile file's "noise_scale" record (common format): PooledNoiseScale.to_dict() + batch, unit_size,
        source."""
        pooled = self.exact_grad if exact else self.estimate
        if pooled is None:
            raise ValueError("no exact |E G|^2 noise scale to record: this measurement had no enumeration")
        return {**pooled.to_dict(), "batch": self.batch, "unit_size": self.unit_size, "source": self.source}


def measure_noise_scale(units: dict[int, np.ndarray], exact_sq: dict[int, np.ndarray], eval_steps: np.ndarray,
                        reward: np.ndarray, batch: int, group_size: int, source: str, seed: int,
                        level: float = noise_estimators.DEFAULT_LEVEL) -> NoiseScaleMeasurement:
    """Pool the checkpoints before the plateau: ``units[step]`` (S, U, d) group gradients at theta_step,
    ``exact_sq[step]`` (S,) the exact |E G|^2 (empty dict: no enumeration). Every (seed, checkpoint) is one theta.

    When no checkpoint lies before the plateau the earliest one is kept, and the source says so.
    """
    plateau = plateau_step(eval_steps, reward)
    steps = sorted(units)
    kept = [t for t in steps if plateau is None or t < plateau]
    if not kept:
        kept = steps[:1]
        where = f"the earliest checkpoint only (the reward plateau, step {plateau}, comes before every other)"
    else:
        where = ("no reward plateau (the reward did not rise)" if plateau is None
                 else f"before the reward plateau at step {plateau}")
    grads = [units[t][i] for t in kept for i in range(units[t].shape[0])]  # (U, d) per (checkpoint, seed)
    S, U = units[kept[0]].shape[:2]
    text = (f"{source}; fresh groups at steps {', '.join(map(str, kept))} ({where}), {S} seeds x {U} groups of "
            f"{group_size}; median over seed x checkpoint")
    estimate = pooled_noise_scale(grads, np.random.default_rng(seed), unit_size=group_size, level=level,
                                  n_boot=NOISE_BOOTSTRAP)
    exact = None
    if exact_sq:
        exact = pooled_exact_grad_sq(grads, np.concatenate([exact_sq[t] for t in kept]),
                                     np.random.default_rng(seed + 1), unit_size=group_size, level=level)
    return NoiseScaleMeasurement(estimate, exact, int(batch), int(group_size), tuple(kept), plateau, text)


def calibration_lines(result: Calibration, asked_capacity: int) -> list[str]:
    """The printed report of ``calibrate-simulator``: both sigma^2 forms, r(s), rho and the correlations, then the
    noise scale and the optimizer's memory kappa (``noise_scale_lines``, ``kappa_lines``)."""
    p = result.noise
    lines = [f"{'staleness':>10} {'sigma^2 plain':>14} {'retained r':>11} {'sigma^2/r^2':>12}"]
    for s, plain, r, norm in zip(p.staleness, p.plain, p.retained, p.signal_normalised):
        lines.append(f"{s:>10g} {plain:>14.4g} {r:>11.3f} {norm:>12.4g}")
    lines.append(f"reference grad F: {result.reference}; ||grad F||^2 = {p.true_grad_sq:.4g}; "
                 f"profile table: {result.form} (loss {result.loss})")
    if result.probe_capacity != asked_capacity:
        lines.append(f"probe capacity raised from {asked_capacity} to {result.probe_capacity} to hold gaps up to "
                     f"--max-gap")
    for label, fit in (("rho", result.rho_fit), ("rho (uncentred eps)", result.rho_fit_uncentred)):
        if fit is None or (label != "rho" and result.rho_noise != "centred"):
            continue
        reaches = [b for b in (0, 1) if fit.ci[0] <= b <= fit.ci[1]]
        status = "in [0, 1]" if fit.in_range else (
            "OUT OF [0, 1], not clamped" + (f"; its interval covers {reaches[0]}" if reaches else "")
            + "; optimal needs --rho")
        lines.append(f"{label} = {fit.value:.4g}, {fit.level:.0%} interval [{fit.ci[0]:.4g}, {fit.ci[1]:.4g}] "
                     f"({status}); corr at gap 1 / {fit.max_gap // 2} / {fit.max_gap} = "
                     f"{fit.correlation[1]:.4f} / {fit.correlation[fit.max_gap // 2]:.4f} / "
                     f"{fit.correlation[fit.max_gap]:.4f}")
    if result.rho_fit is not None:
        fit = result.rho_fit
        lines.append(f"within-group correlation (t_i = t_j, not in rho) = {fit.within_group:.4g}, "
                     f"interval [{fit.within_group_ci[0]:.4g}, {fit.within_group_ci[1]:.4g}]")
    else:
        lines.append("rho not measured: the buffer has no FIFO items (buffer fifo, positive-bias or prioritized)")
    lines.append(f"KL drift per step = {result.kl_drift_per_step:.3g}")
    if result.drift is not None:
        lines.append(drift_line(result.drift, "exact, the run's last policy against its earlier ones"))
    if result.noise_scale is None:
        raise ValueError("calibration_lines: the calibration has no noise scale (calibrate measures it)")
    memory = ["optimizer memory kappa not measured (--kappa-pairs 0)"] if result.memory is None else \
        kappa_lines(result.memory)
    return lines + noise_scale_lines(result.noise_scale) + memory


def noise_scale_lines(noise: NoiseScaleMeasurement) -> list[str]:
    """The printed B_noise and b = B_noise / B, each with its interval (per-sample, then exact |E G|^2)."""
    out = []
    for label, pooled in (("per-sample", noise.estimate), ("exact |E G|^2", noise.exact_grad)):
        if pooled is None:
            continue
        lo, hi = pooled.interval
        B = noise.batch
        out.append(f"noise scale B_noise ({label}) = {pooled.b_noise:.4g}, {pooled.level:.0%} interval "
                   f"[{lo:.4g}, {hi:.4g}]; b = B_noise / B = {pooled.b_noise / B:.4g} [{lo / B:.4g}, {hi / B:.4g}] "
                   f"at B = {B}")
    out.append(f"  measured on {noise.source}")
    if not math.isfinite(noise.estimate.b_noise):
        out.append("  no gradient signal at the median checkpoint: the profile keeps the record as "
                   "noise_scale_unresolved (optimal cannot use it); use more --noise-groups")
    return out


# --------------------------------------------------------------------------- the optimizer's memory kappa

DEFAULT_KAPPA_PAIRS = {"bandit": 8, "token-mdp": 2}
"""Curvature pairs per seed and kept noise checkpoint (three fresh minibatches of B each: two for xi, one for the
independent Hessian-vector product), by env: the token MDP's enumerated grad F runs a forward and a backward DP per
parameter vector, so each of its field products costs far more than a bandit's (docs/SIMULATION.md)."""
JACOBIAN_ENVS = ("bandit",)
"""Where the exact kappa (the whole Jacobian, 2 d S enumerated gradients per checkpoint) is measured: the bandit
(d = 16); on the token MDP it would be 2 x 31 x 8 = 496 enumerated gradients per checkpoint."""


def kappa_pairs_for(config: SimConfig, kappa_pairs: int | None) -> int:
    """``kappa_pairs``, or the env's default (``DEFAULT_KAPPA_PAIRS``) when None."""
    return DEFAULT_KAPPA_PAIRS.get(config.env, 2) if kappa_pairs is None else kappa_pairs
FD_STEP = 1e-5
"""Central-difference step of a gradient along a vector, relative to max(1, |theta|): in float64 the truncation
(~ step^2) and the rounding (~ 1e-16 / step) both stay near 1e-10 (the tests compare steps 10x apart)."""
LAG_BLOCK = 8
"""Moving-block length (steps) of the lag-1 estimator's bootstrap (``kappa_from_gradient_series``)."""
KAPPA_BOOTSTRAP = 1000
HVPS = ("field", "independent", "surrogate", "same")
"""Where H xi comes from: the exact field; a third, independent minibatch (score-reweighted); the same third
minibatch's own loss Hessian; the pair's first minibatch (score-reweighted)."""
HVP_TEXT = {
    "field": "H xi by central differences of the enumerated grad F: the mean gradient field's Jacobian (the H of the "
             "linearised dynamics), no sampling error, independent of xi",
    "independent": "H xi by central differences of a third, independent minibatch's on-policy gradient reweighted "
                   "by its response ratio pi_theta' / pi_theta (rho(theta') g(theta'), unbiased for the field's "
                   "Jacobian): what validate calibrate-model and the TRL trainer measure",
    "surrogate": "H xi by central differences of the third minibatch's own loss gradient (fixed samples, per-token "
                 "ratios): the surrogate's Hessian",
    "same": "H xi as 'independent' but on the pair's first minibatch (one pass fewer; shares samples with xi)",
}
BIAS_TEXT = {
    "exact": "Sigma sampled from the noise scale's fresh groups (its error is the interval); H exact",
    "field": "ratio of sums over pairs: bias O(1 / pairs)",
    "independent": "unbiased for the field's Jacobian but for the group advantage's cross-sample score terms (zero "
                   "for a mean baseline, small with GRPO's std); more variance than the field's (the score term)",
    "surrogate": "the fixed-sample loss Hessian misses the score cross terms between a response's tokens (sum over "
                 "t != t' of A s_t s_t'^T), and for a loss without an importance ratio (reinforce) the whole score "
                 "term: 0.67x the field's kappa on the token MDP (SGD), equal on the one-token bandit",
    "same": "biased: the minibatch's Hessian and xi share samples, which adds E[e^T h e] / B (one sample's noise e "
            "and Hessian h; large for a policy gradient, h ~ A (s s^T + grad^2 log pi), e ~ A s): 1.7x the exact "
            "kappa under SGD on the bandit",
    "lag": "lag-1 autocorrelation: -kappa/2 for SGD, about +0.4 kappa for Adam / momentum at beta1 = 0.9; the mean "
           "gradient's drift adds a positive term early in a run and at low noise (hides SGD's signal, overstates "
           "Adam's kappa); needs fresh noise every step (an on-policy run)",
}
ESTIMATOR_KEYS = {"exact": "exact", "independent": "curvature-pairs-independent-minibatch",
                  "surrogate": "curvature-pairs-surrogate-hessian", "same": "curvature-pairs-same-minibatch",
                  "lag": "lag-autocorrelation"}
"""``memory_estimators`` keys of the profile (the curvature pairs with the field's H are its ``memory``)."""


def optimizer_kind(config: SimConfig) -> tuple[str, float]:
    """(optimizer, beta1) as theory/forgetting.py names them: simulate/optim.py's Adam has beta1 = 0.9."""
    return ("adam", 0.9) if config.optimizer == "adam" else ("sgd", 0.0)


def take_rows(batch: RolloutBatch, rows: int) -> RolloutBatch:
    """(S, K B, ...) -> (S K, B, ...): K consecutive minibatches of every seed as rows of their own (seed-major)."""
    def cut(a: np.ndarray) -> np.ndarray:
        return a.reshape(rows, a.shape[0] * a.shape[1] // rows, *a.shape[2:])

    return RolloutBatch(**{f.name: cut(getattr(batch, f.name)) for f in fields(RolloutBatch)})


def select_rows(batch: RolloutBatch, index: np.ndarray, repeat: int = 1) -> RolloutBatch:
    """The rows ``index`` (leading axis) of every field, the selection repeated ``repeat`` times end to end."""
    return RolloutBatch(**{f.name: np.concatenate([getattr(batch, f.name)[index]] * repeat)
                           for f in fields(RolloutBatch)})


def minibatch_gradient(env, config: SimConfig, params: np.ndarray, batch: RolloutBatch, *,
                       reweighted: bool = False) -> np.ndarray:
    """The run's loss gradient on ``batch`` (R, B, ...) at ``params`` (R, d), as the engine forms it (its batch
    aggregation, every row fresh, weights 1): (R, d). At params other than the ones that generated the batch the
    ratio is pi_params / pi_behav: the fixed-sample surrogate's gradient.

    ``reweighted``: rho(theta') g_on(theta') instead, g_on the loss's gradient with the behaviour log-probs set to the
    current ones (ratio 1: the on-policy per-sample gradient at theta') and rho = pi_theta' / pi_behav of the whole
    response. Its derivative at the behaviour policy is E[grad g + g S^T] (S the response's score), the Jacobian of
    the on-policy field E_{pi_theta}[g]: score cross terms between tokens included, which the surrogate's lacks."""
    logp_new = env.logp(params, batch.prompt, batch.tokens, batch.mask)  # (R, B, L)
    if not reweighted:
        out = compute_loss(config, batch, logp_new)
        return env.grad_logp_contract(params, batch.prompt, batch.tokens, batch.mask, out.grad_logp)
    out = compute_loss(config, dataclasses.replace(batch, logp_behav=logp_new), logp_new)
    rho = np.exp(np.where(batch.mask, logp_new - batch.logp_behav, 0.0).sum(axis=2))  # (R, B) response ratio
    return env.grad_logp_contract(params, batch.prompt, batch.tokens, batch.mask, out.grad_logp * rho[:, :, None])


def central_difference(gradient, params: np.ndarray, vectors: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """H v = (grad(theta + h v) - grad(theta - h v)) / (2 h) per row, h = ``step`` max(1, |theta|) / |v| (a zero v
    gives 0); ``gradient`` maps (2R, d) -> (2R, d), both sides in one call: (R, d)."""
    norm = np.linalg.norm(vectors, axis=1)
    scale = step * np.maximum(1.0, np.linalg.norm(params, axis=1))
    h = np.divide(scale, norm, out=np.zeros_like(norm), where=norm > 0)[:, None]  # (R, 1)
    both = gradient(np.concatenate([params + h * vectors, params - h * vectors]))
    plus, minus = both[: len(params)], both[len(params):]
    return np.divide(plus - minus, 2 * h, out=np.zeros_like(plus), where=h > 0)


def field_hvp(env, config: SimConfig, params: np.ndarray, vectors: np.ndarray, step: float = FD_STEP,
              chunk: int = 512) -> np.ndarray:
    """J v of the exact gradient field grad F (``exact_loss_gradient``) by central differences: (R, d)."""
    out = [central_difference(lambda p: exact_loss_gradient(env, config, p), params[a:a + chunk],
                              vectors[a:a + chunk], step) for a in range(0, len(params), chunk)]
    return np.concatenate(out)


def field_jacobian(env, config: SimConfig, params: np.ndarray, step: float = FD_STEP) -> np.ndarray:
    """The Jacobian J (S, d, d) of grad F at each seed's theta, column by column (J e_j by central differences)."""
    S, d = params.shape
    columns = field_hvp(env, config, np.repeat(params, d, axis=0), np.tile(np.eye(d), (S, 1)), step)  # (S d, d)
    return columns.reshape(S, d, d).transpose(0, 2, 1)  # [s, :, j] = J e_j


@dataclass
class CurvatureParts:
    """kappa's numerators and denominators at one checkpoint (preconditioned forms, D = Adam's 1/(sqrt(v_hat)+eps))."""

    numerators: dict[str, np.ndarray]  # HVPS key -> (S, K) (D xi)^T H (D xi); "field" absent without enumeration
    denominators: np.ndarray  # (S, K) xi^T D xi
    exact_num: np.ndarray | None  # (S, U) (D c)^T J (D c) of the centred units c; None: no enumeration
    exact_den: np.ndarray | None  # (S, U) c^T D c


def curvature_parts(env, config: SimConfig, theta: np.ndarray, precond: np.ndarray | None, pairs: int,
                    version: int, rng, *, field: bool, units: np.ndarray | None = None,
                    grad_f: np.ndarray | None = None, step: float = FD_STEP) -> CurvatureParts:
    """The numerators and denominators of kappa at one checkpoint ``theta`` (S, d), all seeds at once.

    Curvature pairs: 3 ``pairs`` fresh minibatches of B (whole groups) of pi_theta per seed; xi = g_1 - g_2 of the
    first two, w = D xi (D the Adam preconditioner ``precond`` (S, d); identity for SGD); numerators w^T H w with
    H w from each source in ``HVPS`` (``HVP_TEXT``; the field with ``field``, where grad F is enumerable),
    denominator xi^T D xi. Exact: with the fresh group units ``units`` (S, U, d) and grad F ``grad_f`` (S, d) (their
    exact mean; both None: not measured),
    c = u - grad F and the whole Jacobian J give (D c)^T J (D c) and c^T D c per unit, whose sums' ratio is
    tr(D J D Sigma) / tr(D Sigma) with Sigma the units' sample covariance.
    """
    S, d = theta.shape
    D = np.ones((S, d)) if precond is None else precond
    groups = max(1, config.batch_size // config.group_size)
    fresh = generate(EnvBackend(env, rng), config, theta, 3 * pairs * groups, version, 0, rng)  # (S, 3K B)
    rows = take_rows(fresh, S * 3 * pairs)  # row 3 (s K + k) + j: minibatch j of pair k of seed s
    grads = minibatch_gradient(env, config, np.repeat(theta, 3 * pairs, axis=0), rows).reshape(S, pairs, 3, d)
    xi = grads[:, :, 0] - grads[:, :, 1]  # (S, K, d)
    w = (D[:, None, :] * xi).reshape(S * pairs, d)
    theta_k = np.repeat(theta, pairs, axis=0)  # (S K, d)
    products = {}
    for name, j, reweighted in (("same", 0, True), ("independent", 2, True), ("surrogate", 2, False)):
        batch = select_rows(rows, np.arange(j, S * 3 * pairs, 3), repeat=2)  # both sides of the difference
        products[name] = central_difference(
            lambda p, b=batch, r=reweighted: minibatch_gradient(env, config, p, b, reweighted=r), theta_k, w, step)
    exact_num = exact_den = None
    if field:
        products["field"] = field_hvp(env, config, theta_k, w, step)
    if grad_f is not None:
        jac = field_jacobian(env, config, theta, step)  # (S, d, d)
        c = units - grad_f[:, None, :]  # (S, U, d)
        dc = D[:, None, :] * c
        exact_num, exact_den = np.einsum("sud,sde,sue->su", dc, jac, dc), np.einsum("sud,sud,sd->su", c, c, D)
    numerators = {name: np.einsum("rd,rd->r", w, hw).reshape(S, pairs) for name, hw in products.items()}
    return CurvatureParts(numerators, np.einsum("skd,skd,sd->sk", xi, xi, D), exact_num, exact_den)


def on_policy_twin(config: SimConfig) -> SimConfig:
    """The probe's on-policy twin: ``config`` itself when it trains on fresh responses once (sync on-policy), else
    the same run with buffer on-policy and R = B (fresh noise every step: what the lag-1 estimator needs)."""
    if config.buffer == "on-policy" and config.pipeline == "sync":
        return config
    return dataclasses.replace(config, buffer="on-policy", pipeline="sync",
                               rollouts_per_step=config.batch_size).validated()


def lag_series(config: SimConfig) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Successive update gradients of an on-policy run of ``config``: (dots (T-1,), sq (T-1,), plateau step).

    dots[i] = sum over seeds of g_{i+1}^T D g_i and sq[i] = g_i^T D g_i, D the Adam preconditioner of the state
    before update i + 1 (identity for SGD): the lag-1 products in the coordinates Adam's step is SGD in.
    """
    dots, sq, previous = [], [], {}

    def on_step(view) -> None:
        g = view.grad
        if "g" in previous:
            precond = view.optimizer.preconditioner()
            D = np.ones_like(g) if precond is None else precond
            dots.append(float(np.einsum("sd,sd,sd->", g, previous["g"], D)))
            sq.append(float(np.einsum("sd,sd,sd->", previous["g"], previous["g"], D)))
        previous["g"] = g.copy()

    result = run(config, on_step=on_step)
    return np.asarray(dots), np.asarray(sq), plateau_step(result.eval_steps, result.evals["reward"])


@dataclass(frozen=True)
class KappaMeasurement:
    """kappa = eta tr(H Sigma) / tr Sigma at the probe's noise-scale checkpoints, by every estimator."""

    pairs: KappaEstimate | None  # the profile's memory: curvature pairs, H from the field (an independent
    # minibatch's without enumeration); None: not measured (``problems["pairs"]``)
    estimators: dict[str, KappaEstimate | None]  # ESTIMATOR_KEYS key -> the other estimates (None: not measured)
    problems: dict[str, str]  # ESTIMATOR_KEYS key (or "pairs") -> why it is None
    optimizer: str
    beta1: float
    batch: int
    source: str

    def records(self) -> tuple[dict, dict]:
        """(the profile's ``memory`` record, ``memory_estimators``): the curvature-pairs kappa, and the others."""
        def record(key: str, estimate: KappaEstimate | None) -> dict:
            if estimate is None:
                return {**unmeasured_memory(self.problems[key], method=key, optimizer=self.optimizer,
                                            beta1=self.beta1, pilot_batch=float(self.batch)), "source": self.source}
            return {**memory_record(estimate), "source": self.source}

        others = {ESTIMATOR_KEYS[key]: record(key, value) for key, value in self.estimators.items()}
        return record("pairs", self.pairs), others


def _with(estimate: KappaEstimate, **detail) -> KappaEstimate:
    return dataclasses.replace(estimate, detail={**estimate.detail, **detail})


def lag_estimate(config: SimConfig, seed: int, level: float) -> tuple[KappaEstimate | None, str | None]:
    """kappa from the lag-1 autocorrelation of the update gradients of the probe's on-policy twin, before its reward
    plateau, from the second update on; (None, why) when it cannot be formed."""
    optimizer, beta1 = optimizer_kind(config)
    try:
        twin = on_policy_twin(config)
    except ValueError as err:
        return None, f"the probe has no on-policy twin (buffer on-policy, R = B): {err}"
    what = ("the probe run" if twin is config
            else f"an on-policy twin run (buffer on-policy, R = B = {config.batch_size})")
    dots, sq, plateau = lag_series(twin)
    stop = len(dots) if plateau is None else max(0, min(len(dots), plateau - 1))  # g_{i+1} before the plateau
    dots, sq = dots[1:stop], sq[1:stop]  # from the second update on: Adam's first preconditioner is 1 / |g_0|
    if dots.size < 2 * LAG_BLOCK:
        return None, (f"only {dots.size} update pairs before the reward plateau of {what}; the lag-1 estimator needs "
                      f">= {2 * LAG_BLOCK} (use more --steps)")
    try:
        lag = kappa_from_gradient_series(dots, sq, np.random.default_rng(seed), optimizer=optimizer, beta1=beta1,
                                         pilot_batch=float(config.batch_size), block=LAG_BLOCK,
                                         n_boot=KAPPA_BOOTSTRAP, level=level)
    except ValueError as err:
        return None, f"lag-1 estimator on {what}: {err}"
    return _with(lag, series=f"update gradients of {what}, updates 1..{stop} (before its reward plateau), summed "
                             "over seeds", bias=BIAS_TEXT["lag"]), None


def measure_kappa(parts: dict[int, CurvatureParts], kept: tuple[int, ...], config: SimConfig, seed: int,
                  level: float = noise_estimators.DEFAULT_LEVEL) -> KappaMeasurement:
    """Pool the checkpoints ``kept`` (those of the noise scale) into kappa by each estimator (ratio of sums over
    every pair / unit, a bootstrap over them) and add the lag-1 estimator (``lag_estimate``)."""
    optimizer, beta1 = optimizer_kind(config)
    batch = max(1, config.batch_size // config.group_size) * config.group_size
    eta = float(config.lr)
    pairs_kappa = functools.partial(kappa_from_curvature_pairs, optimizer=optimizer, beta1=beta1,
                                    pilot_batch=float(batch), n_boot=KAPPA_BOOTSTRAP, level=level)
    kept_parts = [parts[t] for t in kept]
    den = np.concatenate([p.denominators.ravel() for p in kept_parts])
    noisy = den > 0  # a pair with xi = 0 (no reward variation in its minibatches) adds 0 to both sums: left out
    by_hvp, problems = {}, {}
    for i, name in enumerate(HVPS):
        if name in kept_parts[0].numerators:
            num = np.concatenate([p.numerators[name].ravel() for p in kept_parts])
            if noisy.sum() < 2:
                by_hvp[name] = None
                problems[name] = (f"{int(noisy.sum())} of {den.size} pairs have xi != 0 (their minibatch gradients "
                                  "were equal: no reward variation); need >= 2")
                continue
            by_hvp[name] = _with(pairs_kappa(num[noisy], den[noisy], eta, np.random.default_rng(seed + i)),
                                 hvp=HVP_TEXT[name], bias=BIAS_TEXT[name], pairs_without_noise=int((~noisy).sum()))
    estimators: dict[str, KappaEstimate | None] = {"exact": None}
    problems["exact"] = ((f"the whole Jacobian is measured on {', '.join(JACOBIAN_ENVS)} only (its enumerated grad F "
                          "is cheap)" if config.env not in JACOBIAN_ENVS else
                          "no enumeration of grad F for this loss (exact_gradient_problem)"))
    # every checkpoint has the exact parts or none: the enumeration is the environment's
    exact_parts = [(p.exact_num, p.exact_den) for p in kept_parts
                   if p.exact_num is not None and p.exact_den is not None]
    if exact_parts:
        num = np.concatenate([n.ravel() for n, _ in exact_parts])
        units = np.concatenate([d.ravel() for _, d in exact_parts])
        try:
            exact = pairs_kappa(num, units, eta, np.random.default_rng(seed + 10))
            estimators["exact"] = _with(dataclasses.replace(exact, method="exact"),
                                        hvp="the whole Jacobian of grad F (central differences, column by column)",
                                        bias=BIAS_TEXT["exact"])
        except ValueError as err:  # no unit deviates from grad F: no noise to measure a curvature along
            problems["exact"] = f"the fresh groups carry no noise: {err}"
    primary = "field" if "field" in by_hvp else "independent"
    pairs = by_hvp.pop(primary)
    problems["pairs"] = problems.pop(primary, "")
    estimators.update(by_hvp)
    estimators["lag"], problems["lag"] = lag_estimate(config, seed + 4, level)
    source = (f"calibrate-simulator: {config.env}, loss {config.loss}, {config.optimizer} lr {eta:g}, minibatch "
              f"B = {batch}; {len(kept)} noise-scale checkpoints (steps {', '.join(map(str, kept))}) x "
              f"{config.seeds} seeds")
    return KappaMeasurement(pairs, estimators, problems, optimizer, beta1, batch, source)


def kappa_lines(memory: KappaMeasurement) -> list[str]:
    """The printed kappas, each with its interval and memory 1/kappa (the first curvature-pairs one is the
    profile's ``memory``)."""
    coords = "in Adam's preconditioned coordinates, " if memory.optimizer == "adam" else ""
    out = [f"optimizer memory kappa = eta tr(H Sigma) / tr Sigma ({memory.optimizer}"
           + (f", beta1 {memory.beta1:g}" if memory.optimizer == "adam" else "") + f"; {coords}eta = the lr)"]

    def line(label: str, estimate: KappaEstimate | None, problem: str = "") -> str:
        if estimate is None:
            return f"  {label}: not measured: {problem}"
        lo, hi = estimate.interval
        unit = {"exact": "units", "lag-autocorrelation": "steps"}.get(estimate.method, "pairs")
        corr = estimate.detail.get("lag1_autocorrelation")
        extra = "" if corr is None else f", lag-1 autocorrelation {corr:.3g}"
        memory_steps = f"; memory 1/kappa = {1 / estimate.kappa:.3g} steps" if estimate.kappa > 0 else ""
        return (f"  {label} = {estimate.kappa:.4g}, {estimate.level:.0%} interval [{lo:.4g}, {hi:.4g}] "
                f"({estimate.units} {unit}{extra}){memory_steps}")

    field = "independent" in memory.estimators
    est = memory.estimators
    out.append(line("exact (exact Jacobian of grad F, Sigma from the fresh groups)", est["exact"],
                    memory.problems["exact"]))
    out.append(line("curvature pairs, H xi of the exact grad F [profile memory]" if field else
                    "curvature pairs, H xi of an independent minibatch, score-reweighted [profile memory]",
                    memory.pairs, memory.problems.get("pairs", "")))
    if field:
        out.append(line("curvature pairs, H xi of an independent minibatch, score-reweighted (as the LM and TRL "
                        "measure)", est["independent"], memory.problems.get("independent", "")))
    out.append(line("curvature pairs, H xi of that minibatch's own loss (surrogate Hessian: no cross-token score "
                    "terms)", est["surrogate"], memory.problems.get("surrogate", "")))
    out.append(line("curvature pairs, H xi of the pair's own first minibatch (biased: shares samples with xi)",
                    est["same"], memory.problems.get("same", "")))
    out.append(line("lag-1 autocorrelation of successive update gradients", est["lag"], memory.problems.get("lag", "")))
    out.append("  biases: lag-1 is -kappa/2 for SGD but ~ +0.4 kappa for Adam at beta1 = 0.9, and the mean "
               "gradient's drift pushes it up early in a run and at low noise; a minibatch's H misses the group "
               "advantage's cross-sample terms, and the surrogate's also the cross-token score terms")
    out.append(f"  measured on {memory.source}")
    return out


# --------------------------------------------------------------------------- the probe


def probe_config(config: SimConfig, max_gap: int) -> SimConfig:
    """``config`` with the FIFO capacity raised to (max_gap + 1) R if smaller, so every gap <= max_gap is held."""
    need = (max_gap + 1) * config.rollouts_per_step
    if config.buffer in RHO_BUFFERS and config.pipeline == "sync" and config.capacity < need:
        return dataclasses.replace(config, capacity=need)
    return config


#: The probe's sizes (``calibrate``'s arguments, ``calibrate-simulator``'s options) its memory grows with, beside the
#: run's own (SimConfig's, checked when the config is built).
PROBE_SIZES = (Size("samples"), Size("reference_samples"), Size("noise_groups", 2), Size("kappa_pairs", 0),
               Size("max_gap"), Size("noise_checkpoints"), Size("checkpoints", memory=False))


def probe_peak_bytes(values: Mapping[str, Any]) -> Estimate:
    """Peak bytes of ``calibrate`` on ``values`` (SimConfig's fields and the probe's arguments): the probe run (its
    FIFO raised to (max_gap + 1) R) and the per-response gradients (S, M, d) each part of the probe holds."""
    S, G, B, R = values["seeds"], values["group_size"], values["batch_size"], values["rollouts_per_step"]
    d = policy_shape(values)[2]
    run_values = dict(values)
    if values["buffer"] in RHO_BUFFERS and values["pipeline"] == "sync":
        run_values["capacity"] = max(values["capacity"], (values["max_gap"] + 1) * R)
    response = response_bytes(values) + 8 * d * 3  # its arrays, its own copy of the parameters, its gradient
    exact = values["reference"] == "exact" or (values["reference"] == "auto"
                                              and exact_gradient_problem(values["env"], values["loss"]) is None)
    K, M, n_ref = len(values["staleness"]), values["samples"], values["reference_samples"]
    checkpoints, groups = values["noise_checkpoints"], values["noise_groups"]
    pairs = kappa_pairs_for(SimConfig(env=values["env"]), values["kappa_pairs"])
    kept = 0 if values["buffer"] not in RHO_BUFFERS else run_values["capacity"]
    units = groups if values["env"] in JACOBIAN_ENVS and exact else 0  # kappa's exact part resamples the groups
    return Estimate({
        **peak_bytes(run_values).terms,
        f"the sigma^2(s) gradients: S x K x M x d = {S} x {K} x {M} x {d}":
            S * K * M * 8 * d * 4 + S * M * response,  # the stack and its moments, one batch's responses
        f"the reference gradients: S x n x d = {S} x {n_ref} x {d}": 0 if exact else S * n_ref * response,
        f"the buffer's gradients for rho: S x N x d = {S} x {count(kept)} x {d}": S * kept * response,
        f"the noise-scale groups: checkpoints x S x groups x d = {checkpoints} x {S} x {groups} x {d}":
            checkpoints * S * groups * 8 * d + S * groups * G * response,
        f"the curvature pairs: S x 3 pairs x B = {S} x {3 * pairs} x {B}":
            S * 3 * pairs * B * response * 2 + S * d * d * 8 * 4,  # both sides of the differences; the Jacobian
        f"kappa's bootstrap: {KAPPA_BOOTSTRAP} x S x (pairs + groups) x checkpoints = {KAPPA_BOOTSTRAP} x {S} x "
        f"{pairs + units} x {checkpoints}":  # its int64 index and a gathered float64 array, per kept checkpoint
            0 if not pairs else KAPPA_BOOTSTRAP * S * 16 * (pairs + units) * checkpoints,
    })


def probe_values(config: SimConfig, probe: Mapping[str, Any]) -> dict[str, Any]:
    """What ``probe_peak_bytes`` reads: the run's fields and the probe's arguments (``staleness`` as a tuple)."""
    return {**dataclasses.asdict(config), **probe, "staleness": tuple(probe["staleness"])}


def check_probe_sizes(config: SimConfig, **probe: Any) -> None:
    """The probe's sizes within ``MAX_SIZE`` and its estimated peak within this machine's memory
    (``probe_peak_bytes``): one line naming the argument, before any work. ``probe``: ``calibrate``'s arguments
    (ProbeOptions' fields)."""
    values = probe_values(config, probe)
    check_sizes([size for size in PROBE_SIZES if values[size.name] is not None], values, probe_peak_bytes,
                defaults=_PROBE_DEFAULTS)


def check_probe(config: SimConfig, staleness: tuple[int, ...], samples: int, max_gap: int, reference: str,
                reference_samples: int, noise_checkpoints: int = DEFAULT_NOISE_CHECKPOINTS,
                noise_groups: int = DEFAULT_NOISE_GROUPS, kappa_pairs: int | None = None) -> None:
    """One-line ValueErrors (naming the argument) for a probe that cannot run; before any work."""
    _check_staleness_probe(config.group_size, staleness, samples, max_gap)
    _check_reference(config, reference, reference_samples)
    first = max(max(staleness), max_gap) + 1
    if config.steps <= first:
        raise ValueError(f"steps must exceed max(largest staleness probed, max_gap) + 1 = {first}, "
                         f"got {config.steps}")
    _check_noise_and_kappa_probe(noise_checkpoints, noise_groups, kappa_pairs)


def _check_staleness_probe(G: int, staleness: tuple[int, ...], samples: int, max_gap: int) -> None:
    """The sigma^2(s) probe: the ages probed, the samples per age (whole groups of G) and the largest rho gap."""
    if not staleness or any(int(s) != s or s < 0 for s in staleness) or list(staleness) != sorted(set(staleness)):
        raise ValueError(f"staleness must be increasing integers >= 0, got {','.join(map(str, staleness))}")
    if samples < G or samples % G:
        raise ValueError(f"samples must be a multiple of group_size = {G}, got {samples}")
    require_integer("max_gap", max_gap, 1)


def _check_reference(config: SimConfig, reference: str, reference_samples: int) -> None:
    """The reference gradient: exact only where it can be enumerated; sampled from whole groups, two at least."""
    G = config.group_size
    require_one_of("reference", reference, REFERENCES)
    problem = exact_gradient_problem(config.env, config.loss)
    if reference == "exact" and problem is not None:
        raise ValueError(f"reference exact needs an enumerable gradient (env bandit, or env token-mdp with "
                         f"per-token gradients): {problem}")
    if reference_samples < 2 * G or reference_samples % G:
        raise ValueError(f"reference_samples must be a multiple of group_size = {G} and >= {2 * G}, "
                         f"got {reference_samples}")


def _check_noise_and_kappa_probe(noise_checkpoints: int, noise_groups: int, kappa_pairs: int | None) -> None:
    """B_noise's checkpoints and groups, and kappa's curvature pairs (None: the env's default)."""
    require_integer("noise_checkpoints", noise_checkpoints, 1)
    require_integer("noise_groups", noise_groups, 2, note=" (prompt groups are the noise scale's units)")
    if kappa_pairs is not None:
        require_integer("kappa_pairs", kappa_pairs, 0,
                        note=" (curvature pairs per seed and noise checkpoint; 0: kappa not measured)")


def calibrate(config: SimConfig, staleness: tuple[int, ...] = DEFAULT_STALENESS, checkpoints: int = 3,
              samples: int = 256, max_gap: int = DEFAULT_MAX_GAP, reference: str = "auto",
              reference_samples: int = DEFAULT_REFERENCE_SAMPLES, level: float = noise_estimators.DEFAULT_LEVEL,
              draws: int = noise_estimators.DEFAULT_DRAWS, noise_checkpoints: int = DEFAULT_NOISE_CHECKPOINTS,
              noise_groups: int = DEFAULT_NOISE_GROUPS, kappa_pairs: int | None = None) -> Calibration:
    """Run the probe of ``config`` and measure sigma^2(s) (both forms), rho, the KL drift, B_noise and kappa.

    ``reference``: exact (enumerated grad F: bandit, or token MDP with a per-token loss), sampled (mean
    of ``reference_samples`` held-out fresh responses, its error subtracted) or auto (exact where possible).
    B_noise: ``noise_groups`` fresh groups per seed at ``noise_checkpoints`` steps evenly spread over the run,
    those before the reward plateau kept (``measure_noise_scale``); the exact-|E G|^2 value wherever the gradient
    can be enumerated (whatever ``reference`` says). kappa (the optimizer's memory, ``measure_kappa``): after the run,
    at the checkpoints B_noise kept, ``kappa_pairs`` curvature pairs per seed on their own stream (None: the env's
    default, ``DEFAULT_KAPPA_PAIRS``; 0: not measured), the exact value on the bandit, and the lag-1 estimator on the
    probe's on-policy twin.
    """
    asked_capacity = config.capacity
    config = config.validated()
    staleness = tuple(int(s) for s in staleness)
    check_probe(probe_config(config, max_gap), staleness, samples, max_gap, reference, reference_samples,
                noise_checkpoints, noise_groups, kappa_pairs)
    check_probe_sizes(config, checkpoints=checkpoints, staleness=staleness, samples=samples, max_gap=max_gap,
                      reference=reference, reference_samples=reference_samples, noise_checkpoints=noise_checkpoints,
                      noise_groups=noise_groups, kappa_pairs=kappa_pairs)
    config = probe_config(config, max_gap)
    exact = reference == "exact" or (reference == "auto" and exact_gradient_problem(config.env, config.loss) is None)
    G, S = config.group_size, config.seeds
    first = max(max(staleness), max_gap) + 1
    checkpoint_steps = set(np.linspace(first, config.steps - 1, checkpoints).astype(int).tolist())
    rng = PerSeedGenerator(config.seed + 7919, S)  # the probe's own stream: the run is unchanged
    measure_rho = config.buffer in RHO_BUFFERS
    acc: dict = {}
    drift = []
    noise_steps = set(np.linspace(0, config.steps - 1, noise_checkpoints).astype(int).tolist())
    noise_rng = PerSeedGenerator(config.seed + 15485863, S)  # its own stream: the sigma^2 probe's draws unchanged
    enumerable = exact_gradient_problem(config.env, config.loss) is None
    noise_units: dict[int, np.ndarray] = {}  # updates done -> (S, U, d) per-group mean gradients at that theta
    noise_exact_sq: dict[int, np.ndarray] = {}  # updates done -> (S,) exact |E G|^2 = ||grad F||^2
    kappa_pairs = kappa_pairs_for(config, kappa_pairs)
    kappa_at: dict[int, tuple] = {}  # updates done -> (theta, Adam's preconditioner, grad F) for kappa after the run
    live = {}  # the run's optimizer (its state is the preconditioner), seen by on_step before the first update

    def keep_optimizer(view) -> None:
        live["optimizer"] = view.optimizer

    def observer(step, params, history, buffer, env):
        if step == config.steps - 1 and hasattr(env, "exact_divergences"):  # the last policy T against T - s
            last = len(history) - 1
            ages = drift_ages(last)
            m2 = [float(np.mean(env.exact_divergences(history[-1], history[-1 - s])["m2"])) for s in ages]
            live["drift"] = {"staleness": [float(a) for a in ages], "m2": m2,
                             "source": "calibrate-simulator: exact M2(s) = E[(log pi_T / pi_T-s)^2] of the probe's "
                                       f"last policy T = {last} against its policy s updates earlier, mean over "
                                       f"{S} seeds (a trainer re-scores 64 rollouts an age: trl-replay's "
                                       "drift.parquet)"}
        if step in noise_steps:  # theta_{step + 1}: fresh groups of it, its own loss gradient (staleness 0)
            theta = history[-1]
            fresh = generate(EnvBackend(env, noise_rng), config, theta, noise_groups, step + 1, 0, noise_rng)
            noise_units[step + 1] = group_units(per_sample_grads(env, config, theta, fresh), G)  # (S, U, d)
            grad_f = None
            if enumerable:
                grad_f = exact_loss_gradient(env, config, theta)  # (S, d)
                noise_exact_sq[step + 1] = np.einsum("sd,sd->s", grad_f, grad_f)
            precond = live["optimizer"].preconditioner()
            kappa_at[step + 1] = (theta.copy(), None if precond is None else precond.copy(), grad_f)
            live["env"] = env
        if step not in checkpoint_steps:
            return
        theta = history[-1]  # (S, d): the parameters after this step's update
        backend = EnvBackend(env, rng)
        if exact:
            true_grad, ref_var = exact_loss_gradient(env, config, theta), np.zeros(S)
            means = np.stack([exact_sample_mean(env, config, theta, history[-1 - s]) for s in staleness], axis=1)
        else:
            ref = generate(backend, config, theta, reference_samples // G, step, 0, rng)
            ref_grads = per_sample_grads(env, config, theta, ref)  # (S, n_ref, d), held out from every sample below
            true_grad, ref_var = ref_grads.mean(axis=1), noise_estimators.reference_variance(ref_grads)
            means = None
        grads = np.stack([per_sample_grads(env, config, theta,
                                           generate(backend, config, history[-1 - s], samples // G, step - s, 0, rng))
                          for s in staleness], axis=1)  # (S, K, M, d)
        _add(acc, "stale", noise_estimators.staleness_moments(grads, true_grad, ref_var, means))
        drift.append(env.exact_divergences(history[-1], history[-2])["kl_new_behav"].mean())
        if measure_rho and hasattr(buffer, "valid"):
            C = buffer.valid.shape[1]
            items = buffer.stored(np.broadcast_to(np.arange(C), (S, C)))  # every slot; invalid ones masked
            per_item = per_sample_grads(env, config, theta, items)  # (S, C, d)
            eps = per_item - true_grad[:, None, :]
            _add(acc, "pairs", noise_estimators.pair_moments(eps, items.created, items.group, max_gap, buffer.valid,
                                                             ref_var))
            if exact:  # xi = G - E[G | creation step]: the proof's centred noise (App. C.2)
                created = np.where(buffer.valid, items.created, -1)
                xi = np.zeros_like(per_item)
                for k in np.unique(created[created >= 0]):
                    at = created == k  # (S, C)
                    mean_k = exact_sample_mean(env, config, theta, history[int(k)])  # (S, d), pi_k generated them
                    xi[at] = (per_item - mean_k[:, None, :])[at]
                _add(acc, "centred", noise_estimators.pair_moments(xi, items.created, items.group, max_gap,
                                                                   buffer.valid))

    result = run(config, observer=observer, on_step=keep_optimizer)
    profile = noise_estimators.noise_profile(acc["stale"], staleness, level, draws, seed=config.seed)

    def fit(name: str) -> RhoFit | None:
        moments: PairMoments | None = acc.get(name)
        return None if moments is None else noise_estimators.fit_rho(moments, config.capacity, level, draws,
                                                                      seed=config.seed)

    uncentred, centred = fit("pairs"), fit("centred")
    form = loss_form(config.loss)
    values = np.asarray(profile.plain if form == "plain" else profile.signal_normalised)
    calibration = Calibration(
        staleness=np.asarray(staleness, float), sigma_sq=values, form=form, loss=config.loss, noise=profile,
        rho_fit=centred if centred is not None else uncentred, rho_fit_uncentred=uncentred,
        rho_noise="centred" if centred is not None else "uncentred",
        kl_drift_per_step=float(np.mean(drift)) if drift else math.nan,
        reference="exact" if exact else f"sampled (n = {reference_samples} per seed and checkpoint, "
                                        "its variance / n subtracted)",
        probe_capacity=config.capacity)
    probe = ("the probe run" if config.capacity == asked_capacity
             else f"the probe run (FIFO capacity raised from {asked_capacity} to {config.capacity})")
    calibration.noise_scale = measure_noise_scale(
        noise_units, noise_exact_sq, result.eval_steps, result.evals["reward"], config.batch_size, G,
        f"calibrate-simulator: {config.env}, loss {config.loss}, advantage {config.resolved_advantage()}, B = "
        f"{config.batch_size}, R = {config.rollouts_per_step}, lr {config.lr:g} ({config.optimizer}), {probe}",
        config.seed, level)
    if kappa_pairs:  # at the checkpoints B_noise kept (before the reward plateau), beside b
        kappa_rng = PerSeedGenerator(config.seed + 32452843, S)  # its own stream: every other probe draw unchanged
        jacobian = config.env in JACOBIAN_ENVS
        parts = {t: curvature_parts(live["env"], config, kappa_at[t][0], kappa_at[t][1], kappa_pairs, t, kappa_rng,
                                    field=enumerable, units=noise_units[t] if jacobian and enumerable else None,
                                    grad_f=kappa_at[t][2] if jacobian else None)
                 for t in calibration.noise_scale.steps}
        calibration.memory = measure_kappa(parts, calibration.noise_scale.steps, config, config.seed + 271, level)
    calibration.drift = live.get("drift")
    s, v = calibration.table()
    if s.size >= 2:
        calibration.fits = fit_profiles(s, v)
    return calibration

