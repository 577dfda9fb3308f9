"""The replay design a trainer runs: N, B, R, the buffer design and the off-policy correction (no torch).

Paper: experience-replay (docs/REFERENCES.md), Sec. 3: each step generates R fresh rollouts into a buffer of N and
trains on B; staleness horizon x = N/R, replay ratio y = B/R. Code names -> paper symbols: ``capacity`` N (the
name DesignConfig, SimConfig and the saved results use), ``batch_size`` B, ``rollouts_per_step`` R. Which buffer
designs and losses a trainer can run, and their help, come from the shared registry (``core/designs.py``:
``BUFFER_DESIGNS`` / ``LOSSES`` entries with ``trainer=True``); nothing is listed here. Torch-free, so the command
line checks a design (``trl-replay``) without importing torch; the buffer itself is ``integrations/buffer.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..core import losses
from ..core.designs import (
    BUFFER_DESIGNS,
    LOSSES,
    ClipParams,
    DesignConfig,
    M2POParams,
    RLOOParams,
    check_choice,
    design_field_names,
    loss_aggregation,
)
from ..core.pipeline import age_buckets, fifo_max_age  # the one age bucketing (re-exported)
from ..theory.design import rollout_mu_of_convention
from ..theory.noise_scale import noise_scale_pick

__all__ = ["ReplayConfig", "age_buckets", "fifo_max_age"]

#: The loss parameters a ReplayConfig carries as its own fields (DesignConfig's names; a new loss's parameters go in
#: ``design``, so a loss added to the registry runs in a trainer with no edit here).
_LOSS_FIELDS = ("eps_low", "eps_high", "clip_c", "tau_m2")
#: DesignConfig fields a ReplayConfig sets itself (N, B, R, G, the buffer and the loss): not allowed in ``design``.
_DESIGN_SET_HERE = ("capacity", "batch_size", "rollouts_per_step", "group_size", "buffer", "loss", *_LOSS_FIELDS)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class ReplayConfig:
    """N, B, R and the off-policy correction of a replay run (experience-replay Sec. 3; losses of core/losses.py)."""

    capacity: int
    """N: buffer size in completions; a multiple of the group size (whole groups are stored), >= R."""
    batch_size: int
    """B: completions drawn uniformly with replacement from the buffer for each update."""
    rollouts_per_step: int
    """R: fresh completions generated per update (TRL: per_device_train_batch_size on one process)."""
    loss: str = "grpo"
    """Off-policy correction: a ``LOSSES`` entry of core/designs.py with ``trainer=True`` (its help is there)."""
    eps_low: float = ClipParams.eps_low
    """grpo: ClipParams.eps_low (the ratio is clipped below at 1 - eps_low)."""
    eps_high: float = ClipParams.eps_high
    """grpo: ClipParams.eps_high (the ratio is clipped above at 1 + eps_high; DAPO uses 0.28)."""
    clip_c: float = RLOOParams.clip_c
    """tis: RLOOParams.clip_c (the sequence weight min(c, pi_new / pi_behav), Replay-RLOO Eq. 2)."""
    tau_m2: float = M2POParams.tau_m2
    """m2po: M2POParams.tau_m2 (the second-moment budget tau_M2, M2PO Sec. 5.2)."""
    aggregation: str | None = None
    """How token terms become one loss (core/losses.AGGREGATIONS); None: the loss's own (its LossDesign entry)."""
    buffer: str = "fifo"
    """Buffer design: a ``BUFFER_DESIGNS`` entry of core/designs.py with ``trainer=True`` (its help is there)."""
    design: Mapping[str, Any] = field(default_factory=dict)
    """Other DesignConfig fields of that buffer, e.g. {"delta": 0.2} or {"per_alpha": 0.6, "per_tau": 8.0}; each is
    documented once, on DesignConfig."""
    seed: int = 0
    """Seed of the uniform draws from the buffer (a generator of its own: TRL's RNG streams are left alone)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What ``from_optimal_json`` changed (e.g. N rounded to whole groups)."""

    def __post_init__(self) -> None:
        _positive_int("capacity", self.capacity)
        _positive_int("batch_size", self.batch_size)
        _positive_int("rollouts_per_step", self.rollouts_per_step)
        if self.capacity < self.rollouts_per_step:
            raise ValueError(f"capacity must be >= rollouts_per_step = {self.rollouts_per_step} (the fresh "
                             f"rollouts must fit), got {self.capacity}")
        check_choice("loss", self.loss, LOSSES, trainer=True)
        for name in ("eps_low", "eps_high", "tau_m2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if isinstance(self.clip_c, bool) or not isinstance(self.clip_c, (int, float)) or not self.clip_c > 0:
            raise ValueError(f"clip_c must be > 0, got {self.clip_c!r}")
        check_choice("buffer", self.buffer, BUFFER_DESIGNS, trainer=True)
        if self.buffer == "on-policy" and self.batch_size != self.rollouts_per_step:
            raise ValueError(f"batch_size must equal rollouts_per_step = {self.rollouts_per_step} on-policy (every "
                             f"rollout trained once), got {self.batch_size}")
        unknown = sorted(set(self.design) - set(design_field_names()))
        if unknown:
            raise ValueError(f"design has unknown field(s) {', '.join(unknown)}; DesignConfig's fields are "
                             f"{', '.join(k for k in design_field_names() if k not in _DESIGN_SET_HERE)}")
        clash = sorted(set(self.design) & set(_DESIGN_SET_HERE))
        if clash:
            raise ValueError(f"design sets {', '.join(clash)}, which ReplayConfig sets itself: leave "
                             f"{'it' if len(clash) == 1 else 'them'} out of design")
        if self.aggregation is not None and self.aggregation not in losses.AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {', '.join(losses.AGGREGATIONS)}, got {self.aggregation!r}")

    def design_config(self, group_size: int) -> DesignConfig:
        """The shared registry's DesignConfig of this replay design (N, B, R, G, buffer, loss and ``design``)."""
        return DesignConfig(buffer=self.buffer, capacity=self.capacity, batch_size=self.batch_size,
                            rollouts_per_step=self.rollouts_per_step, group_size=group_size, loss=self.loss,
                            **{k: getattr(self, k) for k in _LOSS_FIELDS}, **dict(self.design))

    def loss_config(self) -> DesignConfig:
        """The DesignConfig the registry's loss reads: the loss, its parameters and ``design``'s (sizes unread)."""
        return DesignConfig(loss=self.loss, **{k: getattr(self, k) for k in _LOSS_FIELDS}, **dict(self.design))

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
        if "capacity" not in data and "buffer_size" in data:  # optimal --json before capacity was its name for N
            data["capacity"] = data["buffer_size"]
        notes: list[str] = []
        if data.get("objective") == "forgetting" and not data.get("measured"):  # the default rule's answer
            raise ValueError("the optimal --json output has no design: run `replay-theory optimal` with the noise "
                             "scale (--noise-scale or --profile) and -B (batch size)")
        if data.get("objective") == "noise-scale":  # N = R at fixed B (cli/theory_cmds.py)
            if data.get("batch_size") is None or data.get("b_noise") is None:
                raise ValueError("the optimal --json output has no design: run `replay-theory optimal` with the "
                                 "noise scale (--noise-scale or --profile) and -B (batch size)")
            if group_size is not None:  # R in whole groups, by the rule's own cost
                _positive_int("group_size", group_size)
                mu = rollout_mu_of_convention(data["mu"], data.get("convention", "rollout-cost"))
                pick = noise_scale_pick(data["b_noise"], data["batch_size"], group_size, mu)
                if pick["R"] != data["rollouts_per_step"]:
                    notes.append(f"R = N = {data['rollouts_per_step']} of the rule rounded to {pick['R']}, whole "
                                 f"groups of {group_size} (the cheaper neighbour by the rule's cost; regime "
                                 f"{pick['regime']})")
                data["capacity"] = data["rollouts_per_step"] = pick["R"]
        missing = [k for k in ("capacity", "batch_size", "rollouts_per_step") if data.get(k) is None]
        if missing and data.get("regime") == "unbounded":  # the objective still fell at the last measured staleness
            raise ValueError("the design is unbounded (the objective still falls at the largest staleness the profile "
                             f"measured): there is no capacity to read; choose N = x R by hand with x at most the "
                             f"profile's last staleness + 1, B = {data.get('batch_size')}, or measure sigma^2(s) "
                             "further out")
        if missing:
            raise ValueError(f"the optimal --json output has no {', '.join(missing)}: run `replay-theory optimal` "
                             "with -R (rollouts per step) or -B (batch size) to get an integer design")
        n, b, r = (int(data[k]) for k in ("capacity", "batch_size", "rollouts_per_step"))  # whole (_check_design)
        if group_size is not None:
            _positive_int("group_size", group_size)
            if r % group_size:
                raise ValueError(f"rollouts_per_step = {r} from the design is not a multiple of group_size = "
                                 f"{group_size}: rerun `replay-theory optimal` with -R a multiple of {group_size}")
            rounded = max(r, group_size * round(n / group_size))
            if rounded != n:
                notes.append(f"capacity {n} rounded to {rounded}, a whole number of groups of {group_size}")
                n = rounded
        return cls(capacity=n, batch_size=b, rollouts_per_step=r, notes=tuple(notes), **overrides)


#: The fields of ``optimal --json`` a design is read from, by kind: sizes are whole numbers >= 1, the rule's inputs
#: finite and > 0, each null where optimal leaves it out.
_DESIGN_SIZES = ("capacity", "buffer_size", "batch_size", "rollouts_per_step")
_DESIGN_POSITIVE = ("b_noise", "mu")


def _check_design(data: Mapping[str, Any]) -> None:
    """Every field the design is read from, checked before any is used (a hand-edited or damaged file gives one
    line naming the field, not a run of N = -50)."""
    from ..theory.design import CONVENTIONS

    for key in _DESIGN_SIZES:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value != int(value) or value < 1):
            raise ValueError(f"{key} must be a whole number >= 1 (or null), got {value!r}")
    for key in _DESIGN_POSITIVE:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{key} must be a finite number > 0 (or null), got {value!r}")
    if data.get("convention") is not None and data["convention"] not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {data['convention']!r}")
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
