"""vLLM rollout engine: the ``Sampler`` interface of ``validate/engines.py`` on ``vllm.LLM`` (GPU only).

Paper: experience-replay (docs/REFERENCES.md), Sec. 2 and App. E:
the paper's inference workers generate rollouts with vLLM while trainers update the weights; a
worker's rollouts come from the last weights pushed to it. Here one in-process ``vllm.LLM``
shares the GPU with the trainer and gets the trainer's weights at every sync step.

What this module does, and nothing more (everything else is shared with the HF path):

* builds the ``vllm.LLM`` from a checkpoint directory (the run's ``warm_start``) with
  ``skip_tokenizer_init=True``: prompts go in as the TRAINER's token ids and completions come
  back as ids, so both sides see exactly the same tokens (the tiny model's character tokenizer
  is not a Hugging Face tokenizer, and no detokenisation happens inside vLLM);
* ``logprobs_mode="processed_logprobs"`` and ``SamplingParams(logprobs=0)``: vLLM returns, for
  every generated token, the log-prob of the SAMPLED token under the distribution it was drawn
  from (after temperature and top-k/top-p), the same quantity as the HF loop's ``logp_behav``
  (vLLM's default, ``raw_logprobs``, is the log-prob before temperature);
* one request per completion, each with its own seed drawn from the run's ``torch.Generator``,
  so a run is reproducible given its seed (as far as vLLM's kernels are);
* ``load_weights_into_vllm``: the one version-specific call (weight sync);
* ``rollouts_from_vllm``: RequestOutputs -> the exact ``Rollouts`` tensors the trainer expects;
* ``vllm_available`` / ``require_vllm``: whether vLLM is installed, and the one-line install hint when not.

vLLM is imported inside functions only: this module imports without vLLM installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..checks import require_open_interval
from .logprobs import prompt_token_ids
from .policy import Policy
from .sampling import Rollouts
from .tokenizer import pad_batch

_SEED_HIGH = 2**31 - 1  # vLLM seeds are Python ints; keep them in int32 range


def vllm_available() -> bool:
    """Whether the optional vLLM package is importable (found without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise a one-line ValueError with the install hint when vLLM is absent."""
    if not vllm_available():
        raise ValueError("vLLM requested but not installed: pip install 'replay-theory[gpu]' (needs a CUDA GPU)")


def load_weights_into_vllm(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy trainer weights (Hugging Face names) into the running vLLM model, in place.

    The model lives in this process because ``VLLMSampler`` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
    before building the engine; vLLM V1 then exposes ``llm.llm_engine.model_executor`` (V0 always
    did). The vLLM model's ``load_weights`` takes HF-named tensors, fuses q/k/v and gate/up itself,
    skips ``lm_head.weight`` when embeddings are tied, and casts to its own dtype (bf16) while
    copying into the existing parameter storage, so captured CUDA graphs stay valid.
    """
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    if executor is None:
        raise ValueError("vLLM runs its engine in a separate process, so weights cannot be synced in place; "
                         "unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0")
    executor.driver_worker.model_runner.model.load_weights(named_tensors)
    llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights


def rollouts_from_vllm(policy: Policy, prompt_seqs: Sequence[Sequence[int]], num_samples: int,
                       outputs: Sequence[Any], prompt_width: int | None = None) -> Rollouts:
    """Convert vLLM ``RequestOutput`` objects (one request per completion, prompt-major) into ``Rollouts``.

    ``outputs[i * num_samples + k].outputs[0]`` is sample k of prompt i, with ``token_ids``
    (generated ids, the stop token included when generation stopped on it) and ``logprobs``
    (one ``{token_id: Logprob}`` mapping per generated token). The result follows
    ``validate.sampling.generate`` exactly: completions right-padded with ``pad_token_id`` to the
    longest one, mask 1 up to and including the first stop token, ``logp_behav`` float32 with 0.0
    on padding, texts decoded by the trainer's tokenizer without special tokens.
    """
    n_rows = len(prompt_seqs) * num_samples
    if len(outputs) != n_rows:
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {n_rows} requests")
    stop = set(policy.stop_token_ids)
    pad_id = policy.tokenizer.pad_token_id
    kept_ids: list[list[int]] = []
    kept_logp: list[list[float]] = []
    finished: list[bool] = []
    for row, request_output in enumerate(outputs):
        completion = request_output.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        logprobs = completion.logprobs
        if logprobs is None or len(logprobs) < len(ids):
            raise RuntimeError(f"vLLM returned no log-prob for some sampled tokens of row {row}; "
                               "SamplingParams(logprobs=0) is required")
        logp = [float(logprobs[t][token].logprob) for t, token in enumerate(ids)]  # the sampled token's entry
        # vLLM stops on a stop token and keeps it; cut at the first one anyway, as the HF loop does
        cut = next((t + 1 for t, token in enumerate(ids) if token in stop), None)
        finished.append(cut is not None)
        if cut is not None:
            ids, logp = ids[:cut], logp[:cut]
        kept_ids.append(ids)
        kept_logp.append(logp)

    device = policy.device
    width = max(1, max(len(ids) for ids in kept_ids))  # L: the longest completion (HF: the steps taken)
    completion_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)  # (N, L)
    completion_mask = torch.zeros((n_rows, width), dtype=torch.long)  # (N, L)
    logp_behav = torch.zeros((n_rows, width), dtype=torch.float32)  # (N, L)
    for row, (ids, logp) in enumerate(zip(kept_ids, kept_logp)):
        completion_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion_mask[row, : len(ids)] = 1
        logp_behav[row, : len(ids)] = torch.tensor(logp, dtype=torch.float32)
    repeated = [seq for seq in prompt_seqs for _ in range(num_samples)]  # row i*K + k answers prompt i
    prompt_ids, prompt_mask = pad_batch(repeated, pad_id, left_pad=True, width=prompt_width)  # (N, P), P >= width
    texts = [policy.tokenizer.decode(ids) for ids in kept_ids]
    return Rollouts(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask.to(device),
        completion_text=texts,
        logp_behav=logp_behav.to(device),
        prompt_index=torch.arange(len(prompt_seqs)).repeat_interleave(num_samples).to(device),  # (N,)
        finished=torch.tensor(finished, dtype=torch.bool, device=device),  # (N,)
    )


