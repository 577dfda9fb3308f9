"""Read the per-step training dumps NeMo-RL, SkyRL and slime already write, as a wide-layout Arrow table.

No paper: this is input plumbing for ``diagnose`` (r = pi_current / pi_behav, ``schema.py``) and
``calibrate --from-log``. Each framework writes both log-prob sides of every trained sample at every step:

============ ======================================================= ================= ================= ==========
preset       file (one per step; a folder of them reads them all)     logp_behav        logp_current      mask
============ ======================================================= ================= ================= ==========
``nemo-rl``  ``train_data_step{N}.jsonl`` (NeMo-RL GRPO, default on)  generation_       prev_logprobs     token_loss_
                                                                      logprobs                            mask x
                                                                                                          sample_
                                                                                                          loss_mask
``skyrl``    ``{export_path}/dumped_data/global_step_{N}_training_   rollout_logprobs  action_log_probs  loss_mask x
             input.pkl`` (``trainer.dump_data_batch=true``)                                               response_
                                                                                                          mask
``slime``    ``{dump_details}/train_data/{rollout_id}.pt``            rollout_log_probs log_probs         loss_masks
             (``--dump-details DIR``)
============ ======================================================= ================= ================= ==========

Where in each framework's source these files are written, and their exact layout: docs/DIAGNOSE.md, 'Logs your
framework already writes'.  Nothing here unpickles without a whitelist: ``.pt`` through
``torch.load(weights_only=True)``, ``.pkl`` through :class:`RestrictedUnpickler` (array / tensor rebuild helpers and
SkyRL's two batch globals, mapped to inert stand-ins; any other global is an :class:`UnsafeDump`).  torch is
optional (slime's files and torch-format SkyRL tensors need it).  One row per sample: per-token fields as float64
list columns, per-sample scalars as float64 columns, and ``step`` (NeMo-RL's and SkyRL's N, slime's rollout id).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .. import TORCH_CPU_INSTALL

#: preset -> (glob of its files in a folder, regex giving the step from a file name)
FILES = {
    "nemo-rl": ("train_data_step*.jsonl", re.compile(r"^train_data_step(\d+)\.jsonl$")),
    "skyrl": ("global_step_*_training_input.pkl", re.compile(r"^global_step_(\d+)_training_input\.pkl$")),
    "slime": ("*.pt", re.compile(r"^(\d+)\.pt$")),
}
#: what a preset's files do not carry, said once wherever it matters (calibrate --from-log, docs/DIAGNOSE.md)
MISSING = {
    "nemo-rl": "NeMo-RL's train_data_step{N}.jsonl carries no step times and no per-row age",
    "skyrl": "SkyRL's global_step_N_training_input.pkl carries no step times, no per-row age and no rewards "
             "(popped before the dump)",
    "slime": "slime's train_data/{rollout_id}.pt carries no step times and no per-row age",
}
STEP_COLUMN = "step"


class UnsafeDump(ValueError):
    """A dump that would run code (or that cannot be read as the framework writes it): one line."""


# ---- the restricted unpickler -------------------------------------------------------------------------------------

class _SkyRLBatchClass:
    """Stand-in for SkyRL's ``TrainingInputBatch`` class: only its name is needed, never its code."""


def _skyrl_rebuild(cls, state: dict) -> dict:
    """Stand-in for SkyRL's ``_rebuild_tensor_batch(cls, state)``: keep the state dict, build nothing."""
    if not isinstance(state, dict):
        raise UnsafeDump("a SkyRL batch whose state is not a dict")
    return state


def _device(*args) -> str:
    """Stand-in for ``torch.device``: SkyRL records the batch's device; a string says as much."""
    return ":".join(str(a) for a in args)


def _torch_storage_from_bytes(data: bytes):
    """torch's ``storage._load_from_bytes``, but through ``torch.load(weights_only=True)``."""
    return require_torch("a pickled torch tensor").load(io.BytesIO(data), weights_only=True, map_location="cpu")


_NUMPY = {"_reconstruct", "scalar", "_frombuffer", "ndarray", "dtype"}
_NUMPY_MODULES = {"numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric",
                  "numpy"}
