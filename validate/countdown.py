"""Countdown 3-to-4: problems, a reference solver, the deterministic verifier, pass@k.

The task of Replay-RLOO (RLOO group replay, docs/REFERENCES.md, Sec. 4 "Task and model"; the verifier: Sec. 3
and the appendix "Verifier reward"): combine three or four given numbers, each exactly once, with + - * / to reach
a target.  Pure Python + numpy (no torch), so the simulator, the tokenizer and the tests can import it anywhere;
exact ``Fraction`` arithmetic, never ``eval``.  The choices the paper leaves open (what "well formed" means,
division by zero, no ``<answer>`` tags): docs/VALIDATION.md, 'The Countdown verifier'.

| code name            | paper symbol / term         | meaning                                              |
|----------------------|-----------------------------|------------------------------------------------------|
| ``Problem.numbers``  | "given numbers"             | 3 or 4 numbers, each to be used exactly once         |
| ``Problem.target``   | "target"                    | value the equation must reach                        |
| ``verify``           | verifier, r_i               | reward of one response (1.0 / 0.1 / 0.0)             |
| ``CORRECT_REWARD``   | 1.0                         | well formed + numbers exactly once + hits target     |
| ``FORMAT_REWARD``    | 0.1                         | well formed, not fully correct                       |
| ``correct``          | r_i == 1.0                  | (problems, samples) bool matrix, samples last        |
| ``fraction_correct`` | "correction rate"           | fraction of responses scoring exactly 1.0            |
| ``mean_reward``      | "evaluation reward"         | mean verifier reward over responses                  |
| ``pass@k``           | pass@k, Eq. (4)             | unbiased 1 - C(n-c,k)/C(n,k), averaged over problems |
| ``pass@k_ordered``   | canonical "first-k" pass@k  | any of the first k samples correct                   |

Prompt: ``"nums 3 7 25 50 target 75 ="`` (the stored order, single spaces).  Answer: the completion up to its first
``"\\n"``, only an expression (no ``"= 75"``, no tags, no prose), at most ``MAX_ANSWER_CHARS`` characters and
``MAX_PAREN_DEPTH`` nested parentheses; spaces between tokens, no unary minus, no decimals::

    expr   := term   (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | "(" expr ")"
    NUMBER := "0" | [1-9][0-9]*          (ASCII digits, no leading zeros)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Sequence

import numpy as np

from ..checks import require_in_range, require_int
from ..theory.group_replay import pass_at_k

__all__ = [
    "ALPHABET",
    "ANSWER_CHARS",
    "CORRECT_REWARD",
    "FORMAT_REWARD",
    "MAX_ANSWER_CHARS",
    "MAX_PAREN_DEPTH",
    "NO_REWARD",
    "Problem",
    "THREE_NUMBER_FAMILY",
    "evaluate_samples",
    "generate_problems",
    "make_splits",
    "parse_answer",
    "problem_key",
    "reachable_values",
    "solvable_family",
    "solve",
    "train_test_split",
    "verify",
    "verify_batch",
    "verify_groups",
]

CORRECT_REWARD = 1.0  # verifier: well formed, each number once, hits the target
FORMAT_REWARD = 0.1  # verifier: well formed, not fully correct
NO_REWARD = 0.0  # verifier: no valid equation

THREE_NUMBER_FAMILY = 1721  # distinct solvable problems, three numbers 1-9, targets 1-40 (the validator's)
MAX_ANSWER_CHARS = 200  # longer answers are malformed (bounds parse time and number size)
MAX_PAREN_DEPTH = 16  # deeper nesting is malformed (bounds recursion)

#: Characters an answer may contain.
ANSWER_CHARS = "0123456789+-*/() "
_PROMPT_WORDS = "nums target ="
#: Every character that can occur in a prompt or an answer, sorted. The tokenizer
#: adds its own special tokens (BOS / EOS / PAD) on top of these.
ALPHABET = "".join(sorted(set(ANSWER_CHARS) | set(_PROMPT_WORDS)))

_ANSWER_SET = frozenset(ANSWER_CHARS)
_DIGITS = frozenset("0123456789")


# --- problems -------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One Countdown instance: reach ``target`` using each of ``numbers`` once."""

    numbers: tuple[int, ...]
    target: int

    def __post_init__(self) -> None:
        nums = tuple(self.numbers)
        if not nums or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in nums):
            raise ValueError(f"numbers must be a non-empty tuple of ints >= 0, got {self.numbers!r}")
        if isinstance(self.target, bool) or not isinstance(self.target, (int, np.integer)) or self.target < 0:
            raise ValueError(f"target must be an int >= 0, got {self.target!r}")
        object.__setattr__(self, "numbers", tuple(int(n) for n in nums))
        object.__setattr__(self, "target", int(self.target))

    def prompt_text(self) -> str:
        """``"nums 3 7 25 50 target 75 ="``: what the model reads (see module docstring)."""
        return f"nums {' '.join(str(n) for n in self.numbers)} target {self.target} ="


