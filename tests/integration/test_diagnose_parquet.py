"""replay-theory diagnose: streamed statistics against the theory module, what-if, drift, bad input.

Integration tier: the slower tests of this module (a multi-row-group Parquet read); the fast ones are in
tests/unit/test_diagnose.py.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from replay_theory.diagnose import DiagnoseConfig, diagnose  # noqa: E402


# --------------------------------------------------------------------------- TRL's tool_mask
def test_parquet_is_read_one_row_group_at_a_time(tmp_path):
    # Arrow memory held while diagnose reads stays about one row group, not the file: pyarrow's iter_batches kept
    # every decoded batch allocated until the end (2.75 GB peak on a 100M-token log; 1.25 GB with this reader).
    import pyarrow as pa


    rng = np.random.default_rng(0)
    groups, rows = 20, 50_000
    path = tmp_path / "log.parquet"
    with pq.ParquetWriter(path, pa.schema([("seq_id", pa.int64()), ("logp_behav", pa.float64()),
                                           ("logp_current", pa.float64())])) as writer:
        for g in range(groups):
            behav = -rng.exponential(size=rows)
            writer.write_table(pa.table({"seq_id": g * 1000 + np.arange(rows) // 50, "logp_behav": behav,
                                         "logp_current": np.minimum(behav + 0.1 * rng.normal(size=rows), 0)}))
    group_bytes = rows * 3 * 8  # 1.2 MB decoded
    # pyarrow's count is the process's: earlier tests in the same pytest process may still hold Arrow memory (CI
    # once saw 3.4 MB held from the first chunk on, about one group more than this test alone), so count from here
    gc.collect()
    before = pa.total_allocated_bytes()
    held = []
    report = diagnose(DiagnoseConfig(path=str(path), chunk_rows=10_000, run_what_if=False),
                      progress=lambda done, total: held.append(pa.total_allocated_bytes() - before))
    assert report["n_tokens"] == groups * rows
    # a constant number of groups, not the file: the group being read and the previous one (the worker thread may
    # be two chunks behind), plus pyarrow's decoding buffers (held: 21.8 MB = 18 groups with iter_batches, 2.59
    # groups here at 2 and 3 threads, 1.92 at 1)
    assert len(held) >= groups and max(held) < 3 * group_bytes
