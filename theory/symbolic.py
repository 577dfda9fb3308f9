"""Symbolic derivations (sympy) of the closed forms used by replay-theory (``replay-theory derive``).

Papers (docs/REFERENCES.md): experience-replay Thm 3.4, Thm 3.5, App. C.2, C.3.1, C.3.2, Eq. (5); M2PO Thm 5.1,
App. C; FreshPER (arXiv:2604.16918) Eqs. (5), (8), (9), (24); McCandlish et al. 2018 (arXiv 1812.06162) Eq. (2.7),
with the batch variance 1/B replaced by the long-run variance V.  Each derivation records every sympy step as a
:class:`Step`; a step saying "(argued)" is reasoned in words, not computed.  The numeric modules implement the
results and ``tests/unit/test_symbolic.py`` compares the two.  Imported only by ``derive`` and the tests, never by
``optimal``, so sympy is imported at the top.  Derivations are cached: treat a :class:`Derivation` as read-only.

| derivation              | derives                                                                         |
|-------------------------|---------------------------------------------------------------------------------|
| ``y-star``              | y*(x) = 1/sqrt(mu (rho + 1/x)) from dJ/dy = 0, d2J/dy2 > 0 (Thm 3.5)            |
| ``reduction``           | I(x) = J(x, y*(x)) = s (sqrt(mu) + sqrt(rho + 1/x))^2 (App. C.3.1)              |
| ``power-law-quadratic`` | sigmabar^2 = (x/tau)^(2a)/(2a+1), K(x) (Eq. 5), first-order condition,          |
|                         | A x^2 + B x - C = 0 via Poly, discriminant, the printed x* as its '+' root      |
| ``power-law-roots``     | y-quadratic, printed y*, rationalised x* and y*, limits rho -> 0 and mu -> rho  |
| ``spurious-root``       | alpha >= 1/2: K' > 0, K -> 0 as x -> 0+, the printed root is spurious; mu < rho |
| ``mu-conventions``      | c = mu R + B is Sec. 3 with mu -> 1/mu; dy*/dmu and dx*/dmu change sign         |
| ``eta-star``            | eta* = sqrt(a/b), J0(eta*) = 2 sqrt(ab) = 8 sqrt(6) ... (printed: 4 sqrt(6))    |
| ``var-r-chi2``          | E_q[r] = 1, Var_q(r) = chi^2 = exp(D_2) - 1, ESS = n exp(-D_2) (FreshPER)       |
| ``thm51-chain``         | (e^z - 1)^2 <= max(1, e^z)^2 z^2 <= exp(2 abs(z)) z^2, chi^2 <= R^2 M2 (M2PO)   |
| ``finite-budget``       | Thm 3.4 at budget C: eta* from 2 b2 eta^3 + b1 eta^2 - A = 0 (trig/cosh root),  |
|                         | limits C -> oo (the paper's J) and C -> 0 (step-limited: c / eta_max)           |
| ``compute-to-target``   | least C for the bound to reach epsilon; proportional to J when kappa = 0        |
| ``fifo-long-run-variance`` | batch-mean noise of a full FIFO (B drawn with replacement): C(0), C(k),     |
|                         | sum over lags sigma^2 (1/B + 1/R - 1/(BN)); on-policy sigma^2/B or 2/B - 1/B^2  |
| ``noise-scale-rule``    | S = S_min (1 + B_noise V), cost (1 + b(1+y))(1 + mu/y), y* = sqrt(mu(1+1/b)),   |
|                         | replay pays iff 4b(1+b) < mu, threshold and best saving (McCandlish Eq. 2.7)    |
| ``assumption-3.2-counterexample`` | F = theta^2/2, G = theta + z: E[eps | F_1] = z_0, no finite kappa;    |
|                         | in mean square kappa ~ 1/eta, so the dropped kappa^2 eta term is O(1/eta)       |
| ``forgetting-variance`` | Var e = eta^2 V_eff/(1 - a^2), V_eff = C(0) + 2 sum a^k C(k); B V_eff =         |
|                         | 1 + y psi - 1/N, psi = 1/x + phi(x, a) closed form, limits a -> 0, 1, x -> oo;  |
|                         | lag-1 gradient autocorrelation -kappa/2 (SGD), (beta1 - 1/2) kappa (Adam)       |
| ``forgetting-rule``     | cost (1 + b + b y psi)(1 + mu/y), y* = sqrt(mu (1+b)/(b psi)), replay pays iff  |
|                         | 4 b psi (1+b) < mu (1 + b - b psi)^2, i.e. psi < (1 + 1/b) mu/(1+sqrt(1+mu))^2; |
|                         | staleness r(s) = 1 + c s gives the horizon x* = sqrt(tau y (2 - c)/c)           |
| ``free-batch``          | psi = 1: on-policy at B' = R beats replay at (R, B); equal-steps condition      |
|                         | psi < mu (y-1)/(y (mu+y)), loosest mu/(1+sqrt(1+mu))^2 = 0.4295 at mu = 5.28    |

| code name    | paper symbol     | meaning                                                            |
|--------------|------------------|--------------------------------------------------------------------|
| ``mu``       | mu (Sec. 3)      | update cost / rollout cost: c = R + mu B (``mu-conventions``)      |
| ``x``, ``y`` | x = N/R, y = B/R | staleness horizon, replay ratio                                    |
| ``s``        | sigmabar^2(x)    | buffer-averaged noise bound, > 0, independent of y                 |
| ``rho``      | rho              | correlation (Assumption 3.3); a positive symbol, rho -> 0 by limit |
| ``alpha``    | alpha            | power-law exponent, sigma(s) = (s/tau)^alpha                       |
| ``z``        | log r            | log importance ratio (M2PO)                                        |
| ``b``        | B_noise / B      | gradient noise scale (McCandlish) in units of the batch            |
| ``V``        | sum_k C(k)/sigma^2 | long-run variance of the batch-mean noise per unit sigma^2       |
| ``a``        | 1 - eta h        | SGD's contraction per step along a direction of curvature h        |
| ``kappa``    | eta lambda_eff   | the optimizer's forgetting rate; its memory is about 1/kappa steps |
| ``psi``      | psi(x, kappa)    | share of the FIFO's extra noise the optimizer keeps, in [0, 1]     |
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import sympy
from sympy import Eq, Rational, sqrt

__all__ = ["Step", "Derivation", "DERIVATIONS", "TITLES", "derive", "render"]

Substitution = Mapping[sympy.Basic | complex, sympy.Basic | complex]
"""What ``subs`` takes: sympy's own key and value types (a dict's keys are invariant, so a dict of symbols is not one
unless annotated)."""


@dataclass(frozen=True)
class Step:
    """One step of a derivation: a line of words and the expression sympy produced."""

    description: str
    expr: sympy.Basic


@dataclass(frozen=True)
class Derivation:
    """A derivation: its steps, its final result and the symbols it uses.

    ``parts`` names intermediate results (coefficients, printed forms, limits) so
    that tests and callers can use them without parsing ``steps``.
    """

    name: str
    title: str
    source: str
    steps: tuple[Step, ...]
    result: sympy.Basic
    symbols: dict[str, sympy.Symbol]
    parts: dict[str, sympy.Basic | sympy.MatrixBase] = field(default_factory=dict)

    def side(self, which: str) -> sympy.Expr:
        """The ``"lhs"`` or ``"rhs"`` of a result that is an equation, as the expression it is."""
        side = getattr(self.result, which, None)
        if not isinstance(side, sympy.Expr):
            raise TypeError(f"derivation {self.name}'s result {self.result} has no expression as its {which}")
        return side

    def expr(self, key: str) -> sympy.Expr:
        """``parts[key]`` as the expression it is (parts also hold equations, tuples and matrices)."""
        value = self.parts[key]
        if not isinstance(value, sympy.Expr):
            raise TypeError(f"derivation {self.name}'s part {key!r} is a {type(value).__name__}, not an expression")
        return value


ER_PAPER = "Efficient RL training for LLMs with experience replay"


def _positive(*names: str) -> tuple[sympy.Symbol, ...]:
    return tuple(sympy.Symbol(name, positive=True) for name in names)


def _zero(expr: sympy.Basic) -> sympy.Basic:
    """simplify(expr): 0 when an identity holds."""
    return sympy.simplify(expr)


def _identity(lhs: sympy.Basic, rhs: sympy.Basic | int) -> sympy.Basic:
    """The step 'lhs - rhs = simplify(lhs - rhs)', unevaluated so that it prints as '... = 0'."""
    # both sides are expressions: sympy types factor, together, diff ... as returning Basic (or Unknown)
    difference = cast(sympy.Expr, lhs) - rhs
    return Eq(difference, _zero(difference), evaluate=False)


def _root_equal_to(roots: list[sympy.Expr], target: sympy.Expr, what: str) -> tuple[sympy.Expr, list[sympy.Expr]]:
    """The root in ``roots`` that simplifies to ``target``, and the others; RuntimeError if none does."""
    differences = [sympy.simplify(root - target) for root in roots]
    if 0 not in differences:
        raise RuntimeError(f"none of sympy's roots {roots} simplifies to the printed {what} {target}")
    index = differences.index(sympy.S.Zero)
    return roots[index], roots[:index] + roots[index + 1:]


# Shared definitions (Sec. 3 parametrisation, App. C.3.1).
def _design_symbols() -> dict[str, sympy.Symbol]:
    mu, rho, x, y, s = _positive("mu", "rho", "x", "y", "s")
    return {"mu": mu, "rho": rho, "x": x, "y": y, "s": s}


def _objective_j(s, mu, rho, x, y):
    return s * (1 + mu * y) * (1 / y + 1 / x + rho)  # App. C.3.1: J(x, y)


def _y_star_printed(mu, rho, x):
    return 1 / sqrt(mu * (rho + 1 / x))  # Thm 3.5


def _power_law_k(x, mu, rho, alpha):
    return x**alpha * (sqrt(mu) + sqrt(rho + 1 / x))  # Eq. (5)


def _printed_x_star(mu, rho, alpha):
    root = sqrt(alpha**2 * mu**2 + mu * rho * (1 - 2 * alpha))
    return (-(alpha * mu + rho * (1 - 2 * alpha)) + root) / (2 * alpha * rho * (mu - rho))  # App. C.3.2


def _printed_y_star(mu, rho, alpha):
    root = sqrt(alpha**2 * mu**2 + mu * rho * (1 - 2 * alpha))
    return (-alpha * mu + root) / (rho * mu)  # App. C.3.2


# --------------------------------------------------------------------------- the registry

_Body = tuple[tuple[Step, ...], sympy.Basic, dict[str, sympy.Symbol], dict[str, sympy.Basic | sympy.MatrixBase]]
"""What a builder returns: the steps, result, symbols and parts of its :class:`Derivation`."""

DERIVATIONS: dict[str, Callable[[], Derivation]] = {}
"""The derivations by name (``derive NAME``), in the order the builders below are defined."""

TITLES: dict[str, str] = {}
"""Each derivation's title by name, known without building it (``derive`` with no name lists them)."""


def _derivation(name: str, title: str, source: str) -> Callable[[Callable[[], _Body]], Callable[[], Derivation]]:
    """Register a builder as the derivation ``name``: the decorated builder returns its (cached) Derivation."""

    def register(build: Callable[[], _Body]) -> Callable[[], Derivation]:
        @functools.cache
        @functools.wraps(build)
        def derivation() -> Derivation:
            return Derivation(name, title, source, *build())

        DERIVATIONS[name], TITLES[name] = derivation, title
        return derivation

    return register


# --------------------------------------------------------------------------- 1. y-star


@_derivation("y-star", "Optimal replay ratio y*(x) for a fixed staleness horizon",
             f"{ER_PAPER}, Thm 3.5 and App. C.3.1")
def _build_y_star() -> _Body:
    sym = _design_symbols()
    mu, rho, x, y, s = (sym[k] for k in ("mu", "rho", "x", "y", "s"))
    J = sympy.Function("J")(x, y)
    y_star = sympy.Symbol("y_*", positive=True)
    j_expr = _objective_j(s, mu, rho, x, y)
    dj = sympy.diff(j_expr, y)
    dj_simple = sympy.factor(sympy.simplify(dj))
    solutions = sympy.solve(Eq(dj, 0), y)  # y is a positive symbol: only the positive root
    (y_solved,) = solutions
    printed = _y_star_printed(mu, rho, x)
    d2j = sympy.simplify(sympy.diff(j_expr, y, 2))
    lim0 = sympy.limit(j_expr, y, 0, "+")
    lim_inf = sympy.limit(j_expr, y, sympy.oo)
    steps = (
        Step("Objective after optimising eta, per R rollouts (App. C.3.1); s = sigmabar^2(x) > 0 does not depend "
             "on y", Eq(J, j_expr)),
        Step("Differentiate in y (sympy.diff)", Eq(sympy.Derivative(J, y), dj)),
        Step("Simplify: the 1/y terms cancel, leaving s (mu (rho + 1/x) - 1/y^2)",
             Eq(sympy.Derivative(J, y), dj_simple)),
        Step(f"Solve dJ/dy = 0 for y > 0 (sympy.solve, {len(solutions)} positive solution)", Eq(y_star, y_solved)),
        Step("It equals the printed Thm 3.5 form 1/sqrt(mu (rho + 1/x)): difference simplifies to 0",
             _identity(y_solved, printed)),
        Step("Second derivative (sympy.diff twice, simplified)", Eq(sympy.Derivative(J, (y, 2)), d2j)),
        Step(f"Positive for s, y > 0 (sympy is_positive = {d2j.is_positive}): J is strictly convex in y, "
             "so the stationary point is the minimum", sympy.Gt(d2j, 0, evaluate=False)),
        Step("J -> oo at both ends of y in (0, oo) (sympy.limit), so the minimum is interior and unique",
             sympy.Tuple(Eq(sympy.Limit(J, y, 0, "+"), lim0), Eq(sympy.Limit(J, y, sympy.oo), lim_inf))),
    )
    return (steps, Eq(y_star, y_solved),
            dict(sym),
            {"J": j_expr, "dJ_dy": dj_simple, "d2J_dy2": d2j, "y_star": y_solved, "printed": printed})


# --------------------------------------------------------------------------- 2. reduction


@_derivation("reduction", "Reduced objective I(x) = J(x, y*(x))", f"{ER_PAPER}, Thm 3.5 and App. C.3.1")
def _build_reduction() -> _Body:
    sym = _design_symbols()
    mu, rho, x, y, s = (sym[k] for k in ("mu", "rho", "x", "y", "s"))
    a = sympy.Symbol("a", positive=True)
    I = sympy.Function("I")(x)
    y_star = _build_y_star().side("rhs")
    j_expr = _objective_j(s, mu, rho, x, y)
    substituted = j_expr.subs(y, y_star)
    simplified = sympy.factor(sympy.simplify(substituted))
    paper_form = s * (sqrt(mu) + sqrt(rho + 1 / x)) ** 2
    lemma_lhs = (1 + sqrt(mu / a)) * (sqrt(mu * a) + a)
    lemma_rhs = (sqrt(mu) + sqrt(a)) ** 2
    steps = (
        Step("Objective (App. C.3.1)", Eq(sympy.Function("J")(x, y), j_expr)),
        Step("Substitute the minimiser y*(x) from the y-star derivation", Eq(I, substituted)),
        Step("Simplify (sympy.simplify, factor)", Eq(I, simplified)),
        Step("The paper's lemma with a = rho + 1/x: (1 + sqrt(mu/a))(sqrt(mu a) + a) - (sqrt(mu) + sqrt(a))^2 "
             "expands to 0", Eq(lemma_lhs - lemma_rhs, sympy.expand(lemma_lhs - lemma_rhs), evaluate=False)),
        Step("Hence J(x, y*) - s (sqrt(mu) + sqrt(rho + 1/x))^2 simplifies to 0 (positive symbols)",
             _identity(substituted, paper_form)),
        Step("Reduced one-dimensional objective; x* = argmin_x I(x) (Thm 3.5)", Eq(I, paper_form)),
    )
    return (steps, Eq(I, paper_form),
            dict(sym),
            {"J_at_y_star": substituted, "simplified": simplified, "I": paper_form})


