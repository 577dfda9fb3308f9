"""checks.py: each rule's one message, worked out by hand; and the design rules that go through it."""

import dataclasses
import json
import math

import numpy as np
import pytest

from replay_theory.checks import (
    Range,
    invalid,
    one_of,
    range_of,
    require_in_range,
    require_int,
    require_integer,
    require_nonnegative,
    require_number,
    require_one_of,
    require_open_interval,
    require_unit_interval,
)
from replay_theory.core.buffers import ReplayBuffer, StaleKQueue
from replay_theory.core.designs import (
    BUFFER_DESIGNS,
    BufferSpec,
    DesignConfig,
    capacity_holds_a_step,
    check_capacity,
    validate_trainer_design,
)
from replay_theory.core.rollouts import RolloutBatch


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_invalid_is_the_one_message_shape():
    assert str(invalid("--mu", "a finite number > 0", -1.0, fmt="g")) == "--mu must be a finite number > 0, got -1"
    assert str(invalid("loss", one_of(["grpo", "tis"]), "ppo")) == "loss must be one of grpo, tis, got 'ppo'"


@pytest.mark.parametrize("value, message", [
    (0, "batch_size must be an integer >= 1, got 0"),
    (2.5, "batch_size must be an integer >= 1, got 2.5"),
    (4.0, "batch_size must be an integer >= 1, got 4.0"),  # a float is not an int unless whole_floats
    (True, "batch_size must be an integer >= 1, got True"),
    ("4", "batch_size must be an integer >= 1, got '4'"),
])
def test_require_integer(value, message):
    assert _message(require_integer, "batch_size", value, 1) == message


def test_require_integer_whole_floats_and_note():
    assert require_integer("capacity", 64.0, 1, whole_floats=True) == 64
    assert _message(require_integer, "capacity", 64.5, 1, note=" (or null)", whole_floats=True) == \
        "capacity must be an integer >= 1 (or null), got 64.5"
    assert _message(require_integer, "capacity", math.inf, 1, whole_floats=True) == \
        "capacity must be an integer >= 1, got inf"
    assert _message(require_integer, "lag_coords", -1, 0, note=" (0: off)") == \
        "lag_coords must be an integer >= 0 (0: off), got -1"


def test_require_number():
    assert require_number("clip_c", math.inf, above=0) == math.inf  # > 0 allows +inf unless finite
    assert _message(require_number, "clip_c", 0, above=0) == "clip_c must be > 0, got 0"
    assert _message(require_number, "eps_high", -0.1, at_least=0) == "eps_high must be >= 0, got -0.1"
    assert _message(require_number, "eps_low", math.nan, at_least=0) == "eps_low must be >= 0, got nan"
    assert _message(require_number, "--lr", math.inf, above=0, finite=True) == \
        "--lr must be a finite number > 0, got inf"
    assert _message(require_number, "mu", True, above=0, finite=True, note=" (or null)") == \
        "mu must be a finite number > 0 (or null), got True"


def test_require_unit_interval_and_one_of():
    assert require_unit_interval("delta", 0.0, closed=False) == 0.0
    assert _message(require_unit_interval, "delta", 1.0, closed=False) == "delta must be in [0, 1), got 1.0"
    assert _message(require_unit_interval, "per_beta_final", 1.5) == "per_beta_final must be in [0, 1], got 1.5"
    assert _message(require_one_of, "buffer", "x", ["fifo", "on-policy"], where=" in a trainer") == \
        "buffer must be one of fifo, on-policy in a trainer, got 'x'"


def test_range_notes_follow_the_range():
    require_in_range("n_held_out", 64, 0, 64)
    assert _message(require_in_range, "n_held_out", 65, 0, 64, note=" (distinct problems)") == \
        "n_held_out must be in [0, 64] (distinct problems), got 65"
    require_nonnegative("values", np.array([0.0, math.inf]), allow_inf=True)
    assert _message(require_nonnegative, "values", np.array([1.0, math.nan]), allow_inf=True,
                    note=" (sum-tree leaves are sampling weights)") == \
        "values must be >= 0 (sum-tree leaves are sampling weights), got nan"


