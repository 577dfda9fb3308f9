"""Values of simulate/envs: vectorised vs naive loops, analytic vs finite-difference gradients,
sampling vs exact probabilities, exact DP divergences vs brute force and Monte Carlo, learning."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.special import log_softmax
from scipy.stats import chi2 as chi2_dist

from replay_theory.simulate.envs import BanditConfig, BanditEnv, TokenMDPConfig, TokenMDPEnv, make_env
from replay_theory.theory import divergences as D

BANDIT = BanditEnv(BanditConfig())
TOKEN = TokenMDPEnv(TokenMDPConfig())
ENVS = {"bandit": BANDIT, "token-mdp": TOKEN}


def _params(env, num_seeds: int, scale: float, seed: int) -> np.ndarray:
    """Distinct random theta per seed, (S, d); the token MDP's skill coefficient (in sharpness units) x 0.1."""
    theta = scale * np.random.default_rng(seed).standard_normal((num_seeds, env.param_dim))
    if isinstance(env, TokenMDPEnv):
        theta[:, -1] *= 0.1
    return theta


def _prompts(env, num_seeds: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(env.num_prompts, size=(num_seeds, n))


# --------------------------------------------------------------------------- #
# construction
# --------------------------------------------------------------------------- #
def test_make_env_names_and_error() -> None:
    assert isinstance(make_env("bandit", num_prompts=8), BanditEnv)
    env = make_env("token-mdp", seq_len=4, vocab_size=3)
    assert isinstance(env, TokenMDPEnv)
    assert (env.seq_len, env.vocab_size, env.param_dim) == (4, 3, 5 * 3 + 1)
    with pytest.raises(ValueError, match=r"env must be one of bandit, noisy-bandit, token-mdp, quadratic, got 'x'"):
        make_env("x")
    with pytest.raises(TypeError):
        make_env("bandit", no_such_field=1)


def test_protocol_attributes_and_init_params() -> None:
    assert (BANDIT.num_prompts, BANDIT.seq_len, BANDIT.param_dim) == (64, 1, 16)
    assert (TOKEN.num_prompts, TOKEN.seq_len, TOKEN.param_dim) == (32, 8, 31)
    for env in ENVS.values():
        theta0 = env.init_params(3)
        assert theta0.shape == (3, env.param_dim)
        assert np.all(theta0 == 0.0)


def test_bandit_reward_table_levels() -> None:
    R = BANDIT.reward_table
    assert R.shape == (64, 16)
    np.testing.assert_array_equal(np.sum(R == 1.0, axis=1), 1)
    np.testing.assert_array_equal(np.sum(R == 0.1, axis=1), 5)
    np.testing.assert_array_equal(np.argmax(R, axis=1), BANDIT.answer)
    prompts = np.array([[0, 1]])
    tokens = BANDIT.answer[prompts][..., None]
    np.testing.assert_array_equal(BANDIT.reward(prompts, tokens, np.ones_like(tokens, bool)), [[1.0, 1.0]])
    np.testing.assert_array_equal(BANDIT.reward(prompts, tokens, np.zeros_like(tokens, bool)), [[0.0, 0.0]])


def test_token_reward_hand_values() -> None:
    env = TokenMDPEnv(TokenMDPConfig(vocab_size=4, seq_len=3, num_prompts=2, tolerance=2))
    env.target = np.array([5, 2])  # hand-set targets
    prompts = np.array([[0, 0, 0, 0, 1, 1]])
    tokens = np.array([[[2, 3, 0], [3, 3, 0], [1, 1, 1], [0, 0, 1], [0, 2, 3], [1, 1, 3]]])  # sums 5 6 3 1 | 5 5
    mask = np.ones_like(tokens, bool)
    mask[0, 5, 2] = False  # padded: the sum is 2
    r = env.reward(prompts, tokens, mask)
    np.testing.assert_array_equal(r, [[1.0, 0.1, 0.1, 0.0, 0.0, 1.0]])


# --------------------------------------------------------------------------- #
# vectorised vs naive loops
# --------------------------------------------------------------------------- #
def _bandit_naive_logpol(env: BanditEnv, theta: np.ndarray, p: int) -> np.ndarray:
    logits = np.array([env.offsets[p, a] + env.features[p, a] @ theta for a in range(env.num_actions)])
    return logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()


def test_bandit_vectorised_matches_naive_loop() -> None:
    env, S, n = BANDIT, 3, 7
    params = _params(env, S, 0.7, 1)
    prompts = _prompts(env, S, n, 2)
    tokens, logp, mask = env.sample(params, prompts, np.random.default_rng(3))
    u = np.random.default_rng(3).random((S, n))  # the same uniforms, drawn the same way
    coef = np.random.default_rng(4).standard_normal((S, n))
    lp_vec = env.logp(params, prompts, tokens, mask)
    g_vec = env.grad_logp_contract(params, prompts, tokens, mask, coef)
    for s in range(S):
        g = np.zeros(env.param_dim)
        for i in range(n):
            p = prompts[s, i]
            lpol = _bandit_naive_logpol(env, params[s], p)
            cdf = np.cumsum(np.exp(lpol))
            a = min(int(np.sum(cdf < u[s, i])), env.num_actions - 1)
            assert tokens[s, i, 0] == a
            np.testing.assert_allclose(lp_vec[s, i, 0], lpol[a], rtol=1e-10)
            np.testing.assert_allclose(logp[s, i, 0], lpol[a], rtol=1e-10)
            pi = np.exp(lpol)
            g += coef[s, i] * (env.features[p, a] - sum(pi[b] * env.features[p, b] for b in range(env.num_actions)))
        np.testing.assert_allclose(g_vec[s], g, rtol=1e-10, atol=1e-12)


def _token_naive_logpol(env: TokenMDPEnv, theta: np.ndarray, p: int, t: int, s: int) -> np.ndarray:
    """log pi(. | p, t, s) from explicit d-dim features phi(state, v) = [f (x) e_v, q(v)]; also the phi (V, d)."""
    V = env.vocab_size
    f = env.state_features(np.array(p), np.array(t), np.array(s))  # (K,)
    x = np.clip((env.target[p] - s) / ((env.seq_len - t) * (V - 1)), -0.5, 1.5)
    np.testing.assert_allclose(f, [1.0, x, t / env.seq_len, x * t / env.seq_len, *env.prompt_embed[p]], rtol=1e-14)
    logits = np.empty(V)
    phi = np.empty((V, env.param_dim))
    for v in range(V):
        q = -(((V - 1) * x - v) ** 2)
        phi[v] = np.concatenate([np.kron(f, np.eye(V)[v]), [q]])  # (d,)
        logits[v] = env.sharpness[p] * q + env.prompt_bias[p, v] + phi[v] @ theta
    return log_softmax(logits), phi


def test_token_vectorised_matches_naive_loop() -> None:
    env, S, n, L = TOKEN, 3, 5, TOKEN.seq_len
    V = env.vocab_size
    params = _params(env, S, 0.5, 5)
    prompts = _prompts(env, S, n, 6)
    tokens, logp, mask = env.sample(params, prompts, np.random.default_rng(7))
    assert tokens.shape == logp.shape == mask.shape == (S, n, L) and mask.all()
    u = np.random.default_rng(7).random((S, n, L))
    coef = np.random.default_rng(8).standard_normal((S, n, L))
    lp_vec = env.logp(params, prompts, tokens, mask)
    g_vec = env.grad_logp_contract(params, prompts, tokens, mask, coef)
    h_vec = env.token_entropy(params, prompts, tokens, mask)
    for s in range(S):
        g = np.zeros(env.param_dim)
        for i in range(n):
            p, partial = prompts[s, i], 0
            for t in range(L):
                lpol, phi = _token_naive_logpol(env, params[s], p, t, partial)
                cdf = np.cumsum(np.exp(lpol))
                v = min(int(np.sum(cdf < u[s, i, t])), V - 1)
                assert tokens[s, i, t] == v
                np.testing.assert_allclose([lp_vec[s, i, t], logp[s, i, t]], lpol[v], rtol=1e-10)
                np.testing.assert_allclose(h_vec[s, i, t], -np.sum(np.exp(lpol) * lpol), rtol=1e-10)
                pi = np.exp(lpol)
                g += coef[s, i, t] * (phi[v] - sum(pi[w] * phi[w] for w in range(V)))
                partial += v
        np.testing.assert_allclose(g_vec[s], g, rtol=1e-10, atol=1e-12)


def test_token_sequence_coef_equals_broadcast_token_coef() -> None:
    env, S, n = TOKEN, 2, 4
    params = _params(env, S, 0.3, 9)
    prompts = _prompts(env, S, n, 10)
    tokens, _, mask = env.sample(params, prompts, np.random.default_rng(11))
    c = np.random.default_rng(12).standard_normal((S, n))
    np.testing.assert_allclose(
        env.grad_logp_contract(params, prompts, tokens, mask, c),
        env.grad_logp_contract(params, prompts, tokens, mask, np.repeat(c[..., None], env.seq_len, -1)),
        rtol=1e-12,
    )


def test_token_mask_padding_contributes_nothing() -> None:
    env, S, n, L = TOKEN, 2, 3, TOKEN.seq_len
    params = _params(env, S, 0.4, 13)
    prompts = _prompts(env, S, n, 14)
    tokens, logp, mask = env.sample(params, prompts, np.random.default_rng(15))
    pad = mask.copy()
    pad[:, :, 5:] = False
    garbage = np.where(pad, tokens, -7)  # padding may hold anything
    lp = env.logp(params, prompts, garbage, pad)
    np.testing.assert_allclose(lp[..., :5], logp[..., :5], rtol=1e-12)  # prefix states unchanged
    assert np.all(lp[..., 5:] == 0.0)
    assert np.all(env.token_entropy(params, prompts, garbage, pad)[..., 5:] == 0.0)
    coef = np.random.default_rng(16).standard_normal((S, n, L))
    g_pad = env.grad_logp_contract(params, prompts, garbage, pad, coef)
    g_zero = env.grad_logp_contract(params, prompts, tokens, mask, np.where(pad, coef, 0.0))
    np.testing.assert_allclose(g_pad, g_zero, rtol=1e-12, atol=1e-14)
    # reward ignores padded tokens
    np.testing.assert_array_equal(
        env.reward(prompts, garbage, pad),
        env.reward(prompts, np.where(pad, tokens, 0), np.ones_like(pad)),
    )


def test_token_position_chunks_match_single_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from replay_theory.simulate.envs import token_mdp

    env, S, n = TOKEN, 2, 5
    params = _params(env, S, 0.5, 40)
    prompts = _prompts(env, S, n, 41)
    tokens, _, mask = env.sample(params, prompts, np.random.default_rng(42))
    mask[1, 2, 4:] = False
    coef = np.random.default_rng(43).standard_normal((S, n, env.seq_len))
    whole = (env.logp(params, prompts, tokens, mask), env.token_entropy(params, prompts, tokens, mask),
             env.grad_logp_contract(params, prompts, tokens, mask, coef))
    monkeypatch.setattr(token_mdp, "CHUNK_ELEMENTS", 3 * S * n * env.vocab_size)  # chunks of 3 positions
    assert len(env._position_chunks(tokens.shape)) == 3
    chunked = (env.logp(params, prompts, tokens, mask), env.token_entropy(params, prompts, tokens, mask),
               env.grad_logp_contract(params, prompts, tokens, mask, coef))
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------- #
# analytic gradient vs finite differences
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", list(ENVS))
def test_gradient_matches_finite_differences(name: str) -> None:
    env = ENVS[name]
    S, n = 3, 6
    params = _params(env, S, 0.5, 17)
    prompts = _prompts(env, S, n, 18)
    tokens, _, mask = env.sample(params, prompts, np.random.default_rng(19))
    if name == "token-mdp":
        mask[0, 0, -3:] = False  # some padding too
    coef = np.random.default_rng(20).standard_normal(tokens.shape)
    grad = env.grad_logp_contract(params, prompts, tokens, mask, coef)

    def objective(theta: np.ndarray) -> np.ndarray:  # (S,): seeds are independent
        return np.sum(coef * env.logp(theta, prompts, tokens, mask), axis=(1, 2))

    h = 1e-5
    fd = np.empty_like(params)
    for j in range(env.param_dim):
        e = np.zeros(env.param_dim)
        e[j] = h
        fd[:, j] = (objective(params + e) - objective(params - e)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------- #
# sampling vs exact probabilities
# --------------------------------------------------------------------------- #
def test_bandit_sampling_frequencies_match_policy() -> None:
    env, N = BANDIT, 20_000
    params = _params(env, 2, 0.8, 21)
    prompts = np.tile(np.array([[3], [40]]), (1, N))  # (2, N): one prompt per seed
    tokens, logp, _ = env.sample(params, prompts, np.random.default_rng(22))
    lpol = env.log_policy(params)  # (S, P, A)
    for s, p in ((0, 3), (1, 40)):
        expected = N * np.exp(lpol[s, p])
        counts = np.bincount(tokens[s, :, 0], minlength=env.num_actions)
        keep = expected > 5
        stat = np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep])
        assert stat < chi2_dist.ppf(0.999, keep.sum() - 1)
        np.testing.assert_allclose(logp[s, :, 0], lpol[s, p, tokens[s, :, 0]], rtol=1e-12)