_TORCH_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"), ("torch", "Size")}
_SKYRL_MODULES = {"skyrl.backends.skyrl_train.training_batch"}
_SKYRL = {"_rebuild_tensor_batch": _skyrl_rebuild, "TrainingInputBatch": _SkyRLBatchClass}


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals array / tensor reconstruction needs.

    Admitted: numpy's ``_reconstruct`` / ``scalar`` / ``_frombuffer`` / ``ndarray`` / ``dtype``; torch's
    ``_rebuild_tensor_v2`` / ``_rebuild_tensor`` / ``Size`` and ``storage._load_from_bytes`` (how a pickled
    tensor's storage travels; replaced by a ``weights_only=True`` load, so the bytes inside are checked too);
    ``collections.OrderedDict`` (a tensor's empty hook dict); ``_codecs.encode``
    (protocol-2 bytes); SkyRL's ``_rebuild_tensor_batch`` / ``TrainingInputBatch`` and ``torch.device``, replaced
    by the inert stand-ins above. Dicts, lists, tuples, strings, numbers and bytes are pickle opcodes, not globals.
    Anything else (``os.system``, ``builtins.eval``, a class's ``__reduce__``) raises :class:`UnsafeDump`.
    """

    def __init__(self, file, name: str) -> None:
        super().__init__(file)
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_MODULES and name in _NUMPY:
            if module.startswith("numpy.core.") and hasattr(np, "_core"):  # numpy 1 names; numpy 2 moved them
                module = "numpy._core." + module[len("numpy.core."):]
            return super().find_class(module, name)
        if module in _SKYRL_MODULES and name in _SKYRL:
            return _SKYRL[name]
        if (module, name) == ("torch", "device"):
            return _device
        if (module, name) == ("collections", "OrderedDict"):
            import collections

            return collections.OrderedDict
        if (module, name) == ("_codecs", "encode"):
            import codecs

            return codecs.encode
        if (module, name) in _TORCH_GLOBALS:
            require_torch("a pickled torch tensor")
            return super().find_class(module, name)
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _torch_storage_from_bytes
        raise UnsafeDump(f"refused {self.name}: it names the global {module}.{name}, which is not array or tensor "
                         "data (unpickling it could run code); nothing was loaded")


def restricted_load(path: Path) -> Any:
    """The object pickled in ``path``, through :class:`RestrictedUnpickler`."""
    with open(path, "rb") as fh:
        try:
            return RestrictedUnpickler(fh, path.name).load()
        except UnsafeDump:
            raise
        except Exception as exc:  # truncated or not a pickle: pickle raises many types
            raise UnsafeDump(f"cannot read {path.name} as a pickle: {type(exc).__name__}: {exc}".splitlines()[0]) \
                from None


def require_torch(what: str):
    """The torch module, or a one-line ValueError: torch is an optional dependency."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{what} needs torch (an optional dependency): {TORCH_CPU_INSTALL} on a machine without a "
                         "CUDA GPU, else pip install torch") from None
    return torch


def torch_load(path: Path) -> Any:
    """``torch.load(path, weights_only=True)``: tensors, dicts, lists and numbers only; refusals in one line."""
    torch = require_torch(f"--preset slime ({path.name}, saved with torch.save)")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        # torch's message is several paragraphs; the global it names is the one fact a user needs
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(exc))
        what = f"it names the global {found.group(1)}" if found else "it holds more than tensors, dicts and numbers"
        raise UnsafeDump(f"refused {path.name}: torch.load(weights_only=True) will not load it ({what}); nothing "
                         "was loaded") from None
    except Exception as exc:
        raise UnsafeDump(f"cannot read {path.name} with torch.load: {str(exc).strip().splitlines()[0]}") from None


# ---- one framework file -> rows ---------------------------------------------------------------------------------

def _array(value: Any) -> Optional[np.ndarray]:
    """``value`` as a float64 numpy array if it is numeric data (list, numpy or torch), else None."""
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().float().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    if isinstance(value, (bool, int, float)):
        return np.asarray(float(value))
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        return None
    if array.dtype.kind not in "biuf":
        return None
    return array.astype(np.float64)


def _nemo_rl_rows(path: Path) -> Iterator[dict]:
    """NeMo-RL: one JSON line per sample, every value a batch of one (``logger.py`` L1089-1096)."""
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path.name} line {number} is not JSON ({getattr(err, 'msg', err)})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path.name} line {number} is not a JSON object")
            row = {}
            for key, value in record.items():
                if key == "idx":
                    row[key] = value
                    continue
                if not isinstance(value, list) or len(value) != 1:
                    if key in ("generation_logprobs", "prev_logprobs"):
                        raise ValueError(f"{path.name} line {number}: {key} is not a batch of one ([[...]]), as "
                                         "NeMo-RL's log_batched_dict_as_jsonl writes it")
                    continue
                row[key] = value[0]  # unwrap the batch of one
            yield row


