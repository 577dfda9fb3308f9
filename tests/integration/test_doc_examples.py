"""docs/check_examples.py on a small markdown file: the examples a doc shows are run as written and their printed
lines compared with the doc's, times marked ``~`` and elided lines ``...`` aside (the README's checker, issue 32)."""

from __future__ import annotations

import importlib.util
import io
import sys

import pytest

DOC = """# A doc

Text, and a block that is no example (no mark):

```console
$ false
```

<!-- example: fast -->
```console
$ printf 'reward: 0.215 -> 0.298\\ntrained 40 steps in 75 s\\n'
reward: 0.215 -> 0.298
trained 40 steps in ~12 s
$ echo 1 > kept.txt && cat kept.txt
1
```

<!-- example: fast -->
```console
$ cat kept.txt && seq 1 5
1
...
5
```

<!-- example: fast -->
```console
$ replay-theory gamma -W 6 -T 2 --mu 6.84
{gamma}
```

<!-- example: fast, exit 2 -->
```console
$ replay-theory gamma -W 0 -T 2 --mu 6.84
{refusal}
```

<!-- example: slow -->
```console
$ echo slow
slow
```
"""


@pytest.fixture(scope="module")
def checker(repo_root):
    spec = importlib.util.spec_from_file_location("check_examples", repo_root / "docs" / "check_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _doc(tmp_path, cli, changes=()):
    # the doc shows what the CLI prints today (run in-process here, by the checker in a shell)
    code, gamma, _ = cli("gamma", "-W", "6", "-T", "2", "--mu", "6.84")
    assert code == 0 and gamma.strip()
    code, _, refusal = cli("gamma", "-W", "0", "-T", "2", "--mu", "6.84")
    assert code == 2 and refusal.startswith("replay-theory: error: ")
    text = DOC.format(gamma=gamma.rstrip("\n"), refusal=refusal.rstrip("\n"))
    for old, new in changes:
        assert text.count(old) == 1
        text = text.replace(old, new)
    path = tmp_path / "doc.md"
    path.write_text(text)
    return path


def test_the_fast_examples_print_what_the_doc_says(checker, tmp_path, cli):
    out = io.StringIO()
    path = _doc(tmp_path, cli)
    assert checker.run([path], only="fast", out=out) == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    text = path.read_text().splitlines()
    fences = [i + 2 for i, line in enumerate(text) if line.startswith("<!-- example: fast")]  # 1-based, after it
    commands = [2, 1, 1, 1]
    assert lines == [f"ok   {path}:{line} ({n} command(s))" for line, n in zip(fences, commands)] + \
        ["4 of 4 example(s) print what the docs say"]  # the unmarked and the slow block not run
    assert checker.run([path], out=io.StringIO()) == 0  # all marked examples, the slow one too


def test_a_changed_number_is_reported_with_its_line(checker, tmp_path, cli):
    path = _doc(tmp_path, cli, [("0.298\ntrained", "0.374\ntrained")])  # the doc's line, not the command
    out = io.StringIO()
    assert checker.run([path], only="fast", out=out) == 1
    report = out.getvalue().splitlines()
    assert report[0] == (f"FAIL {path}:12: `printf 'reward: 0.215 -> 0.298\\ntrained 40 steps in 75 s\\n'` "
                         "printed")
    assert report[1:4] == ["    reward: 0.215 -> 0.298", "  where the doc has", "    reward: 0.215 -> 0.374"]
    # the next example reads kept.txt, which the failed one never wrote: it fails too (examples share a folder)
    assert report[4].startswith(f"FAIL {path}:") and "`cat kept.txt && seq 1 5` exited 1" in report[4]
    assert report[-1] == "2 of 4 example(s) print what the docs say"


def test_an_unexpected_exit_code_fails_its_example(checker, tmp_path):
    path = tmp_path / "doc.md"
    path.write_text("<!-- example: fast -->\n```console\n$ echo out; exit 3\nout\n```\n")
    out = io.StringIO()
    assert checker.run([path], out=out) == 1
    assert out.getvalue().splitlines()[0] == (f"FAIL {path}:3: `echo out; exit 3` exited 3, the doc expects 0; it "
                                              "printed: out")


def test_comparison_rules_by_hand(checker):
    compare = checker.compare
    assert compare([(1, "in ~1.5 s")], ["in 12 s"]) is None  # ~number: any number
    assert compare([(1, "in ~1.5 s")], ["in twelve s"]) == (1, "in ~1.5 s", "in twelve s")
    assert compare([(1, "a"), (2, "..."), (3, "z")], ["a", "b", "c", "z"]) is None
    assert compare([(1, "a"), (2, "...")], ["a"]) is None  # ... may match nothing
    assert compare([(1, "a")], ["a", "extra"]) == (1, "(end of the doc's output)", "extra")
    assert compare([(1, "a"), (2, "b")], ["a"]) == (2, "b", "(no more output)")
