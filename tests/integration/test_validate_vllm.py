"""The vLLM rollout engine's adapter, tested with a fake ``vllm`` module (no GPU, no vLLM here).

What is checked: the exact LLM / SamplingParams arguments, the conversion of vLLM's
RequestOutput shape into the tensors the trainer reads (token ids, per-token behaviour
log-probs, masks, finished flags, texts, prompts), the weight sync call, the engine choice
and its one-line errors, and -- with a fake engine that samples with the HF loop -- that
``validate.rl.train`` drives the engine through the same code (sync every k steps).
What is NOT checked (impossible here): real vLLM generation, its kernels, and the real
``load_weights`` of a vLLM model.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown, vllm_engine  # noqa: E402
from replay_theory.validate.engines import HFSampler, resolve_engine  # noqa: E402
from replay_theory.validate.logprobs import encode_prompts, sequence_logprobs  # noqa: E402
from replay_theory.validate.policy import ModelConfig, Policy, load_policy  # noqa: E402
from replay_theory.validate.rl import RLConfig, train  # noqa: E402
from replay_theory.validate.sampling import generate  # noqa: E402
from replay_theory.validate.vllm_engine import VLLMSampler, load_weights_into_vllm  # noqa: E402


def _fake_vllm(generate_fn, fail_logprobs_mode: bool = False) -> types.ModuleType:
    """A stand-in ``vllm`` module: LLM records its arguments, weight loads and prefix-cache resets."""
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # importlib.util.find_spec needs one
    module.__version__ = "0.0.fake"

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.__dict__.update(kwargs)

    class LLM:
        def __init__(self, **kwargs):
            if fail_logprobs_mode and "logprobs_mode" in kwargs:
                raise TypeError("EngineArgs.__init__() got an unexpected keyword argument 'logprobs_mode'")
            self.kwargs = kwargs
            self.loaded: list[list[tuple[str, torch.Tensor]]] = []
            self.prefix_resets = 0
            self.requests: list = []
            self.params: list = []
            runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda w: self.loaded.append(list(w))))
            self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
                model_runner=runner)))

        def reset_prefix_cache(self):
            self.prefix_resets += 1

        def generate(self, requests, params, use_tqdm=True):
            self.requests.append(requests)
            self.params.append(params)
            return generate_fn(self, requests, params)

    module.LLM = LLM
    module.SamplingParams = SamplingParams
    return module


def _output(token_ids, logps, finish_reason, extra_entry=True):
    """One RequestOutput with one CompletionOutput, vLLM's shape: logprobs = one {token_id: Logprob} per token."""
    entries = []
    for token, lp in zip(token_ids, logps):
        entry = {token: SimpleNamespace(logprob=lp, rank=1, decoded_token=None)}
        if extra_entry:  # a top-1 alternative that is not the sampled token: must be ignored
            entry[token + 1000] = SimpleNamespace(logprob=-9.0, rank=2, decoded_token=None)
        entries.append(entry)
    completion = SimpleNamespace(index=0, text="", token_ids=tuple(token_ids), logprobs=entries,
                                 cumulative_logprob=None, finish_reason=finish_reason, stop_reason=None)
    return SimpleNamespace(request_id="0", prompt=None, prompt_token_ids=None, outputs=[completion], finished=True)


