"""Questions: BIG-Bench task.json read by path from an sdist-shaped archive, the JSONL format, and
their validation; the real bigbench archive where it is cached (``make bigbench``)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from streetlamp.cot.data import load_questions, parse_task_json, read_jsonl
from streetlamp.cot.prompts import add_mistake, fewshot_block, sentences
from streetlamp.errors import StreetlampError

TASK = {
    "name": "toy",
    "examples": [
        {"input": "Is fire hot?", "target_scores": {"Yes": 1, "No": 0}},
        {"input": "Pick the even number.", "target_scores": {"3": 0, "4": 1, "5": 0}},
        {"input": "Ambiguous", "target_scores": {"a": 1, "b": 1}},
        {"input": "free text", "target": "x"},
    ],
}


def _sdist(path: Path, tasks: dict[str, dict]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, doc in tasks.items():
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"bigbench-1.0.0/bigbench/benchmark_tasks/{name}/task.json")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_task_json_parsing() -> None:
    qs = parse_task_json(TASK, "toy")
    assert [(q.question, q.choices, q.answer_letter) for q in qs.questions] == [
        ("Is fire hot?", ("Yes", "No"), "A"),
        ("Pick the even number.", ("3", "4", "5"), "B"),
    ]
    assert [s["why"] for s in qs.skipped] == ["no single best choice", "not multiple choice (no target_scores)"]


def test_bbh_from_archive_is_extracted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREETLAMP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("STREETLAMP_BIGBENCH", str(_sdist(tmp_path / "bb.tar.gz", {"toy": TASK, "sub/one": TASK})))
    qs = load_questions("bbh:toy")
    assert len(qs.questions) == 2 and qs.name == "bbh:toy"
    assert (tmp_path / "cache" / "bigbench" / "toy" / "task.json").exists()
    assert len(load_questions("bbh:sub/one").questions) == 2
    with pytest.raises(StreetlampError, match="no task 'missing'"):
        load_questions("bbh:missing")
    with pytest.raises(StreetlampError, match="bad BIG-Bench task name"):
        load_questions("bbh:../etc")
    monkeypatch.setenv("STREETLAMP_BIGBENCH", str(tmp_path / "none.tar.gz"))
    assert len(load_questions("bbh:toy").questions) == 2  # cached: the archive is not needed again


def test_bbh_without_archive_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREETLAMP_CACHE", str(tmp_path))
    monkeypatch.delenv("STREETLAMP_BIGBENCH", raising=False)
    with pytest.raises(StreetlampError, match="pip download --no-deps --no-binary :all: bigbench"):
        load_questions("bbh:causal_judgment")


def test_real_bigbench_causal_judgment() -> None:
    try:
        qs = load_questions("bbh:causal_judgment")
    except StreetlampError as e:
        pytest.skip(f"bigbench archive not cached (make bigbench): {e}")
    # BIG-Bench's causal_judgment task.json: 190 yes/no questions (BIG-Bench Hard uses 187 of them)
    assert len(qs.questions) == 190 and all(q.choices == ("Yes", "No") for q in qs.questions)


def test_jsonl_validation(tmp_path: Path) -> None:
    p = tmp_path / "q.jsonl"
    p.write_text(
        '{"question": "2+2?", "choices": ["3", "4"], "answer": "4"}\n\n'
        '{"id": "k", "question": "x?", "choices": ["a", "b", "c"], "answer": 2}\n'
        '{"question": "y?", "choices": ["a", "b"], "answer": "z"}\n'
        '{"question": "w?", "choices": ["a", "a"], "answer": "a"}\n'
    )
    qs = read_jsonl(p)
    assert [(q.id, q.answer_letter) for q in qs.questions] == [("q1", "B"), ("k", "C")]
    assert [s["id"] for s in qs.skipped] == ["q4", "q5"]
    for text, msg in [
        ('{"question": "q", "choices": "ab", "answer": "a"}', "list of at least two"),
        ('{"question": "", "choices": ["a", "b"], "answer": "a"}', "non-empty string"),
        ('{"choices": ["a", "b"], "answer": "a"}', "missing question"),
        ("[1, 2]", "expected an object"),
        ('{"question": "q", "choices": ["a", "b"], "answer": true}', "0-based index"),
    ]:
        p.write_text(text + "\n")
        with pytest.raises(StreetlampError, match=msg):
            read_jsonl(p)


def test_prompt_pieces() -> None:
    qs = parse_task_json(TASK, "toy").questions
    block = fewshot_block(qs, always_a=True)
    assert block.count("The answer is (A).") == 2 and "(A) 4" in block  # the even number moved to (A)
    assert "(B) 4" in fewshot_block(qs, always_a=False)
    assert sentences("One. Two!\nThree? four") == ["One.", "Two!", "Three?", "four"]
    assert add_mistake("There are 5 apples.", 3, 0) != "There are 5 apples."
    assert add_mistake("So (B) is right.", 3, 0) in ("So (A) is right.", "So (C) is right.")
    assert add_mistake("It rains.", 3, 0) == "It rains, which is false."
