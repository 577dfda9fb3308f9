"""The training loop of the simulator: every buffer design and loss, synchronous and asynchronous.

Papers: experience-replay (shared/papers/experience-replay-optimal-buffer.txt) Sec. 2-3 for the
pipelines and compute; FreshPER, M2PO, RLOO group replay and ExGRPO for the other designs.

| code name                | paper symbol   | meaning                                                           |
|--------------------------|----------------|-------------------------------------------------------------------|
| ``rollouts_per_step``    | R              | fresh responses per step (sync)                                   |
| ``capacity``             | N              | FIFO buffer size                                                  |
| ``batch_size``           | B              | responses per update                                              |
| ``workers/trainers``     | W / T          | async split; R_async = B W / (T mu) responses per update          |
| ``compute``              | C(1 + W/T)     | per-update compute in units of one sample's update (Eq. 1-2)      |
| ``staleness``            | t - t_i        | step minus the policy version that generated the sample           |

All arrays carry the seed axis first. Each step of the synchronous pipeline:
generate R fresh responses (R/G prompts x G), push them into the buffer, sample B,
compute the loss on the current policy's log-probs, step the optimiser.
Compute per step (rollout-cost units, one sample's update = 1): mu * generated + trained.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.rng import PerSeedGenerator
from replay_theory.simulate.rollouts import Environment, RolloutBatch
from replay_theory.theory import divergences as div

AGE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # left edges, log2-spaced


# bucket of every staleness 0 .. 1024 (the last left edge): one table look-up instead of a binary search
_AGE_TABLE = np.searchsorted(np.asarray(AGE_BUCKETS), np.arange(AGE_BUCKETS[-1] + 1), side="right") - 1


def age_bucket(staleness: np.ndarray) -> np.ndarray:
    """Index of the AGE_BUCKETS bin of each staleness value (>= 0)."""
    return np.take(_AGE_TABLE, staleness, mode="clip")  # beyond 1024: the last bucket


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
            "mean_time_since_last_use": float((tslu * np.arange(tslu.size)).sum() / tslu.sum()) if tslu.sum() else math.nan,
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


# --------------------------------------------------------------------------- generation


def make_advantage(config: SimConfig, reward_groups: np.ndarray) -> np.ndarray:
    """Group-relative advantages (S, g, G) from rewards (S, g, G)."""
    from replay_theory.simulate import advantages

    if config.advantage == "grpo":
        return advantages.group_advantage(reward_groups, normalize_std=True)
    if config.advantage == "group-mean":
        return advantages.group_mean_baseline(reward_groups)
    return advantages.leave_one_out(reward_groups)


def generate(env: Environment, config: SimConfig, params: np.ndarray, num_groups: int, version: np.ndarray | int,
             group_offset: int, rng: PerSeedGenerator) -> RolloutBatch:
    """num_groups prompts x G responses from the policy ``params`` (S, d), seeds first."""
    S, G = params.shape[0], config.group_size
    prompts = rng.integers(0, env.num_prompts, size=(S, num_groups))  # (S, g)
    prompts = np.repeat(prompts, G, axis=1)  # (S, g*G)
    tokens, logp, mask = env.sample(params, prompts, rng)  # (S, n, L) each
    reward = env.reward(prompts, tokens, mask)  # (S, n)
    advantage = make_advantage(config, reward.reshape(S, num_groups, G)).reshape(S, -1)
    n = num_groups * G
    # astype copies the broadcast views into arrays of their own
    created = np.broadcast_to(np.asarray(version).reshape(-1, 1) if np.ndim(version) else version, (S, n)).astype(np.int64)
    group = np.broadcast_to(group_offset + np.repeat(np.arange(num_groups), G), (S, n)).astype(np.int64)
    return RolloutBatch(prompt=prompts, tokens=tokens, mask=mask, logp_behav=logp, reward=reward,
                        advantage=advantage, created=created, group=group)


# --------------------------------------------------------------------------- losses


def compute_loss(config: SimConfig, batch: RolloutBatch, logp_new: np.ndarray, is_fresh: np.ndarray | None = None):
    """Dispatch to the loss named in the config (simulate/losses.py)."""
    from replay_theory.simulate import losses

    if config.loss == "reinforce":
        return losses.reinforce(logp_new, batch.advantage, batch.mask)
    if config.loss == "grpo":
        return losses.grpo(logp_new, batch.logp_behav, batch.advantage, batch.mask,
                           eps_low=config.eps_low, eps_high=config.eps_high)
    if config.loss == "no-trust-region":
        return losses.no_trust_region(logp_new, batch.logp_behav, batch.advantage, batch.mask)
    if config.loss in ("m2po", "m2po-reference"):
        variant = "algorithm1" if config.loss == "m2po" else "reference"
        return losses.m2po(logp_new, batch.logp_behav, batch.advantage, batch.mask, tau_m2=config.tau_m2,
                           variant=variant)
    if config.loss == "rloo":
        fresh = np.ones(batch.prompt.shape, bool) if is_fresh is None else is_fresh
        return losses.rloo(logp_new, batch.logp_behav, batch.advantage, batch.mask, c=config.clip_c, is_fresh=fresh)
    if config.loss == "asymre":
        return losses.asymre(logp_new, batch.reward, batch.reward - batch.advantage, batch.mask,
                             delta_v=config.asymre_delta_v)
    if config.loss == "exgrpo":
        replayed = np.zeros(batch.prompt.shape, bool) if is_fresh is None else ~is_fresh
        return losses.exgrpo_shaped(logp_new, batch.logp_behav, batch.advantage, batch.mask, is_replayed=replayed,
                                    beta=config.exgrpo_beta, eps_low=config.eps_low, eps_high=config.eps_high)
    raise ValueError(f"loss must be one of the simulator's losses, got {config.loss!r}")


# --------------------------------------------------------------------------- the loop


class _Recorder:
    """Accumulates per-step curves and the Fig. 2 distributions."""

    def __init__(self, num_seeds: int, steps: int):
        self.curves: dict[str, np.ndarray] = {}
        self.num_seeds, self.steps = num_seeds, steps
        self.staleness_counts = np.zeros(1, np.int64)
        self.tslu_counts = np.zeros(1, np.int64)
        self.ess_age_sum: dict[int, float] = defaultdict(float)
        self.ess_age_n: dict[int, int] = defaultdict(int)

    def put(self, name: str, step: int, value) -> None:
        if name not in self.curves:
            self.curves[name] = np.full((self.num_seeds, self.steps), np.nan)
        self.curves[name][:, step] = value

    @staticmethod
    def _add_hist(hist: np.ndarray, values: np.ndarray) -> np.ndarray:
        values = values[values >= 0].astype(np.int64)
        if values.size == 0:
            return hist
        counts = np.bincount(values)
        if counts.size > hist.size:
            hist = np.pad(hist, (0, counts.size - hist.size))
        hist[: counts.size] += counts
        return hist

    TOKEN_STATS = ("kl_k1", "kl_k2", "kl_k3", "m2", "d2", "chi2")

    def record_batch(self, step: int, batch: RolloutBatch, logp_new: np.ndarray, staleness: np.ndarray,
                     tslu: np.ndarray, loss_metrics: dict | None = None) -> None:
        """Distributions, sequence-level ESS, ESS by age and the token-level estimators.

        The token-level estimators come from ``loss_metrics`` when the loss already
        computed them on this batch (every loss with a behaviour policy does), else here.
        """
        from replay_theory.simulate.losses import ess_kish_fraction_finite

        self.staleness_counts = self._add_hist(self.staleness_counts, staleness.ravel())
        self.tslu_counts = self._add_hist(self.tslu_counts, tslu.ravel())
        token_lr = np.where(batch.mask, logp_new - batch.logp_behav, 0.0)  # (S, B, L)
        seq_lr = token_lr.sum(axis=-1)  # (S, B): sequence log-ratio = sum of token log-ratios
        mask = batch.mask
        # sequence level: the product of token ratios (div.ess_kish_fraction, without its checks when all finite)
        finite = np.isfinite(seq_lr).all()
        self.put("ess_frac", step, ess_kish_fraction_finite(seq_lr) if finite else div.ess_kish_fraction(seq_lr))
        flat_lr = token_lr.reshape(self.num_seeds, -1)
        flat_mask = mask.reshape(self.num_seeds, -1)
        if loss_metrics is not None and all(k in loss_metrics for k in self.TOKEN_STATS):
            token_stats = {k: loss_metrics[k] for k in self.TOKEN_STATS}
        else:
            token_stats = div.sample_statistics(flat_lr, mask=flat_mask)
        for name in self.TOKEN_STATS:
            self.put(name, step, token_stats[name])  # token level, verl/TRL style
        self.put("staleness_mean", step, np.sum(staleness, axis=1) / staleness.shape[1])  # = .mean(axis=1)
        self.put("staleness_max", step, staleness.max(axis=1))
        self._record_ess_by_age(seq_lr, staleness)

    def _record_ess_by_age(self, seq_lr: np.ndarray, staleness: np.ndarray) -> None:
        """Kish ESS fraction of each (seed, age bucket) cell with >= 2 samples, accumulated over steps."""
        S = seq_lr.shape[0]
        nb = len(AGE_BUCKETS)
        cell = (age_bucket(staleness) + np.arange(0, S * nb, nb)[:, None]).ravel()  # (S*B,) flat (seed, bucket)
        lr = seq_lr.ravel()
        top = np.full(S * nb, -np.inf)
        np.maximum.at(top, cell, lr)  # per-cell max: weights rescaled into (0, 1]
        w = np.exp(lr - np.take(top, cell))  # (S*B,)
        count = np.bincount(cell, minlength=S * nb)
        sum_w = np.bincount(cell, weights=w, minlength=S * nb)
        sum_w2 = np.bincount(cell, weights=w * w, minlength=S * nb)
        ok = count >= 2
        frac = np.zeros(S * nb)
        frac[ok] = sum_w[ok] ** 2 / (count[ok] * sum_w2[ok])  # Kish ESS / n within the cell
        per_bucket_ok = ok.reshape(S, nb)
        per_bucket_frac = frac.reshape(S, nb)
        for b in np.nonzero(per_bucket_ok.any(axis=0))[0]:
            edge = AGE_BUCKETS[b]
            self.ess_age_sum[edge] += float(per_bucket_frac[per_bucket_ok[:, b], b].sum())
            self.ess_age_n[edge] += int(per_bucket_ok[:, b].sum())


@dataclass
class _StepData:
    """What one step trains on, and what it generated."""

    train: RolloutBatch  # (S, B, ...) the training batch
    weight: np.ndarray  # (S, B) sampler weights (FreshPER IS weights; ones otherwise)
    staleness: np.ndarray  # (S, B) step - created
    tslu: np.ndarray  # (S, B) steps since the sample's previous use, -1 on first use
    is_fresh: np.ndarray | None  # (S, B) group replay: fresh (True) or replayed
    fresh: RolloutBatch | None  # responses generated this step (None if none)
    generated: int  # responses generated this step, per seed


class _Pipeline:
    """Where each step's training batch comes from: the one stateful part of the loop.

    sync (Sec. 3): generate R, push, sample B. async (Sec. 2): workers holding weights
    synced every ``sync_interval`` steps generate B W / (T mu) responses per update
    (fractions carried over); the on-policy queue uses each response once.
    Group replay (RLOO) and stale-k (M2PO) follow their papers' orders.
    """

    def __init__(self, config: SimConfig, env, rng: PerSeedGenerator, buffer):
        self.config, self.env, self.rng, self.buffer = config, env, rng, buffer
        self.group_counter = 0
        self.worker_params = None
        self.worker_version = 0
        self.carry = 0.0

    def _generate(self, params: np.ndarray, num_groups: int, version) -> RolloutBatch:
        batch = generate(self.env, self.config, params, num_groups, version, self.group_counter, self.rng)
        self.group_counter += num_groups
        return batch

    @staticmethod
    def _fresh_only(batch: RolloutBatch, step: int) -> _StepData:
        shape = batch.prompt.shape
        return _StepData(batch, np.ones(shape), step - batch.created, np.full(shape, -1), None, batch, batch.size)

    def next_batch(self, step: int, params: np.ndarray) -> _StepData:
        config, G = self.config, self.config.group_size
        if config.buffer == "group-replay":
            return self._group_replay(step, params)
        if config.buffer == "stale-k":
            fresh = self._generate(params, config.rollouts_per_step // G, step)
            self.buffer.push(fresh, step)
            train = self.buffer.pop(step)  # generated k updates ago
            shape = train.prompt.shape
            return _StepData(train, np.ones(shape), step - train.created, np.full(shape, -1), None, fresh, fresh.size)
        if config.pipeline == "async":
            if step % config.sync_interval == 0:
                self.worker_params, self.worker_version = params.copy(), step  # weight sync
            if config.buffer == "on-policy":
                num_groups = math.ceil(config.batch_size / G)  # queue at W/T = mu: each rollout used once
            else:
                self.carry += config.batch_size * config.workers / (config.trainers * config.mu) / G
                num_groups = int(self.carry)
                self.carry -= num_groups
            gen_params, version = self.worker_params, self.worker_version
        else:
            num_groups, gen_params, version = config.rollouts_per_step // G, params, step
        fresh = self._generate(gen_params, num_groups, version) if num_groups else None
        if config.buffer == "on-policy":
            return self._fresh_only(fresh, step)
        if fresh is not None:
            self.buffer.add(fresh, step)
        if config.buffer == "prioritized":
            self.buffer.refresh(step)  # FreshPER Alg. 1 step 5: priorities decay with age
        sample = self.buffer.sample(config.batch_size, step, self.rng)
        return _StepData(sample.batch, sample.weight, sample.staleness, sample.time_since_last_use, None, fresh,
                         0 if fresh is None else fresh.size)

    def _group_replay(self, step: int, params: np.ndarray) -> _StepData:
        """RLOO order: sample fresh, sample replay, update, add fresh, evict (after_update adds)."""
        config = self.config
        _, fresh_needed = _group_replay_counts(config, self.buffer, step)
        replay = (self.buffer.sample_groups(config.batch_size - fresh_needed, step, self.rng)
                  if config.batch_size > fresh_needed else None)
        fresh = self._generate(params, fresh_needed, step)
        if replay is None:
            return self._fresh_only(fresh, step)
        train = RolloutBatch.concatenate([fresh, replay.batch])
        is_fresh = np.concatenate([np.ones(fresh.prompt.shape, bool), np.zeros(replay.batch.prompt.shape, bool)], axis=1)
        tslu = np.concatenate([np.full(fresh.prompt.shape, -1), replay.time_since_last_use], axis=1)
        return _StepData(train, np.ones(train.prompt.shape), step - train.created, tslu, is_fresh, fresh, fresh.size)

    def after_update(self, step: int, data: _StepData) -> None:
        if self.config.buffer == "group-replay":
            self.buffer.add(data.fresh, step)
        if hasattr(self.buffer, "observe_pass_rate") and data.fresh is not None:
            self.buffer.observe_pass_rate((data.fresh.reward == 1.0).mean(axis=1))


def run(config: SimConfig, progress=None, observer=None) -> RunResult:
    """Run one configuration for all its seeds.

    ``progress(step)`` is called after each step; ``observer(step, params, history, buffer, env)``
    too (calibration measures the noise profile through it).

    BLAS runs on one thread meanwhile. The engine's products are small ((S, d) @ (d, P A) is
    64 x 16 x 1024 for the bandit at 64 seeds) and OpenBLAS splits anything above ~2.6e5
    multiply-adds over every core: waking its threads costs more than the product (65 us on one
    thread, 260 us on two, milliseconds when another process holds a core). Each output element
    comes from the same kernel either way, so the results do not change, only the time.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _run(config, progress, observer)


