"""ExGRPO's mixed-policy batches (core/designs.py ``exgrpo_step``) through the engine: values, not just shapes."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from replay_theory.core import losses
from replay_theory.core.designs import fresh_questions, make_advantage
from replay_theory.simulate import engine
from replay_theory.simulate.config import SimConfig
from replay_theory.simulate.envs import make_env

RHO, B, G = 0.5, 8, 8  # B questions of G responses: batch_size = B G responses
THRESHOLD = 0.72  # well above the warm-start pass@1 (~0.44; 8-question batches are noisy): starts at steps 7-26

CONFIG = SimConfig(env="bandit", buffer="exgrpo", loss="exgrpo", seeds=6, steps=60, batch_size=B * G, group_size=G,
                   lr=0.05, exgrpo_rho=RHO, exgrpo_start_pass_rate=THRESHOLD, eval_every=5, measure_drift=False)


def run_exgrpo(config: SimConfig, on_step=None, **ablations):
    """engine.run with ExGRPO's per-step arrays unpacked for the assertions below."""
    config = config.with_updates(**{f"exgrpo_{k}": v for k, v in ablations.items()})

    def unpack(view: engine.StepView) -> None:
        d = view.data
        on_step(SimpleNamespace(step=view.step, batch=d.train, replayed=d.curves["_replayed"],
                                exp_questions=d.curves["_exp_questions"], exp_valid=d.curves["_exp_valid"],
                                n_exp=d.curves["_n_exp"], retired_before=d.curves["_retired_before"],
                                params=view.params, logp_new=view.logp_new, loss=view.loss, staleness=d.staleness))

    return engine.run(config, on_step=None if on_step is None else unpack)


@pytest.fixture(scope="module")
def traced():
    steps = []
    result = run_exgrpo(CONFIG, on_step=steps.append)
    return result, steps


def test_deterministic_for_a_fixed_seed(traced):
    result, _ = traced
    again = run_exgrpo(CONFIG)
    for name, curve in result.curves.items():
        np.testing.assert_array_equal(curve, again.curves[name], err_msg=name)
    np.testing.assert_array_equal(result.evals["accuracy"], again.evals["accuracy"])
    assert result.counts == again.counts
    other = run_exgrpo(CONFIG.with_updates(seed=1))
    assert not np.array_equal(other.curves["reward"], result.curves["reward"])


def test_replay_switches_on_only_after_the_pass_rate_crossed_the_threshold(traced):
    result, _ = traced
    active = result.curves["replay_active"]  # (S, steps), 0/1
    pass1 = result.curves["accuracy_train"]
    assert pass1[:, 0].max() <= THRESHOLD  # the warm start is below the threshold
    assert np.all(np.diff(active, axis=1) >= 0)  # one way
    for s in range(CONFIG.seeds):
        crossed = np.flatnonzero(pass1[s] > THRESHOLD)
        assert crossed.size, "the run must cross the threshold"
        c = crossed[0]
        assert c >= 1
        assert np.all(active[s, : c + 1] == 0) and np.all(active[s, c + 1:] == 1)  # on from the next step
        assert np.all(result.curves["exp_frac"][s, : c + 1] == 0)  # no experience before
        assert np.all(result.curves["n_experience"][s, :c] == 0)  # nothing collected before either


def test_experience_fraction_is_min_floor_rho_b_and_buffer_size(traced):
    result, steps = traced
    exp_frac, n_e, active = result.curves["exp_frac"], result.curves["n_experience"], result.curves["replay_active"]
    e_before = np.concatenate([np.zeros((CONFIG.seeds, 1)), n_e[:, :-1]], axis=1)  # |E| at the start of each step
    expected = active * np.minimum(math.floor(RHO * B), e_before) / B
    np.testing.assert_array_equal(exp_frac, expected)
    large = (active == 1) & (e_before >= math.floor(RHO * B))
    assert large.sum() > 50  # many steps with a large buffer ...
    assert np.all(exp_frac[large] == 0.5)  # ... take exactly floor(rho B) / B = 4/8 from experience
    for st in steps:  # and the batch really has that many mixed groups, one o* each
        np.testing.assert_array_equal(st.replayed.sum(axis=1), st.n_exp)
        np.testing.assert_array_equal(st.exp_valid.sum(axis=1), st.n_exp)
    assert result.counts["exp_questions"] == pytest.approx((exp_frac * B).sum(axis=1).mean())


