"""The golden comparison's tolerance (tests/golden/capture.py): on recorded lines, a last-digit change of a number
printed in full passes, and every real change (a number at relative 1e-9, a word, an integer, a digest, a line more
or less) is reported at its line; a case's LOOSER rules cover only their lines. No case is run here: the records are
edited by hand."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("capture", Path(__file__).parents[1] / "golden" / "capture.py")
capture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capture)


def _record(name: str) -> str:
    return (capture.EXPECTED / f"{name}.txt").read_text()


def _edit(text: str, old: str, new: str) -> tuple[str, int]:
    """``text`` with the first line holding ``old`` changed to hold ``new``; the line's number (from 1)."""
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if old in line)
    lines[i] = lines[i].replace(old, new)
    return "".join(lines), i + 1


def _times(printed: str, factor: float) -> str:
    return repr(float(printed) * factor)


# (record, a number printed in full on one of its lines)
FULL = [("simulate-json", "0.008501323361686254"),
        ("diagnose-verl", '"rollout_corr/chi2_token": 0.050745296068304135'),
        ("theory-test-quick", '"smoothness": 0.011464254875652953'),
        ("calibrate-simulator", '"kappa": 0.04542736749665767')]


def test_the_tolerance_is_the_stated_one():
    assert capture.RELATIVE_TOLERANCE == 1e-12


def test_a_last_digit_change_passes_and_exact_mode_reports_it():
    # the example: final_reward_std on an AMD EPYC with another numpy build, relative 1.9e-15
    expected = _record("simulate-json")
    got, line = _edit(expected, "0.008501323361686254", "0.008501323361686238")
    assert abs(0.008501323361686254 / 0.008501323361686238 - 1) == pytest.approx(1.9e-15, rel=0.05)
    assert capture.first_difference(expected, got) is None
    assert capture.lines_within_tolerance(expected, got) == 1
    assert capture.first_difference(expected, got, exact=True) == (
        f'line {line}:\n  expected:   "final_reward_std": 0.008501323361686254,\n'
        f'  got:        "final_reward_std": 0.008501323361686238,')


def test_the_last_digits_seen_with_numpy_2_2_pass():
    # diagnose-verl's one differing line under numpy 2.2.6 on the recording machine: two numbers, relative 4.4e-15
    expected = _record("diagnose-verl")
    got, _ = _edit(expected, '"rollout_corr/chi2_token": 0.050745296068304135',
                   '"rollout_corr/chi2_token": 0.05074529606830436')
    got, _ = _edit(got, '"sampling/sampling_logp_difference/mean": 0.15754214264697103',
                   '"sampling/sampling_logp_difference/mean": 0.15754214264697097')
    assert capture.first_difference(expected, got) is None
    assert capture.first_difference(expected, got, exact=True) is not None


@pytest.mark.parametrize("name, old", FULL)
@pytest.mark.parametrize("factor, passes", [(1 + 2e-15, True), (1 - 5e-13, True), (1 + 1e-9, False), (1 - 1e-9, False),
                                            (1 + 2e-12, False), (-1, False)])
def test_a_number_moved_by_a_factor(name, old, factor, passes):
    expected = _record(name)
    printed = old.split(": ")[-1]
    got, line = _edit(expected, old, old.replace(printed, _times(printed, factor)))
    assert got != expected
    difference = capture.first_difference(expected, got)
    if passes:
        assert difference is None
    else:
        assert difference is not None and difference.startswith(f"line {line}:\n")
        assert printed in difference and _times(printed, factor) in difference


def test_the_first_line_beyond_the_tolerance_is_reported_not_the_first_that_differs():
    expected = _record("simulate-json")
    got, first = _edit(expected, "0.008501323361686254", "0.008501323361686238")  # within
    got, second = _edit(got, '"final_accuracy": 0.6255476567937712',
                        '"final_accuracy": ' + _times("0.6255476567937712", 1 + 1e-9))
    assert first < second
    assert capture.first_difference(expected, got).startswith(f"line {second}:\n")


