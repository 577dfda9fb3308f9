"""The GPU code paths of the validator's loop (issue 31), run on the CPU and checked by value.

Sampling on the device (the exponential-race draw, the all-finished flag read every few tokens), the static KV cache
and the compiled decode step (``validate/sampling.py``), and the update with the torch losses (``validate/rl.py``,
``core/losses_torch.py``): each against the CPU loop whose numbers every earlier version printed.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown, sampling  # noqa: E402
from replay_theory.validate.batched import stack_policy  # noqa: E402
from replay_theory.validate.config import TINY_MODEL, ValidateConfig  # noqa: E402
from replay_theory.validate.engines import HFSampler, make_sampler  # noqa: E402
from replay_theory.validate.policy import ModelConfig, load_policy  # noqa: E402
from replay_theory.validate.rl import (  # noqa: E402
    RLConfig,
    generate_batch,
    loss_library,
    make_generator,
    update_step,
)
from replay_theory.validate.sampling import DecodeOptions, default_decode, draw_tokens, generate  # noqa: E402

torch.set_num_threads(1)
STATIC_TOL = 1e-5
"""|logp_behav| difference allowed between the static cache (attention over the whole cache width, future columns
masked) and the dynamic one: float32 rounding of a longer reduction (measured 4.8e-7 on the tiny model)."""


@pytest.fixture(scope="module")
def setup():
    config = ValidateConfig()
    train_set, _ = config.problems()
    policy = load_policy(ModelConfig(**TINY_MODEL), countdown.ALPHABET)
    # a policy that stops early and at different lengths: half the vocabulary ends a completion
    stopping = dataclasses.replace(policy, stop_token_ids=tuple(range(3, policy.tokenizer.vocab_size, 2)))
    return train_set, policy, stopping


def _sample(policy, train_set, decode, seeds=(5,), prompts=6, k=4, length=16):
    texts = [p.prompt_text() for p in train_set[:prompts]] * len(seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    return generate(policy, texts, k, length, 1.0, gens[0] if len(gens) == 1 else gens, prompt_width=14,
                    decode=decode)


def _same(a, b, logp_tol: float = 0.0):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.finished, b.finished) and a.completion_text == b.completion_text
    diff = float((a.logp_behav - b.logp_behav).abs().max())
    assert diff <= logp_tol, diff


def test_decode_defaults_by_device_and_bad_modes():
    assert default_decode("cpu") == DecodeOptions()  # the eager loop: today's CPU numbers
    cuda = default_decode("cuda")
    assert cuda.static_cache and cuda.compile and cuda.check_every == sampling.CUDA_CHECK_EVERY
    assert default_decode("cpu", "compiled") == DecodeOptions(static_cache=True, compile=True)
    assert default_decode("cuda", "eager") == DecodeOptions(check_every=sampling.CUDA_CHECK_EVERY)
    with pytest.raises(ValueError, match="--decode must be one of auto, eager, static, compiled, got 'fast'"):
        default_decode("cpu", "fast")
    with pytest.raises(ValueError, match="--decode must be one of"):
        HFSampler(decode="fast")
    with pytest.raises(ValueError, match="compile needs static_cache"):
        DecodeOptions(compile=True)
    assert make_generator("cpu", 3).device.type == "cpu" and loss_library("cpu") == "numpy"
    assert make_generator("cuda", 3).device.type == "cuda" if torch.cuda.is_available() else True
    assert loss_library("cuda") == "torch"
    assert [sampling.padded_rows(n) for n in (1, 8, 9, 64, 65, 512)] == [8, 8, 16, 64, 128, 512]


def test_race_draw_is_multinomials_draw_on_the_cpu():
    """The device path's draw (exponential race) gives torch.multinomial's tokens from the same generator states."""
    probs = torch.softmax(torch.randn(48, 30, generator=torch.Generator().manual_seed(0)), -1)  # (N, V)
    probs[:, :5] = 0.0  # truncated tokens (top-k) are never drawn
    for blocks in (1, 3):
        gens_a = [torch.Generator().manual_seed(10 + i) for i in range(blocks)]
        gens_b = [torch.Generator().manual_seed(10 + i) for i in range(blocks)]
        for _ in range(5):
            a = draw_tokens(probs, gens_a, 48 // blocks, race=False)
            b = draw_tokens(probs, gens_b, 48 // blocks, race=True)
            assert torch.equal(a, b) and int(b.min()) >= 5


def test_device_sampling_path_gives_todays_samples(setup):
    """The race draw with the finished flags read every 4 tokens: the same rollouts as the CPU loop, on a policy
    whose completions stop at different lengths (the trimmed width included)."""
    train_set, policy, stopping = setup
    for pol in (policy, stopping):
        reference = _sample(pol, train_set, DecodeOptions())
        for check_every in (1, 4, 7):
            _same(reference, _sample(pol, train_set, DecodeOptions(race=True, check_every=check_every)))
    short = _sample(stopping, train_set, DecodeOptions())
    assert int(short.completion_mask.sum(1).min()) < int(short.completion_mask.sum(1).max())  # ragged lengths


def test_static_cache_matches_the_dynamic_cache(setup):
    """The static KV cache (rows padded to a power of two, width prompt + L), eager step: the same tokens, log-probs
    within float32 rounding; a seed-stacked policy with two generators too."""
    train_set, policy, stopping = setup
    static = DecodeOptions(static_cache=True, race=True, check_every=4)
    for pol in (policy, stopping):
        _same(_sample(pol, train_set, DecodeOptions(), prompts=5), _sample(pol, train_set, static, prompts=5),
              STATIC_TOL)  # 20 rows: padded to 32
    stacked = stack_policy(policy, 2)
    _same(_sample(stacked, train_set, DecodeOptions(), seeds=(5, 6)),
          _sample(stacked, train_set, static, seeds=(5, 6)), STATIC_TOL)


@pytest.mark.slow
def test_compiled_step_is_compiled_once_and_reused_across_models(setup):
    """torch.compile (inductor on the CPU) of the static decoder's step: equal to the eager step within float32
    rounding; a second model object of the same architecture (another run of a verify) reuses the compiled step
    (no compile time added) and samples from its own weights."""
    train_set, policy, _ = setup
    sampling.release_decoders()
    compiled = DecodeOptions(static_cache=True, compile=True)
    first = _sample(policy, train_set, compiled)
    spent = sampling.compile_seconds()
    assert spent > 0
    _same(_sample(policy, train_set, DecodeOptions(static_cache=True)), first, STATIC_TOL)
    other = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    with torch.no_grad():
        for p in other.model.parameters():
            p.mul_(1.5)  # different weights, same architecture
    again = _sample(other, train_set, compiled)
    assert sampling.compile_seconds() == spent  # the compiled step was reused
    _same(_sample(other, train_set, DecodeOptions()), again, STATIC_TOL)
    assert not torch.equal(again.completion_ids, first.completion_ids)
    assert len(sampling._DECODERS) == 2 and all(d.fallback is None for d in sampling._DECODERS.values())
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for prompts, length in ((20, 16), (5, 24)):  # new rows and widths: graphs recorded, nothing compiled again
        _same(_sample(policy, train_set, DecodeOptions(), prompts=prompts, length=length),
              _sample(policy, train_set, compiled, prompts=prompts, length=length), STATIC_TOL)
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("where", ["torch.compile", "first call"])
def test_compile_failure_falls_back_with_one_line(setup, monkeypatch, capsys, where):
    """Without a working torch.compile (refused outright, or failing in its first call after the cache was written),
    the loop says so once, in one line, and decodes eagerly on the static cache with the eager step's numbers."""
    train_set, policy, _ = setup
    sampling.release_decoders()

    def broken_compile(fn, **kwargs):
        if where == "torch.compile":
            raise RuntimeError("no C compiler\nfound")

        def failing(*args):
            fn(*args)  # writes the cache and advances its position, then fails as a compile error at first call would
            raise RuntimeError("InductorError: compilation failed")
        return failing

    monkeypatch.setattr(torch, "compile", broken_compile)
    out = _sample(policy, train_set, DecodeOptions(static_cache=True, compile=True))
    again = _sample(policy, train_set, DecodeOptions(static_cache=True, compile=True))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch.compile of the decode step is unavailable" in err
    assert "decoding eagerly on the static KV cache" in err and "RuntimeError" in err
    reference = _sample(policy, train_set, DecodeOptions(static_cache=True))
    _same(reference, out)
    _same(reference, again)
    sampling.release_decoders()


