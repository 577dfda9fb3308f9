"""Tests for replay_theory.validate.countdown (Countdown problems, solver, verifier, pass@k).

Reward rules follow the appendix "Verifier reward" of
RLOO group replay, docs/REFERENCES.md: "1.0 when the equation is well
formed, uses each given number once, and reaches the target, 0.1 when the
equation is well formed but does not reach the target, and 0 when no valid
equation is produced." "Well formed" is read syntactically (see the module
docstring), so wrong numbers in a parseable equation score 0.1.

Fast tier; the slower tests of this module (a random-tree property test) are in
tests/integration/test_countdown_property.py.
"""

from __future__ import annotations

import itertools
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay_theory.validate import countdown as cd

P4 = cd.Problem((3, 7, 25, 50), 75)  # (50+7*25)/3 = 225/3 = 75
P3 = cd.Problem((2, 3, 4), 20)  # (2+3)*4 = 20
PDUP = cd.Problem((5, 5, 2), 20)  # (5+5)*2 = 20; a repeated given number may be used twice


# --- prompt / alphabet ----------------------------------------------------------


def test_prompt_text_format():
    assert P4.prompt_text() == "nums 3 7 25 50 target 75 ="
    assert P3.prompt_text() == "nums 2 3 4 target 20 ="


def test_alphabet_covers_prompts_and_solutions():
    assert cd.ALPHABET == " ()*+-/0123456789=aegmnrstu"
    for p in cd.generate_problems(50, np.random.default_rng(1)):
        assert set(p.prompt_text()) <= set(cd.ALPHABET)
        assert set(cd.solve(p)) <= set(cd.ANSWER_CHARS) <= set(cd.ALPHABET)


def test_problem_rejects_bad_fields():
    with pytest.raises(ValueError):
        cd.Problem((), 3)
    with pytest.raises(ValueError):
        cd.Problem((1, -2), 3)
    with pytest.raises(ValueError):
        cd.Problem((1, 2), True)
    assert cd.Problem((np.int64(2), 3), np.int64(5)).numbers == (2, 3)


# --- verifier: hand cases ---------------------------------------------------------


@pytest.mark.parametrize(
    "problem, answer",
    [
        (P4, "(50+7*25)/3"),
        (P4, " ( 50 + 7 * 25 ) / 3 "),  # spaces between tokens are allowed
        (P4, "(50+7*25)/3\nanything after the first newline is ignored"),
        (P4, "((50+(7*25))/3)"),  # redundant parentheses are fine
        (P3, "(2+3)*4"),
        (P3, "4*(3+2)"),
        (PDUP, "(5+5)*2"),
        (cd.Problem((3, 3, 8, 8), 24), "8/(3-8/3)"),  # exact rational intermediate 1/3
        (cd.Problem((0, 5), 5), "0+5"),  # a lone "0" is not a leading zero
    ],
)
def test_correct_equation_scores_one(problem, answer):
    assert cd.verify(problem, answer) == 1.0


@pytest.mark.parametrize(
    "problem, answer",
    [
        (P4, "(50+7*25)*3"),  # numbers exactly once, value 675 != 75
        (P3, "2+3+4"),  # 9 != 20
        (P3, "2+3*4"),  # precedence: 14, not (2+3)*4
        (P3, "4/3/2"),  # exact 2/3, not 20
        (P3, "2-3-4"),  # left-associative: -5
    ],
)
def test_well_formed_wrong_value_scores_point_one(problem, answer):
    # paper: "0.1 when the equation is well formed but does not reach the target"
    assert cd.verify(problem, answer) == 0.1


@pytest.mark.parametrize(
    "answer, why",
    [
        ("(2+2)*5", "2 reused, 3 and 4 missing, 5 extra; value hits 20"),
        ("(2+3)*4*1", "extra number 1, value hits 20"),
        ("(2+3)*2*2", "number 2 reused"),
        ("4*5", "numbers missing, value hits 20"),
        ("(5+5)*2", "a number not given"),
    ],
)
def test_wrong_numbers_score_point_one_by_default(answer, why):
    # Paper: 1.0 needs "well formed, uses each given number once, and reaches the target";
    # 0 only "when no valid equation is produced". Number use is a condition separate from
    # "well formed", so a parseable equation with wrong numbers is well formed but not
    # correct: 0.1 (as in TinyZero's countdown.compute_score, the course verifier).
    assert cd.verify(P3, answer) == 0.1, why
    # the stricter reading is one keyword away
    assert cd.verify(P3, answer, partial_requires_numbers=True) == 0.0, why


def test_strict_reading_keeps_wrong_value_partial_credit():
    assert cd.verify(P3, "2+3+4", partial_requires_numbers=True) == 0.1
    assert cd.verify(P3, "(2+3)*4", partial_requires_numbers=True) == 1.0