def problem_key(problem: Problem) -> tuple[tuple[int, ...], int]:
    """(sorted numbers, target): two problems with the same key are the same puzzle."""
    return tuple(sorted(problem.numbers)), problem.target


def _random_target(numbers: Sequence[int], rng: np.random.Generator) -> Fraction | None:
    """Value of a random expression tree using every number once; None on division by zero."""
    items = [Fraction(n) for n in numbers]
    while len(items) > 1:
        i, j = rng.choice(len(items), size=2, replace=False)
        a, b = items[i], items[j]
        op = int(rng.integers(4))
        if op == 0:
            v = a + b
        elif op == 1:
            v = a - b
        elif op == 2:
            v = a * b
        else:
            if b == 0:
                return None
            v = a / b
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [v]
    return items[0]


def generate_problems(
    n: int,
    rng: np.random.Generator,
    num_numbers: Sequence[int] = (3, 4),
    number_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100),
    max_tries: int = 10_000,
) -> list[Problem]:
    """``n`` solvable problems, drawn with ``rng`` (same seed -> same list).

    Per problem: the count is uniform over ``num_numbers`` (Countdown 3-to-4),
    the numbers are i.i.d. uniform on the inclusive ``number_range`` (repeats
    allowed), and the target is the value of a random expression tree using
    every number exactly once with uniform ops in + - * /; draws whose value is
    not an integer in the inclusive ``target_range`` are rejected and redrawn.
    Small defaults (numbers 1..20, targets 1..100) suit a tiny model. Every
    problem is solvable by construction. Duplicates (same ``problem_key``) can
    occur; ``make_splits`` removes them.
    """
    require_int("n", n, 0)
    counts = [int(k) for k in num_numbers]
    if not counts or min(counts) < 1:
        raise ValueError(f"num_numbers must be non-empty counts >= 1, got {num_numbers!r}")
    lo, hi = (int(x) for x in number_range)
    t_lo, t_hi = (int(x) for x in target_range)
    if not 0 <= lo <= hi:
        raise ValueError(f"number_range must satisfy 0 <= low <= high, got {number_range!r}")
    if not 0 <= t_lo <= t_hi:
        raise ValueError(f"target_range must satisfy 0 <= low <= high, got {target_range!r}")
    problems: list[Problem] = []
    for _ in range(n):
        k = counts[int(rng.integers(len(counts)))]  # drawn once, so counts stay uniform after rejection
        for _attempt in range(max_tries):
            numbers = tuple(int(x) for x in rng.integers(lo, hi + 1, size=k))
            value = _random_target(numbers, rng)
            if value is not None and value.denominator == 1 and t_lo <= value <= t_hi:
                problems.append(Problem(numbers, int(value)))
                break
        else:
            raise ValueError(
                f"no target in {target_range} after {max_tries} draws; widen target_range or number_range"
            )
    return problems