def test_final_reward_rises_above_the_warm_start_on_every_seed(traced):
    result, _ = traced
    env = make_env("bandit", **engine.env_kwargs(CONFIG))
    warm = env.evaluate(env.init_params(CONFIG.seeds))
    assert np.all(result.evals["reward"][:, -1] > warm["reward"] + 0.05)
    assert np.all(result.evals["accuracy"][:, -1] > warm["accuracy"] + 0.05)


def test_mixed_groups_stale_o_star_and_advantage_over_the_mixed_group(traced):
    _, steps = traced
    seen = 0
    for st in steps:
        b = st.batch
        np.testing.assert_array_equal(b.advantage, make_advantage(CONFIG, b.reward.reshape(
            CONFIG.seeds, B, G)).reshape(CONFIG.seeds, -1))  # advantage over the whole mixed group of G
        if not st.replayed.any():
            continue
        seen += int(st.replayed.sum())
        assert np.all(st.staleness[st.replayed] >= 1)  # o* was generated at an earlier step
        assert np.all(st.staleness[~st.replayed] == 0)  # everything else is fresh
        assert np.all(b.reward[st.replayed] == 1.0)  # stored trajectories are successful ones
        rep_q = b.prompt[st.replayed]
        s_idx, _ = np.nonzero(st.replayed)
        # o* is the last response of an experience question's group, whose other G - 1 are fresh rollouts
        groups = st.replayed.reshape(CONFIG.seeds, B, G)
        assert np.all(groups[:, :, :-1] == 0)
        np.testing.assert_array_equal(groups[:, :, -1], st.exp_valid)
        np.testing.assert_array_equal(rep_q, st.exp_questions[st.exp_valid])
        # o* keeps its STORED behaviour log-probs (pi_past), not the current policy's
        assert not np.allclose(b.logp_behav[st.replayed], st.logp_new[st.replayed])
        assert s_idx.size == rep_q.size
    assert seen > 100


def test_o_star_gradient_is_the_shaping_gradient(traced):
    _, steps = traced
    st = next(s for s in steps if s.replayed.sum() >= CONFIG.seeds and s.step > 20)
    b, rep, out = st.batch, st.replayed, st.loss
    n_tok = b.mask.sum(axis=(1, 2))[:, None]  # token-mean aggregation
    w = np.exp(st.logp_new[..., 0] - b.logp_behav[..., 0])  # (S, n) one token per response
    beta = CONFIG.exgrpo_beta
    by_hand = -b.advantage * beta * w / (w + beta) ** 2 / n_tok  # d loss / d logp of o*
    np.testing.assert_allclose(out.grad_logp[..., 0][rep], by_hand[rep], rtol=1e-12, atol=1e-15)
    assert np.any(np.abs(w[rep] - 1) > 1e-3)  # genuinely off-policy ratios
    # fresh responses: GRPO clip, on-policy here (w = 1), so the gradient is -A / n_tok
    np.testing.assert_allclose(out.grad_logp[..., 0][~rep], (-b.advantage / n_tok)[~rep], rtol=1e-12, atol=1e-15)
    # and the loss function itself agrees (central finite difference in one o* log-prob)
    s, i = map(int, np.argwhere(rep & (np.abs(b.advantage) > 0))[0])
    h = 1e-6

    def loss_at(delta):
        lp = st.logp_new.copy()
        lp[s, i, 0] += delta
        return losses.exgrpo_shaped(lp, b.logp_behav, b.advantage, b.mask, is_replayed=rep, beta=beta).loss[s]

    np.testing.assert_allclose((loss_at(h) - loss_at(-h)) / (2 * h), by_hand[s, i], rtol=1e-5)


def test_retired_questions_never_appear_in_experience_samples(traced):
    result, steps = traced
    replayed_any = False
    for st in steps:
        if st.exp_valid.any():
            replayed_any = True
            rows = np.nonzero(st.exp_valid)[0]
            assert not np.any(st.retired_before[rows, st.exp_questions[st.exp_valid]])
        fresh_q = st.batch.prompt.reshape(CONFIG.seeds, B, G)[:, :, 0][~st.exp_valid]
        rows = np.nonzero(~st.exp_valid)[0]
        open_rows = ~st.retired_before.all(axis=1)
        keep = open_rows[rows]
        assert not np.any(st.retired_before[rows[keep], fresh_q[keep]])  # nor in fresh sampling
    assert replayed_any
    assert result.curves["retired"][:, -1].min() > 0
    assert np.all(np.diff(result.curves["retired"], axis=1) >= 0)