# --------------------------------------------------------------------------- 3. power-law-quadratic


@_derivation("power-law-quadratic", "Power-law noise: K(x), the first-order condition and the quadratic for x*",
             f"{ER_PAPER}, App. C.3.2, Eq. (5)")
def _build_power_law_quadratic() -> _Body:
    sym = _design_symbols()
    mu, rho, x = sym["mu"], sym["rho"], sym["x"]
    alpha, tau, t = _positive("alpha", "tau", "t")
    sym.update(alpha=alpha, tau=tau)
    del sym["y"], sym["s"]
    K = sympy.Function("K")(x)
    I = sympy.Function("I")(x)
    sbar = sympy.Function("sigmabar")(x) ** 2

    # sigmabar^2 from the power law sigma(t) = (t/tau)^alpha, integral approximation.
    sigma_sq = (t / tau) ** (2 * alpha)
    integral = sympy.integrate(sigma_sq, (t, 0, x))
    sbar_expr = sympy.simplify(integral / x)
    sbar_paper = (x / tau) ** (2 * alpha) / (2 * alpha + 1)

    # I(x) and K(x).
    reduction = _build_reduction()
    i_expr = reduction.side("rhs").subs(reduction.symbols["s"], sbar_expr)
    k_expr = _power_law_k(x, mu, rho, alpha)
    const = 1 / ((2 * alpha + 1) * tau ** (2 * alpha))

    # First-order condition.
    dk = sympy.diff(k_expr, x)
    multiplier = 2 * x ** (2 - alpha) * sqrt(rho + 1 / x)
    scaled = sympy.expand(sympy.simplify(dk * multiplier))
    paper_scaled = 2 * alpha * x * (sqrt(mu) * sqrt(rho + 1 / x) + rho + 1 / x) - 1
    lhs = 2 * alpha * sqrt(mu) * sqrt(rho * x**2 + x)
    # sympy writes the root term as 2 alpha sqrt(mu) sqrt(x) sqrt(rho x + 1); replace it by lhs and move the rest.
    root_terms = [term for term in sympy.Add.make_args(scaled) if term.has(mu)]
    if len(root_terms) != 1:  # pragma: no cover - depends on sympy's canonical form
        raise RuntimeError(f"unexpected form of the first-order condition: {scaled}")
    rhs = sympy.expand(lhs - scaled.subs(root_terms[0], lhs))

    # Square and collect.
    squared = sympy.expand(lhs**2 - rhs**2)
    poly = sympy.Poly(squared, x)
    c2, c1, c0 = poly.all_coeffs()
    A, B, C = sympy.factor(c2), sympy.factor(c1), sympy.factor(-c0)
    A_sym, B_sym, C_sym, delta_sym = sympy.symbols("A B C Delta")
    disc = sympy.factor(sympy.discriminant(poly, x))
    disc_paper = 16 * alpha**2 * mu * (alpha**2 * mu + rho * (1 - 2 * alpha))
    printed = _printed_x_star(mu, rho, alpha)
    plus_root, (minus_root,) = _root_equal_to(sympy.solve(squared, x), printed, "x*")

    steps = (
        Step("Power-law noise profile squared, sigma^2(t) = (t/tau)^(2 alpha) (App. C.3.2)",
             Eq(sympy.Function("sigma")(t) ** 2, sigma_sq)),
        Step("Integrate over the ages 0..x held by the buffer (integral approximation of the sum, argued)",
             Eq(sympy.Integral(sigma_sq, (t, 0, x)), integral)),
        Step("Divide by x: the buffer average", Eq(sbar, sbar_expr)),
        Step("Equals the printed (x/tau)^(2 alpha)/(2 alpha + 1): difference simplifies to 0",
             _identity(sbar_expr, sbar_paper)),
        Step("Substitute into the reduced objective I(x) (reduction derivation)", Eq(I, i_expr)),
        Step("I(x) = K(x)^2 / ((2 alpha + 1) tau^(2 alpha)) with K(x) = x^alpha (sqrt(mu) + sqrt(rho + 1/x)) "
             "(Eq. 5): difference simplifies to 0; K > 0 so argmin I = argmin K",
             _identity(i_expr, const * k_expr**2)),
        Step("Differentiate K (sympy.diff)", Eq(sympy.Derivative(K, x), dk)),
        Step("Multiply by 2 x^(2 - alpha) sqrt(rho + 1/x) > 0 (same sign as K'), expand",
             Eq(sympy.Mul(multiplier, sympy.Derivative(K, x), evaluate=False), scaled)),
        Step("Equals the printed 2 alpha x (sqrt(mu) sqrt(rho + 1/x) + rho + 1/x) - 1: difference is 0",
             _identity(scaled, paper_scaled)),
        Step("For x > 0, x sqrt(rho + 1/x) = sqrt(rho x^2 + x): difference simplifies to 0",
             _identity(x * sqrt(rho + 1 / x), sqrt(rho * x**2 + x))),
        Step("First-order condition K'(x) = 0, root term on the left, the rest moved right", Eq(lhs, rhs)),
        Step("Square both sides (may add roots where the right side is negative; see spurious-root)",
             Eq(lhs**2, rhs**2)),
        Step("Collect in x (sympy.Poly) and factor the coefficients: A x^2 + B x - C = 0",
             Eq(A * x**2 + B * x - C, 0)),
        Step("Coefficients: A = 4 alpha^2 rho (mu - rho), B = 4 alpha (alpha mu + rho (1 - 2 alpha)), "
             "C = (1 - 2 alpha)^2",
             sympy.Tuple(Eq(A_sym, A), Eq(B_sym, B), Eq(C_sym, C))),
        Step("Discriminant (sympy.discriminant = B^2 + 4 A C for A x^2 + B x - C; the paper writes B^2 - 4AC, "
             "right only if C is read as the signed constant -(1 - 2 alpha)^2)", Eq(delta_sym, disc)),
        Step("Equals the printed 16 alpha^2 mu (alpha^2 mu + rho (1 - 2 alpha)): difference is 0",
             _identity(disc, disc_paper)),
        Step("The '+' root of the quadratic (sympy.solve)", Eq(sympy.Symbol("x_*"), plus_root)),
        Step("equals the printed x* (App. C.3.2): difference simplifies to 0", _identity(plus_root, printed)),
    )
    return (steps, Eq(A * x**2 + B * x - C, 0),
            sym,
            {"sigma_bar_sq": sbar_expr, "I": i_expr, "K": k_expr, "dK": dk, "foc_scaled": scaled, "foc_lhs": lhs,
             "foc_rhs": rhs, "A": A, "B": B, "C": C, "discriminant": disc, "x_plus": plus_root, "x_minus": minus_root,
             "printed_x": printed})


def _on_power_law_quadratic() -> tuple[Derivation, dict[str, sympy.Symbol]]:
    """The power-law-quadratic derivation and a copy of its symbols, for the derivations that continue it."""
    quad = _build_power_law_quadratic()
    return quad, dict(quad.symbols)


# --------------------------------------------------------------------------- 4. power-law-roots


@_derivation("power-law-roots", "Power-law noise: closed forms of x* and y*, stable forms and removable singularities",
             f"{ER_PAPER}, App. C.3.2")
def _build_power_law_roots() -> _Body:
    quad, sym = _on_power_law_quadratic()
    mu, rho, x, alpha = sym["mu"], sym["rho"], sym["x"], sym["alpha"]
    y = sympy.Symbol("y", positive=True)
    w = sympy.Symbol("w", positive=True)  # w = sqrt(rho + 1/x)
    c = sympy.Symbol("c", positive=True)  # c = 1 - alpha (> 1/2 when alpha < 1/2)
    sym["y"] = y
    x_star, y_star = sympy.symbols("x_* y_*", positive=True)

    # (i) x from y*(x) = 1/sqrt(mu (rho + 1/x)).
    (x_from_y,) = sympy.solve(Eq(y, _y_star_printed(mu, rho, x)), x)
    # (ii) x from the first-order condition with sqrt(rho + 1/x) = 1/(sqrt(mu) y).
    foc_w = 2 * alpha * x * (sqrt(mu) * w + w**2) - 1
    foc_y = foc_w.subs(w, 1 / (sqrt(mu) * y))
    (x_from_foc,) = sympy.solve(foc_y, x)
    # (iii) equate.
    numerator = sympy.factor(sympy.numer(sympy.together(x_from_foc - x_from_y)))
    quad_y = sympy.expand(sympy.cancel(numerator / (mu * y**2)))
    if sympy.Poly(quad_y, y).LC().could_extract_minus_sign():
        quad_y = sympy.expand(-quad_y)
    a2, _, a0 = sympy.Poly(quad_y, y).all_coeffs()
    product = sympy.factor(a0 / a2)
    printed_y = _printed_y_star(mu, rho, alpha)
    plus_root, _ = _root_equal_to(sympy.solve(quad_y, y), printed_y, "y*")
    # x* through y* alone: eliminate mu with the quadratic, mu y (rho y + 2 alpha) = 1 - 2 alpha.
    (mu_of_y,) = sympy.solve(quad_y, mu)
    x_of_y = sympy.factor(sympy.simplify(x_from_y.subs(mu, mu_of_y)))

    # Rationalise both printed roots: multiply by the conjugate of the numerator.
    root = sqrt(alpha**2 * mu**2 + mu * rho * (1 - 2 * alpha))
    conj_y = sympy.expand((-alpha * mu + root) * (alpha * mu + root))
    stable_y = sympy.factor(sympy.cancel(conj_y / (rho * mu))) / (alpha * mu + root)
    shift = alpha * mu + rho * (1 - 2 * alpha)
    conj_x = sympy.factor(sympy.expand((-shift + root) * (shift + root)))
    printed_x = _printed_x_star(mu, rho, alpha)
    stable_x = sympy.factor(sympy.cancel(conj_x / (2 * alpha * rho * (mu - rho)))) / (shift + root)

    # Limits rho -> 0 (printed forms are 0/0 there).
    x_rho0 = sympy.factor(sympy.limit(printed_x, rho, 0, "+"))
    y_rho0 = sympy.factor(sympy.limit(printed_y, rho, 0, "+"))
    # mu = rho: the printed numerator holds sqrt((1 - alpha)^2); write alpha = 1 - c (c > 0, true for alpha < 1)
    # so that sympy knows sqrt(c^2) = c, then put alpha back.
    def at_mu_eq_rho(expr: sympy.Expr) -> sympy.Basic:
        return sympy.factor(sympy.simplify(expr.subs(alpha, 1 - c).subs(mu, rho)).subs(c, 1 - alpha))

    num_at = at_mu_eq_rho(sympy.numer(sympy.together(printed_x)))
    x_mu_rho = sympy.factor(sympy.limit(printed_x.subs(alpha, 1 - c), mu, rho, "+-").subs(c, 1 - alpha))
    stable_at = at_mu_eq_rho(stable_x)

    steps = (
        Step("Characterisation 1: invert y*(x) = 1/sqrt(mu (rho + 1/x)) for x (sympy.solve)",
             Eq(x_star, x_from_y.subs(y, y_star))),
        Step("Characterisation 2: put w = sqrt(rho + 1/x) = 1/(sqrt(mu) y) into the first-order condition "
             "2 alpha x (sqrt(mu) w + w^2) = 1", Eq(foc_y.subs(y, y_star) + 1, 1)),
        Step("Solve it for x (sympy.solve)", Eq(x_star, x_from_foc.subs(y, y_star))),
        Step("Equate the two: numerator of the difference (sympy.together, factor)", Eq(numerator.subs(y, y_star), 0)),
        Step("Divide by mu y^2 > 0: the quadratic in y* (App. C.3.2)", Eq(quad_y.subs(y, y_star), 0)),
        Step("Vieta: product of the roots = (2 alpha - 1)/(rho mu) < 0 for alpha < 1/2 (sign argued), "
             "so exactly one root is positive", Eq(sympy.Symbol("y_1") * sympy.Symbol("y_2"), product)),
        Step("Its positive root (sympy.solve)", Eq(y_star, plus_root)),
        Step("equals the printed y*: difference simplifies to 0", _identity(plus_root, printed_y)),
        Step("Multiply the printed y* by the conjugate of its numerator: the numerator becomes mu rho (1 - 2 alpha)",
             Eq(sympy.Mul(-alpha * mu + root, alpha * mu + root, evaluate=False), conj_y)),
        Step("Rationalised (stable) y*: no 0/0 at rho = 0, no cancellation", Eq(y_star, stable_y)),
        Step("Printed y* minus stable y* simplifies to 0", _identity(printed_y, stable_y)),
        Step("Same for the printed x*: the conjugate product is rho (1 - 2 alpha)^2 (mu - rho), which cancels "
             "the (mu - rho) and rho of the denominator",
             Eq(sympy.Mul(-shift + root, shift + root, evaluate=False), conj_x)),
        Step("Rationalised (stable) x*: no 0/0 at rho = 0 nor at mu = rho", Eq(x_star, stable_x)),
        Step("Printed x* minus stable x* simplifies to 0", _identity(printed_x, stable_x)),
        Step("Stable x* agrees with characterisation 2 at the stable y*: difference simplifies to 0",
             _identity(stable_x, x_from_foc.subs(y, stable_y))),
        Step("Eliminating mu from characterisation 1 with the y-quadratic: x* in terms of y* alone "
             "(another stable form)", Eq(x_star, x_of_y.subs(y, y_star))),
        Step("rho -> 0: the printed x* is 0/0; sympy.limit gives a finite value (removable singularity)",
             Eq(sympy.Limit(printed_x, rho, 0, "+"), x_rho0)),
        Step("rho -> 0 of the printed y* (removable singularity)", Eq(sympy.Limit(printed_y, rho, 0, "+"), y_rho0)),
        Step("The stable forms evaluated at rho = 0 give the same values (plain substitution, no limit needed)",
             sympy.Tuple(Eq(sympy.Subs(x_star, rho, 0), sympy.factor(stable_x.subs(rho, 0))),
                         Eq(sympy.Subs(y_star, rho, 0), sympy.factor(stable_y.subs(rho, 0))))),
        Step("mu = rho: the printed x* has denominator 0 and its numerator rho (alpha - 1 + |1 - alpha|) is 0 for "
             "alpha < 1 (computed with alpha = 1 - c, c > 0), i.e. 0/0",
             Eq(sympy.Subs(sympy.numer(sympy.together(printed_x)), mu, rho), num_at)),
        Step("Two-sided limit mu -> rho of the printed x* (same substitution): finite",
             Eq(sympy.Limit(printed_x, mu, rho, "+-"), x_mu_rho)),
        Step("The stable x* evaluated at mu = rho (same substitution) gives the same value",
             Eq(sympy.Subs(x_star, mu, rho), stable_at)),
    )
    return (steps, sympy.Tuple(Eq(x_star, stable_x), Eq(y_star, stable_y)),
            sym,
            {"x_from_y": x_from_y, "x_from_foc": x_from_foc, "x_of_y": x_of_y, "y_quadratic": quad_y,
             "root_product": product, "y_plus": plus_root, "printed_x": printed_x, "printed_y": printed_y,
             "stable_x": stable_x, "stable_y": stable_y, "x_rho0": x_rho0, "y_rho0": y_rho0, "x_mu_eq_rho": x_mu_rho,
             "numerator_mu_eq_rho": num_at, "stable_x_mu_eq_rho": stable_at})


