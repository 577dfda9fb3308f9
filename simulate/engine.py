"""The simulator's training loop: every design of ``core/designs.py`` on a log-linear policy, all seeds at once.

Papers (docs/REFERENCES.md): experience-replay Sec. 2-3 for the pipelines and compute;
FreshPER, M2PO, RLOO group replay and ExGRPO for the other designs.

The batch of each step, the buffer and the compute accounting come from
``core.pipeline.Pipeline`` (shared with the language-model validator); this module
adds what only the simulator can do: exact gradients and evaluations of the policy, and
per-step curves. All arrays carry the seed axis first. Each step: the pipeline hands
over the training batch, the loss of ``core/designs.py`` gives d loss / d logp_new,
``env.grad_logp_contract`` turns it into the exact parameter gradient, the optimiser steps.

| code name                | paper symbol   | meaning                                                           |
|--------------------------|----------------|-------------------------------------------------------------------|
| ``compute``              | c              | rollout-cost units, one sample's update = 1 (Eqs. 1-2)            |
| ``staleness``            | t - t_i        | step minus the policy version that generated the sample           |
| ``ess_by_age``           | ESS/n by age   | Kish ESS fraction per staleness bucket (FreshPER Sec. 3)          |
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Callable, Mapping

import numpy as np
from threadpoolctl import ThreadpoolController

from ..core.designs import StepBatch, compute_loss
from ..core.losses import TOKEN_KISH_METRICS, LazyMetrics, LossOutput
from ..core.metrics import AGE_BUCKETS, TOKEN_STATS, step_metrics_by_age
from ..core.pipeline import EnvBackend, Pipeline, UsageRecord
from ..core.rng import PerSeedGenerator
from ..core.rollouts import RolloutBatch
from .config import SimConfig
from .envs import ENVIRONMENTS, make_env
from .optim import OPTIMIZERS


@dataclass
class RunResult:
    """Everything a run measured; curves are (S, steps), evaluations (S, E)."""

    config: SimConfig
    curves: dict[str, np.ndarray]
    eval_steps: np.ndarray  # (E,)
    evals: dict[str, np.ndarray]  # name -> (S, E)
    staleness_counts: np.ndarray  # (max_staleness + 1,) uses of samples at each staleness, all seeds
    replay_counts: np.ndarray  # flat: use count of every rollout that left the buffer
    time_since_last_use_counts: np.ndarray  # (max + 1,) histogram; first uses excluded
    ess_by_age: dict[int, float] = field(default_factory=dict)  # bucket left edge -> mean Kish ESS fraction
    drift: dict[str, np.ndarray] = field(default_factory=dict)  # exact KL(pi_t || pi_{t-lag}) by lag, (S, lags)
    counts: dict[str, float] = field(default_factory=dict)  # K_training, K_inference, ...

    def summary(self) -> dict[str, float]:
        """Scalar summary (means over seeds; final = mean of the last 10% of evaluations)."""
        tail = max(1, self.eval_steps.size // 10)
        final_reward = self.evals["reward"][:, -tail:].mean(axis=1)  # (S,)
        final_accuracy = self.evals["accuracy"][:, -tail:].mean(axis=1)
        uses = self.staleness_counts
        staleness_values = np.arange(uses.size)
        total_uses = max(uses.sum(), 1)
        tslu = self.time_since_last_use_counts
        out = {
            "final_reward": float(final_reward.mean()),
            "final_reward_std": float(final_reward.std(ddof=1)) if final_reward.size > 1 else 0.0,
            "final_accuracy": float(final_accuracy.mean()),
            "peak_accuracy": float(self.evals["accuracy"].mean(axis=0).max()),
            "mean_staleness": float((uses * staleness_values).sum() / total_uses),
            "max_staleness": int(staleness_values[uses > 0].max()) if uses.any() else 0,
            "replay_ratio": float(self.counts["K_training"] / max(self.counts["K_inference"], 1)),
            "mean_replay_count_evicted": float(self.replay_counts.mean()) if self.replay_counts.size else math.nan,
            "mean_time_since_last_use": (float((tslu * np.arange(tslu.size)).sum() / tslu.sum()) if tslu.sum()
                                         else math.nan),
            "compute": float(self.curves["compute"][:, -1].mean()),
            "compute_ratio": float(self.counts["compute_ratio"]),
            "mu_estimate": float(self.counts.get("mu_estimate", math.nan)),
        }
        for name in ("ess_frac", "chi2", "d2", "kl_k1", "kl_k2", "kl_k3", "m2", "pg_clipfrac", "masked_frac",
                     "clip_frac", "is_ratio_max", "entropy"):
            if name in self.curves:
                out[name] = float(np.nanmean(self.curves[name]))
        return out


DIFFICULTY_EDGES = (0.25, 0.75)  # ExGRPO's hard / medium / easy split of warm-start accuracy


def difficulty_gains(env, params0: np.ndarray, params: np.ndarray) -> dict[str, float]:
    """Final minus warm-start per-prompt accuracy, averaged over each difficulty bucket's prompts and seeds."""
    names = ("hard", "medium", "easy")
    if not (hasattr(env, "prompt_accuracy") and hasattr(env, "difficulty")):
        return {**{f"gain_{n}": math.nan for n in names}, **{f"n_{n}": math.nan for n in names}}
    gain = env.prompt_accuracy(params) - env.prompt_accuracy(params0)  # (S, P)
    bucket = np.searchsorted(np.asarray(DIFFICULTY_EDGES), env.difficulty(), side="left")  # (P,) 0/1/2
    out = {}
    for b, name in enumerate(names):
        sel = bucket == b
        out[f"gain_{name}"] = float(gain[:, sel].mean()) if sel.any() else math.nan
        out[f"n_{name}"] = float(sel.sum())
    return out