def test_token_monte_carlo_reward_matches_exact_evaluate() -> None:
    env, N = TOKEN, 20_000
    params = _params(env, 2, 0.3, 23)
    prompts = _prompts(env, 2, N, 24)
    tokens, _, mask = env.sample(params, prompts, np.random.default_rng(25))
    r = env.reward(prompts, tokens, mask)  # (S, N)
    ev = env.evaluate(params)
    for key, x in (("reward", r), ("accuracy", (r == 1.0).astype(float))):
        se = x.std(axis=1) / np.sqrt(N)
        assert np.all(np.abs(x.mean(axis=1) - ev[key]) < 4 * se), key


def test_token_exact_dp_matches_brute_force_enumeration() -> None:
    """Tiny instance: every sequence enumerated; evaluate and divergences equal the full-distribution values."""
    env = TokenMDPEnv(TokenMDPConfig(vocab_size=3, seq_len=4, num_prompts=3, tolerance=1, instance_seed=4))
    S, P = 2, env.num_prompts
    seqs = np.array(list(itertools.product(range(3), repeat=4)))  # (81, 4)
    m = len(seqs)
    prompts = np.repeat(np.arange(P), m)[None].repeat(S, 0)  # (S, P m)
    tokens = np.tile(seqs, (P, 1))[None].repeat(S, 0)  # (S, P m, 4)
    mask = np.ones_like(tokens, bool)
    pb = _params(env, S, 0.6, 26)
    pn = pb + _params(env, S, 0.4, 27)
    lb = env.logp(pb, prompts, tokens, mask).sum(-1).reshape(S, P, m)  # (S, P, 81) sequence log-probs
    ln = env.logp(pn, prompts, tokens, mask).sum(-1).reshape(S, P, m)
    np.testing.assert_allclose(np.exp(lb).sum(-1), 1.0, rtol=1e-12)
    reward = env.reward(prompts, tokens, mask).reshape(S, P, m)
    ev = env.evaluate(pn)
    np.testing.assert_allclose(ev["reward"], np.sum(np.exp(ln) * reward, -1).mean(-1), rtol=1e-10)
    np.testing.assert_allclose(ev["accuracy"], np.sum(np.exp(ln) * (reward == 1.0), -1).mean(-1), rtol=1e-10)
    div = env.exact_divergences(pn, pb)
    chi2 = np.asarray(D.chi2_exact(ln, lb)).mean(-1)
    np.testing.assert_allclose(div["chi2"], chi2, rtol=1e-10)
    np.testing.assert_allclose(div["d2"], np.log1p(chi2), rtol=1e-10)
    np.testing.assert_allclose(div["kl_new_behav"], np.asarray(D.kl_exact(ln, lb)).mean(-1), rtol=1e-10)
    np.testing.assert_allclose(div["kl_behav_new"], np.asarray(D.kl_exact(lb, ln)).mean(-1), rtol=1e-10)
    np.testing.assert_allclose(div["m2"], np.asarray(D.m2_exact(ln, lb)).mean(-1), rtol=1e-10)


