"""`experiment theory-test` with workers: each worker scores its own unit's cells (``score_unit``) while the others
train, and the summary is the one a single process writes (issue 38's benchmark; issue 39's speed)."""

import json

from replay_theory.experiments.theory_bench.options import Options
from replay_theory.experiments.theory_bench.score import run_theory_test


def _without_times(summary: dict) -> dict:
    summary = json.loads(json.dumps(summary))
    summary.pop("elapsed_s")
    for unit in summary["units"]:
        unit.pop("elapsed_s", None)
    return summary


def test_two_workers_write_the_summary_one_process_writes(tmp_path):
    options = Options(quick=True, instances=(0,), settings=("quadratic-noise10",), mus=(2.0, 5.28),
                      floors=(0, 64), seeds=8)
    one = run_theory_test(tmp_path / "one", options, progress=False, jobs=1)
    two = run_theory_test(tmp_path / "two", options, progress=False, jobs=2)
    assert len(one["cells"]) == 2 * 2 * 2  # sgd and adam x two mus x two floors
    assert _without_times(two) == _without_times(one)
