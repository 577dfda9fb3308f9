"""The verl noise hook's scope (issue 40), with stand-ins for verl's classes so that it runs without verl: which
engines it measures (FSDP's ``forward_step(micro_batch, loss_function, forward_only)``) and refuses (Megatron's
``forward_step(batch_iter, model, logits_processor_func, postprocess_micro_batch_func)``, verl 0.9.1
workers/engine/megatron/transformer_impl.py:1130), the refusal of a noise log with ``trainer.balance_batch`` on,
and verl's padding rows (all-zero masks, trainer/ppo/padding_utils.py) left out of the halves' sizes.

The stand-ins copy what the hook reads: ``EngineRegistry._engines`` (model type -> backend -> device -> class,
workers/engine/base.py:339-396), ``FSDPEngine.forward_backward_batch``'s micro-batch loop (fsdp/transformer_impl.py:
724-776: forward_step, then the backward of its loss), the v1 trainer's ``_balance_batch`` (pad, then reorder in
place, v1/trainer_base.py:1608-1631) and ``KVBatchMeta``'s keys and in-place ``reorder``.
"""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")

from replay_theory.integrations.verl import (  # noqa: E402 (after the importorskip)
    BALANCE_REFUSAL,
    VerlGradNoiseMixin,
    VerlV1DiagnoseLogMixin,
    noise_refusal,
    register_noise_engines,
)
from replay_theory.theory.noise_scale import noise_scale_two_batch  # noqa: E402

LENGTH, FEATURES = 4, 3


class FSDPEngine:
    """verl's FSDPEngine, as far as the hook reads it: the micro-batch loop of fixed-size micro-batches."""

    micro = 2

    def __init__(self, module=None):
        self.module = module

    def get_data_parallel_size(self):
        return 1

    def get_data_parallel_group(self):
        return None

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        rows = data["loss_mask"].shape[0]
        tokens = float(data["loss_mask"].sum())
        for start in range(0, rows, self.micro):
            micro_batch = {k: v[start:start + self.micro] for k, v in data.items()}
            micro_batch["batch_num_tokens"] = tokens
            loss, _ = self.forward_step(micro_batch, loss_function=loss_function, forward_only=forward_only)
            if not forward_only:
                loss.backward()
        return {"metrics": {}}

    def forward_step(self, micro_batch, loss_function, forward_only):
        return loss_function(self.module, micro_batch)


class FSDPEngineWithLMHead(FSDPEngine):
    pass


class MegatronEngine:
    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        raise NotImplementedError


class MegatronEngineWithLMHead(MegatronEngine):
    pass


class TorchTitanEngineWithLMHead:  # the FSDP signature, but its module is a list of model parts
    def forward_step(self, micro_batch, loss_function, forward_only):
        raise NotImplementedError


MEGATRON_REFUSAL = ("the noise-scale hook measures verl's FSDP engines only, not MegatronEngineWithLMHead: its "
                    "forward_step(batch_iter, model, logits_processor_func, postprocess_micro_batch_func) is not the "
                    "FSDP engine's (micro_batch, loss_function, forward_only) and Megatron keeps its gradients in "
                    "main_grad; use actor_rollout_ref.actor.strategy=fsdp2 (or fsdp), or register_v1_trainers alone "
                    "for the diagnose log")


def test_a_megatron_engine_is_refused_in_one_line_naming_it():
    assert noise_refusal(MegatronEngineWithLMHead) == MEGATRON_REFUSAL
    assert "\n" not in MEGATRON_REFUSAL
    assert noise_refusal(FSDPEngineWithLMHead) is None
    assert noise_refusal(TorchTitanEngineWithLMHead) == (
        "the noise-scale hook measures verl's FSDP engines only, not TorchTitanEngineWithLMHead: it is no FSDPEngine, "
        "whose module's .grad the hook reads; use actor_rollout_ref.actor.strategy=fsdp2 (or fsdp), or "
        "register_v1_trainers alone for the diagnose log")


