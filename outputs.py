"""The one rule for writing results, for every command: check before any work, never overwrite, never half-write.

Every command that writes (``simulate --out``, ``sweep``, ``experiment``, ``calibrate-simulator``,
``validate``, ``figures``, ``diagnose --save/--figure``) checks its output paths with these functions
before it starts, and writes through ``write_new``: a temporary file in the same folder, created with
mode 0o666 so the umask applies (0644 under the usual 022; ``tempfile.mkstemp`` would give 0600), then
hard-linked into place, which fails instead of replacing a file that appeared meanwhile.
Errors are one-line ``ValueError``s that name the option as the user typed it.

Writable is checked by trying, not by permission bits: ``check_writable`` creates and removes an empty hidden file
in the folder that will hold the results (or the nearest existing folder above it). Permission bits do not tell:
root passes every one of them, while a read-only mount, ``/sys`` or an ACL refuses whatever they say.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Optional

NEVER = "results are never overwritten"


def check_writable(path: Path, option: str = "--out") -> Path:
    """This process can write in the folder ``path`` (or create it, in its nearest existing folder): a one-line
    ValueError naming ``option`` otherwise. Tried with an empty probe file, created and removed at once."""
    path = Path(path)
    folder = next(p for p in (path, *path.parents) if p.exists())  # "." for a relative path at the least
    probe = folder / f".replay-theory-write-check-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot write in {folder} ({err.strerror or err})") from None
    probe.unlink()
    return path


def check_out_dir(path: Path, option: str = "--out", ours: Optional[Callable[[Path], bool]] = None,
                  holds: str = "") -> Path:
    """``path`` is a directory or does not exist yet, with no file where one of its folders should be, and this
    process can write there.

    ``ours``: when given, a non-empty existing directory must be one this command wrote (``ours(path)``: a sweep's
    spec.json, a validate run's files), so results never mix with other files; ``lambda p: False`` admits only a
    new or empty directory. ``holds`` says what such a directory lacks ("holds no sweep (no spec.json)").
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is an existing file; give a directory (created if absent)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{option} {path}: {parent} is a file, not a folder")
            break
    if ours is not None and path.is_dir() and any(path.iterdir()) and not ours(path):
        raise ValueError(f"{option} {path} is a non-empty directory{' that ' + holds if holds else ''}; results go "
                         "into a new or empty directory, so they never mix with other files")
    return check_writable(path, option)


def check_new_file(path: Path, option: str = "--out", formats: Optional[tuple[str, ...]] = None) -> Path:
    """``path`` can be created without overwriting anything: it does not exist, its folder does."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise ValueError(f"{option} {path} exists; {NEVER}: choose a new path")
    folder = path.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{option} {path}: the folder {folder} {why}; create it first or choose another path")
    if formats is not None and path.suffix.lower().lstrip(".") not in formats:
        raise ValueError(f"{option} {path} must end in one of {', '.join(f'.{f}' for f in formats)}")
    return check_writable(path, option)  # the file does not exist: its folder is tried


def write_new(path: Path, write: Callable[[Path], object], option: str = "--out") -> Path:
    """Write ``path`` whole or not at all, never replacing a file, with the umask's permissions.

    ``write(tmp)`` fills a hidden temporary file in the same folder. A file system without hard links
    falls back to a rename after a last check.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ValueError(f"{option} {path} appeared while this command ran; {NEVER}: choose a new path") from None
        except OSError:  # no hard links here (some network / FAT file systems)
            if path.exists():
                raise ValueError(f"{option} {path} appeared while this command ran; {NEVER}: "
                                 "choose a new path") from None
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_once(path: Path, text: str) -> str | None:
    """Write ``text`` to ``path`` whole, as ``write_new`` does, unless ``path`` exists or appears meanwhile (another
    process writing the same file): then leave it as it is and return its text, for the caller to judge; None when
    this call wrote it. What several workers that may compute one result use: the first whole file wins, and a
    reader never sees a half-written one."""
    path = Path(path)
    if path.exists():
        return path.read_text()
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_text()
        except OSError:  # no hard links here (some network / FAT file systems): a rename after a last check
            if path.exists():
                return path.read_text()
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return None


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (inf, nan) replaced by None, recursively: strict JSON (RFC 8259), the
    form every saved result and ``--json`` output takes."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value