def test_token_state_dp_methods_match_brute_force_enumeration() -> None:
    """The calibration's DP pieces on a tiny instance with every sequence enumerated: the state distributions,
    E[terminal(s_L) | s_t], the reward table over sums, and E[sum_t c(t, s_t, token_t) grad log pi(token_t)]."""
    env = TokenMDPEnv(TokenMDPConfig(vocab_size=3, seq_len=4, num_prompts=3, tolerance=1, instance_seed=4))
    S, P, L, V = 2, env.num_prompts, 4, 3
    seqs = np.array(list(itertools.product(range(V), repeat=L)))  # (81, 4)
    m = len(seqs)
    prompts = np.repeat(np.arange(P), m)[None].repeat(S, 0)  # (S, P m)
    tokens = np.tile(seqs, (P, 1))[None].repeat(S, 0)  # (S, P m, 4)
    mask = np.ones_like(tokens, bool)
    params = _params(env, S, 0.6, 40)
    prob = np.exp(env.logp(params, prompts, tokens, mask).sum(-1)).reshape(S, P, m)  # (S, P, 81)
    partial = np.cumsum(seqs, axis=1) - seqs  # (81, 4) s_t before token t
    final = seqs.sum(1)  # (81,)
    # the verifier as a table over final sums equals the reward of every sequence
    table = env.final_sum_reward()
    np.testing.assert_array_equal(table[prompts[0], np.tile(final, P)], env.reward(prompts, tokens, mask)[0])
    assert table.shape == (P, L * (V - 1) + 1) and set(np.unique(table)) == {0.0, 0.1, 1.0}
    # forward: P(s_t = s | p), t = 0 .. L (the last is the final-sum distribution)
    states = env.state_distributions(params)
    assert [x.shape for x in states] == [(S, P, t * (V - 1) + 1) for t in range(L + 1)]
    for t in range(L + 1):
        sums = final if t == L else partial[:, t]
        want = np.stack([prob[..., sums == s].sum(-1) for s in range(t * (V - 1) + 1)], axis=-1)
        np.testing.assert_allclose(states[t], want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(states[L], env.final_sum_distribution(params), rtol=1e-12)
    # backward: E[terminal | s_t = s] for an arbitrary terminal function of (prompt, final sum)
    terminal = np.random.default_rng(41).standard_normal((S, P, L * (V - 1) + 1))
    values = env.backward_values(params, terminal)
    np.testing.assert_array_equal(values[L], terminal)
    end = terminal[:, :, final]  # (S, P, 81) terminal of each sequence
    for t in range(L):
        for s in range(t * (V - 1) + 1):
            at = partial[:, t] == s
            want = (prob[..., at] * end[..., at]).sum(-1) / prob[..., at].sum(-1)
            np.testing.assert_allclose(values[t][..., s], want, rtol=1e-10)
    # contraction: weight = P(state) pi(v | state) c / P gives E_p E_pi[sum_t c grad log pi(token_t)]
    coef = [np.random.default_rng(42 + t).standard_normal((S, P, t * (V - 1) + 1, V)) for t in range(L)]
    got = sum(env.state_token_contract(params, t, states[t][..., None] * np.exp(env.token_log_policy(params, t))
                                       * coef[t] / P) for t in range(L))
    c_seq = np.stack([coef[t][:, prompts[0], partial[np.arange(P * m) % m, t], tokens[0, :, t]]
                      for t in range(L)], axis=-1)  # (S, P m, L) the coefficient of each sampled token
    want = env.grad_logp_contract(params, prompts, tokens, mask, c_seq * prob.reshape(S, P * m, 1) / P)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match=r"t must lie in \[0, 4\), got 4"):
        env.token_log_policy(params, 4)
    with pytest.raises(ValueError, match=r"terminal must have shape \(2, 3, 9\), got \(2, 3, 8\)"):
        env.backward_values(params, terminal[..., :-1])