# --------------------------------------------------------------------------- 5. spurious-root


@_derivation("spurious-root", "alpha > 1/2: no interior optimum; the squared first-order condition has a spurious root",
             f"{ER_PAPER}, App. C.3.2 (closed form stated for alpha < 1/2)")
def _build_spurious_root() -> _Body:
    quad, sym = _on_power_law_quadratic()
    mu, rho, x, alpha = sym["mu"], sym["rho"], sym["x"], sym["alpha"]
    d = sympy.Symbol("delta", nonnegative=True)  # alpha = 1/2 + delta
    lhs, rhs = quad.expr("foc_lhs"), quad.expr("foc_rhs")
    scaled = sympy.expand(lhs - rhs)  # = 2 x^(2-alpha) sqrt(rho + 1/x) K'(x)
    shifted = sympy.expand(scaled.subs(alpha, Rational(1, 2) + d))
    A, B, C = quad.expr("A"), quad.expr("B"), quad.expr("C")

    values: Substitution = {alpha: Rational(3, 4), mu: 2, rho: Rational(1, 2)}
    A_v, B_v, C_v = (sympy.nsimplify(e.subs(values)) for e in (A, B, C))
    x_plus = sympy.radsimp(sympy.simplify(quad.expr("printed_x").subs(values)))
    lhs_v = sympy.simplify(lhs.subs(values).subs(x, x_plus))
    rhs_v = sympy.simplify(rhs.subs(values).subs(x, x_plus))
    k_expr = quad.expr("K")
    dk_v = quad.expr("dK").subs(values).subs(x, x_plus)
    residual = sympy.simplify(A_v * x_plus**2 + B_v * x_plus - C_v)
    y_printed_v = sympy.simplify(_printed_y_star(mu, rho, alpha).subs(values))
    x_plus_sym = sympy.Symbol("x_+")
    K = sympy.Function("K")(x)
    Kp = sympy.Subs(sympy.Derivative(K, x), x, x_plus_sym)
    multiplier = 2 * x ** (2 - alpha) * sqrt(rho + 1 / x)
    # The infimum on the border: K(x) -> 0 as x -> 0+ for alpha > 1/2 (K -> 1 at alpha = 1/2).
    d_pos = sympy.Symbol("delta", positive=True)
    k_lim = sympy.limit(k_expr.subs(alpha, Rational(1, 2) + d_pos), x, 0, "+")
    k_lim_half = sympy.limit(k_expr.subs(alpha, Rational(1, 2)), x, 0, "+")
    # alpha < 1/2 but mu < rho: A < 0, both roots of the squared quadratic are positive; only one is genuine.
    values_low: Substitution = {alpha: Rational(2, 5), mu: Rational(1, 5), rho: Rational(1, 2)}
    roots_low = sympy.solve(quad.side("lhs").subs(values_low), x)
    printed_low = sympy.radsimp(sympy.simplify(quad.expr("printed_x").subs(values_low)))
    genuine_low, (other_low,) = _root_equal_to(roots_low, printed_low, "x*")
    rhs_low = tuple(sympy.simplify(rhs.subs(values_low).subs(x, r)) for r in (genuine_low, other_low))

    steps = (
        Step("Scaled derivative 2 x^(2 - alpha) sqrt(rho + 1/x) K'(x) = LHS - RHS of the first-order condition",
             Eq(sympy.Mul(multiplier, sympy.Derivative(K, x), evaluate=False), scaled)),
        Step(f"With alpha = 1/2 + delta, delta >= 0: every term is >= 0 and the root term > 0 "
             f"(sympy is_positive = {shifted.is_positive}), so K' > 0: K increases, the infimum is x -> 0+ "
             "(stay on-policy)", sympy.Gt(shifted, 0, evaluate=False)),
        Step("For alpha = 1/2 + delta, delta > 0, K(x) -> 0 as x -> 0+ (sympy.limit; at alpha = 1/2 the limit is "
             "1): the infimum is on the border and not attained, so App. C.3.1's premise that J tends to infinity "
             "on the border of (0, oo)^2 fails for alpha >= 1/2",
             sympy.Tuple(Eq(sympy.Limit(k_expr.subs(alpha, Rational(1, 2) + d_pos), x, 0, "+"), k_lim),
                         Eq(sympy.Limit(k_expr.subs(alpha, Rational(1, 2)), x, 0, "+"), k_lim_half))),
        Step("Squared quadratic A x^2 + B x - C = 0 (power-law-quadratic): for mu > rho, A > 0 and -C < 0, "
             "so the roots have product -C/A < 0 and one of them is positive (argued from signs)",
             Eq(sympy.Symbol("x_1") * sympy.Symbol("x_2"), sympy.factor(-C / A))),
        Step("That positive root satisfies LHS = -RHS, not LHS = RHS: its RHS 1 - 2 alpha - 2 alpha rho x is < 0 "
             "for alpha > 1/2 while LHS = 2 alpha sqrt(mu) sqrt(rho x^2 + x) > 0 (argued)", Eq(lhs, rhs)),
        Step("Instance alpha = 3/4, mu = 2, rho = 1/2: coefficients A, B, C",
             sympy.Tuple(*(Eq(sympy.Symbol(n), v) for n, v in zip("ABC", (A_v, B_v, C_v))))),
        Step(f"Printed x* there (exact): positive (x_+ = {float(x_plus):.6g})", Eq(x_plus_sym, x_plus)),
        Step("It solves the squared quadratic: A x_+^2 + B x_+ - C simplifies to 0",
             Eq(A_v * x_plus_sym**2 + B_v * x_plus_sym - C_v, residual, evaluate=False)),
        Step(f"But LHS = {float(lhs_v):.6g} > 0 and RHS = {float(rhs_v):.6g} < 0 at x_+: the unsquared condition fails",
             sympy.Tuple(Eq(sympy.Symbol("LHS"), lhs_v), Eq(sympy.Symbol("RHS"), rhs_v))),
        Step("K'(x_+), computed exactly and evaluated to 15 digits, is > 0: x_+ is not a stationary point of K",
             Eq(Kp, dk_v.evalf(15))),
        Step(f"The printed y* at the same values is {float(y_printed_v):.6g} < 0 (both roots of the y-quadratic are "
             "negative when 2 alpha - 1 > 0)", Eq(sympy.Symbol("y^printed_*"), y_printed_v)),
        Step("Even for alpha < 1/2 squaring adds a root when mu < rho: A < 0, product -C/A > 0 and sum -B/A > 0, so "
             "both roots are positive. Instance alpha = 2/5, mu = 1/5, rho = 1/2: the printed ('+') root has "
             f"RHS = {float(rhs_low[0]):.4g} > 0 (genuine), the other RHS = {float(rhs_low[1]):.4g} < 0 (spurious); "
             "the printed formula picks the right one",
             sympy.Tuple(Eq(sympy.Symbol("x_printed"), genuine_low), Eq(sympy.Symbol("x_other"), other_low))),
    )
    return (steps, sympy.Gt(shifted, 0, evaluate=False),
            {**sym, "delta": d},
            {"scaled_dK": scaled, "scaled_dK_shifted": shifted, "instance": sympy.Dict(values), "x_plus": x_plus,
             "lhs_at_root": lhs_v, "rhs_at_root": rhs_v, "dK_at_root": dk_v, "K": k_expr,
             "printed_y_at_instance": y_printed_v, "K_limit_at_0": k_lim, "K_limit_at_0_alpha_half": k_lim_half,
             "instance_mu_below_rho": sympy.Dict(values_low), "genuine_root_mu_below_rho": genuine_low,
             "other_root_mu_below_rho": other_low, "rhs_at_roots_mu_below_rho": sympy.Tuple(*rhs_low)})


# --------------------------------------------------------------------------- 6. mu-conventions


@_derivation("mu-conventions", "The two meanings of mu: c = R + mu B (Sec. 3) versus c = mu R + B (Sec. 2, Table 1)",
             f"{ER_PAPER}, Sec. 2, Sec. 3, Fig. 4 caption")
def _build_mu_conventions() -> _Body:
    sym = _design_symbols()
    mu, rho, x, y, s = (sym[k] for k in ("mu", "rho", "x", "y", "s"))
    alpha = sympy.Symbol("alpha", positive=True)
    R, B = _positive("R", "B")
    sym["alpha"] = alpha
    J_sec3 = sympy.Function("J_sec3")
    J_roll = sympy.Function("J_rollout")
    noise = s * (1 / y + 1 / x + rho)
    j_sec3 = _objective_j(s, mu, rho, x, y)
    j_roll = sympy.expand((mu * R + B) / R).subs(B, y * R) * noise  # cost mu R + B per update, per R rollouts
    identity = _identity(j_roll, mu * j_sec3.subs(mu, 1 / mu))
    (y_roll,) = sympy.solve(sympy.diff(j_roll, y), y)
    y_sec3 = _build_y_star().side("rhs")
    y_roll_paper = sqrt(mu / (rho + 1 / x))
    dy_sec3 = sympy.simplify(sympy.diff(y_sec3, mu))
    dy_roll = sympy.simplify(sympy.diff(y_roll, mu))

    # Power law: how x*, y* move with the Sec. 3 mu (implicit differentiation of the y-quadratic).
    roots = _build_power_law_roots()  # its y symbol is the same positive Symbol("y")
    yq = sympy.Function("y")(mu)
    implicit = roots.expr("y_quadratic").subs(y, yq)
    (dy_dmu,) = sympy.solve(sympy.diff(implicit, mu), sympy.Derivative(yq, mu))
    dy_dmu = sympy.factor(dy_dmu.subs(yq, y))
    x_of_y = roots.expr("x_of_y")  # x* = (1 - 2 alpha) y* / (2 alpha (1 + rho y*))
    dx_dy = sympy.factor(sympy.diff(x_of_y, y))

    steps = (
        Step("Sec. 3 as printed: cost per update c = R + mu B, mu = update cost / rollout cost; per R rollouts",
             Eq(J_sec3(x, y, mu), j_sec3)),
        Step("Sec. 2 / Table 1 reading: mu = rollout cost / update cost, so c = mu R + B; divide by R (y = B/R)",
             Eq(J_roll(x, y, mu), j_roll)),
        Step("J_rollout(x, y; mu) - mu J_sec3(x, y; 1/mu) simplifies to 0: a positive factor, same argmin with "
             "mu -> 1/mu", identity),
        Step("Solve dJ_rollout/dy = 0 for y > 0 (sympy.solve)", Eq(sympy.Symbol("y^*_rollout"), y_roll)),
        Step("Equals sqrt(mu/(rho + 1/x)) and the Sec. 3 y* at 1/mu: differences simplify to 0",
             sympy.Tuple(_identity(y_roll, y_roll_paper), _identity(y_roll, y_sec3.subs(mu, 1 / mu)))),
        Step(f"Sec. 3 reading: dy*/dmu (sympy is_negative = {dy_sec3.is_negative}): more expensive updates, "
             "fewer replays", Eq(sympy.Derivative(sympy.Symbol("y^*_sec3"), mu), dy_sec3)),
        Step(f"Rollout-cost reading: dy*/dmu (sympy is_positive = {dy_roll.is_positive}): more expensive rollouts, "
             "more replays", Eq(sympy.Derivative(sympy.Symbol("y^*_rollout"), mu), dy_roll)),
        Step("Power law (Sec. 3 mu): differentiate rho mu y^2 + 2 alpha mu y + 2 alpha - 1 = 0 implicitly; "
             "negative for y > 0 (every factor signed)", Eq(sympy.Derivative(sympy.Symbol("y_*"), mu), dy_dmu)),
        Step("x* as a function of y* alone (power-law-roots: mu eliminated with the y-quadratic)",
             Eq(sympy.Symbol("x_*"), x_of_y)),
        Step("dx*/dy* > 0 for alpha < 1/2 (argued from the signs): x* moves with y*, so both fall as the Sec. 3 "
             "mu grows and both rise with the rollout-cost mu (Fig. 4's caption)",
             Eq(sympy.Derivative(sympy.Symbol("x_*"), sympy.Symbol("y_*")), dx_dy)),
    )
    return (steps, Eq(sympy.Symbol("y^*_rollout"), y_roll),
            sym,
            {"J_sec3": j_sec3, "J_rollout": j_roll, "identity": identity, "y_rollout": y_roll, "dy_dmu_sec3": dy_sec3,
             "dy_dmu_rollout": dy_roll, "dy_dmu_power_law": dy_dmu, "x_of_y": x_of_y, "dx_dy": dx_dy})


# --------------------------------------------------------------------------- 7. eta-star


@_derivation("eta-star", "Optimal step size eta* and the value of the asymptotic bound",
             f"{ER_PAPER}, App. C.3.1 (from Thm 3.4)")
def _build_eta_star() -> _Body:
    eta, a, b, F0, c, C, L, s, S = _positive("eta", "a", "b", "F_0", "c", "C", "L", "s", "S")
    B, N, R, rho, mu = _positive("B", "N", "R", "rho", "mu")
    J0 = sympy.Function("J_0")(eta)
    j0 = a / eta + b * eta
    a_def = 12 * F0 * c / C
    b_def = 8 * L * s * S
    (eta_star,) = sympy.solve(sympy.diff(j0, eta), eta)
    d2 = sympy.simplify(sympy.diff(j0, eta, 2))
    j_min_ab = sympy.simplify(j0.subs(eta, eta_star))
    j_min = sympy.simplify(j_min_ab.subs({a: a_def, b: b_def}))
    printed = 4 * sqrt(6) * sqrt(L * F0) / sqrt(C) * sqrt(c * s * S)  # App. C.3.1 as printed
    ratio = sympy.simplify(j_min / printed)
    steps = (
        Step("Asymptotic objective (App. C.3.1): J0 = 12 F0 c/(C eta) + 8 L eta s S, s = sigmabar^2(N/R), "
             "S = 1/B + 1/N + rho/R, c = R + mu B", Eq(J0, j0)),
        Step("with a and b",
             sympy.Tuple(Eq(a, a_def), Eq(b, b_def), Eq(S, 1 / B + 1 / N + rho / R), Eq(c, R + mu * B))),
        Step("Solve dJ0/deta = -a/eta^2 + b = 0 for eta > 0 (sympy.solve)", Eq(sympy.Symbol("eta_*"), eta_star)),
        Step(f"Second derivative 2a/eta^3 > 0 (sympy is_positive = {d2.is_positive}): a minimum",
             Eq(sympy.Derivative(J0, (eta, 2)), d2)),
        Step("Minimum value (substitute and simplify)", Eq(sympy.Function("J_0")(sympy.Symbol("eta_*")), j_min_ab)),
        Step("Put a and b back: 2 sqrt(96 L F0 c s S / C) = 8 sqrt(6) sqrt(L F0 c s S / C)",
             Eq(sympy.Function("J_0")(sympy.Symbol("eta_*")), j_min)),
        Step("App. C.3.1 prints 4 sqrt(6) sqrt(L F0/C) sqrt(c s S): derived / printed = 2 (a factor 2 dropped, "
             "i.e. the paper wrote sqrt(ab) for 2 sqrt(ab)); a positive constant, so the argmin over (R, B, N) and "
             "the objective J = c s S are unchanged", Eq(sympy.Symbol("derived") / sympy.Symbol("printed"), ratio)),
    )
    return (steps, Eq(sympy.Function("J_0")(sympy.Symbol("eta_*")), j_min),
            {"eta": eta, "a": a, "b": b, "F0": F0, "c": c, "C": C, "L": L, "s": s, "S": S,
             "B": B, "N": N, "R": R, "rho": rho, "mu": mu},
            {"J0": j0, "eta_star": eta_star, "J0_min_ab": j_min_ab, "J0_min": j_min, "printed": printed,
             "ratio": ratio, "a": a_def, "b": b_def})