def test_register_noise_engines_wraps_fsdp_and_makes_megatron_refuse_to_be_built(monkeypatch):
    registry = types.SimpleNamespace(_engines={"language_model": {
        "fsdp": {"cuda": FSDPEngineWithLMHead, "npu": FSDPEngineWithLMHead},
        "megatron": {"cuda": MegatronEngineWithLMHead}}})
    base = types.ModuleType("verl.workers.engine.base")
    base.EngineRegistry = registry
    for name in ("verl", "verl.workers", "verl.workers.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "verl.workers.engine.base", base)

    made = register_noise_engines()
    fsdp, megatron = registry._engines["language_model"]["fsdp"], registry._engines["language_model"]["megatron"]
    assert sorted(made) == ["FSDPEngineWithLMHead", "MegatronEngineWithLMHead"]
    assert fsdp["cuda"] is fsdp["npu"] is made["FSDPEngineWithLMHead"]
    assert fsdp["cuda"].__name__ == "NoiseMeasuredFSDPEngineWithLMHead"
    assert fsdp["cuda"].__mro__[1:3] == (VerlGradNoiseMixin, FSDPEngineWithLMHead)
    assert megatron["cuda"].__name__ == "NoiseRefusedMegatronEngineWithLMHead"
    assert issubclass(megatron["cuda"], MegatronEngineWithLMHead)
    with pytest.raises(RuntimeError) as info:
        megatron["cuda"]()  # EngineRegistry.new builds it: refused before any training
    assert str(info.value) == MEGATRON_REFUSAL
    assert register_noise_engines() == {}  # idempotent: nothing left to wrap or refuse
    fsdp["cuda"](module=None)  # the measured engine builds as verl's


class KVBatchMeta:
    """TransferQueue's KVBatchMeta as far as ``_balance_batch`` uses it: keys, tags, an in-place reorder."""

    def __init__(self, keys, tags):
        self.keys, self.tags = list(keys), list(tags)

    def reorder(self, indices):
        self.keys, self.tags = [self.keys[i] for i in indices], [self.tags[i] for i in indices]


class Trainer:
    """verl's v1 PPOTrainer as far as the mixin uses it: the config, and ``_balance_batch`` padding to a multiple of
    4 (a new batch meta, padding rows last) and then reordering it in place (here: reversed)."""

    def __init__(self, config):
        self.config = config

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        pad = -len(batch.keys) % 4
        batch = KVBatchMeta(batch.keys + [f"pad_{i}" for i in range(pad)],
                            batch.tags + [{"is_padding": True}] * pad)
        batch.reorder(list(range(len(batch.keys)))[::-1])
        return batch


class LoggedTrainer(VerlV1DiagnoseLogMixin, Trainer):
    pass


def test_a_noise_log_with_balance_batch_on_is_refused_with_the_key_to_set(tmp_path):
    noise = str(tmp_path / "noise.jsonl")
    for trainer in ({"noise_log": noise}, {"noise_log": noise, "balance_batch": True}):  # verl's default: on
        with pytest.raises(ValueError) as info:
            LoggedTrainer({"trainer": trainer})
        assert str(info.value) == BALANCE_REFUSAL
    assert BALANCE_REFUSAL.startswith("the noise log needs trainer.balance_batch=False: ")
    LoggedTrainer({"trainer": {"balance_batch": True}})  # no noise log: verl's default stands


def test_with_balance_batch_off_the_v1_step_keeps_the_sampled_order_and_verls_padding(tmp_path):
    trainer = LoggedTrainer({"trainer": {"noise_log": str(tmp_path / "noise.jsonl"), "balance_batch": False}})
    batch = KVBatchMeta(["a", "b", "c", "d", "e", "f"], [{}] * 6)
    out = trainer._balance_batch(batch, {})
    assert out.keys == ["a", "b", "c", "d", "e", "f", "pad_1", "pad_0"]  # padded to 8, verl's reorder undone
    assert [tag.get("is_padding", False) for tag in out.tags] == [False] * 6 + [True] * 2
    plain = LoggedTrainer({"trainer": {}})._balance_batch(KVBatchMeta(list("abcdef"), [{}] * 6), {})
    assert plain.keys == ["pad_1", "pad_0", "f", "e", "d", "c", "b", "a"]  # without the noise log: verl's order


def loss_function(module, micro_batch):
    """verl's token-mean: a squared error per token over the mini-batch's token count."""
    y = module(micro_batch["x"]).squeeze(-1)
    loss = ((y - micro_batch["target"]) ** 2 * micro_batch["loss_mask"]).sum() / micro_batch["batch_num_tokens"]
    return loss, {}


class NoiseEngine(VerlGradNoiseMixin, FSDPEngine):
    pass


def grad_sq(module, data, rows) -> float:
    """|grad|^2 of the token-mean loss over ``rows`` alone (their own token count), by autograd."""
    module.zero_grad()
    mask = data["loss_mask"][rows]
    y = module(data["x"][rows]).squeeze(-1)
    (((y - data["target"][rows]) ** 2 * mask).sum() / mask.sum()).backward()
    return float(sum((p.grad.double() ** 2).sum() for p in module.parameters()))


def test_padding_rows_are_no_samples_in_the_halves_sizes_and_b_simple():
    # 8 rows in micro-batches of 2, rows 1 and 6 verl's padding (all-zero masks): 6 responses, so the hook splits
    # once 3 are done, after micro-batches [0, 1p] and [2, 3]: halves {0, 2, 3} and {4, 5, 7}, b_1 = b_2 = 3
    # (counting the padding rows it would report batch_small 4 and batch_big 8)
    g = torch.Generator().manual_seed(3)
    data = {"x": torch.randn(8, LENGTH, FEATURES, generator=g, dtype=torch.float64),
            "target": torch.randn(8, LENGTH, generator=g, dtype=torch.float64) + 2.0,  # a signal: |G|^2 > 0
            "loss_mask": (torch.rand(8, LENGTH, generator=g) > 0.3).double()}
    data["loss_mask"][:, 0] = 1.0
    data["loss_mask"][[1, 6]] = 0.0
    torch.manual_seed(0)
    engine = NoiseEngine(torch.nn.Linear(FEATURES, 1).double())
    probe = torch.nn.Linear(FEATURES, 1).double()
    probe.load_state_dict(engine.module.state_dict())
    metrics = engine.forward_backward_batch(data, loss_function)["metrics"]

    small = [grad_sq(probe, data, rows) for rows in ([0, 2, 3], [4, 5, 7])]  # each half's own token-mean gradient
    big = grad_sq(probe, data, [0, 2, 3, 4, 5, 7])
    assert (metrics["noise/batch_small"], metrics["noise/batch_big"]) == (3.0, 6.0)  # 2 * 3 * 3 / 6, 3 + 3
    assert metrics["noise/grad_sq_small"] == pytest.approx((small[0] + small[1]) / 2, rel=1e-12)
    assert metrics["noise/grad_sq_big"] == pytest.approx(big, rel=1e-12)
    # B_simple = tr Sigma / |G|^2 with tr Sigma = (|g_s|^2 - |g_b|^2) / (1/3 - 1/6), |G|^2 = (6 |g_b|^2 - 3 |g_s|^2) / 3
    s, b = (small[0] + small[1]) / 2, big
    by_hand = ((s - b) / (1 / 3 - 1 / 6)) / ((6 * b - 3 * s) / 3)
    estimate = noise_scale_two_batch(metrics["noise/grad_sq_small"], metrics["noise/grad_sq_big"],
                                     metrics["noise/batch_small"], metrics["noise/batch_big"])
    assert estimate.grad_sq > 0 and estimate.b_noise == pytest.approx(by_hand, rel=1e-9)
    print(f"padding rows 1, 6 of 8: halves 3 + 3 responses, B_simple = {estimate.b_noise:.6g} (by hand {by_hand:.6g})")
