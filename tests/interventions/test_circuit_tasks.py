"""Circuit tasks: the generators' pairs have the structure their task needs, on several templates; a CSV
of pairs reads back; bad pairs are refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from streetlamp.errors import StreetlampError
from streetlamp.interventions.circuits import tasks as T
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import tiny_model


def _diff_words(a: str, b: str) -> list[tuple[str, str]]:
    wa, wb = a.split(), b.split()
    assert len(wa) == len(wb)
    return [(x, y) for x, y in zip(wa, wb) if x != y]


def test_ioi_pairs() -> None:
    pairs = T.ioi(40, seed=1)
    assert len({p.template for p in pairs}) == len(T.IOI_TEMPLATES) >= 3
    for p in pairs:
        (old, new), *rest = _diff_words(p.clean, p.corrupt)
        assert not rest  # one word changed: the subject's second mention
        a, b = p.answer.strip(), p.wrong.strip()
        assert old.rstrip(",.") == b and new.rstrip(",.") not in (a, b)
        assert p.clean.count(a) == 1 and p.clean.count(b) == 2 and p.clean.endswith(" to")
    assert T.ioi(5, seed=1) == T.ioi(5, seed=1) and T.ioi(5, seed=1) != T.ioi(5, seed=2)


@pytest.mark.parametrize("two_digit", [True, False])
def test_greater_than_pairs(two_digit: bool) -> None:
    pairs = T.greater_than(30, seed=0, two_digit=two_digit)
    assert len({p.template for p in pairs}) == 3
    for p in pairs:
        (old, new), *rest = _diff_words(p.clean, p.corrupt)
        assert not rest and new == "1701" and old.startswith("17") and len(old) == 4
        if two_digit:
            assert int(p.answer) > int(old[2:]) > int(p.wrong)
        else:
            assert int(p.answer) > int(old[2]) > int(p.wrong)


def test_induction_pairs() -> None:
    pairs = T.induction(20, seed=0, length=4)
    assert len({p.template for p in pairs}) == len(T.INDUCTION_TEMPLATES)
    for p in pairs:
        words = p.clean.split()
        ans = p.answer.strip()
        # the clean prompt ends with the first copy's first three words; the answer is the fourth
        first = words.index(words[-3])
        assert words[first : first + 3] == words[-3:] and words[first + 3] == ans
        assert ans not in p.corrupt.split() and p.wrong.strip() in p.corrupt.split()
        assert len(p.clean.split()) == len(p.corrupt.split())


def test_csv_pairs_and_bad_input(tmp_path: Path) -> None:
    f = tmp_path / "pairs.csv"
    f.write_text('clean,corrupt,answer,wrong\n"the movie was good","the film was bad", good, bad\n', encoding="utf-8")
    (p,) = T.read_pairs(f)
    assert (p.clean, p.corrupt, p.answer, p.wrong, p.template) == (
        "the movie was good",
        "the film was bad",
        " good",
        " bad",
        0,
    )
    model, tok = tiny_model("gpt2")
    a = ModelAdapter(model, tok, "tiny-gpt2")
    ps = T.encode_pairs(a, [p])
    assert len(ps) == 1 and int(ps.answer[0]) == a.token_id(" good") and int(ps.wrong[0]) == a.token_id(" bad")
    bad = tmp_path / "bad.csv"
    bad.write_text("clean,corrupt,answer\nx,y,z\n", encoding="utf-8")
    with pytest.raises(StreetlampError, match="clean,corrupt,answer,wrong"):
        T.read_pairs(bad)
    bad.write_text("clean,corrupt,answer,wrong\nx,,z,w\n", encoding="utf-8")
    with pytest.raises(StreetlampError, match="row 1"):
        T.read_pairs(bad)
    with pytest.raises(StreetlampError, match="does not exist"):
        T.read_pairs(tmp_path / "missing.csv")
    with pytest.raises(StreetlampError, match="same token"):
        T.encode_pairs(a, [T.TaskPair("the movie was good", "the film", " good", " bad")])
    with pytest.raises(StreetlampError, match="same token"):
        T.encode_pairs(a, [T.TaskPair("the movie was good", "the film was bad", " good", " good")])
    with pytest.raises(StreetlampError, match="2 tokens"):
        T.encode_pairs(a, [T.TaskPair("the movie was good", "the film was bad", " very good", " bad")])
    with pytest.raises(StreetlampError, match="no pairs"):
        T.encode_pairs(a, [])
