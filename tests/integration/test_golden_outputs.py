"""Every golden case (tests/golden/capture.py) prints what it printed when it was recorded: the same text, each number
within capture.RELATIVE_TOLERANCE, so that the last-digit differences of another numpy build or CPU family pass
(`python tests/golden/capture.py --check --exact` wants every character equal). The two slow cases, a tiny model's
float32 training, are compared only on the machine that recorded them (capture.recorded_elsewhere)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("capture", Path(__file__).parents[1] / "golden" / "capture.py")
capture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capture)


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.slow] if slow else [])
                                  for name, (_, _, slow) in capture.CASES.items()])
def test_golden_output_is_unchanged(name):
    if capture.CASES[name][2]:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
        elsewhere = capture.recorded_elsewhere(name)
        if elsewhere is not None:
            pytest.skip(elsewhere)
    expected = (capture.EXPECTED / f"{name}.txt").read_text()
    difference = capture.first_difference(expected, capture.run_case(name), exact=False, case=name)
    assert difference is None, f"{name} differs at {difference}"
