"""ruff (configured in pyproject.toml) finds nothing: the codebase stays clean for the next contributor."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                                     capture_output=True).returncode != 0,
                    reason="ruff is in the test extra")
def test_ruff_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT), "--output-format", "json"],
                         capture_output=True, text=True, cwd=ROOT)
    findings = json.loads(out.stdout or "[]")
    assert [f"{f['filename']}:{f['location']['row']} {f['code']}" for f in findings] == []
