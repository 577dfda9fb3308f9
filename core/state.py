"""A running object's state (a replay buffer, its random generator, a trainer's counters) saved as JSON plus arrays,
and restored into a freshly built object of the same configuration: what a resumed run needs, without pickle.

Pickle (and ``torch.load`` without ``weights_only``) runs code named in the file when it loads, so a checkpoint
that someone else handed over could do anything (docs/REFERENCES.md's trainers write such files; we never read
them that way). Here the state is a JSON tree, with every array in an ``.npz`` read with ``allow_pickle=False``;
restoring walks the tree and the freshly built object side by side and assigns leaves, so no class is ever made
from what the file says: an object in the tree is restored only into an attribute that already holds an object of
the same class (built from the same configuration), and a frozen dataclass (a config) is compared, not assigned.

| node in the tree            | Python value                                                         |
|-----------------------------|----------------------------------------------------------------------|
| ``{"value": v}``            | None, bool, int, float, str                                          |
| ``{"scalar": dtype, ...}``  | a numpy scalar (np.int64, np.float64, ...)                           |
| ``{"array": key}``          | a numpy array, ``arrays[key]``                                       |
| ``{"tensor": key, ...}``    | a torch tensor (dtype and device recorded; bfloat16 kept exactly)    |
| ``{"generator": state}``    | ``np.random.Generator`` (its bit generator's state)                  |
| ``{"dict"/"list"/"tuple"}`` | containers (dict keys are strings)                                   |
| ``{"object": {...}}``       | an object's attributes (``vars``), restored into the existing object |
| ``{"config": repr}``        | a frozen dataclass or a dtype: must equal the existing one           |
"""

from __future__ import annotations

import dataclasses
from types import FunctionType, MethodType, ModuleType, SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["object_state", "load_object_state", "save_state", "load_state"]


def object_state(obj: Any, skip: tuple[str, ...] = ()) -> tuple[dict, dict[str, np.ndarray]]:
    """(tree, arrays) of ``obj``'s attributes (``vars(obj)``) except ``skip``; the tree is JSON-serialisable."""
    arrays: dict[str, np.ndarray] = {}
    attrs = {k: v for k, v in vars(obj).items() if k not in skip}
    return {"object": {k: _node(v, k, arrays) for k, v in attrs.items()}, "class": type(obj).__qualname__}, arrays


def load_object_state(obj: Any, tree: dict, arrays: Any) -> None:
    """Assign the state ``tree`` / ``arrays`` (from :func:`object_state`) into ``obj``, built with the same config.

    Raises a one-line ValueError when the state does not fit ``obj`` (another class or config)."""
    _restore_into(obj, tree, arrays, "")


def save_state(path_stem: Any, tree: dict, arrays: dict[str, np.ndarray]) -> list:
    """Write ``<stem>.json`` and ``<stem>.npz``; returns the two paths."""
    import json
    from pathlib import Path

    stem = Path(path_stem)
    json_path, npz_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".npz")
    with open(npz_path, "wb") as fh:  # a file handle: np.savez would append .npz to a name without it
        np.savez(fh, **arrays)
    json_path.write_text(json.dumps(tree))
    return [json_path, npz_path]


