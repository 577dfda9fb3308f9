"""B_noise from a verl run: the engine hook's two batch sizes (``VerlGradNoiseMixin``) through verl's real training
step, checked against autograd by hand, and the per-step noise log the v1 trainer mixin writes.

What ran and what was stubbed.  Ran, verl 0.9.1's own code on CPU: ``BaseEngine.train_batch`` (zero grad, the
micro-batch loop, ``optimizer_step``), ``FSDPEngine.forward_backward_batch`` (``batch_num_tokens`` all-reduced over
a one-process gloo group, ``prepare_micro_batches`` chunking the mini-batch, ``_gradient_sync_context``, one
backward per micro-batch, ``postprocess_batch_func``), ``FSDPEngine.optimizer_step`` (``clip_grad_norm_`` on a
module that is not FSDP-wrapped: its own ``grad_norm``) and verl's ``agg_loss`` (token-mean over the global token
count). Stubbed: the model (a linear layer on per-token features instead of an LM, so the gradient can be worked
out by hand), ``forward_step`` (verl's is per model class; ours calls the loss on that layer) and verl's device id
(it has no CPU platform: ``get_device_id`` returns "cpu"). Not run: FSDP sharding, more than one rank (the hook's
all-reduce of the shards' squares and the split check), verl's LM forward.

Needs verl 0.9.1, torch and tensordict; skipped where they do not import.
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

from replay_theory.integrations.verl import NoiseLog, VerlGradNoiseMixin  # noqa: E402

ROWS, LENGTH, FEATURES = 8, 5, 3


def loss_function(module, micro_batch):
    """verl's token-mean aggregation (agg_loss) of a squared error per token, over the mini-batch's token count."""
    y = module(micro_batch["x"]).squeeze(-1)  # (rows, L)
    loss = agg_loss((y - micro_batch["target"]) ** 2, micro_batch["loss_mask"], "token-mean",
                    dp_size=tu.get_non_tensor_data(micro_batch, "dp_size", 1),
                    batch_num_tokens=tu.get_non_tensor_data(micro_batch, "batch_num_tokens", None))
    return loss, {"loss": loss.detach(), "metrics": {}}


class Engine(transformer_impl.FSDPEngine):
    def forward_step(self, micro_batch, loss_function, forward_only):  # verl's is per model class
        return loss_function(self.module, micro_batch)


class NoiseEngine(VerlGradNoiseMixin, Engine):
    pass


def make_engine(cls, seed: int = 0):
    """The attributes verl's FSDPEngine.__init__ / initialize would set that the training step reads."""
    engine = object.__new__(cls)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        engine.module = torch.nn.Linear(FEATURES, 1).double()
    engine.optimizer = torch.optim.SGD(engine.module.parameters(), lr=0.1)
    engine.optimizer_config = SimpleNamespace(clip_grad=1e9)  # no clipping: the step is the plain gradient's
    engine.engine_config = SimpleNamespace(use_no_sync_for_gradient_accumulation=True)
    engine.ulysses_sequence_parallel_size, engine.ulysses_device_mesh = 1, None
    engine.scaler, engine._qat_enabled = None, False
    return engine


def mini_batch(rows: int, micro: int, seed: int = 1) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    data = TensorDict({"x": torch.randn(rows, LENGTH, FEATURES, generator=g, dtype=torch.float64),
                       "target": torch.randn(rows, LENGTH, generator=g, dtype=torch.float64),
                       "loss_mask": (torch.rand(rows, LENGTH, generator=g) > 0.3).double()}, batch_size=[rows])
    data["loss_mask"][:, 0] = 1.0  # every response has a token
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro)
    return data


def grad_sq(module, data, rows) -> float:
    """|grad|^2 of the token-mean loss over ``rows`` alone (their own token count), by autograd."""
    module.zero_grad()
    y = module(data["x"][rows]).squeeze(-1)
    mask = data["loss_mask"][rows]
    (((y - data["target"][rows]) ** 2 * mask).sum() / mask.sum()).backward()
    return float(sum((p.grad.double() ** 2).sum() for p in module.parameters()))


