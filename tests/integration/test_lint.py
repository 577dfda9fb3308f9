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
