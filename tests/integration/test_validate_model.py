"""Tests of validate/tokenizer.py, policy.py, logprobs.py, sampling.py and sft.py on tiny models (hidden 64, 2 layers).

Levels (style note 8): hand-computed values (token ids, parameter count);
vectorised code against a naive loop (sequence_logprobs vs. a per-token
log_softmax/gather, a padded batch vs. each row alone); a tiny-model run
(SFT on real Countdown solver pairs lowers the loss and moves the parameters).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from replay_theory.validate import countdown, vllm_engine  # noqa: E402
from replay_theory.validate.logprobs import encode_prompts, sequence_logprobs  # noqa: E402
from replay_theory.validate.policy import (  # noqa: E402
    META_FILENAME,
    HFTokenizer,
    ModelConfig,
    load_checkpoint,
    load_policy,
    num_parameters,
    resolve_compute_dtype,
    resolve_dtype,
    save_checkpoint,
)
from replay_theory.validate.sampling import generate  # noqa: E402
from replay_theory.validate.sft import sft_warm_start  # noqa: E402
from replay_theory.validate.tokenizer import CharTokenizer  # noqa: E402

ALPHABET = countdown.ALPHABET
TINY = ModelConfig()  # hidden 64, 2 layers, 4 heads, 2 kv heads, SwiGLU 128


def _countdown_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    problems = countdown.generate_problems(n, np.random.default_rng(seed))
    return [(p.prompt_text(), countdown.solve(p)) for p in problems]


def _assert_one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.strip() == msg
    return msg


@pytest.fixture(scope="module")
def sft_run():
    """(policy, losses, parameters before): 60 SFT steps on 32 Countdown solver pairs."""
    pol = load_policy(TINY, ALPHABET)
    before = [p.detach().clone() for p in pol.model.parameters()]
    losses = sft_warm_start(pol, _countdown_pairs(32), steps=60, batch_size=16, lr=3e-3,
                            generator=torch.Generator().manual_seed(0))
    return pol, losses, before


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_ids_and_round_trip(tmp_path):
    tok = CharTokenizer("ab=")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (0, 1, 2, 6)
    assert tok.encode("ba=", add_bos=True, add_eos=True) == [1, 4, 3, 5, 2]
    assert tok.decode([1, 4, 3, 5, 2, 0]) == "ba="
    assert tok.decode([1, 4, 2, 0], skip_special=False) == "<bos>b<eos><pad>"
    full = CharTokenizer(ALPHABET)
    text = "nums 3 7 25 target 75 =(25-7)*3+7"
    assert full.decode(full.encode(text, add_bos=True, add_eos=True)) == text
    tok.save(tmp_path)
    assert CharTokenizer.load(tmp_path).encode("ab=") == [3, 4, 5]


def test_tokenizer_errors():
    tok = CharTokenizer("ab")
    with pytest.raises(ValueError, match="'z'") as err:
        tok.encode("abz")
    _assert_one_line(err)
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aba")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([5])


def test_tokenizer_left_and_right_padding():
    tok = CharTokenizer("ab")
    ids, mask = tok.batch_encode(["a", "abb", ""])
    assert ids.tolist() == [[0, 0, 3], [3, 4, 4], [0, 0, 0]]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = tok.batch_encode(["a", "ab"], left_pad=False, add_eos=True)
    assert ids.tolist() == [[3, 2, 0], [3, 4, 2]]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]


# --------------------------------------------------------------------------- tiny model


def test_tiny_parameter_count_matches_qwen2_formula(policy):
    c, vocab = TINY, 3 + len(ALPHABET)
    h, inter = c.hidden_size, c.intermediate_size
    kv = c.num_kv_heads * (h // c.num_heads)  # 2 heads * 16 = 32
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v with bias; o without
    mlp = 3 * h * inter  # gate, up, down (no bias)
    per_layer = attn + mlp + 2 * h  # + input and post-attention RMSNorm
    expected = vocab * h + c.num_layers * per_layer + h  # tied embedding/lm_head, final norm
    assert expected == 30 * 64 + 2 * 37120 + 64 == 76224
    assert num_parameters(policy) == expected
    assert policy.model.get_output_embeddings().weight is policy.model.get_input_embeddings().weight


def test_tiny_init_is_seeded_and_leaves_global_rng_alone(policy):
    state = torch.random.get_rng_state()
    same = load_policy(TINY, ALPHABET)
    other = load_policy(ModelConfig(seed=1), ALPHABET)
    assert torch.equal(torch.random.get_rng_state(), state)
    for a, b in zip(policy.model.parameters(), same.model.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(policy.model.model.embed_tokens.weight, other.model.model.embed_tokens.weight)
    assert policy.device == torch.device("cpu") and policy.model.dtype == torch.float32
    assert policy.stop_token_ids == (policy.tokenizer.eos_token_id,)


def _toy_batch(policy):
    tok = policy.tokenizer
    prompts = ["nums 3 4 target 7 =", "nums 1 2 3 target 6 =", "nums 5 target 5 ="]
    answers = ["3+4", "1+2+3", "5"]
    p_ids, p_mask = encode_prompts(policy, prompts)  # (3, P) left-padded
    c_ids, c_mask = tok.batch_encode(answers, left_pad=False, add_eos=True)  # (3, L) right-padded
    return p_ids, p_mask, c_ids, c_mask


def test_sequence_logprobs_equal_manual_gather_and_zero_on_padding(policy):
    p_ids, p_mask, c_ids, c_mask = _toy_batch(policy)
    token_logp, token_entropy = sequence_logprobs(policy, p_ids, p_mask, c_ids, c_mask, with_entropy=True)
    assert token_logp.shape == c_ids.shape and token_logp.dtype == torch.float32
    assert token_logp.requires_grad and not token_entropy.requires_grad
    assert (token_logp[c_mask == 0] == 0).all() and (token_entropy[c_mask == 0] == 0).all()
    assert (token_logp[c_mask == 1] < 0).all()

    # naive loop over the full-sequence logits, same mask and positions
    n_prompt = p_ids.shape[1]
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    with torch.no_grad():
        logits = policy.model(input_ids=ids, attention_mask=mask,
                              position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    vocab_log = math.log(policy.tokenizer.vocab_size)
    for b in range(ids.shape[0]):
        for t in range(c_ids.shape[1]):
            if c_mask[b, t]:
                logp = torch.log_softmax(logits[b, n_prompt - 1 + t].float(), -1)
                assert torch.allclose(token_logp[b, t], logp[c_ids[b, t]], atol=1e-6)
                ent = -(logp.exp() * logp).sum()
                assert torch.allclose(token_entropy[b, t], ent, atol=1e-6)
                assert 0 < token_entropy[b, t] <= vocab_log + 1e-5

    # padding is invisible: each row alone, unpadded, gives the same log-probs
    for b in range(ids.shape[0]):
        pm, cm = p_mask[b].bool(), c_mask[b].bool()
        alone = sequence_logprobs(policy, p_ids[b, pm][None], p_mask[b, pm][None],
                                  c_ids[b, cm][None], c_mask[b, cm][None])
        assert torch.allclose(alone[0], token_logp[b, cm], atol=1e-5)


def test_sequence_logprobs_temperature_and_gradients(policy):
    p_ids, p_mask, c_ids, c_mask = _toy_batch(policy)
    policy.model.zero_grad(set_to_none=True)
    token_logp = sequence_logprobs(policy, p_ids, p_mask, c_ids, c_mask)
    token_logp.sum().backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
        assert grads[name].abs().sum() > 0, name
    policy.model.zero_grad(set_to_none=True)

    with torch.no_grad():
        hot = sequence_logprobs(policy, p_ids, p_mask, c_ids, c_mask, temperature=2.0)
        out = policy.model(input_ids=torch.cat([p_ids, c_ids], 1),
                           attention_mask=torch.cat([p_mask, c_mask], 1),
                           position_ids=(torch.cat([p_mask, c_mask], 1).cumsum(1) - 1).clamp(min=0))
    n_prompt = p_ids.shape[1]
    expected = torch.log_softmax(out.logits[0, n_prompt - 1] / 2.0, -1)[c_ids[0, 0]]
    assert torch.allclose(hot[0, 0], expected, atol=1e-6)


# --------------------------------------------------------------------------- generate


def test_generate_is_deterministic_and_shaped(policy):
    prompts = ["nums 3 4 target 7 =", "nums 1 2 3 target 6 ="]
    a = generate(policy, prompts, 3, 12, 1.0, torch.Generator().manual_seed(7))
    b = generate(policy, prompts, 3, 12, 1.0, torch.Generator().manual_seed(7))
    c = generate(policy, prompts, 3, 12, 1.0, torch.Generator().manual_seed(8))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completion_text == b.completion_text
    assert torch.equal(a.logp_behav, b.logp_behav)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert a.completion_ids.shape == a.completion_mask.shape == a.logp_behav.shape
    assert a.completion_ids.shape[0] == 6 and a.completion_ids.shape[1] <= 12
    assert a.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(a.prompt_ids[0], a.prompt_ids[2]) and a.logp_behav.dtype == torch.float32
    assert a.prompt_mask[:, -1].all()  # left padding: every prompt ends in the last column


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_behav_equals_recomputed_logprobs(policy, temperature):
    prompts = ["nums 3 4 target 7 =", "nums 10 2 3 target 36 =", "nums 5 target 5 ="]
    r = generate(policy, prompts, 4, 16, temperature, torch.Generator().manual_seed(0))
    with torch.no_grad():
        fresh = sequence_logprobs(policy, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                  temperature=temperature)
    assert (r.logp_behav[r.completion_mask == 0] == 0).all()
    assert (fresh - r.logp_behav).abs().max() < 1e-5  # log-ratio of fresh data ~ 0


def test_generate_stops_at_eos_and_pads_after(sft_run):
    pol, _, _ = sft_run
    tok = pol.tokenizer
    prompts = [p for p, _ in _countdown_pairs(8, seed=1)]
    r = generate(pol, prompts, 4, 24, 1.0, torch.Generator().manual_seed(0))
    assert r.finished.float().mean() > 0.5  # the warm-started model ends its answers
    for ids, mask, logp, text, done in zip(r.completion_ids, r.completion_mask, r.logp_behav,
                                           r.completion_text, r.finished):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # ones then zeros
        assert (ids[n:] == tok.pad_token_id).all() and (logp[n:] == 0).all()
        eos_at = (ids[:n] == tok.eos_token_id).nonzero().flatten().tolist()
        assert eos_at == ([n - 1] if done else [])
        assert n == r.completion_ids.shape[1] or done
        assert text == tok.decode(ids[:n])


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}, {"top_k": 1, "top_p": 0.95}])
def test_top_k_one_and_tiny_top_p_are_greedy(policy, truncation):
    r = generate(policy, ["nums 3 4 target 7 ="], 2, 8, 1.0, torch.Generator().manual_seed(0), **truncation)
    assert torch.equal(r.completion_ids[0], r.completion_ids[1])
    assert (r.logp_behav == 0).all()  # probability 1 under the truncated distribution
    ids = torch.cat([r.prompt_ids[:1], r.completion_ids[:1]], 1)
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0]  # no padding in a single row
    n_prompt = r.prompt_ids.shape[1]
    n = int(r.completion_mask[0].sum())
    assert torch.equal(logits[n_prompt - 1:n_prompt - 1 + n].argmax(-1), r.completion_ids[0, :n])


# --------------------------------------------------------------------------- SFT


def test_sft_warm_start_lowers_loss_and_moves_parameters(sft_run):
    pol, losses, before = sft_run
    assert len(losses) == 60 and all(math.isfinite(x) for x in losses)
    assert losses[0] > 0.8 * math.log(pol.tokenizer.vocab_size)  # starts near uniform
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    moved = [not torch.equal(a, b) for a, b in zip(before, pol.model.parameters())]
    assert all(moved)
    assert not pol.model.training  # left in eval mode as it was


# --------------------------------------------------------------------------- errors


def test_bad_sources_raise_one_line_value_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot load model .*no such directory.*local directory") as err:
        load_policy(ModelConfig(source=str(tmp_path / "missing")))
    _assert_one_line(err)
    with pytest.raises(ValueError, match="no config.json") as err:
        load_policy(ModelConfig(source=str(tmp_path)))
    _assert_one_line(err)
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="not a causal LM") as err:
        load_policy(ModelConfig(source=str(tmp_path / "vit")))
    _assert_one_line(err)
    with pytest.raises(ValueError, match="alphabet"):
        load_policy(TINY)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_policy(ModelConfig(dtype="float8"), ALPHABET)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_raises():
    msg = r"CUDA requested but torch.cuda.is_available\(\) is False; use --device cpu"
    with pytest.raises(ValueError, match=msg) as err:
        load_policy(ModelConfig(device="cuda"), ALPHABET)
    _assert_one_line(err)


def test_require_vllm(monkeypatch):
    if not vllm_engine.vllm_available():
        with pytest.raises(ValueError, match="pip install 'replay-theory\\[gpu\\]'"):
            vllm_engine.require_vllm()
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    with pytest.raises(ValueError, match="vLLM requested but not installed") as err:
        vllm_engine.require_vllm()
    _assert_one_line(err)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_gives_identical_logits(sft_run, tmp_path):
    pol, _, _ = sft_run
    save_checkpoint(pol, tmp_path / "ckpt")
    back = load_checkpoint(tmp_path / "ckpt")
    assert back.config == pol.config and back.tokenizer.alphabet == pol.tokenizer.alphabet
    p_ids, p_mask, c_ids, c_mask = _toy_batch(pol)
    with torch.no_grad():
        a = sequence_logprobs(pol, p_ids, p_mask, c_ids, c_mask)
        b = sequence_logprobs(back, p_ids, p_mask, c_ids, c_mask)
    assert torch.equal(a, b)


def test_corrupt_checkpoints_raise_one_line_value_errors(policy, tmp_path):
    def fresh(name):
        return save_checkpoint(policy, tmp_path / name)

    def expect_corrupt(path):
        with pytest.raises(ValueError, match="is corrupt or incomplete.*delete it or point --resume elsewhere") as err:
            load_checkpoint(path)
        _assert_one_line(err)

    ckpt = fresh("no_meta")
    (ckpt / META_FILENAME).unlink()
    expect_corrupt(ckpt)

    ckpt = fresh("bad_meta")
    (ckpt / META_FILENAME).write_text("{not json")
    expect_corrupt(ckpt)

    ckpt = fresh("truncated_weights")
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    expect_corrupt(ckpt)

    ckpt = fresh("no_weights")
    weights = ckpt / "model.safetensors"
    weights.unlink()
    expect_corrupt(ckpt)

    ckpt = fresh("no_tokenizer")
    (ckpt / "char_tokenizer.json").unlink()
    expect_corrupt(ckpt)

    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint(tmp_path / "never_written")
    meta = json.loads((fresh("ok") / META_FILENAME).read_text())
    assert meta["tokenizer"] == "char" and meta["config"]["hidden_size"] == 64


# --------------------------------------------------------------------------- real-checkpoint path


def test_local_hf_checkpoint_shares_the_pipeline(tmp_path):
    """A local directory with a HF tokenizer goes through the same sampling / log-prob / checkpoint code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(ALPHABET)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    hf_config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, intermediate_size=64, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    Qwen2ForCausalLM(hf_config).save_pretrained(tmp_path / "hf")
    hf_tok.save_pretrained(tmp_path / "hf")

    pol = load_policy(ModelConfig(source=str(tmp_path / "hf")))
    assert isinstance(pol.tokenizer, HFTokenizer)
    assert (pol.tokenizer.pad_token_id, pol.tokenizer.eos_token_id, pol.tokenizer.bos_token_id) == (0, 1, None)
    assert pol.tokenizer.encode("3+4", add_bos=True, add_eos=True) == [vocab["3"], vocab["+"], vocab["4"], 1]
    r = generate(pol, ["nums 3 4 target 7 =", "nums 5 target 5 ="], 2, 10, 1.0,
                 torch.Generator().manual_seed(0))
    with torch.no_grad():
        fresh = sequence_logprobs(pol, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert (fresh - r.logp_behav).abs().max() < 1e-5
    losses = sft_warm_start(pol, _countdown_pairs(4), steps=2, batch_size=2, lr=1e-3,
                            generator=torch.Generator().manual_seed(0))
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)

    save_checkpoint(pol, tmp_path / "ckpt")
    back = load_checkpoint(tmp_path / "ckpt")
    assert isinstance(back.tokenizer, HFTokenizer)
    with torch.no_grad():
        again = sequence_logprobs(back, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        now = sequence_logprobs(pol, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert torch.equal(again, now)


# --------------------------------------------------------------------------- precision


def test_fp32_weights_everywhere_and_bf16_autocast_only_on_cuda(policy):
    cuda = ModelConfig(device="cuda")  # resolving dtypes needs no GPU
    assert resolve_dtype(cuda) == torch.float32 and resolve_compute_dtype(cuda) == torch.bfloat16
    assert resolve_dtype(TINY) == resolve_compute_dtype(TINY) == torch.float32
    assert resolve_compute_dtype(ModelConfig(device="cuda", compute_dtype="float16")) == torch.float16
    assert resolve_dtype(ModelConfig(dtype="bfloat16")) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        resolve_compute_dtype(ModelConfig(compute_dtype="fp8"))
    with policy.autocast():
        assert not torch.is_autocast_enabled("cpu")  # CPU runs are plain float32
    # why the master weights stay float32: the paper's lr (3.37e-7) is invisible to a bf16 weight of 0.02
    weight = torch.tensor(0.02, dtype=torch.bfloat16)
    assert torch.equal(weight - 3.37e-7, weight)
    assert float(torch.tensor(0.02) - 3.37e-7) != 0.02
