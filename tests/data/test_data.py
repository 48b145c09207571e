"""Dataset loaders: bundled data, CSV/JSONL, ERASER (fixture written here), bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streetlamp.data import load_dataset
from streetlamp.errors import StreetlampError


def test_bundled() -> None:
    m = load_dataset("movies")
    assert len(m.examples) == 200 and m.labels() == ["negative", "positive"]
    assert m.examples[0].text == "simplistic , silly and tedious ." and m.examples[0].label == "negative"
    assert len({e.id for e in m.examples}) == 200
    for name in ("tweets", "drugs"):
        d = load_dataset(name)
        assert d.labels() == ["negative", "positive"] and len(d.examples) > 100
        assert "&#039;" not in " ".join(e.text for e in d.examples[:50])
    assert m.hash() == load_dataset("movies").hash() != load_dataset("drugs").hash()


def test_csv_jsonl(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text('id,sentence,label\nx1,"good, really",pos\nx2,bad,neg\n')
    d = load_dataset(str(tmp_path / "a.csv"))
    assert [(e.id, e.text, e.label) for e in d.examples] == [("x1", "good, really", "pos"), ("x2", "bad", "neg")]
    (tmp_path / "b.jsonl").write_text('{"text": "fine", "y": "1"}\n\n{"text": "meh", "y": "0"}\n')
    d = load_dataset(str(tmp_path / "b.jsonl"), label_column="y")
    assert [e.label for e in d.examples] == ["1", "0"]
    # same examples, other format: same hash
    (tmp_path / "c.jsonl").write_text(
        '{"id": "x1", "sentence": "good, really", "label": "pos"}\n{"id": "x2", "sentence": "bad", "label": "neg"}\n'
    )
    assert load_dataset(str(tmp_path / "c.jsonl")).hash() == load_dataset(str(tmp_path / "a.csv")).hash()


@pytest.mark.parametrize(
    "name,content,msg",
    [
        ("e.csv", "", "empty"),
        ("m.csv", "text,label\n", "no examples"),
        ("n.csv", "words,label\nhi,pos\n", "no text column"),
        ("o.csv", "text,label\nhi,pos,extra\n", "more fields"),
        ("p.jsonl", '{"text": "a", "label": "pos"}\n{bad json\n', "malformed JSON"),
        ("q.csv", "text,label\n,pos\n", "empty"),
        ("r.txt", "hello", "unsupported"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, content: str, msg: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(StreetlampError, match=msg):
        load_dataset(str(tmp_path / name))


def test_missing_and_named_columns(tmp_path: Path) -> None:
    with pytest.raises(StreetlampError, match="no dataset"):
        load_dataset(str(tmp_path / "nope.csv"))
    (tmp_path / "a.csv").write_text("text,label\nhi,pos\n")
    with pytest.raises(StreetlampError, match="no label column 'gold'"):
        load_dataset(str(tmp_path / "a.csv"), label_column="gold")


def write_eraser(root: Path) -> Path:
    """A two-document ERASER-format dataset (docs/ + test.jsonl)."""
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "d1").write_text("the movie was great\ni loved the acting\n")
    (root / "docs" / "d2").write_text("a boring plot and bad acting\n")
    anns = [
        {
            "annotation_id": "d1",
            "classification": "pos",
            "docids": ["d1"],
            "query": "",
            "query_type": None,
            "evidences": [
                [{"docid": "d1", "start_token": 3, "end_token": 4, "text": "great"}],
                [{"docid": "d1", "start_token": 5, "end_token": 6, "text": "loved"}],
            ],
        },
        {
            "annotation_id": "d2",
            "classification": "neg",
            "query": "",
            "evidences": [
                [
                    {"docid": "d2", "start_token": 1, "end_token": 2, "text": "boring"},
                    {"docid": "d2", "start_token": 4, "end_token": 6, "text": "bad acting"},
                ]
            ],
        },
    ]
    (root / "test.jsonl").write_text("".join(json.dumps(a) + "\n" for a in anns))
    return root


def test_eraser(tmp_path: Path) -> None:
    d = load_dataset(str(write_eraser(tmp_path / "er")))
    assert d.has_rationales and [e.label for e in d.examples] == ["pos", "neg"]
    e1, e2 = d.examples
    assert e1.text == "the movie was great i loved the acting"
    assert [e1.text[s:t] for s, t in e1.rationale] == ["great", "loved"]
    assert [e2.text[s:t] for s, t in e2.rationale] == ["boring", "bad acting"]
    assert load_dataset(str(tmp_path / "er" / "test.jsonl")).hash() == d.hash()
    (tmp_path / "er" / "test.jsonl").write_text('{"annotation_id": "d3", "classification": "x", "evidences": []}\n')
    with pytest.raises(StreetlampError, match="not found"):
        load_dataset(str(tmp_path / "er"))
