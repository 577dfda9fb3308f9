"""Speed and memory of ``replay-theory diagnose`` against the queries a practitioner would write instead.

Writes a synthetic long-layout Parquet log (seq_id, logp_behav, logp_current,
age, advantage; 10M tokens in ~300k sequences, ages 0-7) once, then runs, one
after the other, each in a fresh subprocess so that peak memory is its own:

* ``duckdb``: one DuckDB SQL query of the token, sequence (GROUP BY seq_id)
  and by-age k1, M2, D_2 and Kish ESS, log-sum-exp via the group maximum;
* ``polars``: the same as a polars lazy query on the streaming engine;
* ``pandas``: ``pd.read_parquet`` of the whole file, the same in numpy;
* ``stats``: ``diagnose`` with the what-if table off (every statistic of the
  report at token, sequence and age level, framework metrics, bounds, drift);
* ``full``: ``diagnose`` with the default what-if table (PPO clip, TIS, masks,
  M2PO both variants, sequence corrections, FreshPER).

Python's bytecode cache of the modules diagnose imports is filled first, as any
first import fills it (unless PYTHONDONTWRITEBYTECODE is set): no tool pays for
compiling its own code (duckdb, polars and pandas come compiled by pip).
Runs ``--repeat`` rounds (default 3) of all tools, interleaved, so that a noisy
moment on a shared machine hits every tool alike.  Checks that all agree (k1, M2,
D_2, ESS at every level, to 1e-9: the tools sum in different orders), then prints
each tool's median seconds and range, tokens per second, largest peak RSS and the
ratios to the DuckDB query, all measured in this one run, with the load average
before it.
Run: ``python bench/bench_diagnose.py [--tokens N] [--keep PATH] [--modes duckdb,stats,...] [--drift D] [--repeat R]``
(needs pandas and polars: ``pip install -e ".[bench,diagnose]"``).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from replay_theory.checks import require_integer


def write_log(path: Path, n_tokens: int, seed: int = 0, drift: float = 0.03) -> None:
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
        current = np.minimum(behav + rng.normal(scale=drift, size=n) * np.sqrt(1.0 + age), 0.0)
        adv = np.repeat(rng.normal(size=lengths.size), lengths)
        table = pa.table({"seq_id": seq, "logp_behav": behav, "logp_current": current, "age": age,
                          "advantage": adv})
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=262_144)
        seq_base += lengths.size
        written += n
    if writer is None:
        raise ValueError(f"n_tokens={n_tokens} is fewer than the first sequence's tokens: no log to write")
    writer.close()


def _summary(n, s1, s2, top, a, b, top2=None) -> dict:
    """k1, M2, D_2 and the Kish ESS fraction from n, sum lr, sum lr^2, M = max lr, A = sum e^{lr - M},
    B = sum e^{2 (lr - M)} (log-sum-exp, as every tool here computes them)."""
    d2 = 2 * top + np.log(b / n)
    return {"n": int(n), "kl_k1": float(-s1 / n), "m2": float(s2 / n), "d2": float(d2),
            "ess_frac": float(a * a / (n * b))}


def pandas_statistics(path: str) -> dict:
    """The plain pandas implementation: whole file in memory, vectorised statistics."""
    import pandas as pd

    df = pd.read_parquet(path, columns=["seq_id", "logp_behav", "logp_current", "age"])
    df["lr"] = df["logp_current"] - df["logp_behav"]

    def stats(lr: np.ndarray) -> dict:
        top = lr.max()
        e = np.exp(lr - top)
        return _summary(lr.size, lr.sum(), (lr * lr).sum(), top, e.sum(), (e * e).sum())

    return {"token": stats(df["lr"].to_numpy()),
            "sequence": stats(df.groupby("seq_id", sort=False)["lr"].sum().to_numpy()),
            "by_age": {float(a): stats(g.to_numpy()) for a, g in df.groupby("age")["lr"]}}


def duckdb_statistics(path: str) -> dict:
    """The query a practitioner writes: token, sequence and by-age sums in SQL, log-sum-exp via the group max."""
    import duckdb

    sums = "count(*), sum(lr), sum(lr * lr), any_value(m), sum(exp(lr - m)), sum(exp(2 * (lr - m)))"
    query = f"""
        WITH t AS (SELECT seq_id, age, logp_current - logp_behav AS lr FROM read_parquet('{path}')),
        s AS (SELECT seq_id, sum(lr) AS lr FROM t GROUP BY seq_id),
        am AS (SELECT age, max(lr) AS m FROM t GROUP BY age)
        SELECT 'token', NULL, {sums} FROM t, (SELECT max(lr) AS m FROM t)
        UNION ALL SELECT 'sequence', NULL, {sums} FROM s, (SELECT max(lr) AS m FROM s)
        UNION ALL SELECT 'age', t.age, {sums} FROM t JOIN am USING (age) GROUP BY t.age"""
    out: dict = {"by_age": {}}
    for level, age, *row in duckdb.connect().sql(query).fetchall():
        stats = _summary(*row)
        if level == "age":
            out["by_age"][float(age)] = stats
        else:
            out[level] = stats
    return out


def polars_statistics(path: str) -> dict:
    """The same in a polars lazy query on the streaming engine."""
    import polars as pl

    lr = pl.col("lr")
    top = lr.max()
    sums = [pl.len().alias("n"), lr.sum().alias("s1"), (lr * lr).sum().alias("s2"), top.alias("top"),
            (lr - top).exp().sum().alias("a"), (2 * (lr - top)).exp().sum().alias("b")]
    scan = pl.scan_parquet(path).select("seq_id", "age", (pl.col("logp_current") - pl.col("logp_behav")).alias("lr"))
    token, sequence, ages = pl.collect_all([
        scan.select(sums), scan.group_by("seq_id").agg(lr.sum()).select(sums),
        scan.group_by("age").agg(sums).sort("age")], engine="streaming")

    def stats(row: dict) -> dict:
        return _summary(row["n"], row["s1"], row["s2"], row["top"], row["a"], row["b"])

    return {"token": stats(token.row(0, named=True)), "sequence": stats(sequence.row(0, named=True)),
            "by_age": {float(r["age"]): stats(r) for r in ages.iter_rows(named=True)}}


def diagnose_statistics(path: str, what_if: bool) -> dict:
    from replay_theory.diagnose import DiagnoseConfig, diagnose

    report = diagnose(DiagnoseConfig(path=path, run_what_if=what_if))
    pick = ("n_tokens", "kl_k1", "m2", "d2", "ess_frac")
    seq = report["sequence"]
    return {"token": dict(zip(("n", *pick[1:]), (report[k] for k in pick))),
            "sequence": {"n": seq["n_sequences"], **{k: seq[k] for k in pick[1:]}},
            "by_age": {b["age"]: dict(zip(("n", *pick[1:]), (b[k] for k in pick))) for b in report["by_age"]}}


MODES = {"duckdb": ("DuckDB query (token, sequence, by age)", duckdb_statistics),
         "polars": ("polars lazy query, streaming engine", polars_statistics),
         "pandas": ("pandas, whole file in memory", pandas_statistics),
         "stats": ("diagnose, statistics only", lambda p: diagnose_statistics(p, False)),
         "full": ("diagnose, statistics + what-if", lambda p: diagnose_statistics(p, True))}


def worker(mode: str, path: str) -> None:
    start = time.perf_counter()
    result = MODES[mode][1](path)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"mode": mode, "seconds": seconds, "peak_rss": peak, "result": result}))


def agree(a: dict, b: dict, rel: float = 1e-9) -> None:
    """Every token, sequence and by-age statistic of ``a`` equals ``b``'s to ``rel`` (the tools sum in other orders)."""
    groups = [("token", a["token"], b["token"]), ("sequence", a["sequence"], b["sequence"])]
    ages_a, ages_b = ({float(k): v for k, v in x["by_age"].items()} for x in (a, b))  # JSON keys are strings
    assert set(ages_a) == set(ages_b), (sorted(ages_a), sorted(ages_b))
    groups += [(f"age {k}", v, ages_b[k]) for k, v in ages_a.items()]
    for name, x, y in groups:
        for key in ("n", "kl_k1", "m2", "d2", "ess_frac"):
            assert abs(x[key] - y[key]) <= rel * max(abs(y[key]), 1e-300), (name, key, x[key], y[key])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="Write / reuse the log here.")
    parser.add_argument("--drift", type=float, default=0.03,
                        help="Per-token log-ratio noise at age 0 (x sqrt(1 + age)); 0.3 makes M2PO's mask bind.")
    parser.add_argument("--modes", default=",".join(MODES), help="Comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--repeat", type=int, default=3,
                        help="Rounds of all tools, interleaved; seconds are each tool's median, peak RSS its largest.")
    parser.add_argument("--worker", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    return parser.parse_args()


def checked_modes(args: argparse.Namespace) -> list[str]:
    """The modes to run (DuckDB, the reference, among them); exits with a one-line message otherwise."""
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or "duckdb" not in modes:
        sys.exit(f"--modes must name some of {', '.join(MODES)}, duckdb among them; got {args.modes!r}")
    try:
        require_integer("--repeat", args.repeat, 1)
    except ValueError as err:
        sys.exit(str(err))
    return modes


def compile_diagnose_imports() -> None:
    """Fill the bytecode cache of the modules diagnose imports, as any first import does."""
    import replay_theory

    root = Path(replay_theory.__file__).parent
    compileall.compile_file(root / "__init__.py", quiet=1)
    for package in ("diagnose", "theory", "simulate"):
        compileall.compile_dir(root / package, quiet=1)


def time_rounds(modes: list[str], path: Path, repeat: int) -> dict[str, list[dict]]:
    """Each mode's worker result per round; rounds interleave the tools, so a noisy moment hits them alike."""
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(repeat):
        for mode in modes:  # each in a fresh process: its peak RSS is its own
            proc = subprocess.run([sys.executable, __file__, "--worker", mode, "--path", str(path)],
                                  capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def print_table(modes: list[str], results: dict[str, dict], repeat: int) -> None:
    """The agreement line and each tool's median seconds, range, tokens/s, peak RSS and ratios to DuckDB."""
    base = results["duckdb"]
    tok, seq = base["result"]["token"], base["result"]["sequence"]
    n = tok["n"]
    print(f"{n:,} tokens; {', '.join(modes)} agree to 1e-9 on k1, M2, D_2 and ESS at token, sequence and age level "
          f"(ess_frac {tok['ess_frac']:.6f}, sequence ess_frac {seq['ess_frac']:.6f}, "
          f"{len(base['result']['by_age'])} ages)")
    print(f"median of {repeat} interleaved rounds (seconds: median and range)")
    print(f"{'run':<42}{'seconds':>9}{'range':>12}{'tokens/s':>13}{'peak RSS':>11}{'speed vs DuckDB':>17}"
          f"{'memory vs DuckDB':>18}")
    for mode in modes:
        r = results[mode]
        print(f"{MODES[mode][0]:<42}{r['seconds']:>9.2f}{r['range'][0]:>7.2f}-{r['range'][1]:<4.2f}"
              f"{n / r['seconds']:>13,.0f}{r['peak_rss'] / 2**20:>7.0f} MiB"
              f"{base['seconds'] / r['seconds']:>16.2f}x{r['peak_rss'] / base['peak_rss']:>17.2f}x")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.path)
        return
    modes = checked_modes(args)
    tmp = tempfile.TemporaryDirectory()  # held until the end: the log lives in it unless --keep
    path = args.keep or Path(tmp.name) / "log.parquet"
    if not path.exists():
        t = time.perf_counter()
        write_log(path, args.tokens, drift=args.drift)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")
    with open("/proc/loadavg") as fh:
        print(f"load average before: {' '.join(fh.read().split()[:3])} ({os.cpu_count()} CPUs)")
    compile_diagnose_imports()
    runs = time_rounds(modes, path, args.repeat)
    results = {mode: {"seconds": float(np.median([r["seconds"] for r in rs])),
                      "peak_rss": max(r["peak_rss"] for r in rs), "result": rs[0]["result"],
                      "range": (min(r["seconds"] for r in rs), max(r["seconds"] for r in rs))}
               for mode, rs in runs.items()}
    for mode in modes:
        for r in runs[mode]:
            agree(r["result"], results["duckdb"]["result"])
    print_table(modes, results, args.repeat)


if __name__ == "__main__":
    main()
