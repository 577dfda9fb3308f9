"""kappa on the simulator (issue 30): the exact Jacobian and the exact kappa against a hand computation on a tiny
bandit, the central differences' step, and Adam's preconditioner."""

import numpy as np
import pytest

from replay_theory.core.pipeline import EnvBackend, generate
from replay_theory.core.rng import PerSeedGenerator
from replay_theory.simulate.calibrate import (
    central_difference,
    curvature_parts,
    exact_loss_gradient,
    field_hvp,
    field_jacobian,
    group_units,
    minibatch_gradient,
    per_sample_grads,
    take_rows,
)
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.engine import env_kwargs, make_env
from replay_theory.simulate.optim import SGD, Adam

# REINFORCE with the group-mean baseline on a tiny bandit: on-policy its exact gradient field is -(1 - 1/G) grad J
# (E[(r_i - mean_j r_j) s_i] = (1 - 1/G) E[r s]), J = (1/P) sum_p sum_a pi(a | p) r(p, a), so its Jacobian is
# -(1 - 1/G) times the Hessian of J, which a softmax-linear policy has in closed form.
TINY = SimConfig(num_prompts=3, num_actions=8, group_size=4, batch_size=8, rollouts_per_step=8, loss="reinforce",
                 advantage="group-mean", optimizer="sgd", seeds=2, buffer="on-policy")


def _env_and_theta(config=TINY):
    env = make_env(config.env, **env_kwargs(config))
    theta = np.random.default_rng(3).normal(0, 0.7, (config.seeds, env.param_dim))
    return env, theta


def _hand_grad_and_hessian(env, theta):
    """grad J and Hess J of J(theta) = (1/P) sum_p sum_a pi_a r_a, pi = softmax(b + phi theta), per seed.

    grad J_p = sum_a pi_a r_a s_a, s_a = phi_a - phi_bar;  Hess J_p = sum_a pi_a r_a s_a s_a^T - J_p Cov_pi(phi)
    (d pi_a = pi_a s_a, d s_a = -Cov_pi(phi)).
    """
    phi, r = env.features, env.reward_table  # (P, A, d), (P, A)
    P = phi.shape[0]
    grads, hessians = [], []
    for t in theta:
        logits = env.offsets + phi @ t  # (P, A)
        pi = np.exp(logits - logits.max(axis=1, keepdims=True))
        pi /= pi.sum(axis=1, keepdims=True)
        s = phi - np.einsum("pa,pad->pd", pi, phi)[:, None, :]  # (P, A, d)
        cov = np.einsum("pa,pad,pae->pde", pi, s, s)
        j_p = (pi * r).sum(axis=1)  # (P,)
        grads.append(np.einsum("pa,pa,pad->d", pi, r, s) / P)
        hessians.append((np.einsum("pa,pa,pad,pae->de", pi, r, s, s) - np.einsum("p,pde->de", j_p, cov)) / P)
    return np.stack(grads), np.stack(hessians)


def test_exact_field_jacobian_is_the_hand_hessian_on_a_tiny_bandit():
    env, theta = _env_and_theta()
    grad_j, hess_j = _hand_grad_and_hessian(env, theta)
    factor = 1 - 1 / TINY.group_size
    np.testing.assert_allclose(exact_loss_gradient(env, TINY, theta), -factor * grad_j, rtol=1e-10, atol=1e-14)
    jac = field_jacobian(env, TINY, theta)  # (S, d, d) by central differences of the exact field
    np.testing.assert_allclose(jac, -factor * hess_j, rtol=0, atol=1e-8 * np.abs(hess_j).max())


def test_exact_kappa_parts_are_the_hand_computation():
    """(D c)^T J (D c) and c^T D c per unit, c = u - grad F, for Adam's D: the sums' ratio times eta is
    eta tr(D H D Sigma_hat) / tr(D Sigma_hat), with H the hand Hessian and Sigma_hat the units' covariance."""
    env, theta = _env_and_theta()
    S, d = theta.shape
    rng = PerSeedGenerator(11, S)
    fresh = generate(EnvBackend(env, rng), TINY, theta, 64, 1, 0, rng)
    units = group_units(per_sample_grads(env, TINY, theta, fresh), TINY.group_size)  # (S, 64, d)
    grad_f = exact_loss_gradient(env, TINY, theta)
    precond = np.random.default_rng(5).uniform(0.5, 2.0, (S, d))  # any positive diagonal D
    parts = curvature_parts(env, TINY, theta, precond, 3, 1, PerSeedGenerator(12, S), field=True, units=units,
                            grad_f=grad_f)
    _, hess_j = _hand_grad_and_hessian(env, theta)
    hessian = -(1 - 1 / TINY.group_size) * hess_j  # (S, d, d)
    eta = 0.3
    for s in range(S):
        c = units[s] - grad_f[s]  # (U, d)
        sigma = c.T @ c / len(c)  # the units' covariance about their exact mean
        D = np.diag(precond[s])
        hand = eta * np.trace(hessian[s] @ D @ sigma @ D) / np.trace(D @ sigma)
        got = eta * parts.exact_num[s].sum() / parts.exact_den[s].sum()
        assert got == pytest.approx(hand, rel=1e-7)
    assert set(parts.numerators) == {"field", "independent", "surrogate", "same"}
    assert parts.denominators.shape == (S, 3) and np.all(parts.denominators > 0)