@pytest.mark.parametrize("rows, micro, first", [(8, 2, 4), (6, 2, 4), (8, 4, 4)])
def test_two_batch_norms_through_verls_training_step_equal_autograd_by_hand(gloo, on_cpu, rows, micro, first):
    # halves: the micro-batches finished when half the responses are (8 rows of 2: after 2 micro-batches, 4 + 4;
    # 6 rows of 2: after 2, 4 + 2; 8 rows of 4: after 1, 4 + 4)
    data = mini_batch(rows, micro)
    engine = make_engine(NoiseEngine)
    reference = make_engine(Engine)  # verl's engine without the hook, the same weights
    before = [p.detach().clone() for p in engine.module.parameters()]
    out = engine.train_batch(data, loss_function)
    plain = reference.train_batch(mini_batch(rows, micro), loss_function)
    metrics = out["metrics"]

    probe = make_engine(Engine).module  # the weights the step's gradient was taken at
    assert all(torch.equal(p, q) for p, q in zip(probe.parameters(), before))
    halves = [list(range(first)), list(range(first, rows))]
    small = [grad_sq(probe, data, h) for h in halves]  # |g_hat_k|^2: each half's own token-mean gradient
    big = grad_sq(probe, data, list(range(rows)))
    b1, b2 = first, rows - first
    assert metrics["noise/grad_sq_small"] == pytest.approx((small[0] + small[1]) / 2, rel=1e-12)
    assert metrics["noise/grad_sq_big"] == pytest.approx(big, rel=1e-12)
    assert metrics["noise/batch_small"] == 2 * b1 * b2 / (b1 + b2) and metrics["noise/batch_big"] == rows
    # the big batch's gradient is the one verl clips and steps with: its own grad_norm, squared
    assert metrics["noise/grad_sq_big"] == pytest.approx(metrics["grad_norm"] ** 2, rel=1e-12)
    # training is unchanged: the same update as verl's engine without the hook
    assert plain["metrics"]["grad_norm"] == metrics["grad_norm"]
    assert all(torch.equal(p, q) for p, q in zip(engine.module.parameters(), reference.module.parameters()))
    assert not any(torch.equal(p, q) for p, q in zip(engine.module.parameters(), before))


def test_one_micro_batch_measures_nothing(gloo, on_cpu):
    out = make_engine(NoiseEngine).train_batch(mini_batch(8, 8), loss_function)
    assert not [k for k in out["metrics"] if k.startswith("noise/")] and "grad_norm" in out["metrics"]


def test_unsynchronised_data_parallel_halves_are_refused(gloo, on_cpu, monkeypatch):
    engine = make_engine(NoiseEngine)
    monkeypatch.setattr(NoiseEngine, "get_data_parallel_size", lambda self: 2)
    with pytest.raises(ValueError) as info:
        engine.train_batch(mini_batch(8, 2), loss_function)
    assert str(info.value) == ("the noise-scale hook needs the gradient synchronised after every micro-batch with 2 "
                               "data-parallel ranks: set use_no_sync_for_gradient_accumulation=False")


def test_noise_log_writes_a_line_per_measured_step_and_never_overwrites(tmp_path):
    path = tmp_path / "noise.jsonl"
    log = NoiseLog(path)
    metrics = {"actor/noise/grad_sq_small": 10.0, "actor/noise/grad_sq_big": 6.0, "actor/noise/batch_small": 4.0,
               "actor/noise/batch_big": 8.0}
    assert log(metrics, 3) is True
    assert log({"actor/grad_norm": 1.0}, 4) is False  # the engine hook is off: nothing for the step
    assert log({**metrics, "actor/noise/grad_sq_small": 8.0}, 5) is True
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"step": 3, "grad_sq_small": 10.0, "grad_sq_big": 6.0, "batch_small": 4.0, "batch_big": 8.0,
                      "unit_size": 1},
                     {"step": 5, "grad_sq_small": 8.0, "grad_sq_big": 6.0, "batch_small": 4.0, "batch_big": 8.0,
                      "unit_size": 1}]
    with pytest.raises(ValueError, match="exists: a log is never overwritten"):
        NoiseLog(path)


def test_register_noise_engines_puts_the_hook_on_verls_registered_engines(monkeypatch):
    import copy

    from verl.workers.engine.base import EngineRegistry

    from replay_theory.integrations.verl import register_noise_engines

    monkeypatch.setattr(EngineRegistry, "_engines", copy.deepcopy(EngineRegistry._engines))  # undone after
    before = EngineRegistry._engines["language_model"]["fsdp"]
    made = register_noise_engines()
    after = EngineRegistry._engines["language_model"]["fsdp"]
    assert set(after) == set(before)
    for key, cls in after.items():
        assert issubclass(cls, VerlGradNoiseMixin) and issubclass(cls, before[key])
        assert cls.__mro__[1] is VerlGradNoiseMixin  # the hook's methods first, then verl's engine
    assert register_noise_engines() == {}  # idempotent: nothing left to wrap
    assert made["FSDPEngineWithLMHead"].__name__ == "NoiseMeasuredFSDPEngineWithLMHead"