def _run(config: SimConfig, progress, observer) -> RunResult:
    config = config.validated()
    if config.buffer == "exgrpo":
        from replay_theory.simulate.exgrpo_loop import run_exgrpo
        return run_exgrpo(config, progress, shaping=config.exgrpo_shaping,
                          question_selection=config.exgrpo_question_selection,
                          skip_retired=config.exgrpo_skip_retired)
    from replay_theory.simulate.buffers import make_buffer
    from replay_theory.simulate.envs import make_env
    from replay_theory.simulate.optim import OPTIMIZERS

    S = config.seeds
    rng = PerSeedGenerator(config.seed, S)
    env = make_env(config.env, **env_kwargs(config))
    params = env.init_params(S)  # (S, d)
    optimizer = OPTIMIZERS[config.optimizer](params, config.lr)
    rec = _Recorder(S, config.steps)
    history = [params.copy()]  # params before each update, for staleness-exact divergences
    eval_steps, evals = [], defaultdict(list)
    drift_lags = [lag for lag in (1, 2, 4, 8, 16, 32) if lag < config.steps] if config.measure_drift else []
    drift_sum = np.zeros((S, len(drift_lags)))
    drift_n = np.zeros(len(drift_lags))
    compute = np.zeros(S)
    k_training = k_inference = 0.0
    async_mode = config.pipeline == "async"
    pipeline = _Pipeline(config, env, rng, _make_buffer_for(config, env, make_buffer, S))
    buffer = pipeline.buffer

    for step in range(config.steps):
        data = pipeline.next_batch(step, params)
        train, weight, staleness, tslu, is_fresh = data.train, data.weight, data.staleness, data.tslu, data.is_fresh
        fresh, generated = data.fresh, data.generated
        fresh_reward = fresh.reward if fresh is not None else None

        logp_new = env.logp(params, train.prompt, train.tokens, train.mask)  # (S, B, L)
        out = compute_loss(config, train, logp_new, is_fresh)
        coef = out.grad_logp * weight[:, :, None]  # FreshPER IS weights (ones otherwise)
        grad = env.grad_logp_contract(params, train.prompt, train.tokens, train.mask, coef)  # (S, d)
        rec.record_batch(step, train, logp_new, staleness, tslu, out.metrics)
        for name, value in out.metrics.items():
            if name in _Recorder.TOKEN_STATS or name == "ess_frac":
                continue  # recorded by record_batch (ess_frac at sequence level)
            rec.put(name, step, value)
        rec.put("loss", step, out.loss)
        if fresh_reward is not None:
            n = fresh_reward.shape[1]  # means as sums / n: what .mean(axis=1) computes, without its overhead
            rec.put("reward", step, np.sum(fresh_reward, axis=1) / n)
            rec.put("accuracy_train", step, np.count_nonzero(fresh_reward == 1.0, axis=1) / n)

        trained = train.size
        k_training += trained
        k_inference += generated
        if async_mode:
            ratio = config.mu if config.buffer == "on-policy" else config.workers / config.trainers
            compute += trained * (1.0 + ratio)  # Eq. (1) / text before Eq. (2): C(1 + W/T), C = B
        else:
            compute += config.mu * generated + trained  # rollout-cost convention: c = mu R + B
        rec.put("compute", step, compute)

        params = optimizer.step(params, grad)
        history.append(params.copy())
        pipeline.after_update(step, data)

        if step % config.eval_every == 0 or step == config.steps - 1:
            quality = env.evaluate(params)
            eval_steps.append(step + 1)
            for name, value in quality.items():
                evals[name].append(value)
            entropy_batch = fresh if (fresh_reward is not None) else train
            ent = env.token_entropy(params, entropy_batch.prompt, entropy_batch.tokens, entropy_batch.mask)
            rec.put("entropy", step, np.where(entropy_batch.mask, ent, 0).sum(axis=(1, 2)) / entropy_batch.mask.sum(axis=(1, 2)))
            if config.buffer == "stale-k" and step >= config.stale_k:
                # exact divergences between the policy that scored the batch and the one that generated it
                exact = env.exact_divergences(history[-2], history[max(step - config.stale_k, 0)])
                for name, value in exact.items():
                    rec.put(f"exact_{name}", step, value)
                rec.put("exact_ess_frac", step, np.exp(-exact["d2"]))  # ESS/n = e^{-D_2}, FreshPER Eqs. (5), (24)
            for j, lag in enumerate(drift_lags):
                if len(history) > lag:
                    exact = env.exact_divergences(history[-1], history[-1 - lag])
                    drift_sum[:, j] += exact["kl_new_behav"]
                    drift_n[j] += 1
        if observer is not None:
            observer(step=step, params=params, history=history, buffer=buffer, env=env)
        if progress is not None:
            progress(step)

    counts = {"K_training": k_training, "K_inference": k_inference, **difficulty_gains(env, history[0], params)}
    if async_mode:
        ratio = config.mu if config.buffer == "on-policy" else config.workers / config.trainers
        counts["compute_ratio"] = (1 + ratio) / (1 + config.mu)  # Eq. (2)
        workers = config.mu * config.trainers if config.buffer == "on-policy" else config.workers
        counts["mu_estimate"] = (k_training / config.trainers) / (k_inference / workers)  # App. E
    else:
        on_policy = (config.mu + 1) * k_training  # same number of updates, each on fresh rollouts
        counts["compute_ratio"] = float(compute.mean() / on_policy)
    ess_by_age = {edge: rec.ess_age_sum[edge] / rec.ess_age_n[edge] for edge in sorted(rec.ess_age_n)}
    drift = {"lags": np.asarray(drift_lags), "kl_new_behav": drift_sum / np.maximum(drift_n, 1)}
    replay_counts = buffer.evicted_use_counts() if hasattr(buffer, "evicted_use_counts") else np.zeros(0)
    return RunResult(
        config=config,
        curves=rec.curves,
        eval_steps=np.asarray(eval_steps),
        evals={name: np.stack(values, axis=1) for name, values in evals.items()},
        staleness_counts=rec.staleness_counts,
        replay_counts=np.asarray(replay_counts),
        time_since_last_use_counts=rec.tslu_counts,
        ess_by_age=ess_by_age,
        drift=drift,
        counts=counts,
    )