def test_central_differences_do_not_depend_on_the_step():
    env, theta = _env_and_theta()
    v = np.random.default_rng(4).standard_normal(theta.shape)
    base = field_hvp(env, TINY, theta, v)
    for step in (1e-4, 1e-6):
        np.testing.assert_allclose(field_hvp(env, TINY, theta, v, step=step), base, rtol=1e-6,
                                   atol=1e-9 * np.abs(base).max())
    np.testing.assert_array_equal(field_hvp(env, TINY, theta, np.zeros_like(v)), 0.0)  # a zero vector: 0, not NaN


def test_minibatch_hessian_of_reinforce_lacks_the_score_term():
    """The fixed-sample Hessian of a loss without an importance ratio is E[-A grad^2 log pi]: it misses the field's
    E[A s s^T] term, so a minibatch HVP of REINFORCE is not the field's (the docstrings' bias statement)."""
    env, theta = _env_and_theta()
    rng = PerSeedGenerator(13, theta.shape[0])
    fresh = generate(EnvBackend(env, rng), TINY, theta, 4096, 1, 0, rng)
    batch = take_rows(fresh, theta.shape[0])
    v = np.random.default_rng(6).standard_normal(theta.shape)
    two = type(batch)(**{k: np.concatenate([getattr(batch, k)] * 2) for k in batch.__dataclass_fields__})
    mb = central_difference(lambda p: minibatch_gradient(env, TINY, p, two), theta, v)
    field = field_hvp(env, TINY, theta, v)
    assert np.all(np.abs(np.einsum("sd,sd->s", v, mb - field)) > 0.1 * np.abs(np.einsum("sd,sd->s", v, field)))


def test_adam_preconditioner_is_its_step_diagonal():
    params = np.zeros((2, 3))
    opt = Adam(params, lr=0.1)
    with pytest.raises(ValueError, match="no step"):
        opt.preconditioner()
    g = np.array([[1.0, -2.0, 0.5], [0.1, 0.0, 3.0]])
    new = opt.step(params, g)
    # after one step m_hat = g, v_hat = g^2: the step is lr g / (|g| + eps) = lr * D * m_hat
    np.testing.assert_allclose(params - new, 0.1 * opt.preconditioner() * g, rtol=1e-12)
    np.testing.assert_allclose(opt.preconditioner(), 1 / (np.abs(g) + 1e-8), rtol=1e-12)
    assert SGD(params, 0.1).preconditioner() is None


def test_reweighted_minibatch_hessian_is_the_fields_on_sequences():
    """Token MDP (three-token responses, mean baseline): the score-reweighted minibatch gradient's central difference
    averages to the exact field's Jacobian along w (within 3 standard errors over 20 minibatches of 4000); the
    surrogate's (per-token ratios, fixed samples) misses the cross-token score terms: 2.7x the field's here."""
    config = SimConfig(env="token-mdp", num_prompts=2, seq_len=3, vocab_size=3, group_size=4, batch_size=8,
                       rollouts_per_step=8, loss="no-trust-region", advantage="group-mean", optimizer="sgd", seeds=1,
                       buffer="on-policy")
    env = make_env(config.env, **env_kwargs(config))
    theta = np.random.default_rng(1).normal(0, 0.5, (1, env.param_dim))
    w = np.random.default_rng(2).standard_normal(theta.shape)
    field = float(w[0] @ field_hvp(env, config, theta, w)[0])
    rng = PerSeedGenerator(3, 1)
    rows = take_rows(generate(EnvBackend(env, rng), config, theta, 20000, 1, 0, rng), 20)  # 20 x 4000 responses
    both = type(rows)(**{k: np.concatenate([getattr(rows, k)] * 2) for k in rows.__dataclass_fields__})
    thetas, ws = np.repeat(theta, 20, axis=0), np.repeat(w, 20, axis=0)
    for reweighted in (True, False):
        hw = central_difference(lambda p, r=reweighted: minibatch_gradient(env, config, p, both, reweighted=r),
                                thetas, ws)
        values = np.einsum("rd,rd->r", ws, hw)
        se = values.std(ddof=1) / np.sqrt(values.size)
        if reweighted:
            assert abs(values.mean() - field) < 3 * se
        else:
            assert abs(values.mean() - field) > 10 * se and values.mean() > 2 * field
