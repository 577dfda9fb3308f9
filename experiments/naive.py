"""A deliberately plain per-seed Python loop of one synchronous FIFO-buffer bandit run (not a user API).

What it is for: the REFERENCE against which the vectorised engine
(``simulate.engine.run``) is checked and timed. ``tests/unit/test_naive.py`` asserts
that both give the same final parameters and evaluation curves, and
``bench/bench_simulator.py`` prints the engine's speed-up over this loop.
Nothing else should call it: it is slow on purpose and covers one design only.

Scope: ``env="bandit"``, ``pipeline="sync"``, ``buffer="fifo"`` (with or
without replacement), ``loss="grpo"`` (token-mean aggregation, L = 1),
``advantage="grpo"`` (std-normalised, ddof = 1, eps = 1e-6) and the Adam or
SGD optimiser; any other config raises ValueError.

Written the obvious way: for each seed, for each step, Python loops over
prompts, responses and buffer slots, one small softmax per response over the
A actions, a Python list as the FIFO ring, the clip decided token by token, and
one Adam state per seed. It consumes exactly the random numbers the engine
consumes: seed i uses ``np.random.default_rng([config.seed, i])`` and, each
step, draws (1) the R/G prompt indices, (2) R uniforms for the inverse-CDF
action draws, (3) the buffer uniforms (B with replacement; one key per slot,
N of them, without), in that order.
"""

from __future__ import annotations

import math

import numpy as np

from ..simulate.config import SimConfig
from ..simulate.envs.bandit import BanditConfig, BanditEnv

__all__ = ["run_naive_fifo_bandit"]

_ADV_EPS = 1e-6  # advantages.group_advantage default
_ADAM = (0.9, 0.999, 1e-8)  # optim.Adam defaults: beta1, beta2, eps


def _check_scope(config: SimConfig) -> SimConfig:
    config = config.validated()
    wanted = {"env": "bandit", "pipeline": "sync", "buffer": "fifo", "loss": "grpo", "advantage": "grpo"}
    for name, value in wanted.items():
        if getattr(config, name) != value:
            raise ValueError(f"run_naive_fifo_bandit covers {name}={value!r} only, "
                             f"got {name}={getattr(config, name)!r}")
    return config


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log pi over the A actions of one prompt (1-D)."""
    shifted = logits - logits.max()
    return shifted - math.log(np.exp(shifted).sum())


def _policy(theta: np.ndarray, features: np.ndarray, offsets: np.ndarray, p: int) -> np.ndarray:
    """log pi(. | p) (A,) for one seed's parameters theta (d,)."""
    return _log_softmax(offsets[p] + features[p] @ theta)


def _draw_action(logp: np.ndarray, u: float) -> int:
    """Inverse CDF: the number of cumulative probabilities below u (clipped to A - 1)."""
    probs = np.exp(logp)
    total = 0.0
    count = 0
    for prob in probs:
        total += prob
        if total < u:
            count += 1
    return min(count, len(probs) - 1)


def _group_advantages(rewards: list[float]) -> list[float]:
    """(r - mean) / (std_ddof1 + eps) within one group; 0 for a constant group."""
    r = np.asarray(rewards)
    mean = r.mean()
    std = r.std(ddof=1)
    if std == 0.0:
        return [0.0] * len(rewards)
    return [float((x - mean) / (std + _ADV_EPS)) for x in r]


