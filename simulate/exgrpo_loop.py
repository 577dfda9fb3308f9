"""ExGRPO's mixed-policy training loop on the simulator, vectorised over seeds.

Paper: shared/papers/exgrpo-experience-replay.txt, Algorithm 1 and Sec. 4
(notes: shared/notes/exgrpo.md). ``engine.run`` dispatches here for
``buffer="exgrpo"``; this module reuses the engine's ``make_advantage``,
``compute_loss``, ``_Recorder`` and ``RunResult``.

| code name            | paper symbol      | meaning                                                          |
|----------------------|-------------------|------------------------------------------------------------------|
| ``batch_size``       | B                 | QUESTIONS per step (not responses: each question has G of them)  |
| ``group_size``       | K (G)             | responses per question                                           |
| ``exgrpo_rho``       | rho               | experience share: |B_exp| = min(floor(rho B), |E|)               |
| ``exgrpo_beta``      | beta              | policy shaping f(w) = w / (w + beta) of the replayed o*         |
| ``n_exp``            | |B_exp|           | experience questions this step, per seed (S,)                    |
| ``replayed``         | o*                | the stored trajectory in a mixed group (last response of it)     |
| ``retired``          | S (retired set)   | questions solved by a whole group; skipped by fresh sampling     |

One step t (per seed; all seeds in one numpy pass):

1. ``replay_active`` = the buffer's delayed-start switch at the start of the step.
   |B_exp| = min(floor(rho B), |E|) once active, else 0 (``ExGRPOBuffer.split``).
2. Experience questions q* (Alg. 2 bucket sampling, or uniform over the questions
   in E for the ``question_selection="uniform"`` ablation) and their o* = the
   stored successful trajectory chosen by ``exgrpo_selection`` ("lowest" =
   lowest mean token entropy under the CURRENT policy).
3. Fresh questions for the other B - |B_exp| slots: uniform with replacement over
   the seed's NON-retired prompts (over all prompts if every prompt is retired;
   ``skip_retired=False``: over all prompts always, i.e. retirement only empties E).
4. G fresh responses for fresh questions, G - 1 fresh responses + o* for experience
   questions; advantages ``engine.make_advantage(config.advantage)`` over each
   (mixed) group of G (the paper uses Dr. GRPO = ``advantage="group-mean"``).
5. Loss ``losses.exgrpo_shaped`` through ``engine.compute_loss``: o* gets
   f(w*) A with w* = pi_theta / pi_past (its STORED behaviour log-probs), every
   fresh response the GRPO clip. ``shaping=False`` (the "w/o policy shaping"
   ablation) gives o* the GRPO clip against its stored log-probs as well.
6. Optimiser step; then the delayed-start switch sees this batch's pass@1 (fresh
   responses only) and ``ExGRPOBuffer.add`` records EVERY group of the step, mixed
   ones included (Alg. 1 lines 22-29 sum successes over all K members of the mixed
   group; o* is always correct and, an exact duplicate, is not stored twice).
   So the step that crosses the threshold is already collected and replay can
   start at the next step; a question whose G - 1 fresh responses all succeed is
   retired.

Compute (rollout-cost units, as the sync pipeline): mu * fresh responses generated
(B G - |B_exp|, per seed) + responses trained (B G). For simplicity the simulator
draws a response at the o* slot too and discards it; it is not counted.

Curves beyond the engine's: ``exp_frac`` (|B_exp| / B), ``replay_active`` (0/1 per
seed; its mean over seeds is the fraction of active seeds), ``n_experience`` (|E|),
``retired`` (retired questions), ``shaping_weight_mean`` etc. from the loss.
``counts``: the engine's K_training / K_inference / compute_ratio, ``shaping``,
``uniform_questions`` and ``skip_retired`` (1.0 / 0.0), ``retired`` (final, mean over seeds),
``exp_questions`` (experience questions over the run, mean over seeds), and
``gain_hard`` / ``gain_medium`` / ``gain_easy``: final per-prompt accuracy minus the
warm start's (``env.prompt_accuracy``), averaged over the prompts of each warm-start
difficulty bucket (``env.difficulty()``: hard <= 0.25 < medium <= 0.75 < easy, the
paper's (0, 25%], (25%, 75%], (75%, 100%]) and over seeds; ``n_hard`` / ... count
the prompts per bucket. NaN where the environment has no ``prompt_accuracy``.

On the bandit (one-token responses) every stored trajectory of a question has the
same entropy pi(. | q), so "lowest" breaks the tie at the first stored slot; the
trajectory-selection ablation is only meaningful on the token MDP.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from replay_theory.simulate.buffers import ExGRPOBuffer, Sample
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.engine import RunResult, _Recorder, compute_loss, DIFFICULTY_EDGES, difficulty_gains as _difficulty_gains, env_kwargs, make_advantage
from replay_theory.simulate.rng import PerSeedGenerator
from replay_theory.simulate.rollouts import RolloutBatch

__all__ = ["ExGRPOStep", "UniformQuestionBuffer", "run_exgrpo", "DIFFICULTY_EDGES"]



@dataclass
class ExGRPOStep:
    """What one step trained on, handed to ``run_exgrpo(..., on_step=...)`` (tests, diagnostics).

    ``batch``: the B G responses (S, B G, ...), question j's group at items j G .. j G + G - 1;
    ``replayed`` (S, B G): o* positions; ``exp_questions`` (S, B) with ``exp_valid``:
    question j of seed s came from the buffer; ``n_exp`` (S,); ``retired_before`` (S, P):
    the retired set when the questions were sampled; ``logp_new`` (S, B G, L) and ``loss``
    (a ``losses.LossOutput``) under ``params`` (S, d), the policy before the update;
    ``staleness`` (S, B G).
    """

    step: int
    batch: RolloutBatch
    replayed: np.ndarray
    exp_questions: np.ndarray
    exp_valid: np.ndarray
    n_exp: np.ndarray
    retired_before: np.ndarray
    params: np.ndarray
    logp_new: np.ndarray
    loss: object
    staleness: np.ndarray


class UniformQuestionBuffer(ExGRPOBuffer):
    """ExGRPOBuffer whose question draw is uniform over the questions in E ("w/o question selection").

    Bucket k gets probability |U_k| / |E| (so one draw is uniform over E); the counts
    then go through the same multinomial-and-clip sampler, within a bucket without
    replacement, so a batch is a uniform draw up to the clip-and-redraw of Alg. 2.
    """

    def bucket_probs(self) -> np.ndarray:
        sizes = self.bucket_sizes().astype(float)  # (S, K-1)
        total = sizes.sum(axis=1, keepdims=True)
        return np.divide(sizes, total, out=np.zeros_like(sizes), where=total > 0)


def _make_exgrpo_buffer(config: SimConfig, env, S: int, question_selection: str) -> ExGRPOBuffer:
    cls = {"buckets": ExGRPOBuffer, "uniform": UniformQuestionBuffer}[question_selection]
    return cls(S, env.num_prompts, config.group_size, env.seq_len, rho=config.exgrpo_rho,
               units=config.exgrpo_units, selection=config.exgrpo_selection,
               start_pass_rate=config.exgrpo_start_pass_rate)


def _fresh_questions(retired: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Uniform draws (S, m) with replacement over each seed's non-retired prompts (all if none left)."""
    available = ~retired  # (S, P)
    available[~available.any(axis=1)] = True
    order = np.argsort(~available, axis=1, kind="stable")  # (S, P): available prompts first
    count = available.sum(axis=1, keepdims=True)  # (S, 1)
    pos = np.minimum((u * count).astype(np.int64), count - 1)  # (S, m)
    return np.take_along_axis(order, pos, axis=1)