# --------------------------------------------------------------------------- 8. var-r-chi2


def _linear_sum(summand: sympy.Expr, limits: tuple) -> sympy.Expr:
    """Sum of an expanded summand, split term by term with constant factors pulled out."""
    total = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(summand)):
        coeff, rest = term.as_coeff_Mul()
        total += coeff * sympy.Sum(rest, limits)
    return total


@_derivation("var-r-chi2", "Importance ratio: E_q[r] = 1, Var_q(r) = chi^2(p||q) = exp(D_2) - 1",
             "FreshPER (FreshPER                       ) Eqs. (5), (8), (9), (23), (24)")
def _build_var_r_chi2() -> _Body:
    p = _positive("p1", "p2", "p3")
    q = _positive("q1", "q2", "q3")
    n = sympy.Symbol("n", positive=True)
    constraints: Substitution = {p[2]: 1 - p[0] - p[1], q[2]: 1 - q[0] - q[1]}
    r = [pi / qi for pi, qi in zip(p, q)]
    mean_r = sympy.Add(*(qi * ri for qi, ri in zip(q, r)))
    second = sympy.Add(*(qi * ri**2 for qi, ri in zip(q, r)))
    mean_value = sympy.simplify(mean_r.subs(constraints))
    var_r = sympy.simplify(second.subs(constraints) - mean_value**2)
    chi2 = sympy.Add(*(qi * (ri - 1) ** 2 for qi, ri in zip(q, r)))
    chi2_formula = sympy.Add(*(pi**2 / qi for pi, qi in zip(p, q))) - 1
    d2 = sympy.log(sympy.Add(*(pi**2 / qi for pi, qi in zip(p, q))))

    i, K = sympy.symbols("i K", integer=True, positive=True)
    # sympy annotates IndexedBase.__new__ as returning Basic: it returns the IndexedBase
    P, Q = cast(sympy.IndexedBase, sympy.IndexedBase("p")), cast(sympy.IndexedBase, sympy.IndexedBase("q"))
    limits = (i, 1, K)
    general = _linear_sum(Q[i] * (P[i] / Q[i] - 1) ** 2, limits)
    general_reduced = general.subs({sympy.Sum(P[i], limits): 1, sympy.Sum(Q[i], limits): 1})
    Eq_, Var_ = sympy.Function("E_q"), sympy.Function("Var_q")
    rr = sympy.Symbol("r")
    chi2_sym = sympy.Symbol("chi^2")
    steps = (
        Step("Categorical pair on 3 outcomes, p3 = 1 - p1 - p2, q3 = 1 - q1 - q2; ratio r_i = p_i/q_i",
             sympy.Tuple(*(Eq(sympy.Symbol(f"r{k + 1}"), ri) for k, ri in enumerate(r)))),
        Step("E_q[r] = sum q_i r_i simplifies to 1 (FreshPER Eq. 8)", Eq(Eq_(rr), mean_value)),
        Step("Var_q(r) = E_q[r^2] - E_q[r]^2 (constraints substituted, simplified)", Eq(Var_(rr), var_r)),
        Step("chi^2(p||q) = sum q_i (r_i - 1)^2 minus (sum p_i^2/q_i - 1) simplifies to 0 under the constraints",
             _identity(chi2.subs(constraints), chi2_formula.subs(constraints))),
        Step("and Var_q(r) - chi^2 simplifies to 0 (FreshPER Eq. 9)",
             _identity(var_r, chi2.subs(constraints))),
        Step("Any number K of outcomes: expand the summand and split the sum (linearity)",
             Eq(sympy.Sum(Q[i] * (P[i] / Q[i] - 1) ** 2, limits), general)),
        Step("with sum p_i = sum q_i = 1", Eq(chi2_sym, general_reduced)),
        Step("Renyi order 2: D_2 = log E_q[r^2] = log sum p_i^2/q_i; exp(D_2) - 1 - chi^2 simplifies to 0 "
             "(FreshPER Eq. 24)", _identity(sympy.exp(d2) - 1, chi2_formula)),
        Step("Hence the ESS of n weighted samples, n/(1 + Var_q r) = n/E_q[r^2] = n exp(-D_2) (FreshPER Eq. 5): "
             "n/(1 + chi^2) - n exp(-D_2) simplifies to 0", _identity(n / (1 + chi2_formula), n * sympy.exp(-d2))),
    )
    return (steps, Eq(Var_(rr), chi2_formula),
            {**{f"p{k + 1}": v for k, v in enumerate(p)}, **{f"q{k + 1}": v for k, v in enumerate(q)}, "n": n},
            {"mean_r": mean_value, "var_r": var_r, "chi2": chi2_formula, "d2": d2,
             "general": general_reduced})


# --------------------------------------------------------------------------- 9. thm51-chain


@_derivation("thm51-chain", "M2PO Thm 5.1: chi^2 <= R^2 M2 and the sharper max(1, r)^2 pointwise bound",
             "M2PO (M2PO               ), Thm 5.1 and App. C")
def _build_thm51_chain() -> _Body:
    z = sympy.Symbol("z", real=True)
    zp = sympy.Symbol("z", nonnegative=True)  # the branch z >= 0
    u = sympy.Symbol("u", nonnegative=True)  # u = -z for the branch z <= 0
    xi = sympy.Symbol("xi", real=True)
    R = sympy.Symbol("R", positive=True)
    chi2, m2 = sympy.Symbol("chi^2"), sympy.Symbol("M_2")
    g = zp * sympy.exp(zp) - (sympy.exp(zp) - 1)
    g_prime = sympy.simplify(sympy.diff(g, zp))
    h = u - (1 - sympy.exp(-u))
    h_prime = sympy.diff(h, u)
    k = sympy.exp(zp) - 1 - zp  # for the converse
    k_prime = sympy.diff(k, zp)
    lhs = (sympy.exp(z) - 1) ** 2
    sharp = sympy.Max(1, sympy.exp(z)) ** 2 * z**2
    paper = z**2 * sympy.exp(2 * sympy.Abs(z))
    series = sympy.series(lhs, z, 0, 5)
    ratio_limit = sympy.limit(lhs / z**2, z, 0, "+-")
    steps = (
        Step("Definitions (M2PO Sec. 5.1): z = log r, chi^2 = E_behav[(r - 1)^2] = E[(e^z - 1)^2], M2 = E[z^2]",
             sympy.Tuple(Eq(chi2, sympy.Function("E")(lhs)), Eq(m2, sympy.Function("E")(z**2)))),
        Step("Mean-value theorem (argued): e^z - 1 = z e^xi for some xi between 0 and z, so |xi| <= |z| and "
             "(e^z - 1)^2 = z^2 e^(2 xi) <= z^2 e^(2|z|)", Eq(sympy.exp(z) - 1, z * sympy.exp(xi))),
        Step("Sharper, z >= 0: g(z) = z e^z - (e^z - 1) has g(0) = 0 ...",
             sympy.Tuple(Eq(sympy.Function("g")(zp), g), Eq(sympy.Function("g")(0), g.subs(zp, 0)))),
        Step(f"... and g'(z) = z e^z >= 0 (sympy.diff; is_nonnegative = {g_prime.is_nonnegative}), so g >= 0: "
             "0 <= e^z - 1 <= z e^z", Eq(sympy.Derivative(sympy.Function("g")(zp), zp), g_prime)),
        Step("z < 0, u = -z > 0: h(u) = u - (1 - e^-u) has h(0) = 0 ...",
             sympy.Tuple(Eq(sympy.Function("h")(u), h), Eq(sympy.Function("h")(0), h.subs(u, 0)))),
        Step("... and h'(u) = 1 - e^-u >= 0 (e^-u <= 1, argued), so 0 <= 1 - e^z <= |z|",
             Eq(sympy.Derivative(sympy.Function("h")(u), u), h_prime)),
        Step("Both branches together (squares of non-negative sides): the sharper pointwise bound",
             sympy.Le(lhs, sharp, evaluate=False)),
        Step("max(1, e^z) = e^max(0, z) <= e^|z| (argued), which gives the paper's pointwise bound",
             sympy.Le(sharp, paper, evaluate=False)),
        Step("If 1/R <= r <= R then |z| <= log R, e^(2|z|) <= R^2; take E_behav: chi^2 <= R^2 M2 (Thm 5.1). "
             "The sharper bound needs only r <= R (R >= 1): chi^2 <= max(1, sup r)^2 M2 (argued)",
             sympy.Le(chi2, R**2 * m2, evaluate=False)),
        Step("Local behaviour (sympy.series): (e^z - 1)^2 = z^2 + z^3 + ..., so chi^2 ~= M2 for small log-ratios",
             Eq(lhs, series)),
        Step("and (e^z - 1)^2 / z^2 -> 1 as z -> 0 (sympy.limit): no constant below 1 can work",
             Eq(sympy.Limit(lhs / z**2, z, 0, "+-"), ratio_limit)),
        Step("Converse (not in the paper): k(z) = e^z - 1 - z has k(0) = 0 and k'(z) = e^z - 1 of the sign of z, "
             "so k >= 0; hence z^2 <= (r - 1)^2 for z >= 0 and z^2 <= e^(-2z)(r - 1)^2 for z < 0: "
             "M2 <= max(1, sup 1/r)^2 chi^2 (argued from k)",
             sympy.Tuple(Eq(sympy.Function("k")(zp), k), Eq(sympy.Function("k")(0), k.subs(zp, 0)),
                         Eq(sympy.Derivative(sympy.Function("k")(zp), zp), k_prime))),
    )
    return (steps, sympy.Le(lhs, sharp, evaluate=False),
            {"z": z, "R": R, "xi": xi},
            {"g": g, "g_prime": g_prime, "h": h, "h_prime": h_prime, "k": k, "k_prime": k_prime,
             "lhs": lhs, "sharp": sharp, "paper": paper, "series": series, "ratio_limit": ratio_limit})


# --------------------------------------------------------------------------- 10. finite-budget


@_derivation("finite-budget", "The Thm 3.4 bound at a finite compute budget: eta* from a cubic, and its two limits",
             f"{ER_PAPER}, Thm 3.4, App. C.2 (Eqs. (3), (4)), App. C.3.1")
def _build_finite_budget() -> _Body:
    eta, A, b1, b2, F0, c, C, L, s, S, x, kappa, w, beta = _positive(
        "eta", "A", "b_1", "b_2", "F_0", "c", "C", "L", "s", "S", "x", "kappa", "w", "beta")
    phi = sympy.Symbol("phi", real=True)
    V = sympy.Function("V")(eta)
    bound = 12 * F0 / (eta * (C / c)) + 8 * eta * (4 * x**2 * kappa**2 * eta + L) * s * S  # Thm 3.4, T = C/c
    a_def, b1_def, b2_def = 12 * F0 * c / C, 8 * L * s * S, 32 * kappa**2 * x**2 * s * S
    v = A / eta + b1 * eta + b2 * eta**2
    same = _identity(bound, v.subs({A: a_def, b1: b1_def, b2: b2_def}))
    d2 = sympy.simplify(sympy.diff(v, eta, 2))
    cubic = sympy.expand(sympy.diff(v, eta) * eta**2)
    coeffs = sympy.Poly(cubic, eta).all_coeffs()
    beta_def = b2 * sqrt(A) / b1 ** Rational(3, 2)
    scaled = sympy.expand(sympy.simplify(-cubic.subs(eta, sqrt(A / b1) / w) * w**3 / A))
    w_cubic = w**3 - w - 2 * beta
    scaled_ok = _identity(scaled, w_cubic.subs(beta, beta_def))
    w_trig = 2 / sqrt(3) * sympy.cos(phi)
    trig_ok = _identity(sympy.expand_trig(w_trig**3 - w_trig - 2 * sympy.cos(3 * phi) / (3 * sqrt(3))), 0)
    w_hyp = 2 / sqrt(3) * sympy.cosh(phi)
    hyp_ok = _identity(sympy.expand_trig(w_hyp**3 - w_hyp - 2 * sympy.cosh(3 * phi) / (3 * sqrt(3))), 0)
    w_root = 2 / sqrt(3) * sympy.cos(sympy.acos(3 * sqrt(3) * beta) / 3)
    w_series = sympy.series(w_root, beta, 0, 4).removeO()
    value_w = sympy.simplify(v.subs(eta, sqrt(A / b1) / w).subs(b2, beta * b1 ** Rational(3, 2) / sqrt(A)))
    value_w_form = sqrt(A * b1) * (w + 1 / w + beta / w**2)
    value_ok = _identity(value_w, value_w_form)
    limit_value = sympy.simplify(value_w_form.subs({w: 1, beta: 0}).subs({A: a_def, b1: b1_def}))
    beta_of_c = sympy.simplify(beta_def.subs({A: a_def, b1: b1_def, b2: b2_def}))
    beta_limit = sympy.limit(beta_of_c, C, sympy.oo)
    eta_max = sympy.Symbol("eta_max", positive=True)
    capped = v.subs({eta: eta_max, A: a_def})
    step_limit = sympy.simplify(sympy.limit(C * capped, C, 0))
    large_limit = sympy.simplify(limit_value * sqrt(C))
    steps = (
        Step("Thm 3.4 at compute C: T = C/c updates of cost c (rollout-cost c = mu R + B), x = N/R, "
             "s = sigmabar^2(x), S = 1/B + 1/N + rho/R", Eq(V, bound)),
        Step("Write it as A/eta + b1 eta + b2 eta^2 with A = 12 F0 c/C, b1 = 8 L s S, b2 = 32 kappa^2 x^2 s S",
             Eq(V, v)),
        Step("Check: the two forms agree (difference simplifies to 0)", same),
        Step(f"V'' > 0 on eta > 0 (sympy is_positive = {d2.is_positive}): convex, one minimiser; on "
             "0 < eta <= eta_max = min(1/(2L), 1/(2 sqrt2 kappa x)) it is min(eta_root, eta_max)",
             Eq(sympy.Derivative(V, (eta, 2)), d2)),
        Step("eta^2 V'(eta) = 0 is a cubic (App. C.3.1's 'third degree polynomial'); coefficients "
             "[2 b2, b1, 0, -A]: one sign change, so exactly one positive root (Descartes)",
             Eq(cubic, 0)),
        Step("Substitute eta = sqrt(A/b1)/w and multiply by -w^3/A: the depressed cubic w^3 - w - 2 beta = 0 "
             "with beta = b2 sqrt(A)/b1^(3/2)", Eq(w_cubic, 0)),
        Step("Check: -w^3/A times the cubic at eta = sqrt(A/b1)/w minus that form (difference simplifies to 0)",
             scaled_ok),
        Step("Triple-angle identity: w = (2/sqrt3) cos(phi) solves it when cos(3 phi) = 3 sqrt3 beta "
             "(3 sqrt3 beta <= 1, three real roots, this is the largest and the only positive one)", trig_ok),
        Step("Hyperbolic twin: w = (2/sqrt3) cosh(phi), cosh(3 phi) = 3 sqrt3 beta (3 sqrt3 beta > 1, one real "
             "root)", hyp_ok),
        Step("Closed form and its series at beta -> 0 (no cancellation: w -> 1, eta* -> sqrt(A/b1))",
             Eq(sympy.Symbol("w"), w_root)),
        Step("Series of w in beta", Eq(sympy.Symbol("w"), w_series)),
        Step("Value at eta = sqrt(A/b1)/w, with b2 written through beta", Eq(sympy.Function("V")(
            sympy.Symbol("eta_*")), value_w_form)),
        Step("Check: that form equals V at eta = sqrt(A/b1)/w (difference simplifies to 0)", value_ok),
        Step(f"beta as a function of C; its limit as C -> oo is {beta_limit}: the large-budget limit is the "
             "kappa-free App. C.3.1 problem", Eq(sympy.Symbol("beta"), beta_of_c)),
        Step("Noise-limited limit (beta -> 0, w -> 1): sqrt(C) V(eta*) -> 8 sqrt6 sqrt(F0 L c s S), so the "
             "argmin over designs tends to the argmin of J = c s S (Thm 3.5; docs/ERRATA.md E7 for 8 vs 4)",
             Eq(sympy.Symbol("sqrt(C) V_inf"), large_limit)),
        Step("Step-limited limit: when the cap binds (small C, eta* = eta_max), C V(eta_max) -> 12 F0 c/eta_max "
             "as C -> 0: the argmin minimises c / eta_max(x), i.e. the cheapest updates",
             Eq(sympy.Symbol("C V(eta_max)"), step_limit)),
    )
    return (steps, Eq(sympy.Symbol("eta_*"), sqrt(A / b1) / sympy.Symbol("w")),
            {"eta": eta, "A": A, "b1": b1, "b2": b2, "F0": F0, "c": c, "C": C, "L": L, "s": s, "S": S,
             "x": x, "kappa": kappa, "w": w, "beta": beta, "phi": phi, "eta_max": eta_max},
            {"bound": bound, "V": v, "A": a_def, "b1": b1_def, "b2": b2_def, "cubic": cubic,
             "coefficients": sympy.Tuple(*coeffs), "beta": beta_def, "w_cubic": w_cubic, "w_root": w_root,
             "w_series": w_series, "value_w": value_w_form, "large_budget_limit": large_limit,
             "step_limit": step_limit, "beta_limit": beta_limit, "identity_bound": same,
             "identity_scaled": scaled_ok, "identity_trig": trig_ok, "identity_hyp": hyp_ok,
             "identity_value": value_ok, "second_derivative": d2})