def train_test_split(
    problems: Iterable[Problem], n_held_out: int, rng: np.random.Generator
) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out), disjoint by ``problem_key``.

    Duplicates (same key) are dropped first, keeping the first occurrence; the
    distinct problems are then shuffled with ``rng`` and the first
    ``n_held_out`` held out.
    """
    unique: dict[tuple[tuple[int, ...], int], Problem] = {}
    for p in problems:
        unique.setdefault(problem_key(p), p)
    distinct = list(unique.values())
    require_in_range("n_held_out", n_held_out, 0, len(distinct), note=" (distinct problems)")
    order = rng.permutation(len(distinct))
    held_out = [distinct[i] for i in order[:n_held_out]]
    train = [distinct[i] for i in order[n_held_out:]]
    return train, held_out


def make_splits(n_train: int, n_test: int, seed: int, **generator_kwargs: Any) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out) of exactly ``n_train`` / ``n_test`` distinct problems, disjoint by key.

    One ``np.random.default_rng(seed)`` drives generation (distinct problems
    collected in draw order) and the split. ``generator_kwargs`` go to
    ``generate_problems``. Near the family's size the random draw may never reach
    a rare problem: after 100 draws that add none, the rest come from the family's
    enumeration (``solvable_family``), in an order the same generator shuffles, so a
    draw that never stalls is unchanged. One-line ValueError where the family holds
    fewer than ``n_train + n_test``.
    """
    rng = np.random.default_rng(seed)
    need = n_train + n_test
    unique: dict[tuple[tuple[int, ...], int], Problem] = {}
    stalls = 0
    while len(unique) < need and stalls <= 100:
        before = len(unique)
        for p in generate_problems(need - len(unique), rng, **generator_kwargs):
            unique.setdefault(problem_key(p), p)
        stalls = stalls + 1 if len(unique) == before else 0
    if len(unique) < need:  # stalled: complete from the enumeration (only near the family's size)
        rest = [p for p in solvable_family(**generator_kwargs) if problem_key(p) not in unique]
        if len(unique) + len(rest) < need:
            raise ValueError(f"n_train + n_test = {need} is more than the {len(unique) + len(rest)} distinct "
                             f"solvable problems with {generator_kwargs!r}")
        for i in rng.permutation(len(rest))[: need - len(unique)]:  # numbers in a drawn order, as a draw has them
            unique[problem_key(rest[i])] = Problem(tuple(int(n) for n in rng.permutation(rest[i].numbers)),
                                                   rest[i].target)
    return train_test_split(unique.values(), n_test, rng)


def solvable_family(num_numbers: Sequence[int] = (3, 4), number_range: tuple[int, int] = (1, 20),
                    target_range: tuple[int, int] = (1, 100)) -> list[Problem]:
    """Every distinct solvable problem ``generate_problems`` can draw with these arguments (its defaults), one per
    ``problem_key``, numbers sorted, in key order. The validator's family (three numbers 1-9, targets 1-40) holds
    ``THREE_NUMBER_FAMILY`` = 1721."""
    lo, hi = (int(x) for x in number_range)
    t_lo, t_hi = (int(x) for x in target_range)
    reached: dict[tuple[Fraction, ...], frozenset[Fraction]] = {}  # shared by every multiset's sub-multisets
    return [Problem(numbers, target)
            for k in sorted({int(c) for c in num_numbers})
            for numbers in itertools.combinations_with_replacement(range(lo, hi + 1), k)
            for values in [reachable_values(numbers, reached)]
            for target in range(t_lo, t_hi + 1) if Fraction(target) in values]


def reachable_values(numbers: Sequence[int], memo: dict | None = None) -> frozenset[Fraction]:
    """Every exact value of an expression using each of ``numbers`` once with + - * /: the values ``solve``'s
    search reaches, so ``solve(Problem(numbers, t))`` is None exactly when ``Fraction(t)`` is not among them. One
    enumeration per multiset instead of one search per target (``solvable_family``); ``memo`` (sorted multiset ->
    values) may be shared across calls."""
    memo = {} if memo is None else memo

    def values(items: tuple[Fraction, ...]) -> frozenset[Fraction]:
        if len(items) == 1:
            return frozenset(items)
        if items not in memo:
            out: set[Fraction] = set()
            for i, j in itertools.combinations(range(len(items)), 2):  # solve's pairs, then its six operations
                rest = tuple(it for k, it in enumerate(items) if k != i and k != j)
                a, b = items[i], items[j]
                for new in (a + b, a * b, a - b, b - a, *((a / b,) if b != 0 else ()), *((b / a,) if a != 0 else ())):
                    out |= values(tuple(sorted(rest + (new,))))
            memo[items] = frozenset(out)
        return memo[items]

    return values(tuple(sorted(Fraction(n) for n in numbers)))


# --- reference solver -----------------------------------------------------------

# An item of the search: (exact value, expression string, precedence), with
# precedence 3 for a number, 2 for * and /, 1 for + and -.
_Item = tuple[Fraction, str, int]


def _wrap(item: _Item, min_prec: int) -> str:
    return item[1] if item[2] >= min_prec else f"({item[1]})"


def _combine(a: _Item, b: _Item) -> list[_Item]:
    """Every a op b with minimal parentheses (left-associative, usual precedence)."""
    out: list[_Item] = [
        (a[0] + b[0], f"{a[1]}+{b[1]}", 1),  # a+(b±c) == a+b±c exactly
        (a[0] * b[0], f"{_wrap(a, 2)}*{_wrap(b, 2)}", 2),  # a*(b/c) == a*b/c exactly
        (a[0] - b[0], f"{a[1]}-{_wrap(b, 2)}", 1),
        (b[0] - a[0], f"{b[1]}-{_wrap(a, 2)}", 1),
    ]
    if b[0] != 0:
        out.append((a[0] / b[0], f"{_wrap(a, 2)}/{_wrap(b, 3)}", 2))
    if a[0] != 0:
        out.append((b[0] / a[0], f"{_wrap(b, 2)}/{_wrap(a, 3)}", 2))
    return out


