"""Tests for replay_theory.validate.countdown (Countdown problems, solver, verifier, pass@k).

Reward rules: tests/unit/test_countdown.py's docstring (the appendix "Verifier reward" of RLOO group replay).

Integration tier: the slower tests of this module (a random-tree property test); the fast ones are in
tests/unit/test_countdown.py.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from replay_theory.validate import countdown as cd

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


@st.composite
def _expressions(draw, depth=0):
    """(fully parenthesised expression string, exact value or None on division by zero, numbers)."""
    if depth >= 3 or draw(st.booleans()):
        n = draw(st.integers(0, 30))
        return str(n), Fraction(n), [n]
    left, lv, ln = draw(_expressions(depth + 1))
    right, rv, rn = draw(_expressions(depth + 1))
    op = draw(st.sampled_from("+-*/"))
    value = None if lv is None or rv is None or (op == "/" and rv == 0) else _OPS[op](lv, rv)
    return f"({left}{op}{right})", value, ln + rn


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_random_expression_trees_parse_to_their_value(expr):
    text, value, numbers = expr
    parsed = cd.parse_answer(text)
    if value is None:
        assert parsed is None  # a division by zero somewhere: no value
        assert cd.verify(cd.Problem(tuple(numbers), 0), text) == 0.0
        return
    assert parsed == (value, tuple(numbers))
    target_hit = value.denominator == 1 and value >= 0
    problem = cd.Problem(tuple(reversed(numbers)), int(value) if target_hit else 0)
    assert cd.verify(problem, text) == (1.0 if target_hit else 0.1)