# --------------------------------------------------------------------------- #
# exact divergences
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", list(ENVS))
def test_divergences_vanish_for_equal_policies(name: str) -> None:
    env = ENVS[name]
    params = _params(env, 3, 0.5, 28)
    div = env.exact_divergences(params, params.copy())
    assert set(div) == {"chi2", "d2", "kl_new_behav", "kl_behav_new", "m2"}
    for key, value in div.items():
        assert value.shape == (3,)
        np.testing.assert_allclose(value, 0.0, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", list(ENVS))
def test_divergences_match_monte_carlo_and_identities(name: str) -> None:
    env, S, N = ENVS[name], 2, 20_000
    pb = _params(env, S, 0.5, 29)
    pn = pb + _params(env, S, 0.3 if name == "bandit" else 0.15, 30)
    div = env.exact_divergences(pn, pb)
    np.testing.assert_allclose(div["chi2"], np.expm1(div["d2"]), rtol=1e-12)
    assert np.all(div["kl_new_behav"] <= div["d2"])
    assert np.all(div["kl_behav_new"] > 0) and np.all(div["chi2"] > 0)

    prompts = _prompts(env, S, N, 31)  # uniform prompts: the joint distribution
    tokens, logp_b, mask = env.sample(pb, prompts, np.random.default_rng(32))
    lr = D.sequence_log_ratio(D.token_log_ratio(env.logp(pn, prompts, tokens, mask), logp_b, mask), mask)  # (S, N)
    r = np.exp(lr)
    checks = {
        "chi2": (D.chi2_estimate(lr), r**2),
        "kl_behav_new": (D.kl_k1(lr), -lr),
        "m2": (D.m2(lr), lr**2),
        "kl_new_behav": (np.mean(r * lr, axis=1), r * lr),
    }
    for key, (estimate, terms) in checks.items():
        se = terms.std(axis=1) / np.sqrt(N)
        assert np.all(np.abs(estimate - div[key]) < 5 * se), (key, estimate, div[key], se)


# --------------------------------------------------------------------------- #
# difficulty spread
# --------------------------------------------------------------------------- #
def test_bandit_difficulty_spread() -> None:
    q = BANDIT.difficulty()
    assert q.shape == (64,)
    np.testing.assert_allclose(q, BANDIT.target_success, rtol=1e-12)
    assert np.any(q > 0.75) and np.any((q >= 0.25) & (q <= 0.75)) and np.any(q < 0.25)
    assert 0.02 <= q.min() and q.max() <= 0.95
    np.testing.assert_allclose(BANDIT.evaluate(BANDIT.init_params(1))["accuracy"], q.mean(), rtol=1e-12)


def test_token_difficulty_spread() -> None:
    for env in (TOKEN, TokenMDPEnv(TokenMDPConfig(seq_len=32))):
        acc = env.evaluate(env.init_params(1))["accuracy"][0]
        assert 0.05 <= acc <= 0.6
        q = env.difficulty()
        assert np.any(q < 0.25) and np.any((q >= 0.25) & (q <= 0.75))
        np.testing.assert_allclose(q.mean(), acc, rtol=1e-12)


# --------------------------------------------------------------------------- #
# learning and determinism
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name, lr", [("bandit", 1.0), ("token-mdp", 0.03)])
def test_reinforce_raises_reward(name: str, lr: float) -> None:
    env, S, n = ENVS[name], 3, 128
    rng = np.random.default_rng(33)
    params = env.init_params(S)
    before = env.evaluate(params)["reward"]
    for _ in range(100):
        prompts = rng.integers(env.num_prompts, size=(S, n))
        tokens, _, mask = env.sample(params, prompts, rng)
        reward = env.reward(prompts, tokens, mask)  # (S, n)
        advantage = reward - reward.mean(axis=1, keepdims=True)
        params = params + lr * env.grad_logp_contract(params, prompts, tokens, mask, advantage / n)
    after = env.evaluate(params)["reward"]
    assert np.all(after > before + 0.05), (before, after)


@pytest.mark.parametrize("name", list(ENVS))
def test_same_rng_seed_gives_identical_samples(name: str) -> None:
    env = ENVS[name]
    params = _params(env, 2, 0.5, 34)
    prompts = _prompts(env, 2, 50, 35)
    a = env.sample(params, prompts, np.random.default_rng(36))
    b = env.sample(params, prompts, np.random.default_rng(36))
    c = env.sample(params, prompts, np.random.default_rng(37))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


class _StackedGenerator:
    """One generator per seed, draws stacked along axis 0 (like core/rng.py's PerSeedGenerator)."""

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [np.random.default_rng(s) for s in seeds]

    def random(self, size: tuple[int, ...]) -> np.ndarray:
        assert size[0] == len(self.generators)
        return np.stack([g.random(size[1:]) for g in self.generators])


@pytest.mark.parametrize("name", list(ENVS))
def test_per_seed_streams_give_per_seed_samples(name: str) -> None:
    """Seed s of a batched call equals a one-seed call on seed s's own stream (draws are seed-first)."""
    env = ENVS[name]
    params = _params(env, 3, 0.5, 44)
    prompts = _prompts(env, 3, 20, 45)
    batched = env.sample(params, prompts, _StackedGenerator([7, 8, 9]))
    for s, seed in enumerate([7, 8, 9]):
        single = env.sample(params[s:s + 1], prompts[s:s + 1], np.random.default_rng(seed))
        np.testing.assert_array_equal(batched[0][s:s + 1], single[0])  # tokens
        np.testing.assert_allclose(batched[1][s:s + 1], single[1], rtol=1e-12)  # log-probs
        np.testing.assert_array_equal(batched[2][s:s + 1], single[2])  # mask


def test_instance_is_fixed_by_instance_seed() -> None:
    a, b = TokenMDPEnv(TokenMDPConfig()), TokenMDPEnv(TokenMDPConfig(instance_seed=1))
    np.testing.assert_array_equal(a.target, TOKEN.target)
    assert not np.array_equal(a.target, b.target)
    np.testing.assert_array_equal(BanditEnv(BanditConfig()).offsets, BANDIT.offsets)


def test_bandit_row_probabilities_and_gradient_match_the_full_table() -> None:
    """The draws and the gradient exponentiate only the rows they need: the same numbers as exp(log_policy)."""
    env = BanditEnv(BanditConfig(num_prompts=12, num_actions=5, feature_dim=4, num_well_formed=2))
    rng = np.random.default_rng(3)
    params = 0.5 * rng.standard_normal((2, 4))
    prompts = rng.integers(0, 12, size=(2, 9))
    tokens = rng.integers(0, 5, size=(2, 9, 1))
    coef = rng.standard_normal((2, 9))
    grad = env.grad_logp_contract(params, prompts, tokens, None, coef)  # before any full pi table exists
    pi = np.exp(env.log_policy(params))  # (S, P, A)
    phi = env.features  # (P, A, d)
    mean_phi = np.einsum("snA,snAd->snd", pi[np.arange(2)[:, None], prompts], phi[prompts])  # E_pi[phi | p_n]
    want = np.einsum("sn,snd->sd", coef, phi[prompts, tokens[..., 0]] - mean_phi)
    np.testing.assert_allclose(grad, want, rtol=1e-12, atol=1e-12)
    cells = np.array([0, 5, 23])  # flat (seed, prompt) rows
    rows = env._row_probs(env.log_policy(params), cells)
    np.testing.assert_array_equal(rows, pi.reshape(-1, 5)[cells])
    full = env.evaluate(params)  # makes the full table; the rows then come from it
    np.testing.assert_array_equal(env._row_probs(env.log_policy(params), cells), rows)
    np.testing.assert_allclose(full["accuracy"], pi[:, np.arange(12), env.answer].mean(axis=1), rtol=1e-15)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 16, 17, 64, 127, 128, 129, 300])
