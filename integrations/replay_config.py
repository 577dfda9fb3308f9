"""The replay design a trainer runs: N, B, R, the buffer design and the off-policy correction (no torch).

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh rollouts into a buffer of N and
trains on B; staleness horizon x = N/R, replay ratio y = B/R. Code names -> paper symbols: ``capacity`` N (the
name DesignConfig, SimConfig and the saved results use), ``batch_size`` B, ``rollouts_per_step`` R. Which buffer
designs and losses a trainer can run, and their help, come from the shared registry (``core/designs.py``:
``BUFFER_DESIGNS`` / ``LOSSES`` entries with ``trainer=True``); nothing is listed here. Torch-free, so the command
line checks a design (``trl-replay``) without importing torch; the buffer itself is ``integrations/buffer.py``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Mapping

from ..checks import require_integer, require_number, require_one_of
from ..core import losses
from ..core.designs import (
    ClipParams,
    DesignConfig,
    M2POParams,
    RLOOParams,
    design_field_names,
    in_design_names,
    loss_aggregation,
    validate_trainer_design,
)
from ..core.pipeline import age_buckets, fifo_max_age  # the one age bucketing (re-exported)
from ..theory.design import rollout_mu_of_convention
from ..theory.noise_scale import noise_scale_pick

__all__ = ["ReplayConfig", "age_buckets", "fifo_max_age"]

#: The loss parameters a ReplayConfig takes as its own arguments (DesignConfig's names; a new loss's parameters go in
#: ``design``, so a loss added to the registry runs in a trainer with no edit here).
_LOSS_FIELDS = ("eps_low", "eps_high", "clip_c", "tau_m2")
#: DesignConfig fields a ReplayConfig sets itself (N, B, R, G, the buffer and the loss): not allowed in ``design``.
_DESIGN_SET_HERE = ("capacity", "batch_size", "rollouts_per_step", "group_size", "buffer", "loss", *_LOSS_FIELDS)
#: The constructor's arguments, in its order: ``record()``'s keys (run.json's ``replay``) and ``repr``.
_ARGUMENTS = ("capacity", "batch_size", "rollouts_per_step", "loss", *_LOSS_FIELDS, "aggregation", "buffer",
              "design", "seed", "notes")



def _from_shared(name: str, doc: str | None = None) -> property:
    """A read-only attribute that is ``self.shared.<name>`` (the DesignConfig the ReplayConfig holds)."""
    return property(attrgetter(f"shared.{name}"), doc=doc)


@dataclass(frozen=True, init=False, repr=False)
class ReplayConfig:
    """N, B, R and the off-policy correction of a replay run (experience-replay Sec. 3; losses of core/losses.py).

    It holds the registry's ``DesignConfig`` (``shared``) of the design and reads N, B, R, the buffer, the loss
    and its parameters from it; each is documented once, on DesignConfig. The trainer's group size G (TRL's
    num_generations) is set by :meth:`design_config`. Arguments: ``capacity`` N (in completions; a multiple of G,
    >= R), ``batch_size`` B (completions drawn per update), ``rollouts_per_step`` R (fresh completions per update;
    TRL: per_device_train_batch_size on one process), ``loss`` (a ``LOSSES`` entry with ``trainer=True``),
    ``eps_low`` / ``eps_high`` (grpo's clip), ``clip_c`` (tis), ``tau_m2`` (m2po), ``buffer`` (a
    ``BUFFER_DESIGNS`` entry with ``trainer=True``) and ``design`` (that buffer's other DesignConfig fields, e.g.
    {"delta": 0.2}).
    """

    shared: DesignConfig
    """The registry's design: N, B, R, buffer, loss, its parameters and ``design``'s fields (G: the default)."""
    aggregation: str | None
    """How token terms become one loss (core/losses.AGGREGATIONS); None: the loss's own (its LossDesign entry)."""
    design: Mapping[str, Any]
    """The buffer's other DesignConfig fields as given, e.g. {"delta": 0.2} or {"per_alpha": 0.6, "per_tau": 8.0}."""
    seed: int
    """Seed of the uniform draws from the buffer (a generator of its own: TRL's RNG streams are left alone)."""
    notes: tuple[str, ...] = field(compare=False)
    """What ``from_optimal_json`` changed (e.g. N rounded to whole groups)."""

    def __init__(self, capacity: int, batch_size: int, rollouts_per_step: int, loss: str = "grpo",
                 eps_low: float = ClipParams.eps_low, eps_high: float = ClipParams.eps_high,
                 clip_c: float = RLOOParams.clip_c, tau_m2: float = M2POParams.tau_m2, aggregation: str | None = None,
                 buffer: str = "fifo", design: Mapping[str, Any] | None = None, seed: int = 0,
                 notes: tuple[str, ...] = ()) -> None:
        design = {} if design is None else design
        shared = DesignConfig(buffer=buffer, loss=loss, capacity=capacity, batch_size=batch_size,
                              rollouts_per_step=rollouts_per_step, eps_low=eps_low, eps_high=eps_high,
                              clip_c=clip_c, tau_m2=tau_m2)
        unknown = sorted(set(design) - set(design_field_names()))
        if unknown:
            raise ValueError(f"design has unknown field(s) {', '.join(unknown)}; DesignConfig's fields are "
                             f"{', '.join(k for k in design_field_names() if k not in _DESIGN_SET_HERE)}")
        clash = sorted(set(design) & set(_DESIGN_SET_HERE))
        if clash:
            raise ValueError(f"design sets {', '.join(clash)}, which ReplayConfig sets itself: leave "
                             f"{'it' if len(clash) == 1 else 'them'} out of design")
        if aggregation is not None:
            require_one_of("aggregation", aggregation, losses.AGGREGATIONS)
        shared = dataclasses.replace(shared, **design)
        validate_trainer_design(shared)  # the registry's rules (core/designs.py), with the buffer's own fields
        for name, value in (("shared", shared), ("aggregation", aggregation),
                            ("design", design), ("seed", seed), ("notes", notes)):
            object.__setattr__(self, name, value)

    # N, B, R, the buffer, the loss and its parameters: read from ``shared``, where each is stored and documented once
    capacity = _from_shared("capacity", "N: buffer size in completions.")
    batch_size = _from_shared("batch_size", "B: completions drawn from the buffer for each update.")
    rollouts_per_step = _from_shared("rollouts_per_step", "R: fresh completions generated per update.")
    loss = _from_shared("loss")
    buffer = _from_shared("buffer")
    eps_low = _from_shared("eps_low")
    eps_high = _from_shared("eps_high")
    clip_c = _from_shared("clip_c")
    tau_m2 = _from_shared("tau_m2")

    def record(self) -> dict[str, Any]:
        """The constructor's arguments as a JSON object, in its order (run.json's ``replay``; notes as a list)."""
        out = {name: getattr(self, name) for name in _ARGUMENTS}
        return out | {"design": dict(self.design), "notes": list(self.notes)}

    def __repr__(self) -> str:
        args = {name: getattr(self, name) for name in _ARGUMENTS}
        return f"ReplayConfig({', '.join(f'{k}={v!r}' for k, v in args.items())})"

    def design_config(self, group_size: int) -> DesignConfig:
        """The shared registry's DesignConfig of this replay design (N, B, R, G, buffer, loss and ``design``)."""
        return dataclasses.replace(self.shared, group_size=group_size)

    def loss_config(self) -> DesignConfig:
        """The DesignConfig the registry's loss reads: the loss, its parameters and ``design``'s."""
        return self.shared

    @property
    def resolved_aggregation(self) -> str:
        """The aggregation the loss runs with: ``aggregation``, else its registry entry's (tis: seq-mean-token-sum)."""
        return loss_aggregation(self.loss_config(), self.aggregation)

    @property
    def replay_ratio(self) -> float:
        """y = B/R: how many times each rollout is trained on, on average."""
        return self.batch_size / self.rollouts_per_step

    @property
    def max_age(self) -> int:
        """Oldest age a trained row can have under the FIFO law: ceil(N/R) - 1."""
        return fifo_max_age(self.capacity, self.rollouts_per_step)

    @classmethod
    def from_optimal_json(cls, source: str | Path | Mapping[str, Any], *, group_size: int | None = None,
                          **overrides: Any) -> "ReplayConfig":
        """N, B, R from ``replay-theory optimal ... --json`` output (a path, a JSON string, or its dict).

        Both objectives name them ``capacity``, ``batch_size`` and ``rollouts_per_step`` (a file saved before the
        names were unified may say ``buffer_size`` for N: read as capacity). The paper objective's are null unless
        ``optimal`` was given -R or -B; then this raises. With ``group_size`` G, the noise-scale rule's R = N is
        rounded to whole groups by the rule's own cost (theory.noise_scale.noise_scale_pick), and the paper's N to
        the nearest multiple of G, at least R; the rounding is recorded in ``notes``. ``overrides`` set the other
        fields (``loss``, ``eps_high``, ...).
        """
        data = dict(_load_json(source))
        _check_design(data)
        data = in_design_names(data)  # optimal --json before capacity was its name for N says buffer_size
        notes: list[str] = []
        if data.get("objective") == "forgetting" and not data.get("measured"):  # the default rule's answer
            raise ValueError("the optimal --json output has no design: run `replay-theory optimal` with the noise "
                             "scale (--noise-scale or --profile) and -B (batch size)")
        if data.get("regime") == "overlapped" and overrides.get("buffer") == "stale-k":  # its staleness, no overlap
            k = data.get("max_staleness")
            require_integer("max_staleness", k, 1, whole_floats=True)
            require_integer("batch_size", data.get("batch_size"), 1, whole_floats=True)
            b = int(data["batch_size"])
            design = {**dict(overrides.pop("design", None) or {}), "stale_k": int(k)}
            return cls(capacity=b, batch_size=b, rollouts_per_step=b, design=design,
                       notes=(f"overlapped generation (max_staleness = {int(k)}) run as buffer stale-k, k = {int(k)}: "
                              f"the same staleness, generated in the update's own step (no overlap, so none of its "
                              f"wall-time gain)",), **overrides)
        if data.get("regime") == "epochs":  # e epochs over m mini-batches of one generation: TRL's own buffering
            return cls._epochs_answer(data, overrides)
        if data.get("regime") == "overlapped":  # a pipeline, not a buffer: no ReplayConfig realises it
            raise ValueError(f"the optimal --json output answers overlapped generation (max_staleness = "
                             f"{data.get('max_staleness')}), which the replay buffer does not run: each rollout is "
                             f"used once, one update late, while the next generation runs on other GPUs; set your "
                             f"trainer's asynchronous mode (replay-theory optimal ... --framework NAME prints its "
                             f"keys), or run its staleness without the overlap: buffer stale-k with stale_k = "
                             f"{data.get('max_staleness')}, N = B = R")
        if data.get("regime") == "dynamic":  # rounds of B until B are informative: buffer dynamic
            return cls._dynamic_answer(data, overrides)
        if data.get("objective") == "noise-scale":  # N = R at fixed B (cli/theory_cmds.py)
            if data.get("batch_size") is None or data.get("b_noise") is None:
                raise ValueError("the optimal --json output has no design: run `replay-theory optimal` with the "
                                 "noise scale (--noise-scale or --profile) and -B (batch size)")
            if group_size is not None:  # R in whole groups, by the rule's own cost
                require_integer("group_size", group_size, 1)
                mu = rollout_mu_of_convention(data["mu"], data.get("convention", "rollout-cost"))
                pick = noise_scale_pick(data["b_noise"], data["batch_size"], group_size, mu)
                if pick["rollouts_per_step"] != data["rollouts_per_step"]:
                    notes.append(f"R = N = {data['rollouts_per_step']} of the rule rounded to "
                                 f"{pick['rollouts_per_step']}, whole groups of {group_size} (the cheaper neighbour "
                                 f"by the rule's cost; regime {pick['regime']})")
                data["capacity"] = data["rollouts_per_step"] = pick["rollouts_per_step"]
        missing = [k for k in ("capacity", "batch_size", "rollouts_per_step") if data.get(k) is None]
        if missing and data.get("regime") == "unbounded":  # the objective still fell at the last measured staleness
            raise ValueError("the design is unbounded (the objective still falls at the largest staleness the profile "
                             f"measured): there is no capacity to read; choose N = x R by hand with x at most the "
                             f"profile's last staleness + 1, B = {data.get('batch_size')}, or measure sigma^2(s) "
                             "further out")
        if missing:
            raise ValueError(f"the optimal --json output has no {', '.join(missing)}: run `replay-theory optimal` "
                             "with -R (rollouts per step) or -B (batch size) to get an integer design")
        if data.get("regime") == "selective":  # a FIFO that admits only groups with unequal rewards ([E8])
            asked = overrides.pop("buffer", None)
            if asked not in (None, "fifo", "selective"):  # fifo: the trainer's default, not a choice against it
                raise ValueError(f"the optimal --json output answers selective replay (a FIFO admitting only the "
                                 f"groups whose rewards are not all equal), which buffer {asked} does not run: leave "
                                 f"the buffer at its default or give buffer selective")
            overrides["buffer"] = "selective"
            notes.append(f"selective replay run as buffer selective: only the groups whose rewards are not all equal "
                         f"enter the FIFO (the answer priced a zero share z = {data.get('zero_share')})")
        sizes = DesignConfig.from_record(data)  # N, B, R: whole numbers (_check_design)
        n, b, r = sizes.capacity, sizes.batch_size, sizes.rollouts_per_step
        if group_size is not None:
            require_integer("group_size", group_size, 1)
            if r % group_size:
                raise ValueError(f"rollouts_per_step = {r} from the design is not a multiple of group_size = "
                                 f"{group_size}: rerun `replay-theory optimal` with -R a multiple of {group_size}")
            rounded = max(r, group_size * round(n / group_size))
            if rounded != n:
                notes.append(f"capacity {n} rounded to {rounded}, a whole number of groups of {group_size}")
                n = rounded
        return cls(capacity=n, batch_size=b, rollouts_per_step=r, notes=tuple(notes), **overrides)

    @classmethod
    def _dynamic_answer(cls, data: Mapping[str, Any], overrides: dict[str, Any]) -> "ReplayConfig":
        """A dynamic-sampling answer (``regime`` dynamic: on-policy at B, the groups whose rewards are all equal
        dropped and generated again) as buffer dynamic, N = B = R; another buffer asked for by name is refused in
        one line."""
        asked = overrides.pop("buffer", None)
        if asked not in (None, "fifo", "dynamic"):  # fifo: the trainer's default, not a choice against the answer
            raise ValueError(f"the optimal --json output answers dynamic sampling at B = {data.get('batch_size')} "
                             f"(drop the groups whose rewards are all equal and generate again, each rollout used "
                             f"once), which buffer {asked} does not run: leave the buffer at its default or give "
                             f"buffer dynamic")
        require_integer("batch_size", data.get("batch_size"), 1, whole_floats=True)
        b = int(data["batch_size"])
        note = (f"dynamic sampling run as buffer dynamic: generation batches of R = B = {b} until B rollouts have "
                f"unequal group rewards, each trained once; a refill's prompts are drawn uniformly by the trainer")
        return cls(capacity=b, batch_size=b, rollouts_per_step=b, buffer="dynamic", notes=(note,), **overrides)

    @classmethod
    def _epochs_answer(cls, data: Mapping[str, Any], overrides: dict[str, Any]) -> "ReplayConfig":
        """An epochs answer (``regime`` epochs: e passes over m mini-batches of each generation of R, B = R / m) as
        buffer epochs, its e and m from the answer; a FIFO of N = R would generate R every update instead. Another
        buffer asked for by name is refused in one line."""
        asked = overrides.pop("buffer", None)
        if asked not in (None, "fifo", "epochs"):  # fifo: the trainer's default, not a choice against the answer
            raise ValueError(f"the optimal --json output answers epochs over mini-batches (epochs = "
                             f"{data.get('epochs')}, mini_batches = {data.get('mini_batches')}), which buffer "
                             f"{asked} does not run: leave the buffer at its default or give buffer epochs")
        for key in ("epochs", "mini_batches", "rollouts_per_step"):
            require_integer(key, data.get(key), 1, whole_floats=True)
        e, m, r = int(data["epochs"]), int(data["mini_batches"]), int(data["rollouts_per_step"])
        design = {**dict(overrides.pop("design", None) or {}), "epochs": e, "mini_batches": m}
        design.pop("epoch_shuffle", None)  # TRL keeps one order per generation: the trainer's only order
        note = (f"epochs over mini-batches run as buffer epochs: e = {e} passes over m = {m} mini-batches of each "
                f"generation of R = {r} (TRL num_iterations = {e}, steps_per_generation = {m})")
        return cls(capacity=r, batch_size=r // m, rollouts_per_step=r, buffer="epochs", design=design,
                   notes=(note,), **overrides)