def test_require_open_interval():
    assert require_open_interval("curvature_step", 1e-4, 0, 1) == 1e-4
    assert _message(require_open_interval, "curvature_step", 0.0, 0, 1, note=" (|h w| / |theta|)") == \
        "curvature_step must be in (0, 1) (|h w| / |theta|), got 0.0"
    assert _message(require_open_interval, "level", True, 0, 1, fmt="g") == "level must be in (0, 1), got 1"
    assert require_open_interval("is_cap", 3, 0, math.inf, finite=True) == 3.0
    assert _message(require_open_interval, "is_cap", math.inf, 0, math.inf, finite=True) == \
        "is_cap must be a finite number in (0, inf), got inf"
    assert _message(require_open_interval, "clip_low", math.nan, 0, 1, finite=True) == \
        "clip_low must be a finite number in (0, 1), got nan"


def test_require_int_shows_the_first_bad_element():
    assert require_int("B", np.array([1.0, 2.0]), 1).tolist() == [1, 2]
    assert _message(require_int, "B", np.array([1.0, 0.5]), 1) == "B must be an integer >= 1, got 0.5"


def test_capacity_rule_is_the_registrys():
    assert capacity_holds_a_step(64, 64) and not capacity_holds_a_step(63, 64)
    assert _message(check_capacity, 32, 64) == \
        "capacity must be >= rollouts_per_step = 64 (a FIFO holds at least one step), got 32"
    assert _message(check_capacity, 3, 4, names=("capacity N", "rollouts R")) == \
        "capacity N must be >= rollouts R = 4 (a FIFO holds at least one step), got 3"
    with pytest.raises(ValueError, match="^capacity must be >= rollouts_per_step = 64"):
        DesignConfig(capacity=32).validated_design()
    assert _message(validate_trainer_design, DesignConfig(buffer="on-policy", capacity=64, batch_size=32)) == \
        "batch_size must equal rollouts_per_step = 64 on-policy (every rollout trained once), got 32"


def _batch(S: int, n: int, created: int) -> RolloutBatch:
    z = np.zeros((S, n), np.int64)
    return RolloutBatch(prompt=z, tokens=np.zeros((S, n, 1), np.int64), mask=np.ones((S, n, 1), bool),
                        logp_behav=np.zeros((S, n, 1)), reward=np.zeros((S, n)), advantage=np.zeros((S, n)),
                        created=z + created, group=z)


def test_every_design_buffer_is_a_replay_buffer():
    loss = {"group-replay": "rloo", "exgrpo": "exgrpo"}
    for name, design in BUFFER_DESIGNS.items():
        config = DesignConfig(buffer=name, loss=loss.get(name, "grpo"))
        buffer = None if design.make is None else design.make(config, BufferSpec(num_seeds=2, seq_len=1, num_prompts=4))
        assert buffer is None or isinstance(buffer, ReplayBuffer), name
    queue = StaleKQueue(2, k=2)  # the stale-k queue as a ReplayBuffer: add = push, sample = pop
    for step in range(4):
        queue.add(_batch(2, 3, step), step)
    drawn = queue.sample(3, 3, np.random.default_rng(0))
    assert drawn.batch.created.tolist() == [[1, 1, 1]] * 2 and drawn.staleness.tolist() == [[2, 2, 2]] * 2
    assert drawn.weight.tolist() == [[1.0] * 3] * 2 and drawn.time_since_last_use.tolist() == [[-1] * 3] * 2
    assert queue.evicted_use_counts().size == 0