def test_bandit_column_sums_are_numpy_s_row_sums_bit_for_bit(n: int) -> None:
    # the bandit's log-softmax sums its exponentials over a transposed copy: the same additions, in numpy's order
    from replay_theory.simulate.envs.bandit import _column_sums

    x = np.exp(3.0 * np.random.default_rng(n).standard_normal((200, n)))
    np.testing.assert_array_equal(_column_sums(np.ascontiguousarray(x.T)), x.sum(axis=-1))


def test_bandit_rows_made_when_asked_for_are_the_whole_table_s_bit_for_bit() -> None:
    # a step makes only the log-policy rows it draws from or differentiates; each is the whole table's row, and the
    # draws, log-probs, gradient and entropies are those of an environment that made the whole table first
    config = BanditConfig(num_prompts=16, num_actions=8, feature_dim=5)
    params = 0.7 * np.random.default_rng(3).standard_normal((6, 5))
    whole = BanditEnv(config)
    table = whole.log_policy(params).copy()
    lazy = BanditEnv(config)
    cells = np.array([3, 17, 17, 40, 95])
    part = lazy._log_policy_rows(params, cells)
    np.testing.assert_array_equal(part.reshape(-1, 8)[cells], table.reshape(-1, 8)[cells])
    assert lazy._rows_todo is not None and int(lazy._rows_todo[1].sum()) == 6 * 16 - 4
    prompts = np.repeat(np.random.default_rng(4).integers(0, 16, size=(6, 3)), 4, axis=1)  # groups of 4
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for got, want in zip(lazy.sample(params, prompts, rng_a), whole.sample(params, prompts, rng_b)):
        np.testing.assert_array_equal(got, want)
    tokens = np.random.default_rng(6).integers(0, 8, size=(6, 12, 1))
    mask = np.ones(tokens.shape, bool)
    coef = np.random.default_rng(7).standard_normal((6, 12))
    np.testing.assert_array_equal(lazy.logp(params, prompts, tokens, mask), whole.logp(params, prompts, tokens, mask))
    np.testing.assert_array_equal(lazy.grad_logp_contract(params, prompts, tokens, mask, coef),
                                  whole.grad_logp_contract(params, prompts, tokens, mask, coef))
    np.testing.assert_array_equal(lazy.token_entropy(params, prompts, tokens, mask),
                                  whole.token_entropy(params, prompts, tokens, mask))
    np.testing.assert_array_equal(lazy.log_policy(params), table)  # the rest made when the whole table is asked for
    assert lazy._rows_todo is None