# --------------------------------------------------------------------------- 11. compute-to-target


@_derivation("compute-to-target", "Least compute for the eta-optimised Thm 3.4 bound to reach a target epsilon",
             f"{ER_PAPER}, Thm 3.4 (dual of the finite-budget problem)")
def _build_compute_to_target() -> _Body:
    eta, b1, b2, eps, F0, c, L, s, S = _positive("eta", "b_1", "b_2", "epsilon", "F_0", "c", "L", "s", "S")
    p = eta * (eps - b1 * eta - b2 * eta**2)
    d2 = sympy.simplify(sympy.diff(p, eta, 2))
    roots = sympy.solve(sympy.diff(p, eta), eta)
    stable = eps / (b1 + sqrt(b1**2 + 3 * b2 * eps))
    root, others = _root_equal_to(roots, stable, "stable root")
    compute = c * 12 * F0 / p.subs(eta, stable)
    small_b2 = sympy.limit(compute, b2, 0)
    small_b2_in_j = sympy.simplify(small_b2.subs(b1, 8 * L * s * S))
    steps = (
        Step("Bound <= epsilon after T updates at step eta iff T >= 12 F0 / p(eta), with p = eta (epsilon - b1 eta "
             "- b2 eta^2) (finite-budget: A = 12 F0/T)", Eq(sympy.Function("p")(eta), p)),
        Step(f"p'' < 0 for eta > 0 (sympy is_negative = {d2.is_negative}): concave, one maximiser",
             Eq(sympy.Derivative(sympy.Function("p")(eta), (eta, 2)), d2)),
        Step("Solve p' = 0 (sympy.solve); the positive root, rationalised (no cancellation as b2 -> 0); capped "
             "at eta_max when it exceeds the cap", Eq(sympy.Symbol("eta_o"), stable)),
        Step("Check: sympy's positive root minus the rationalised form (difference simplifies to 0)",
             _identity(root, stable)),
        Step("Least compute C = c T = 12 F0 c / p(eta_o)", Eq(sympy.Symbol("C_epsilon"), compute)),
        Step("kappa = 0 (b2 -> 0): C = 48 F0 b1 c/epsilon^2 = 384 F0 L c s S/epsilon^2, proportional to J = c s S",
             Eq(sympy.Symbol("C_epsilon"), small_b2_in_j)),
    )
    return (steps, Eq(sympy.Symbol("C_epsilon"), compute),
            {"eta": eta, "b1": b1, "b2": b2, "epsilon": eps, "F0": F0, "c": c, "L": L, "s": s, "S": S},
            {"p": p, "root": root, "other_roots": sympy.Tuple(*others), "stable": stable, "compute": compute,
             "kappa_zero": small_b2_in_j, "second_derivative": d2})


# --------------------------------------------------------------------------- 12. fifo-long-run-variance


@_derivation("fifo-long-run-variance", "Long-run variance of the batch-mean noise of a FIFO sampled with replacement",
             f"{ER_PAPER}, Sec. 3 (FIFO of N, R new per step, B drawn uniformly with replacement)")
def _build_fifo_long_run_variance() -> _Body:
    B, R, N, sigma = _positive("B", "R", "N", "sigma")
    x, k, W, m = (sympy.Symbol(name, integer=True, positive=True) for name in ("x", "k", "W", "m"))
    j = sympy.Symbol("j", integer=True, positive=True)
    C = sympy.Function("C")
    e_t, z_draw = sympy.Symbol("e_t"), sympy.Function("z")(sympy.Symbol("I_tj"))
    lrv = sympy.Symbol("sum_k C(k)")
    # C(0): B^2 ordered pairs of draws; the B diagonal ones give sigma^2, each of the B(B - 1) others picks the same
    # item with probability 1/N (independent uniform draws with replacement)
    c0_pairs = sigma**2 * (B + B * (B - 1) / N) / B**2
    c0 = sigma**2 * (1 / B + 1 / N - 1 / (B * N))
    # C(k >= 1): draws k steps apart are independent; they pick the same item only among the N - kR shared ones
    ck = sigma**2 * sympy.Sum(1 / N**2, (m, 1, N - k * R)).doit()  # every one of the B^2 pairs alike
    shared_x = sympy.factor((N - k * R).subs(N, x * R))
    lag_sum = cast(sympy.Expr, sympy.summation(ck.subs(N, x * R), (k, 1, x - 1)))  # typed as any relation or NaN
    long_run_x = sympy.simplify(c0.subs(N, x * R) + 2 * lag_sum)
    closed = sigma**2 * (1 / B + 1 / R - 1 / (B * N))
    window = (W * c0.subs(N, x * R) + 2 * sympy.summation((W - k) * ck.subs(N, x * R), (k, 1, x - 1))) / W
    window_limit = sympy.simplify(sympy.limit(window, W, sympy.oo))
    on_policy = sympy.summation(sigma**2 / B**2, (m, 1, B))  # B distinct i.i.d. items, no repeats, no overlap
    with_replacement = sympy.simplify(closed.subs({N: B, R: B}))  # x = 1, y = 1: N = R = B
    steps = (
        Step("Model (experience-replay Sec. 3): each step R fresh items join a FIFO of N = x R (x a positive "
             "integer), B indices drawn uniformly with replacement; item noises i.i.d., mean 0, variance sigma^2, "
             "fixed at draw; e_t is the batch-mean noise", Eq(e_t, sympy.Sum(z_draw, (j, 1, B)) / B)),
        Step("C(0) = E e_t^2: the B diagonal pairs give sigma^2, each of the B (B - 1) others picks the same item "
             "with probability 1/N", Eq(C(0), c0_pairs)),
        Step("C(0) minus sigma^2 (1/B + 1/N - 1/(BN)) simplifies to 0", _identity(c0_pairs, c0)),
        Step("C(k), k >= 1: the buffers k steps apart share N - kR items and two independent draws pick the same "
             "one with probability (N - kR)/N^2 (sum over the shared items of 1/N^2, sympy Sum.doit)",
             Eq(C(k), ck)),
        Step("With N = x R the shared count factors as R (x - k): C(k) = sigma^2 (N - kR)_+/N^2 vanishes for "
             "k >= x (argued from the factor)", Eq((N - k * R).subs(N, x * R), shared_x)),
        Step("Sum over all lags, C(0) + 2 sum_{k=1}^{x-1} C(k) (sympy.summation over k)", Eq(lrv, long_run_x)),
        Step("It minus sigma^2 (1/B + 1/R - 1/(BN)) simplifies to 0 at N = x R: replay cannot push the noise "
             "below the sigma^2/R that the R fresh items per step carry", _identity(long_run_x, closed.subs(N, x * R))),
        Step("The variance of the mean of W consecutive e_t, times W, tends to it as W -> oo (sympy.limit): the "
             "noise a slowly moving theta integrates", Eq(sympy.Limit(sympy.Symbol("W Var(mean_W e)"), W, sympy.oo),
                                                           window_limit)),
        Step("That limit minus sigma^2 (1/B + 1/R - 1/(BN)) simplifies to 0",
             _identity(window_limit, closed.subs(N, x * R))),
        Step("On-policy without replacement (N = R = B, every item once, no overlap between steps): the mean of B "
             "distinct i.i.d. items (sympy.summation)", Eq(sympy.Symbol("V_on sigma^2"), on_policy)),
        Step("On-policy drawn with replacement (x = 1, y = 1: N = R = B) minus sigma^2 (2/B - 1/B^2) simplifies to "
             "0: almost twice the on-policy noise", _identity(with_replacement, sigma**2 * (2 / B - 1 / B**2))),
    )
    return (steps, Eq(lrv, closed),
            {"B": B, "R": R, "N": N, "sigma": sigma, "x": x, "k": k, "W": W},
            {"C0": c0, "Ck": ck, "long_run": closed, "long_run_x": long_run_x, "window_limit": window_limit,
             "on_policy": on_policy, "on_policy_with_replacement": with_replacement})


# --------------------------------------------------------------------------- 13. noise-scale-rule


MU_QWEN = Rational(132, 25)  # mu = 5.28, Table 1 (Qwen2.5-7B), rollout cost / per-sample update cost


def _minimise_cost_in_y(cost_by: sympy.Expr, y: sympy.Symbol, y_star: sympy.Expr, min_cost: sympy.Expr,
                        y_star_text: str, min_cost_text: str) -> tuple[sympy.Expr, sympy.Expr, tuple[Step, ...]]:
    """Minimise the cost per S_min B at fixed B over y > 0 and check the stated minimiser and minimum.

    Returns d cost/dy, the second derivative and the five steps (differentiate, solve, compare with ``y_star``,
    convexity, compare ``cost(y*)`` with ``min_cost``); ``*_text`` are those two closed forms as the steps print them.
    """
    cost_fn, y_star_sym = sympy.Function("cost")(y), sympy.Symbol("y_*")
    d_cost = sympy.diff(cost_by, y)
    (y_solved,) = sympy.solve(Eq(d_cost, 0), y)  # y is a positive symbol: the positive root only
    d2 = sympy.simplify(sympy.diff(cost_by, y, 2))
    steps = (
        Step("Differentiate cost(y) = C/(S_min B) in y (sympy.diff)", Eq(sympy.Derivative(cost_fn, y), d_cost)),
        Step("Solve d cost/dy = 0 for y > 0 (sympy.solve, 1 positive solution)", Eq(y_star_sym, y_solved)),
        Step(f"It minus {y_star_text} simplifies to 0", _identity(y_solved, y_star)),
        Step(f"Second derivative (sympy.diff twice); is_positive = {d2.is_positive} for y > 0: convex, the "
             "stationary point is the minimum", Eq(sympy.Derivative(cost_fn, (y, 2)), d2)),
        Step(f"cost(y*) minus {min_cost_text} simplifies to 0", _identity(cost_by.subs(y, y_star), min_cost)),
    )
    return d_cost, d2, steps


@_derivation("noise-scale-rule", "The noise-scale rule: optimal replay ratio, when replay pays, and the saving",
             "McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7; V from derive fifo-long-run-variance")