@pytest.mark.parametrize("name, old, new", [
    # a word
    ("calibrate-simulator", "KL drift per step = 0.000269", "KL draft per step = 0.000269"),
    ("simulate-json", '"buffer": "fifo"', '"buffer": "fifu"'),
    # an integer, and an integer that became a float
    ("simulate-json", '"max_staleness": 3', '"max_staleness": 4'),
    ("simulate-json", '"max_staleness": 3', '"max_staleness": 3.0'),
    ("diagnose-verl", '"n_tokens": 20558,', '"n_tokens": 20559,'),
    # a number printed with few digits: compared as printed
    ("theory-test-quick", "| sgd | 0 | 0.796 [0.54, 0.796] |", "| sgd | 0 | 0.797 [0.54, 0.796] |"),
    # a number that became nan, null or Infinity
    ("simulate-json", '"replay_ratio": 1.0', '"replay_ratio": NaN'),
    ("simulate-json", '"final_reward": 0.6453406818533907', '"final_reward": null'),
    ("calibrate-simulator", "interval [48.29, inf]", "interval [48.29, 1e308]"),
    # a digest, its last hex digit
    ("calibrate-from-log-verl", "11c8ab82957b7d7dc50e80d045c2456fb7bd1a92de171f0b7e65bdfa373c3cf4",
     "11c8ab82957b7d7dc50e80d045c2456fb7bd1a92de171f0b7e65bdfa373c3cf5"),
    ("calibrate-from-log-verl", "(sha256 11c8ab82957b, preset", "(sha256 11c8ab82957c, preset"),
    ("validate-tiny", "sha256 ccabb0498bf243db5bb31900b0b8da5a34975ce8a982da675bf4b3139020a60e",
     "sha256 ccabb0498bf243db5bb31900b0b8da5a34975ce8a982da675bf4b3139020a60f"),
])
def test_a_changed_text_integer_or_digest_is_reported(name, old, new):
    expected = _record(name)
    got, line = _edit(expected, old, new)
    assert capture.first_difference(expected, got).startswith(f"line {line}:\n")


def test_a_line_more_or_less_is_reported():
    expected = _record("gamma")
    lines = expected.splitlines(keepends=True)
    assert capture.first_difference(expected, expected + "one more\n") == (
        f"line {len(lines) + 1}: expected {len(lines)} lines, got {len(lines) + 1}")
    assert capture.first_difference(expected, "".join(lines[:-1])) == (
        f"line {len(lines)}: expected {len(lines)} lines, got {len(lines) - 1}")
    # a line left out in the middle: the first line that no longer matches is reported
    assert capture.first_difference(expected, "".join(lines[:2] + lines[3:])).startswith("line 3:\n")


def test_line_endings_are_compared():
    expected = _record("gamma")
    assert capture.first_difference(expected, expected.replace("\n", "\r\n")) == "line 1: line endings differ"


@pytest.mark.parametrize("a, b, equal", [
    ("x = 0.0", "x = 0.0", True), ("x = 0.0", "x = 1e-300", False), ("x = 0.0", "x = -0.0", True),
    ("x = 1e-17", "x = -1e-17", False),  # near zero: no absolute floor, a sign flip is a change
    ("x = 6.938893903907228e-18", "x = 6.938893903907229e-18", True),  # but its last digit is not
    ("n = 1000000000000000", "n = 1000000000000001", False),  # integers exactly, even where 1e-12 would pass
    ("n = 3", "n = 3.0", False), ("x = nan", "x = nan", True), ("x = inf", "x = 1e308", False),
    ("x = 1e999", "x = 2e999", False),  # too big for a double: compared as printed
    ("key ab1e50", "key ab1e51", False), ("digest 1234567890123456789e5", "digest 1234567890123456788e5", False),
    ("worst 1.29.", "worst 1.2900000000000003.", True), ("x=16-32", "x=16 - 32", False),
    ("| 0.796 | 1.2x |", "| 0.796 | 1.2000000000000002x |", False),  # a number glued to a word is text
])
def test_lines_equal(a, b, equal):
    assert capture.lines_equal(a, b) is equal
    assert capture.lines_equal(a, b, exact=True) is (a == b)


def test_a_long_line_is_shown_around_its_first_difference():
    # diagnose-verl's --json output is one line of ~10,000 characters
    expected = _record("diagnose-verl")
    old = '"kl_k2": 0.023464106516835254'
    got, line = _edit(expected, old, '"kl_k2": ' + _times("0.023464106516835254", 1 + 1e-9))
    difference = capture.first_difference(expected, got)
    shown_old, shown_new = (part.split(":", 1)[1].strip() for part in difference.splitlines()[1:])
    assert difference.startswith(f"line {line}:\n")
    assert old in shown_old and '"kl_k2": 0.023464106540299363' in shown_new
    assert len(shown_old) < 250 and shown_old.startswith("...") and shown_old.endswith("...")