def env_kwargs(config: SimConfig) -> dict:
    if config.env == "bandit":
        return {"num_prompts": config.num_prompts, "num_actions": config.num_actions,
                "instance_seed": config.instance_seed}
    return {"num_prompts": config.num_prompts, "vocab_size": config.vocab_size, "seq_len": config.seq_len,
            "instance_seed": config.instance_seed}


def _group_replay_counts(config: SimConfig, buffer, step: int) -> tuple[int, int]:
    """Fresh groups this step: round(B/(1+rho)), plus any replay shortfall filled with fresh groups."""
    from replay_theory.theory.group_replay import fresh_groups_per_step

    b_fresh = int(fresh_groups_per_step(config.batch_size, config.replay_ratio_groups))
    available = int(np.min(buffer.available(step)))
    replay = min(config.batch_size - b_fresh, available)
    return b_fresh, config.batch_size - replay


def _make_buffer_for(config: SimConfig, env, make_buffer, S: int):
    L = env.seq_len
    if config.buffer in ("fifo",):
        return make_buffer("fifo", num_seeds=S, capacity=config.capacity, seq_len=L, replacement=config.replacement)
    if config.buffer == "positive-bias":
        return make_buffer("positive-bias", num_seeds=S, capacity=config.capacity, seq_len=L, delta=config.delta)
    if config.buffer == "prioritized":
        return make_buffer("prioritized", num_seeds=S, capacity=config.capacity, seq_len=L, alpha=config.per_alpha,
                           beta=config.per_beta, tau=config.per_tau, base=config.per_base)
    if config.buffer == "group-replay":
        return make_buffer("group-replay", num_seeds=S, max_age=config.max_age, group_size=config.group_size,
                           seq_len=L)
    if config.buffer == "stale-k":
        return make_buffer("stale-k", num_seeds=S, k=config.stale_k)
    return None