# --------------------------------------------------------------------------- the loop


#: the most (seed, response, token) cells of training batches whose metrics the recorder computes in one pass: a
#: chunk of steps pays the calls of one step (at least one step a chunk; the stacked arrays stay small: 256 KiB of
#: float64, so that the chunk's dozens of temporaries do not grow and shrink the heap by megabytes at every flush)
CHUNK_CELLS = 1 << 15


@dataclass
class _PendingStep:
    """One step's inputs to its recorded curves, kept until ``Recorder.flush``."""

    step: int
    token_lr: np.ndarray  # (S, B, L) logp_new - logp_behav
    mask: np.ndarray  # (S, B, L)
    staleness: np.ndarray  # (S, B)
    time_since_last_use: np.ndarray  # (S, B)
    loss: np.ndarray  # (S,)
    loss_metrics: Mapping[str, np.ndarray]
    fresh: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # (reward, group, keep) (S, m) of the fresh view

    def kind(self) -> tuple:
        """What the steps of one chunk share: the arrays' shapes and the loss metrics' ``make``."""
        metrics = self.loss_metrics
        make = metrics.stack_key if isinstance(metrics, LazyMetrics) else None
        return (self.token_lr.shape, self.staleness.shape, None if self.fresh is None else self.fresh[0].shape,
                "alone" if make is None else make)