# Lines seen on the recording machine emulating a CPU without AVX-512 (capture.py's docstring), beyond 1e-12: each
# passes under its case's LOOSER rule, and the same kind of line elsewhere, or changed by more, is still reported.
@pytest.mark.parametrize("name, old, new, passes", [
    # the floor power law's degenerate fit: alpha and tau inside "floor_power_law"
    ("calibrate-simulator", '"alpha": 0.15895597427632369', '"alpha": 0.15895204842746347', True),
    ("calibrate-simulator", '"tau": 7045.107916987954', '"tau": 7046.508248052662', True),
    ("calibrate-simulator", '"alpha": 0.15895597427632369', '"alpha": 0.16', False),
    # the pure power law's alpha (a straight-line fit, well determined) moved by 1.6e-5: not under the rule
    ("calibrate-simulator", '"alpha": 0.024945210488778968', '"alpha": 0.0249456', False),
    # curvature pairs by central differences: inside "memory" / "memory_estimators"
    ("calibrate-simulator", '"kappa": 0.04542736749665767', '"kappa": 0.04542736749701642', True),
    ("calibrate-simulator", '"kappa": 0.04542736749665767',
     '"kappa": ' + _times("0.04542736749665767", 1 + 1e-8), False),
    ("calibrate-simulator", '"kl_drift_per_step": 0.0002687922799049635',
     '"kl_drift_per_step": ' + _times("0.0002687922799049635", 1 + 4.8e-11), False),  # not a derivative
    # the bandit's smoothness from a central-difference Hessian sets every step size of theory-test-quick (the record:
    # Zen 4; the edit: the value a Zen 5 EPYC recorded before, capture.py's docstring)
    ("theory-test-quick", '"smoothness": 0.011464254875652953', '"smoothness": 0.011464254875625782', True),
    ("theory-test-quick", "10.903456121292885,", "10.903456121318726,", True),
    ("theory-test-quick", '"smoothness": 0.011464254875652953',
     '"smoothness": ' + _times("0.011464254875652953", 1 + 1e-8), False),
    ("theory-test-quick", "| bandit-grpo | sgd | 0 | 1.48 [0.893", "| bandit-grpo | sgd | 0 | 1.49 [0.893", False),
    # a run's store key: a digest of the config below it
    ("theory-test-quick", '"key": "f3c7876912e719f5"', '"key": "b9cd4f8787235e27"', True),
    ("theory-test-quick", '"key": "f3c7876912e719f5"', '"key": "f3c7876912e719f"', False),
    ("theory-test-quick", '"kind": "pilot"', '"kind": "pilots"', False),
])
def test_a_cases_looser_rules(name, old, new, passes):
    expected = _record(name)
    got, line = _edit(expected, old, new)
    assert capture.first_difference(expected, got) is not None  # beyond RELATIVE_TOLERANCE, or a changed text
    difference = capture.first_difference(expected, got, case=name)
    assert difference is None if passes else difference.startswith(f"line {line}:\n")
    assert capture.first_difference(expected, got, exact=True, case=name) is not None


def test_the_rules_name_real_cases_and_the_derivative_tolerance_is_20x_the_largest_seen():
    assert {rule.case for rule in capture.LOOSER} <= set(capture.CASES)
    assert capture.DERIVATIVE_TOLERANCE == pytest.approx(20 * 4.8e-11, rel=0.05)


def test_a_slow_case_is_compared_only_on_the_machine_that_recorded_it(tmp_path, monkeypatch):
    """``recorded_elsewhere``: None for a fast case (compared everywhere) and for a slow case whose recorded machine is
    this one or was never written; a slow case recorded on another CPU gets one line naming both machines."""
    here = {"cpu": {"vendor_id": "GenuineIntel", "cpu family": "6", "model": "207", "model name": "Xeon"},
            "cpu_capability": "AVX512", "torch": "2.13.0+cpu", "transformers": "5.24.0"}
    monkeypatch.setattr(capture, "EXPECTED", tmp_path)
    monkeypatch.setattr(capture, "machine", lambda: here)
    slow = next(name for name, (_, _, is_slow) in capture.CASES.items() if is_slow)
    fast = next(name for name, (_, _, is_slow) in capture.CASES.items() if not is_slow)
    assert capture.recorded_elsewhere(slow) is None  # no machine recorded: compared, as before
    (tmp_path / f"{slow}.machine.json").write_text(capture.json.dumps(here))
    assert capture.recorded_elsewhere(slow) is None
    zen4 = {**here, "cpu": {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "model name": "EPYC"}}
    (tmp_path / f"{slow}.machine.json").write_text(capture.json.dumps(zen4))
    reason = capture.recorded_elsewhere(slow)
    assert reason.startswith("recorded on ") and "AuthenticAMD" in reason and "GenuineIntel" in reason
    assert "\n" not in reason
    (tmp_path / f"{fast}.machine.json").write_text(capture.json.dumps(zen4))
    assert capture.recorded_elsewhere(fast) is None