def _build_noise_scale_rule() -> _Body:
    s_min, b_noise, B, R, mu, b, y, V = _positive("S_min", "B_noise", "B", "R", "mu", "b", "y", "V")
    S, cost_sym, y_star_sym, b_c = sympy.Symbol("S"), sympy.Symbol("C"), sympy.Symbol("y_*"), sympy.Symbol("b_c")
    v_replay, v_on = 1 / B + 1 / R, 1 / B
    cost = s_min * (1 + b_noise * v_replay) * (mu * R + B)  # S steps of cost mu R + B
    cost_by = (1 + b * (1 + y)) * (1 + mu / y)  # in units of S_min B
    cost_on = (1 + b) * (1 + mu)
    y_star = sqrt(mu * (1 + 1 / b))
    min_cost = (sqrt(1 + b) + sqrt(mu * b)) ** 2
    d_cost, d2, minimise = _minimise_cost_in_y(cost_by, y, y_star, min_cost, "sqrt(mu (1 + 1/b))",
                                               "(sqrt(1 + b) + sqrt(mu b))^2")
    gap = sympy.simplify(cost_on - cost_by.subs(y, y_star))
    (b_solved,) = sympy.solve(Eq(4 * b * (1 + b), mu), b)
    threshold = (sqrt(1 + mu) - 1) / 2
    saving = cost_on / min_cost
    t = sympy.Symbol("t", positive=True)  # t = sqrt(1 + mu) - 1: mu = t (t + 2), b_c = t/2 (no nested roots)
    at_threshold = saving.subs({b: t / 2, mu: t * (t + 2)})
    noiseless = sympy.limit(saving, b, 0)
    table = {bb: (sympy.N(saving.subs({b: bb, mu: MU_QWEN}), 6), sympy.N(y_star.subs({b: bb, mu: MU_QWEN}), 4))
             for bb in (Rational(1, 10), Rational(1, 4), Rational(1, 2))}
    steps = (
        Step("Steps to a target (McCandlish et al. 2018, Eq. 2.7) with the batch variance 1/B replaced by the "
             "long-run variance V (per sigma^2) of the design's batch-mean noise", Eq(S, s_min * (1 + b_noise * V))),
        Step("V for FIFO with replacement (derive fifo-long-run-variance without its -1/(BN), below 1/B^2) and for "
             "on-policy without replacement", sympy.Tuple(Eq(sympy.Symbol("V_replay"), v_replay),
                                                          Eq(sympy.Symbol("V_on"), v_on))),
        Step("Compute to the target: S steps costing mu R + B each (mu = rollout cost / per-sample update cost, "
             "Table 1)", Eq(cost_sym, cost)),
        Step("At fixed B with B_noise = b B and R = B/y, C minus S_min B (1 + b (1 + y))(1 + mu/y) simplifies to 0",
             _identity(cost.subs({b_noise: b * B, R: B / y}), s_min * B * cost_by)),
        Step("On-policy (R = B, V = 1/B): S_min (1 + b)(mu B + B) minus S_min B (1 + b)(1 + mu) simplifies to 0",
             _identity(s_min * (1 + b * B * v_on) * (mu * B + B), s_min * B * cost_on)),
        *minimise,
        Step("On-policy cost minus the replay minimum (sympy.simplify)",
             Eq(sympy.Symbol("cost_on - cost(y*)"), gap)),
        Step("It minus sqrt(mu) (sqrt(mu) - 2 sqrt(b (1 + b))) simplifies to 0: replay beats on-policy iff "
             "sqrt(mu) > 2 sqrt(b (1 + b)), i.e. 4 b (1 + b) < mu (both sides positive, argued)",
             _identity(gap, sqrt(mu) * (sqrt(mu) - 2 * sqrt(b * (1 + b))))),
        Step("Threshold: solve 4 b (1 + b) = mu for b > 0 (sympy.solve, 1 positive solution): "
             "b_c = (sqrt(1 + mu) - 1)/2", Eq(b_c, b_solved)),
        Step("At mu = 5.28 = 132/25 (sympy.N)", sympy.Tuple(Eq(b_c, threshold.subs(mu, MU_QWEN)),
                                                            Eq(b_c, sympy.N(threshold.subs(mu, MU_QWEN), 6)))),
        Step("Best saving = on-policy cost / cost(y*); at the threshold, written with t = sqrt(1 + mu) - 1 "
             "(mu = t (t + 2), b_c = t/2), it minus 1 simplifies to 0", _identity(at_threshold, 1)),
        Step("As b -> 0 (noiseless gradients, every rollout reused without limit) it tends to 1 + mu (sympy.limit)",
             Eq(sympy.Limit(sympy.Symbol("saving"), b, 0), noiseless)),
        Step("At mu = 5.28 (sympy.N): (b, saving, y*) for b = 1/10, 1/4, 1/2",
             sympy.Tuple(*(sympy.Tuple(bb, sv, ys) for bb, (sv, ys) in table.items()))),
    )
    return (steps, Eq(y_star_sym, y_star),
            {"S_min": s_min, "B_noise": b_noise, "B": B, "R": R, "mu": mu, "b": b, "y": y, "V": V},
            {"cost": cost, "cost_replay": cost_by, "cost_on_policy": cost_on, "dcost_dy": d_cost,
             "y_star": y_star, "second_derivative": d2, "min_cost": min_cost, "gap": gap,
             "threshold": threshold, "saving": saving, "saving_noiseless": noiseless,
             "threshold_mu_5_28": threshold.subs(mu, MU_QWEN),
             "table_mu_5_28": sympy.Tuple(*(sympy.Tuple(bb, sv, ys) for bb, (sv, ys) in table.items()))})


# --------------------------------------------------------------------------- 14. assumption-3.2-counterexample


@_derivation("assumption-3.2-counterexample",
             "Assumption 3.2 fails for replayed samples: E[eps | F_1] = z_0 and kappa ~ 1/eta",
             f"{ER_PAPER}, Assumption 3.2, App. C.1, App. C.2.1 (Eq. 4), App. C.3.1")
def _build_assumption_32_counterexample() -> _Body:
    theta, theta_1, z, z0 = sympy.symbols("theta theta_1 z z_0", real=True)
    theta_0 = sympy.Symbol("theta_0", positive=True)  # theta -> -theta, z -> -z gives theta_0 < 0
    eta, sigma, kappa, H, L = _positive("eta", "sigma", "kappa", "H", "L")
    F = theta**2 / 2
    G = theta + z0
    update = theta_0 - eta * (theta_0 + z0)  # step 0: the buffer holds only z_0, g_0 = G(theta_0, z_0) for any B
    (z0_solved,) = sympy.solve(Eq(theta_1, update), z0)
    eps_12 = G.subs(theta, theta_1) - sympy.diff(F, theta).subs(theta, theta_1)  # noise of z_0 at theta_1
    drift = sympy.Abs(update - theta_0)
    kappa_req = sympy.Abs(z0) / (eta * sympy.Abs(theta_0 + z0))
    lim_right = sympy.limit(kappa_req, z0, -theta_0, "+")
    lim_left = sympy.limit(kappa_req, z0, -theta_0, "-")
    density = sympy.exp(-(z**2) / (2 * sigma**2)) / (sigma * sqrt(2 * sympy.pi))  # z_0 ~ N(0, sigma^2)
    mean_sq_noise = sympy.integrate(z**2 * density, (z, -sympy.oo, sympy.oo))
    mean_sq_step = sympy.simplify(sympy.integrate((theta_0 + z) ** 2 * density, (z, -sympy.oo, sympy.oo)))
    kappa_ms = sqrt(mean_sq_noise / (eta**2 * mean_sq_step))  # E|E[eps|F_1]|^2 <= kappa^2 E|theta_1 - theta_0|^2
    eta_kappa = sympy.simplify(eta * kappa_ms)
    ratio_limit = sympy.limit(4 * H**2 * kappa_ms**2 * eta / L, eta, 0)
    term = 8 * eta * 4 * H**2 * kappa_ms**2 * eta  # Thm 3.4: 8 eta (4 N^2 kappa^2 eta / R^2) per sigmabar^2 S
    term_limit = sympy.limit(term, eta, 0)
    eq4 = sympy.simplify(2 * H**2 * kappa_ms**2 * eta**2)  # Eq. (4): must be <= 1/4
    (theta_0_eq4,) = sympy.solve(Eq(eq4, Rational(1, 4)), theta_0)
    cond = sympy.Symbol("E[epsilon_{1,2} | F_1]")
    kr = sympy.Symbol("kappa_req")
    steps = (
        Step("F = theta^2/2 (L = 1), G(theta, z) = theta + z with z ~ N(0, sigma^2); Assumption 3.2 bounds "
             "||E[eps_{t,i} | F_t]|| <= kappa ||theta_t - theta_{t_i}||, eps_{t,i} = G(theta_t, z_{t,i}) - grad F, "
             "F_t = sigma(theta_s, s <= t)", sympy.Tuple(Eq(sympy.Function("F")(theta), F),
                                                         Eq(sympy.Function("G")(theta, z0), G))),
        Step("R = 1, N >= 2 (Sec. 3: add R, then draw B uniformly). Step 0: the buffer holds only z_0, so every "
             "draw is z_0 and g_0 = theta_0 + z_0 whatever B", Eq(theta_1, update)),
        Step("Solve for z_0 (sympy.solve): a function of (theta_0, theta_1), hence F_1-measurable",
             Eq(z0, z0_solved)),
        Step("Step 1: z_0 sits at buffer position i = 2, t_i = t + 1 - ceil(i/R) = 0; its noise at theta_1, "
             "G(theta_1, z_0) - F'(theta_1), is z_0 itself", Eq(sympy.Symbol("epsilon_{1,2}"), eps_12)),
        Step("So E[eps_{1,2} | F_1] = z_0 read off the trajectory: the recovered z_0 at theta_1 = theta_0 - "
             "eta (theta_0 + z_0) minus z_0 simplifies to 0", _identity(z0_solved.subs(theta_1, update), z0)),
        Step("The bound's right side at (t, i) = (1, 2): kappa |theta_1 - theta_0| with the step above",
             Eq(sympy.Symbol("kappa |theta_1 - theta_0|"), kappa * drift)),
        Step("Assumption 3.2 at (t, i) = (1, 2) needs |z_0| <= kappa eta |theta_0 + z_0|: the least kappa for this "
             "z_0", Eq(kr, kappa_req)),
        Step("It is unbounded as z_0 -> -theta_0 from either side (sympy.limit; theta_0 != 0)",
             sympy.Tuple(Eq(sympy.Limit(kr, z0, -theta_0, "+"), lim_right),
                         Eq(sympy.Limit(kr, z0, -theta_0, "-"), lim_left))),
        Step("z_0 has positive density at -theta_0, so P(kappa_req > K) > 0 for every K: no finite kappa holds "
             "almost surely (argued); theta_0 = 0 would give kappa_req = 1/eta exactly",
             Eq(sympy.Symbol("kappa_req(theta_0 = 0)"), sympy.Abs(z0) / (eta * sympy.Abs(z0)))),
        Step("Mean square, the form App. C.2.1 uses (it squares the bound and takes expectations): Gaussian "
             "integrals (sympy.integrate) of z_0^2 and (theta_0 + z_0)^2",
             sympy.Tuple(Eq(sympy.Symbol("E z_0^2"), mean_sq_noise),
                         Eq(sympy.Symbol("E (theta_0 + z_0)^2"), mean_sq_step))),
        Step("kappa^2 >= E z_0^2 / (eta^2 E (theta_0 + z_0)^2): eta kappa_ms does not depend on eta, kappa ~ 1/eta",
             sympy.Tuple(Eq(sympy.Symbol("kappa_ms"), kappa_ms), Eq(sympy.Symbol("eta kappa_ms"), eta_kappa))),
        Step("App. C.3.1 drops the kappa^2 eta term as 'negligible in front of L' when eta -> 0; with kappa_ms its "
             "ratio to L (H = N/R) tends to oo (sympy.limit): kappa^2 eta = O(1/eta), not o(1)",
             Eq(sympy.Limit(4 * H**2 * sympy.Symbol("kappa_ms") ** 2 * eta / L, eta, 0), ratio_limit)),
        Step("Its contribution 8 eta (4 H^2 kappa^2 eta) to the Thm 3.4 bound (per sigmabar^2 S) tends to a "
             "constant (sympy.limit): the bound no longer vanishes as eta -> 0",
             Eq(sympy.Limit(32 * H**2 * sympy.Symbol("kappa_ms") ** 2 * eta**2, eta, 0), term_limit)),
        Step("Eq. (4), 2 H^2 kappa^2 eta^2 <= 1/4, loses eta; equality at this theta_0 (sympy.solve), so when "
             "theta_0^2 < (8 H^2 - 1) sigma^2 no step size meets it", Eq(theta_0, theta_0_eq4)),
        Step("App. C.1 posits ||pi(.|F_t) - pi_theta_t|| <= kappa_0 ||pi_theta_{t_i} - pi_theta_t||; here the "
             "sampling law N(0, sigma^2) does not depend on theta, so the right side is 0, while pi(.|F_1) is the "
             "point mass at z_0: one use of a sample reveals it, however little theta moved (argued)",
             Eq(sympy.Function("pi")(z, sympy.Symbol("F_1")), sympy.DiracDelta(z - z0))),
    )
    return (steps, Eq(cond, z0),
            {"theta": theta, "theta_0": theta_0, "theta_1": theta_1, "z_0": z0, "z": z, "eta": eta,
             "sigma": sigma, "kappa": kappa, "H": H, "L": L},
            {"update": update, "z0_recovered": z0_solved, "eps": eps_12, "kappa_required": kappa_req,
             "limit_right": lim_right, "limit_left": lim_left, "mean_sq_noise": mean_sq_noise,
             "mean_sq_step": mean_sq_step, "kappa_ms": kappa_ms, "eta_kappa_ms": eta_kappa,
             "ratio_limit": ratio_limit, "term_limit": term_limit, "eq4": eq4, "theta_0_eq4": theta_0_eq4})


# --------------------------------------------------------------------------- 15. forgetting-variance


def _piecewise_branch(expr: sympy.Basic, index: int) -> sympy.Basic:
    """``expr`` with every Piecewise replaced by its branch number ``index`` (sympy's summation states the
    convergent or generic case as one branch and the special case as another)."""
    return expr.replace(lambda e: isinstance(e, sympy.Piecewise), lambda e: e.args[index].expr)


def _adam_lyapunov(kappa: sympy.Expr, beta: sympy.Expr) -> tuple[sympy.Matrix, sympy.Matrix, sympy.Matrix]:
    """(A, b, P) of Adam's linearised error response (theory/forgetting.py ``_linear_system``): state (e, eta m),
    eta m' = beta eta m + (1 - beta)(eta h e + eta n), e' = e - eta m', kappa = eta h; P = A P A^T + b b^T solved by
    sympy.solve (three unknowns of the symmetric P), per unit (eta n)^2."""
    k = kappa * (1 - beta)
    A = sympy.Matrix([[1 - k, -beta], [k, beta]])
    b = sympy.Matrix([-(1 - beta), 1 - beta])
    p00, p01, p11 = sympy.symbols("p00 p01 p11")
    P = sympy.Matrix([[p00, p01], [p01, p11]])
    residual = P - A * P * A.T - b * b.T
    (solution,) = sympy.solve([residual[0, 0], residual[0, 1], residual[1, 1]], [p00, p01, p11], dict=True)
    return A, b, P.subs(solution).applyfunc(sympy.factor)


def _adam_psi(x: int, kappa: sympy.Expr, beta: sympy.Expr) -> sympy.Expr:
    """psi(x) for Adam in exact arithmetic: 1/x + (2/x^2) sum_{k=1}^{x-1} (x - k) rho(k), rho(k) = c^T A^k P c /
    c^T P c (the impulse-response autocorrelation theory/forgetting.py ``impulse_autocorrelation`` computes)."""
    A, _, P = _adam_lyapunov(kappa, beta)
    pc = P[:, 0]  # P c with c = (1, 0)
    total, power = sympy.Integer(0), sympy.eye(2)
    for lag in range(1, x):
        power = power * A
        total += (x - lag) * (power * pc)[0]
    return sympy.nsimplify(1 / sympy.Integer(x) + 2 * total / (pc[0] * x**2))


KAPPAS_PSI16 = (sympy.Integer(1), Rational(1, 2), Rational(1, 10), Rational(1, 100))
BETA_ADAM = Rational(9, 10)


@_derivation("forgetting-variance",
             "The FIFO noise an optimizer keeps: V_eff, psi(x, kappa) and the lag-1 gradient autocorrelation",
             f"{ER_PAPER}, Sec. 3 (FIFO); C(k) from derive fifo-long-run-variance; the SGD, heavy-ball and "
             "Adam error recursions (theory/forgetting.py)")
