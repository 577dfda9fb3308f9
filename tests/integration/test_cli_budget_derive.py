"""`replay-theory optimal --budget`, the large-budget label without it, and honest `gamma` verdicts.

Integration tier: the slower tests of this module (the sympy derivations); the fast ones are in
tests/unit/test_cli_budget.py.
"""


import pytest


@pytest.mark.slow
def test_derive_lists_the_finite_budget_derivations(cli):
    code, out, _ = cli("derive")
    assert code == 0 and "finite-budget" in out and "compute-to-target" in out
    code, out, _ = cli("derive", "finite-budget")
    assert code == 0 and "w^3 - w - 2 beta = 0" in out
