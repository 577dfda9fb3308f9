"""App. E count-based mu (count_window), the micro-batched update, the gradient sketch, the exact KL by lag and
the error bars of calibrate.

Levels: hand-computed counts with a fake clock; the micro-batched update against the
whole-batch update; sketched per-sample gradients against the full ones; the exact KL against
``theory.divergences.kl_exact`` by hand and against the sampled k3 / k1 estimates; sigma^2(s)
with prompt-group units against the one-unit estimate.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import tracemalloc

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.theory.compute import estimate_mu  # noqa: E402
from replay_theory.theory.divergences import k3_terms, kl_exact  # noqa: E402
from replay_theory.theory.noise import noise_profile, staleness_moments  # noqa: E402
from replay_theory.theory.noise_scale import noise_scale_from_samples, pooled_noise_scale  # noqa: E402
from replay_theory.validate import countdown  # noqa: E402
from replay_theory.validate.calibrate import (  # noqa: E402
    RowSums,
    _group_means,
    block_rows,
    calibrate_lm,
    count_window,
    gradient_coordinates,
    gram_rows,
    group_means_of_rows,
    group_moments,
    measure_kl_by_lag,
    measure_mu_count,
    noise_scale_line,
    per_sample_grads,
    row_moments,
    sequence_kl_terms,
    staleness_profile,
)
from replay_theory.validate.logprobs import encode_prompts, next_token_logprobs, sequence_logprobs  # noqa: E402
from replay_theory.validate.policy import ModelConfig, load_policy  # noqa: E402
from replay_theory.validate.rl import RLConfig, generate_batch, update_step  # noqa: E402


class FakeClock:
    """Time advances only when a side works: generation costs ``gen`` s per call, an update ``upd`` s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sides(clock: FakeClock, gen_s: float, upd_s: float, rollouts: int, samples: int):
    log = []

    def generate_once():
        clock.now += gen_s
        log.append("g")
        return rollouts

    def update_once():
        clock.now += upd_s
        log.append("u")
        return samples

    return generate_once, update_once, log


@pytest.mark.parametrize("window,k_inference,k_training", [
    # 0.5 s per 16 rollouts, 0.125 s per update on 8 samples, binary-exact times.
    (4.0, 8 * 16, 32 * 8),  # 8 generations end at 0.5..4.0, 32 updates at 0.125..4.0: all inside
    (4.1, 8 * 16, 32 * 8),  # the 9th generation (4.5) and the 33rd update (4.125) end outside: not counted
    (3.9, 7 * 16, 31 * 8),  # the 8th generation and the 32nd update end at 4.0 > 3.9
])
def test_count_window_counts_work_finished_inside_the_window(window, k_inference, k_training):
    clock = FakeClock()
    generate_once, update_once, log = _sides(clock, 0.5, 0.125, 16, 8)
    out = count_window(generate_once, update_once, window, clock=clock)
    assert (out["k_inference"], out["k_training"]) == (k_inference, k_training)
    # App. E with W = T = 1: mu = (K_training / T) / (K_inference / W)
    assert out["mu"] == pytest.approx(k_training / k_inference) == estimate_mu(k_training, k_inference, 1, 1)
    assert (out["workers"], out["trainers"], out["seconds"]) == (1, 1, window)
    assert log[0] == "g"  # generation first: the buffer needs data before the first update
    if window == 4.0:
        # per-unit costs: rollout 0.5 / 16, sample 0.125 / 8 -> mu = (1/32) / (1/64) = 2 exactly
        assert out["mu"] == 2.0 and out["generation_busy_s"] == 4.0 and out["training_busy_s"] == 4.0
        assert log[:6] == ["g", "u", "u", "u", "u", "g"]  # the side that is behind works next
    if window == 3.9:
        assert out["mu"] == pytest.approx(248 / 112)  # edge effects of a short window: 2.214, not 2


def test_count_window_rejects_bad_windows_and_stuck_clocks():
    clock = FakeClock()
    generate_once, update_once, _ = _sides(clock, 0.0, 0.0, 1, 1)
    with pytest.raises(ValueError, match="count window must be > 0 seconds"):
        count_window(generate_once, update_once, 0.0, clock=clock)
    with pytest.raises(RuntimeError, match="clock did not advance"):
        count_window(generate_once, update_once, 1.0, clock=clock)