def _skyrl_rows(path: Path) -> Iterator[dict]:
    """SkyRL: the pickled ``TrainingInputBatch`` state, one row per batch entry (``training_batch.py`` L255-281)."""
    state = restricted_load(path)
    if not isinstance(state, dict) or not isinstance(state.get("batch_dict"), dict):
        raise ValueError(f"{path.name} is not a SkyRL TrainingInputBatch dump (no batch_dict)")
    columns = {}
    for key, blob in state["batch_dict"].items():
        if blob is None:
            columns[key] = None
            continue
        if not isinstance(blob, dict) or blob.get("format") == "tensor_list":
            continue  # multimodal ragged inputs: not per-token quantities
        if blob.get("format") == "torch":  # SkyRL's fallback for dtypes numpy lacks (bf16): a torch.save blob
            tensor = require_torch(f"{path.name}'s {key} (saved in torch's format)").load(
                io.BytesIO(blob["data"]), weights_only=True, map_location="cpu")
            columns[key] = _array(tensor)
            continue
        dtype = np.dtype(blob["dtype"])
        if dtype.kind not in "biuf":
            continue
        columns[key] = np.frombuffer(blob["data"], dtype=dtype).reshape(blob["shape"]).astype(np.float64)
    for key in ("rollout_logprobs", "action_log_probs"):
        if columns.get(key) is None:
            raise ValueError(f"{path.name} has no {key}: SkyRL stores rollout_logprobs only when its generator "
                             "returns the sampler's log-probs, and action_log_probs from the policy forward")
    rows = columns["action_log_probs"].shape[0]
    for i in range(rows):
        yield {key: value[i] for key, value in columns.items() if value is not None and value.shape[:1] == (rows,)}


def _slime_rows(path: Path) -> Iterator[dict]:
    """slime: ``payload["samples"]``, one dict per sample (``train_data_utils.py`` L112-188)."""
    payload = torch_load(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        keys = ", ".join(map(str, payload)) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{path.name} is not slime's train-data dump (format_version 2, a 'samples' list); it holds "
                         f"{keys}")
    yield from payload["samples"]


READERS: dict[str, Callable[[Path], Iterator[dict]]] = {"nemo-rl": _nemo_rl_rows, "skyrl": _skyrl_rows,
                                                        "slime": _slime_rows}


def dump_files(preset: str, path: Path) -> list[tuple[int, Path]]:
    """(step, file) of ``path`` (one file, or a folder of the preset's files), in step order."""
    pattern, regex = FILES[preset]
    if path.is_dir():
        found = [(regex.match(p.name), p) for p in path.glob(pattern)]
        files = sorted((int(m.group(1)), p) for m, p in found if m and p.is_file())
        if not files:
            raise ValueError(f"{path} holds no {pattern} file (what --preset {preset} reads)")
        return files
    if not path.is_file():
        raise ValueError(f"{path} is not a file or a folder (not found)")
    match = regex.match(path.name)
    return [(int(match.group(1)) if match else -1, path)]