@pytest.mark.parametrize("loss,buffer,micro", [("grpo", "fifo", 0), ("grpo", "fifo", 16), ("rloo", "on-policy", 0),
                                               ("m2po", "fifo", 0)])
def test_update_with_torch_losses_equals_the_numpy_update(setup, loss, buffer, micro):
    """The update CUDA runs (torch loss on the device) against the CPU's (numpy loss): the logged loss and metrics
    to 1e-9, every parameter after the AdamW step to 1e-6."""
    train_set, policy, _ = setup
    config = RLConfig(steps=1, rollouts_per_step=32, group_size=8, batch_size=32, capacity=64, buffer=buffer,
                      loss=loss, max_new_tokens=12, micro_batch_size=micro, lr=1e-3, tau_m2=0.0001).validated()
    batch, _ = generate_batch(policy, train_set, np.arange(4), config, 0, 0, torch.Generator().manual_seed(2))
    rng = np.random.default_rng(0)
    batch.logp_behav[:] += rng.normal(0, 0.3, batch.logp_behav.shape)  # stale: the clip binds
    batch.advantage[:] = rng.normal(0, 1, batch.advantage.shape)  # the random model's rewards are all 0
    results = {}
    for library in ("numpy", "torch"):
        pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        pol.model.train()
        optimizer = torch.optim.AdamW(pol.model.parameters(), lr=config.lr)
        logp, out = update_step(pol, optimizer, train_set, config, batch, library=library)
        results[library] = (logp, out, [p.detach().clone() for p in pol.model.parameters()])
    (logp_n, out_n, params_n), (logp_t, out_t, params_t) = results["numpy"], results["torch"]
    assert torch.equal(logp_n, logp_t)
    np.testing.assert_allclose(out_t.loss, out_n.loss, rtol=0, atol=1e-9)
    for key, value in out_t.metrics.items():
        np.testing.assert_allclose(value, np.asarray(out_n.metrics[key], float), rtol=0, atol=1e-9, err_msg=key)
    assert max(float((a - b).abs().max()) for a, b in zip(params_n, params_t)) <= 1e-6
    moved = max(float((a - b.detach()).abs().max()) for a, b in zip(params_n, policy.model.parameters()))
    assert moved > 1e-4  # the step did move the weights
    with pytest.raises(ValueError, match="library must be one of numpy, torch"):
        update_step(policy, torch.optim.AdamW(policy.model.parameters()), train_set, config, batch, library="jax")


