"""The `replay-theory` CLI contract: JSON keys and values, human output, one-line errors with exit 2.

Integration tier: the slower tests of this module (subprocess runs and a sympy derivation); the fast ones are in
tests/unit/test_cli.py.
"""

import json
import subprocess
import sys

import pytest


def test_optimal_imports_no_sympy_matplotlib_or_torch():
    code = (
        "import sys\n"
        "from replay_theory.cli.app import main\n"
        "try:\n    main(['optimal', '--mu', '5.28', '--json'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'sympy', 'matplotlib', 'torch', 'pandas'})\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "replay_theory", "gamma", "-W", "1", "-T", "7", "--mu", "5.28",
                             "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert json.loads(result.stdout)["gamma"] == pytest.approx((1 + 1 / 7) / 6.28)


def test_derive_prints_the_derived_y_star(cli):
    code, out, err = cli("derive", "y-star")
    assert code == 0 and err == ""
    assert out.startswith("y-star: Optimal replay ratio")
    assert "sympy.solve" in out and "= 0" in out  # the step that checks the printed form reduces to 0
