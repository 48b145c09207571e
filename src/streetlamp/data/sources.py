"""The sources of a context (``streetlamp cite``): passages read from a file, each one a unit a citation names.

* ``.jsonl``: one source per line, a JSON object with a ``text`` field (and optionally ``id``) or a JSON
  string; blank lines are skipped; a line that is not JSON, or has no text, is refused with its line number.
* any other file (``.txt``): the text split into ``sentences`` (after ``.``, ``!`` or ``?`` followed by
  white space), ``paragraphs`` (at blank lines) or ``lines``.

The benchmark file (``--data``) is also JSONL: one question per line, ``{"sources": [...], "question": ...,
"answer": ..., "planted": [source indices], "kind": ..., "answer_prefix": ...}`` (the prefix, optional: the start
of the answer after ``Answer:``, which the model continues), read by :func:`read_questions`.
Every refusal is one :class:`~streetlamp.errors.StreetlampError` line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StreetlampError

SPLITS = ("sentences", "paragraphs", "lines")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_text(text: str, split: str) -> list[str]:
    """``text`` cut into sources (stripped, empty pieces dropped)."""
    if split not in SPLITS:
        raise StreetlampError(f"--split must be one of {', '.join(SPLITS)} (got {split!r})")
    if split == "lines":
        parts = text.splitlines()
    elif split == "paragraphs":
        parts = re.split(r"\n\s*\n", text)
    else:
        parts = _SENTENCE_END.split(text)
    return [" ".join(p.split()) for p in parts if p.strip()]


def _jsonl(path: Path) -> list[tuple[int, Any]]:
    """``(line number, parsed value)`` per non-blank line; a malformed line is refused with its number."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise StreetlampError(f"{path}: not UTF-8 text ({e.reason})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            raise StreetlampError(f"{path} line {i}: not valid JSON ({e.msg})") from None
    return out


def read_sources(path: str | Path, split: str = "sentences") -> list[str]:
    """The sources of ``path`` (see the module docstring); refused when there are none."""
    p = Path(path)
    if not p.is_file():
        raise StreetlampError(f"--context {path}: no such file")
    if p.suffix == ".jsonl":
        sources = []
        for i, v in _jsonl(p):
            text = v.get("text") if isinstance(v, dict) else v
            if not isinstance(text, str):
                raise StreetlampError(f"{p} line {i}: a source is a JSON string or an object with a 'text' string")
            if not text.strip():
                raise StreetlampError(f"{p} line {i}: an empty source")
            sources.append(" ".join(text.split()))
    else:
        try:
            sources = split_text(p.read_text(encoding="utf-8"), split)
        except UnicodeDecodeError as e:
            raise StreetlampError(f"{p}: not UTF-8 text ({e.reason})") from None
    if not sources:
        raise StreetlampError(f"--context {path}: no sources (the file is empty)")
    return sources


@dataclass
class Question:
    """One benchmark question: its sources, question, expected answer, the planted source indices (the
    ones the answer needs) and what kind of plant it is; ``extra``: the rest of the line."""

    id: str
    sources: list[str]
    question: str
    answer: str
    planted: list[int]
    kind: str = "single"
    extra: dict[str, Any] = field(default_factory=dict)


def read_questions(path: str | Path) -> list[Question]:
    """The questions of a benchmark JSONL file; each malformed line is refused with its number."""
    p = Path(path)
    if not p.is_file():
        raise StreetlampError(f"--data {path}: no such file")
    out: list[Question] = []
    for i, v in _jsonl(p):
        if not isinstance(v, dict):
            raise StreetlampError(f"{p} line {i}: a question is a JSON object")
        src, q, a = v.get("sources"), v.get("question"), v.get("answer")
        if not isinstance(src, list) or not src or not all(isinstance(s, str) and s.strip() for s in src):
            raise StreetlampError(f"{p} line {i}: 'sources' must be a non-empty list of non-empty strings")
        if not isinstance(q, str) or not q.strip() or not isinstance(a, str) or not a.strip():
            raise StreetlampError(f"{p} line {i}: 'question' and 'answer' must be non-empty strings")
        planted = v.get("planted", [])
        if not isinstance(planted, list) or not all(isinstance(k, int) and 0 <= k < len(src) for k in planted):
            raise StreetlampError(f"{p} line {i}: 'planted' must list source indices 0..{len(src) - 1}")
        rest = {k: x for k, x in v.items() if k not in ("id", "sources", "question", "answer", "planted", "kind")}
        out.append(Question(str(v.get("id", i)), src, q, a, list(planted), str(v.get("kind", "single")), rest))
    if not out:
        raise StreetlampError(f"--data {path}: no questions (the file is empty)")
    return out
