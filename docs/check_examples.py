"""Run the examples a markdown file shows and check that they print what it says: ``python docs/check_examples.py
[--only fast] README.md docs/*.md``.

Why here: it checks the docs, so it lives with them, outside the installed package (``docs/`` is no package);
``.ci/run`` runs it on the fast examples, and tests/integration/test_doc_examples.py runs it on a fixture.

What it checks: a fenced ``console`` block right after ``<!-- example -->``, ``<!-- example: fast -->`` or
``<!-- example: slow -->`` (``--only fast`` runs CI's); ``$ `` lines are commands (a trailing backslash continues
one), run with ``bash`` in one fresh temporary folder per markdown file, with this Python's ``bin`` first on PATH;
the lines after a command are what it prints (stdout and stderr together).  A non-zero exit fails the example unless
the comment says ``<!-- example: fast, exit 2 -->``.  Output is compared line by line, exactly, except that ``~12``
in the doc matches any number (wall-clock times), a line ``...`` matches any number of lines, and trailing
whitespace is ignored.  The first difference of each example is reported with the doc's file and line; exit code 1
when any example differs.  In full: docs/CONTRIBUTING.md, 'Examples in the docs'.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MARK = re.compile(r"^<!--\s*example(?::\s*(?P<opts>[^>]*?))?\s*-->\s*$")
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
ANY_NUMBER = re.compile(r"~(" + NUMBER + r")")


@dataclass
class Command:
    text: str  # as the shell gets it (continuation lines joined)
    line: int  # 1-based line of the "$ " in the markdown file
    expected: list[tuple[int, str]] = field(default_factory=list)  # (line in the file, expected output line)


@dataclass
class Example:
    path: Path
    line: int  # the fence's line
    speed: str  # fast, slow or "" (unmarked)
    exit_code: int
    commands: list[Command]


def parse(path: Path) -> list[Example]:
    """The marked console blocks of a markdown file."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    examples, i = [], 0
    while i < len(lines):
        mark = MARK.match(lines[i].strip())
        if not mark or i + 1 >= len(lines) or not lines[i + 1].strip().startswith("```console"):
            i += 1
            continue
        opts = [o.strip() for o in (mark.group("opts") or "").split(",") if o.strip()]
        speed = next((o for o in opts if o in ("fast", "slow")), "")
        code = next((int(o.split()[1]) for o in opts if o.startswith("exit ")), 0)
        start, i = i + 2, i + 2
        commands: list[Command] = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            text = lines[i]
            if text.startswith("$ "):
                command, first = text[2:], i + 1
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1] + "\n" + lines[i]
                commands.append(Command(command, first))
            elif commands:
                commands[-1].expected.append((i + 1, text))
            i += 1
        examples.append(Example(path, start, speed, code, commands))
        i += 1
    return examples


def _matches(expected: str, got: str) -> bool:
    """One expected line against one printed line: exact, but a ``~number`` matches any number."""
    expected, got = expected.rstrip(), got.rstrip()
    if "~" not in expected:
        return expected == got
    pattern = "".join(NUMBER if k % 2 else re.escape(part)
                      for k, part in enumerate(ANY_NUMBER.split(expected)))
    return re.fullmatch(pattern, got) is not None


def compare(expected: list[tuple[int, str]], got: list[str]) -> tuple[int, str, str] | None:
    """None when ``got`` is what the doc shows; else (doc line, expected text, printed text) of the first
    difference. ``...`` lines match any run of lines (the shortest that lets the rest match)."""

    def walk(e: int, g: int) -> tuple[int, str, str] | None:
        while e < len(expected):
            line, text = expected[e]
            if text.strip() == "...":
                first = None
                for skip in range(g, len(got) + 1):
                    found = walk(e + 1, skip)
                    if found is None:
                        return None
                    first = first or found
                return first
            if g >= len(got):
                return line, text, "(no more output)"
            if not _matches(text, got[g]):
                return line, text, got[g]
            e, g = e + 1, g + 1
        if g < len(got):
            return expected[-1][0] if expected else 0, "(end of the doc's output)", got[g]
        return None

    return walk(0, 0)


def run(paths: list[Path], only: str | None = None, out=sys.stdout) -> int:
    """Run every example of ``paths`` (only those marked ``only``); print one line per example; 1 if any differs."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    failed = checked = 0
    for path in paths:
        examples = [e for e in parse(path) if only is None or e.speed == only]
        if not examples:
            continue
        with tempfile.TemporaryDirectory(prefix="doc-examples-") as cwd:
            for example in examples:
                checked += 1
                problem = None
                for command in example.commands:
                    done = subprocess.run(["bash", "-c", command.text], cwd=cwd, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    if done.returncode != example.exit_code:
                        problem = (f"{path}:{command.line}: `{command.text}` exited {done.returncode}, the doc "
                                   f"expects {example.exit_code}; it printed: {done.stdout.strip()[-300:]}")
                        break
                    diff = compare(command.expected, done.stdout.splitlines())
                    if diff is not None:
                        line, want, got = diff
                        problem = (f"{path}:{line}: `{command.text}` printed\n    {got}\n  where the doc has\n    "
                                   f"{want}")
                        break
                if problem is None:
                    print(f"ok   {path}:{example.line} ({len(example.commands)} command(s))", file=out)
                else:
                    failed += 1
                    print(f"FAIL {problem}", file=out)
    print(f"{checked - failed} of {checked} example(s) print what the docs say", file=out)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="markdown files")
    parser.add_argument("--only", choices=("fast", "slow"), help="run only the examples marked so")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    return run(args.paths, args.only)


if __name__ == "__main__":
    sys.exit(main())