class Recorder:
    """Accumulates per-step curves (S, steps), ESS by age and, through ``UsageRecord``, the Fig. 2 distributions.

    The metrics of the training batches (``record_batch``) are computed for a chunk of steps at once: the steps
    stacked on the seed axis (every metric is per seed, the same numbers as step by step), at most ``CHUNK_CELLS``
    cells, flushed before any curve is first written (the curves keep the order of their first values) and at the
    end of the run (``flush``).
    """

    def __init__(self, num_seeds: int, steps: int):
        self.curves: dict[str, np.ndarray] = {}
        self.num_seeds, self.steps = num_seeds, steps
        self.usage = UsageRecord()
        self.ess_age_sum: dict[int, float] = defaultdict(float)
        self.ess_age_n: dict[int, int] = defaultdict(int)
        self.pending: list[_PendingStep] = []

    def put(self, name: str, step: int, value) -> None:
        if name not in self.curves:
            self.flush()  # the pending steps' curves come first, as they would step by step
            self.curves[name] = np.full((self.num_seeds, self.steps), np.nan)
        self.curves[name][:, step] = value

    def _put_steps(self, name: str, first: int, values: np.ndarray) -> None:
        """Steps first, first + 1, ... of curve ``name`` from values (k S,), step after step."""
        if name not in self.curves:
            self.curves[name] = np.full((self.num_seeds, self.steps), np.nan)
        k = values.shape[0] // self.num_seeds
        self.curves[name][:, first:first + k] = values.reshape(k, self.num_seeds).T

    TOKEN_STATS = TOKEN_STATS
    #: the keys of core.metrics.step_metrics the engine records (under these names)
    STEP_KEYS = ("ess_frac", *TOKEN_STATS, "staleness_mean", "staleness_max")

    def record_batch(self, step: int, data: StepBatch, logp_new: np.ndarray, out: LossOutput,
                     fresh: tuple[RolloutBatch, np.ndarray] | None) -> None:
        """Distributions, sequence-level ESS, ESS by age and the token-level estimators (``core.metrics``), the loss
        and its metrics, and the fresh responses' reward, accuracy and ``frac_reward_zero_std``: kept, and computed
        with the chunk's other steps.

        The token-level estimators come from the loss's metrics when the loss computed them on this batch (every
        loss with a behaviour policy does), else from ``core.metrics``. ``fresh``: ``StepBatch.fresh_view()``.
        """
        batch = data.train
        record = _PendingStep(step, logp_new - batch.logp_behav, batch.mask, data.staleness, data.time_since_last_use,
                              out.loss, out.metrics, None if fresh is None else (fresh[0].reward, fresh[0].group,
                                                                                  fresh[1]))
        if self.pending and record.kind() != self.pending[0].kind():
            self.flush()
        self.pending.append(record)
        if len(self.pending) * record.token_lr.size >= CHUNK_CELLS:
            self.flush()

    def flush(self) -> None:
        """Compute and write the pending steps' curves."""
        pending, self.pending = self.pending, []
        if pending:
            self._write_chunk(pending)

    def _write_chunk(self, chunk: list[_PendingStep]) -> None:
        def stacked(name: str, index: int | None = None) -> np.ndarray:
            parts = [getattr(r, name) if index is None else getattr(r, name)[index] for r in chunk]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        first_metrics = chunk[0].loss_metrics  # the chunk's steps share its make (``_PendingStep.kind``)
        make = first_metrics.stack_key if isinstance(first_metrics, LazyMetrics) else None  # None once computed
        loss_metrics = _stacked_loss_metrics([r.loss_metrics for r in chunk])
        if loss_metrics is None:  # metrics with different keys: step by step
            for record in chunk:
                self._write_chunk([record])
            return
        S, first, fresh = self.num_seeds, chunk[0].step, chunk[0].fresh is not None
        staleness = stacked("staleness")
        self.usage.add_uses(staleness, stacked("time_since_last_use"))
        generated = (stacked("fresh", 0), stacked("fresh", 1)) if fresh else (None, None)
        token_lr, mask = stacked("token_lr"), stacked("mask")
        # one-token responses, every token real (the bandit): the loss's token-level Kish ESS is the sequence-level
        # one, the same sums of the same numbers (core.losses.TOKEN_KISH_METRICS), not summed a second time
        one_token = make in TOKEN_KISH_METRICS and token_lr.shape[-1] == 1 and bool(mask.all())
        metrics, frac, count = step_metrics_by_age(token_lr, mask, staleness, loss_metrics, *generated,
                                                   seq_ess=loss_metrics["ess_frac"] if one_token else None,
                                                   abs_max=False)  # log_ratio_abs_max: not a curve (STEP_KEYS)
        for name in self.STEP_KEYS:  # ess_frac at sequence level; the estimators at token level, verl/TRL style
            self._put_steps(name, first, metrics[name])
        # ESS by age: the fraction of each (seed, age bucket) cell with >= 2 samples, summed over seeds, then over
        # steps in step order. A bucket with every seed in is one contiguous row of the transposed fractions: the
        # same pairwise sum as of the selection (numpy sums a contiguous row pairwise, whatever its length)
        k, K = len(chunk), frac.shape[1]
        ok = (count >= 2).reshape(k, S, K)
        seeds_in = ok.sum(axis=1)  # (k, K)
        whole = np.ascontiguousarray(frac.reshape(k, S, K).transpose(0, 2, 1)).sum(axis=-1)  # (k, K)
        for j, b in zip(*np.nonzero(seeds_in)):
            some = frac[j * S:(j + 1) * S, b][ok[j, :, b]].sum() if seeds_in[j, b] < S else whole[j, b]
            self.ess_age_sum[AGE_BUCKETS[b]] += float(some)
            self.ess_age_n[AGE_BUCKETS[b]] += int(seeds_in[j, b])
        for name, value in loss_metrics.items():
            if name not in self.TOKEN_STATS and name != "ess_frac":  # those come from step_metrics above
                self._put_steps(name, first, value)
        self._put_steps("loss", first, stacked("loss"))
        if fresh:
            reward, keep = generated[0], stacked("fresh", 2)
            n = np.maximum(keep.sum(axis=1), 1)  # (k S,)
            self._put_steps("reward", first, np.where(keep, reward, 0.0).sum(axis=1) / n)
            self._put_steps("accuracy_train", first, np.where(keep, reward == 1.0, 0.0).sum(axis=1) / n)
            self._put_steps("frac_reward_zero_std", first, metrics["frac_reward_zero_std"])  # z, TRL's name


