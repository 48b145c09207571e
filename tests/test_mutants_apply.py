"""scripts/mutants_issue29.py stays runnable: every mutant's text is still in the code it edits, and every
test file it names exists (a refactor that moves the code must move the mutant with it)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = runpy.run_path(str(ROOT / "scripts" / "mutants_issue29.py"), run_name="mutants")["MUTANTS"]


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_mutant_applies(m) -> None:
    text = (ROOT / "src" / "streetlamp" / m.file).read_text(encoding="utf-8")
    assert text.count(m.old) == m.count, f"{m.name}: the text it edits moved; update the mutant"
    assert m.old != m.new and all((ROOT / t).is_file() for t in m.tests)