def test_repeated_given_number_counts_as_multiset():
    assert cd.verify(PDUP, "(5+2)*5") == 0.1  # 35, numbers fine
    assert cd.verify(PDUP, "5*2*2", partial_requires_numbers=True) == 0.0  # 2 twice, 5 once


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   ",
        "\n(2+3)*4",  # empty first line
        "2+3)*4",  # unbalanced
        "((2+3)*4",  # unbalanced
        ")2+3(*4",
        "()",
        "(2+3)(4)",  # implicit multiplication
        "1+",
        "+2+3*4",  # unary plus
        "-2+3*4",  # unary minus is not in the grammar
        "2+3*-4",
        "2 3 4",
        "4/(3-3)+2",  # division by zero: no value
        "4/0",
        "9**9**9",  # '**' is not an operator
        "10^1000000",  # '^' is not an allowed character
        "(" * 1000 + "1" + ")" * 1000,  # 1000-deep nesting
        "(" * 17 + "2" + ")" * 17 + "+3*4",  # one past MAX_PAREN_DEPTH
        "٣+٤",  # Arabic-Indic digits
        "２+３*４",  # full-width digits
        "1e9",
        "0x10",
        "2.0+3*4",
        "(2+3)*04",  # leading zero
        "007",
        "The answer is (2+3)*4",  # no prose before the equation (bare-expression format)
        "(2+3)*4 = 20",  # no '= target' after it
        "<answer>(2+3)*4</answer>",  # no tags in the tiny-model format
        "(2+3)\t*4",  # only ' ' counts as space
        "(2+3)*4\r",
        "__import__('os')",
    ],
)
def test_malformed_scores_zero(answer):
    # paper: "0 when no valid equation is produced"
    assert cd.verify(P3, answer) == 0.0
    assert cd.parse_answer(answer) is None


def test_paren_depth_cap_is_inclusive():
    deep = "(" * cd.MAX_PAREN_DEPTH + "2" + ")" * cd.MAX_PAREN_DEPTH + "+3*4"
    assert cd.verify(cd.Problem((2, 3, 4), 14), deep) == 1.0


def test_length_cap():
    ok = "2+3" + " " * (cd.MAX_ANSWER_CHARS - 5) + "+4"  # exactly MAX_ANSWER_CHARS
    assert len(ok) == cd.MAX_ANSWER_CHARS
    assert cd.verify(cd.Problem((2, 3, 4), 9), ok) == 1.0
    assert cd.verify(cd.Problem((2, 3, 4), 9), ok + " ") == 0.0
    assert cd.verify(cd.Problem((2, 3, 4), 9), ok + "\n" + "x" * 10_000) == 1.0


@pytest.mark.parametrize("completion", [None, 42, b"(2+3)*4", ["(2+3)*4"], 2.5])
def test_non_string_scores_zero(completion):
    assert cd.verify(P3, completion) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["1" * 10**6, "(" * 10**6, "1+" * 500_000, "(2+3)*4" + " " * 10**6, "9" * 10**6 + "\n(2+3)*4"],
)
def test_huge_input_returns_zero_fast(completion):
    start = time.perf_counter()
    assert cd.verify(P3, completion) == 0.0
    assert time.perf_counter() - start < 0.1


def test_parse_answer_value_and_numbers():
    assert cd.parse_answer("(50+7*25)/3") == (Fraction(75), (50, 7, 25, 3))
    assert cd.parse_answer("8/(3-8/3)") == (Fraction(24), (8, 3, 8, 3))
    assert cd.parse_answer("1/3") == (Fraction(1, 3), (1, 3))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=cd.ALPHABET + "\n", max_size=60))
def test_random_alphabet_strings_never_raise(text):
    assert cd.verify(P4, text) in (0.0, 0.1, 1.0)
    assert cd.verify(P3, text, partial_requires_numbers=True) in (0.0, 0.1, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ", min_size=1, max_size=40))
def test_random_answer_char_strings_agree_with_python_arithmetic(text):
    # Any string that parses must have the value Python's own parser gives it with
    # exact Fractions (leading zeros and '**'/'//' excluded by our grammar).
    parsed = cd.parse_answer(text)
    if parsed is None:
        return
    import ast

    tree = ast.parse(text.strip(), mode="eval")

    def ev(node):
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Div: lambda a, b: a / b}
        assert isinstance(node, ast.BinOp) and type(node.op) in ops
        return ops[type(node.op)](ev(node.left), ev(node.right))

    assert ev(tree.body) == parsed[0]