def test_torch_update_refuses_non_finite_log_probs_before_the_step(setup):
    train_set, policy, _ = setup
    config = RLConfig(steps=1, rollouts_per_step=16, group_size=8, batch_size=16, capacity=16, buffer="on-policy",
                      max_new_tokens=8).validated()
    batch, _ = generate_batch(policy, train_set, np.arange(2), config, 0, 0, torch.Generator().manual_seed(2))
    batch.logp_behav[0, 0, 0] = np.nan  # a corrupt buffer row: the numpy loss refuses it, so must the torch one
    pol = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    before = [p.detach().clone() for p in pol.model.parameters()]
    for library in ("numpy", "torch"):
        with pytest.raises(ValueError, match="must be finite on real"):
            update_step(pol, torch.optim.AdamW(pol.model.parameters()), train_set, config, batch, library=library)
    assert all(torch.equal(a, b) for a, b in zip(before, pol.model.parameters()))  # no step was taken


def test_sampler_decode_option_reaches_generate(setup, monkeypatch):
    train_set, policy, _ = setup
    seen = []
    real = sampling.generate

    def spy(*args, **kwargs):
        seen.append(kwargs["decode"])
        return real(*args, **kwargs)

    monkeypatch.setattr("replay_theory.validate.engines.generate", spy)
    make_sampler("hf", decode="static").generate(policy, ["nums 1 2 3 target 6 ="], 2, 4, 1.0,
                                                  torch.Generator().manual_seed(0))
    HFSampler().generate(policy, ["nums 1 2 3 target 6 ="], 2, 4, 1.0, torch.Generator().manual_seed(0))
    assert seen == [DecodeOptions(static_cache=True), DecodeOptions()]


@pytest.mark.slow
def test_seed_stacked_model_through_the_compiled_step(setup):
    """verify --batched on a GPU: a design's seeds as one stacked model through the compiled static step; each seed's
    rows equal the eager loop's (tokens; log-probs within float32 rounding), padding split per seed (12 rows -> 16)."""
    train_set, policy, stopping = setup
    stacked = stack_policy(stopping, 3)
    with torch.no_grad():
        for s, p in enumerate(p for p in stacked.model.parameters()):
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(s)))  # the seeds differ
    reference = _sample(stacked, train_set, DecodeOptions(), seeds=(5, 6, 7), prompts=3)
    compiled = _sample(stacked, train_set, DecodeOptions(static_cache=True, compile=True, race=True, check_every=4),
                       seeds=(5, 6, 7), prompts=3)
    _same(reference, compiled, STATIC_TOL)
    decoder = next(d for d in sampling._DECODERS.values() if d.options.compile and d.fallback is None
                   and type(d.model.lm_head).__name__ == "SeedLinear")
    assert any(rows == 48 and width % sampling.WIDTH_STEP == 16 % sampling.WIDTH_STEP for rows, width in
               decoder.warm)  # 3 seeds x 12 rows, each padded to 16; width a multiple of 16 plus L = 16