def load_state(path_stem: Any) -> tuple[dict, dict[str, np.ndarray]]:
    """Read what :func:`save_state` wrote (arrays without pickle)."""
    import json
    from pathlib import Path

    stem = Path(path_stem)
    tree = json.loads(stem.with_name(stem.name + ".json").read_text())
    with np.load(stem.with_name(stem.name + ".npz"), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    return tree, arrays


def _is_ours(value: Any) -> bool:
    """An object whose attributes are state: a SimpleNamespace or an instance of a replay_theory class."""
    return isinstance(value, SimpleNamespace) or type(value).__module__.split(".")[0] == "replay_theory"


def _frozen(instance: Any) -> bool:
    """A frozen dataclass instance (a config): its class's ``__dataclass_params__``."""
    params = getattr(type(instance), "__dataclass_params__", None)
    return params is not None and bool(params.frozen)


def _node(value: Any, path: str, arrays: dict[str, np.ndarray]) -> dict:
    """The tree node of ``value`` (the module docstring's table); arrays and tensors go into ``arrays`` at ``path``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, np.generic):
        return {"scalar": value.dtype.str, "value": value.item()}
    if isinstance(value, np.ndarray):
        return _array_node(value, path, arrays)
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a torch tensor (torch not imported here)
        return _tensor_node(value, path, arrays)
    if isinstance(value, np.random.Generator):
        return {"generator": value.bit_generator.state}
    if isinstance(value, (dict, list, tuple)):
        return _container_node(value, path, arrays)
    return _object_node(value, path, arrays)


def _array_node(value: np.ndarray, path: str, arrays: dict[str, np.ndarray]) -> dict:
    if value.dtype.hasobject:
        raise ValueError(f"state {path}: an object array cannot be saved without pickle")
    arrays[path] = value
    return {"array": path}


def _tensor_node(value: Any, path: str, arrays: dict[str, np.ndarray]) -> dict:
    tensor = value.detach().cpu()
    dtype = str(tensor.dtype).removeprefix("torch.")
    arrays[path] = (tensor.float() if dtype == "bfloat16" else tensor).numpy()  # bf16 -> fp32 -> bf16: exact
    return {"tensor": path, "dtype": dtype, "device": str(value.device)}


def _container_node(value: dict | list | tuple, path: str, arrays: dict[str, np.ndarray]) -> dict:
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"state {path}: only string keys can be saved")
        return {"dict": {k: _node(v, f"{path}.{k}", arrays) for k, v in value.items()}}
    kind = "list" if isinstance(value, list) else "tuple"
    return {kind: [_node(v, f"{path}.{i}", arrays) for i, v in enumerate(value)]}


def _object_node(value: Any, path: str, arrays: dict[str, np.ndarray]) -> dict:
    """A config (compared on restore), code (kept from the fresh object) or one of our objects (its attributes)."""
    if isinstance(value, np.dtype):  # set from the config when the object was built
        return {"config": repr(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and _frozen(value):
        return {"config": repr(value)}
    if isinstance(value, (FunctionType, MethodType, ModuleType, type)) or callable(value) and not _is_ours(value):
        return {"code": repr(value)}  # behaviour, not state: the fresh object was built with the same
    if _is_ours(value):
        return {"object": {k: _node(v, f"{path}.{k}", arrays) for k, v in vars(value).items()},
                "class": type(value).__qualname__}
    raise ValueError(f"state {path}: cannot save a {type(value).__name__} without pickle")


def _restore(node: dict, current: Any, arrays: Any, path: str) -> Any:
    """The value of ``node`` (from :func:`_node`), restored into ``current`` (the fresh object's value) where it has
    one."""
    kind = next(k for k in node if k != "class")
    if kind not in _RESTORE:
        raise ValueError(f"state {path}: unknown node {kind!r}")
    return _RESTORE[kind](node, current, arrays, path)


def _restore_tensor(node: dict, current: Any, arrays: Any, path: str) -> Any:
    import torch

    data = torch.as_tensor(np.array(arrays[node["tensor"]]))
    return data.to(dtype=getattr(torch, node["dtype"]), device=node["device"])


def _restore_generator(node: dict, current: Any, arrays: Any, path: str) -> np.random.Generator:
    if not isinstance(current, np.random.Generator):
        raise ValueError(f"state {path}: a random generator where the object has {type(current).__name__}")
    current.bit_generator.state = node["generator"]
    return current


def _restore_dict(node: dict, current: Any, arrays: Any, path: str) -> dict:
    base = current if isinstance(current, dict) else {}
    return {k: _restore(v, base.get(k), arrays, f"{path}.{k}") for k, v in node["dict"].items()}


def _restore_sequence(node: dict, current: Any, arrays: Any, path: str) -> list | tuple:
    kind = "list" if "list" in node else "tuple"
    base = list(current) if isinstance(current, (list, tuple)) else []
    items = [_restore(v, base[i] if i < len(base) else None, arrays, f"{path}.{i}") for i, v in enumerate(node[kind])]
    return items if kind == "list" else tuple(items)


def _restore_config(node: dict, current: Any, arrays: Any, path: str) -> Any:
    if repr(current) != node["config"]:
        raise ValueError(f"state {path}: saved with {node['config']}, this object has {current!r}")
    return current


def _restore_object(node: dict, current: Any, arrays: Any, path: str) -> Any:
    if current is None or not _is_ours(current):
        raise ValueError(f"state {path}: an object where this one has {type(current).__name__}")
    _restore_into(current, node, arrays, path)
    return current


_RESTORE = {
    "value": lambda node, current, arrays, path: node["value"],
    "scalar": lambda node, current, arrays, path: np.dtype(node["scalar"]).type(node["value"]),
    "array": lambda node, current, arrays, path: np.array(arrays[node["array"]]),
    "tensor": _restore_tensor,
    "generator": _restore_generator,
    "dict": _restore_dict,
    "list": _restore_sequence,
    "tuple": _restore_sequence,
    "config": _restore_config,
    "code": lambda node, current, arrays, path: current,  # behaviour: the fresh object's own
    "object": _restore_object,
}


def _restore_into(obj: Any, node: dict, arrays: Any, path: str) -> None:
    if "object" not in node:
        raise ValueError(f"state {path or 'root'}: not an object's state")
    if node.get("class") != type(obj).__qualname__:
        raise ValueError(f"state {path or 'root'}: saved from a {node.get('class')}, this is a "
                         f"{type(obj).__qualname__}")
    for name, child in node["object"].items():
        setattr(obj, name, _restore(child, getattr(obj, name, None), arrays, f"{path}.{name}" if path else name))