@pytest.fixture(scope="module")
def tiny():
    train_set, _ = countdown.make_splits(40, 4, seed=2)
    return load_policy(ModelConfig(), countdown.ALPHABET), train_set


@pytest.mark.slow
def test_measure_mu_count_on_the_tiny_pipeline(tiny):
    policy, train_set = tiny
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    config = RLConfig(steps=2, rollouts_per_step=8, group_size=4, batch_size=4, capacity=16, max_new_tokens=6)
    out = measure_mu_count(policy, train_set, config, window_seconds=1.0)
    assert out["k_inference"] % 8 == 0 and out["k_training"] % 4 == 0  # whole generations of R, updates of B
    assert out["k_inference"] > 0 and out["k_training"] > 0
    assert out["mu"] == pytest.approx(out["k_training"] / out["k_inference"])
    assert out["generation_busy_s"] >= 1.0 and out["training_busy_s"] >= 1.0
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())  # ran on a copy


def test_micro_batched_update_equals_the_whole_batch_update(tiny):
    policy, train_set = tiny
    config = RLConfig(steps=1, rollouts_per_step=8, group_size=4, batch_size=8, capacity=8, max_new_tokens=8,
                      loss="asymre", lr=1e-2)
    batch, _ = generate_batch(policy, train_set, np.array([0, 1]), config, 0, 0, torch.Generator().manual_seed(0))
    results = {}
    for micro in (0, 3):  # 3: chunks of 3, 3 and 2 completions
        copy_ = copy.deepcopy(policy)
        optimizer = torch.optim.SGD(copy_.model.parameters(), lr=config.lr)
        logp, out = update_step(copy_, optimizer, train_set, RLConfig(**{**config.__dict__, "micro_batch_size": micro}),
                                batch)
        results[micro] = (logp, out, [p.grad.detach().clone() for p in copy_.model.parameters()])
    (logp0, out0, grads0), (logp3, out3, grads3) = results[0], results[3]
    assert logp0.shape == logp3.shape == (8, batch.tokens.shape[-1])
    torch.testing.assert_close(logp3, logp0, rtol=0, atol=1e-5)
    assert float(out3.loss[0]) == pytest.approx(float(out0.loss[0]), abs=1e-6)
    assert max(float(g.abs().max()) for g in grads0) > 1e-3  # a real gradient...
    for a, b in zip(grads0, grads3):  # ...and the same one, accumulated over chunks
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match=r"^micro_batch_size must be an integer >= 0 \(0: whole batch\), got -1$"):
        RLConfig(micro_batch_size=-1).validated()


def test_gradient_sketch_keeps_the_chosen_coordinates(tiny):
    policy, train_set = tiny
    assert gradient_coordinates(1000, 1000, 0) is None and gradient_coordinates(1000, None, 0) is None
    coords = gradient_coordinates(1000, 50, 7)
    assert coords.shape == (50,) and bool((coords[1:] >= coords[:-1]).all()) and 0 <= int(coords.min())
    assert int(coords.max()) < 1000 and torch.equal(coords, gradient_coordinates(1000, 50, 7))  # seeded
    config = RLConfig(steps=1, rollouts_per_step=4, group_size=4, batch_size=4, capacity=4, max_new_tokens=6,
                      loss="asymre")
    batch, _ = generate_batch(policy, train_set, np.array([3]), config, 0, 0, torch.Generator().manual_seed(1))
    num_params = sum(p.numel() for p in policy.model.parameters())
    coords = gradient_coordinates(num_params, 2048, 3)
    full = per_sample_grads(policy, train_set, batch, config)  # (4, P)
    sketched = per_sample_grads(policy, train_set, batch, config, coords)  # (4, 2048)
    assert full.shape == (4, num_params) and sketched.shape == (4, 2048)
    assert torch.equal(sketched, full[:, coords])


# --------------------------------------------------------------------------- exact KL by lag


def _drifted(policy, scale: float = 0.02, seed: int = 0):
    """A copy of ``policy`` with seeded Gaussian noise of std ``scale`` added to every weight: pi_{t-lag}."""
    old = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in old.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return old


