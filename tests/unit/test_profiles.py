"""Noise profiles: buffer averages against quadrature and naive loops; profile files."""

import json
import math

import numpy as np
import pytest

from replay_theory.advise.profile_files import load_profile, save_profile
from replay_theory.theory.profiles import FunctionProfile, PowerLawProfile, TabulatedProfile, sigma_bar_sq


def test_power_law_integral_average_closed_form_vs_quadrature():
    profile = PowerLawProfile(alpha=0.3, tau=2.0, scale=1.5, floor=0.4)
    as_function = FunctionProfile(lambda s: 1.5 * (0.4 + (s / 2.0) ** 0.6))
    xs = np.array([0.5, 1.0, 3.0, 17.0, 250.0])
    np.testing.assert_allclose(sigma_bar_sq(profile, xs), sigma_bar_sq(as_function, xs), rtol=1e-8)
    # hand value: alpha = 1/2, tau = 1, floor 0: (1/x) int_0^x s ds = x/2
    assert sigma_bar_sq(PowerLawProfile(0.5), 6.0) == pytest.approx(3.0, rel=1e-15)


def test_table_integral_is_exact_for_piecewise_linear():
    table = TabulatedProfile((0.0, 2.0, 4.0), (1.0, 3.0, 3.0))
    # int_0^3 = trapezoid 0..2 (area 4) + 2..3 at 3 (area 3) = 7, /3
    assert sigma_bar_sq(table, 3.0) == pytest.approx(7 / 3, rel=1e-15)
    assert sigma_bar_sq(table, 1.0) == pytest.approx((1.0 + 2.0) / 2, rel=1e-15)
    # a table starting after 0 is held flat at its first value on [0, s0]
    late = TabulatedProfile((2.0, 4.0), (2.0, 4.0))
    assert sigma_bar_sq(late, 4.0) == pytest.approx((2 * 2 + (2 + 4) / 2 * 2) / 4, rel=1e-15)


def test_discrete_average_matches_naive_loop():
    profile = PowerLawProfile(alpha=0.2, tau=3.0, floor=1.0)
    horizons = np.array([1, 2, 5, 40])
    naive = [np.mean([float(profile.sigma_sq(s)) for s in range(h)]) for h in horizons]
    np.testing.assert_allclose(sigma_bar_sq(profile, horizons, "discrete"), naive, rtol=1e-14)
    with pytest.raises(ValueError, match="integer >= 1"):
        sigma_bar_sq(profile, 2.5, "discrete")


def test_json_and_csv_profiles_load(tmp_path):
    path = tmp_path / "p.json"
    save_profile(path, {"kind": "power_law", "alpha": 0.3, "tau": 2.0, "floor": 1.0, "rho": 0.05})
    loaded = load_profile(path)
    assert loaded.rho == 0.05 and loaded.profile == PowerLawProfile(0.3, tau=2.0, floor=1.0)
    with pytest.raises(FileExistsError):  # results are never overwritten
        save_profile(path, {"kind": "power_law", "alpha": 0.1})
    csv_path = tmp_path / "p.csv"
    csv_path.write_text("staleness,sigma_sq\n0,1.0\n1,1.5\n4,2.0\n")
    table = load_profile(csv_path)
    assert table.rho is None and table.profile.sigma_sq(2.5) == pytest.approx(1.75)


@pytest.mark.parametrize(
    "content,suffix,message",
    [
        ("{not json", ".json", "is not valid JSON"),
        (json.dumps({"kind": "spline"}), ".json", "kind must be 'power_law', 'table' or 'noise_scale'"),
        (json.dumps({"kind": "table", "staleness": [0, 1]}), ".json", "needs 'staleness' and 'sigma_sq'"),
        (json.dumps({"staleness": [0, 2, 1], "sigma_sq": [1, 2, 3]}), ".json", "strictly increasing"),
        (json.dumps({"staleness": [0, 1], "sigma_sq": [1, -2]}), ".json", "sigma_sq must be a finite number > 0"),
        (json.dumps({"staleness": [0, 1], "sigma_sq": [1, 2], "rho": 3}), ".json", r"rho must be in \[0, 1\]"),
        (json.dumps({"kind": "power_law", "alpha": -1}), ".json", "alpha must be a finite number >= 0"),
        ("a,b\n1,2\n", ".csv", "columns staleness,sigma_sq"),
        ("staleness,sigma_sq\n0,x\n1,2\n", ".csv", "non-numeric"),
    ],
)
def test_bad_profile_files_are_one_line_errors(tmp_path, content, suffix, message):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value)


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        load_profile(tmp_path / "missing.json")


def test_power_law_rejects_bad_parameters():
    with pytest.raises(ValueError, match="tau must be a finite number > 0"):
        PowerLawProfile(0.2, tau=0.0)
    with pytest.raises(ValueError, match="alpha"):
        PowerLawProfile(math.nan)
