"""docs/ERRATA.md: every entry's id is written once, so "ERRATA E10" names one entry (issue 33)."""

import re
from pathlib import Path


def test_errata_ids_are_unique_and_each_paper_numbers_in_order():
    text = (Path(__file__).parents[2] / "docs" / "ERRATA.md").read_text(encoding="utf-8")
    ids = re.findall(r"^### ([A-Z]\d+[a-z]?)\. ", text, re.M)
    assert len(ids) == len(set(ids)) == 29
    experience_replay = [i for i in ids if i.startswith("E")]
    assert experience_replay[-3:] == ["E15", "E16", "E17"]  # the two finite-budget / gamma > 1 notes, renumbered
