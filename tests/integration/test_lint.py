"""ruff (configured in pyproject.toml) finds nothing: the codebase stays clean for the next contributor."""

import json
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                                     capture_output=True).returncode != 0,
                    reason="ruff is in the test extra")
def test_ruff_finds_nothing(repo_root):
    out = subprocess.run([sys.executable, "-m", "ruff", "check", str(repo_root), "--output-format", "json"],
                         capture_output=True, text=True, cwd=repo_root)
    findings = json.loads(out.stdout or "[]")
    assert [f"{f['filename']}:{f['location']['row']} {f['code']}" for f in findings] == []


def test_no_user_facing_text_pins_the_ci_torch(repo_root):
    # `pip install torch==2.13.0` is the CPU wheel only on the CI machine's local index; for a user it is PyPI's CUDA
    # build. Only .ci/run may say it: the package, the docs and the README give PyTorch's CPU index instead.
    offenders = []
    for path in sorted(repo_root.rglob("*")):
        parts = path.relative_to(repo_root).parts
        if path.suffix not in (".py", ".md") or parts[0].startswith(".") or parts[0] in ("tests", "build"):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "install torch==" in line or "install \"torch==" in line:
                offenders.append(f"{path.relative_to(repo_root)}:{number}")
    assert offenders == []