def _mean_entropy_fn(env, params: np.ndarray) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """entropy_fn for ExGRPOBuffer.sample: mean token entropy over real tokens under ``params`` (S, m)."""

    def entropy(prompts: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        h = env.token_entropy(params, prompts, tokens, mask)  # (S, m, L)
        return np.where(mask, h, 0.0).sum(axis=-1) / np.maximum(mask.sum(axis=-1), 1)

    return entropy


def _masked_mean(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Mean of x (S, n) over keep (S, n), per seed."""
    return np.where(keep, x, 0.0).sum(axis=1) / np.maximum(keep.sum(axis=1), 1)


class _Evaluation:
    """The engine's periodic exact evaluation: env.evaluate, policy entropy, exact drift KL by lag."""

    def __init__(self, config: SimConfig, S: int):
        self.config = config
        self.lags = [lag for lag in (1, 2, 4, 8, 16, 32) if lag < config.steps] if config.measure_drift else []
        self.drift_sum = np.zeros((S, len(self.lags)))
        self.drift_n = np.zeros(len(self.lags))
        self.steps: list[int] = []
        self.values: dict[str, list[np.ndarray]] = defaultdict(list)

    def maybe(self, step: int, env, params: np.ndarray, history: list[np.ndarray], rec: _Recorder,
              batch: RolloutBatch, keep: np.ndarray) -> None:
        """At eval steps: evaluate ``params``; entropy over the ``keep`` (S, n) responses of ``batch``."""
        if not (step % self.config.eval_every == 0 or step == self.config.steps - 1):
            return
        for name, value in env.evaluate(params).items():
            self.values[name].append(value)
        self.steps.append(step + 1)
        m = batch.mask & keep[:, :, None]
        ent = env.token_entropy(params, batch.prompt, batch.tokens, batch.mask)
        rec.put("entropy", step, np.where(m, ent, 0).sum(axis=(1, 2)) / np.maximum(m.sum(axis=(1, 2)), 1))
        for j, lag in enumerate(self.lags):
            if len(history) > lag:
                self.drift_sum[:, j] += env.exact_divergences(history[-1], history[-1 - lag])["kl_new_behav"]
                self.drift_n[j] += 1

    def result(self, config: SimConfig, rec: _Recorder, replay_counts: np.ndarray, counts: dict) -> RunResult:
        return RunResult(
            config=config,
            curves=rec.curves,
            eval_steps=np.asarray(self.steps),
            evals={name: np.stack(values, axis=1) for name, values in self.values.items()},
            staleness_counts=rec.staleness_counts,
            replay_counts=np.asarray(replay_counts),
            time_since_last_use_counts=rec.tslu_counts,
            ess_by_age={edge: rec.ess_age_sum[edge] / rec.ess_age_n[edge] for edge in sorted(rec.ess_age_n)},
            drift={"lags": np.asarray(self.lags), "kl_new_behav": self.drift_sum / np.maximum(self.drift_n, 1)},
            counts=counts,
        )


def run_exgrpo(config: SimConfig, progress=None, *, shaping: bool = True,
               question_selection: Literal["buckets", "uniform"] = "buckets", skip_retired: bool = True,
               on_step: Callable[[ExGRPOStep], None] | None = None) -> RunResult:
    """Run ExGRPO (Alg. 1) for all seeds of ``config``; ``progress(step)`` after each step.

    ``config.batch_size`` is B QUESTIONS per step (B G responses). ``shaping=False``:
    the "w/o policy shaping" ablation (o* trained with the GRPO clip, ratio against its
    stored log-probs). ``question_selection="uniform"``: the "w/o question selection"
    ablation (uniform over the questions in E instead of Gaussian bucket weights).
    ``skip_retired=False``: fresh questions uniform over ALL prompts (retired ones only
    leave the experience buffer), to separate retirement from replay.
    ``on_step`` receives an ``ExGRPOStep`` before each update.
    """
    from replay_theory.simulate.envs import make_env
    from replay_theory.simulate.optim import OPTIMIZERS

    config = config.validated()
    if config.pipeline != "sync":
        raise ValueError(f"ExGRPO runs the synchronous pipeline, got pipeline {config.pipeline!r}")
    if question_selection not in ("buckets", "uniform"):
        raise ValueError(f"question_selection must be 'buckets' or 'uniform', got {question_selection!r}")
    S, G, B = config.seeds, config.group_size, config.batch_size
    rng = PerSeedGenerator(config.seed, S)
    env = make_env(config.env, **env_kwargs(config))
    params = env.init_params(S)  # (S, d)
    params0 = params.copy()
    optimizer = OPTIMIZERS[config.optimizer](params, config.lr)
    buffer = _make_exgrpo_buffer(config, env, S, question_selection)
    rec = _Recorder(S, config.steps)
    evaluation = _Evaluation(config, S)
    history = [params.copy()]
    n = B * G
    last = np.zeros((B, G), bool)
    last[:, -1] = True
    o_star_slot = last.ravel()  # (n,) the last response of each question's group
    compute = np.zeros(S)
    k_training = k_inference = 0.0
    exp_questions = np.zeros(S)

    for step in range(config.steps):
        active = buffer.active.copy()
        retired_before = buffer.retired.copy()
        n_exp, _ = buffer.split(B)  # (S,): min(floor(rho B), |E|) once active, else 0
        n_exp = np.asarray(n_exp, dtype=np.int64).reshape(S)
        m = int(n_exp.max())
        if m:
            sample: Sample | None = buffer.sample(m, step, rng, entropy_fn=_mean_entropy_fn(env, params))
            exp_valid = sample.valid & (np.arange(m) < n_exp[:, None])  # (S, m)
            assert np.array_equal(exp_valid, sample.valid), "buffer.sample and split disagree on |B_exp|"
            exp_valid = np.pad(exp_valid, ((0, 0), (0, B - m)))  # (S, B)
            exp_q = np.pad(sample.batch.prompt, ((0, 0), (0, B - m)))  # (S, B)
        else:
            sample = None
            exp_valid = np.zeros((S, B), bool)
            exp_q = np.zeros((S, B), np.int64)

        not_offered = buffer.retired if skip_retired else np.zeros_like(buffer.retired)
        questions = np.where(exp_valid, exp_q, _fresh_questions(not_offered, rng.random((S, B))))  # (S, B)
        prompts = np.repeat(questions, G, axis=1)  # (S, n)
        tokens, logp_behav, mask = env.sample(params, prompts, rng)  # (S, n, L)
        created = np.full((S, n), step, np.int64)
        tslu = np.full((S, n), -1, np.int64)
        replayed = np.repeat(exp_valid, G, axis=1) & o_star_slot  # (S, n) o* positions
        if sample is not None:
            r, j = np.nonzero(exp_valid)  # question j (< m) of the batch is sample item j
            it = np.flatnonzero(o_star_slot)[j]  # item index of its group's o* slot
            stored = sample.batch
            tokens[r, it], mask[r, it] = stored.tokens[r, j], stored.mask[r, j]
            logp_behav[r, it] = stored.logp_behav[r, j]  # pi_past: o*'s stored behaviour log-probs
            created[r, it] = stored.created[r, j]
            tslu[r, it] = sample.time_since_last_use[r, j]
        reward = env.reward(prompts, tokens, mask)  # (S, n)
        advantage = make_advantage(config, reward.reshape(S, B, G)).reshape(S, n)  # over the (mixed) group
        group = np.broadcast_to(step * B + np.repeat(np.arange(B), G), (S, n)).copy()
        train = RolloutBatch(prompt=prompts, tokens=tokens, mask=mask, logp_behav=logp_behav, reward=reward,
                             advantage=advantage, created=created, group=group)
        fresh = ~replayed

        logp_new = env.logp(params, prompts, tokens, mask)  # (S, n, L)
        out = compute_loss(config, train, logp_new, is_fresh=fresh if shaping else np.ones_like(fresh))
        grad = env.grad_logp_contract(params, prompts, tokens, mask, out.grad_logp)  # (S, d)
        staleness = step - created
        if on_step is not None:
            on_step(ExGRPOStep(step=step, batch=train, replayed=replayed, exp_questions=exp_q, exp_valid=exp_valid,
                               n_exp=n_exp, retired_before=retired_before, params=params, logp_new=logp_new,
                               loss=out, staleness=staleness))
        rec.record_batch(step, train, logp_new, staleness, tslu, out.metrics)
        for name, value in out.metrics.items():
            if name not in _Recorder.TOKEN_STATS and name != "ess_frac":  # recorded by record_batch
                rec.put(name, step, value)
        rec.put("loss", step, out.loss)
        pass_at_1 = _masked_mean(reward == 1.0, fresh)  # (S,) batch pass@1 of the fresh responses
        rec.put("reward", step, _masked_mean(reward, fresh))
        rec.put("accuracy_train", step, pass_at_1)
        rec.put("exp_frac", step, n_exp / B)
        rec.put("replay_active", step, active.astype(float))

        generated = n - n_exp  # (S,) fresh responses actually used
        k_training += n
        k_inference += float(generated.mean())
        exp_questions += n_exp
        compute += config.mu * generated + n  # rollout-cost convention: c = mu R + B
        rec.put("compute", step, compute)

        params = optimizer.step(params, grad)
        history.append(params.copy())
        buffer.observe_pass_rate(pass_at_1)  # delayed start (Sec. 4.2), one way
        buffer.add(train, step)  # Alg. 1 lines 22-29 (collects only in active seeds); retires all-correct
        rec.put("n_experience", step, buffer.n_experience())
        rec.put("retired", step, buffer.retired.sum(axis=1))
        evaluation.maybe(step, env, params, history, rec, train, fresh)
        if progress is not None:
            progress(step)

    counts = {"K_training": k_training, "K_inference": k_inference,
              "compute_ratio": float(compute.mean() / ((config.mu + 1) * k_training)),
              "shaping": 1.0 if shaping else 0.0,
              "uniform_questions": 1.0 if question_selection == "uniform" else 0.0,
              "skip_retired": 1.0 if skip_retired else 0.0,
              "retired": float(buffer.retired.sum(axis=1).mean()),
              "exp_questions": float(exp_questions.mean()),
              **_difficulty_gains(env, params0, params)}
    return evaluation.result(config, rec, buffer.evicted_use_counts(), counts)