def _build_forgetting_variance() -> _Body:
    fifo = _build_fifo_long_run_variance()
    B, R, N, sigma, x, k = (fifo.symbols[n] for n in ("B", "R", "N", "sigma", "x", "k"))
    a = sympy.Symbol("a", real=True)  # 1 - eta h: |a| < 1 for a stable step, negative when eta h > 1
    eta, h, y, s, beta, kappa, tau = _positive("eta", "h", "y", "s", "beta1", "kappa", "tau")
    l = sympy.Symbol("l", integer=True, nonnegative=True)
    e_t, e_next, n_t = sympy.symbols("e_t e_{t+1} n_t")
    C = sympy.Function("C")
    var_e, v_eff_sym, psi_sym, phi_sym = sympy.symbols("Var(e) V_eff psi phi")
    # Var e = eta^2 sum_{j,l >= 0} a^(j + l) C(j - l): the pairs with j - l = k >= 0 carry sum_l a^(2 l + k)
    pair_sum = sympy.summation(a ** (2 * l + k), (l, 0, sympy.oo))
    pair_closed = _piecewise_branch(pair_sum, 0)  # the branch a^2 < 1 (a stable step)
    c0 = fifo.expr("C0").subs(N, x * R)
    ck = fifo.expr("Ck").subs(N, x * R)
    lag_sum = sympy.simplify(sympy.summation((x - k) * a**k, (k, 1, x - 1)))
    lag_generic, lag_at_1 = _piecewise_branch(lag_sum, 1), _piecewise_branch(lag_sum, 0)
    lag_closed = a * (x * (1 - a) - 1 + a**x) / (1 - a) ** 2
    cov_sum = _piecewise_branch(sympy.summation(a**k * ck, (k, 1, x - 1)), 1)  # C(k) = 0 from k = x on
    cov_closed = sigma**2 * lag_closed / (x**2 * R)
    v_eff = c0 + 2 * cov_closed
    phi = 2 * lag_closed / x**2
    psi = 1 / x + phi
    r_v = (R * v_eff / sigma**2).subs(B, y * R)
    b_v = (B * v_eff / sigma**2).subs(B, y * R)
    paper_form = 1 / B + 1 / (x * R) + phi / R - 1 / (B * x * R)  # Thm 3.5's 1/B + 1/N + rho/R with rho -> phi
    var_closed = eta**2 * v_eff / (1 - a**2)
    lim_a1, lim_a0 = sympy.limit(psi, a, 1), sympy.limit(psi, a, 0)
    # a = e^(-s) in (0, 1); sympy returns 1/tanh(s/2), written back in exponentials
    lim_x = sympy.limit(x * psi.subs(a, sympy.exp(-s)), x, sympy.oo).rewrite(sympy.exp)
    tau_sgd = (1 + a) / (1 - a)
    psi_kappa = psi.subs(a, 1 - kappa)
    slope = sympy.simplify(sympy.series(psi_kappa, kappa, 0, 2).removeO().coeff(kappa, 1))
    x5 = 5
    double_sum = sum(a ** abs(i - j) for i in range(x5) for j in range(x5)) / sympy.Integer(x5) ** 2
    # the lag-1 gradient autocorrelation, fresh noise each step (on-policy): g = h e + n, Var n = s^2
    p_on = eta**2 * s**2 / (1 - a**2)  # Var e with C(k >= 1) = 0
    corr_sgd_def = (h**2 * a * p_on - eta * h * s**2) / (h**2 * p_on + s**2)
    corr_sgd = sympy.simplify(corr_sgd_def.subs({a: 1 - kappa, eta: kappa / h}))
    # Adam (heavy ball has the same A and b / (1 - beta)): the same quantities from the Lyapunov equation
    A, bvec, P = _adam_lyapunov(kappa, beta)
    corr_adam = sympy.factor(sympy.simplify((kappa**2 * (A * P)[0, 0] + kappa * bvec[0]) / (kappa**2 * P[0, 0] + 1)))
    corr_adam_printed = (kappa * ((2 * beta - 1) * (1 + beta) - beta * (1 - beta) * kappa)
                         / (2 * (1 + beta + beta * kappa)))
    corr_slope = sympy.cancel(sympy.limit(corr_adam / kappa, kappa, 0))
    A_hb, b_hb = A, bvec / (1 - beta)  # heavy ball: eta v' = beta eta v + eta g, e' = e - eta v'; k = eta h
    P_hb = P / (1 - beta) ** 2  # b scaled by 1/(1 - beta): P scales by its square (the equation is linear in b b^T)
    k_hb = kappa * (1 - beta)
    corr_hb = (k_hb**2 * (A_hb * P_hb)[0, 0] + k_hb * b_hb[0]) / (k_hb**2 * P_hb[0, 0] + 1)
    corr_hb_simple = sympy.factor(sympy.simplify(corr_hb))
    tau_adam = sympy.factor(sympy.simplify(1 + 2 * (A * (sympy.eye(2) - A).inv() * P)[0, 0] / P[0, 0]))
    det_a = sympy.factor(A.det())
    psi16_sgd = sympy.Tuple(*(sympy.Tuple(kv, sympy.N(psi.subs({x: 16, a: 1 - kv}), 4)) for kv in KAPPAS_PSI16))
    psi16_adam = sympy.Tuple(*(sympy.Tuple(kv, sympy.N(_adam_psi(16, kv, BETA_ADAM), 4)) for kv in KAPPAS_PSI16))
    steps = (
        Step("SGD along an eigendirection of H (curvature h, step eta): the error e = theta - theta* moves as "
             "e_{t+1} = a e_t - eta n_t with a = 1 - eta h; n_t is the step's batch-mean noise, stationary with "
             "autocovariance C(k) (derive fifo-long-run-variance)", Eq(e_next, a * e_t - eta * n_t)),
        Step("(argued) Unrolled, e_t = -eta sum_{j >= 0} a^j n_{t-1-j}, so at stationarity Var e = eta^2 "
             "sum_{j, l >= 0} a^(j + l) C(j - l); group the pairs by their lag k = |j - l|",
             Eq(var_e, eta**2 * sympy.Sum(sympy.Sum(a ** (sympy.Symbol("j") + l) * C(sympy.Symbol("j") - l),
                                                     (sympy.Symbol("j"), 0, sympy.oo)), (l, 0, sympy.oo)))),
        Step("The pairs with j - l = k >= 0 weigh C(k) by sum_l a^(2l + k) (sympy.summation; the branch a^2 < 1 "
             "is a stable step)", Eq(sympy.Sum(a ** (2 * l + k), (l, 0, sympy.oo)), pair_sum)),
        Step("(argued) The pairs with l - j = k give the same (C(-k) = C(k)), so Var e = eta^2 V_eff / (1 - a^2) "
             "with V_eff = C(0) + 2 sum_{k >= 1} a^k C(k); a = 1 (no forgetting) leaves the plain sum over lags "
             "of derive fifo-long-run-variance", Eq(var_e, eta**2 * v_eff_sym / (1 - a**2))),
        Step("C(0) and C(k) of the FIFO at N = x R (derive fifo-long-run-variance), C(k) = 0 from k = x on",
             sympy.Tuple(Eq(C(0), c0), Eq(C(k), ck))),
        Step("The lag sum sum_{k=1}^{x-1} (x - k) a^k (sympy.summation, simplified): a = 1 gives x (x - 1)/2",
             Eq(sympy.Sum((x - k) * a**k, (k, 1, x - 1)), lag_sum)),
        Step("Its a != 1 branch minus a [x (1 - a) - 1 + a^x] / (1 - a)^2 simplifies to 0",
             _identity(lag_generic, lag_closed)),
        Step("sum_{k=1}^{x-1} a^k C(k) (sympy.summation, a != 1 branch) minus sigma^2/(x^2 R) times the lag sum "
             "simplifies to 0", _identity(cov_sum, cov_closed)),
        Step("Hence V_eff = C(0) + 2 sum_{k=1}^{x-1} a^k C(k)", Eq(v_eff_sym, v_eff)),
        Step("With B = y R: R V_eff / sigma^2 minus (1/y + 1/x - 1/(x y R) + phi), phi = 2 a [x (1 - a) - 1 + "
             "a^x] / (x^2 (1 - a)^2), simplifies to 0",
             _identity(r_v, 1 / y + 1 / x - 1 / (x * y * R) + phi)),
        Step("B V_eff / sigma^2 minus (1 + y psi - 1/N), psi = 1/x + phi, simplifies to 0",
             _identity(b_v, 1 + y * psi - 1 / (x * R))),
        Step("In the paper's form V_eff / sigma^2 minus (1/B + 1/N + phi/R - 1/(BN)) simplifies to 0: Thm 3.5's "
             "1/B + 1/N + rho/R with its constant rho replaced by phi(x, a), which depends on x",
             _identity((v_eff / sigma**2).subs(N, x * R), paper_form)),
        Step("Stationary variance along the direction: eta^2 V_eff / (1 - a^2)", Eq(var_e, var_closed)),
        Step("psi = 1/x + phi", Eq(psi_sym, psi)),
        Step("a -> 1 (the optimizer remembers the whole horizon) and a -> 0 (it forgets within a step), "
             "sympy.limit: psi -> 1 is today's B V = 1 + y; psi -> 1/x", sympy.Tuple(
                 Eq(sympy.Limit(psi_sym, a, 1), lim_a1), Eq(sympy.Limit(psi_sym, a, 0), lim_a0))),
        Step("x -> oo at fixed a = e^(-s) in (0, 1) (sympy.limit of x psi)",
             Eq(sympy.Limit(x * psi_sym, x, sympy.oo), lim_x)),
        Step("It minus (1 + a)/(1 - a) simplifies to 0 (a = e^(-s)): psi ~ (1 + a)/((1 - a) x) = (2 - kappa)/"
             "(kappa x) with kappa = eta h, about 2/(kappa x) when kappa is small",
             _identity(lim_x, tau_sgd.subs(a, sympy.exp(-s)))),
        Step("Short horizon: the kappa coefficient of psi(x, 1 - kappa) (sympy.series) minus -(x^2 - 1)/(3 x) "
             "simplifies to 0: psi = 1 - kappa (x^2 - 1)/(3 x) + O(kappa^2)",
             _identity(slope, -(x**2 - 1) / (3 * x))),
        Step("At x = 5, psi minus x^-2 sum_{j,l<x} a^|j - l| simplifies to 0: psi is the variance of the mean of x "
             "consecutive values of a unit AR(1), so psi is in [0, 1] for |a| < 1 and in [1/x, 1] for a >= 0 "
             "(argued from that form)", _identity(psi.subs(x, x5), double_sum)),
        Step("(argued) Fresh noise each step (on-policy, Var n = s^2): g = h e + n, Var e = eta^2 s^2/(1 - a^2), "
             "Cov(g_{t+1}, g_t) = h^2 a Var e - eta h s^2 (e_{t+1} = a e_t - eta n_t; n_{t+1} is new)",
             Eq(sympy.Symbol("corr(g_{t+1}, g_t)"), corr_sgd_def)),
        Step("At a = 1 - kappa, eta = kappa/h (sympy.simplify): the lag-1 gradient autocorrelation of SGD",
             Eq(sympy.Symbol("corr_SGD"), corr_sgd)),
        Step("Adam, linearised (state (e, eta m), v frozen, kappa = eta h): A, b and the stationary P = A P A^T + "
             "b b^T (sympy.solve), per unit (eta n)^2",
             sympy.Tuple(*(Eq(sympy.MatrixSymbol(name, *m.shape), sympy.ImmutableMatrix(m), evaluate=False)
                           for name, m in (("A", A), ("b", bvec), ("P", P))))),
        Step("Its lag-1 gradient autocorrelation (kappa^2 (A P)_00 + kappa b_0)/(kappa^2 P_00 + 1) (sympy.factor)",
             Eq(sympy.Symbol("corr_Adam"), corr_adam)),
        Step("It minus kappa [(2 beta1 - 1)(1 + beta1) - beta1 (1 - beta1) kappa] / (2 (1 + beta1 + beta1 kappa)) "
             "simplifies to 0; beta1 = 0 gives SGD's -kappa/2", _identity(corr_adam, corr_adam_printed)),
        Step("Heavy ball (torch SGD momentum, b / (1 - beta1), kappa = eta h / (1 - beta1)): its autocorrelation "
             "(sympy.factor)", Eq(sympy.Symbol("corr_HB"), corr_hb_simple)),
        Step("It minus Adam's simplifies to 0: the same function of kappa", _identity(corr_hb_simple, corr_adam)),
        Step("Small kappa (sympy.limit of corr / kappa): beta1 - 1/2, POSITIVE for beta1 > 1/2 (0.4 at 0.9), "
             "where SGD's is -1/2", Eq(sympy.Limit(sympy.Symbol("corr_Adam") / kappa, kappa, 0), corr_slope)),
        Step("Adam's integrated autocorrelation lim x psi = 1 + 2 c^T A (I - A)^-1 P c / c^T P c (sympy)",
             Eq(tau, tau_adam)),
        Step("It minus (2/kappa - (1 - beta1)/(1 + beta1)) simplifies to 0: at long horizons Adam keeps what SGD "
             "keeps, 2/kappa - 1 at beta1 = 0",
             _identity(tau_adam, 2 / kappa - (1 - beta) / (1 + beta))),
        Step("det A = beta1 (sympy), the product of A's eigenvalues: the slower one has |lambda| >= sqrt(beta1), "
             "so a kick's squared response falls by at most beta1 a step, over ~1/(1 - beta1) steps: the memory "
             "floor that keeps psi near 1 at short horizons whatever kappa (argued from the product)",
             Eq(sympy.Symbol("det A"), det_a)),
        Step("psi(16) for SGD at kappa = 1, 1/2, 1/10, 1/100 (exact, sympy.N)",
             Eq(sympy.Symbol("(kappa, psi_SGD(16))"), psi16_sgd)),
        Step("psi(16) for Adam at beta1 = 9/10, same kappa (exact rho(k) = c^T A^k P c / c^T P c, sympy.N)",
             Eq(sympy.Symbol("(kappa, psi_Adam(16))"), psi16_adam)),
    )
    return (steps, Eq(psi_sym, psi),
            {"B": B, "R": R, "N": N, "sigma": sigma, "x": x, "k": k, "a": a, "eta": eta, "h": h, "y": y,
             "s": s, "beta1": beta, "kappa": kappa},
            {"pair_sum": pair_closed, "C0": c0, "Ck": ck, "lag_sum": lag_closed, "lag_sum_at_1": lag_at_1,
             "v_eff": v_eff, "R_v_eff": sympy.expand(r_v), "B_v_eff": sympy.expand(b_v),  # expanded: no sigma
             "phi": phi, "psi": psi, "variance": var_closed,
             "limit_a_1": lim_a1, "limit_a_0": lim_a0, "x_psi_limit": lim_x, "tau_sgd": tau_sgd,
             "small_kappa_slope": slope, "corr_sgd": corr_sgd, "corr_adam": corr_adam,
             "corr_adam_slope": corr_slope, "tau_adam": tau_adam, "det_A": det_a, "P_adam": P,
             "psi16_sgd": psi16_sgd, "psi16_adam": psi16_adam})


# --------------------------------------------------------------------------- 16. forgetting-rule


@_derivation("forgetting-rule",
             "The forgetting-aware rule at fixed B: optimal replay ratio, cost, when replay pays, the horizon",
             "McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7; V_eff from derive forgetting-variance")
