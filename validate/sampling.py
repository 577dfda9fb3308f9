"""The validator's sampler: a KV-cached sampling loop that records the behaviour log-probs.

Paper: RLOO group replay (docs/REFERENCES.md), Sec. 3.1-3.3: K responses are sampled per prompt
(Eq. (1)'s group) and the behaviour log-probability log mu(y_i | x_i) of Eq. (2) is stored when a
group is sampled.  ``generate`` is the HF engine of ``validate/engines.py`` (the vLLM one returns the same
``Rollouts``): explicit ``torch.Generator``s (the same seed gives the same samples), ``logp_behav`` from the sampling
forward pass itself, decoding chosen by a ``DecodeOptions`` (``default_decode`` by device: the CPU's eager loop,
bit for bit as before; on CUDA device generators, a static cache and a compiled ``StaticDecoder`` step, eager where
``torch.compile`` fails): docs/VALIDATION.md, 'GPU path'.  Padding, positions and log-prob conventions are those of
``validate/logprobs.py``.  In addition:

* Rows: ``B * num_samples``, prompt-major: row ``i * num_samples + k`` is sample k of prompt i
  (``Rollouts.prompt_index``), so a ``(B, K)`` reshape gives the RLOO groups.
* Temperature: ``logp_behav`` is the log-prob under the SAMPLING distribution, ``log_softmax(logits / T)`` (after
  top-k/top-p truncation if used, renormalised), as ``sequence_logprobs(..., temperature=T)`` computes it, so with
  equal weights the log-ratio of fresh data is ~0.

| code name          | paper symbol                    | where                      |
|--------------------|---------------------------------|----------------------------|
| ``logp_behav``     | log mu(y_t given x, y_<t)       | RLOO Eq. (2): stored at sampling time |
| ``num_samples``    | K (8)                           | RLOO Eq. (1)               |
| ``temperature``    | sampling temperature (1.0)      | RLOO Sec. 4, training configuration |
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from ..checks import require_integer, require_number, require_one_of
from .config import DECODE_MODES  # auto (compiled on CUDA, eager on the CPU), eager, static, compiled
from .logprobs import encode_prompts
from .policy import Policy, resolve_compute_dtype

if TYPE_CHECKING:
    from transformers import StaticCache


@dataclass
class Rollouts:
    """Sampled completions, ``N = B * num_samples`` rows, prompt-major (row i*K + k)."""

    prompt_ids: torch.Tensor  # (N, P) long, left-padded
    prompt_mask: torch.Tensor  # (N, P) long
    completion_ids: torch.Tensor  # (N, L) long, right-padded with pad_token_id; L <= max_new_tokens
    completion_mask: torch.Tensor  # (N, L) long; 1 on sampled tokens including the EOS
    completion_text: list[str]  # N strings, special tokens removed
    logp_behav: torch.Tensor  # (N, L) float32, log mu of the sampled tokens at temperature T; 0 on padding
    prompt_index: torch.Tensor  # (N,) long: which prompt each row answers
    finished: torch.Tensor  # (N,) bool: stopped at a stop token (False = cut at max_new_tokens)


@dataclass(frozen=True)
class DecodeOptions:
    """How ``generate`` decodes (module docstring): ``default_decode`` picks one per device."""

    static_cache: bool = False
    """A static KV cache of width prompt + L on a ``StaticDecoder`` (False: transformers' dynamic cache on the
    policy's own model)."""
    compile: bool = False
    """Compile the static decoder's step (``torch.compile``; needs ``static_cache``)."""
    check_every: int = 1
    """Read the all-finished flag (a host sync) every this many tokens; > 1 draws past the end for finished rows, so
    the generators advance further than with 1 (the returned rollouts are the same)."""
    compile_mode: str | None = None
    """``torch.compile``'s mode: None = "reduce-overhead" (CUDA graphs) on CUDA, inductor's default on the CPU."""
    compile_backend: str = "inductor"
    """``torch.compile``'s backend (gpu_check's CPU smoke run passes "eager": dynamo without inductor's minutes)."""
    race: bool | None = None
    """Draw by the exponential race on the generators' device (``draw_tokens``); None: when they are not on the CPU.
    On the CPU it gives ``torch.multinomial``'s tokens (the tests run the device path there)."""

    def __post_init__(self):
        require_integer("check_every", self.check_every, 1)
        if self.compile and not self.static_cache:
            raise ValueError("compile needs static_cache: the compiled step has fixed shapes")


CUDA_CHECK_EVERY = 8
"""All-finished read every 8 tokens on CUDA: at most 7 extra tokens of work per call, 1/8 of the syncs."""


def default_decode(device: torch.device | str, mode: str = "auto") -> DecodeOptions:
    """``--decode MODE`` on ``device``: auto is the compiled loop on CUDA and the eager loop (today's CPU numbers) on
    the CPU; eager, static and compiled ask for one everywhere (the CPU tests run each)."""
    require_one_of("--decode", mode, DECODE_MODES)
    cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        mode = "compiled" if cuda else "eager"
    check_every = CUDA_CHECK_EVERY if cuda else 1
    return DecodeOptions(static_cache=mode != "eager", compile=mode == "compiled", check_every=check_every)


def _truncate(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of log-probs (N, V), renormalised."""
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # (N, 1)
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # (N, V)
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # probability above each token
        drop_sorted = mass_before >= top_p  # always keeps the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


def draw_tokens(probs: torch.Tensor, generators: Sequence[torch.Generator], block: int,
                race: bool | None = None) -> torch.Tensor:
    """One token per row of ``probs`` (N, V), rows block i drawn with ``generators[i]``: (N,) long on ``probs``' device.

    ``race`` False (None: generators on the CPU): ``torch.multinomial`` on them (the CPU numbers of every version; a
    CUDA ``probs`` is copied to the host, the slow path issue 31 measured). ``race`` True (None: generators on
    ``probs``' device): the exponential race argmax_v p_v / E_v, E ~ Exp(1) from generator i, which is how
    ``torch.multinomial`` draws one sample (the same tokens on the CPU), on the device and without a host round trip.
    """
    device = probs.device
    if race is None:
        race = generators[0].device.type != "cpu"
    if not race:
        if device.type != "cpu":
            probs = probs.to("cpu")
        return torch.cat([torch.multinomial(probs[i * block:(i + 1) * block], 1, generator=g)
                          for i, g in enumerate(generators)]).to(device).squeeze(1)  # (N,): block i from stream i
    exp_draws = torch.empty_like(probs)  # (N, V)
    for i, g in enumerate(generators):
        exp_draws[i * block:(i + 1) * block].exponential_(generator=g)  # E ~ Exp(1), block i from stream i
    return (probs / exp_draws).argmax(dim=-1)  # (N,)


@torch.no_grad()
def generate(
    policy: Policy,
    prompts: Sequence[str],
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | Sequence[torch.Generator],
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    prompt_width: int | None = None,
    decode: DecodeOptions | None = None,
) -> Rollouts:
    """Sample ``num_samples`` completions per prompt with a KV-cached loop; deterministic given ``generator``.

    Each step draws a token from ``log_softmax(logits / temperature)`` in float32 (top-k / top-p renormalised if
    asked) and records its log-prob as ``logp_behav``; a row stops after a stop token, later columns are padding.
    ``generator`` (on the CPU or ``policy.device``): a list of S splits the rows into S equal consecutive blocks (the
    seeds of a seed-stacked policy, ``validate/batched.py``), block s drawn with generator s only, so each seed gets
    the tokens it gets sampling alone. ``prompt_width``: pad prompts to at least this width (``encode_prompts``);
    ``decode``: how (``DecodeOptions``; None = ``default_decode(policy.device)``).
    """
    _check_sampling(num_samples, max_new_tokens, temperature, top_k, top_p)
    decode = default_decode(policy.device) if decode is None else decode
    model, device = policy.model, policy.device
    pad_id = policy.tokenizer.pad_token_id
    was_training = model.training
    model.eval()

    prompt_ids, prompt_mask = encode_prompts(policy, prompts, prompt_width)  # (B, P)
    prompt_ids = prompt_ids.repeat_interleave(num_samples, dim=0)  # (N, P), row i*K + k
    prompt_mask = prompt_mask.repeat_interleave(num_samples, dim=0)  # (N, P)
    prompt_index = torch.arange(len(prompts)).repeat_interleave(num_samples)  # (N,)
    n_rows = prompt_ids.shape[0]
    prompt_len = prompt_mask.sum(1)  # (N,)
    stop_ids = torch.tensor(policy.stop_token_ids, device=device)
    generators = [generator] if isinstance(generator, torch.Generator) else list(generator)
    if not generators or n_rows % len(generators):
        raise ValueError(f"{len(generators)} generators for {n_rows} rows; the rows must split into equal blocks")
    block = n_rows // len(generators)  # rows per generator (per seed)

    tokens = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (N, T)
    logp_behav = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32, device=device)  # (N, T)
    alive_cols = torch.zeros((n_rows, max_new_tokens), dtype=torch.long, device=device)  # (N, T)
    finished = torch.zeros(n_rows, dtype=torch.bool, device=device)  # (N,)
    if decode.static_cache:
        decoder = static_decoder(policy, decode)
        next_logits = decoder.start(policy, prompt_ids, prompt_mask, len(generators), max_new_tokens)
    else:
        next_logits = _eager_step(policy, prompt_ids, prompt_mask, prompt_len)

    steps = 0
    logits = next_logits(None, None, 0)
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
        if top_k or top_p < 1.0:
            logp_all = _truncate(logp_all, top_k, top_p)
        token = draw_tokens(logp_all.exp(), generators, block, decode.race)  # (N,)
        alive = ~finished  # (N,)
        token = torch.where(alive, token, torch.full_like(token, pad_id))
        tokens[:, t] = token
        logp_behav[:, t] = torch.where(alive, logp_all.gather(-1, token[:, None]).squeeze(1), 0.0)
        alive_cols[:, t] = alive.long()
        finished = finished | (alive & torch.isin(token, stop_ids))
        steps = t + 1
        if steps == max_new_tokens or (steps % decode.check_every == 0 and bool(finished.all())):
            break
        logits = next_logits(token, alive, t)
    model.train(was_training)
    if decode.check_every > 1:  # the loop may have run past the last live column: trim as checking every token does
        live = alive_cols.any(0).nonzero()
        steps = int(live.max()) + 1 if live.numel() else 1

    completion_ids = tokens[:, :steps]
    completion_mask = alive_cols[:, :steps]
    texts = [policy.tokenizer.decode(row[m.bool()].tolist())
             for row, m in zip(completion_ids.cpu(), completion_mask.cpu())]
    return Rollouts(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                    completion_mask=completion_mask, completion_text=texts, logp_behav=logp_behav[:, :steps],
                    prompt_index=prompt_index.to(device), finished=finished)


def _check_sampling(num_samples: int, max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    """``generate``'s sampling settings, checked before any work."""
    require_integer("num_samples", num_samples, 1)
    require_integer("max_new_tokens", max_new_tokens, 1)
    require_number("temperature", temperature, above=0, note=" (use top_k=1 for greedy decoding)")
    if not 0.0 < top_p <= 1.0 or top_k < 0:
        raise ValueError(f"top_k={top_k}, top_p={top_p}; need top_k >= 0 and 0 < top_p <= 1")


def _eager_step(policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompt_len: torch.Tensor):
    """The eager decode step over the model's own (dynamic) KV cache: runs the prompt once, then returns
    ``next_logits(token, alive, t)``, the (N, V) logits after feeding completion token t (None: after the prompt)."""
    model = policy.model

    def forward(**inputs):
        with policy.autocast():  # bf16 on CUDA, as in training; nothing on CPU
            return model(**inputs)

    state = {"mask": prompt_mask, "out": forward(input_ids=prompt_ids, attention_mask=prompt_mask,
                                                 position_ids=(prompt_mask.cumsum(1) - 1).clamp(min=0),
                                                 use_cache=True, logits_to_keep=1)}

    def next_logits(token: torch.Tensor | None, alive: torch.Tensor | None, t: int) -> torch.Tensor:
        if token is not None:
            assert alive is not None  # generate passes alive with every token
            state["mask"] = torch.cat([state["mask"], alive.long()[:, None]], dim=1)  # (N, P + t + 1)
            state["out"] = forward(input_ids=token[:, None], attention_mask=state["mask"],
                                   position_ids=(prompt_len + t)[:, None],  # same positions as sequence_logprobs
                                   use_cache=True, **_cache_argument(model, state["out"]))
        return state["out"].logits[:, -1]  # (N, V)

    return next_logits


# --------------------------------------------------------------------------- the static, compiled decoder


def padded_rows(rows: int) -> int:
    """Rows per seed block of the static decoder: the next power of two >= ``rows`` (at least 8), so that the few
    batch sizes of a verify (R of each design, evaluation's 64 x 8) share a handful of compiled shapes."""
    return max(8, 1 << max(0, rows - 1).bit_length())


_COMPILE_SECONDS = [0.0]  # wall seconds of first calls of newly compiled steps in this process (compile + one step)


def compile_seconds() -> float:
    """Seconds this process has spent compiling decode steps (first calls of each new shape): the generation side
    of mu excludes them (``validate.rl.LMBackend``)."""
    return _COMPILE_SECONDS[0]


class StaticDecoder:
    """A model's decode step on static KV caches, optionally compiled, shared by every ``generate`` of the process.

    ``model``: a copy of the policy's architecture in the compute dtype (bf16 on CUDA), with fixed parameter
    addresses: ``start`` copies the policy's current weights in, so what is compiled (and the CUDA graphs recorded)
    once stays valid for every run. One static cache per (rows, width), rows padded per seed block to a power of two
    and the prompt width to a multiple of ``WIDTH_STEP`` (extra left padding); the prefill is eager. The step takes the
    cache as an argument and is compiled once with dynamic shapes, so a new (rows, width) records a graph rather than
    compiling again.
    """

    def __init__(self, policy: Policy, options: DecodeOptions):
        self.device = policy.device
        self.dtype = resolve_compute_dtype(policy.config)
        self.model = copy.deepcopy(policy.model).to(dtype=self.dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.options = options
        cuda = self.device.type == "cuda"
        self.mode = options.compile_mode if options.compile_mode is not None else (
            "reduce-overhead" if cuda else None)
        self.caches: dict[tuple[int, int], StaticCache] = {}
        self.fallback: str | None = None  # why the step runs eagerly although compile was asked (one line, once)
        self.attn = getattr(self.model.config, "_attn_implementation", "sdpa")
        self.takes_cache = _takes_cache(type(self.model))
        self.warm: set = set()  # (rows, width) whose compiled step has run once (compiled or graph recorded)
        self.compiled = False  # whether self.step is torch.compile's (set by _compile, cleared by _fall_back)
        self.step = self._compile() if options.compile else self.eager_step

    # -- weights and shapes

    @torch.no_grad()
    def load(self, policy: Policy) -> None:
        """Copy ``policy``'s current weights into the decoder's model (converted to the compute dtype)."""
        for dst, src in zip(self.model.parameters(), policy.model.parameters()):
            dst.copy_(src)

    def _cache(self, rows: int, width: int):
        from transformers import StaticCache

        key = (rows, width)
        if key not in self.caches:
            self.caches[key] = StaticCache(config=self.model.config, max_cache_len=width)
        cache = self.caches[key]
        cache.reset()  # in place: the tensors keep their addresses (the CUDA graphs read them)
        return cache

    def _cache_kw(self, cache) -> dict:
        return {"cache": cache} if self.takes_cache else {"past_key_values": cache}

    def _attention(self, mask2d: torch.Tensor) -> torch.Tensor:
        """The decode step's 4D mask (rows, 1, 1, width) from the 2D one: the columns not yet written are 0, so the
        causal part is already in it. sdpa takes True = attend; eager an additive mask; others read the 2D mask."""
        if self.attn == "sdpa":
            return mask2d.bool()[:, None, None, :].clone()
        if self.attn == "eager":
            additive = torch.zeros(mask2d.shape, dtype=self.dtype, device=mask2d.device)
            return additive.masked_fill(mask2d == 0, torch.finfo(self.dtype).min)[:, None, None, :].contiguous()
        return mask2d.clone()

    def _set_column(self, attention: torch.Tensor, column: int, alive: torch.Tensor) -> None:
        if self.attn == "sdpa":
            attention[:, 0, 0, column] = alive
        elif self.attn == "eager":
            attention[:, 0, 0, column] = torch.where(alive, 0.0, torch.finfo(self.dtype).min).to(self.dtype)
        else:
            attention[:, column] = alive.long()

    # -- the step

    def eager_step(self, cache, input_ids: torch.Tensor, position_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> torch.Tensor:
        """One decode step: the tokens (rows, 1) at their positions, written to the cache; the next logits (rows, V)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **self._cache_kw(cache))
        return out.logits[:, -1]

    def _compile(self):
        _raise_recompile_limit()
        try:
            step = torch.compile(self.eager_step, mode=self.mode, dynamic=True, fullgraph=False,
                                 backend=self.options.compile_backend)
        except Exception as err:  # noqa: BLE001 - no compiler on this platform: decode eagerly, said once
            self._fall_back(err)
            return self.eager_step
        self.compiled = True
        return step

    def _fall_back(self, err: BaseException) -> None:
        if self.fallback is None:
            self.fallback = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            print(f"validate: torch.compile of the decode step is unavailable ({self.fallback}); decoding eagerly "
                  f"on the static KV cache", file=sys.stderr, flush=True)
        self.step, self.compiled = self.eager_step, False

    @torch.no_grad()
    def start(self, policy: Policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_blocks: int,
              max_new_tokens: int):
        """Load the weights, pad every seed block to ``padded_rows`` and the prompt to a multiple of ``WIDTH_STEP``,
        prefill the static cache; returns ``next_logits(token, alive, t)`` for ``generate`` (real rows, (N, V))."""
        self.load(policy)
        N, P0 = prompt_ids.shape
        n = N // num_blocks
        n_pad = padded_rows(n)
        P = -(-P0 // WIDTH_STEP) * WIDTH_STEP  # prompt columns, left-padded further
        rows, width = num_blocks * n_pad, P + max_new_tokens
        device = prompt_ids.device
        # padded layout: block s holds its n real rows, then copies of its first row (never sampled, never NaN)
        local = torch.arange(n_pad, device=device).clamp(max=n - 1)  # (n_pad,)
        source = (torch.arange(num_blocks, device=device)[:, None] * n + local).reshape(-1)  # (rows,)
        real = (torch.arange(num_blocks, device=device)[:, None] * n_pad
                + torch.arange(n, device=device)).reshape(-1)  # (N,) where the real rows sit
        padded = n_pad != n
        pad_token = policy.tokenizer.pad_token_id
        ids_p = torch.full((rows, P), pad_token, dtype=prompt_ids.dtype, device=device)  # (rows, P)
        ids_p[:, P - P0:] = prompt_ids[source]
        mask2d = torch.zeros((rows, width), dtype=torch.long, device=device)  # (rows, P + L)
        mask2d[:, P - P0:P] = prompt_mask[source]
        mask_p = mask2d[:, :P]
        prompt_len = mask_p.sum(1)  # (rows,)
        cache = self._cache(rows, width)
        out = self.model(input_ids=ids_p, attention_mask=mask2d, position_ids=(mask_p.cumsum(1) - 1).clamp(min=0),
                         use_cache=True, logits_to_keep=1, **self._cache_kw(cache))  # eager prefill, columns 0..P-1
        first = out.logits[:, -1]
        attention = self._attention(mask2d)
        key = (rows, width)

        def next_logits(token, alive, t):
            if token is None:
                logits = first
            else:
                if padded:
                    token_p = torch.full((rows,), pad_token, dtype=token.dtype, device=device)
                    token_p[real] = token
                    alive_p = torch.zeros(rows, dtype=torch.bool, device=device)
                    alive_p[real] = alive
                else:
                    token_p, alive_p = token, alive
                column = P + t  # completion token t is written to cache column P + t
                self._set_column(attention, column, alive_p)
                inputs = (cache, token_p[:, None], (prompt_len + t)[:, None], attention)
                compiled = self.compiled
                if compiled and self.device.type == "cuda" and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
                    torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits are consumed
                if compiled and key not in self.warm:  # first call of a shape: compile or record its graph
                    started = time.perf_counter()
                    try:
                        logits = self.step(*inputs)
                    except Exception as err:  # noqa: BLE001 - a compile error surfaces at the first call
                        self._fall_back(err)
                        _rewind(cache, column)
                        logits = self.step(*inputs)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    _COMPILE_SECONDS[0] += time.perf_counter() - started
                    self.warm.add(key)
                else:
                    logits = self.step(*inputs)
            return logits[real] if padded else logits  # (N, V); consumed before the next step overwrites it

        return next_logits


WIDTH_STEP = 16
"""The static decoder left-pads prompts to a multiple of 16 columns: callers that pad each batch to its own longest
prompt (calibration's batches) then share a few cache widths."""


def _rewind(cache, column: int) -> None:
    """Set every static layer's write position back to ``column`` (a failed compiled call may have advanced it)."""
    for layer in getattr(cache, "layers", []):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.fill_(column)


def _raise_recompile_limit() -> None:
    """Every decoder compiles the same step function (one code object), one graph per shape: dynamo's default limit
    of 8 recompiles per code object would silently fall back to eager after a few shapes and models."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 64:
            setattr(config, name, 64)


_DECODERS: dict[str, StaticDecoder] = {}  # one decoder per architecture, device, dtype and options, per process


def static_decoder(policy: Policy, options: DecodeOptions) -> StaticDecoder:
    """The process's ``StaticDecoder`` for ``policy``'s architecture (built at first use)."""
    model = policy.model
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    key = json.dumps([type(model).__name__, shapes, str(policy.device), str(resolve_compute_dtype(policy.config)),
                      options.compile, options.compile_mode, config], default=str)
    if key not in _DECODERS:
        _DECODERS[key] = StaticDecoder(policy, options)
    return _DECODERS[key]


def release_decoders() -> None:
    """Drop every decoder of this process (their weights, caches and graphs): gpu_check between model shapes."""
    _DECODERS.clear()


def _cache_argument(model, out) -> dict:
    """The KV cache of ``out`` as the next forward's keyword: ``cache`` from transformers 5.24 on (``past_key_values``
    is deprecated there and removed in 5.40), ``past_key_values`` before (the validate extra allows >= 4.44)."""
    return {"cache": out.cache} if _takes_cache(type(model)) else {"past_key_values": out.past_key_values}


@functools.lru_cache(maxsize=None)
def _takes_cache(model_class: type) -> bool:
    return "cache" in inspect.signature(model_class.forward).parameters