def _stacked_loss_metrics(items: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray] | None:
    """The loss metrics of a chunk's steps stacked on the seed axis (``LazyMetrics.stacked`` computes them in one
    call); None when the steps' metrics do not have the same keys."""
    if len(items) > 1 and all(isinstance(m, LazyMetrics) and m.stack_key is not None for m in items):
        return LazyMetrics.stacked(list(items))  # type: ignore[arg-type]
    values = [dict(m) for m in items]
    if len(values) == 1:
        return values[0]
    if any(list(v) != list(values[0]) for v in values):
        return None
    return {k: np.concatenate([v[k] for v in values]) for k in values[0]}


def env_kwargs(config: SimConfig) -> dict:
    """The environment's constructor arguments from the run config: each field of its registry config that the run
    config also has (``num_prompts``, ``instance_seed``, ...); the rest keep the environment's defaults."""
    run = {f.name for f in fields(config)}
    return {f.name: getattr(config, f.name) for f in fields(ENVIRONMENTS[config.env].config) if f.name in run}


@dataclass
class StepView:
    """What ``run(..., on_step=...)`` sees before each update (tests, diagnostics)."""

    step: int
    data: StepBatch  # the pipeline's training batch
    params: np.ndarray  # (S, d) the policy before the update
    logp_new: np.ndarray  # (S, B, L) the training batch's log-probs under ``params``
    loss: LossOutput
    grad: np.ndarray | None = None  # (S, d) the gradient this update applies (calibration's lag-1 series)
    optimizer: object = None  # the run's optimizer (simulate/optim.py), its state before this update


def run(config: SimConfig, progress: Callable[[int], None] | None = None, observer=None,
        on_step: Callable[[StepView], None] | None = None) -> RunResult:
    """Run one configuration for all its seeds.

    ``progress(step)`` is called after each step; ``observer(step, params, history, buffer, env)``
    too (calibration measures the noise profile through it); ``on_step(StepView)`` before each update.

    BLAS runs on one thread meanwhile. The engine's products are small ((S, d) @ (d, P A) is
    64 x 16 x 1024 for the bandit at 64 seeds) and OpenBLAS splits anything above ~2.6e5
    multiply-adds over every core: waking its threads costs more than the product, most of all when
    another process holds a core (bench/bench_simulator.py). Each output element comes from the same
    kernel either way, so the results do not change, only the time.
    """
    with _blas_controller().limit(limits=1, user_api="blas"):
        return _run(config.validated(), progress, observer, on_step)


@lru_cache(maxsize=1)
def _blas_controller() -> ThreadpoolController:
    """One ThreadpoolController for the process: finding the loaded BLAS libraries (what
    ``threadpool_limits`` does on every call) costs more than a short run's steps."""
    return ThreadpoolController()


@dataclass
class _DriftMeter:
    """KL(new || behav) between the policy and itself ``lag`` updates earlier, at each evaluation (measure_drift)."""

    lags: list[int]
    total: np.ndarray  # (S, lags)
    n: np.ndarray  # (lags,)

    @classmethod
    def of(cls, config: SimConfig) -> _DriftMeter:
        lags = [lag for lag in (1, 2, 4, 8, 16, 32) if lag < config.steps] if config.measure_drift else []
        return cls(lags, np.zeros((config.seeds, len(lags))), np.zeros(len(lags)))

    def add(self, env, history: list[np.ndarray]) -> None:
        for j, lag in enumerate(self.lags):
            if len(history) > lag:
                exact = env.exact_divergences(history[-1], history[-1 - lag])
                self.total[:, j] += exact["kl_new_behav"]
                self.n[j] += 1

    def result(self) -> dict:
        return {"lags": np.asarray(self.lags), "kl_new_behav": self.total / np.maximum(self.n, 1)}


def _record_training_batch(rec: Recorder, step: int, data: StepBatch, logp_new: np.ndarray, out: LossOutput):
    """The step's batch statistics, loss metrics, fresh rewards and the design's curves; the fresh view it used."""
    fresh = data.fresh_view()  # (batch, keep): the responses generated this step
    rec.record_batch(step, data, logp_new, out, fresh)
    for name, value in data.curves.items():
        if not name.startswith("_"):  # "_" marks the design's internal per-step arrays
            rec.put(name, step, value)
    return fresh


