"""core/losses_torch.py against the numpy reference (core/losses.py): every loss of the registry, random batches.

One loss, two array libraries: the validator on CUDA trains with the torch one, the CPU validator and the simulator
with the numpy one. On random batches (stale log-ratios that make the clip and M2PO's mask bind, masks with padding,
fresh and replayed rows) every value, every d loss / d logp_new entry and every metric the torch loss returns equal the
numpy ones to 1e-6 (measured ~1e-15: both run in float64).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replay_theory.core.designs import LOSSES, DesignConfig, LossInputs, loss_output  # noqa: E402
from replay_theory.core.losses_torch import TORCH_LOSSES, loss_output_torch  # noqa: E402

torch.set_num_threads(1)
TOL = 1e-6


def _batch(rng: np.random.Generator, S: int = 3, n: int = 16, L: int = 12, spread: float = 0.3) -> dict:
    """A random training batch: log-probs, stale log-ratios of scale ``spread``, GRPO-like advantages, padding."""
    logp_behav = -rng.exponential(1.5, (S, n, L))
    logp_new = logp_behav + spread * rng.standard_normal((S, n, L))
    lengths = rng.integers(1, L + 1, (S, n))
    mask = np.arange(L)[None, None, :] < lengths[..., None]  # (S, n, L) right-padded
    reward = rng.choice([0.0, 0.1, 1.0], (S, n))
    advantage = rng.standard_normal((S, n))
    advantage[:, ::5] = 0.0  # A = 0 rows: no gradient, no 0 * inf
    is_fresh = rng.random((S, n)) < 0.4
    return {"logp_new": logp_new, "logp_behav": logp_behav, "mask": mask, "reward": reward, "advantage": advantage,
            "is_fresh": is_fresh}


def _both(config: DesignConfig, b: dict, is_fresh: bool = True):
    fresh = b["is_fresh"] if is_fresh else None
    ref = loss_output(config, LossInputs(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], fresh,
                                         b["reward"]))
    t = {k: torch.as_tensor(v) for k, v in b.items()}
    out = loss_output_torch(config, t["logp_new"].float().double(), t["logp_behav"], t["advantage"], t["mask"],
                            t["is_fresh"] if is_fresh else None, t["reward"])
    return ref, out


@pytest.mark.parametrize("loss", list(LOSSES))
@pytest.mark.parametrize("spread", [0.05, 0.4])
def test_every_registry_loss_equals_the_numpy_reference(loss, spread):
    assert set(TORCH_LOSSES) == set(LOSSES)  # no loss the validator can train with is missing
    rng = np.random.default_rng(hash((loss, spread)) % 2**32)
    config = DesignConfig(loss=loss, tau_m2=0.04 if spread > 0.1 else 0.0004)
    worst = 0.0
    for _ in range(4):
        b = _batch(rng, spread=spread)
        b["logp_new"] = b["logp_new"].astype(np.float32).astype(np.float64)  # the model's float32 log-probs
        ref, out = _both(config, b)
        assert out.finite.all()
        np.testing.assert_allclose(out.loss.numpy(), ref.loss, rtol=0, atol=TOL)
        np.testing.assert_allclose(out.grad_logp.numpy(), ref.grad_logp, rtol=0, atol=TOL)
        worst = max(worst, float(np.abs(out.grad_logp.numpy() - ref.grad_logp).max()),
                    float(np.abs(out.loss.numpy() - ref.loss).max()))
        assert set(out.metrics) <= set(ref.metrics) and (bool(out.metrics) or loss in ("reinforce", "asymre"))
        for key, value in out.metrics.items():
            np.testing.assert_allclose(value.numpy(), np.asarray(ref.metrics[key], dtype=float), rtol=TOL, atol=TOL,
                                       equal_nan=True, err_msg=f"{loss} {key}")
    assert worst < 1e-12  # both libraries in float64: the same numbers up to rounding


def test_logged_metrics_are_those_the_validator_reads():
    """validate.rl.step_metrics logs the clip, mask and is_ratio metrics: the torch losses carry each of them."""
    rng = np.random.default_rng(7)
    b = _batch(rng)
    for loss in LOSSES:
        ref, out = _both(DesignConfig(loss=loss), b)
        wanted = {k for k in ref.metrics if k.startswith(("clip_ratio", "pg_clipfrac", "masked_frac", "is_ratio"))}
        assert wanted <= set(out.metrics), (loss, wanted - set(out.metrics))


def test_m2po_masks_bind_and_match_algorithm1_by_hand():
    """tau_M2 small enough that Algorithm 1 masks tokens: the same tokens as the numpy sort, and a hand case."""
    from replay_theory.core.losses import m2po_mask
    from replay_theory.core.losses_torch import _m2po_drop_and_cap

    # one seed, 4 tokens of T: M2 = 0.25, 0.16, 0.09, 0.01; tau 0.05: drop 0.25 (mean of rest 0.0867 > tau), then
    # 0.16 (rest 0.05 <= tau): two tokens masked
    lr = np.array([[[0.5, 0.4, -0.3, 0.1]]])
    adv = np.array([[[1.0, 1.0, -1.0, 1.0]]])
    mask = np.ones((1, 1, 4), bool)
    keep = m2po_mask(lr, adv, mask, 0.05)
    drop, cap = _m2po_drop_and_cap(torch.as_tensor(lr), torch.as_tensor(adv), torch.as_tensor(mask), 0.05,
                                   "algorithm1")
    assert keep.tolist() == [[[False, False, True, True]]]
    assert (~drop).numpy().tolist() == keep.tolist() and float(cap[0]) == float("inf")
    rng = np.random.default_rng(3)
    b = _batch(rng, spread=0.6)
    for variant in ("algorithm1", "reference"):
        config = DesignConfig(loss="m2po" if variant == "algorithm1" else "m2po-reference", tau_m2=0.02)
        ref, out = _both(config, b)
        assert float(out.metrics["masked_frac"].max()) > 0.0  # the mask binds
        np.testing.assert_allclose(out.metrics["masked_frac"].numpy(), ref.metrics["masked_frac"], atol=1e-12)


def test_non_finite_log_probs_are_flagged_per_seed():
    rng = np.random.default_rng(1)
    b = _batch(rng)
    b["logp_new"][1, 0, 0] = np.nan  # seed 1, a real token (every row has length >= 1)
    out = loss_output_torch(DesignConfig(loss="grpo"), *(torch.as_tensor(b[k]) for k in
                                                          ("logp_new", "logp_behav", "advantage", "mask")))
    assert out.finite.tolist() == [True, False, True]


def test_unknown_aggregation_and_loss_are_one_line_errors():
    rng = np.random.default_rng(2)
    b = {k: torch.as_tensor(v) for k, v in _batch(rng).items()}
    from replay_theory.core import losses_torch

    with pytest.raises(ValueError, match="aggregation must be one of"):
        losses_torch.grpo(b["logp_new"], b["logp_behav"], b["advantage"], b["mask"], aggregation="nope")
    with pytest.raises(ValueError, match="no torch implementation"):
        loss_output_torch(dataclasses.replace(DesignConfig(), loss="nope"), b["logp_new"], b["logp_behav"],
                          b["advantage"], b["mask"])