def _completions(policy, train_set, prompts: int, temperature: float = 1.0):
    config = RLConfig(steps=1, rollouts_per_step=4, group_size=4, batch_size=4, capacity=4, max_new_tokens=8,
                      temperature=temperature)
    batch, _ = generate_batch(policy, train_set, np.arange(prompts) % len(train_set), config, 0, 0,
                              torch.Generator().manual_seed(1))
    prompt_ids, prompt_mask = encode_prompts(policy, [train_set[i].prompt_text() for i in batch.prompt[0]])
    ids = torch.as_tensor(batch.tokens[0])
    mask = torch.as_tensor(batch.mask[0].astype(np.int64))
    return config, batch, (prompt_ids, prompt_mask, ids, mask)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_next_token_logprobs_gather_to_sequence_logprobs(tiny, temperature):
    policy, train_set = tiny
    _, _, args = _completions(policy, train_set, 3, temperature)
    with torch.no_grad():
        full = next_token_logprobs(policy, *args, temperature=temperature)  # (B, L, V)
        token = sequence_logprobs(policy, *args, temperature=temperature)  # (B, L)
    B, L = args[2].shape
    assert full.shape == (B, L, policy.model.config.vocab_size) and full.dtype == torch.float32
    gathered = full.gather(-1, args[2].unsqueeze(-1)).squeeze(-1).masked_fill(args[3] == 0, 0.0)
    assert torch.equal(gathered, token)  # the same numbers, not merely close
    torch.testing.assert_close(full.logsumexp(-1), torch.zeros(B, L), rtol=0, atol=1e-5)  # normalised rows


