"""Stream a rollout log (Parquet, CSV or JSON lines) as chunks of per-token arrays.

Files larger than memory are read piece by piece through pyarrow: Parquet one row group at a time, split into
record batches (only the mapped columns are decoded), CSV by blocks, JSON lines by blocks of whole lines. Each
piece becomes a :class:`TokenChunk` of flat per-token arrays, whichever layout (long / wide, see ``schema.py``)
the file has. Sequence identifiers of any type are mapped to dense integer codes that are stable across chunks,
so a sequence whose tokens straddle two chunks is still one sequence.

pyarrow does the parsing because it streams all three formats with typed, vectorised decoders, and reads only
the columns asked for. Columns become numpy arrays straight from the Arrow buffers (:func:`to_numpy`). With
``sorted_ids`` integer ids that never decrease get running codes and no dictionary (O(1) memory); the first
decrease raises :class:`UnsortedIds`.

Malformed rows are never silently dropped: null log-probs surface as NaN for the caller's validity check, and a
wide row whose lists disagree in length raises unless ``skip_invalid`` is set, in which case it is counted in
``TokenChunk.mismatched_rows``. Tokens whose ``mask`` (padding) or ``tool_mask`` (TRL's tool results) is 0 are
removed here, in either layout, before any check or statistic sees them.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from ..checks import require_integer
from .errors import ConfigError, check_field
from .schema import PRESETS, REQUIRED, ColumnMap

FORMATS = ("parquet", "csv", "jsonl")
_SUFFIX_FORMAT = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv",
                  ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
#: bytes per CSV / JSON-lines block: large enough to amortise parsing, small enough to stream.
BLOCK_BYTES = 16 * 1024 * 1024
#: bytes read from the head of a file to tell Parquet, JSON lines and CSV apart.
SNIFF_BYTES = 4096
#: the per-token float quantities a :class:`TokenChunk` carries (masks are applied, not carried).
_TOKEN_FIELDS = ("logp_behav", "logp_current", "age", "advantage", "reward")
_READ_FIELDS = (*_TOKEN_FIELDS, "mask", "tool_mask")
_KIND = {"parquet": "a Parquet file", "jsonl": "a JSON-lines file", "csv": "a CSV file",
         "binary": "a binary file that is not Parquet", "json-array": "one JSON array, not one object per line"}
#: log-probs in (0, LOGP_ROUNDOFF] are round-off from bf16 / fused kernels and read as 0.
LOGP_ROUNDOFF = 1e-6


def grow(a: np.ndarray, size: int, fill) -> np.ndarray:
    """``a`` (n,) extended to at least ``size`` entries filled with ``fill`` (capacity doubles: amortised O(1))."""
    if size <= a.size:
        return a
    out = np.full(max(size, 2 * a.size), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


class UnsortedIds(Exception):
    """Raised by a ``sorted_ids`` reader at the first sequence id that is smaller than one before it."""


def require_pyarrow():
    """The pyarrow module, or a one-line ValueError naming the extra that installs it."""
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the diagnose/test extras install it
        raise ValueError("diagnose needs pyarrow to read logs: pip install 'replay-theory[diagnose]'") from exc
    return pyarrow


@dataclass
class TokenChunk:
    """One streamed piece of a log, flattened to tokens (padding already removed)."""

    seq: np.ndarray  # (n,) int64 dense sequence codes, stable across chunks (consecutive when ``sorted_ids``)
    logp_behav: np.ndarray  # (n,) float64
    logp_current: np.ndarray  # (n,) float64
    age: Optional[np.ndarray]  # (n,) float64 or None
    advantage: Optional[np.ndarray]  # (n,) float64 or None
    reward: Optional[np.ndarray]  # (n,) float64 or None
    first_row: int  # file row of the chunk's first row (for error messages)
    mismatched_rows: int = 0  # wide rows skipped because their lists disagree in length


def sniff_format(path: Path) -> Optional[str]:
    """What the head of ``path`` looks like: parquet, jsonl, json-array, csv, binary or None (empty, unreadable)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    if not head:
        return None
    if head[:4] == b"PAR1":
        return "parquet"
    if any(b < 0x20 and b not in b"\t\n\r" for b in head) or b"\x7f" in head:
        return "binary"
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]  # a UTF-8 byte-order mark may precede the text
    return {b"{": "jsonl", b"[": "json-array"}.get(first, "csv")


