"""cli/config_options.py: typer options from a config dataclass (help = field docstring, inherited fields,
booleans typer-style), and each command family runnable on its own."""

import dataclasses
import json
from typing import Optional

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from replay_theory.cli import simulate_cmds, theory_cmds, validate_cmds
from replay_theory.cli.config_options import field_docs, parse_bool, with_field_options
from replay_theory.simulate.config import SimConfig


@dataclasses.dataclass(frozen=True)
class Base:
    width: int = 3
    """Width of the thing."""
    shared: float = 1.0
    """Base help of shared."""


@dataclasses.dataclass(frozen=True)
class Child(Base):
    shared: float = 2.0
    """Child help of shared."""
    flag: bool = True
    """A switch."""
    label: Optional[str] = None
    """An optional label."""


def _toy_app():
    seen = []

    @with_field_options(Child, aliases={"width": ("-w",)})
    def toy(fields: dict, verbose: bool = False) -> None:
        """Toy command."""
        seen.append((fields, verbose))

    app = typer.Typer()
    app.command("toy")(toy)
    app.command("other")(lambda: None)  # two commands: invoked by name, as in the real app
    return app, seen


def test_field_docs_walk_the_mro_subclass_wins():
    assert field_docs(Child) == {"width": "Width of the thing.", "shared": "Child help of shared.",
                                 "flag": "A switch.", "label": "An optional label."}


def test_options_from_fields_with_help_defaults_and_inheritance():
    app, seen = _toy_app()
    command = typer.main.get_command(app).commands["toy"]
    params = {p.name: p for p in command.params}
    assert params["width"].opts == ["--width", "-w"] and params["width"].help == "Width of the thing."
    assert params["shared"].default == 2.0 and params["shared"].help == "Child help of shared."
    assert params["flag"].help == "A switch. (--no-flag: false)" and params["no__flag"].hidden
    runner = CliRunner()
    assert runner.invoke(app, ["toy"]).exit_code == 0
    assert seen[-1] == ({}, False)  # only what was typed: the config's own defaults apply to the rest
    result = runner.invoke(app, ["toy", "-w", "5", "--shared", "inf", "--flag", "False", "--label", "x", "--verbose"])
    assert result.exit_code == 0, result.output
    assert seen[-1] == ({"width": 5, "shared": float("inf"), "flag": False, "label": "x"}, True)
    assert runner.invoke(app, ["toy", "--no-flag"]).exit_code == 0 and seen[-1][0] == {"flag": False}
    assert runner.invoke(app, ["toy", "--flag", "true", "--no-flag"]).exit_code == 2  # contradictory


@pytest.mark.parametrize("word,value", [("true", True), ("False", False), ("1", True), ("0", False), ("YES", True),
                                        ("no", False), ("on", True), ("off", False), ("t", True), ("n", False)])
def test_parse_bool_accepts_clicks_boolean_words(word, value):
    assert parse_bool(word) is value


def test_simulate_help_is_the_first_sentence_of_every_field_docstring():
    # issue 32: --help gives each option one short entry; the whole docstring is in docs/OPTIONS.md
    from replay_theory.cli.config_options import first_sentence, option_help

    app = typer.Typer()
    simulate_cmds.register(app)
    command = typer.main.get_command(app).commands["simulate"]
    params = {p.name: p for p in command.params}
    docs = field_docs(SimConfig)
    for field in dataclasses.fields(SimConfig):
        assert params[field.name].help.startswith(option_help(field, docs[field.name])), field.name
    assert params["batch_size"].opts == ["--batch-size", "--batch"]
    assert params["per_tau"].default == float("inf")
    assert params["buffer"].help == ("Buffer design. One of: on-policy, fifo, positive-bias, prioritized, "
                                     "group-replay, exgrpo, stale-k, epochs, selective, dynamic.")
    assert params["advantage"].help == "grpo, group-mean, leave-one-out or auto."  # the asides are in the doc
    assert params["delta"].help == ("Positive-bias buffer: share of the N slots kept for the freshest correct "
                                    "rollouts, in [0, 1).")  # an interval's bracket is no aside
    assert first_sentence("Sample with replacement (Sec. 3 theory) or not. More.") == \
        "Sample with replacement (Sec. 3 theory) or not."
    assert first_sentence("FreshPER Alg. 1: K updates. Then more.") == "FreshPER Alg. 1: K updates."
    assert first_sentence("`optimal ... -B B --json` saved. More.") == "`optimal ... -B B --json` saved."
    assert command.help.endswith("Every option in full: docs/OPTIONS.md.")


def test_options_doc_is_the_field_docstrings_in_full(repo_root):
    # docs/OPTIONS.md is written from the docstrings --help shortens: regenerate it when a field changes
    from replay_theory.cli.options_doc import options_markdown

    text = (repo_root / "docs" / "OPTIONS.md").read_text(encoding="utf-8")
    assert text == options_markdown(), "run: python -m replay_theory.cli.options_doc > docs/OPTIONS.md"
    assert "| `--buffer` | `'fifo'` | Buffer design. One of: on-policy: no buffer, each rollout trained once" in text


def test_simulate_runs_from_its_own_module(tmp_path):
    """The simulator family alone (no root app): --replacement False, --batch alias and --per-tau inf."""
    app = typer.Typer()
    simulate_cmds.register(app)
    args = ["simulate", "--buffer", "fifo", "--capacity", "64", "--rollouts-per-step", "32", "--batch", "16",
            "--replacement", "False", "--per-tau", "inf", "--steps", "20", "--seeds", "2", "--eval-every", "10",
            "--measure-drift", "no", "--num-prompts", "16", "--json", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["config"]["replacement"] is False and payload["config"]["batch_size"] == 16
    assert payload["config"]["per_tau"] is None  # inf as strict-JSON null
    # sync FIFO, N = 2R: every rollout stays 2 steps, so B/R = 0.5 samples per rollout per step
    assert payload["replay_ratio"] == 0.5 and payload["max_staleness"] == 1


def test_theory_and_validate_families_run_on_their_own():
    app = typer.Typer()
    theory_cmds.register(app)
    result = CliRunner().invoke(app, ["gamma", "-W", "6", "-T", "2", "--mu", "6.84", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["gamma"] == pytest.approx((1 + 3) / 7.84)
    app = typer.Typer()
    validate_cmds.register(app)
    app.command("noop")(lambda: None)
    names = set(typer.main.get_command(app).commands["validate"].commands)
    assert names == {"calibrate-model", "predict", "verify", "all"}
