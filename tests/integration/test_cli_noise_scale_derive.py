"""``replay-theory optimal`` with the noise-scale rule (the default objective): values by hand, bad input.

Integration tier: the slower tests of this module (the sympy derivations); the fast ones are in
tests/unit/test_cli_noise_scale.py.
"""

from __future__ import annotations


def test_derive_lists_the_noise_scale_derivations_in_one_aligned_column(cli):
    code, out, _ = cli("derive")
    lines = out.splitlines()
    names = [line.split()[0] for line in lines]
    assert code == 0 and {"fifo-long-run-variance", "noise-scale-rule", "assumption-3.2-counterexample"} <= set(names)
    width = max(map(len, names))
    assert {line.index(line.split()[1], len(line.split()[0])) for line in lines} == {width + 2}  # titles aligned