def detect_format(path: Path, fmt: str = "auto") -> str:
    """The format to read ``path`` as: ``fmt``, or from the suffix when ``auto``; refuses one the bytes contradict.

    Reading a Parquet file as CSV would fill error messages with its raw control
    bytes, so the file's head (:func:`sniff_format`) must agree with the format.
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError("format", f"must be auto, {', '.join(FORMATS)}; got {fmt!r}")
    valid = f"valid: auto, {', '.join(FORMATS)}"
    chosen = fmt if fmt != "auto" else next(
        (_SUFFIX_FORMAT[s.lower()] for s in reversed(path.suffixes) if s.lower() in _SUFFIX_FORMAT), None)
    if chosen is None:
        raise ConfigError("format", f"auto cannot tell the format of {path.name} from its suffix ({valid})")
    seen = sniff_format(path) if path.is_file() else None
    # refuse only what the head proves: Parquet's magic, control bytes, '[' or '{' read as CSV; a text file
    # read as Parquet or CSV read as JSON lines fails in pyarrow with a one-line message of its own
    if ((seen == "parquet" and chosen != "parquet") or (chosen in ("csv", "jsonl") and seen in ("binary", "json-array"))
            or (chosen == "csv" and seen == "jsonl")):
        how = "" if fmt != "auto" else f" (auto took {chosen} from the suffix)"
        raise ConfigError("format", f"{fmt} does not match {path.name}{how}: it looks like {_KIND[seen]} ({valid})")
    return chosen


def check_log_options(path: Path, columns: ColumnMap, fmt: str, chunk_rows: int) -> None:
    """The log exists (a file, or a folder for a dump preset), ``chunk_rows`` >= 1, and a dump preset reads its files
    as they are (format auto)."""
    if not (path.is_file() or (columns.dump and path.is_dir())):
        raise ConfigError("path", f"{path} is not a file " + (
            "or a folder (not found)" if columns.dump else "(not found, or a directory)"))
    check_field(require_integer, "chunk_rows", chunk_rows, 1, whole_floats=True)
    if columns.dump and fmt != "auto":
        raise ConfigError("format", f"must be auto with --preset {columns.dump} (it reads the framework's own "
                                    f"files), got {fmt!r}")


class LogReader:
    """Iterates a log file as :class:`TokenChunk` s; tracks progress and sequence codes."""

    def __init__(self, path: str | os.PathLike, columns: ColumnMap, *, fmt: str = "auto",
                 chunk_rows: int = 262144, skip_invalid: bool = False, sorted_ids: bool = False) -> None:
        self.path = Path(path)
        self.dump = None  # a framework's dump files (``dumps.DumpSource``), for the nemo-rl / skyrl / slime presets
        check_log_options(self.path, columns, fmt, chunk_rows)
        self.format = columns.dump or detect_format(self.path, fmt)
        self.chunk_rows = int(chunk_rows)
        self.skip_invalid = skip_invalid
        self.total_bytes = self.path.stat().st_size if self.path.is_file() else 0
        self.bytes_done = 0
        self.rows_done = 0
        self._codes: dict = {}
        # sorted_ids: integer ids that never decrease (each sequence's tokens together, as TRL's and verl's exports
        # and most loggers write them) get consecutive codes from a running counter, so a finished sequence can be
        # folded and forgotten; the first id below its predecessor raises UnsortedIds (the caller re-reads unsorted)
        self.sorted_ids = sorted_ids
        self._last_id = None
        self._next_code = 0
        self._pa = require_pyarrow()
        self._open_schema(columns.dump)
        self.names = list(self.schema.names)
        self.used = {field: name for field, name in columns.columns().items() if name in self.names}  # field -> column
        for field in REQUIRED:
            if field not in self.used:
                raise ValueError(missing_column(self.path.name, field, getattr(columns, field), self.names))
        self.layout = self._layout(columns)

    def _open_schema(self, dump: Optional[str]) -> None:
        """``schema`` (and, for a dump preset, ``dump`` and the files' ``total_bytes``), read from the file heads."""
        if dump:
            from .dumps import DumpSource

            self.dump = DumpSource(dump, self.path)
            self.schema, self.total_bytes = self.dump.schema, self.dump.total_bytes
            return
        try:
            self.schema = read_schema(self.path, self.format)
        except Exception as exc:  # pyarrow raises many types for a corrupt file
            raise ValueError(f"cannot read {self.path.name} as {self.format}: {self._parse_error(exc, 0)}") from exc

    def _layout(self, columns: ColumnMap) -> str:
        """wide (list columns, a row per sequence) or long (a row per token): the mapped one, or the log-prob
        column's type under auto; refused where the format or the columns cannot hold it."""
        layout = columns.layout
        if layout == "auto":  # CSV has no list columns
            wide = self.format != "csv" and _is_list_type(self.schema.field(self.used["logp_behav"]).type)
            layout = "wide" if wide else "long"
        if layout == "wide" and self.format == "csv":
            raise ValueError("the wide layout (list columns) needs Parquet or JSON lines, not CSV")
        if layout == "long" and "seq_id" not in self.used:
            raise ValueError(
                f"column {columns.seq_id!r} (seq_id) not in {self.path.name}: the long layout (a row per token) "
                "needs a sequence id; map it with --columns seq_id=NAME")
        return layout

    def __iter__(self) -> Iterator[TokenChunk]:
        floats = [self.used[f] for f in _READ_FIELDS if f in self.used]
        names = sorted(set(self.used.values()))
        batches = self.dump.batches(names, self.chunk_rows) if self.dump is not None else \
            iter_batches(self.path, self.format, names, self.chunk_rows, floats, self.schema)
        try:
            for batch, self.bytes_done in batches:
                chunk = self._wide(batch) if self.layout == "wide" else self._long(batch)
                self.rows_done += batch.num_rows
                yield chunk
        except Exception as exc:  # pyarrow parse errors mid-file: one line, no traceback
            if _ours(exc, self._pa) or isinstance(exc, UnsortedIds):
                raise
            if self.format == "jsonl":
                raise ValueError(f"cannot read {self.path.name}: {self._parse_error(exc, self.rows_done)}") from exc
            raise ValueError(f"cannot read {self.path.name} past row {self.rows_done}: {_first_line(exc)}") from exc

    def _parse_error(self, exc: BaseException, rows_before: int) -> str:
        """pyarrow's message, for JSON lines with the file's 1-based line number in place of pyarrow's row (0-based,
        counted from the start of the block that failed, blank lines skipped): ``rows_before`` rows came before it."""
        text = _first_line(exc)
        found = _PYARROW_ROW.search(text) if self.format == "jsonl" else None
        if found is None:
            return text
        line, content = _line_of_row(self.path, rows_before + int(found.group(1)))
        if line is None:
            return text
        try:  # pyarrow reads a cut-off line together with the next; Python's parser names what is wrong with it
            json.loads(content)
        except ValueError as err:
            return f"line {line} is not JSON ({getattr(err, 'msg', err)}, column {getattr(err, 'colno', '?')})"
        return f"{text[:found.start()].rstrip()} on line {line}{text[found.end():]}"

    def _check_ages(self, batch) -> None:
        """Ages count optimizer steps (s = t - v): a fractional one means another unit (epochs, seconds) or another
        column, which would make a by-age bucket of its own (diagnose) or a staleness the profile cannot place
        (calibrate). Refused, with the column and its file row, whatever --skip-invalid says: no row is wrong, the
        column is."""
        if "age" not in self.used:
            return
        import pyarrow.compute as pc

        name = self.used["age"]
        col = batch.column(name)
        listed = _is_list_type(col.type)
        kind = col.type.value_type if listed else col.type
        if not self._pa.types.is_floating(kind) and not self._pa.types.is_decimal(kind):
            return  # integers (or strings, refused as numbers later): whole by construction
        values = np.asarray(to_numpy(pc.list_flatten(col) if listed else col), dtype=np.float64)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
        with np.errstate(invalid="ignore"):
            fractional = np.isfinite(values) & (values != np.floor(values))
        if fractional.any():
            i = int(np.argmax(fractional))
            row = int(np.asarray(to_numpy(pc.list_parent_indices(col)))[i]) if listed else i  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
            raise ValueError(f"row {self.rows_done + row} of {self.path.name}: column {name!r} (the age) holds "
                             f"{values[i]:g}, not a whole number of steps; ages count optimizer steps (s = t - v): "
                             "convert the column, or map another with --columns age=NAME")

    def _long(self, batch) -> TokenChunk:
        self._check_ages(batch)
        seq = self._encode(self._ids(batch.column(self.used["seq_id"])))
        seq, arrays = _drop_masked(seq, {f: np.asarray(to_numpy(batch.column(self.used[f])), dtype=np.float64)
                                         if f in self.used else None for f in _READ_FIELDS})
        return TokenChunk(seq=seq, first_row=self.rows_done, **arrays)

    def _wide(self, batch) -> TokenChunk:
        import pyarrow.compute as pc

        self._check_ages(batch)

        def lengths(name: str) -> np.ndarray:
            counts = pc.list_value_length(batch.column(name))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
            return np.asarray(to_numpy(counts), dtype=np.float64)  # null -> NaN

        length = lengths(self.used["logp_behav"])  # (rows,)
        ok = np.isfinite(length)
        list_fields = [f for f in ("logp_current", "mask", "tool_mask", "age", "advantage", "reward")
                       if f in self.used and _is_list_type(batch.schema.field(self.used[f]).type)]
        for field in list_fields:
            ok &= lengths(self.used[field]) == length
        bad = np.flatnonzero(~ok)
        if bad.size and not self.skip_invalid:
            raise ValueError(
                f"row {self.rows_done + int(bad[0])} of {self.path.name}: the per-token lists have different "
                f"lengths (or are null); fix the log or pass --skip-invalid to drop and count such rows")
        length = np.where(ok, length, 0).astype(np.int64)
        keep_rows = self._pa.array(ok)

        def flat(field: str) -> Optional[np.ndarray]:
            if field not in self.used:
                return None
            col = batch.column(self.used[field])
            if field == "logp_behav" or field in list_fields:
                return np.asarray(to_numpy(pc.list_flatten(col.filter(keep_rows))), dtype=np.float64)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute defines its kernels at import
            return np.repeat(np.asarray(to_numpy(col), dtype=np.float64)[ok], length[ok])

        ids = self._ids(batch.column(self.used["seq_id"])) if "seq_id" in self.used else \
            self.rows_done + np.arange(batch.num_rows, dtype=np.int64)  # no id column: one sequence per row
        seq = np.repeat(self._encode(ids)[ok], length[ok])  # (n_tokens,)
        seq, arrays = _drop_masked(seq, {f: flat(f) for f in _READ_FIELDS})
        return TokenChunk(seq=seq, first_row=self.rows_done, mismatched_rows=int(bad.size), **arrays)

    def _ids(self, col) -> np.ndarray:
        """Sequence ids as numpy: integers as they are, anything else as Python objects (None for a null)."""
        if col.null_count == 0 and self._pa.types.is_integer(col.type):
            return to_numpy(col)
        return np.array(col.to_pylist(), dtype=object)

    def _encode(self, ids: np.ndarray) -> np.ndarray:
        """Dense int64 codes for arbitrary sequence ids, stable across chunks."""
        if self.sorted_ids:
            return self._encode_sorted(ids)
        if ids.dtype == object and any(v is None for v in ids[:1]):
            raise ValueError(f"null seq_id near row {self.rows_done} of {self.path.name}")
        try:
            uniq, inverse = np.unique(ids, return_inverse=True)
        except TypeError as exc:  # mixed types or nulls in an object column
            raise ValueError(f"seq_id values near row {self.rows_done} are not comparable (nulls or mixed types)") \
                from exc
        codes = self._codes
        uniq_codes = np.fromiter((codes.setdefault(u, len(codes)) for u in uniq.tolist()),
                                 dtype=np.int64, count=len(uniq))
        return uniq_codes[inverse.reshape(-1)]

    def _encode_sorted(self, ids: np.ndarray) -> np.ndarray:
        """Codes 0, 1, 2, ... in order of appearance for non-decreasing integer ids (no dictionary: O(1) memory)."""
        if ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        if ids.dtype.kind not in "iu":
            raise UnsortedIds("sequence ids are not integers")
        new = ids[1:] != ids[:-1]  # (n-1,) a new sequence starts at i + 1
        down = np.flatnonzero(ids[1:] < ids[:-1]) + 1
        if self._last_id is not None and ids[0] < self._last_id:
            down = np.zeros(1, dtype=np.int64)
        if down.size:
            raise UnsortedIds(f"sequence id decreases at row {self.rows_done + int(down[0])}")
        first = self._next_code - (1 if ids[0] == self._last_id else 0)  # a sequence straddling two chunks
        codes = np.empty(ids.size, dtype=np.int64)
        codes[0] = first
        np.cumsum(new, out=codes[1:])
        codes[1:] += first
        self._last_id = ids[-1]
        self._next_code = int(codes[-1]) + 1
        return codes


def read_schema(path: Path, fmt: str):
    """The Arrow schema of a log: the Parquet footer, or what pyarrow infers from the first MiB of a text file."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).schema_arrow
    with open(path, "rb") as fh:
        head = fh.read(1 << 20)
    head = head[: head.rfind(b"\n") + 1] or head
    if fmt == "jsonl":
        import pyarrow.json as pj

        return pj.read_json(io.BytesIO(head)).schema
    import pyarrow.csv as pc_csv

    return pc_csv.read_csv(io.BytesIO(head)).schema


def iter_batches(path: Path, fmt: str, columns: list[str], chunk_rows: int, floats: Sequence[str] = (),
                 schema=None) -> Iterator[tuple]:
    """(record batch of ``columns``, bytes read so far): at most ``chunk_rows`` rows each, in file order.

    Parquet is read one row group at a time, released before the next: pyarrow 26's ``ParquetFile.iter_batches``
    keeps every batch it decoded until the file object goes (peak RSS 2.75 GB at 100M tokens). CSV and JSON lines
    stream by blocks; ``floats`` are parsed as float64 (as lists of float64 where ``schema``, the head's, has
    lists) whatever the first block looks like.
    """
    import pyarrow as pa

    total = path.stat().st_size
    if fmt == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        # on two cores pyarrow's own decoding threads only compete with diagnose's fold thread
        many_cores = (os.cpu_count() or 1) > 2
        rows, done = max(parquet.metadata.num_rows, 1), 0
        for group in range(parquet.metadata.num_row_groups):
            table = parquet.read_row_group(group, columns=columns, use_threads=many_cores)
            for batch in table.to_batches(max_chunksize=chunk_rows):
                done += batch.num_rows
                yield batch, int(total * done / rows)
        return
    with open(path, "rb") as fh:
        if fmt == "csv":
            import pyarrow.csv as pc_csv

            reader = pc_csv.open_csv(fh, read_options=pc_csv.ReadOptions(block_size=BLOCK_BYTES),
                                     convert_options=pc_csv.ConvertOptions(
                                         include_columns=columns, column_types={n: pa.float64() for n in floats}))
        else:
            import pyarrow.json as pj

            typed = [pa.field(n, pa.list_(pa.float64()) if schema is not None and _is_list_type(
                schema.field(n).type) else pa.float64()) for n in floats]
            reader = pj.open_json(fh, read_options=pj.ReadOptions(block_size=BLOCK_BYTES),
                                  parse_options=pj.ParseOptions(explicit_schema=pa.schema(typed),
                                                                unexpected_field_behavior="infer"))
        for batch in reader:
            missing = [n for n in columns if n not in batch.schema.names]
            if missing:
                raise ValueError(f"column {missing[0]!r} missing from some lines of {path.name}")
            for start in range(0, batch.num_rows, chunk_rows):
                yield batch.select(columns).slice(start, chunk_rows), min(fh.tell(), total)


def _is_list_type(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def to_numpy(col) -> np.ndarray:
    """A numeric Arrow array as numpy (zero-copy when it has no nulls), nulls as NaN.

    Read from the Arrow buffer directly: pyarrow's ``to_numpy`` imports pandas on
    its first call (0.23 s, longer than diagnosing a million tokens).
    """
    import pyarrow as pa

    kind = "f" if pa.types.is_floating(col.type) else "i" if pa.types.is_signed_integer(col.type) else \
        "u" if pa.types.is_unsigned_integer(col.type) else None
    if not col.null_count and kind in ("i", "u") and col.type.bit_width < 32:
        col, kind = col.cast(pa.int64()), "i"
    elif col.null_count or kind is None or col.type.bit_width < 32:
        col, kind = col.cast(pa.float64()).fill_null(float("nan")), "f"  # nulls -> NaN; bool, float16, ... -> float
    dtype = np.dtype(f"{kind}{col.type.bit_width // 8}")
    return np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col), offset=col.offset * dtype.itemsize)


def _drop_masked(seq: np.ndarray, arrays: dict[str, Optional[np.ndarray]]) -> tuple[np.ndarray, dict]:
    """``arrays`` less ``mask`` and ``tool_mask``, at the tokens whose ``mask * tool_mask`` is non-zero (None: all 1).

    The one place masks act: padding (``mask`` 0) and TRL's tool-result tokens (``tool_mask`` 0, whose sampling
    log-prob TRL sets to 0, so their ratio says nothing about the policy) never reach a count or a statistic, as
    they never reach TRL's loss (``completion_mask * tool_mask``). Null flags drop out too.
    """
    flags = [arrays.pop(f) for f in ("mask", "tool_mask")]
    keeps = [np.nan_to_num(f, nan=0.0) != 0 for f in flags if f is not None]
    if not keeps:
        return seq, arrays
    keep = np.logical_and.reduce(keeps)
    return seq[keep], {f: None if a is None else a[keep] for f, a in arrays.items()}


def _ours(exc: BaseException, pa) -> bool:
    """A ValueError raised here (already one line), not a pyarrow error (some subclass ValueError)."""
    return isinstance(exc, ValueError) and not isinstance(exc, pa.lib.ArrowException)


def missing_column(file: str, field: str, name: str, names: list[str]) -> str:
    """The one-line error for a required column ``field`` (mapped to ``name``) that ``file`` lacks: the fix, naming
    the preset whose two log-prob columns the file has where one has them (``diagnose`` and ``calibrate --from-log``
    both say it)."""
    tables = [p for p, cmap in PRESETS.items() if p != "default" and not cmap.dump]  # dump presets read other files
    fits = [p for p in tables if PRESETS[p].logp_behav in names and PRESETS[p].logp_current in names]
    if fits:
        fix = f"this log has the {' and the '.join(fits)} preset's columns: pass --preset {fits[0]}"
    else:
        fix = f"map it with --columns {field}=NAME or pick --preset {'|'.join(tables)}"
    return f"column {name!r} ({field}) not in {file} (columns: {', '.join(names[:12])}); {fix}"


#: where pyarrow's JSON reader names the failing row
_PYARROW_ROW = re.compile(r"\s*\bin row (\d+)\b")


def _line_of_row(path: Path, row: int) -> tuple[Optional[int], bytes]:
    """The 1-based line number and the bytes of the ``row``-th (0-based) non-blank line of ``path``, as pyarrow
    counts rows (blank lines skipped); (None, b"") past the end. Read in blocks: only an error message pays for it."""
    seen = lines_before = 0
    rest = b""
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK_BYTES), b""):
            lines = (rest + block).split(b"\n")
            rest = lines.pop()  # the block's last line may go on in the next block
            nonblank = np.flatnonzero([bool(text.strip()) for text in lines])  # (k,)
            if seen + nonblank.size > row:
                at = int(nonblank[row - seen])
                return lines_before + at + 1, lines[at]
            seen += nonblank.size
            lines_before += len(lines)
    if rest.strip() and seen == row:
        return lines_before + 1, rest
    return None, b""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