def run_naive_fifo_bandit(config: SimConfig) -> dict:
    """Final params (S, d) and evaluations (S, E) of ``engine.run(config)``, computed seed by seed in Python.

    Returns ``{"params": (S, d), "eval_steps": (E,), "reward": (S, E), "accuracy": (S, E)}``;
    ``reward`` is the exact expected reward averaged over prompts after each
    evaluated update (steps where ``step % eval_every == 0`` and the last one).
    """
    config = _check_scope(config)
    env = BanditEnv(BanditConfig(num_prompts=config.num_prompts, num_actions=config.num_actions,
                                 instance_seed=config.instance_seed))
    features, offsets, table, answer = env.features, env.offsets, env.reward_table, env.answer  # the instance
    P, A, d = features.shape
    G, N, B = config.group_size, config.capacity, config.batch_size
    num_groups = config.rollouts_per_step // G
    log_lo = math.log1p(-config.eps_low) if config.eps_low < 1.0 else -math.inf
    log_hi = math.log1p(config.eps_high) if math.isfinite(config.eps_high) else math.inf
    beta1, beta2, adam_eps = _ADAM

    eval_steps = [step + 1 for step in range(config.steps) if step % config.eval_every == 0 or step == config.steps - 1]
    final_params, rewards, accuracies = [], [], []
    for seed_index in range(config.seeds):
        gen = np.random.default_rng([config.seed, seed_index])
        theta = np.zeros(d)
        first, second = np.zeros(d), np.zeros(d)
        ring: list[tuple | None] = [None] * N  # (prompt, action, logp_behav, advantage) per slot
        ptr, filled = 0, 0
        seed_reward, seed_accuracy = [], []
        for step in range(config.steps):
            # --- generate R = num_groups x G fresh responses with the current policy
            prompts = gen.integers(0, P, size=num_groups)
            uniforms = gen.random(num_groups * G)
            fresh = []
            for k, p in enumerate(prompts):
                p = int(p)
                group = []
                for i in range(G):
                    logp = _policy(theta, features, offsets, p)
                    a = _draw_action(logp, float(uniforms[k * G + i]))
                    group.append((p, a, float(logp[a]), float(table[p, a])))
                advs = _group_advantages([item[3] for item in group])
                fresh.extend((p, a, lp, adv) for (p, a, lp, _), adv in zip(group, advs))
            # --- push into the FIFO ring (oldest slot overwritten)
            for item in fresh:
                ring[ptr] = item
                ptr = (ptr + 1) % N
                filled = min(filled + 1, N)
            # --- sample B slots uniformly
            if config.replacement:
                u = gen.random(B)
                chosen = [min(int(u[j] * filled), filled - 1) for j in range(B)]
            else:
                if B > filled:
                    raise ValueError(f"batch_size={B} exceeds the {filled} filled slots at step {step} "
                                     f"(sampling without replacement)")
                u = gen.random(N)  # one key per slot; the B filled slots with the smallest keys
                chosen = sorted(range(filled), key=lambda slot: u[slot])[:B]
            # --- GRPO clipped surrogate, token-mean over B one-token responses, and its gradient
            grad = np.zeros(d)
            for slot in chosen:
                p, a, logp_behav, adv = ring[slot]
                logp = _policy(theta, features, offsets, p)
                log_ratio = float(logp[a]) - logp_behav
                if adv > 0 and log_ratio > log_hi:
                    continue  # clipped high: no gradient
                if adv < 0 and log_ratio < log_lo:
                    continue  # clipped low: no gradient
                if adv == 0:
                    continue
                coef = -math.exp(log_ratio) * adv / B  # d loss / d logp
                probs = np.exp(logp)
                grad_logp = features[p, a] - probs @ features[p]  # phi(p, a) - E_pi[phi(p, .)]
                grad += coef * grad_logp
            # --- optimiser step
            if config.optimizer == "adam":
                count = step + 1
                first = beta1 * first + (1 - beta1) * grad
                second = beta2 * second + (1 - beta2) * grad**2
                first_hat = first / (1 - beta1**count)
                second_hat = second / (1 - beta2**count)
                theta = theta - config.lr * first_hat / (np.sqrt(second_hat) + adam_eps)
            else:
                theta = theta - config.lr * grad
            # --- exact evaluation, prompt by prompt
            if step % config.eval_every == 0 or step == config.steps - 1:
                total_reward = total_accuracy = 0.0
                for p in range(P):
                    probs = np.exp(_policy(theta, features, offsets, p))
                    total_reward += float(probs @ table[p])
                    total_accuracy += float(probs[answer[p]])
                seed_reward.append(total_reward / P)
                seed_accuracy.append(total_accuracy / P)
        final_params.append(theta)
        rewards.append(seed_reward)
        accuracies.append(seed_accuracy)
    return {
        "params": np.array(final_params),
        "eval_steps": np.array(eval_steps),
        "reward": np.array(rewards),
        "accuracy": np.array(accuracies),
    }