def test_bandit_rejects_prompt_indices_out_of_range() -> None:
    env = BanditEnv(BanditConfig(num_prompts=4))
    params = env.init_params(2)
    for bad in (-1, 4):
        prompts = np.zeros((2, 3), dtype=np.int64)
        prompts[1, 2] = bad
        with pytest.raises(ValueError, match=r"prompt indices must lie in \[0, 4\)"):
            env.logp(params, prompts, np.zeros((2, 3, 1), dtype=np.int64))
    np.testing.assert_array_equal(env.logp(params, np.full((2, 3), 3, dtype=np.int32), np.zeros((2, 3, 1), int)),
                                  env.logp(params, np.full((2, 3), 3), np.zeros((2, 3, 1), int)))


@pytest.mark.parametrize("runs", [[4, 8, 4, 4], [3, 5, 2, 6], [16], [1, 1, 2, 12]])
def test_bandit_sample_is_the_inverse_cdf_of_each_response_whatever_its_runs_of_prompts(runs) -> None:
    # responses to one prompt side by side share one CDF (a run): runs of any lengths, in any order
    env, S = BANDIT, 2
    params = _params(env, S, 0.7, 1)
    prompt_of_run = np.random.default_rng(5).permutation(env.num_prompts)[:len(runs)]
    prompts = np.tile(np.repeat(prompt_of_run, runs), (S, 1))
    prompts[1] = prompts[1][::-1]  # another order of the runs in seed 1
    tokens, logp, _ = env.sample(params, prompts, np.random.default_rng(3))
    u = np.random.default_rng(3).random(prompts.shape)
    for s in range(S):
        for i in range(prompts.shape[1]):
            lpol = _bandit_naive_logpol(env, params[s], prompts[s, i])
            a = min(int(np.sum(np.cumsum(np.exp(lpol)) < u[s, i])), env.num_actions - 1)
            assert tokens[s, i, 0] == a
            np.testing.assert_allclose(logp[s, i, 0], lpol[a], rtol=1e-10)