def test_no_shaping_and_uniform_question_ablations():
    cfg = CONFIG.with_updates(steps=40)
    base = run_exgrpo(cfg)
    captured = []
    plain = run_exgrpo(cfg, shaping=False, on_step=captured.append)
    assert base.counts["shaping"] == 1.0 and plain.counts["shaping"] == 0.0
    st = next(s for s in captured if s.replayed.any())
    b = st.batch
    expected = losses.grpo(st.logp_new, b.logp_behav, b.advantage, b.mask).grad_logp  # o* with the GRPO clip
    np.testing.assert_allclose(st.loss.grad_logp, expected, rtol=1e-12, atol=1e-15)
    assert np.isnan(plain.curves["shaping_weight_mean"][:, st.step]).all()
    uniform = run_exgrpo(cfg, question_selection="uniform")
    assert uniform.counts["uniform_questions"] == 1.0
    assert uniform.curves["exp_frac"].max() == 0.5
    with pytest.raises(ValueError, match="exgrpo_question_selection must be one of buckets, uniform"):
        run_exgrpo(cfg, question_selection="gaussian")
    offered = []
    all_prompts = run_exgrpo(cfg, skip_retired=False, on_step=offered.append)
    assert all_prompts.counts["skip_retired"] == 0.0 and base.counts["skip_retired"] == 1.0
    fresh_retired = sum(int(st.retired_before[np.nonzero(~st.exp_valid)[0],
                                             st.batch.prompt[:, ::G][~st.exp_valid]].sum()) for st in offered)
    assert fresh_retired > 0  # retired prompts stay in fresh sampling, only E loses them
    assert all(not st.retired_before[np.nonzero(st.exp_valid)[0], st.exp_questions[st.exp_valid]].any()
               for st in offered)


def test_compute_and_difficulty_gains(traced):
    result, _ = traced
    S, n = CONFIG.seeds, B * G
    generated = n - result.curves["exp_frac"] * B  # fresh responses per step (o* is not generated)
    np.testing.assert_allclose(result.curves["compute"][:, -1], (CONFIG.mu * generated + n).sum(axis=1))
    assert result.counts["K_training"] == n * CONFIG.steps
    assert result.counts["K_inference"] == pytest.approx(generated.sum(axis=1).mean())
    env = make_env("bandit", **engine.env_kwargs(CONFIG))
    d = env.difficulty()
    assert result.counts["n_hard"] == (d <= 0.25).sum() and result.counts["n_easy"] == (d > 0.75).sum()
    assert result.counts["n_hard"] + result.counts["n_medium"] + result.counts["n_easy"] == env.num_prompts
    for name in ("gain_hard", "gain_medium", "gain_easy"):
        assert np.isfinite(result.counts[name])
    # the bucket gains average to the overall accuracy gain (prompts weighted by bucket size)
    warm = env.evaluate(env.init_params(S))["accuracy"].mean()
    total = sum(result.counts[f"gain_{k}"] * result.counts[f"n_{k}"] for k in ("hard", "medium", "easy"))
    assert total / env.num_prompts == pytest.approx(result.evals["accuracy"][:, -1].mean() - warm, rel=1e-9)


def test_fresh_questions_skip_retired_prompts():
    retired = np.array([[True, False, True, False], [True, True, True, True]])
    u = np.array([[0.0, 0.49, 0.5, 0.99], [0.0, 0.3, 0.6, 0.99]])
    np.testing.assert_array_equal(fresh_questions(retired, u), [[1, 1, 3, 3], [0, 1, 2, 3]])  # all retired: all


def test_token_mdp_mixed_groups_and_per_token_shaping():
    cfg = SimConfig(env="token-mdp", buffer="exgrpo", loss="exgrpo", seeds=3, steps=30, batch_size=B * G,
                    group_size=G, measure_drift=False)
    steps = []
    result = run_exgrpo(cfg, on_step=steps.append)
    st = next(s for s in reversed(steps) if s.replayed.any())
    b, rep = st.batch, st.replayed
    assert np.all(st.staleness[rep] >= 1) and np.all(b.reward[rep] == 1.0)
    m = b.mask & rep[:, :, None]
    w = np.exp(st.logp_new - b.logp_behav)  # token ratios w_t of o*
    n_tok = b.mask.sum(axis=(1, 2))[:, None, None]
    beta = cfg.exgrpo_beta
    by_hand = -b.advantage[:, :, None] * beta * w / (w + beta) ** 2 / n_tok
    np.testing.assert_allclose(st.loss.grad_logp[m], by_hand[m], rtol=1e-12, atol=1e-15)
    assert result.evals["accuracy"][:, -1].mean() > result.evals["accuracy"][:, 0].mean()
