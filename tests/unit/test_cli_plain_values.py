"""cli/plain_values.py: every value it converts is the value typer's own (pydantic) conversion returns, of the same
type; the values ``optimal`` takes are all converted there; any other value gets typer's conversion and message."""

import itertools
import random

import pytest
import typer
import typer.main
from typer.models import OptionInfo

from replay_theory.cli.app import app
from replay_theory.cli.config_options import parse_bool
from replay_theory.cli.plain_values import UNDECIDED, PlainValues, plain_value

adapters = pytest.importorskip("typer._adapters")  # a typer that converts through pydantic (0.29)

TEXTS = ["5.28", "+5.28", "-5", ".5", "5.", "1e5", "1E-3", "-0", "0005.2", "007", "+0", "64", "4096", "4097", "0",
         "1e400", "9" * 30, " 5", "5 ", "1_0", "inf", "-inf", "nan", "0x10", "\uff11\uff12", "", "e5", "1e", "1.5.2",
         "abc", "true", "forgetting"]
VALUES = [None, 0, 1, 64, -3, 2.0, 0.0, 5.28, float("inf"), float("nan"), True, False, 10 ** 20, "x", b"5"]
INFOS = [OptionInfo(), OptionInfo(min=1), OptionInfo(min=0, max=4096), OptionInfo(min=1e-9),
         OptionInfo(min=1, clamp=True), OptionInfo(parser=parse_bool)]


def _fuzz(count: int = 3000) -> list[str]:
    chars = "0123456789+-.eE _xin"
    rng = random.Random(39)
    return ["".join(rng.choice(chars) for _ in range(rng.randint(1, 7))) for _ in range(count)]


def _typers(value, annotation, info):
    try:
        return adapters.build_adapter(annotation, info).validate_python(value)
    except Exception as err:  # noqa: BLE001 - the test compares outcomes, a refusal included
        return err


@pytest.mark.parametrize("annotation", [int, float, str, bool])
def test_every_value_converted_here_is_typers_value_of_typers_type(annotation):
    decided = 0
    for info, value in itertools.product(INFOS, TEXTS + VALUES + _fuzz()):
        if value is None:
            continue  # typer's runtime parameter answers None itself, before converting
        ours = plain_value(value, annotation, info)
        if ours is UNDECIDED:
            continue
        decided += 1
        theirs = _typers(value, annotation, info)
        assert not isinstance(theirs, Exception), (annotation, info.min, value)
        assert (type(ours), repr(ours)) == (type(theirs), repr(theirs)), (annotation, info.min, value)
    assert decided > 0


def test_the_values_optimal_takes_are_converted_here():
    assert plain_value("5.28", float, OptionInfo()) == 5.28 and plain_value("-7", int, OptionInfo()) == -7
    assert plain_value("64", int, OptionInfo(min=1)) == 64 and plain_value(2.0, float, OptionInfo()) == 2.0
    assert plain_value("forgetting", str, OptionInfo()) == "forgetting"
    assert plain_value("off", str, OptionInfo(parser=parse_bool)) is False
    for value, annotation, info in [("abc", float, OptionInfo()), ("1.5", int, OptionInfo()),
                                    ("0", int, OptionInfo(min=1)), ("inf", float, OptionInfo()),
                                    ("maybe", str, OptionInfo(parser=parse_bool)), ("5", bool, OptionInfo())]:
        assert plain_value(value, annotation, info) is UNDECIDED  # typer's conversion, and its message


def test_optimal_and_the_root_convert_all_their_values_here():
    root = typer.main.get_command(app)
    optimal = root.commands["optimal"]
    with root.make_context("replay-theory", ["optimal"]) as parent:
        with optimal.make_context("optimal", ["--mu", "5.28", "-B", "64", "--objective", "paper"],
                                  parent=parent) as ctx:
            assert ctx.params["mu"] == 5.28 and ctx.params["batch_size"] == 64
            converted = [p.name for p in (*root.get_params(parent), *optimal.get_params(ctx))
                         if not isinstance(p._runtime_param, PlainValues)]
    assert converted == []  # none took typer's (pydantic) conversion: no value needed it


def test_a_value_not_plain_gets_typers_conversion_and_message():
    optimal = typer.main.get_command(app).commands["optimal"]
    with pytest.raises(typer.BadParameter, match="Input should be a valid number, unable to parse string as a number"):
        optimal.make_context("optimal", ["--mu", "abc"])
    mu = next(p for p in optimal.params if p.name == "mu")
    assert not isinstance(mu._runtime_param, PlainValues)  # typer's own, kept from then on
