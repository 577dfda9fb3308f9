"""diagnose / calibrate --from-log on the step files NeMo-RL, SkyRL and slime write (``diagnose/dumps.py``).

None of the three frameworks installs here, so every fixture is written by a faithful transcription of the
framework's own writer (cited on each builder), and every statistic is checked against a hand computation from the
fixture's arrays. Pickles that would run code are refused before anything runs.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import types

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from replay_theory.diagnose import DiagnoseConfig, diagnose  # noqa: E402
from replay_theory.diagnose.dumps import RestrictedUnpickler, UnsafeDump, restricted_load  # noqa: E402


def hand_stats(behav: np.ndarray, current: np.ndarray, keep: np.ndarray) -> dict:
    """The token-level statistics by their definitions, on the kept tokens: log r = current - behav."""
    lr = (current - behav)[keep != 0]  # (n,)
    w = np.exp(lr)
    return {"n_tokens": lr.size, "kl_k1": np.mean(-lr), "m2": np.mean(lr ** 2),
            "chi2": np.mean(w ** 2) - 1.0,  # FreshPER Eq. (24): E[r^2] - 1
            "ess_frac": w.sum() ** 2 / (lr.size * np.sum(w ** 2)),  # Kish
            "ratio_max": w.max(), "ratio_min": w.min()}


def assert_matches(report: dict, want: dict) -> None:
    assert report["n_tokens"] == want["n_tokens"]
    for key in ("kl_k1", "m2", "chi2", "ess_frac", "ratio_max", "ratio_min"):
        assert report[key] == pytest.approx(want[key], rel=1e-10, abs=1e-13), key


def _response_arrays(rng: np.random.Generator, rows: int, length: int):
    """float32-exact behaviour / current log-probs (the frameworks' tensors are float32)."""
    behav = np.log(rng.uniform(0.05, 0.95, size=(rows, length))).astype(np.float32).astype(np.float64)
    current = np.minimum(behav + rng.normal(0, 0.3, size=(rows, length)), -1e-3).astype(np.float32).astype(np.float64)
    return behav, current


# ---- NeMo-RL ------------------------------------------------------------------------------------------------------

def write_nemo_rl(log_dir, step: int, train_data: dict, rewards: list, content: list, input_lengths: list):
    """Transcription of NeMo-RL's writer: ``nemo_rl/algorithms/grpo.py`` L3632-3653 (NVIDIA-NeMo/RL at 7ea279a)
    builds ``log_data`` from ``train_data`` (``.tolist()`` of (B, L) tensors) and ``logger.py`` L1071-1096
    (``log_batched_dict_as_jsonl``) writes ``make_microbatch_iterator(1)`` samples, each value a batch of one,
    with ``"idx": i``."""
    log_data = {"content": content, "rewards": rewards, "input_lengths": input_lengths,
                "token_ids": train_data["input_ids"].tolist(), "token_loss_mask": train_data["token_mask"].tolist(),
                "sample_loss_mask": train_data["sample_mask"].tolist(),
                "advantages": train_data["advantages"].tolist(),
                "generation_logprobs": train_data["generation_logprobs"].tolist(),
                "prev_logprobs": train_data["prev_logprobs"].tolist()}
    path = log_dir / f"train_data_step{step}.jsonl"
    batch = len(rewards)
    with open(path, "w") as f:
        for i in range(batch):
            sample = {key: value[i:i + 1] for key, value in log_data.items()}  # BatchedDataDict slice of size 1
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")
    return path


def nemo_rl_batch(rng: np.random.Generator, batch: int = 5, width: int = 12, prompt: int = 3):
    """A GRPO batch as NeMo-RL's train_data holds it: prompt + response + right padding, the log-prob of token t at
    position t (0 on the prompt and padding), token_mask 1 on response tokens, one sample masked out."""
    behav, current = _response_arrays(rng, batch, width)
    lengths = rng.integers(3, width - prompt + 1, size=batch)  # (B,) response lengths
    token_mask = np.zeros((batch, width))
    for i, n in enumerate(lengths):
        token_mask[i, prompt:prompt + n] = 1
    behav, current = behav * token_mask, current * token_mask  # 0 off the response, as NeMo-RL stores them
    rewards = rng.integers(0, 2, size=batch).astype(float)
    advantages = np.repeat((rewards - rewards.mean())[:, None], width, axis=1) * token_mask  # per token
    sample_mask = np.ones(batch)
    sample_mask[1] = 0.0  # loss_multiplier 0: NeMo-RL leaves the sample out of the loss
    data = {"input_ids": rng.integers(0, 1000, size=(batch, width)), "token_mask": token_mask,
            "sample_mask": sample_mask, "advantages": advantages, "generation_logprobs": behav,
            "prev_logprobs": current}
    return data, rewards.tolist(), [f"sample {i}" for i in range(batch)], (lengths + prompt).tolist()


def test_nemo_rl_preset_matches_hand_computation(tmp_path, cli):
    rng = np.random.default_rng(0)
    steps = {}
    for step in (1, 2):
        data, rewards, content, lengths = nemo_rl_batch(rng)
        write_nemo_rl(tmp_path, step, data, rewards, content, lengths)
        steps[step] = (data, rewards)
    one = tmp_path / "train_data_step1.jsonl"
    data, rewards = steps[1]
    keep = data["token_mask"] * data["sample_mask"][:, None]
    report = diagnose(DiagnoseConfig(path=str(one), preset="nemo-rl", run_what_if=False))
    assert_matches(report, hand_stats(data["generation_logprobs"], data["prev_logprobs"], keep))
    assert report["n_sequences"] == 4  # the masked sample is gone
    assert report["mean_reward"] == pytest.approx(np.mean(np.repeat(rewards, keep.sum(1).astype(int))))
    assert report["columns"]["logp_behav"] == "generation_logprobs" and "age" not in report["columns"]
    # a folder reads every step file, in step order
    both = diagnose(DiagnoseConfig(path=str(tmp_path), preset="nemo-rl", run_what_if=False))
    cat = [np.concatenate([steps[s][0][k] for s in (1, 2)]) for k in ("generation_logprobs", "prev_logprobs")]
    keeps = np.concatenate([steps[s][0]["token_mask"] * steps[s][0]["sample_mask"][:, None] for s in (1, 2)])
    assert_matches(both, hand_stats(*cat, keeps))
    code, out, err = cli("diagnose", str(one), "--preset", "nemo-rl", "--json", "--no-what-if")
    assert code == 0 and err == "" and json.loads(out)["kl_k1"] == pytest.approx(report["kl_k1"], rel=1e-15)


def test_nemo_rl_skipped_prev_logprobs_refused(tmp_path, error_line):
    data, rewards, content, lengths = nemo_rl_batch(np.random.default_rng(1))
    data["prev_logprobs"] = np.zeros_like(data["prev_logprobs"])  # force_on_policy_ratio: grpo.py L3247-3249
    path = write_nemo_rl(tmp_path, 3, data, rewards, content, lengths)
    assert error_line("diagnose", str(path), "--preset", "nemo-rl") == (
        "train_data_step3.jsonl: prev_logprobs is 0 on every trained token (NeMo-RL skips them under "
        "force_on_policy_ratio): the file has no learner log-probs to compare")


def test_calibrate_says_what_the_dump_lacks(tmp_path, error_line):
    data, rewards, content, lengths = nemo_rl_batch(np.random.default_rng(2))
    path = write_nemo_rl(tmp_path, 1, data, rewards, content, lengths)
    out = tmp_path / "profile.json"
    assert error_line("calibrate", "--from-log", str(path), "--out", str(out), "--preset", "nemo-rl") == (
        "--preset nemo-rl: NeMo-RL's train_data_step{N}.jsonl carries no step times and no per-row age, so "
        "calibrate --from-log needs a per-row age (--columns age=NAME) and --mu MU (mu = rollout cost / per-sample "
        "update cost, > 0); diagnose reads the files as they are")
    assert not out.exists()


# ---- SkyRL --------------------------------------------------------------------------------------------------------

SKYRL_MODULE = "skyrl.backends.skyrl_train.training_batch"


def skyrl_module(monkeypatch) -> types.ModuleType:
    """SkyRL's ``training_batch`` pickling code, transcribed (NovaSky-AI/SkyRL at a956457,
    ``skyrl/backends/skyrl_train/training_batch.py`` L17-35 ``_serialize_tensor``, L113-117 ``_rebuild_tensor_batch``,
    L244-281 ``__reduce__`` / ``__getstate__``, L395-398 ``save``), registered under SkyRL's module name so that
    pickle writes the globals SkyRL's files name. numpy arrays stand in for ``tensor.numpy()``."""
    module = types.ModuleType(SKYRL_MODULE)

    def _serialize_tensor(arr: np.ndarray) -> dict:
        return {"format": "numpy", "data": arr.tobytes(), "shape": arr.shape, "dtype": str(arr.dtype)}

    def _rebuild_tensor_batch(cls, state):  # never called here: the reader substitutes its own stand-in
        raise AssertionError("SkyRL code must not run when a dump is read")

    class TensorBatch(dict):
        metadata = None

        def __reduce__(self):
            return (_rebuild_tensor_batch, (type(self), self.__getstate__()))

        def __getstate__(self):
            batch_dict = {key: None if value is None else _serialize_tensor(value) for key, value in self.items()}
            return {"batch_dict": batch_dict, "batch_size": self._batch_size, "device": self._device,
                    "metadata": self.metadata}

        def save(self, path):
            with open(path, "wb") as f:
                pickle.dump(self, f)

    class TrainingInputBatch(TensorBatch):
        pass

    for obj in (_rebuild_tensor_batch, TensorBatch, TrainingInputBatch):
        obj.__module__, obj.__qualname__ = SKYRL_MODULE, obj.__name__
        setattr(module, obj.__name__, obj)
    for name in ("skyrl", "skyrl.backends", "skyrl.backends.skyrl_train"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, SKYRL_MODULE, module)
    return module


def write_skyrl(module, export_path, step: int, tensors: dict, metadata: dict):
    """``RayPPOTrainer.dump_data`` (``skyrl/train/trainer.py`` L1236-1242): ``{export_path}/dumped_data/
    global_step_{N}_training_input.pkl`` via ``TrainingInputBatch.save``."""
    batch = module.TrainingInputBatch(tensors)
    batch._batch_size, batch._device, batch.metadata = len(tensors["action_log_probs"]), None, metadata
    folder = export_path / "dumped_data"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"global_step_{step}_training_input.pkl"
    batch.save(path)
    return path


def skyrl_batch(rng: np.random.Generator, batch: int = 6, length: int = 8):
    """(B, T) response tensors, left-padded (``TrainingInput``'s layout), loss_mask 0 on padding and on a tool turn;
    ``rewards`` already popped (trainer.py L436)."""
    behav, current = _response_arrays(rng, batch, length)
    lengths = rng.integers(2, length + 1, size=batch)
    response_mask = (np.arange(length)[None, :] >= (length - lengths)[:, None]).astype(np.int64)  # left padding
    loss_mask = response_mask.astype(np.float32)
    loss_mask[0, -2] = 0.0  # a tool-output token
    return {"sequences": rng.integers(0, 100, size=(batch, length + 4)),
            "attention_mask": np.ones((batch, length + 4), dtype=np.int64),
            "response_mask": response_mask, "loss_mask": loss_mask,
            "action_log_probs": (current * response_mask).astype(np.float32),
            "base_action_log_probs": (behav * response_mask).astype(np.float32),
            "rollout_logprobs": (behav * response_mask).astype(np.float32),
            "advantages": (rng.normal(size=(batch, 1)) * response_mask).astype(np.float32), "values": None}


def test_skyrl_preset_matches_hand_computation(tmp_path, monkeypatch, cli):
    module = skyrl_module(monkeypatch)
    tensors = skyrl_batch(np.random.default_rng(3))
    path = write_skyrl(module, tmp_path, 7, tensors, {"global_step": 7})
    monkeypatch.delitem(sys.modules, SKYRL_MODULE)  # the reader must not need SkyRL's module
    keep = tensors["loss_mask"] * tensors["response_mask"]
    report = diagnose(DiagnoseConfig(path=str(path), preset="skyrl", run_what_if=False))
    want = hand_stats(tensors["rollout_logprobs"].astype(np.float64), tensors["action_log_probs"].astype(np.float64),
                      keep)
    assert_matches(report, want)
    assert report["n_sequences"] == 6 and "reward" not in report["columns"]
    code, out, err = cli("diagnose", str(tmp_path / "dumped_data"), "--preset", "skyrl", "--json", "--no-what-if")
    assert code == 0 and err == "" and json.loads(out)["chi2"] == pytest.approx(want["chi2"], rel=1e-10)


class _WritesAFile:
    """What an attacker pickles: unpickling calls os.system, which would create ``marker``."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_refused_and_runs_nothing(tmp_path, monkeypatch, error_line):
    marker = tmp_path / "pwned"
    folder = tmp_path / "dumped_data"
    folder.mkdir()
    path = folder / "global_step_1_training_input.pkl"
    path.write_bytes(pickle.dumps({"batch_dict": {"x": _WritesAFile(marker)}}))
    line = error_line("diagnose", str(path), "--preset", "skyrl")
    assert line == (f"refused {path.name}: it names the global {os.system.__module__}.system, which is not array or "
                    "tensor data (unpickling it could run code); nothing was loaded")
    assert not marker.exists()
    # hidden inside a SkyRL-shaped batch, behind the admitted SkyRL globals: still refused, still nothing run
    module = skyrl_module(monkeypatch)
    evil = write_skyrl(module, tmp_path / "evil", 2, skyrl_batch(np.random.default_rng(4)), {"x": _WritesAFile(marker)})
    with pytest.raises(UnsafeDump, match=f"the global {os.system.__module__}.system"):
        restricted_load(evil)
    with pytest.raises(UnsafeDump, match="the global builtins.eval"):
        RestrictedUnpickler(__import__("io").BytesIO(b"cbuiltins\neval\n(S'1'\ntR."), "inline").load()
    assert not marker.exists()


# ---- slime --------------------------------------------------------------------------------------------------------

def write_slime(torch, dump_details, rollout_id: int, rollout_data: dict):
    """slime's writer (THUDM/slime at 624b824): ``--dump-details DIR`` sets ``save_debug_train_data =
    DIR/train_data/{rollout_id}.pt`` (``slime/utils/arguments.py`` L1890-1892); ``save_debug_train_data``
    (``slime/observability/train_data_utils.py`` L191-242) with one DP shard ``torch.save`` s
    ``_build_dump_payload`` (L112-188), transcribed here for that shard."""
    shard = {"rank": 0, "data_parallel_rank": 0, "rollout_data": rollout_data}
    id_columns = {"sample_indices": "sample_index", "partition": "rollout_position"}
    layout_fields, whole_batch_fields = ("micro_batch_indices", "num_microbatches", "global_batch_sizes"), \
        ("raw_reward",)
    samples, layout, whole_batch = [], [], {}
    num_local = len(rollout_data["response_lengths"])
    shard_layout = {"rank": shard["rank"], "data_parallel_rank": 0}
    for column in id_columns:
        value = rollout_data.get(column)
        shard_layout[column] = list(value) if value is not None else None
    per_sample = {}
    for key, value in rollout_data.items():
        if key in id_columns:
            continue
        if key in whole_batch_fields:
            whole_batch.setdefault(key, value)
        elif key in layout_fields or not (
                (torch.is_tensor(value) and value.dim() >= 1 and value.size(0) == num_local)
                or (isinstance(value, (list, tuple)) and len(value) == num_local)):
            shard_layout[key] = value
        else:
            per_sample[key] = value
    for i in range(num_local):
        sample = {"data_parallel_rank": 0}
        for column, scalar_key in id_columns.items():
            if rollout_data.get(column) is not None:
                sample[scalar_key] = rollout_data[column][i]
        sample.update({key: column[i] for key, column in per_sample.items()})
        samples.append(sample)
    layout.append(shard_layout)
    samples.sort(key=lambda s: s["rollout_position"])
    payload = {"format_version": 2, "rollout_id": rollout_id, "rank": 0, "samples": samples, "dp_shards": layout,
               **whole_batch}
    path = dump_details / "train_data" / f"{rollout_id}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def slime_rollout_data(torch, rng: np.random.Generator, n: int = 5):
    """The train side's ``rollout_data`` (``slime/ray/rollout.py`` L657-750, actor.py L261): per-sample response
    tensors of varying length, int loss masks, scalar rewards."""
    lengths = rng.integers(2, 9, size=n)
    behav = [np.log(rng.uniform(0.05, 0.95, size=k)).astype(np.float32) for k in lengths]
    current = [np.minimum(b + rng.normal(0, 0.3, size=b.size), -1e-3).astype(np.float32) for b in behav]
    masks = [np.ones(k, dtype=np.int32) for k in lengths]
    masks[2][0] = 0  # a tool turn
    rewards = rng.integers(0, 2, size=n).astype(float)
    return {"tokens": [torch.arange(int(k) + 3) for k in lengths], "response_lengths": [int(k) for k in lengths],
            "total_lengths": [int(k) + 3 for k in lengths], "rewards": rewards.tolist(),
            "raw_reward": rewards.tolist(), "truncated": [0] * n, "sample_indices": list(range(n)),
            "partition": list(range(n)), "rollout_ids": list(range(n)),
            "loss_masks": [torch.from_numpy(m) for m in masks],
            "rollout_log_probs": [torch.from_numpy(b) for b in behav],
            "log_probs": [torch.from_numpy(c) for c in current],
            "advantages": [torch.full((int(k),), float(r - rewards.mean())) for k, r in zip(lengths, rewards)],
            "num_microbatches": [1]}, behav, current, masks, rewards


def test_slime_preset_matches_hand_computation(tmp_path, cli):
    torch = pytest.importorskip("torch")
    data, behav, current, masks, rewards = slime_rollout_data(torch, np.random.default_rng(5))
    path = write_slime(torch, tmp_path, 4, data)
    report = diagnose(DiagnoseConfig(path=str(path), preset="slime", run_what_if=False))
    cat = [np.concatenate(x).astype(np.float64) for x in (behav, current, masks)]
    assert_matches(report, hand_stats(*cat))
    kept = np.array([m.sum() for m in masks])
    assert report["mean_reward"] == pytest.approx(np.sum(rewards * kept) / kept.sum())
    code, out, err = cli("diagnose", str(tmp_path / "train_data"), "--preset", "slime", "--json", "--no-what-if")
    assert code == 0 and err == "" and json.loads(out)["ess_frac"] == pytest.approx(report["ess_frac"], rel=1e-15)


def test_slime_refuses_code_and_says_it_needs_torch(tmp_path, monkeypatch, error_line):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    path = tmp_path / "train_data" / "9.pt"
    path.parent.mkdir()
    torch.save({"format_version": 2, "samples": [_WritesAFile(marker)]}, path)
    assert error_line("diagnose", str(path), "--preset", "slime") == (
        f"refused 9.pt: torch.load(weights_only=True) will not load it (it names the global "
        f"{os.system.__module__}.system); nothing was loaded")
    assert not marker.exists()
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    assert error_line("diagnose", str(path), "--preset", "slime") == (
        "--preset slime (9.pt, saved with torch.save) needs torch (an optional dependency): pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu on a machine without a CUDA GPU, else pip install torch")


def test_restricted_unpickler_admits_arrays_and_tensors():
    """What the whitelist is for: numpy arrays (numpy 1 and 2 module names) and plainly pickled torch tensors."""
    import io

    arrays = {"a": np.arange(6.0).reshape(2, 3), "b": np.array([1, 0], dtype=np.int8), "s": np.float32(0.5)}
    for protocol in (2, 4, 5):
        back = RestrictedUnpickler(io.BytesIO(pickle.dumps(arrays, protocol=protocol)), "inline").load()
        assert all(np.array_equal(back[k], v) and back[k].dtype == np.asarray(v).dtype for k, v in arrays.items())
    legacy = pickle.dumps(np.arange(3.0), protocol=2).replace(b"numpy._core", b"numpy.core")  # a numpy 1 pickle
    assert np.array_equal(RestrictedUnpickler(io.BytesIO(legacy), "inline").load(), np.arange(3.0))
    torch = pytest.importorskip("torch")
    tensor = torch.tensor([[-0.5, -1.25], [-2.0, 0.0]], dtype=torch.bfloat16)
    back = RestrictedUnpickler(io.BytesIO(pickle.dumps({"t": tensor})), "inline").load()
    assert back["t"].dtype == torch.bfloat16 and torch.equal(back["t"], tensor)
