"""README.md is a newcomer's page and the docs' examples are checkable (issue 32): at most 200 lines, none over 300
characters; the two set-up commands as CI reads them (.ci/run takes the test command from the block after "Install
the test extras, then run the tests:"); the CPU torch line; every console block of README.md and docs/*.md marked for
docs/check_examples.py; every relative link of README.md and docs/*.md pointing at a file that exists."""

from __future__ import annotations

import re

import pytest

MARK = re.compile(r"^<!--\s*example(?::\s*[^>]*?)?\s*-->\s*$")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _docs(repo_root):
    return [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]


def test_readme_fits_a_first_read(repo_root):
    lines = (repo_root / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    long = [(number, len(line)) for number, line in enumerate(lines, 1) if len(line) > 300]
    assert long == []


def test_readme_gives_the_two_set_up_commands_and_the_cpu_torch_line(repo_root):
    text = (repo_root / "README.md").read_text(encoding="utf-8")
    main = re.search(r"Install, then run the main job:\s*```bash\n(.+?)\n```", text, re.S)
    tests = re.search(r"Install the test extras, then run the tests:\s*```(?:bash)?\n(.+?)\n```", text, re.S)
    assert main and main.group(1).strip() == "pip install . && replay-theory optimal --mu 5.28"
    assert tests and tests.group(1).strip() == 'pip install -e ".[test]" && python -m pytest'
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in text


@pytest.mark.parametrize("name", ["README.md", "docs/OPTIMAL.md", "docs/DIAGNOSE.md", "docs/TRL.md", "docs/VERL.md",
                                  "docs/COMMANDS.md"])
def test_every_console_block_is_a_marked_example(repo_root, name):
    path = repo_root / name
    lines = path.read_text(encoding="utf-8").splitlines()
    unmarked = [number for number, line in enumerate(lines, 1) if line.strip().startswith("```console")
                and not (number >= 2 and MARK.match(lines[number - 2].strip()))]
    assert unmarked == [], f"{name}: console blocks without <!-- example: fast|slow --> at lines {unmarked}"
    assert any(line.strip().startswith("```console") for line in lines), f"{name} shows no example"


def test_relative_links_point_at_files(repo_root):
    missing = []
    for path in _docs(repo_root):
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(repo_root)} -> {target}")
    assert missing == []
