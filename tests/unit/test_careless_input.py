"""A careless hand (issue 37): huge, tiny, overflowing and physically implausible values typed into ``optimal`` and
``gamma``. Each is refused in one line naming the option and its range (exit 2), or answered with what to do first;
with every warning an error, so no RuntimeWarning (an overflow, a NaN) can reach the user."""

from __future__ import annotations

import warnings

import pytest

OPTIMAL = ["optimal", "--mu", "5.28", "-B", "512", "--noise-scale", "2383"]
REFUSED = [
    # huge sizes: refused before the search allocates anything per batch
    (OPTIMAL[:3] + ["-B", "1000000000000", "--noise-scale", "2383"], "--batch-size"),
    (OPTIMAL[:3] + ["-B", "100000000", "--noise-scale", "2383", "--kappa", "0.1"], "--batch-size"),
    (OPTIMAL + ["--group-size", "100000000"], "--group-size"),
    # overflowing products: mu x floor, W / T
    (OPTIMAL + ["--latency-floor", "1e308"], "--latency-floor"),
    (OPTIMAL + ["--max-steps-ratio", "1e308"], "--max-steps-ratio"),
    (["optimal", "--objective", "paper", "--mu", "1e100"], "--mu"),
    (["optimal", "--mu", "1e-300"], "--mu"),
    (OPTIMAL[:1] + ["--mu", "5.28", "--noise-scale", "1e300", "-B", "64"], "--noise-scale"),
    (["gamma", "-W", "1e308", "-T", "1e-308", "--mu", "5"], "--workers / --trainers"),
    (["gamma", "-W", "1", "-T", "1e9", "--mu", "5"], "--workers / --trainers"),
    (["gamma", "-W", "6", "-T", "2", "--mu", "1e308"], "--mu"),
    # physically implausible: a kappa beyond the optimizer's stability limit (the memory typed for kappa)
    (OPTIMAL + ["--kappa", "1e308"], "--kappa"),
    (OPTIMAL + ["--kappa", "10", "--optimizer", "sgd"], "--kappa"),
    (OPTIMAL + ["--kappa", "1e-320"], "--kappa"),  # a subnormal kappa: a memory beyond 10^9 steps
]
ANSWERED = [
    OPTIMAL + ["--kappa", "1.99", "--optimizer", "sgd"],
    OPTIMAL + ["--kappa", "1e-9"],
    OPTIMAL + ["--latency-floor", "1e7"],
    OPTIMAL + ["--max-steps-ratio", "1000"],
    OPTIMAL[:3] + ["-B", "10000000", "--noise-scale", "1e12"],
    OPTIMAL[:3] + ["-B", "1", "--noise-scale", "1e-6"],
    ["optimal", "--mu", "10000"],
    ["optimal", "--mu", "0.0001", "-B", "64", "--noise-scale", "64"],
    ["optimal", "--objective", "paper", "--mu", "10000"],
    ["optimal", "--objective", "paper", "--mu", "0.0001", "-R", "64"],
    ["optimal", "--objective", "noise-scale", "--mu", "10000", "-B", "10000000", "--noise-scale", "1e-6"],
]


@pytest.fixture
def strict_cli(cli):
    """The in-process CLI with every warning raised as an error."""

    def run(*args):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return cli(*args)

    return run


@pytest.mark.parametrize("args, option", REFUSED)
def test_implausible_values_are_one_line_naming_the_option(strict_cli, args, option):
    code, out, err = strict_cli(*args)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith(f"replay-theory: error: {option} must be ") and "Traceback" not in err


@pytest.mark.parametrize("args", ANSWERED)
def test_extreme_but_valid_values_answer_what_to_do_first_without_a_warning(strict_cli, args):
    code, out, err = strict_cli(*args)
    assert code == 0, (code, out, err)
    first = out.splitlines()[0]
    assert first.startswith("what to do: ") and "nan" not in out and " inf" not in out.replace("infer", "")