@pytest.mark.parametrize("runs", [[8, 16, 8, 8], [4, 8, 12], [3, 5, 2, 6], [16], [8] * 5])
def test_bandit_sample_is_sample_categorical_of_the_table_bit_for_bit(runs) -> None:
    # the draws build one CDF column per block of gcd(run lengths) responses (per run when the gcd is 1): the same
    # tokens and log-probs as the inverse CDF of each response's row of the whole table, number for number
    from replay_theory.simulate.envs.bandit import sample_categorical

    env, S = BanditEnv(BanditConfig()), 3
    params = _params(env, S, 0.7, 2)
    prompt_of_run = np.random.default_rng(6).integers(0, 4, size=len(runs))  # few prompts: equal neighbours too
    prompts = np.tile(np.repeat(prompt_of_run, runs), (S, 1))
    prompts[1] = prompts[1][::-1]
    tokens, logp, mask = env.sample(params, prompts, np.random.default_rng(4))
    u = np.random.default_rng(4).random(prompts.shape)
    table = BanditEnv(BanditConfig()).log_policy(params)  # (S, P, A), made whole
    rows = table[np.arange(S)[:, None], prompts]  # (S, n, A)
    want = sample_categorical(rows, u)  # (S, n)
    np.testing.assert_array_equal(tokens[..., 0], want)
    np.testing.assert_array_equal(logp[..., 0], np.take_along_axis(rows, want[..., None], axis=-1)[..., 0])
    assert mask.all()