def test_exact_kl_equals_kl_exact_by_hand_and_is_nonnegative(tiny):
    policy, train_set = tiny
    old = _drifted(policy)
    config, _, args = _completions(policy, train_set, 4)
    terms = sequence_kl_terms(policy, old, *args, config.temperature)
    with torch.no_grad():
        lp = next_token_logprobs(policy, *args).double().numpy()  # (n, L, V)
        lq = next_token_logprobs(old, *args).double().numpy()
        token_p = sequence_logprobs(policy, *args).double().numpy()  # (n, L)
        token_q = sequence_logprobs(old, *args).double().numpy()
    live = args[3].numpy().astype(bool)
    by_hand = (kl_exact(lp, lq) * live).sum(-1)  # sum over positions of KL over the vocabulary
    np.testing.assert_allclose(terms["exact"], by_hand, rtol=1e-9, atol=1e-12)
    assert (terms["exact"] >= 0).all() and terms["exact"].mean() > 1e-3  # the drift is real
    log_ratio = np.where(live, token_q - token_p, 0.0)  # log pi_old - log pi_t of the sampled tokens
    np.testing.assert_allclose(terms["k1"], -log_ratio.sum(-1), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(terms["k3"], k3_terms(log_ratio).sum(-1), rtol=1e-9, atol=1e-12)
    chunked = sequence_kl_terms(policy, old, *args, config.temperature, chunk_elements=1)  # one row per pass
    for name in terms:
        np.testing.assert_allclose(chunked[name], terms[name], rtol=1e-5, atol=1e-7)
    same = sequence_kl_terms(policy, policy, *args, config.temperature)
    assert (same["exact"] == 0).all() and (same["k3"] == 0).all()  # KL(p || p) = 0 exactly


def test_exact_kl_k3_and_k1_agree_within_standard_errors(tiny):
    """KL(pi_t || pi_{t-1}) on 160 completions of a drifted pair: exact 0.171 +- 0.003, k3 0.166 +- 0.007,
    k1 0.219 +- 0.045 (standard errors over the 40 prompt groups)."""
    policy, train_set = tiny
    old = _drifted(policy)
    config, fresh, _ = _completions(policy, train_set, 40)
    snapshots = collections.deque([{k: v.clone() for k, v in old.model.state_dict().items()},
                                   {k: v.clone() for k, v in policy.model.state_dict().items()}])
    kl = measure_kl_by_lag(policy, copy.deepcopy(policy), train_set, fresh, snapshots, config)
    assert set(kl["exact"]) == {1}  # two snapshots reach lag 1 only
    exact, k3, k1 = kl["exact"][1], kl["k3"][1], kl["k1"][1]
    assert exact > 0.05 and 0 < kl["exact_se"][1] < exact / 10
    assert abs(k3 - exact) < 4 * math.hypot(kl["k3_se"][1], kl["exact_se"][1])
    assert abs(k1 - exact) < 4 * math.hypot(kl["k1_se"][1], kl["exact_se"][1])
    assert kl["exact_se"][1] < kl["k3_se"][1] < kl["k1_se"][1]  # the exact sum has the least noise


# --------------------------------------------------------------------------- error bars of sigma^2(s)


def test_staleness_profile_units_are_prompt_groups():
    """Point estimates equal the one-unit pooled estimate; the intervals exist and contain them."""
    rng = np.random.default_rng(0)
    K, n, G, d = 3, 24, 4, 5
    reference = rng.standard_normal(d)
    grads = reference + rng.standard_normal((K, n, d)) * np.array([1.0, 1.5, 2.0])[:, None, None]  # (K, n, d)
    grads[:, :, 0] += np.repeat(rng.standard_normal((K, n // G)), G, axis=1)  # a shared prompt effect per group
    profile = staleness_profile(grads, reference, 0.01, G, (0, 1, 2), seed=3)
    one_unit = noise_profile(staleness_moments(grads[None], reference[None], 0.01), (0, 1, 2))
    assert profile.units == n // G and one_unit.units == 1 and math.isnan(one_unit.plain_ci[0][0])
    np.testing.assert_allclose(profile.plain, one_unit.plain, rtol=1e-12)
    np.testing.assert_allclose(profile.signal_normalised, one_unit.signal_normalised, rtol=1e-12)
    np.testing.assert_allclose(profile.retained, one_unit.retained, rtol=1e-12)
    for values, intervals in ((profile.plain, profile.plain_ci), (profile.retained, profile.retained_ci),
                              (profile.signal_normalised, profile.signal_normalised_ci)):
        for v, (lo, hi) in zip(values, intervals):
            assert math.isfinite(lo) and math.isfinite(hi) and lo <= v <= hi and hi > lo
    with pytest.raises(ValueError, match="whole prompt groups"):
        staleness_profile(grads[:, :6], reference, 0.01, G, (0, 1, 2))


def test_calibrate_lm_gives_error_bars(tiny):
    """A 3-step probe, 4 prompt groups per staleness value: finite sigma^2 intervals around the point estimates,
    a rho interval from the buffer's groups, and an exact KL by lag next to k3 and k1."""
    policy, train_set = tiny
    policy = copy.deepcopy(policy)
    config = RLConfig(steps=3, rollouts_per_step=8, group_size=4, batch_size=8, capacity=16, max_new_tokens=6,
                      loss="asymre", lr=1e-2)
    cal = calibrate_lm(policy, train_set, config, staleness=(0, 1, 2), samples=16, reference_samples=32)
    assert cal.sigma_sq_units == 4 and cal.sigma_sq_level == 0.9
    for v, (lo, hi) in zip(cal.sigma_sq_plain, cal.sigma_sq_plain_ci):
        assert math.isfinite(lo) and math.isfinite(hi) and lo <= v <= hi and hi > lo
    assert cal.rho_fit["units"] == 4 and cal.rho_fit["bootstrap_unit"].startswith("prompt group")
    assert cal.rho_fit["ci"][0] <= cal.rho <= cal.rho_fit["ci"][1]
    assert set(cal.kl_by_lag) == set(cal.kl_by_lag_k3) == set(cal.kl_by_lag_k1) == set(cal.kl_by_lag_se) == {1, 2}
    assert all(v > 0 for v in cal.kl_by_lag.values()) and cal.kl_drift_per_step == cal.kl_by_lag[1]
    assert all(cal.kl_by_lag_se[lag] > 0 and cal.kl_by_lag_k3_se[lag] > 0 for lag in (1, 2))
    forms = cal.profile_dict("test")["forms"]
    assert forms["plain_ci"] == [list(c) for c in cal.sigma_sq_plain_ci] and forms["units"] == 4
    # the drift: the same completions re-scored at the final policy. At s = 0 the sampler's log-probs are the final
    # policy's own (the HF sampler), so the re-scoring must give them back token for token; older ones have drifted
    drift = cal.profile_dict("test")["drift"]
    assert drift["staleness"] == [0, 1, 2] and drift["m2"][0] == 0 and drift["m2_age0_measured"] < 1e-10
    assert min(drift["m2"][1:]) > 1e-8 and all(n > 0 for n in drift["tokens"])
    # B_noise at 3 checkpoints: the warm start and 2 updates (32 fresh completions = 8 groups each), the end (the
    # 32 reference and 16 s = 0 completions: 12 groups)
    record = cal.profile_dict("test")["noise_scale"]
    assert record["checkpoints"] == 3 and len(record["per_checkpoint"]) == 3 and record["unit_size"] == 4
    assert "after 0 (8 groups), 2 (8 groups), 3 (12 groups) of 3 probe updates" in record["source"]
    with pytest.raises(ValueError, match="samples must be a multiple of group_size = 4"):
        calibrate_lm(policy, train_set, config, staleness=(0, 1), samples=6)


def test_streamed_group_moments_equal_the_whole_array_profile():
    """calibrate_lm reduces each chunk of gradients to group means at once; the profile equals staleness_profile's."""
    from replay_theory.theory import noise as noise_estimators
    from replay_theory.validate.calibrate import group_moments, staleness_profile

    rng = np.random.default_rng(5)
    grads = rng.normal(size=(3, 24, 7)) + 0.3  # (K, n, d): 6 groups of 4 per staleness value
    reference, ref_var = rng.normal(size=7) + 0.3, 0.01
    whole = staleness_profile(grads, reference, ref_var, 4, (0, 1, 2), seed=2)
    parts = [[group_moments(grads[k, a:a + 8], reference, 4) for a in (0, 8, 16)] for k in range(3)]  # chunks of 8
    sq = np.stack([np.concatenate([p[0] for p in row]) for row in parts], axis=1)  # (U, K)
    inner = np.stack([np.concatenate([p[1] for p in row]) for row in parts], axis=1)
    moments = noise_estimators.StalenessMoments(sq, inner, np.full(6, reference @ reference - ref_var), np.ones(6))
    streamed = noise_estimators.noise_profile(moments, (0, 1, 2), seed=2)
    np.testing.assert_allclose(streamed.plain, whole.plain, rtol=1e-12)
    np.testing.assert_allclose(streamed.retained, whole.retained, rtol=1e-12)
    np.testing.assert_allclose(np.array(streamed.plain_ci), np.array(whole.plain_ci), rtol=1e-12)
    # by hand: plain sigma^2 at s = 0 is mean ||G||^2 - 2 mean <G, g_ref> + ||g_ref||^2 - ref_var
    g0 = grads[0]
    expected = (g0 * g0).sum(1).mean() - 2 * (g0 @ reference).mean() + reference @ reference - ref_var
    assert streamed.plain[0] == pytest.approx(expected, rel=1e-12)


def _calibration(retained_ci):
    from replay_theory.validate.calibrate import LMCalibration

    staleness = [0.0, 1.0, 2.0, 4.0, 8.0]
    return LMCalibration(
        mu_timing=1.0, staleness=staleness, sigma_sq=[2.0, 3.0, 5.0, 9.0, 40.0], rho=0.0, correlation_by_gap={},
        kl_by_lag={}, kl_drift_per_step=0.0, probe_metrics=[], fits={}, sigma_sq_form="signal-normalised",
        sigma_sq_plain=[2.0, 1.9, 1.8, 1.5, 1.2], sigma_sq_signal_normalised=[2.0, 3.0, 5.0, 9.0, 40.0],
        retained_signal=[1.0, 0.8, 0.6, 0.4, 0.1], retained_signal_ci=retained_ci,
        sigma_sq_ci=[[1, 3]] * 5, sigma_sq_plain_ci=[[1, 3]] * 5, sigma_sq_units=8, reference_variance=0.1)


def test_profile_uses_the_signal_normalised_table_only_where_the_retained_signal_is_resolved():
    resolved = _calibration([[0.9, 1.1], [0.6, 1.0], [0.4, 0.8], [0.2, 0.6], [0.05, 0.2]])
    assert resolved.profile_dict("x")["sigma_sq"] == [2.0, 3.0, 5.0, 9.0, 40.0]
    # r(4)'s interval reaches 0: the table stops before s = 4, and says so
    cut = _calibration([[0.9, 1.1], [0.6, 1.0], [0.4, 0.8], [-0.1, 0.6], [-0.2, 0.2]]).profile_dict("x")
    assert cut["sigma_sq"] == [2.0, 3.0, 5.0] and cut["sigma_sq_form"] == "signal-normalised"
    assert cut["note"].startswith("the signal-normalised table stops before s = 4: the retained signal r(s)'s 0.9 "
                                  "interval reaches 0 at s = 4")
    # r(1) unresolved: fewer than 3 points left, so the plain table, said
    plain = _calibration([[0.9, 1.1], [-0.1, 1.0], [0.4, 0.8], [0.2, 0.6], [0.05, 0.2]]).profile_dict("x")
    assert plain["sigma_sq"] == [2.0, 1.9, 1.8, 1.5, 1.2] and plain["sigma_sq_form"] == "plain"
    assert "the table is the plain sigma^2(s) of Assumption 3.3" in plain["note"]


def test_gram_rows_keep_the_noise_scale_and_its_bootstrap():
    """B_noise sees only inner products: the (U, U) rows give the same estimate and the same bootstrap draws."""
    rng = np.random.default_rng(3)
    units = [rng.normal(0.3, 1.0, size=(12, 500)), rng.normal(0.1, 1.0, size=(9, 500))]
    rows = [gram_rows(u) for u in units]
    assert rows[0].shape == (12, 12) and rows[1].shape == (9, 9)
    for u, r in zip(units, rows):
        full, small = noise_scale_from_samples(u, 4), noise_scale_from_samples(r, 4)
        assert small.trace_sigma == pytest.approx(full.trace_sigma, rel=1e-10)
        assert small.grad_sq == pytest.approx(full.grad_sq, rel=1e-9)
    a = pooled_noise_scale(units, np.random.default_rng(0), unit_size=4, n_boot=50)
    b = pooled_noise_scale(rows, np.random.default_rng(0), unit_size=4, n_boot=50)
    assert b.b_noise == pytest.approx(a.b_noise, rel=1e-9) and b.interval == pytest.approx(a.interval, rel=1e-9)


def test_gram_rows_in_place_are_numpys_qr_bit_for_bit():
    """gram_rows factors with LAPACK's dgeqrf in place (np.linalg.qr would copy the units twice): the same R."""
    rng = np.random.default_rng(4)
    units = rng.normal(0.2, 1.0, size=(24, 3000))
    expected = np.linalg.qr(units.T, mode="r").T
    kept = units.copy()
    assert np.array_equal(gram_rows(units), expected) and np.array_equal(units, kept)  # a copy was factored
    assert np.array_equal(gram_rows(units, overwrite=True), expected)
    assert not np.array_equal(units, kept)  # factored in place: no copy made
    np.testing.assert_allclose(expected @ expected.T, kept @ kept.T, rtol=1e-9, atol=1e-9)  # the inner products


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_block_reductions_equal_the_whole_chunk_bit_for_bit(group_size):
    """A chunk's per-sample gradients reduced block by block (block_rows rows at a time): the group means, the
    ||G||^2 and <G, g_ref> per group and the running sums equal those of the whole chunk at once, bit for bit.

    On one BLAS thread: a threaded matrix-vector product splits the rows among its threads, and an uneven split
    (the whole chunk's 126 rows at G = 3 on 2 threads) moves <G, g_ref>'s last digit, blocks or not."""
    with threadpool_limits(limits=1, user_api="blas"):
        _check_blocks(group_size)


def _check_blocks(group_size: int) -> None:
    rng = np.random.default_rng(6)
    n, dim = 128 // group_size * group_size, 20_000
    chunk = rng.normal(size=(n, dim)).astype(np.float32).astype(np.float64)  # float32 gradients, as the model's
    reference = rng.normal(size=dim) * 1e-2
    rows = block_rows(group_size)
    assert rows % 4 == 0 and rows % group_size == 0 and rows <= 32
    blocks = [chunk[a:a + rows] for a in range(0, n, rows)]
    sums = RowSums(dim)
    for block in blocks:
        sums.add(block)
    assert np.array_equal(sums.sum, chunk.sum(0)) and np.array_equal(sums.sum_sq, (chunk**2).sum(0))
    means = np.concatenate([_group_means(block, group_size) for block in blocks])
    assert np.array_equal(means, _group_means(chunk, group_size))
    parts = [row_moments(block, reference) for block in blocks]
    streamed = group_means_of_rows(*(np.concatenate(m) for m in zip(*parts)), group_size=group_size)
    whole = group_moments(chunk, reference, group_size)
    assert np.array_equal(streamed[0], whole[0]) and np.array_equal(streamed[1], whole[1])


def test_calibrate_lm_holds_one_checkpoints_units_and_one_gradient_block(tiny, monkeypatch):
    """Memory (issue 37): per-sample gradients are reduced block by block and each checkpoint's B_noise units are
    factored in place before the next checkpoint's, so numpy's peak is the final checkpoint's units, one block of
    gradients with its group means and a few (P,) vectors: not every checkpoint's units, whole chunks of gradients
    and the copies np.linalg.qr makes (the code before peaked at 83 P-rows here, this at 29). tracemalloc counts
    numpy's arrays exactly (not torch's tensors, which hold no more than one gradient at a time)."""
    from replay_theory.validate import calibrate

    monkeypatch.setattr(calibrate, "GRAD_BLOCK", 8)  # blocks of 8 rows: smaller than the units they are counted with
    policy, train_set = tiny
    policy = copy.deepcopy(policy)
    config = RLConfig(steps=3, rollouts_per_step=8, group_size=4, batch_size=8, capacity=8, max_new_tokens=6,
                      lr=1e-2)
    num_params = sum(p.numel() for p in policy.model.parameters())
    # modules calibrate_lm imports on first use (scipy.stats for theory/resampling's bootstrap, about 10 P-rows of
    # module objects here; the profile fit's scipy; the forgetting reader), imported before the trace: whether an
    # earlier test imported them must not decide this one (run alone, it counted scipy.stats and failed at 44 rows)
    import scipy.integrate  # noqa: F401
    import scipy.optimize  # noqa: F401
    import scipy.stats  # noqa: F401

    import replay_theory.theory.forgetting  # noqa: F401

    tracemalloc.start()
    try:
        cal = calibrate_lm(policy, train_set, config, staleness=(0, 1), samples=16, reference_samples=32,
                           kappa_pairs=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "after 0 (8 groups), 2 (8 groups), 3 (12 groups)" in cal.noise_scale["source"]  # 28 units in all
    assert block_rows(4) == 8
    rows = 12 + 8 + 8 // 4 + 8  # final units (reference and s = 0), a block, its group means, sums and temporaries
    assert peak < rows * num_params * 8, peak / (num_params * 8)


def test_noise_scale_line_prints_b_and_its_interval():
    record = {"b_noise": 240.0, "b_noise_interval": [160.0, None], "level": 0.9, "method": "per-sample", "batch": 8}
    assert noise_scale_line(record) == ("noise scale B_noise (per-sample) = 240, 90% interval [160, inf (no signal)]; "
                                        "b = B_noise / B = 30 [20, inf] at B = 8")


@pytest.mark.slow
def test_calibrate_lm_noise_scale_is_finite_with_an_interval(tiny, tmp_path):
    """GRPO on the tiny model after 2 updates: B_noise is about 240 responses, so 1024 fresh completions (256
    groups of 4, the reference batch and s = 0) resolve it: finite, positive, inside a finite interval, and the
    profile file carries the record."""
    policy, train_set = tiny
    policy = copy.deepcopy(policy)
    config = RLConfig(steps=2, rollouts_per_step=8, group_size=4, batch_size=8, capacity=8, max_new_tokens=6,
                      loss="grpo", lr=1e-2)
    cal = calibrate_lm(policy, train_set, config, staleness=(0, 1), samples=8, reference_samples=1024,
                       noise_checkpoints=1)
    record = cal.noise_scale
    lo, hi = record["b_noise_interval"]
    assert math.isfinite(record["b_noise"]) and record["b_noise"] > 0 and lo is not None and hi is not None
    assert 0 < lo <= record["b_noise"] <= hi and record["per_checkpoint"] == [record["b_noise"]]
    assert record["method"] == "per-sample" and record["batch"] == 8 and record["unit_size"] == 4
    assert record["level"] == 0.9 and record["checkpoints"] == 1
    num_params = sum(p.numel() for p in policy.model.parameters())
    assert f"({num_params} parameters, qwen2), loss grpo" in record["source"]
    assert "after 2 (258 groups) of 2 probe updates" in record["source"] and "all coordinates" in record["source"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(cal.profile_dict("test")))
    assert json.loads(path.read_text())["noise_scale"] == record