#: The fields of ``optimal --json`` a design is read from, by kind: sizes are integers >= 1, the rule's inputs
#: finite and > 0, each null where optimal leaves it out.
_DESIGN_SIZES = ("capacity", "buffer_size", "batch_size", "rollouts_per_step")
_DESIGN_POSITIVE = ("b_noise", "mu")


def _check_design(data: Mapping[str, Any]) -> None:
    """Every field the design is read from, checked before any is used (a hand-edited or damaged file gives one
    line naming the field, not a run of N = -50)."""
    from ..theory.design import CONVENTIONS

    for key in _DESIGN_SIZES:
        if data.get(key) is not None:
            require_integer(key, data[key], 1, note=" (or null)", whole_floats=True)
    for key in _DESIGN_POSITIVE:
        if data.get(key) is not None:
            require_number(key, data[key], above=0, finite=True, note=" (or null)")
    if data.get("convention") is not None:
        require_one_of("convention", data["convention"], CONVENTIONS)
    if data.get("objective") == "noise-scale" and data.get("batch_size") is not None and data.get("mu") is None:
        raise ValueError("mu is missing: the noise-scale design needs the mu it was priced at")


def _load_json(source: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    text = str(source)
    if isinstance(source, Path) or not text.lstrip().startswith("{"):
        text = Path(source).read_text(encoding="utf-8-sig")  # a byte-order mark is no reason to refuse a file
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the optimal --json output must be one JSON object")
    return data