def test_verify_batch_and_groups():
    problems = [P3, P4]
    np.testing.assert_array_equal(cd.verify_batch(problems, ["(2+3)*4", "1+"]), [1.0, 0.0])
    groups = [["(2+3)*4", "2+3+4", ""], ["(50+7*25)/3", None, "(50+7*25)*3"]]
    got = cd.verify_groups(problems, groups)
    assert got.shape == (2, 3) and got.dtype == np.float64
    np.testing.assert_array_equal(got, [[1.0, 0.1, 0.0], [1.0, 0.0, 0.1]])
    with pytest.raises(ValueError):
        cd.verify_batch(problems, ["x"])
    with pytest.raises(ValueError):
        cd.verify_groups(problems, [["a"], ["b", "c"]])


# --- solver ---------------------------------------------------------------------


def test_solver_hand_cases():
    assert cd.solve(P4) == "(50+7*25)/3"
    assert cd.verify(cd.Problem((3, 3, 8, 8), 24), cd.solve(cd.Problem((3, 3, 8, 8), 24))) == 1.0
    assert cd.solve(cd.Problem((1, 1, 1, 1), 100)) is None  # max is (1+1)*(1+1) = 4
    assert cd.solve(cd.Problem((7,), 7)) == "7"
    assert cd.solve(cd.Problem((7,), 8)) is None


def test_solution_is_the_solvers_answer_or_one_line_error():
    assert cd.solution(P4) == "(50+7*25)/3"
    with pytest.raises(ValueError, match=r"^nums 1 1 1 1 target 100 = has no solution: an SFT example needs one$"):
        cd.solution(cd.Problem((1, 1, 1, 1), 100))


def test_solver_is_fast_on_unsolvable_four_numbers():
    start = time.perf_counter()
    assert cd.solve(cd.Problem((1, 1, 1, 1), 97)) is None  # full search, nothing found
    assert time.perf_counter() - start < 0.05


# --- generator and splits ---------------------------------------------------------


def test_generator_is_seeded():
    a = cd.generate_problems(30, np.random.default_rng(7))
    b = cd.generate_problems(30, np.random.default_rng(7))
    c = cd.generate_problems(30, np.random.default_rng(8))
    assert a == b
    assert a != c


def test_generated_problems_are_solvable_and_in_range():
    problems = cd.generate_problems(200, np.random.default_rng(0))
    counts = {3: 0, 4: 0}
    for p in problems:
        counts[len(p.numbers)] += 1
        assert all(1 <= n <= 20 for n in p.numbers)
        assert 1 <= p.target <= 100
        solution = cd.solve(p)
        assert solution is not None, p
        assert cd.verify(p, solution) == 1.0, (p, solution)
    assert min(counts.values()) > 60  # count drawn uniformly from (3, 4)


def test_generator_parameters():
    problems = cd.generate_problems(20, np.random.default_rng(3), num_numbers=(3,), number_range=(1, 5),
                                    target_range=(10, 20))
    assert all(len(p.numbers) == 3 and max(p.numbers) <= 5 and 10 <= p.target <= 20 for p in problems)
    with pytest.raises(ValueError):
        cd.generate_problems(1, np.random.default_rng(0), number_range=(1, 2), target_range=(10**6, 10**7),
                             max_tries=50)


def test_make_splits_disjoint_and_reproducible():
    train, test = cd.make_splits(300, 50, seed=0)
    assert len(train) == 300 and len(test) == 50
    train_keys = {cd.problem_key(p) for p in train}
    test_keys = {cd.problem_key(p) for p in test}
    assert len(train_keys) == 300 and len(test_keys) == 50
    assert not train_keys & test_keys
    assert cd.make_splits(300, 50, seed=0) == (train, test)


def _old_make_splits(n_train, n_test, seed, **kwargs):
    # the draw loop as it was before the stall completion (a naive copy): what every non-stalling call still returns
    rng = np.random.default_rng(seed)
    unique = {}
    while len(unique) < n_train + n_test:
        for p in cd.generate_problems(n_train + n_test - len(unique), rng, **kwargs):
            unique.setdefault(cd.problem_key(p), p)
    return cd.train_test_split(unique.values(), n_test, rng)


THREE = dict(num_numbers=(3,), number_range=(1, 9), target_range=(1, 40))  # the validator's family


def test_make_splits_below_the_stall_is_the_old_draw():
    assert cd.make_splits(1000, 64, seed=0, **THREE) == _old_make_splits(1000, 64, 0, **THREE)
    assert cd.make_splits(300, 50, seed=4) == _old_make_splits(300, 50, 4)