def test_bandit_gradient_of_an_all_real_batch_is_token_coef_s() -> None:
    # every action real: the gradient reads coef and the actions as token_coef and np.where give them; a coef that
    # only broadcasts against the batch, or a wrong shape, goes the token_coef way (its values, its errors)
    from replay_theory.simulate.envs.bandit import _coef_values, token_coef

    env, S, n = BANDIT, 3, 10
    params = _params(env, S, 0.5, 8)
    prompts = _prompts(env, S, n, 9)
    tokens = np.random.default_rng(10).integers(0, env.num_actions, size=(S, n, 1))
    mask = np.ones((S, n, 1), bool)
    coef = np.random.default_rng(11).standard_normal((S, n))
    edge = coef.copy()
    edge[0, :4] = (-0.0, np.inf, 0.0, np.nan)
    for values in (edge, edge[..., None]):
        np.testing.assert_array_equal(_coef_values(values, mask), token_coef(values, mask))  # NaN where NaN
        assert np.signbit(_coef_values(values, mask)[0, 0, 0])
    grad = env.grad_logp_contract(params, prompts, tokens, mask, coef)
    pi = np.exp(env.log_policy(params))  # (S, P, A)
    phi = env.features  # (P, A, d)
    mean_phi = np.einsum("snA,snAd->snd", pi[np.arange(S)[:, None], prompts], phi[prompts])  # E_pi[phi | p_n]
    want = np.einsum("sn,snd->sd", coef, phi[prompts, tokens[..., 0]] - mean_phi)
    np.testing.assert_allclose(grad, want, rtol=1e-12, atol=1e-12)
    partial = mask.copy()
    partial[1, 4] = False  # a padded action: the np.where way, whose coef and action there are 0
    np.testing.assert_array_equal(
        env.grad_logp_contract(params, prompts, np.where(partial, tokens, 0), mask, np.where(partial[..., 0], coef, 0)),
        env.grad_logp_contract(params, prompts, tokens, partial, coef))
    with pytest.raises(ValueError, match=r"coef must have shape \(S, n\) or \(S, n, L\)"):
        env.grad_logp_contract(params, prompts, tokens, mask, coef[0])
    with pytest.raises(ValueError):  # (2, n, 1) does not broadcast against (3, n, 1): numpy's error, as before
        env.grad_logp_contract(params, prompts, tokens, mask, coef[:2, :, None])
    one = env.grad_logp_contract(params, prompts, tokens, mask, coef[:1, :, None])  # broadcasts over the seeds
    np.testing.assert_array_equal(one, env.grad_logp_contract(params, prompts, tokens, mask,
                                                              np.repeat(coef[:1], S, axis=0)))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 16, 17, 64, 127, 128, 129, 300])
def test_row_sums_are_numpy_s_last_axis_sums_bit_for_bit(n: int) -> None:
    # the bandit's entropies sum their terms over a transposed copy: numpy's values, signed zeros, inf and NaN included
    from replay_theory.theory.moments import row_sums

    rng = np.random.default_rng(n)
    x = rng.standard_normal((40, n)) * 10.0 ** rng.integers(-8, 8, size=(40, n))
    x[rng.random((40, n)) < 0.1] = -0.0
    x[0] = -0.0  # all -0.0: numpy's sum is 0.0
    if n >= 2:
        x[1, 0], x[2, -1], x[3, :2] = np.nan, np.inf, (np.inf, -np.inf)
        x[4, :] = (-0.0, 0.0) * (n // 2) + (-0.0,) * (n % 2)  # mixed signed zeros: 0.0
    with np.errstate(invalid="ignore"):
        got, want = row_sums(x), x.sum(axis=-1)
    assert got.shape == want.shape == (40,)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    real = ~np.isnan(want)
    np.testing.assert_array_equal(got[real].view(np.uint64), want[real].view(np.uint64))  # the bits: -0.0 is not 0.0
    assert not np.signbit(got[0])


def test_run_starts_are_the_first_index_of_each_run() -> None:
    from replay_theory.simulate.envs.bandit import _run_starts

    for cells, want in (([], []), ([5], [0]), ([3, 3, 3], [0]), ([1, 2, 2, 1, 1, 7], [0, 1, 3, 5]),
                        ([0, 1, 2, 3], [0, 1, 2, 3])):
        got = _run_starts(np.asarray(cells, dtype=np.int64))
        assert got.dtype == np.intp
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("runs", [[8] * 6, [8, 16, 8], [3, 5, 2, 6], [1] * 10])
def test_bandit_token_entropy_once_per_run_is_each_response_s_bit_for_bit(runs) -> None:
    # responses to one prompt side by side share one entropy: the sum of the row's terms as np.sum gives it per item
    env, S = BanditEnv(BanditConfig()), 3
    params = _params(env, S, 0.9, 12)
    prompts = np.tile(np.repeat(np.random.default_rng(13).integers(0, 5, size=len(runs)), runs), (S, 1))
    prompts[2] = prompts[2][::-1]
    n = prompts.shape[1]
    mask = np.ones((S, n, 1), bool)
    mask[1, 2] = False
    for whole in (False, True):
        fresh = BanditEnv(BanditConfig())
        if whole:
            fresh.evaluate(params)  # the pi table made: the rows come from it
        got = fresh.token_entropy(params, prompts, np.zeros((S, n, 1), np.int64), mask)
        table = env.log_policy(params)
        rows = table[np.arange(S)[:, None], prompts]  # (S, n, A)
        want = -np.sum(np.exp(rows) * rows, axis=-1, keepdims=True)
        np.testing.assert_array_equal(got.view(np.uint64), np.where(mask, want, 0.0).view(np.uint64))
    empty = env.token_entropy(params, np.zeros((S, 0), np.int64), np.zeros((S, 0, 1), np.int64))
    assert empty.shape == (S, 0, 1)