def _record_entropy(rec: Recorder, step: int, env, params: np.ndarray, data: StepBatch, fresh) -> None:
    """Mean token entropy of the updated policy on the step's fresh responses (the whole batch when none are)."""
    train = data.train
    batch, keep = fresh if fresh is not None else (train, np.ones(train.prompt.shape, bool))
    m = batch.mask & keep[:, :, None]
    ent = env.token_entropy(params, batch.prompt, batch.tokens, batch.mask)
    rec.put("entropy", step, np.where(m, ent, 0).sum(axis=(1, 2)) / np.maximum(m.sum(axis=(1, 2)), 1))


def _record_exact_divergences(rec: Recorder, step: int, env, history: list[np.ndarray], stale_k: int) -> None:
    """stale-k's exact divergences between the policy that scored the batch and the one that generated it."""
    exact = env.exact_divergences(history[-2], history[max(step - stale_k, 0)])
    for name, value in exact.items():
        rec.put(f"exact_{name}", step, value)
    rec.put("exact_ess_frac", step, np.exp(-exact["d2"]))  # ESS/n = e^{-D_2}, FreshPER Eqs. (5), (24)


def _run(config: SimConfig, progress, observer, on_step) -> RunResult:
    S = config.seeds
    rec = Recorder(S, config.steps)
    drift = _DriftMeter.of(config)
    env_args, settings = env_kwargs(config), config.pipeline_settings()
    rng = PerSeedGenerator(config.seed, S)
    env = make_env(config.env, **env_args)
    params = env.init_params(S)  # (S, d)
    optimizer = OPTIMIZERS[config.optimizer](params, config.lr)
    history = [params.copy()]  # params before each update, for staleness-exact divergences
    eval_steps, evals = [], defaultdict(list)
    backend = EnvBackend(env, rng)
    pipeline = Pipeline(config, backend, rng, S, settings)

    for step in range(config.steps):
        data = pipeline.next_batch(step, params)
        train = data.train
        logp_new = env.logp(params, train.prompt, train.tokens, train.mask)  # (S, B, L)
        out = compute_loss(config, train, logp_new, data.is_fresh)
        coef = out.grad_logp * data.weight[:, :, None]  # FreshPER IS weights (ones otherwise)
        grad = env.grad_logp_contract(params, train.prompt, train.tokens, train.mask, coef)  # (S, d)
        if on_step is not None:
            on_step(StepView(step, data, params, logp_new, out, grad, optimizer))
        params = optimizer.step(params, grad)
        history.append(params.copy())
        compute = pipeline.account(data)  # (S,) compute so far, Eqs. (1)-(2)
        design_curves = pipeline.after_update(step, data)  # the design's buffer bookkeeping after the update

        fresh = _record_training_batch(rec, step, data, logp_new, out)
        rec.put("compute", step, compute)
        for name, value in design_curves.items():
            rec.put(name, step, value)

        if step % config.eval_every == 0 or step == config.steps - 1:
            for name, value in env.evaluate(params).items():
                evals[name].append(value)
            eval_steps.append(step + 1)
            _record_entropy(rec, step, env, params, data, fresh)
            if config.buffer == "stale-k" and step >= config.stale_k:
                _record_exact_divergences(rec, step, env, history, config.stale_k)
            drift.add(env, history)
        if observer is not None:
            observer(step=step, params=params, history=history, buffer=pipeline.buffer, env=env)
        if progress is not None:
            progress(step)

    rec.flush()
    gains = difficulty_gains(env, history[0], params)
    replay_counts = pipeline.evicted_use_counts()
    counts = {**pipeline.counts(), **gains}
    ess_by_age = {edge: rec.ess_age_sum[edge] / rec.ess_age_n[edge] for edge in sorted(rec.ess_age_n)}
    return RunResult(
        config=config,
        curves=rec.curves,
        eval_steps=np.asarray(eval_steps),
        evals={name: np.stack(values, axis=1) for name, values in evals.items()},
        staleness_counts=rec.usage.staleness_counts,
        replay_counts=replay_counts,
        time_since_last_use_counts=rec.usage.time_since_last_use_counts,
        ess_by_age=ess_by_age,
        drift=drift.result(),
        counts=counts,
    )
