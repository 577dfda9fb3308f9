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


def _generate(gen: np.random.Generator, theta: np.ndarray, env: BanditEnv, num_groups: int, G: int) -> list[tuple]:
    """R = num_groups x G fresh (prompt, action, logp_behav, advantage) with the current policy: the prompts, then
    the uniforms for the inverse-CDF action draws."""
    P = env.features.shape[0]
    prompts = gen.integers(0, P, size=num_groups)
    uniforms = gen.random(num_groups * G)
    fresh = []
    for k, p in enumerate(prompts):
        p = int(p)
        group = []
        for i in range(G):
            logp = _policy(theta, env.features, env.offsets, p)
            a = _draw_action(logp, float(uniforms[k * G + i]))
            group.append((p, a, float(logp[a]), float(env.reward_table[p, a])))
        advs = _group_advantages([item[3] for item in group])
        fresh.extend((p, a, lp, adv) for (p, a, lp, _), adv in zip(group, advs))
    return fresh


def _push(ring: list[tuple], capacity: int, ptr: int, fresh: list[tuple]) -> int:
    """Push into the FIFO ring of ``capacity`` slots (appended until full, then the oldest slot overwritten); the new
    write pointer. The filled slots are ``ring``'s first ``len(ring)``."""
    for item in fresh:
        if len(ring) < capacity:
            ring.append(item)
        else:
            ring[ptr] = item
        ptr = (ptr + 1) % capacity
    return ptr


def _sample_slots(gen: np.random.Generator, config: SimConfig, filled: int, step: int) -> list[int]:
    """B slots uniformly: B uniforms with replacement; one key per slot (N of them) and the smallest B without."""
    B = config.batch_size
    if config.replacement:
        u = gen.random(B)
        return [min(int(u[j] * filled), filled - 1) for j in range(B)]
    if B > filled:
        raise ValueError(f"batch_size={B} exceeds the {filled} filled slots at step {step} "
                         f"(sampling without replacement)")
    u = gen.random(config.capacity)  # one key per slot; the B filled slots with the smallest keys
    return sorted(range(filled), key=lambda slot: u[slot])[:B]


def _grpo_gradient(theta: np.ndarray, env: BanditEnv, samples: list[tuple], log_lo: float, log_hi: float,
                   B: int) -> np.ndarray:
    """The GRPO clipped surrogate's gradient, token-mean over B one-token responses, sample by sample."""
    grad = np.zeros_like(theta)
    for p, a, logp_behav, adv in samples:
        logp = _policy(theta, env.features, env.offsets, p)
        log_ratio = float(logp[a]) - logp_behav
        if adv > 0 and log_ratio > log_hi:
            continue  # clipped high: no gradient
        if adv < 0 and log_ratio < log_lo:
            continue  # clipped low: no gradient
        if adv == 0:
            continue
        coef = -math.exp(log_ratio) * adv / B  # d loss / d logp
        probs = np.exp(logp)
        grad_logp = env.features[p, a] - probs @ env.features[p]  # phi(p, a) - E_pi[phi(p, .)]
        grad += coef * grad_logp
    return grad


def _adam_step(theta: np.ndarray, grad: np.ndarray, first: np.ndarray, second: np.ndarray, count: int,
               lr: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One bias-corrected Adam step (optim.Adam's defaults); the new (theta, first moment, second moment)."""
    beta1, beta2, adam_eps = _ADAM
    first = beta1 * first + (1 - beta1) * grad
    second = beta2 * second + (1 - beta2) * grad**2
    first_hat = first / (1 - beta1**count)
    second_hat = second / (1 - beta2**count)
    return theta - lr * first_hat / (np.sqrt(second_hat) + adam_eps), first, second


def _evaluate(theta: np.ndarray, env: BanditEnv) -> tuple[float, float]:
    """Exact expected reward and accuracy averaged over prompts, prompt by prompt."""
    P = env.features.shape[0]
    total_reward = total_accuracy = 0.0
    for p in range(P):
        probs = np.exp(_policy(theta, env.features, env.offsets, p))
        total_reward += float(probs @ env.reward_table[p])
        total_accuracy += float(probs[env.answer[p]])
    return total_reward / P, total_accuracy / P


def _run_seed(config: SimConfig, env: BanditEnv, seed_index: int) -> tuple[np.ndarray, list[float], list[float]]:
    """One seed's run: its final theta and its evaluated rewards and accuracies."""
    gen = np.random.default_rng([config.seed, seed_index])
    d = env.features.shape[2]
    G = config.group_size
    num_groups = config.rollouts_per_step // G
    log_lo = math.log1p(-config.eps_low) if config.eps_low < 1.0 else -math.inf
    log_hi = math.log1p(config.eps_high) if math.isfinite(config.eps_high) else math.inf
    theta = np.zeros(d)
    first, second = np.zeros(d), np.zeros(d)
    ring: list[tuple] = []  # (prompt, action, logp_behav, advantage) per filled slot, up to config.capacity
    ptr = 0
    seed_reward, seed_accuracy = [], []
    for step in range(config.steps):
        ptr = _push(ring, config.capacity, ptr, _generate(gen, theta, env, num_groups, G))
        chosen = _sample_slots(gen, config, len(ring), step)
        grad = _grpo_gradient(theta, env, [ring[slot] for slot in chosen], log_lo, log_hi, config.batch_size)
        if config.optimizer == "adam":
            theta, first, second = _adam_step(theta, grad, first, second, step + 1, config.lr)
        else:
            theta = theta - config.lr * grad
        if step % config.eval_every == 0 or step == config.steps - 1:
            reward, accuracy = _evaluate(theta, env)
            seed_reward.append(reward)
            seed_accuracy.append(accuracy)
    return theta, seed_reward, seed_accuracy


def run_naive_fifo_bandit(config: SimConfig) -> dict:
    """Final params (S, d) and evaluations (S, E) of ``engine.run(config)``, computed seed by seed in Python.

    Returns ``{"params": (S, d), "eval_steps": (E,), "reward": (S, E), "accuracy": (S, E)}``;
    ``reward`` is the exact expected reward averaged over prompts after each
    evaluated update (steps where ``step % eval_every == 0`` and the last one).
    """
    config = _check_scope(config)
    env = BanditEnv(BanditConfig(num_prompts=config.num_prompts, num_actions=config.num_actions,
                                 instance_seed=config.instance_seed))
    eval_steps = [step + 1 for step in range(config.steps) if step % config.eval_every == 0 or step == config.steps - 1]
    final_params, rewards, accuracies = [], [], []
    for seed_index in range(config.seeds):
        theta, seed_reward, seed_accuracy = _run_seed(config, env, seed_index)
        final_params.append(theta)
        rewards.append(seed_reward)
        accuracies.append(seed_accuracy)
    return {
        "params": np.array(final_params),
        "eval_steps": np.array(eval_steps),
        "reward": np.array(rewards),
        "accuracy": np.array(accuracies),
    }
