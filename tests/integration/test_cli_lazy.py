"""Lazy command registration (issue 24): `optimal` and the root help import only what they need, and the root help
written from cli/app.py's COMMANDS table is the help typer would write from the loaded commands, at every width."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.core import TyperCommand, TyperGroup

from replay_theory.cli.app import COMMANDS, app, load_family, valid_range

HEAVY = ("scipy", "sympy", "matplotlib", "torch", "joblib", "pandas", "pyarrow", "transformers")
LIBRARY_PARTS = ("core", "simulate", "experiments", "validate", "diagnose", "integrations", "figures")


def _modules_after(args: list[str]) -> tuple[str, list[str]]:
    """(stdout, sorted sys.modules) of `replay-theory ARGS` run in a fresh interpreter."""
    code = ("import json, sys\nfrom replay_theory.cli.app import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(json.dumps(sorted(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout, json.loads(result.stderr)


def test_optimal_imports_only_the_theory_it_uses():
    out, modules = _modules_after(["optimal", "--mu", "5.28"])
    assert any(line.startswith("what to do: stay on-policy at your batch until you have measured b = B_noise / B")
               for line in out.splitlines()[:2])  # the actionable line first (after a verdict line, if any)
    assert sorted({m.split(".")[0] for m in modules} & set(HEAVY)) == []  # the default rule needs numpy only
    assert "pydantic" not in modules  # typer's value conversion, replaced for plain values (cli/plain_values.py)
    ours = [m for m in modules if m.startswith("replay_theory.")]
    assert [m for m in ours if m.split(".")[1] in LIBRARY_PARTS] == []
    assert [m for m in ours if m.startswith("replay_theory.cli.")] == [
        "replay_theory.cli.app", "replay_theory.cli.common", "replay_theory.cli.config_options",
        "replay_theory.cli.plain_values",
        "replay_theory.cli.theory_cmds"]  # its options come from advise.optimal.OptimalQuery's fields


def test_root_help_imports_no_command_module():
    out, modules = _modules_after(["--help"])
    assert out.startswith("Usage: replay-theory [OPTIONS] COMMAND [ARGS]...")
    assert [line.split()[0] for line in out.split("Commands:\n")[1].splitlines()] == list(COMMANDS)
    assert [m for m in modules if m.startswith("replay_theory")] == [
        "replay_theory", "replay_theory.cli", "replay_theory.cli.app", "replay_theory.cli.common",
        "replay_theory.cli.plain_values",
        "replay_theory.outputs"]  # outputs: the strict-JSON and no-overwrite rules, standard library only
    assert "numpy" not in modules and "pydantic" not in modules


def test_each_family_registers_exactly_its_table_entries():
    for module in dict.fromkeys(entry.module for entry in COMMANDS.values()):
        assert list(load_family(module)) == [name for name, entry in COMMANDS.items() if entry.module == module]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_table_summary_is_the_commands_own_short_help_at_every_width(name):
    command = typer.main.get_command(app).commands[name]  # imports the family
    words = COMMANDS[name].help.split()
    assert command.help.split("\n\n")[0].split()[:len(words)] == words  # the first words of its own help
    stand_in = TyperCommand(name, help=COMMANDS[name].help)
    assert not command.hidden and command.short_help is None
    for limit in range(1, 400):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), limit


@pytest.mark.parametrize("width", [40, 60, 80, 100, 200])
def test_root_help_equals_typers_help_of_the_loaded_commands(width):
    group = typer.main.get_command(app)
    ctx = typer.Context(group, info_name="replay-theory", terminal_width=width, max_content_width=width)
    lazy, eager = ctx.make_formatter(), ctx.make_formatter()
    group.format_commands(ctx, lazy)
    TyperGroup.format_commands(group, ctx, eager)  # typer's own: loads every command and asks it
    assert lazy.getvalue() == eager.getvalue() and lazy.getvalue().count("\n") == len(COMMANDS) + 1


def test_valid_range_is_the_range_the_commands_field_states():
    commands = typer.main.get_command(app).commands
    assert {name: valid_range(name, commands["calibrate-simulator"]) for name in
            ("checkpoints", "samples", "noise_groups", "kappa_pairs", "capacity")} == {
        "checkpoints": "an integer >= 1", "samples": "an integer >= 1, a multiple of --group-size",
        "noise_groups": "an integer >= 2", "kappa_pairs": "an integer >= 0", "capacity": None}  # from the fields
    assert valid_range("jobs", commands["sweep"]) == valid_range("jobs", commands["experiment"]) == (
        "-1 (all cores) or an integer >= 1")
    assert valid_range("no_such_option") is None
    optimal = typer.main.get_command(app).commands["optimal"]  # built from advise.optimal.OptimalQuery
    assert valid_range("kappa", optimal) == "a finite number >= 1e-09 (the optimizer's memory, 1/kappa steps)"
    assert valid_range("max_horizon", optimal) == "an integer in [1, 4096]"
    assert valid_range("kappa") is None and valid_range("json", optimal) is None


def test_a_value_typer_rejects_names_the_range_its_field_states(error_line):
    assert error_line("optimal", "--mu", "abc").endswith("(valid: a number in [0.0001, 10000] (a ratio of two costs))")
    assert error_line("optimal", "--mu", "5", "-B", "1.5").endswith("(valid: an integer in [1, 10000000])")
    assert error_line("gamma", "-W", "x", "-T", "1", "--mu", "1").endswith("(valid: a finite number > 0)")


def test_unknown_command_is_one_line_with_a_suggestion(error_line):
    assert error_line("optimall", "--mu", "5") == "No such command 'optimall'. Did you mean 'optimal'?"
    assert error_line("validate", "verfy") == "No such command 'verfy'. Did you mean 'verify'?"