def test_the_family_holds_every_draw_and_a_stall_is_completed_from_it():
    family = cd.solvable_family(**THREE)
    keys = [cd.problem_key(p) for p in family]
    assert len(keys) == len(set(keys)) == cd.THREE_NUMBER_FAMILY == 1721
    assert keys[:3] == [((1, 1, 1), 1), ((1, 1, 1), 2), ((1, 1, 1), 3)]  # 1 * 1 * 1, (1 + 1) * 1, 1 + 1 + 1
    assert ((1, 1, 1), 4) not in set(keys) and ((9, 9, 9), 40) not in set(keys) and ((8, 9, 9), 40) not in set(keys)
    drawn = {cd.problem_key(p) for p in cd.generate_problems(5000, np.random.default_rng(5), **THREE)}
    assert drawn <= set(keys) and len(drawn) < 1721  # rare problems stay undrawn: the old loop stalled on them
    # the whole family: 1657 + 64 distinct, disjoint, reproducible; numbers of the completed ones in a drawn order
    train, test = cd.make_splits(1657, 64, seed=0, **THREE)
    assert {cd.problem_key(p) for p in train} | {cd.problem_key(p) for p in test} == set(keys)
    assert len(train) == 1657 and len(test) == 64 and cd.make_splits(1657, 64, seed=0, **THREE) == (train, test)
    assert any(list(p.numbers) != sorted(p.numbers) for p in train)
    with pytest.raises(ValueError, match=r"^n_train \+ n_test = 1722 is more than the 1721 distinct solvable "):
        cd.make_splits(1658, 64, seed=0, **THREE)


def test_reachable_values_answer_as_the_solver_does_target_by_target():
    """The family's enumeration (one value set per multiset) against solve's search, one target at a time: three
    numbers 1-6 and some four-number multisets, targets 0-60, fractions and zero included."""
    memo: dict = {}
    cases = [*itertools.combinations_with_replacement(range(1, 7), 3), (1, 2, 3, 4), (2, 2, 7, 9), (1, 1, 1, 1),
             (3, 3, 8, 8), (0, 5), (6,)]
    for numbers in cases:
        values = cd.reachable_values(numbers, memo)
        for target in range(61):
            assert (Fraction(target) in values) == (cd.solve(cd.Problem(numbers, target)) is not None), (numbers,
                                                                                                        target)
    assert {Fraction(24), Fraction(64)} <= cd.reachable_values((3, 3, 8, 8))  # 8 / (3 - 8 / 3), 8 * 8 * 3 / 3
    assert cd.reachable_values((1, 2)) == {Fraction(v) for v in (3, 2, 1, -1)} | {Fraction(1, 2)}


def test_train_test_split_drops_duplicates_by_key():
    a = cd.Problem((1, 2, 3), 6)
    a_perm = cd.Problem((3, 2, 1), 6)  # same puzzle, other order
    b = cd.Problem((1, 2, 3), 7)
    train, held = cd.train_test_split([a, a_perm, b], 1, np.random.default_rng(0))
    assert len(train) == 1 and len(held) == 1
    assert {cd.problem_key(p) for p in train + held} == {cd.problem_key(a), cd.problem_key(b)}
    with pytest.raises(ValueError):
        cd.train_test_split([a, a_perm], 2, np.random.default_rng(0))


# --- pass@k ---------------------------------------------------------------------


def test_evaluate_samples_by_hand():
    correct = np.array(
        [
            [False, True, False, False],  # n=4, c=1: pass@1 = 1/4, pass@4 = 1; first-1 fails
            [True, True, False, False],  # c=2: pass@1 = 1/2, pass@4 = 1
            [False, False, False, False],  # c=0: all zero
        ]
    )
    out = cd.evaluate_samples(correct, ks=(1, 2, 4, 16))
    assert out["pass@1"] == pytest.approx((0.25 + 0.5 + 0.0) / 3)
    # pass@2 = 1 - C(n-c,2)/C(4,2): c=1 -> 1 - 3/6 = 1/2; c=2 -> 1 - 1/6 = 5/6
    assert out["pass@2"] == pytest.approx((0.5 + 5 / 6 + 0.0) / 3)
    assert out["pass@4"] == pytest.approx(2 / 3)
    assert "pass@16" not in out  # k > n_samples is skipped
    assert out["pass@1_ordered"] == pytest.approx(1 / 3)
    assert out["pass@2_ordered"] == pytest.approx(2 / 3)
    assert out["fraction_correct"] == pytest.approx(3 / 12)
    assert np.isnan(out["mean_reward"])
    assert out["num_problems"] == 3 and out["num_samples"] == 4


def test_evaluate_samples_with_rewards():
    rewards = np.array([[1.0, 0.1, 0.0, 0.1]])
    out = cd.evaluate_samples(rewards == cd.CORRECT_REWARD, ks=(1, 4), rewards=rewards)
    assert out["pass@1"] == pytest.approx(0.25)
    assert out["pass@4"] == pytest.approx(1.0)
    assert out["mean_reward"] == pytest.approx(0.3)
    assert out["fraction_correct"] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        cd.evaluate_samples(np.ones((2, 2), bool), rewards=np.ones((2, 3)))
    with pytest.raises(ValueError):
        cd.evaluate_samples(np.ones(4, bool))
