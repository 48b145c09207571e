"""scripts/mutants_issue29.py and mutants_issue35.py stay runnable: every mutant's text is still in the code
it edits, and every test file it names exists (a refactor that moves the code must move the mutant with it)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = [
    m
    for issue in ("29", "35")
    for m in runpy.run_path(str(ROOT / "scripts" / f"mutants_issue{issue}.py"), run_name="mutants")["MUTANTS"]
]


def test_mutant_names_are_unique() -> None:
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_mutant_applies(m) -> None:
    text = (ROOT / "src" / "streetlamp" / m.file).read_text(encoding="utf-8")
    assert text.count(m.old) == m.count, f"{m.name}: the text it edits moved; update the mutant"
    assert m.old != m.new and all((ROOT / t).is_file() for t in m.tests)
