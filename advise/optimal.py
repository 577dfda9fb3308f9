"""``replay-theory optimal``: every input it takes (:class:`OptimalQuery`, one field per option, checked once) and
its answer as a record with its text (:func:`answer`).

The objectives are the entries of ``OBJECTIVES`` (help, answer function, benchmark key, the options it reads):
``forgetting`` (the default; advise/advice.py, theory/forgetting.py: McCandlish et al. 2018's steps with the FIFO
noise the optimizer keeps, psi(x, kappa)), ``noise-scale`` (theory/noise_scale.py: y* = sqrt(mu (1 + 1/b)) at a
fixed B when 4 b (1 + b) < mu, N = R) and ``paper`` (experience-replay, docs/REFERENCES.md: Thm 3.5's x* = N/R,
y* = B/R, or with a budget the Thm 3.4 bound; theory/design.py). Each answer carries the prediction benchmark's
``evidence:`` line for its objective (advise/evidence.py, under the entry's benchmark key).

A field's help is its attribute docstring, its check, valid range and choices one ``Range`` in its metadata
(checks.py); the command line builds its options from both (cli/config_options.py).
Messages name the options as typed (field ``batch_size`` -> ``--batch-size``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..checks import Range, invalid, range_of
from ..theory.compute import rollout_mu_of_convention
from .answer import (
    CONVENTIONS,
    HORIZON_TEXT,
    MEASURE_B,
    TABLE_BS,
    render_design,
    render_rule,
    render_rule_table,
)
from .evidence import (
    FAMILIES_EVIDENCE_FILE,
    evidence_line,
    families_evidence_line,
    floor_ratio_of,
    load_evidence,
    outside_tested_range,
    verdict_line,
)

if TYPE_CHECKING:
    from ..theory.design import DesignQuery, Split
    from .profile_files import LoadedProfile

OPTIMIZERS = {"sgd": "plain SGD", "momentum": "SGD with heavy-ball momentum beta1", "adam": "Adam with beta1"}
AVERAGES = {"integral": "the paper's integral over the buffer", "discrete": "the exact mean over integer ages"}
NOISE_SCALE = Range(1e-6, 1e12, finite=True, noun="a number", note=" (B_noise = tr Sigma / |E G|^2, in samples)",
                    fmt="g")
"""B_noise is a number of samples: below a millionth of one the rules' y* overflows into nonsense (y* = 1.8e151 at
1e-300), above 1e12 no batch is large enough to matter; both ends are beyond any measurement."""
MU = Range(1e-4, 1e4, finite=True, noun="a number", note=" (a ratio of two costs)", fmt="g")
"""mu is a ratio of two costs of the same run (Table 1's models lie near 5; the other convention inverts it): beyond
1e4 either way a run is all generation or all training, and the paper's closed form answers with batches of
astronomical size (mu = 1e100 gave a 53-digit B). A range, said up front."""
MAX_BATCH = 10_000_000
"""The largest batch, pilot batch, group and latency floor (responses) ``optimal`` takes: ten million responses per
update is two orders beyond the largest published RL batches; the search's time grows as log(B)^2, so the bound also
keeps an answer within seconds."""
KAPPA_MIN = 1e-9
"""The smallest kappa (a memory of a billion steps, beyond any run): below it the momentum / Adam impulse response's
stationary covariance loses every digit (kappa = 1e-12 reads as unstable, 1e-320 overflows)."""
FORGETTING_FIELDS = ("kappa", "optimizer", "beta1", "pilot_batch", "group_size", "latency_floor", "max_steps_ratio",
                     "max_horizon", "max_epochs", "max_staleness", "max_work_ratio", "zero_share")
PAPER_FIELDS = ("alpha", "rho", "average", "budget", "smoothness", "bias", "f0", "rollouts_per_step")
BUDGET_CONSTANTS = ("smoothness", "bias", "f0")


def load_profile(path: str) -> LoadedProfile:
    """The --profile file (advise/profile_files.py: its reader, with csv, is imported only when a --profile is
    given, which keeps it out of ``optimal --mu``'s start-up)."""
    from .profile_files import load_profile as read

    return read(path)


def option(name: str) -> str:
    """The option a user types for a field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _batch(note: str = "") -> dict:
    """A batch, pilot batch or group: an integer in [1, MAX_BATCH] responses."""
    return Range(1, MAX_BATCH, integer=True, note=note).field()


def _positive(note: str = "") -> dict:
    """A finite number > 0 (a budget, a constant, a GPU count)."""
    return Range(0, low_open=True, finite=True, note=note, fmt="g").field()


def framework_choices() -> dict[str, str]:
    """{framework: its name and pinned version} of ``advise.frameworks.FRAMEWORKS`` (imported when asked)."""
    from .frameworks import FRAMEWORKS

    return {key: f"{fw.name} {fw.version}" for key, fw in FRAMEWORKS.items()}


def objective_choices() -> dict[str, str]:
    """{objective: help} of ``OBJECTIVES`` (defined below its answer functions), in table order."""
    return {name: objective.help for name, objective in OBJECTIVES.items()}


@dataclass(frozen=True)
class OptimalQuery:
    """What ``replay-theory optimal`` is asked: one field per option (``--json`` aside)."""

    mu: float | None = field(default=None, metadata=MU.field())
    """Rollout cost ratio, rollout cost / per-sample update cost in the default convention (Table 1; 5.28 for
    Qwen2.5-7B); required unless --profile carries a measured mu (calibrate --from-log writes one)."""
    batch_size: int | None = field(default=None, metadata=_batch())
    """Your batch B (responses per update, on-policy today): the rules' b = B_noise / B; paper: gives R and N."""
    noise_scale: float | None = field(default=None, metadata=NOISE_SCALE.field())
    """Measured gradient noise scale B_noise = tr Sigma / |E G|^2 in samples (with -B)."""
    kappa: float | None = field(default=None, metadata=Range(
        KAPPA_MIN, finite=True, note=" (the optimizer's memory, 1/kappa steps)", fmt="g").field())
    """forgetting: the optimizer's measured memory kappa = eta tr(H Sigma) / tr Sigma (1/kappa steps) at
    --pilot-batch; or a profile's memory record."""
    optimizer: str | None = field(default=None, metadata=Range(choices=OPTIMIZERS).field())
    """forgetting: the optimizer kappa belongs to (default adam, or the profile's)."""
    beta1: float | None = field(default=None, metadata=Range(0, 1, high_open=True, noun="a number", fmt="g").field())
    """forgetting: momentum / Adam's beta1 (default 0.9, or the profile's)."""
    pilot_batch: int | None = field(default=None, metadata=_batch())
    """forgetting: the on-policy batch kappa was measured at (default -B, or the profile's)."""
    group_size: int = field(default=1, metadata=_batch(" that divides -B"))
    """forgetting: responses per prompt group; B and R in whole groups."""
    latency_floor: float = field(default=0.0, metadata=Range(0, MAX_BATCH, note=" (rollouts)", fmt="g").field())
    """forgetting: generation latency floor in rollouts (a step costs mu max(R, floor) + B)."""
    max_steps_ratio: float = field(default=1000.0, metadata=Range(1, 1000, fmt="g").field())
    """forgetting: steps allowed, relative to on-policy at B (a wall-time budget; the default 1000 asks for least
    compute whatever the steps)."""
    max_work_ratio: float = field(default=1000.0, metadata=Range(1, 1000, fmt="g").field())
    """forgetting: work allowed, relative to on-policy at B's to the target: the GPU time spent generating and
    training, the latency floor's waiting not counted (a compute budget: with --latency-floor the answer is the
    fastest design within it); the default 1000 sets none. Without --noise-scale the floor rule's batch stays within
    it whatever b is (at most this x B)."""
    max_horizon: int = field(default=64, metadata=Range(1, 4096, integer=True, fmt="g").field())
    """forgetting: the longest buffer horizon x = N/R considered."""
    max_epochs: int = field(default=1, metadata=Range(1, 64, integer=True, fmt="g").field())
    """forgetting: also price e epochs over m mini-batches of one generation (TRL num_iterations and
    steps_per_generation, verl ppo_epochs), e up to this; 1 (default) prices none: the benchmark has not tested them."""
    max_staleness: int = field(default=0, metadata=Range(0, 64, integer=True, fmt="g").field())
    """forgetting: also price generation overlapped with training on a GPU split, each rollout trained once at most
    this many updates old (TRL max_staleness, verl max_off_policy_threshold); priced at 1 update, as a larger bound
    only adds staleness in the model; needs a staleness table (--profile) reaching age 1; 0 (default) prices none:
    the benchmark has not tested it."""
    zero_share: float | None = field(default=None, metadata=Range(0, 1, high_open=True, fmt="g").field())
    """forgetting: the share of prompt groups whose rewards are all equal (no advantage, no gradient), averaged over
    your run: TRL logs it as frac_reward_zero_std, calibrate --from-log writes it into the profile; above 0 optimal
    also prices selective replay, a FIFO that stores only the other groups (trl-replay --buffer selective), and
    dynamic sampling, which drops them and generates again (DAPO; verl filter_groups); none given (default, or 0)
    prices none."""
    objective: str = field(default="forgetting", metadata=Range(choices=objective_choices).field())
    """Which rule answers (default forgetting, the rule the benchmark tests)."""
    alpha: float | None = field(default=None, metadata=Range(0, finite=True, fmt="g").field())
    """paper: exponent alpha of the power-law noise profile sigma(s) = s^alpha, s in units of tau (default 0.25)."""
    rho: float | None = field(default=None, metadata=Range(0, 1).field())
    """paper: sample correlation coefficient of Assumption 3.3 (default 0.1, or the profile's)."""
    convention: str | None = field(default=None, metadata=Range(choices=CONVENTIONS).field())
    """Which meaning of mu is given (default rollout-cost, Table 1; or the profile's mu's)."""
    rollouts_per_step: int | None = field(default=None, metadata=Range(1, integer=True).field())
    """paper: fresh rollouts per step R: gives integer N and B."""
    profile: str | None = None
    """Profile file (JSON or CSV, see docs): its noise_scale and memory records feed the rules, its mu the cost, its
    drift record (1 + M2(s), calibrate --from-log --drift) or else its sigma^2(s) table the staleness cost
    (forgetting), the table the paper objective's noise profile."""
    average: str | None = field(default=None, metadata=Range(choices=AVERAGES).field())
    """paper: average of sigma^2 over the buffer for --profile (default integral)."""
    budget: float | None = field(default=None, metadata=_positive(" (compute, in per-sample update costs)"))
    """paper: compute budget C (per-sample update costs): minimise the Thm 3.4 bound itself at C."""
    smoothness: float | None = field(default=None, metadata=_positive(" (L of Assumption 3.1)"))
    """paper: L of Assumption 3.1 (with --budget)."""
    bias: float | None = field(default=None, metadata=Range(0, finite=True, note=" (kappa of Assumption 3.2)",
                                                           fmt="g").field())
    """paper: kappa of Assumption 3.2 (with --budget)."""
    f0: float | None = field(default=None, metadata=_positive(" (F(theta_0) - inf F)"))
    """paper: F(theta_0) - inf F (with --budget)."""
    framework: str | None = field(default=None, metadata=Range(choices=framework_choices).field())
    """Also print the config lines that realise the answer's design in this trainer (keys at its pinned version,
    docs/FRAMEWORKS.md), or the line saying why it needs our TRL replay trainer."""

    def given(self, names: tuple[str, ...]) -> list[str]:
        """The options among ``names`` set to other than their default."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [option(name) for name in names if getattr(self, name) != defaults[name]]

    def validated(self) -> "OptimalQuery":
        """Each option in its range, and only where its objective reads it: one line naming the first that is not."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            valid = range_of(f)
            if value is not None and valid is not None and valid.choices is not None:  # as a parser checks them
                valid.check(option(f.name), value)
        self._check_objective_reads_them()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            valid = range_of(f)
            if value is not None and valid is not None:
                valid.check(option(f.name), value)
        if self.batch_size is not None and self.batch_size % self.group_size:
            raise invalid("--group-size", _valid("group_size"), self.group_size, fmt="g")
        if self.budget is not None:
            self.budget_constants()
        return self

    def _check_objective_reads_them(self) -> None:
        """Refuse an objective's own option given to an objective whose entry in ``OBJECTIVES`` does not read it."""
        reads = OBJECTIVES[self.objective].reads
        forgetting = self.given(tuple(name for name in FORGETTING_FIELDS if name not in reads))
        if forgetting:
            raise ValueError(f"{forgetting[0]} applies to the forgetting-aware rule (the default --objective), not "
                             f"--objective {self.objective}")
        paper = self.given(tuple(name for name in PAPER_FIELDS if name not in reads))
        if paper:
            why = (" (at a fixed R replay cannot beat on-policy at batch R; give -B)"
                   if paper[0] == "--rollouts-per-step" else "")
            raise ValueError(f"{paper[0]} applies to --objective paper; the {self.objective} rule reads --mu, "
                             f"--noise-scale (or --profile) and -B{why}")
        if "noise_scale" not in reads and self.noise_scale is not None:
            raise ValueError("--noise-scale applies to the forgetting-aware and noise-scale rules, not --objective "
                             f"{self.objective}")
        constants = self.given(BUDGET_CONSTANTS)
        if self.budget is None and constants:
            raise ValueError(f"{constants[0]} only applies with --budget (the finite-budget objective)")

    def budget_constants(self) -> tuple[float, float, float]:
        """(L, kappa, F(theta_0) - inf F) that --budget needs, and a fixed scale: a line naming the first missing."""
        constants = (_budget_constant("smoothness", self.smoothness), _budget_constant("bias", self.bias),
                     _budget_constant("f0", self.f0))
        if self.rollouts_per_step is None and self.batch_size is None:
            raise ValueError("--budget needs --batch-size or --rollouts-per-step: at a finite budget the bound "
                             "prefers the smallest batch, so the scale must be fixed")
        return constants


def _budget_constant(name: str, value: float | None) -> float:
    """One of Thm 3.4's constants that --budget needs: its value, or the line saying it is missing."""
    if value is None:
        raise ValueError(f"--budget needs {option(name)}: {_valid(name)} (Thm 3.4's constants; see docs/THEORY.md)")
    return value


@functools.lru_cache(maxsize=None)
def _valid(name: str) -> str:
    """The valid range of OptimalQuery's field ``name``."""
    return next(range_of(f).text for f in dataclasses.fields(OptimalQuery) if f.name == name)


@dataclass(frozen=True)
class Answer:
    """What ``optimal`` prints: ``text``, or ``record`` as JSON; ``note`` (where mu came from) goes to stderr."""

    text: str
    record: dict
    note: str | None = None


def answer(query: OptimalQuery) -> Answer:
    """The answer of ``query``'s objective; bad input is a one-line ValueError naming the option, before any work."""
    query = query.validated()
    mu, convention, note = _mu_of(query)
    result = dataclasses.replace(OBJECTIVES[query.objective].answer(query, mu, convention), note=note)
    return result if query.framework is None else _with_framework(result, query)


def _with_framework(result: Answer, q: OptimalQuery) -> Answer:
    """``result`` with --framework's lines after its text and under "framework" in its record (advise/frameworks.py):
    the answer's design (B, R, N) at --group-size, or a line saying the answer names no whole design."""
    from ..theory.designs import Design
    from .frameworks import FrameworkAnswer, config_lines

    r = result.record
    sizes = [r.get(name) for name in ("batch_size", "rollouts_per_step", "capacity")]
    if all(type(v) is int for v in sizes):
        B, R, N = sizes
        e, m = r.get("epochs", 1), r.get("mini_batches", 1)
        selective, dynamic = r.get("regime") == "selective", r.get("regime") == "dynamic"
        fa = config_lines(q.framework, Design(B, R, N, B == R == N and not selective, q.group_size,
                                              selective=selective or dynamic),
                          epochs=e, mini_batches=m, max_staleness=r.get("max_staleness", 0))
    else:
        fa = FrameworkAnswer(q.framework, framework_choices()[q.framework].rsplit(" ", 1)[1],
                             refused="this answer names no whole design (B, R, N) to configure: give -B and the "
                                     "measurements it asks for")
    return dataclasses.replace(result, text=result.text + "\n" + fa.text(), record={**r, "framework": fa.to_json()})


def _mu_of(query: OptimalQuery) -> tuple[float, str, str | None]:
    """(mu, its convention, where it came from): --mu, else the measured mu the --profile file carries (so a
    calibrate --from-log profile feeds optimal with the user's own numbers); never a silent default: where it came
    from is the note optimal prints on stderr once the answer is out (an input error stays one line)."""
    if query.mu is not None:
        return query.mu, query.convention or "rollout-cost", None
    if query.profile is None:
        raise ValueError("--mu is required (or a --profile file that carries a measured mu, as calibrate --from-log "
                         "writes)")
    record = load_profile(query.profile).mu
    if record is None:
        raise ValueError(f"--mu is required: --profile {query.profile} carries no measured mu")
    if query.convention is not None and query.convention != record["convention"]:
        raise ValueError(f"--convention {query.convention} differs from the {record['convention']} mu that --profile "
                         f"{query.profile} carries: give --mu in that convention")
    ci = record.get("ci") or [None, None]
    span = f", 90% CI [{ci[0]:.4g}, {ci[1]:.4g}]" if None not in ci else ""
    MU.check("--mu", record["value"])
    source = record.get("source", "measured")
    how = ("typed with --mu when the profile was made, not measured" if source.startswith("--mu") else
           "measured from the log" if source == "log" else source)
    note = f"mu = {record['value']:.4g} from --profile {query.profile} ({how}{span})"
    return record["value"], record["convention"], note


# --- forgetting (the default) ------------------------------------------------------------------------------------


def _memory_inputs(q: OptimalQuery, loaded: LoadedProfile | None) -> dict:
    """kappa, optimizer, beta1, pilot batch and where kappa came from: the options, else the profile's memory record;
    given twice and different is an error, never a silent choice."""
    record = None if loaded is None else loaded.memory
    if record is not None and q.kappa is not None:
        raise ValueError("give kappa once: --kappa or --profile's memory record, not both")
    if record is None:
        return {"kappa": q.kappa, "optimizer": q.optimizer or "adam", "beta1": 0.9 if q.beta1 is None else q.beta1,
                "pilot_batch": q.pilot_batch, "kappa_source": "--kappa" if q.kappa is not None else ""}
    if record.get("kappa") is None:
        raise ValueError(f"--profile {q.profile}: its kappa was not measured "
                         f"({record.get('reason', 'no reason given')}); measure again or pass --kappa")
    for name, stored in (("optimizer", record["optimizer"]), ("beta1", record["beta1"]),
                         ("pilot_batch", record.get("pilot_batch"))):
        given = getattr(q, name)
        if given is not None and stored is not None and given != stored:
            raise ValueError(f"{option(name)} {given} differs from the {stored} that --profile {q.profile}'s memory "
                             f"was measured with: leave {option(name)} out")
    interval = record.get("kappa_interval") or [None, None]
    span = "" if None in interval else f", 90% interval [{interval[0]:.3g}, {interval[1]:.3g}]"
    pilot = record.get("pilot_batch") if q.pilot_batch is None else q.pilot_batch
    return {"kappa": float(record["kappa"]), "optimizer": record["optimizer"], "beta1": float(record["beta1"]),
            "pilot_batch": None if pilot is None else int(pilot),
            "kappa_source": f"--profile {q.profile} ({record.get('method', 'measured')}{span})"}


def _checked_memory(memory: dict) -> dict:
    """``_memory_inputs`` with kappa inside the named optimizer's stability limit: a tuned step never sits beyond it
    (SGD's steps diverge at kappa = eta h >= 2, momentum's and Adam's at 2 (1 + beta1) / (1 - beta1)), so a larger
    kappa is a mistyped input, most often the memory in steps (10) for kappa (0.1): one line, before any work."""
    from ..theory.forgetting import stable_kappa

    kappa, optimizer, beta1 = memory["kappa"], memory["optimizer"], memory["beta1"]
    if kappa is None:
        return memory
    limit = stable_kappa(optimizer, beta1) / (1.0 - 1e-9)  # the limit itself (stable_kappa stops just inside it)
    if not KAPPA_MIN <= kappa < limit:
        where = "--kappa" if memory["kappa_source"] == "--kappa" else f"{memory['kappa_source']}'s kappa"
        momentum = "" if optimizer == "sgd" else f" at beta1 = {beta1:g}"
        raise ValueError(f"{where} must be a finite number in [{KAPPA_MIN:g}, {limit:g}) for {optimizer}{momentum} "
                         "(its steps diverge beyond; kappa is 1 / the memory in steps: a memory of 10 steps is "
                         f"--kappa 0.1), got {kappa:g}")
    return memory


def _staleness_of(loaded: LoadedProfile | None):
    """The forgetting rule's staleness cost from a profile: r(s) = 1 + M2(s) of its drift record (the run re-scored
    by age: what the benchmark's printed answer is priced and scored at, docs/SIMULATION.md), else sigma^2(s) /
    sigma^2(0) of its measured table."""
    from ..theory.forgetting import NO_STALENESS, staleness_of_drift, staleness_of_table

    if loaded is None:
        return NO_STALENESS
    if loaded.drift is not None:
        source = loaded.drift.get("source") or "the profile"
        return staleness_of_drift(loaded.drift["staleness"], loaded.drift["m2"],
                                  f"1 + M2(s) re-scored over the run ({source})")
    from ..theory.profiles import TabulatedProfile

    if not isinstance(loaded.profile, TabulatedProfile):
        return NO_STALENESS
    return staleness_of_table(loaded.profile.staleness, loaded.profile.sigma_sq_values,
                              loaded.sigma_sq_form or "form not stated")


def _forgetting_answer(q: OptimalQuery, mu: float, convention: str) -> Answer:
    from . import advice

    b_noise, source = _noise_scale_input(q)
    if b_noise is not None and q.batch_size is None:
        raise ValueError("--noise-scale needs -B (the batch size: b = B_noise / B)")
    loaded = None if q.profile is None else load_profile(q.profile)
    memory = _checked_memory(_memory_inputs(q, loaded))
    query = advice.Query(mu=rollout_mu_of_convention(mu, convention), batch_size=q.batch_size, b_noise=b_noise,
                         b_noise_source=source, **memory, group_size=q.group_size,
                         floor=q.latency_floor, max_steps_ratio=q.max_steps_ratio, max_horizon=q.max_horizon,
                         max_epochs=q.max_epochs, max_staleness=q.max_staleness, **_zero_share_input(q, loaded),
                         staleness=_staleness_of(loaded), max_work_ratio=q.max_work_ratio)
    record = advice.advise(query)
    floor_ratio = floor_ratio_of(q.latency_floor, q.batch_size)  # the benchmark's cost model nearest the user's
    # a menu with a reuse family is scored against a grid that trains them: that run's record
    priced_families = q.max_epochs > 1 or q.max_staleness >= 1 or query.zero_share > 0
    families_record = load_evidence(FAMILIES_EVIDENCE_FILE) if priced_families else None
    verdict = (verdict_line(families_record, floor_ratio, "the benchmark with the reuse families in the grid")
               if families_record else verdict_line(floor_ratio=floor_ratio))
    evidence = _evidence("forgetting", floor_ratio=floor_ratio)
    if record.get("measured") and q.batch_size is not None:  # the evidence covers only the designs it trained
        outside = outside_tested_range({"batch_size": record["batch_size"], "capacity": record["capacity"],
                                        "rollouts_per_step": record["rollouts_per_step"],
                                        "on_policy": record["regime"] in ("on-policy", "overlapped", "dynamic")},
                                       q.batch_size)
        evidence += f"; {outside}" if outside else ""
        if record["regime"] == "epochs":
            evidence += ("; an epoch design: the default protocol trains none (experiment theory-test --families "
                         "epochs does, docs/SIMULATION.md), so no share above speaks for it")
        if record["regime"] == "overlapped":
            evidence += ("; overlapped generation: the default protocol trains none (experiment theory-test --families "
                         "overlap does, docs/SIMULATION.md), so no share above speaks for it")
        if record["regime"] == "selective":
            evidence += ("; selective replay: the default protocol trains none (experiment theory-test --families "
                         "selective does, docs/SIMULATION.md), so no share above speaks for it")
        if record["regime"] == "dynamic":
            evidence += ("; dynamic sampling: the default protocol trains none (experiment theory-test --families "
                         "selective does, docs/SIMULATION.md; its steps against on-policy at B / (1 - z): python -m "
                         "replay_theory.experiments.dynamic_check, docs/THEORY.md [E11]), so no share above speaks "
                         "for it")
    # a menu with epochs or overlap is scored against a grid that trains them: the families run's line, next
    families = families_evidence_line(floor_ratio, families_record) if priced_families else None
    return Answer(text=advice.render(record, [evidence, families] if families else [evidence], verdict),
                  record={**record, "verdict": verdict, "evidence": evidence, "convention": convention,
                          "paper_evidence": _evidence("paper"),
                          **({"families_evidence": families} if families else {})})


def _zero_share_input(q: OptimalQuery, loaded) -> dict:
    """advice.Query's zero share and its source: --zero-share, else the --profile's zero_share record, else none."""
    if q.zero_share is not None:
        if loaded is not None and loaded.zero_share is not None:
            raise ValueError(f"give the zero share once: --zero-share or --profile {q.profile}'s zero_share record, "
                             f"not both")
        return {"zero_share": q.zero_share, "zero_share_source": "--zero-share"}
    if loaded is not None and loaded.zero_share is not None:
        record = loaded.zero_share
        return {"zero_share": record["value"],
                "zero_share_source": f"--profile {q.profile}: {record.get('source', 'measured')}"}
    return {}


# --- the noise-scale rule --------------------------------------------------------------------------------------


def _noise_scale_input(q: OptimalQuery) -> tuple[float | None, str]:
    """(B_noise, where it came from): --noise-scale, or the profile's noise_scale record."""
    if q.profile is None:
        return q.noise_scale, "--noise-scale"
    if q.noise_scale is not None:
        raise ValueError("give the noise scale once: --noise-scale or --profile, not both")
    record = load_profile(q.profile).noise_scale
    if record is None:
        raise ValueError(f"--profile {q.profile} has no noise_scale record (b is missing): measure B_noise "
                         f"(replay-theory calibrate-simulator, validate calibrate-model, calibrate --from-log "
                         f"--grad-norms) or pass --noise-scale")
    interval = record.get("b_noise_interval") or [None, None]
    if record.get("b_noise") is None:
        low = "" if interval[0] is None else (f"; its interval's lower end is {interval[0]:.4g}: --mu MU --noise-scale "
                                              f"{interval[0]:.4g} -B B gives the most replay-friendly answer the data "
                                              f"allow")
        why = record.get("reason") or record.get("note")
        said = f": {why}" if why else ""
        raise ValueError(f"--profile {q.profile} has no B_noise (its noise_scale record has b_noise: null{said}){low}; "
                         f"or measure again over more steps or a larger batch")
    span = "" if None in interval else f", 90% interval [{interval[0]:.4g}, {interval[1]:.4g}]"
    return float(record["b_noise"]), f"--profile {q.profile} ({record.get('method', 'measured')}{span})"


def _noise_scale_answer(q: OptimalQuery, mu: float, convention: str) -> Answer:
    from ..theory import noise_scale as ns  # this objective's rule only, kept out of the default's start-up
    from ..theory.design import DesignQuery, optimal_design

    b_noise, source = _noise_scale_input(q)
    mu_rollout = rollout_mu_of_convention(mu, convention)
    evidence, paper, verdict = _evidence("noise-scale"), _evidence("paper"), verdict_line()
    head = {"objective": "noise-scale", "verdict": verdict, "horizon": HORIZON_TEXT, "mu": mu,
            "convention": convention}
    if b_noise is None:
        threshold = ns.replay_threshold(mu_rollout)
        rows = [ns.rule_at(b, mu_rollout) for b in sorted({*TABLE_BS, threshold})]
        paper_design = optimal_design(DesignQuery(mu=mu, convention=convention))  # whatever b and B
        return Answer(text=render_rule_table(mu, mu_rollout, convention, rows, verdict, evidence, paper_design,
                                             paper),
                      record={**head, "mu_rollout_cost": mu_rollout, "threshold_b": threshold, "rows": rows,
                              "evidence": evidence, "measure_b": list(MEASURE_B), "paper_evidence": paper})
    if q.batch_size is None:
        raise ValueError("--noise-scale needs -B (the batch size: the rule's b = B_noise / B)")
    design = ns.noise_scale_design(b_noise, q.batch_size, mu_rollout)
    paper_design = optimal_design(DesignQuery(mu=mu, convention=convention, batch_size=q.batch_size))
    return Answer(text=render_rule(mu, convention, design, source, verdict, evidence, paper_design, paper),
                  record={**head, "noise_scale_source": source, **design.__dict__, "x": design.x,
                          "workers_per_trainer": design.workers_per_trainer, "compute_ratio": design.compute_ratio,
                          "evidence": evidence,
                          "paper": {"x_star": paper_design.x_star, "y_star": paper_design.y_star,
                                    "regime": paper_design.regime, "evidence": paper}})


# --- the paper's design ------------------------------------------------------------------------------------------


def _paper_profile(q: OptimalQuery) -> LoadedProfile | None:
    """The --profile file as the paper objective reads it: a sigma^2(s) table or power law, with a usable rho."""
    if q.profile is None:
        return None
    loaded = load_profile(q.profile)
    if loaded.profile is None:
        raise ValueError(f"--profile {q.profile} holds a noise scale only; --objective paper needs a sigma^2(s) table "
                         f"or power law")
    if q.rho is None and loaded.rho_problem():  # never a silent default for a failed fit
        raise ValueError(f"--profile {q.profile}: {loaded.rho_problem()}; pass --rho explicitly")
    if q.alpha is not None:
        raise ValueError("alpha cannot be combined with --profile (the profile replaces the power law)")
    return loaded


def _finite_budget(q: OptimalQuery, query: DesignQuery, budget: float):
    """finite_budget_design for an `optimal` query: the power law (default alpha) or the --profile's."""
    from ..theory.design import DEFAULT_ALPHA, DEFAULT_RHO, finite_budget_design
    from ..theory.profiles import PowerLawProfile
    query.validated()  # the shared checks (-R with -B, ...) before the search
    smoothness, bias, f0 = q.budget_constants()
    if query.profile is None:
        alpha = DEFAULT_ALPHA if query.alpha is None else query.alpha
        profile, description = PowerLawProfile(alpha), f"power law sigma(s) = (s/tau)^{alpha:g}"
    else:
        alpha, profile, description = None, query.profile, query.profile_description
    rho = query.rho if query.rho is not None else (query.profile_rho if query.profile_rho is not None
                                                   else DEFAULT_RHO)
    try:
        return finite_budget_design(
            budget=budget, mu=query.mu, smoothness=smoothness, bias=bias, f0=f0, profile=profile,
            profile_description=description, alpha=alpha, rho=rho, batch_size=q.batch_size,
            rollouts_per_step=q.rollouts_per_step, convention=query.convention, average=query.average)
    except ValueError as err:  # "budget must be >= ..." names the option as typed
        head = str(err).split(" ", 1)[0]
        raise ValueError(f"--{err}" if head in ("budget", *BUDGET_CONSTANTS) else str(err)) from None


def _paper_answer(q: OptimalQuery, mu: float, convention: str) -> Answer:
    from ..theory.design import DesignQuery, optimal_design
    loaded = _paper_profile(q)
    query = DesignQuery(mu=mu, alpha=q.alpha, rho=q.rho, convention=convention,
                        rollouts_per_step=q.rollouts_per_step, batch_size=q.batch_size,
                        profile=None if loaded is None else loaded.profile,
                        profile_description=None if loaded is None else loaded.description,
                        profile_rho=None if loaded is None else loaded.rho, average=q.average or "integral")
    design = optimal_design(query) if q.budget is None else _finite_budget(q, query, q.budget)
    evidence = _evidence("paper") if q.budget is None else evidence_line("finite-budget", FINITE_BUDGET_EVIDENCE)
    return Answer(text=render_design(design) + "\n" + evidence + ".",
                  record={**design.to_json_dict(), "evidence": evidence})


# --- the objectives: one entry each --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Objective:
    """One ``--objective``: its help, the function that answers it, its key among the benchmark's objectives
    (advise/evidence.json; experiments/theory_bench/objectives.py's ``OBJECTIVES``) and the objective-specific fields it
    reads (``FORGETTING_FIELDS``, ``PAPER_FIELDS``, ``noise_scale``: the others are refused)."""

    help: str
    answer: Callable[[OptimalQuery, float, str], Answer]
    """(query, mu, its convention) -> the answer (mu resolved once, by ``_mu_of``)."""
    evidence: str
    reads: tuple[str, ...] = ()


OBJECTIVES = {
    "forgetting": Objective("the whole design (B, R, N) from mu, b = B_noise / B and the optimizer's memory kappa; "
                            "the rule the benchmark tests", _forgetting_answer, "forgetting",
                            ("noise_scale", *FORGETTING_FIELDS)),
    "noise-scale": Objective("the replay ratio at a fixed B, the optimizer never forgetting (psi = 1)",
                             _noise_scale_answer, "noise_scale", ("noise_scale",)),
    "paper": Objective("Thm 3.5's J (the large-budget limit), or with --budget the Thm 3.4 bound at compute C",
                       _paper_answer, "paper_J", PAPER_FIELDS),
}
FINITE_BUDGET_EVIDENCE = "finite_budget"
"""The benchmark's key of ``--objective paper --budget C`` (the Thm 3.4 bound)."""


def _evidence(objective: str, floor_ratio: float | None = None) -> str:
    """The ``evidence:`` line of ``objective`` under its entry's benchmark key."""
    return evidence_line(objective, OBJECTIVES[objective].evidence, floor_ratio=floor_ratio)


# --- gamma: a (W, T) GPU split (Eq. 2) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitQuery:
    """What ``replay-theory gamma`` is asked: a (W, T) GPU split and the cost ratio mu."""

    workers: float = field(metadata=_positive())
    """Inference GPUs W."""
    trainers: float = field(metadata=_positive())
    """Trainer GPUs T."""
    mu: float = field(metadata=MU.field())
    """Rollout cost / per-sample update cost (Table 1 meaning)."""

    def split(self) -> Split:
        """The split's gamma, y and regime (theory/design.py, ``split_design``), each option checked first."""
        from ..theory.design import split_design
        for f in dataclasses.fields(self):
            range_of(f).check(option(f.name), getattr(self, f.name))
        low, high = SPLIT_RATIO_RANGE
        if not low <= self.workers / self.trainers <= high:  # 1e308 / 1e-308 is inf: Eq. 2 would print nonsense
            raise ValueError(f"--workers / --trainers must be in [{low:g}, {high:g}] (inference GPUs per trainer GPU),"
                             f" got {self.workers:g} / {self.trainers:g}")
        return split_design(self.workers, self.trainers, self.mu)


SPLIT_RATIO_RANGE = (1e-6, 1e6)
"""W/T beyond a million either way is not a GPU split (and overflows Eq. 2 at the float range's ends)."""