@pytest.fixture
def install(monkeypatch):
    """Put a fake vllm into sys.modules for one test; the engine's env variable starts unset."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)

    def put(module):
        monkeypatch.setitem(sys.modules, "vllm", module)
        return module

    return put


def test_adapter_builds_the_exact_trainer_tensors(policy, install):
    tok = policy.tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a = tok.encode("1+2")  # 3 ids
    b = tok.encode("7*3=")  # 4 ids: cut at max_tokens
    c = tok.encode("9")

    def script(llm, requests, params):
        rows = []
        for r in range(len(requests)):
            if r % 3 == 0:  # stopped on EOS (vLLM keeps the stop token)
                rows.append(_output(a + [eos], [-0.5, -0.25, -0.125, -1.0], "stop"))
            elif r % 3 == 1:  # ran into max_tokens
                rows.append(_output(b, [-2.0, -0.75, -0.5, -0.25], "length"))
            else:  # tokens after a stop token are dropped, as in the HF loop
                rows.append(_output(c + [eos] + c, [-0.0625, -3.0, -4.0], "stop"))
        return rows

    fake = install(_fake_vllm(script))
    sampler = VLLMSampler("/ckpt/warm_start", seed=3)
    llm = sampler.llm
    assert llm.kwargs == {"model": "/ckpt/warm_start", "dtype": "bfloat16", "seed": 3, "gpu_memory_utilization": 0.3,
                          "skip_tokenizer_init": True, "enable_prefix_caching": True, "enforce_eager": False,
                          "logprobs_mode": "processed_logprobs", "generation_config": "vllm"}
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # in-process engine: weights can be synced

    prompts = ["nums 1 2 target 3 =", "nums 4 5 target 9 ="]
    out = sampler.generate(policy, prompts, 3, 4, 0.7, torch.Generator().manual_seed(11))

    # requests: the trainer's own token ids (BOS included), prompt-major, one request per completion
    seqs = [tok.encode(p, add_bos=True) for p in prompts]
    assert llm.requests[0] == [{"prompt_token_ids": seqs[i]} for i in range(2) for _ in range(3)]
    seeds = torch.randint(0, 2**31 - 1, (6,), generator=torch.Generator().manual_seed(11)).tolist()
    assert [p.seed for p in llm.params[0]] == seeds  # one seed per row, from the run's generator
    for p in llm.params[0]:
        assert p.kwargs == {"n": 1, "temperature": 0.7, "max_tokens": 4, "logprobs": 0, "seed": p.seed,
                            "stop_token_ids": list(policy.stop_token_ids), "detokenize": False}
    assert isinstance(fake.SamplingParams, type)

    row_a = a + [eos]
    row_c = c + [eos, pad, pad]
    expected_ids = torch.tensor([row_a, b, row_c, row_a, b, row_c])  # (6, 4)
    expected_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]] * 2)
    expected_logp = torch.tensor([[-0.5, -0.25, -0.125, -1.0], [-2.0, -0.75, -0.5, -0.25],
                                  [-0.0625, -3.0, 0.0, 0.0]] * 2, dtype=torch.float32)
    assert torch.equal(out.completion_ids, expected_ids)
    assert torch.equal(out.completion_mask, expected_mask)
    assert out.logp_behav.dtype == torch.float32 and torch.equal(out.logp_behav, expected_logp)
    assert out.finished.tolist() == [True, False, True, True, False, True]
    assert out.completion_text == ["1+2", "7*3=", "9"] * 2
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    prompt_ids, prompt_mask = encode_prompts(policy, prompts)
    assert torch.equal(out.prompt_ids, prompt_ids.repeat_interleave(3, dim=0))
    assert torch.equal(out.prompt_mask, prompt_mask.repeat_interleave(3, dim=0))
    # the trainer's log-probs line up column by column with these completions (same shape, same mask)
    trainer_logp = sequence_logprobs(policy, out.prompt_ids, out.prompt_mask, out.completion_ids,
                                     out.completion_mask, temperature=0.7)
    assert trainer_logp.shape == (6, 4) and bool((trainer_logp[expected_mask == 0] == 0).all())


def test_truncation_params_are_passed_only_when_used(policy, install):
    install(_fake_vllm(lambda llm, requests, params: [_output([policy.tokenizer.eos_token_id], [-0.5], "stop")
                                                       for _ in requests]))
    sampler = VLLMSampler("/ckpt")
    out = sampler.generate(policy, ["nums 1 2 target 3 ="], 2, 5, 1.0, torch.Generator().manual_seed(0), top_k=5,
                           top_p=0.9)
    params = sampler.llm.params[0][0].kwargs
    assert params["top_k"] == 5 and params["top_p"] == 0.9
    assert out.completion_ids.shape == (2, 1) and out.completion_text == ["", ""]
    assert out.finished.tolist() == [True] * 2


def test_weight_sync_passes_every_trainer_tensor_and_resets_the_prefix_cache(policy, install):
    install(_fake_vllm(lambda *a: []))
    sampler = VLLMSampler("/ckpt")
    sampler.sync(policy)
    (loaded,) = sampler.llm.loaded
    state = policy.model.state_dict()
    assert [name for name, _ in loaded] == list(state)  # HF names: vLLM's load_weights maps them itself
    assert all(tensor.data_ptr() == state[name].data_ptr() for name, tensor in loaded)  # no copies on the way
    assert sampler.llm.prefix_resets == 1  # cached prompt KV came from the old weights
    sampler.llm.llm_engine = SimpleNamespace()  # an engine running out of process has no model_executor
    with pytest.raises(ValueError, match="separate process.*VLLM_ENABLE_V1_MULTIPROCESSING") as err:
        load_weights_into_vllm(sampler.llm, [])
    assert "\n" not in str(err.value)


def test_engine_choice_and_one_line_errors(install, monkeypatch):
    assert resolve_engine("hf", "cpu") == "hf"
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    assert resolve_engine("auto", "cuda") == "hf"  # not installed
    with pytest.raises(ValueError, match=r"vLLM requested but not installed: pip install"):
        resolve_engine("vllm", "cuda")
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    assert resolve_engine("auto", "cpu") == "hf"  # a CPU trainer keeps the HF loop
    with pytest.raises(ValueError, match="--engine vllm generates on a GPU but --device is 'cpu'; add --device cuda"):
        resolve_engine("vllm", "cpu")
    with pytest.raises(ValueError, match="unknown engine 'sglang'; use --engine hf, vllm or auto"):
        resolve_engine("sglang", "cpu")
    if not torch.cuda.is_available():
        assert resolve_engine("auto", "cuda") == "hf"  # installed but no GPU
        with pytest.raises(ValueError, match=r"CUDA requested but torch.cuda.is_available\(\) is False"):
            resolve_engine("vllm", "cuda")
    install(_fake_vllm(lambda *a: [], fail_logprobs_mode=True))
    with pytest.raises(ValueError,
                       match=r"vLLM 0.0.fake cannot return log-probs after temperature.*; pip install -U vllm$"):
        VLLMSampler("/ckpt")
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization must be in \(0, 1\) \(the trainer needs the rest "
                                         r"of the GPU\), got 1\.0$"):
        VLLMSampler("/ckpt", gpu_memory_utilization=1.0)


def test_cli_engine_errors_exit_2_without_traceback(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    code, _, err = cli("validate", "calibrate-model", "--out", str(tmp_path / "run"), "--engine", "vllm")
    assert code == 2 and err.strip() == ("replay-theory: error: vLLM requested but not installed: "
                                         "pip install 'replay-theory[gpu]' (needs a CUDA GPU)")
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    code, _, err = cli("validate", "all", "--out", str(tmp_path / "run"), "--engine", "vllm", "--device", "cpu")
    assert code == 2 and "add --device cuda" in err and "Traceback" not in err and err.count("\n") == 1
    code, _, err = cli("validate", "calibrate-model", "--out", str(tmp_path / "run"), "--sync-every", "0")
    assert code == 2 and err.strip() == "replay-theory: error: --sync-every must be an integer >= 1, got 0"
    assert not (tmp_path / "run").exists()  # bad input leaves nothing behind


class _HFBackedLLM:
    """Generation for the fake vllm: the tiny model's HF loop on the engine's OWN copy of the weights.

    The copy changes only through load_weights, so the test sees exactly which weights the engine had.
    """

    def __init__(self, base: Policy):
        import copy

        self.policy = copy.deepcopy(base)

    def load(self, weights):
        self.policy.model.load_state_dict(dict(weights))

    def __call__(self, llm, requests, params):
        tok = self.policy.tokenizer
        texts = [tok.decode(r["prompt_token_ids"]) for r in requests]  # BOS dropped, re-added by generate
        generator = torch.Generator().manual_seed(params[0].seed)
        out = generate(self.policy, texts, 1, params[0].max_tokens, params[0].temperature, generator)
        rows = []
        for ids, mask, logp in zip(out.completion_ids, out.completion_mask, out.logp_behav):
            keep = mask.bool()
            rows.append(_output(ids[keep].tolist(), logp[keep].tolist(), "stop", extra_entry=False))
        return rows


def test_train_drives_the_vllm_engine_through_the_shared_loop(install):
    """sync_every = 2 (AsymRE: a nonzero gradient even before any reward): the engine gets the trainer's weights at
    steps 0 and 2 only, and its behaviour log-probs match the trainer's exactly when synced and differ when one update
    stale."""
    train_set, _ = countdown.make_splits(40, 4, seed=3)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    backend = _HFBackedLLM(policy)
    install(_fake_vllm(backend))
    sampler = VLLMSampler("/ckpt")
    original_loaded = sampler.llm.loaded

    def load_and_record(weights):
        weights = list(weights)
        original_loaded.append(weights)
        backend.load(weights)

    sampler.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights = load_and_record
    config = RLConfig(steps=4, rollouts_per_step=8, group_size=4, batch_size=8, capacity=16, lr=1e-2,
                      max_new_tokens=8, logp_source="sampler", sync_every=2, loss="asymre")
    result = train(policy, train_set, config, sampler=sampler)
    assert len(sampler.llm.loaded) == 2 and sampler.llm.prefix_resets == 2  # steps 0 and 2
    assert [m["policy_lag"] for m in result.metrics] == [0, 1, 0, 1]
    mismatch = [m["logp_mismatch_max"] for m in result.metrics]
    assert mismatch[0] < 1e-5 and mismatch[2] < 1e-5  # synced: vLLM's log-probs are the trainer's
    assert mismatch[1] > 1e-3 and mismatch[3] > 1e-3  # one update stale
    assert result.metrics[0]["log_ratio_abs_max"] < 1e-5  # fresh, on-policy batch at step 0
    assert result.k_inference == 4 * 8 and all(np.isfinite(m["loss"]) for m in result.metrics)


def test_hf_engine_with_sync_every_has_the_same_staleness():
    train_set, _ = countdown.make_splits(40, 4, seed=3)
    policy = load_policy(ModelConfig(), countdown.ALPHABET)
    config = RLConfig(steps=4, rollouts_per_step=8, group_size=4, batch_size=8, capacity=16, lr=1e-2,
                      max_new_tokens=8, logp_source="sampler", sync_every=2, loss="asymre")
    result = train(policy, train_set, config)  # default sampler: HFSampler(stale_copy=True)
    mismatch = [m["logp_mismatch_max"] for m in result.metrics]
    assert [m["policy_lag"] for m in result.metrics] == [0, 1, 0, 1]
    assert mismatch[0] < 1e-5 and mismatch[2] < 1e-5 and mismatch[1] > 1e-3 and mismatch[3] > 1e-3
    every_step = train(load_policy(ModelConfig(), countdown.ALPHABET), train_set,
                       RLConfig(**{**config.__dict__, "sync_every": 1}), sampler=HFSampler())
    assert all(m["policy_lag"] == 0 and m["logp_mismatch_max"] < 1e-5 for m in every_step.metrics)