def test_design_config_from_record_reads_every_saved_shape(cli, optimal_profile):
    # a replay answer needs --optimizer sgd and a staleness table reaching the buffer's oldest sample since the guarded
    # rule (theory/guarded.py, issue 38); its answer here is replay at B = 1048, R = 160, N = 10240 (at b = 2383 the
    # guard, pricing b down to 1/16 of it, keeps the floor rule's on-policy 64)
    code, out, _ = cli("optimal", "--mu", "5.28", "-B", "512", "--profile", optimal_profile(5000.0), "--kappa", "0.2",
                       "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "64", "--json")
    design = DesignConfig.from_record(json.loads(out), group_size=8)
    assert code == 0 and (design.capacity, design.batch_size, design.rollouts_per_step) == (10240, 1048, 160)
    old = {"buffer_size": 512.0, "batch_size": 256, "rollouts_per_step": 64}  # optimal --json before `capacity`
    predicted = {"x_star": 8.0, "y_star": 4.0, "N": 512, "B": 256, "R": 64, "regime": "replay"}  # validate predict
    assert DesignConfig.from_record(old) == DesignConfig.from_record(predicted) == \
        DesignConfig(capacity=512, batch_size=256, rollouts_per_step=64)
    assert DesignConfig.from_record(predicted, buffer="prioritized").buffer == "prioritized"
    assert _message(DesignConfig.from_record, {"N": 512, "B": 256}) == \
        "the record has no rollouts_per_step (one of rollouts_per_step, R)"
    assert _message(DesignConfig.from_record, {"N": 512, "B": 2.5, "R": 64}) == "B must be an integer >= 1, got 2.5"


def _said(check, *args, **kwargs) -> str | None:
    try:
        check(*args, **kwargs)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("valid,legacy", [  # one Range each, and the check it replaced (same words, same values)
    (Range(1, 10_000_000, integer=True), lambda n, v: require_integer(n, v, 1, maximum=10_000_000)),
    (Range(1, integer=True, note=" (0: off)"), lambda n, v: require_integer(n, v, 1, note=" (0: off)")),
    (Range(1e-9, finite=True, fmt="g"), lambda n, v: require_number(n, v, at_least=1e-9, finite=True, fmt="g")),
    (Range(0, low_open=True, finite=True, fmt="g"), lambda n, v: require_number(n, v, above=0, finite=True, fmt="g")),
    (Range(0, 1e7, note=" (rollouts)", fmt="g"), lambda n, v: require_in_range(n, v, 0, 1e7, note=" (rollouts)",
                                                                               fmt="g")),
    (Range(choices={"sgd": "", "adam": ""}), lambda n, v: require_one_of(n, v, ("sgd", "adam"))),
])
@pytest.mark.parametrize("value", [0, 1, 5, 2.5, -3, 1e-10, 1e8, 10_000_001, math.nan, math.inf, "sgd", "x"])
def test_range_check_says_what_the_check_it_replaced_says(valid, legacy, value):
    if isinstance(value, str) != (valid.choices is not None):
        return  # a name for a number (or a number for a name): typer's type refuses it first
    assert _said(valid.check, "--x", value) == _said(legacy, "--x", value)


def test_range_text_and_choices():
    assert Range(1, 4096, integer=True).text == "an integer in [1, 4096]"
    assert Range(0, 1, high_open=True, noun="a number").text == "a number in [0, 1)"
    assert Range(1, integer=True, special={-1: "all cores"}).text == "-1 (all cores) or an integer >= 1"
    assert Range(1, integer=True, special={-1: "all cores"}).check("--jobs", -1) == -1
    assert _said(Range(0, integer=True).check, "n", True) == "n must be an integer >= 0, got True"  # not a bool
    assert Range(0, integer=True, noun="comma-separated integers").holds((0, 2, 4))
    named = Range(choices=lambda: {"a": "first", "b": "second"})
    assert named.named() == {"a": "first", "b": "second"} and named.text == "one of a, b"
    assert range_of(dataclasses.field(metadata=named.field())) is named