class VLLMSampler:
    """``Sampler`` on an in-process ``vllm.LLM`` that shares the GPU with the trainer."""

    name = "vllm"

    def __init__(self, model_path: str | Path, *, seed: int = 0, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, dtype: str = "bfloat16", enforce_eager: bool = False):
        require_vllm()
        require_open_interval("gpu_memory_utilization", gpu_memory_utilization, 0, 1,
                              note=" (the trainer needs the rest of the GPU)")
        # Weight sync calls into the model, so the engine core must run in this process (V1 default: a
        # separate one). setdefault: an explicit user setting wins and load_weights_into_vllm explains it.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm

        # generation_config="vllm": ignore the checkpoint's generation_config.json sampling defaults
        # (Qwen2.5-Instruct ships repetition_penalty 1.05, top_k 20, top_p 0.8); the HF loop applies none of
        # them, and a penalty would change the distribution whose log-probs are recorded.
        kwargs = dict(model=str(model_path), dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                      skip_tokenizer_init=True, enable_prefix_caching=True, enforce_eager=enforce_eager,
                      logprobs_mode="processed_logprobs", generation_config="vllm")
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        try:
            self.llm = vllm.LLM(**kwargs)
        except TypeError as err:
            if "logprobs_mode" in str(err):
                raise ValueError(f"vLLM {getattr(vllm, '__version__', '?')} cannot return log-probs after "
                                 "temperature (its LLM has no logprobs_mode); pip install -U vllm") from None
            raise

    def sync(self, policy: Policy) -> None:
        load_weights_into_vllm(self.llm, policy.model.state_dict().items())

    def generate(self, policy: Policy, prompts: Sequence[str], num_samples: int, max_new_tokens: int,
                 temperature: float, generator: torch.Generator | Sequence[torch.Generator], *, top_k: int = 0,
                 top_p: float = 1.0, prompt_width: int | None = None) -> Rollouts:
        from vllm import SamplingParams

        if not isinstance(generator, torch.Generator):
            raise ValueError("the vLLM engine draws from one generator: seeds as a batch axis (--batched) need "
                             "--engine hf")
        if num_samples < 1 or max_new_tokens < 1 or temperature <= 0:
            raise ValueError(f"num_samples={num_samples}, max_new_tokens={max_new_tokens}, temperature={temperature}; "
                             "need num_samples >= 1, max_new_tokens >= 1, temperature > 0")
        seqs = prompt_token_ids(policy, prompts)  # the trainer's tokenisation, BOS included where it has one
        n_rows = len(seqs) * num_samples
        seeds = torch.randint(0, _SEED_HIGH, (n_rows,), generator=generator, device=generator.device).tolist()
        truncation = {**({"top_k": top_k} if top_k else {}), **({"top_p": top_p} if top_p < 1.0 else {})}
        params = [SamplingParams(n=1, temperature=temperature, max_tokens=max_new_tokens, logprobs=0, seed=int(s),
                                 stop_token_ids=list(policy.stop_token_ids), detokenize=False, **truncation)
                  for s in seeds]
        requests = [{"prompt_token_ids": list(seq)} for seq in seqs for _ in range(num_samples)]  # prompt-major
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return rollouts_from_vllm(policy, seqs, num_samples, outputs, prompt_width)
