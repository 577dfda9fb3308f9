"""The model sections of bench/gpu_check.py (4 mu, 5 decode, 6 log-prob mismatch), each run by
``gpu_check.py --worker NAME`` in a subprocess; see bench/gpu_check.py for what they measure."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from gpu_check_plan import WORKER_SECTIONS, Plan, Shape, one_line, write_json


def _sync(device) -> None:
    """Wait for queued CUDA work, so a timer around it measures the work and not its launch."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None


def _reset_peak(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _free(device) -> None:
    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _full_vocab_tokenizer(alphabet: str, vocab_size: int):
    """Countdown's character tokenizer for the prompts, with a model vocabulary of ``vocab_size`` ids.

    A random-weight model samples any of the ``vocab_size`` ids; decoding folds an id past the alphabet onto it
    (the texts, and so the rewards, are noise either way: only the shapes and the timings matter here).
    """
    import torch

    from replay_theory.validate.tokenizer import CharTokenizer

    class FullVocabTokenizer(CharTokenizer):
        def __init__(self):
            super().__init__(alphabet)
            self.num_special = super().vocab_size - len(alphabet)
            if vocab_size < super().vocab_size:
                raise ValueError(f"vocab_size {vocab_size} is below the alphabet's {super().vocab_size} ids")
            self._vocab = vocab_size

        @property
        def vocab_size(self) -> int:
            return self._vocab

        def decode(self, ids: Sequence[int] | torch.Tensor, skip_special: bool = True) -> str:
            values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
            n, k = len(self.alphabet), self.num_special
            return super().decode([i if i < k else k + (i - k) % n for i in values], skip_special)

    return FullVocabTokenizer()


def build_policy(shape: Shape, device: str, *, dtype: str | None = None, compute_dtype: str | None = None,
                 seed: int = 0):
    """A ``validate.policy.Policy`` around a random-weight Qwen2 of ``shape`` that never stops early.

    ``stop_token_ids=(-1,)``: no sampled id is -1, so every completion runs to max_new_tokens (fixed length).
    Precision as ``ModelConfig``: ``dtype`` None = fp32 master weights, ``compute_dtype`` None = bf16 autocast on
    CUDA. On the CPU (smoke) ``Policy.autocast`` is a no-op by design; a subclass turns CPU bf16 autocast on when a
    compute dtype below the weights' is asked, so the smoke run goes through the same bf16 arithmetic paths.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from replay_theory.validate import countdown
    from replay_theory.validate.policy import ModelConfig, Policy, resolve_compute_dtype, resolve_dtype

    tokenizer = _full_vocab_tokenizer(countdown.ALPHABET, shape.vocab_size)
    hf_config = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size, max_position_embeddings=4096, tie_word_embeddings=True,
        use_sliding_window=False, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    config = ModelConfig(source="tiny", hidden_size=shape.hidden_size, num_layers=shape.num_layers,
                         num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                         intermediate_size=shape.intermediate_size, max_position_embeddings=4096, device=device,
                         dtype=dtype, compute_dtype=compute_dtype, seed=seed)
    torch_device = torch.device(device)
    with torch.random.fork_rng(devices=[torch_device] if torch_device.type == "cuda" else []):
        torch.manual_seed(seed)  # random weights, reproducible, without touching anyone's global stream
        try:
            with torch_device:  # initialise on the GPU: a 1.5B model's init on the CPU takes tens of seconds
                model = Qwen2ForCausalLM(hf_config)
        except Exception:  # noqa: BLE001 - some transformers versions initialise on the CPU only
            # transformers' to() is @wraps(torch.nn.Module.to): its stub is the unbound function, which wants self
            model = Qwen2ForCausalLM(hf_config).to(torch_device)  # pyright: ignore[reportArgumentType]
    model = model.to(dtype=resolve_dtype(config)).eval()  # pyright: ignore[reportCallIssue]  - to()'s stub, above

    cls = Policy
    if torch_device.type == "cpu":

        @dataclasses.dataclass
        class CpuAutocastPolicy(Policy):
            def autocast(self):
                compute = resolve_compute_dtype(self.config)
                enabled = compute != next(self.model.parameters()).dtype
                return torch.autocast(device_type="cpu", dtype=compute, enabled=enabled)

        cls = CpuAutocastPolicy
    return cls(model=model, tokenizer=tokenizer, device=torch_device, config=config, stop_token_ids=(-1,))


def _problems(plan: Plan):
    from replay_theory.validate import countdown

    train, _ = countdown.make_splits(max(plan.rollouts, 64), 1, seed=0)
    return train


def decode_options(plan: Plan):
    """How sections 4-6 decode: what validate runs on CUDA (``default_decode("cuda")``: static cache, compiled step,
    all-finished read every 8 tokens, the exponential-race draw), with the plan's compile backend (smoke: eager)."""
    from replay_theory.validate.sampling import CUDA_CHECK_EVERY, DecodeOptions

    return DecodeOptions(static_cache=True, compile=True, check_every=CUDA_CHECK_EVERY, race=True,
                         compile_backend=plan.compile_backend)


def _timed_sampler(plan: Plan):
    """``HFSampler`` decoding with ``decode_options(plan)`` that also times its ``generate`` calls (the sampling-only
    part of the generation side, less the compiling of new shapes, which ``compile_s`` holds)."""
    from replay_theory.validate import sampling
    from replay_theory.validate.engines import HFSampler

    options = decode_options(plan)

    class TimedSampler(HFSampler):
        seconds = 0.0
        compile_s = 0.0

        def generate(self, policy, prompts, num_samples, max_new_tokens, temperature, generator, *,
                     prompt_width=None):
            _sync(plan.device)
            start, compiled = time.perf_counter(), sampling.compile_seconds()
            rollouts = sampling.generate(policy, prompts, num_samples, max_new_tokens, temperature, generator,
                                         prompt_width=prompt_width, decode=options)
            _sync(plan.device)
            compiling = sampling.compile_seconds() - compiled
            self.compile_s += compiling
            self.seconds += time.perf_counter() - start - compiling
            return rollouts

    return TimedSampler()


def micro_batch_for(plan: Plan, length: int) -> int:
    """Completions per forward/backward chunk of the update: <= tokens_per_micro_batch completion tokens, 0 (the
    whole batch) when R of them fit."""
    chunk = max(1, plan.tokens_per_micro_batch // length)
    return 0 if chunk >= plan.rollouts else chunk


def worker_mu(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 4: per shape and length, one generation step and one update step of the validator's own code."""
    import numpy as np
    import torch

    from replay_theory.validate import sampling
    from replay_theory.validate.rl import RLConfig, generate_batch, make_generator, update_step

    problems = _problems(plan)
    R, G = plan.rollouts, plan.group_size
    index = np.arange(R // G)  # R / G prompts x G samples
    result: dict[str, Any] = {"rollouts": R, "group_size": G, "precision": "fp32 weights, bf16 autocast on CUDA "
                              "(validate's default; the decoder a bf16 copy); fp32 on the CPU",
                              "loop": f"{decode_options(plan)}; generators on the device; torch losses", "cases": []}

    def rl_config(length: int) -> RLConfig:
        return RLConfig(steps=1, rollouts_per_step=R, group_size=G, batch_size=R, capacity=R, buffer="on-policy",
                        max_new_tokens=length, micro_batch_size=micro_batch_for(plan, length), lr=1e-6).validated()

    def one_case(policy, optimizer, length: int) -> dict:
        config = rl_config(length)
        sampler = _timed_sampler(plan)
        generator = make_generator(plan.device, length)  # on the device on CUDA, as validate's loop now samples
        _reset_peak(plan.device)
        policy.model.eval()
        _sync(plan.device)
        start, compiled = time.perf_counter(), sampling.compile_seconds()
        batch, _ = generate_batch(policy, problems, index, config, 0, 0, generator, sampler)
        _sync(plan.device)
        compile_s = sampling.compile_seconds() - compiled  # a new decode shape: compiled or its graph recorded
        generation_s = time.perf_counter() - start - compile_s  # as RLResult.mu_timing charges it
        policy.model.train()
        start = time.perf_counter()
        update_step(policy, optimizer, problems, config, batch, library="torch")  # the loss on the device
        _sync(plan.device)
        update_s = time.perf_counter() - start
        policy.model.eval()
        tokens = int(batch.mask.sum())
        return {"generation_s": generation_s, "sampling_s": sampler.seconds, "update_s": update_s,
                "compile_s": compile_s, "mu": generation_s / update_s,  # (gen s / R) / (update s / R)
                "mu_sampling_only": sampler.seconds / update_s, "completion_tokens": tokens,
                "fixed_length": tokens == R * length, "micro_batch": config.micro_batch_size,
                "sampled_tokens_per_s": tokens / sampler.seconds, "peak_memory_gib": _peak_gib(plan.device)}

    # Short lengths of every shape first, then the longest of every shape (rebuilding the model): when the deadline
    # cuts the section, what is lost is the longest case of the largest shape, not a whole shape.
    passes = [(shape, plan.lengths[:-1]) for shape in plan.shapes] + [(shape, plan.lengths[-1:])
                                                                        for shape in plan.shapes]
    seconds_per_token: dict[str, float] = {}  # per shape, from its last finished case: predicts the next one

    def too_late(shape: Shape, length: int, extra_s: float = 0.0) -> str | None:
        """Why a case cannot finish before the deadline (None if it can): a case killed halfway gives nothing."""
        left = deadline - time.time()
        predicted = 1.15 * seconds_per_token.get(shape.name, 0.0) * length + extra_s
        if left < max(plan.min_case_s, predicted):
            return f"skipped: deadline ({left:.0f} s left, about {max(plan.min_case_s, predicted):.0f} s needed)"
        return None

    for shape, lengths in passes:
        if not lengths:
            continue
        why = too_late(shape, min(lengths), extra_s=plan.min_case_s)  # + building the model and its warm-up
        if why:
            for length in lengths:
                result["cases"].append({"shape": shape.name, "length": length, "status": why})
            emit(result)
            continue
        start = time.perf_counter()
        policy = build_policy(shape, plan.device)
        optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-6)
        build_s = time.perf_counter() - start
        params = sum(p.numel() for p in policy.model.parameters())
        print(f"[mu] {shape.name}: {params / 1e6:.0f} M parameters, built in {build_s:.1f} s", file=sys.stderr,
              flush=True)
        try:  # warm-up outside the clock: first calls pay for allocator, cuBLAS and AdamW-state setup
            one_case(policy, optimizer, min(4, min(plan.lengths)))  # 4 tokens: the setup, not the length
        except Exception as err:  # noqa: BLE001 - recorded; the timed cases below say whether it persists
            print(f"[mu] warm-up failed: {one_line(err)}", file=sys.stderr, flush=True)
        _free(plan.device)
        for length in lengths:
            case: dict[str, Any] = {"shape": shape.name, "parameters": params, "length": length, "rollouts": R}
            why = too_late(shape, length)
            if why:
                case["status"] = why
            else:
                try:
                    case.update(one_case(policy, optimizer, length), status="ok")
                    seconds_per_token[shape.name] = (case["generation_s"] + case["update_s"]) / length
                    print(f"[mu] {shape.name} L={length}: generation {case['generation_s']:.2f} s (sampling "
                          f"{case['sampling_s']:.2f} s), update {case['update_s']:.2f} s, mu {case['mu']:.2f}, "
                          f"peak {case['peak_memory_gib'] or 0:.1f} GiB", file=sys.stderr, flush=True)
                except Exception as err:  # noqa: BLE001 - e.g. out of memory at 512: the other cases still run
                    case["status"] = f"error: {one_line(err)}"
                    print(f"[mu] {shape.name} L={length}: {case['status']}", file=sys.stderr, flush=True)
                _free(plan.device)
            result["cases"].append(case)
            emit(result)
        del policy, optimizer
        sampling.release_decoders()  # the shape's decoder (its weights, caches and graphs) goes with it
        _free(plan.device)
    return result


def _token_stats(a, b, mask) -> dict:
    """max and mean |a - b| over the completion tokens (mask 1), and the max |difference| of their sums per row."""
    diff = (a.float() - b.float()).abs() * mask  # (N, L)
    seq = ((a.float() - b.float()) * mask).sum(1).abs()  # (N,): sequence log-ratio error (RLOO Eq. (2))
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.sum() / mask.sum()), "seq_max_abs": float(seq.max()),
            "tokens": int(mask.sum())}


def worker_logprob_mismatch(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 6: the sampler's logp_behav against ``sequence_logprobs`` in bf16 and in fp32, same tokens."""
    import torch

    from replay_theory.validate.logprobs import sequence_logprobs
    from replay_theory.validate.sampling import generate

    shape, length = plan.shapes[0], plan.mismatch_tokens
    R, G = plan.rollouts, plan.group_size
    policy_bf16 = build_policy(shape, plan.device, compute_dtype="bfloat16")  # fp32 weights, bf16 autocast
    policy_fp32 = dataclasses.replace(policy_bf16, config=dataclasses.replace(policy_bf16.config,
                                                                               compute_dtype="float32"))
    prompts = [p.prompt_text() for p in _problems(plan)[: R // G]]
    chunk = max(1, plan.tokens_per_micro_batch // length)  # rows per trainer pass: bounds the (rows, L, V) logits

    @torch.no_grad()
    def trainer(policy, rollouts) -> torch.Tensor:  # (N, L) float32
        parts = []
        for a in range(0, rollouts.completion_ids.shape[0], chunk):
            rows = slice(a, a + chunk)
            parts.append(sequence_logprobs(policy, rollouts.prompt_ids[rows], rollouts.prompt_mask[rows],
                                           rollouts.completion_ids[rows], rollouts.completion_mask[rows]))
        return torch.cat(parts)

    result: dict[str, Any] = {"shape": shape.name, "length": length, "rollouts": R, "cases": []}

    def generator():  # on the device: how tokens are drawn does not matter here, and a CPU draw of 151,936 ids
        return torch.Generator(device=policy_bf16.device).manual_seed(1)  # per row and step costs seconds

    decode = decode_options(plan)  # the sampler as validate runs it on CUDA: a bf16 (compute dtype) decoder copy
    result["decode"] = str(decode)
    sampled_bf16 = generate(policy_bf16, prompts, G, length, 1.0, generator(), decode=decode)
    mask = sampled_bf16.completion_mask.float()
    trainer_bf16, trainer_fp32 = trainer(policy_bf16, sampled_bf16), trainer(policy_fp32, sampled_bf16)
    pairs = [("sampler bf16 vs trainer bf16", sampled_bf16.logp_behav, trainer_bf16),
             ("sampler bf16 vs trainer fp32", sampled_bf16.logp_behav, trainer_fp32),
             ("trainer bf16 vs trainer fp32", trainer_bf16, trainer_fp32)]
    for name, a, b in pairs:
        result["cases"].append({"pair": name, "status": "ok", **_token_stats(a, b, mask)})
    emit(result)
    # The control: sampler and trainer both fp32. Only the KV-cached vs full forward's float32 rounding remains.
    sampled_fp32 = generate(policy_fp32, prompts, G, length, 1.0, generator(), decode=decode)
    result["cases"].append({"pair": "sampler fp32 vs trainer fp32 (control)", "status": "ok",
                            **_token_stats(sampled_fp32.logp_behav, trainer(policy_fp32, sampled_fp32),
                                           sampled_fp32.completion_mask.float())})
    result["autocast_bf16"] = _autocast_state(policy_bf16)
    result["autocast_fp32"] = _autocast_state(policy_fp32)
    return result


def _autocast_state(policy) -> str:
    """What ``policy.autocast()`` does, in words: the rule of ``Policy.autocast`` (and of the CPU subclass)."""
    from replay_theory.validate.policy import resolve_compute_dtype

    compute, weights = resolve_compute_dtype(policy.config), next(policy.model.parameters()).dtype
    if compute == weights:
        return f"{str(weights).removeprefix('torch.')} throughout (no autocast)"
    return f"{str(compute).removeprefix('torch.')} autocast over {str(weights).removeprefix('torch.')} weights"


def worker_decode(plan: Plan, deadline: float, emit: Callable[[dict], None]) -> dict:
    """Section 5: tokens/s of the validator's loop as it runs on CUDA (compiled), of its eager forms (the loop before
    issue 31 with a CPU generator, and with a CUDA one), and of transformers' generate (dynamic cache, static cache,
    static cache + torch.compile: the compiled reference); the loop's ratio to the reference."""
    import torch
    from transformers import GenerationConfig

    from replay_theory.validate import sampling
    from replay_theory.validate.logprobs import encode_prompts
    from replay_theory.validate.sampling import DecodeOptions, generate

    shape, length = plan.shapes[0], plan.decode_tokens
    R, G = plan.rollouts, plan.group_size
    # bf16 weights: a static cache takes the model's dtype, and the project's loop then runs the same arithmetic
    # (ModelConfig(dtype="bfloat16"): compute dtype = weights' dtype, no autocast).
    policy = build_policy(shape, plan.device, dtype="bfloat16")
    model, device = policy.model, policy.device
    prompts = [p.prompt_text() for p in _problems(plan)[: R // G]]
    prompt_ids, prompt_mask = encode_prompts(policy, prompts)  # (R / G, P) left-padded
    prompt_ids = prompt_ids.repeat_interleave(G, dim=0)  # (R, P): the rows the project's loop samples
    prompt_mask = prompt_mask.repeat_interleave(G, dim=0)
    old_length = min(length, 16)  # the loop before issue 31 draws on the host: ~140 tokens/s at 0.5B on an H200
    result: dict[str, Any] = {"shape": shape.name, "length": length, "rollouts": R, "weights": "bfloat16",
                              "old_loop_length": old_length, "cases": []}

    def timed(fn, *args, **kwargs) -> float:
        _sync(device)
        start = time.perf_counter()
        fn(*args, **kwargs)
        _sync(device)
        return time.perf_counter() - start

    def hf_config(new_tokens: int, **extra) -> GenerationConfig:
        # min_new_tokens = max_new_tokens: fixed length, as in the project's loop with no stop token
        return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, pad_token_id=policy.tokenizer.pad_token_id,
                                eos_token_id=policy.tokenizer.eos_token_id, **extra)

    def hf_generate(new_tokens: int, **extra):
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                             generation_config=hf_config(new_tokens, **extra))
        if out.shape[1] - prompt_ids.shape[1] != new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - prompt_ids.shape[1]} new tokens, not {new_tokens}")
        return out

    def project(generator_device: str, decode: DecodeOptions):
        def run(new_tokens: int):
            generator = torch.Generator(device=generator_device).manual_seed(0)
            rollouts = generate(policy, prompts, G, new_tokens, 1.0, generator, decode=decode)
            if rollouts.completion_ids.shape[1] != new_tokens:
                raise RuntimeError(f"the loop returned {rollouts.completion_ids.shape[1]} tokens, not {new_tokens}")
        return run

    cuda = torch.device(device).type == "cuda"
    compile_config = _reference_compile_config(cuda)
    compile_name = f"torch.compile(backend={compile_config.backend}, mode={compile_config.mode})"
    ours = decode_options(plan)
    eager_device = DecodeOptions(check_every=ours.check_every, race=True)
    LOOP = "validator's loop as validate runs it on CUDA (static cache, compiled step, device generator)"
    REFERENCE = f"transformers generate, static cache + {compile_name}"
    variants = [  # (name, run(new_tokens), tokens per call, compiles?, skip reason)
        ("validator's loop before issue 31 (eager, CPU generator)", project("cpu", DecodeOptions()), old_length,
         False, None),
        ("validator's loop, eager, CUDA generator", project(str(device), eager_device), length, False,
         None if cuda else "skipped: CPU run (the generator already lives on the device)"),
        ("transformers generate, dynamic cache", lambda n: hf_generate(n, disable_compile=True), length, False, None),
        ("transformers generate, static cache", lambda n: hf_generate(n, cache_implementation="static",
                                                                      disable_compile=True), length, False, None),
        (LOOP, project(str(device) if cuda else "cpu", ours), length, True, None),
        (REFERENCE, lambda n: hf_generate(n, cache_implementation="static", compile_config=compile_config), length,
         True, None),
    ]
    rates: dict[str, float] = {}
    for name, fn, new_tokens, compiles, skip in variants:
        case: dict[str, Any] = {"variant": name, "tokens_per_call": R * new_tokens}
        result["cases"].append(case)  # updated in place: a kill mid-case keeps what finished
        left = deadline - time.time()
        need = plan.min_case_s * (3 if compiles else 1)  # a compile needs far more than one plain case
        if skip or left < need:
            case["status"] = skip or f"skipped: deadline ({left:.0f} s left, about {need:.0f} s needed)"
        else:
            try:
                seconds = _time_decode_case(case, fn, new_tokens, compiles, timed, partial(emit, result))
                if compiles:  # transformers keeps its compiled forward as model._compiled_call (5.x)
                    case["compiled"] = hasattr(model, "_compiled_call") if name == REFERENCE else _loop_compiled()
                case.update(status="ok", seconds=seconds, tokens_per_s=R * new_tokens / seconds)
                rates[name] = case["tokens_per_s"]
            except Exception as err:  # noqa: BLE001 - one variant's failure leaves the others
                case["status"] = f"error: {one_line(err)}"
            _free(device)
        print(f"[decode] {name}: {case.get('status')} {case.get('tokens_per_s', 0):,.0f} tokens/s", file=sys.stderr,
              flush=True)
        emit(result)
    _add_decode_ratios(result, rates, variants[0][0], LOOP, REFERENCE)
    sampling.release_decoders()
    return result


def _reference_compile_config(cuda: bool):
    """transformers' CompileConfig of the compiled reference: inductor + CUDA graphs on a GPU; on the CPU (smoke) the
    eager backend, which still goes through dynamo (inductor on a 2-core CPU takes minutes)."""
    from transformers import CompileConfig

    if cuda:
        return CompileConfig(mode="reduce-overhead")
    # the stubs are narrower than the code: torch.compile takes mode=None (its default), and generate() reads
    # _compile_all_devices (declared `= None`, so typed None) as a bool
    compile_config = CompileConfig(backend="eager", mode=None)  # pyright: ignore[reportArgumentType]
    compile_config._compile_all_devices = True  # pyright: ignore[reportAttributeAccessIssue]  - compile off-GPU
    return compile_config


def _time_decode_case(case: dict, fn: Callable[[int], Any], new_tokens: int, compiles: bool,
                      timed: Callable[..., float], checkpoint: Callable[[], None]) -> float:
    """Seconds of one call of ``fn(new_tokens)``: after a short warm-up call, or for a compiling variant the faster of
    two steady calls after the first (compiling) one, whose time ``case`` records apart."""
    if not compiles:
        timed(fn, min(4, new_tokens))  # warm-up: kernels, allocator
        return timed(fn, new_tokens)
    case["status"] = "error: killed during the first (compiling) call"
    checkpoint()
    case["first_call_s"] = timed(fn, new_tokens)  # compiles (and records the CUDA graphs)
    case["status"] = "error: killed during the steady calls"
    checkpoint()
    steady = [timed(fn, new_tokens) for _ in range(2)]
    seconds = min(steady)
    case.update(steady_calls_s=steady, compile_s=case["first_call_s"] - seconds)
    return seconds


def _loop_compiled() -> bool:
    """Whether the validator's compiled decoder (``sampling._DECODERS``) exists and compiled its step."""
    from replay_theory.validate import sampling

    decoder = next((d for d in sampling._DECODERS.values() if d.options.compile), None)
    return decoder is not None and decoder.compiled


def _add_decode_ratios(result: dict, rates: dict[str, float], old_loop: str, loop: str, reference: str) -> None:
    """Each case's speed-up over the old loop, and the loop's tokens/s and its ratio to the compiled reference."""
    old = rates.get(old_loop)
    for case in result["cases"]:
        if old and "tokens_per_s" in case:
            case["speedup_vs_old_loop"] = case["tokens_per_s"] / old
    if loop in rates and reference in rates:
        result["loop_over_compiled_reference"] = rates[loop] / rates[reference]  # target >= 0.7
    if loop in rates:
        result["loop_tokens_per_s"] = rates[loop]  # target >= 10,000 at the 0.5B shape, R = 64, L = 128


WORKERS: dict[str, Callable[[Plan, float, Callable[[dict], None]], dict]] = {
    "mu": worker_mu, "decode": worker_decode, "logprob_mismatch": worker_logprob_mismatch}


def worker_main(argv: list[str]) -> int:
    """``gpu_check.py --worker NAME --plan FILE --result FILE --deadline-at EPOCH_S``: one model section."""
    parser = argparse.ArgumentParser(prog="gpu_check.py --worker")
    parser.add_argument("name", choices=WORKER_SECTIONS)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--deadline-at", type=float, required=True)
    args = parser.parse_args(argv)
    raw = json.loads(Path(args.plan).read_text())
    raw["shapes"] = tuple(Shape(**s) for s in raw["shapes"])
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}  # JSON values
    plan = Plan(**fields)
    import torch

    torch.set_num_threads(plan.threads)
    result_path = Path(args.result)
    result: dict[str, Any] = {}

    def emit(partial: dict) -> None:  # after every case: a later crash or kill keeps what finished
        write_json(result_path, {**partial, "status": "partial: running"})

    try:
        result = WORKERS[args.name](plan, args.deadline_at, emit)
        failed = [c for c in result.get("cases", []) if str(c.get("status", "")).startswith("error")]
        result["status"] = (f"error: {len(failed)} of {len(result['cases'])} cases failed: {failed[0]['status'][7:]}"
                            if failed else "ok")
    except Exception as err:  # noqa: BLE001 - the section's one-line error, with what finished before it
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {}
        result["status"] = f"error: {one_line(err)}"
    write_json(result_path, result)
    return 0
