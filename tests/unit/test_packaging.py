"""pyproject.toml ships every package of the tree: a sub-package missing from its list installs without its files
(an editable install hides that; a wheel, what `pip install .` builds, does not)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_")) and d not in ("tests", "build", "docs")]
        if "__init__.py" in files:
            found.add(".".join(("replay_theory", *Path(folder).relative_to(ROOT).parts)))
    assert found == listed