def _build_forgetting_rule() -> _Body:
    s_min, b_noise, B, R, mu, b, y, psi = _positive("S_min", "B_noise", "B", "R", "mu", "b", "y", "psi")
    S, cost_sym, y_star_sym, psi_c = sympy.Symbol("S"), sympy.Symbol("C"), sympy.Symbol("y_*"), sympy.Symbol("psi_c")
    cost = s_min * (1 + b_noise * (1 + y * psi) / B) * (mu * R + B)  # S steps of mu R + B, B V_eff = 1 + y psi
    cost_by = (1 + b + b * y * psi) * (1 + mu / y)
    cost_on = (1 + b) * (1 + mu)
    y_star = sqrt(mu * (1 + b) / (b * psi))
    min_cost = (sqrt(1 + b) + sqrt(mu * b * psi)) ** 2
    d_cost, d2, minimise = _minimise_cost_in_y(cost_by, y, y_star, min_cost, "sqrt(mu (1 + b) / (b psi))",
                                               "(sqrt(1 + b) + sqrt(mu b psi))^2")
    gap = sympy.expand(cost_on - min_cost)
    gap_factored = sqrt(mu) * (sqrt(mu) * (1 + b - b * psi) - 2 * sqrt(b * psi * (1 + b)))
    condition_lhs, condition_rhs = 4 * b * psi * (1 + b), mu * (1 + b - b * psi) ** 2
    roots = sympy.solve(Eq(condition_lhs, condition_rhs), psi)
    psi_threshold = (1 + 1 / b) * mu / (1 + sqrt(1 + mu)) ** 2
    threshold_root, other_roots = _root_equal_to(roots, psi_threshold, "psi threshold")
    big_b = sympy.limit(psi_threshold, b, sympy.oo)
    noise_rule = _build_noise_scale_rule()
    table = sympy.Tuple(*(sympy.Tuple(bb, sympy.N(psi_threshold.subs({b: bb, mu: MU_QWEN}), 4))
                          for bb in (Rational(1, 10), Rational(1, 4), Rational(1, 2), 1, 4, 37)))
    # the horizon: staleness r(s) = 1 + c s by age, psi ~ tau / x at long horizons
    c, x, tau = _positive("c", "x", "tau")
    age, x_int = sympy.Symbol("s", integer=True, nonnegative=True), sympy.Symbol("x", integer=True, positive=True)
    m_fn, x_star_sym = sympy.Function("m")(x), sympy.Symbol("x_*")
    m_x = sympy.simplify(sympy.summation(1 + c * age, (age, 0, x_int - 1)) / x_int).subs(x_int, x)
    noise_x = (1 + y * tau / x) * m_x
    x_roots = sympy.solve(Eq(sympy.diff(noise_x, x), 0), x)
    x_star = sqrt(tau * y * (2 - c) / c)
    x_root, _ = _root_equal_to(x_roots, x_star, "horizon")
    d2_x = sympy.simplify(sympy.diff(noise_x, x, 2).subs(x, x_star))
    x_flat = sympy.limit(x_star, c, 0, "+")
    steps = (
        Step("Steps to a target (McCandlish et al. 2018, Eq. 2.7) with the noise the optimizer keeps, "
             "B V_eff = 1 + y psi(x, kappa) - 1/N (derive forgetting-variance), the -1/N dropped",
             Eq(S, s_min * (1 + b_noise * (1 + y * psi) / B))),
        Step("Compute: S steps costing mu R + B each", Eq(cost_sym, cost)),
        Step("At fixed B with B_noise = b B, R = B/y: C minus S_min B (1 + b + b y psi)(1 + mu/y) simplifies to 0",
             _identity(cost.subs({b_noise: b * B, R: B / y}), s_min * B * cost_by)),
        *minimise,
        Step("On-policy (R = B, V = 1/B) costs (1 + b)(1 + mu); it minus cost(y*) (sympy.expand)",
             Eq(sympy.Symbol("cost_on - cost(y*)"), gap)),
        Step("It minus sqrt(mu) (sqrt(mu) (1 + b - b psi) - 2 sqrt(b psi (1 + b))) simplifies to 0: replay beats "
             "on-policy iff b psi < 1 + b and 4 b psi (1 + b) < mu (1 + b - b psi)^2 (squaring two positive "
             "sides, argued)", _identity(gap, gap_factored)),
        Step(f"The boundary 4 b psi (1 + b) = mu (1 + b - b psi)^2 in psi (sympy.solve, {len(roots)} roots); the "
             "second, shown last, is above (1 + b)/b, where b psi < 1 + b fails",
             sympy.Tuple(Eq(psi_c, threshold_root), *other_roots)),
        Step("The first minus (1 + 1/b) mu / (1 + sqrt(1 + mu))^2 simplifies to 0",
             _identity(threshold_root, psi_threshold)),
        Step("So replay pays at fixed B iff psi < psi_c = (1 + 1/b) mu/(1 + sqrt(1 + mu))^2; as b -> oo "
             "(sympy.limit) it tightens to the free-batch threshold of derive free-batch",
             Eq(sympy.Limit(psi_c, b, sympy.oo), big_b)),
        Step("At psi = 1 the condition's right side minus mu simplifies to 0: today's 4 b (1 + b) < mu "
             "(derive noise-scale-rule)", _identity(condition_rhs.subs(psi, 1), mu)),
        Step("At psi = 1, y* minus sqrt(mu (1 + 1/b)) and cost(y*) minus noise-scale-rule's minimum simplify to 0",
             sympy.Tuple(_identity(y_star.subs(psi, 1), noise_rule.expr("y_star")),
                         _identity(min_cost.subs(psi, 1), noise_rule.expr("min_cost")))),
        Step("psi_c at mu = 5.28 = 132/25 (sympy.N): (b, psi_c) for b = 1/10, 1/4, 1/2, 1, 4, 37; psi <= 1 "
             "always, so replay pays whatever the memory where psi_c >= 1", Eq(sympy.Symbol("(b, psi_c)"), table)),
        Step("The horizon. (argued, an approximation) A stored sample of age s is r(s) = sigma^2(s)/sigma^2(0) times "
             "as noisy (IS: 1 + chi^2(s)); a FIFO of x steps holds the ages 0 .. x - 1 alike, so every term of "
             "V_eff is scaled by their mean m(x); for r(s) = 1 + c s (sympy.summation)", Eq(m_fn, m_x)),
        Step("(argued) At horizons long against the memory, psi ~ tau/x with tau = lim x psi ((2 - kappa)/kappa for "
             "SGD, 2/kappa - (1 - beta1)/(1 + beta1) for Adam; derive forgetting-variance), so the design's noise "
             "per b is (1 + y tau/x) m(x)", Eq(sympy.Symbol("B V_eff m / sigma^2"), noise_x)),
        Step(f"d/dx = 0 (sympy.solve, {len(x_roots)} positive solution)", Eq(x_star_sym, x_root)),
        Step("It minus sqrt(tau y (2 - c)/c) simplifies to 0: x* ~ sqrt(2 tau y / c) when c is small",
             _identity(x_root, x_star)),
        Step("The second derivative at x* (sympy.simplify): positive for 0 < c < 2 (argued from its form), a minimum",
             Eq(sympy.Symbol("d2/dx2 at x_*"), d2_x)),
        Step("As c -> 0 (flat staleness, sympy.limit) the horizon runs off: x* is finite only when r(s) grows",
             Eq(sympy.Limit(x_star_sym, c, 0, "+"), x_flat)),
    )
    return (steps, Eq(y_star_sym, y_star),
            {"S_min": s_min, "B_noise": b_noise, "B": B, "R": R, "mu": mu, "b": b, "y": y, "psi": psi, "c": c,
             "x": x, "tau": tau},
            {"cost": cost, "cost_replay": cost_by, "cost_on_policy": cost_on, "dcost_dy": d_cost,
             "y_star": y_star, "second_derivative": d2, "min_cost": min_cost, "gap": gap,
             "psi_threshold": psi_threshold, "psi_threshold_large_b": big_b, "other_roots": sympy.Tuple(*other_roots),
             "table_mu_5_28": table, "staleness_mean": m_x, "horizon_noise": noise_x, "x_star": x_star,
             "x_star_flat": x_flat})


# --------------------------------------------------------------------------- 17. free-batch


@_derivation("free-batch", "At a free batch: a smaller on-policy batch beats replay unless the optimizer forgets",
             "McCandlish et al. 2018 (arXiv 1812.06162), Eq. 2.7; derive noise-scale-rule, derive forgetting-rule")
def _build_free_batch() -> _Body:
    b_noise, B, R, N, mu, y, psi, b_prime = _positive("B_noise", "B", "R", "N", "mu", "y", "psi", "B'")
    W, T = _positive("W", "T")
    s_rep, s_on = sympy.Symbol("S_replay / S_min"), sympy.Symbol("S_on(R) / S_min")
    thr_sym, y_l = sympy.Symbol("psi_eq"), sympy.Symbol("y_l")
    steps_replay = 1 + b_noise * (1 / B + 1 / R)  # psi = 1: V = 1/B + 1/R (derive noise-scale-rule)
    steps_on = 1 + b_noise / R  # on-policy at B' = R
    steps_exact = 1 + b_noise * (1 / B + 1 / R - 1 / (B * N))  # keeping -1/(BN) (derive fifo-long-run-variance)
    more_steps = sympy.simplify(steps_replay - steps_on)
    more_steps_exact = sympy.factor(sympy.simplify(steps_exact - steps_on))
    more_cost = sympy.simplify((mu * R + B) - (1 + mu) * R)
    # with forgetting, replay at (R, B = y R): B V_eff = 1 + y psi
    steps_forget = 1 + b_noise * (1 + y * psi) / (y * R)
    (b_equal,) = sympy.solve(Eq(1 + b_noise / b_prime, steps_forget), b_prime)
    cheaper = sympy.simplify((1 + mu) * b_equal - (mu * R + y * R))  # > 0: replay's step is the cheaper
    (psi_eq,) = sympy.solve(Eq((1 + mu) * b_equal, mu * R + y * R), psi)
    psi_eq_printed = mu * (y - 1) / (y * (mu + y))
    margin = sympy.factor(sympy.simplify(1 - psi_eq_printed))
    d_thr = sympy.diff(psi_eq_printed, y)
    y_roots = sympy.solve(Eq(d_thr, 0), y)
    y_loose = 1 + sqrt(1 + mu)
    y_root, _ = _root_equal_to(y_roots, y_loose, "loosest y")
    at_loose = psi_eq_printed.subs(y, y_loose)
    loose_value = mu / (1 + sqrt(1 + mu)) ** 2
    lim_inf = sympy.limit(psi_eq_printed, y, sympy.oo)
    horizon = 1 / loose_value  # psi >= 1/x: x must exceed it
    steps = (
        Step("psi = 1 (derive noise-scale-rule): replay at (R, B > R) takes S_min (1 + B_noise (1/B + 1/R)) steps, "
             "on-policy at B' = R takes S_min (1 + B_noise/R); their difference (sympy.simplify)",
             sympy.Tuple(Eq(s_rep, steps_replay), Eq(s_on, steps_on), Eq(s_rep - s_on, more_steps))),
        Step("Keeping FIFO's -1/(BN) (derive fifo-long-run-variance) the difference is B_noise (N - 1)/(B N) >= 0 "
             "(sympy.factor)", Eq(s_rep - s_on, more_steps_exact)),
        Step("A replay step costs mu R + B, an on-policy step at R costs (1 + mu) R; their difference is B - R > 0 "
             "(sympy.simplify)", Eq(sympy.Symbol("(mu R + B) - (1 + mu) R"), more_cost)),
        Step("(argued) Fewer steps and cheaper ones: on-policy at B' = R costs less compute than replay at "
             "(R, B > R), and less time in any step time that does not fall with B (max(mu R/W, B/T) on W "
             "generation and T training GPUs is at least max(mu R/W, R/T))",
             sympy.Ge(sympy.Max(mu * R / W, B / T), sympy.Max(mu * R / W, R / T), evaluate=False)),
        Step("With forgetting, replay at (R, B = y R) takes S_min (1 + B_noise (1 + y psi)/(y R)) steps (derive "
             "forgetting-rule); the on-policy batch B' with as many steps (sympy.solve)",
             Eq(b_prime, b_equal)),
        Step("On-policy's step (1 + mu) B' minus replay's mu R + y R (sympy.simplify); replay is cheaper at equal "
             "steps iff it is positive", Eq(sympy.Symbol("(1 + mu) B' - (mu + y) R"), cheaper)),
        Step("The boundary in psi (sympy.solve)", Eq(thr_sym, psi_eq)),
        Step("It minus mu (y - 1)/(y (mu + y)) simplifies to 0: replay beats the smaller on-policy batch at equal "
             "steps iff psi < mu (y - 1)/(y (mu + y)); 0 at y = 1", _identity(psi_eq, psi_eq_printed)),
        Step("1 - psi_eq (sympy.factor) is positive: at psi = 1 replay never wins",
             Eq(1 - thr_sym, margin)),
        Step(f"d psi_eq/dy = 0 (sympy.solve, {len(y_roots)} roots; 1 - sqrt(1 + mu) < 0 is not a ratio)",
             Eq(y_l, y_root)),
        Step("It minus 1 + sqrt(1 + mu) simplifies to 0", _identity(y_root, y_loose)),
        Step("psi_eq is 0 at y = 1 and tends to 0 as y -> oo (sympy.limit) with one stationary point between: "
             "its maximum (argued)", Eq(sympy.Limit(thr_sym, y, sympy.oo), lim_inf)),
        Step("psi_eq at y_l minus mu/(1 + sqrt(1 + mu))^2 simplifies to 0: no replay ratio beats a smaller "
             "on-policy batch unless psi < mu/(1 + sqrt(1 + mu))^2", _identity(at_loose, loose_value)),
        Step("At mu = 5.28 = 132/25 (sympy.N): y_l, the threshold, and the horizon it needs, x > (1 + sqrt(1 + "
             "mu))^2/mu, since psi >= 1/x (derive forgetting-variance)",
             sympy.Tuple(Eq(y_l, sympy.N(y_loose.subs(mu, MU_QWEN), 6)),
                         Eq(thr_sym, sympy.N(loose_value.subs(mu, MU_QWEN), 6)),
                         Eq(sympy.Symbol("x_min"), sympy.N(horizon.subs(mu, MU_QWEN), 6)))),
    )
    return (steps, Eq(thr_sym, psi_eq_printed),
            {"B_noise": b_noise, "B": B, "R": R, "N": N, "mu": mu, "y": y, "psi": psi, "B'": b_prime},
            {"steps_replay": steps_replay, "steps_on_policy": steps_on, "more_steps": more_steps,
             "more_steps_exact": more_steps_exact, "more_cost": more_cost, "equal_steps_batch": b_equal,
             "cheaper": cheaper, "threshold": psi_eq_printed, "y_loose": y_loose, "loose_value": loose_value,
             "loose_value_mu_5_28": loose_value.subs(mu, MU_QWEN), "y_loose_mu_5_28": y_loose.subs(mu, MU_QWEN),
             "horizon_mu_5_28": horizon.subs(mu, MU_QWEN)})


# --------------------------------------------------------------------------- rendering


def derive(name: str) -> Derivation:
    """Build (once; cached) the derivation called ``name``."""
    try:
        builder = DERIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown derivation {name!r}; choose one of: {', '.join(DERIVATIONS)}") from None
    return builder()


_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex_text(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def _indent(block: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else line for line in block.splitlines())


def render(derivation: Derivation, latex: bool = False) -> str:
    """The derivation as numbered steps: ASCII text (sympy.pretty) or LaTeX (sympy.latex)."""
    if latex:
        lines = [
            f"% {derivation.name}: {derivation.title}",
            f"\\paragraph{{{_latex_text(derivation.title)}}} {_latex_text('Source: ' + derivation.source)}",
            "\\begin{enumerate}",
        ]
        for step in derivation.steps:
            lines.append(f"  \\item {_latex_text(step.description)}")
            lines.append(f"  \\[ {sympy.latex(step.expr)} \\]")
        lines.append("\\end{enumerate}")
        lines.append(f"\\textbf{{Result.}} \\[ {sympy.latex(derivation.result)} \\]")
        return "\n".join(lines) + "\n"
    width = max(len(str(len(derivation.steps))), 1)
    lines = [f"{derivation.name}: {derivation.title}", f"Source: {derivation.source}", ""]
    for number, step in enumerate(derivation.steps, start=1):
        lines.append(f"{number:>{width}}. {step.description}")
        lines.append(_indent(sympy.pretty(step.expr, use_unicode=False), width + 4))
        lines.append("")
    lines.append("Result:")
    lines.append(_indent(sympy.pretty(derivation.result, use_unicode=False), width + 4))
    return "\n".join(lines) + "\n"
