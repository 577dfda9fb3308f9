"""Speed and memory of ``replay-theory diagnose`` on a 10-million-token log, against plain pandas.

Writes a synthetic long-layout Parquet log (seq_id, logp_behav, logp_current,
age, advantage; 10M tokens in ~300k sequences, ages 0-7) once, then runs, each
in a fresh subprocess so that peak memory is its own:

* ``stats``: ``diagnose`` with the what-if table off (token, sequence and
  by-age statistics, bounds, drift) -- the same work as the pandas baseline;
* ``full``: ``diagnose`` with the default what-if table (PPO clip, TIS, masks,
  M2PO both variants, FreshPER);
* ``pandas``: ``pd.read_parquet`` of the whole file, then the same token,
  sequence (groupby seq_id) and by-age (groupby age) statistics in vectorised
  pandas / numpy (log-sum-exp for D_2 and ESS).

Prints rows (tokens) per second and peak RSS of each, and the ratios to pandas
measured in this one run; checks that ``stats`` and ``pandas`` agree.
Run: ``python bench/bench_diagnose.py [--tokens N] [--keep PATH]`` (needs pandas: ``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_log(path: Path, n_tokens: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    piece = 1_000_000
    writer = None
    seq_base, written = 0, 0
    while written < n_tokens:
        lengths = rng.integers(8, 56, size=piece // 30)
        lengths = lengths[np.cumsum(lengths) <= min(piece, n_tokens - written)]
        n = int(lengths.sum())
        if n == 0:  # fewer tokens left than the shortest sequence
            break
        seq = seq_base + np.repeat(np.arange(lengths.size), lengths)
        age = np.repeat(rng.integers(0, 8, size=lengths.size), lengths).astype(np.float64)
        behav = -rng.exponential(1.0, size=n)
        current = np.minimum(behav + rng.normal(scale=0.03, size=n) * np.sqrt(1.0 + age), 0.0)
        adv = np.repeat(rng.normal(size=lengths.size), lengths)
        table = pa.table({"seq_id": seq, "logp_behav": behav, "logp_current": current, "age": age,
                          "advantage": adv})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=262_144)
        seq_base += lengths.size
        written += n
    writer.close()


def pandas_statistics(path: str) -> dict:
    """The plain pandas implementation: whole file in memory, vectorised statistics."""
    import pandas as pd
    from scipy.special import logsumexp

    df = pd.read_parquet(path, columns=["seq_id", "logp_behav", "logp_current", "age"])
    df["lr"] = df["logp_current"] - df["logp_behav"]

    def stats(lr: np.ndarray) -> dict:
        n = lr.size
        d2 = logsumexp(2 * lr) - np.log(n)
        return {"n": n, "kl_k1": float(-lr.mean()), "kl_k2": float(0.5 * (lr**2).mean()),
                "kl_k3": float((np.expm1(lr) - lr).mean()), "m2": float((lr**2).mean()), "d2": float(d2),
                "chi2": float(np.expm1(d2)), "ess_frac": float(np.exp(2 * logsumexp(lr) - logsumexp(2 * lr)) / n),
                "ratio_max": float(np.exp(lr.max()))}

    out = stats(df["lr"].to_numpy())
    out["sequence"] = stats(df.groupby("seq_id", sort=False)["lr"].sum().to_numpy())
    out["by_age"] = {float(a): stats(g.to_numpy()) for a, g in df.groupby("age")["lr"]}
    return out


def worker(mode: str, path: str) -> None:
    start = time.perf_counter()
    if mode == "pandas":
        result = pandas_statistics(path)
        summary = {"ess_frac": result["ess_frac"], "m2": result["m2"], "n_tokens": result["n"],
                   "seq_ess_frac": result["sequence"]["ess_frac"], "n_ages": len(result["by_age"])}
    else:
        from replay_theory.diagnose import DiagnoseConfig, diagnose

        report = diagnose(DiagnoseConfig(path=path, chunk_rows=262_144, run_what_if=(mode == "full")))
        summary = {"ess_frac": report["ess_frac"], "m2": report["m2"], "n_tokens": report["n_tokens"],
                   "seq_ess_frac": report["sequence"]["ess_frac"], "n_ages": len(report["by_age"])}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mode": mode, "seconds": seconds, "peak_rss": peak, **summary}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="Write / reuse the log here.")
    parser.add_argument("--worker", choices=["stats", "full", "pandas"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.path)
        return
    try:
        import pandas  # noqa: F401
    except ImportError:
        sys.exit("bench_diagnose needs pandas for its baseline: pip install pandas")
    tmp = tempfile.TemporaryDirectory()
    path = args.keep or Path(tmp.name) / "log.parquet"
    if not path.exists():
        t = time.perf_counter()
        write_log(path, args.tokens)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")
    results = {}
    for mode in ("pandas", "stats", "full"):
        proc = subprocess.run([sys.executable, __file__, "--worker", mode, "--path", str(path)],
                              capture_output=True, text=True, check=True)
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    n = results["stats"]["n_tokens"]
    assert n == results["pandas"]["n_tokens"]
    for key in ("ess_frac", "m2", "seq_ess_frac"):
        a, b = results["stats"][key], results["pandas"][key]
        assert abs(a - b) <= 1e-9 * max(1.0, abs(b)), (key, a, b)
    base = results["pandas"]
    print(f"{n:,} tokens; diagnose and pandas agree (ess_frac {base['ess_frac']:.6f}, "
          f"sequence ess_frac {base['seq_ess_frac']:.6f}, {base['n_ages']} ages)")
    print(f"{'run':<34}{'seconds':>9}{'tokens/s':>13}{'peak RSS':>11}{'speed vs pandas':>17}{'memory vs pandas':>18}")
    labels = {"pandas": "pandas (whole file in memory)", "stats": "diagnose, statistics (streamed)",
              "full": "diagnose, statistics + what-if"}
    for mode in ("pandas", "stats", "full"):
        r = results[mode]
        print(f"{labels[mode]:<34}{r['seconds']:>9.2f}{n / r['seconds']:>13,.0f}{r['peak_rss'] / 2**20:>9.0f} MiB"
              f"{base['seconds'] / r['seconds']:>16.2f}x{r['peak_rss'] / base['peak_rss']:>17.2f}x")


if __name__ == "__main__":
    main()