def solve(problem: Problem) -> str | None:
    """One solution in the answer format (no spaces, minimal parentheses), or None.

    Exhaustive search over expression trees: repeatedly replace two items by
    their sum, product, either difference or either quotient (exact Fraction
    arithmetic), each given number used exactly once. Multisets of values
    already shown to be dead ends are memoised. Deterministic: the first
    solution in the search order (pairs in index order, then + * - /).
    About 4k leaves for 4 numbers, a few milliseconds.
    """
    target = Fraction(problem.target)
    dead: set[tuple[Fraction, ...]] = set()

    def search(items: list[_Item]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        key = tuple(sorted(it[0] for it in items))
        if key in dead:
            return None
        for i, j in itertools.combinations(range(len(items)), 2):
            rest = [it for k, it in enumerate(items) if k != i and k != j]
            for new in _combine(items[i], items[j]):
                found = search(rest + [new])
                if found is not None:
                    return found
        dead.add(key)
        return None

    return search([(Fraction(n), str(n), 3) for n in problem.numbers])


# --- verifier -------------------------------------------------------------------


class _Malformed(Exception):
    """Internal: the answer is not a well-formed equation."""


def solution(problem: Problem) -> str:
    """``solve(problem)`` of a problem known solvable (``generate_problems`` draws only those): an SFT target."""
    answer = solve(problem)
    if answer is None:
        raise ValueError(f"{problem.prompt_text()} has no solution: an SFT example needs one")
    return answer


def _tokenize(answer: str) -> list[str]:
    tokens: list[str] = []
    i, n = 0, len(answer)
    while i < n:
        ch = answer[i]
        if ch == " ":
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < n and answer[j] in _DIGITS:
                j += 1
            if answer[i] == "0" and j - i > 1:  # leading zero ("007")
                raise _Malformed
            tokens.append(answer[i:j])
            i = j
        else:  # one of + - * / ( ) (the character set was checked before)
            tokens.append(ch)
            i += 1
    return tokens


class _Parser:
    """Recursive descent over the grammar in the module docstring, exact arithmetic."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Malformed
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            if self.take() == "+":
                value = value + self.term()
            else:
                value = value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value = value * self.factor()
            else:
                divisor = self.factor()
                if divisor == 0:
                    raise _Malformed  # division by zero: the expression has no value
                value = value / divisor
        return value

    def factor(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise _Malformed
            return value
        if tok[0] in _DIGITS:
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise _Malformed


def _extract_answer(completion: object) -> str | None:
    """The answer text: the completion up to its first newline, if it is a short str."""
    if not isinstance(completion, str):
        return None
    head = completion[: MAX_ANSWER_CHARS + 1]  # O(1) in the completion's length
    newline = head.find("\n")
    if newline >= 0:
        head = head[:newline]
    if len(head) > MAX_ANSWER_CHARS:
        return None
    return head


def parse_answer(completion: object) -> tuple[Fraction, tuple[int, ...]] | None:
    """(exact value, numbers used in order of appearance) of a well-formed answer, else None.

    "Well formed" = the answer line (see module docstring) is at most
    ``MAX_ANSWER_CHARS`` characters from ``ANSWER_CHARS``, has balanced
    parentheses nested at most ``MAX_PAREN_DEPTH`` deep, parses under the
    grammar, and has a value (no division by zero). Never raises.
    """
    answer = _extract_answer(completion)
    if answer is None or not answer.strip():
        return None
    depth = 0
    for ch in answer:
        if ch not in _ANSWER_SET:  # also rejects non-ASCII digits, letters, '.', '^', '=', tabs
            return None
        if ch == "(":
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                return None
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
    if depth != 0:
        return None
    try:
        parser = _Parser(_tokenize(answer))
        value = parser.expr()
        if parser.peek() is not None:  # trailing tokens, e.g. "1 2", "(1)(2)", "1**2"
            return None
    except _Malformed:
        return None
    return value, tuple(parser.numbers)


def verify(problem: Problem, completion: object, *, partial_requires_numbers: bool = False) -> float:
    """Verifier reward r of one completion: 1.0, 0.1 or 0.0 (never raises, never hangs).

    Appendix "Verifier reward": 1.0 when the equation is well formed, uses
    each given number once, and reaches the target; 0.1 when it is well
    formed but not fully correct (wrong value, or -- under the default
    syntactic reading of "well formed" -- wrong numbers); 0.0 when no valid
    equation is produced (see ``parse_answer``). With
    ``partial_requires_numbers=True`` a well-formed equation whose numbers are
    not exactly the given ones scores 0.0 instead of 0.1.
    """
    parsed = parse_answer(completion)
    if parsed is None:
        return NO_REWARD
    value, used = parsed
    numbers_ok = sorted(used) == sorted(problem.numbers)  # each given number exactly once (multiset)
    if numbers_ok and value == problem.target:
        return CORRECT_REWARD
    if partial_requires_numbers and not numbers_ok:
        return NO_REWARD
    return FORMAT_REWARD


def verify_batch(
    problems: Sequence[Problem], completions: Sequence[object], *, partial_requires_numbers: bool = False
) -> np.ndarray:
    """Rewards of one completion per problem: float64 array, shape (N,)."""
    if len(problems) != len(completions):
        raise ValueError(f"got {len(problems)} problems but {len(completions)} completions")
    return np.array(
        [verify(p, c, partial_requires_numbers=partial_requires_numbers) for p, c in zip(problems, completions)],
        dtype=np.float64,
    )  # (N,)


def verify_groups(
    problems: Sequence[Problem], groups: Sequence[Sequence[object]], *, partial_requires_numbers: bool = False
) -> np.ndarray:
    """Rewards of a group of K completions per problem: float64 array, shape (N, K)."""
    if len(problems) != len(groups):
        raise ValueError(f"got {len(problems)} problems but {len(groups)} groups")
    sizes = {len(g) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"all groups must have the same size K, got sizes {sorted(sizes)}")
    k = sizes.pop() if sizes else 0
    out = np.empty((len(problems), k), dtype=np.float64)  # (N, K)
    for i, (p, g) in enumerate(zip(problems, groups)):
        out[i] = [verify(p, c, partial_requires_numbers=partial_requires_numbers) for c in g]
    return out


# --- evaluation -----------------------------------------------------------------


def evaluate_samples(
    correct: np.ndarray, ks: Sequence[int] = (1, 4, 16), rewards: np.ndarray | None = None
) -> dict[str, float]:
    """pass@k and reward summaries of a (num_problems, n_samples) sample matrix.

    ``correct[p, j]`` says whether sample j of problem p scored 1.0, in
    sampling order. Returns, for each k in ``ks`` with k <= n_samples (larger
    k are skipped):

    * ``"pass@k"``: unbiased pass@k (Eq. 4, Chen et al. 2021) per problem with
      n = n_samples and c = its correct count, averaged over problems -- the
      paper's best-of-N probe convention;
    * ``"pass@k_ordered"``: fraction of problems with a correct sample among
      the first k -- the paper's canonical "ordered first-k" convention;

    plus ``"fraction_correct"`` (the paper's correction rate), ``"mean_reward"``
    (mean of ``rewards``, same shape; NaN when not given), ``"num_problems"``
    and ``"num_samples"``.
    """
    correct = np.asarray(correct)
    if correct.ndim != 2 or correct.shape[0] < 1 or correct.shape[1] < 1:
        raise ValueError(f"correct must be a non-empty (num_problems, n_samples) array, got shape {correct.shape}")
    if correct.dtype != bool:
        if not np.all((correct == 0) | (correct == 1)):
            raise ValueError("correct must hold booleans (or 0/1)")
        correct = correct.astype(bool)
    num_problems, n = correct.shape  # (problems, samples)
    c = correct.sum(axis=1)  # (problems,)
    out: dict[str, float] = {}
    for k in ks:
        k = int(require_int("k", k, 1))
        if k > n:
            continue
        out[f"pass@{k}"] = float(np.mean(pass_at_k(n, c, k)))  # Eq. (4), averaged over problems
        out[f"pass@{k}_ordered"] = float(np.mean(correct[:, :k].any(axis=1)))
    out["fraction_correct"] = float(correct.mean())
    if rewards is None:
        out["mean_reward"] = float("nan")
    else:
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.shape != correct.shape:
            raise ValueError(f"rewards shape {rewards.shape} != correct shape {correct.shape}")
        out["mean_reward"] = float(rewards.mean())
    out["num_problems"] = float(num_problems)
    out["num_samples"] = float(n)
    return out
