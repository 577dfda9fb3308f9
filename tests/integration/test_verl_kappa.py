"""kappa from a verl run: the engine hook's curvature pairs (``VerlGradNoiseMixin``) through verl's real training step,
checked by hand, and carried by the noise log into ``calibrate --from-log --preset verl --grad-norms`` (issue 30).

What ran and what was stubbed: as tests/integration/test_integrations_verl_noise.py (its gloo group and device stub
are tests/conftest.py's):
verl 0.9.1's own ``BaseEngine.train_batch``, ``FSDPEngine.forward_backward_batch`` and ``optimizer_step`` on CPU,
with AdamW; the model a linear layer on per-token features under verl's token-mean ``agg_loss`` of a squared error,
so the Hessian is known exactly (central differences of a quadratic are exact to rounding). Not run: FSDP sharding,
more than one rank, verl's LM forward and PPO loss.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
transformer_impl = pytest.importorskip("verl.workers.engine.fsdp.transformer_impl")

from tensordict import TensorDict  # noqa: E402 (after the importorskips)
from verl.trainer.ppo.core_algos import agg_loss  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from replay_theory.integrations.verl import CURVATURE_METRICS, NoiseLog, VerlGradNoiseMixin  # noqa: E402

ROWS, LENGTH, FEATURES, LR = 8, 5, 3, 0.05


def loss_function(module, micro_batch):
    y = module(micro_batch["x"]).squeeze(-1)
    loss = agg_loss((y - micro_batch["target"]) ** 2, micro_batch["loss_mask"], "token-mean",
                    dp_size=tu.get_non_tensor_data(micro_batch, "dp_size", 1),
                    batch_num_tokens=tu.get_non_tensor_data(micro_batch, "batch_num_tokens", None))
    return loss, {"loss": loss.detach(), "metrics": {}}


class Engine(transformer_impl.FSDPEngine):
    def forward_step(self, micro_batch, loss_function, forward_only):
        return loss_function(self.module, micro_batch)


class NoiseEngine(VerlGradNoiseMixin, Engine):
    curvature_every = 1


class PlainNoiseEngine(VerlGradNoiseMixin, Engine):
    curvature_every = 0


def make_engine(cls):
    engine = object.__new__(cls)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        engine.module = torch.nn.Linear(FEATURES, 1).double()
    engine.optimizer = torch.optim.AdamW(engine.module.parameters(), lr=LR, weight_decay=0.0)
    engine.optimizer_config = SimpleNamespace(clip_grad=1.0)  # verl clips: D folds the clipped gradient in
    engine.engine_config = SimpleNamespace(use_no_sync_for_gradient_accumulation=True)
    engine.ulysses_sequence_parallel_size, engine.ulysses_device_mesh = 1, None
    engine.scaler, engine._qat_enabled = None, False
    return engine


def mini_batch(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    data = TensorDict({"x": torch.randn(ROWS, LENGTH, FEATURES, generator=g, dtype=torch.float64),
                       "target": torch.randn(ROWS, LENGTH, generator=g, dtype=torch.float64),
                       "loss_mask": (torch.rand(ROWS, LENGTH, generator=g) > 0.3).double()}, batch_size=[ROWS])
    data["loss_mask"][:, 0] = 1.0
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=2)
    return data


def loss_on(module, data, rows):
    y = module(data["x"][rows]).squeeze(-1)
    mask = data["loss_mask"][rows]
    return ((y - data["target"][rows]) ** 2 * mask).sum() / mask.sum()


def grads(module, data, rows) -> list:
    return list(torch.autograd.grad(loss_on(module, data, rows), list(module.parameters())))


def test_curvature_pair_through_verls_training_step_equals_a_hand_computation(gloo, on_cpu):
    """Update 0 starts a pair (xi from the halves of mini-batch A, D of AdamW's first update with verl's clip),
    update 1 completes it on mini-batch B at the updated weights: w^T H w by autograd on B's loss. Training is
    bit-identical to the engine without pairs."""
    engine, plain = make_engine(NoiseEngine), make_engine(PlainNoiseEngine)
    probe = make_engine(Engine).module  # the weights before the first update
    a, b = mini_batch(1), mini_batch(2)
    first = engine.train_batch(a, loss_function)["metrics"]
    assert not any(k.startswith("noise/curvature") for k in first)  # started, not completed
    after_first = [p.detach().clone() for p in engine.module.parameters()]
    second = engine.train_batch(b, loss_function)["metrics"]
    for data in (mini_batch(1), mini_batch(2)):
        plain.train_batch(data, loss_function)
    assert all(torch.equal(p, q) for p, q in zip(engine.module.parameters(), plain.module.parameters()))

    halves = [list(range(4)), list(range(4, ROWS))]  # micro-batches of 2: the halves split after 2 of them
    g1, g2 = (grads(probe, a, h) for h in halves)
    g = grads(probe, a, list(range(ROWS)))
    norm = float(torch.sqrt(sum((x ** 2).sum() for x in g)))
    clip = min(1.0, 1.0 / (norm + 1e-6))
    w, den = [], 0.0
    for x1, x2, x in zip(g1, g2, g):
        xi = x1 - x2
        d = 1.0 / (((0.001 * (clip * x) ** 2) / (1 - 0.999)).sqrt() + 1e-8)  # the first update's v_hat
        w.append(d * xi)
        den += float((xi * d * xi).sum())
    assert second["noise/curvature_den"] == pytest.approx(den, rel=1e-12)
    assert second["noise/curvature_lr"] == LR and second["noise/curvature_beta1"] == 0.9
    at = make_engine(Engine).module
    with torch.no_grad():
        for p, q in zip(at.parameters(), after_first):
            p.copy_(q)
    gb = torch.autograd.grad(loss_on(at, b, list(range(ROWS))), list(at.parameters()), create_graph=True)
    hw = torch.autograd.grad(sum((x * v).sum() for x, v in zip(gb, w)), list(at.parameters()))
    num = sum(float((x * v).sum()) for x, v in zip(hw, w))
    assert second["noise/curvature_num"] == pytest.approx(num, rel=1e-7)  # a quadratic: exact but for rounding


def test_the_same_responses_again_wait_for_new_ones(gloo, on_cpu):
    """A second epoch over the same mini-batch shares xi's responses: the pair waits for a new mini-batch."""
    engine = make_engine(NoiseEngine)
    engine.train_batch(mini_batch(1), loss_function)
    again = engine.train_batch(mini_batch(1), loss_function)["metrics"]
    assert not any(k.startswith("noise/curvature") for k in again) and engine._curvature is not None
    new = engine.train_batch(mini_batch(3), loss_function)["metrics"]
    assert all(f"noise/{name}" in new for name in CURVATURE_METRICS)


def test_noise_log_carries_the_pairs_to_calibrate_from_log(tmp_path):
    from replay_theory.diagnose.calibrate_log import memory_record, read_grad_norms

    path = tmp_path / "noise.jsonl"
    log = NoiseLog(path)
    base = {"actor/noise/grad_sq_small": 10.0, "actor/noise/grad_sq_big": 6.0, "actor/noise/batch_small": 4.0,
            "actor/noise/batch_big": 8.0}
    pair = {"actor/noise/curvature_num": 3.0, "actor/noise/curvature_den": 2.0, "actor/noise/curvature_lr": 0.01,
            "actor/noise/curvature_beta1": 0.9}
    assert log({**base, **pair}, 3) and log(base, 4) and log({**base, **pair, "actor/noise/curvature_num": 1.0}, 5)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["curvature_num"] == 3.0 and "curvature_num" not in lines[1]
    record = memory_record(read_grad_norms(path), source="test")
    assert record["kappa"] == pytest.approx(0.01 * (3.0 + 1.0) / (2.0 + 2.0), rel=1e-12) and record["units"] == 2