def _add_sample(row: dict, lists: dict[str, list], scalars: dict[str, list], rows: int) -> None:
    """Append sample number ``rows``'s per-token arrays to ``lists`` and its numbers to ``scalars``; every column
    stays ``rows + 1`` long (null where the sample lacks the key)."""
    for key, value in row.items():
        array = _array(value)
        if array is None or array.ndim > 1:
            continue  # text, messages, (B, ...) layouts: not a per-token or per-sample number
        target, other = (lists, scalars) if array.ndim == 1 else (scalars, lists)
        if key in other:  # a key that is a list on one sample and a number on another: not read
            continue
        target.setdefault(key, [None] * rows).append(array if array.ndim == 1 else float(array))
    for target in (lists, scalars):
        for values in target.values():
            values.extend([None] * (rows + 1 - len(values)))  # a key this sample lacks: null


def _samples(preset: str, step: int, path: Path) -> tuple[dict[str, list], dict[str, list], int, int]:
    """The file's per-token columns, per-sample columns, sample count and step (slime's rollout_id when the file
    name has none)."""
    lists: dict[str, list] = {}
    scalars: dict[str, list] = {}
    rows = 0
    for row in READERS[preset](path):
        if not isinstance(row, dict):
            raise ValueError(f"{path.name}: sample {rows} is not a dict")
        if preset == "slime" and step < 0 and "rollout_id" in row:
            step = int(row["rollout_id"])
        _add_sample(row, lists, scalars, rows)
        rows += 1
    if rows == 0:
        raise ValueError(f"{path.name} holds no samples")
    return lists, scalars, rows, step


def _list_array(values: list):
    """A pyarrow list<float64> array of per-sample arrays (None: a null list)."""
    import pyarrow as pa

    lengths = np.array([0 if v is None else v.size for v in values], dtype=np.int32)  # (rows,)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    flat = np.concatenate([v for v in values if v is not None]) if lengths.sum() else np.zeros(0)
    mask = pa.array([v is None for v in values])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.float64()), mask=mask)


def read_dump(preset: str, step: int, path: Path):
    """One framework file as a pyarrow Table (one row per sample; see the module docstring)."""
    import pyarrow as pa

    lists, scalars, rows, step = _samples(preset, step, path)
    columns = {key: _list_array(values) for key, values in lists.items()}
    for key, values in scalars.items():
        columns[key] = pa.array(values, pa.float64())
    columns[STEP_COLUMN] = pa.array(np.full(rows, step, dtype=np.int64))
    table = pa.table(columns)
    if preset == "nemo-rl":
        _check_prev_logprobs(table, path)
    return table


def _check_prev_logprobs(table, path: Path) -> None:
    """NeMo-RL writes prev_logprobs = 0 everywhere when it skips them (``force_on_policy_ratio``): no learner side."""
    import pyarrow.compute as pc

    if "prev_logprobs" not in table.column_names or "token_loss_mask" not in table.column_names:
        return
    prev = np.asarray(pc.list_flatten(table.column("prev_logprobs")).to_numpy(zero_copy_only=False))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
    mask = np.asarray(pc.list_flatten(table.column("token_loss_mask")).to_numpy(zero_copy_only=False))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
    if prev.size == mask.size and np.any(mask != 0) and not np.any(prev[mask != 0] != 0):
        raise ValueError(f"{path.name}: prev_logprobs is 0 on every trained token (NeMo-RL skips them under "
                         "force_on_policy_ratio): the file has no learner log-probs to compare")


class DumpSource:
    """The files of a dump preset, read one at a time; ``schema`` is the first file's."""

    def __init__(self, preset: str, path: Path) -> None:
        self.preset = preset
        self.files = dump_files(preset, path)
        self.total_bytes = sum(p.stat().st_size for _, p in self.files)
        self._first = read_dump(preset, *self.files[0])
        self.schema = self._first.schema

    def batches(self, columns: list[str], chunk_rows: int) -> Iterator[tuple]:
        """(record batch of ``columns``, bytes read so far), as ``reader.iter_batches`` yields them."""
        done = 0
        for index, (step, path) in enumerate(self.files):
            table = self._first if index == 0 and self._first is not None else read_dump(self.preset, step, path)
            self._first = None  # released once read (a second pass reads the file again)
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise ValueError(f"{path.name} has no {missing[0]} (the first file, {self.files[0][1].name}, has)")
            done += path.stat().st_size
            for batch in table.select(columns).to_batches(max_chunksize=chunk_rows):
                yield batch, done
