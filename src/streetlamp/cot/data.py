"""Multiple-choice questions for the chain-of-thought tests.

Two sources, one type (:class:`Question`):

* ``bbh:TASK`` (or ``bbh:TASK/SUBTASK``): a BIG-Bench task behind BIG-Bench Hard, read from the
  ``task.json`` files inside the ``bigbench`` source distribution on PyPI, by path, never imported
  (it pulls TensorFlow and friends). The archive is looked for in ``$STREETLAMP_BIGBENCH`` or
  ``<cache>/sdist/bigbench-*.tar.gz`` (``make bigbench`` puts it there); the task files that were
  asked for are extracted once to ``<cache>/bigbench/`` (``<cache>`` is ``~/.cache/streetlamp``).
  Each example's ``target_scores`` gives the choices (in the file's order) and the answer (the one
  choice with the highest score; ties make the example ambiguous and it is skipped, counted).
* a ``.jsonl`` file, one question per line: ``{"question": str, "choices": [str, ...],
  "answer": str | int, "id": str (optional)}``; ``answer`` is the text of one choice or its
  0-based index.

Structural faults (not JSON, missing fields, wrong types, fewer than two choices) are one clear
:class:`StreetlampError`; a question whose answer is not among its choices, or with duplicate
choices, is skipped and counted (``Questions.skipped``), so one bad row does not sink a file.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..data.files import read_text
from ..errors import StreetlampError

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# the BIG-Bench tasks behind the 23 BIG-Bench Hard tasks that are multiple choice with target_scores
BBH_TASKS = (
    "causal_judgment",
    "date_understanding",
    "disambiguation_qa",
    "formal_fallacies_syllogisms_negation",
    "geometric_shapes",
    "hyperbaton",
    "logical_deduction",
    "movie_recommendation",
    "navigate",
    "penguins_in_a_table",
    "reasoning_about_colored_objects",
    "ruin_names",
    "salient_translation_error_detection",
    "snarks",
    "sports_understanding",
    "temporal_sequences",
    "tracking_shuffled_objects",
    "web_of_lies",
)
SDIST_HINT = (
    "pip download --no-deps --no-binary :all: bigbench -d ~/.cache/streetlamp/sdist  "
    "(or `make bigbench`; ~360 MB, read by path, never installed)"
)


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    choices: tuple[str, ...]
    answer: int  # index into choices

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.choices)]

    @property
    def answer_letter(self) -> str:
        return LETTERS[self.answer]


@dataclass
class Questions:
    name: str
    source: str
    questions: list[Question]
    skipped: list[dict] = field(default_factory=list)  # {"id", "why"}

    def hash(self) -> str:
        h = hashlib.sha256()
        for q in self.questions:
            h.update(json.dumps([q.id, q.question, q.choices, q.answer]).encode())
        return h.hexdigest()


def _check_question(qid: str, question: object, choices: object, where: str) -> tuple[str, tuple[str, ...]]:
    if not isinstance(question, str) or not question.strip():
        raise StreetlampError(f"{where}: 'question' must be a non-empty string")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c.strip() for c in choices):
        raise StreetlampError(f"{where}: 'choices' must be a list of at least two non-empty strings")
    if len(choices) > len(LETTERS):
        raise StreetlampError(f"{where}: {len(choices)} choices; at most {len(LETTERS)} (letters A-Z)")
    return question, tuple(c.strip() for c in choices)


def read_jsonl(path: Path) -> Questions:
    path = Path(path)
    questions, skipped, seen = [], [], set()
    lines = read_text(path, "data file").splitlines()  # a regular UTF-8 file (a FIFO, binary: refused)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise StreetlampError(f"{where} is not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise StreetlampError(f"{where}: expected an object with question, choices, answer")
        missing = [k for k in ("question", "choices", "answer") if k not in row]
        if missing:
            raise StreetlampError(f"{where}: missing {', '.join(missing)} (each line: question, choices, answer)")
        qid = str(row.get("id", f"q{n}"))
        if qid in seen:
            raise StreetlampError(f"{where}: id {qid!r} appears twice")
        seen.add(qid)
        question, choices = _check_question(qid, row["question"], row["choices"], where)
        ans = row["answer"]
        if len(set(choices)) < len(choices):
            skipped.append({"id": qid, "why": "duplicate choices"})
            continue
        if isinstance(ans, bool) or not isinstance(ans, (str, int)):
            raise StreetlampError(f"{where}: 'answer' must be a choice's text or its 0-based index")
        if isinstance(ans, int):
            idx = ans if 0 <= ans < len(choices) else None
        else:
            idx = choices.index(ans.strip()) if ans.strip() in choices else None
        if idx is None:
            skipped.append({"id": qid, "why": f"answer {ans!r} is not among the choices"})
            continue
        questions.append(Question(qid, question, choices, idx))
    return Questions(path.stem, str(path), questions, skipped)


def parse_task_json(doc: object, name: str) -> Questions:
    """Questions of a BIG-Bench ``task.json`` (multiple choice: examples with ``target_scores``)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("examples"), list):
        raise StreetlampError(f"BIG-Bench task {name}: no 'examples' list in task.json")
    prefix = str(doc.get("example_input_prefix", "") or "")
    prefix = "" if prefix.strip() in ("", "Q:", "Question:") else prefix
    questions, skipped = [], []
    for i, ex in enumerate(doc["examples"]):
        qid = f"{name.replace('/', '.')}-{i}"
        ts = ex.get("target_scores") if isinstance(ex, dict) else None
        if not isinstance(ts, dict) or len(ts) < 2 or not isinstance(ex.get("input"), str):
            skipped.append({"id": qid, "why": "not multiple choice (no target_scores)"})
            continue
        choices = tuple(str(c).strip() for c in ts)
        scores = [float(v) for v in ts.values()]
        best = [j for j, s in enumerate(scores) if s == max(scores)]
        if len(best) != 1 or len(set(choices)) < len(choices):
            skipped.append({"id": qid, "why": "no single best choice" if len(best) != 1 else "duplicate choices"})
            continue
        if len(choices) > len(LETTERS):
            skipped.append({"id": qid, "why": f"{len(choices)} choices (more than A-Z)"})
            continue
        questions.append(Question(qid, (prefix + ex["input"]).strip(), choices, best[0]))
    return Questions(f"bbh:{name}", "", questions, skipped)


def find_sdist() -> Path | None:
    from ..models.loading import cache_dir

    env = os.environ.get("STREETLAMP_BIGBENCH")
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise StreetlampError(f"$STREETLAMP_BIGBENCH={env} is not a file")
        return p
    hits = sorted(
        glob.glob(str(cache_dir() / "sdist" / "bigbench-*.tar.gz"))
        + glob.glob(str(cache_dir() / "sdist" / "bigbench-*.zip"))
    )
    return Path(hits[-1]) if hits else None


def _member(task: str) -> str:
    return f"bigbench/benchmark_tasks/{task}/task.json"


def extract_tasks(sdist: Path, tasks: list[str], dest: Path) -> list[str]:
    """One pass over the archive: write ``dest/TASK/task.json`` for each task found; return the found ones."""
    wanted = {_member(t): t for t in tasks}
    found = []
    dest.mkdir(parents=True, exist_ok=True)

    def save(task: str, data: bytes) -> None:
        target = dest / task / "task.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".task.json.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        found.append(task)

    try:
        if sdist.suffix == ".zip":
            with zipfile.ZipFile(sdist) as z:
                for name in z.namelist():
                    tail = name.split("/", 1)[-1]
                    if tail in wanted:
                        save(wanted[tail], z.read(name))
        else:
            with tarfile.open(sdist, "r:*") as t:
                for m in t:
                    tail = m.name.split("/", 1)[-1]
                    if m.isfile() and tail in wanted:
                        f = t.extractfile(m)
                        if f is not None:
                            save(wanted[tail], f.read())
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise StreetlampError(f"cannot read the bigbench archive {sdist}: {e}") from None
    return found


def load_bbh(task: str) -> Questions:
    from ..models.loading import cache_dir

    task = task.strip().strip("/")
    if not task or ".." in task.split("/") or not all(p.replace("_", "").isalnum() for p in task.split("/")):
        raise StreetlampError(
            f"bad BIG-Bench task name {task!r} (e.g. bbh:causal_judgment, bbh:logical_deduction/three_objects)"
        )
    cached = cache_dir() / "bigbench" / task / "task.json"
    if not cached.is_file():
        sdist = find_sdist()
        if sdist is None:
            raise StreetlampError(
                f"BIG-Bench task {task!r} is not cached and the bigbench sdist is not found; get it with: {SDIST_HINT}"
            )
        # one read of the (gzip, ~360 MB) archive: take every BBH task not cached yet in the same pass
        root = cache_dir() / "bigbench"
        want = [task] + [t for t in BBH_TASKS if t != task and not (root / t / "task.json").is_file()]
        if task not in extract_tasks(sdist, want, root):
            raise StreetlampError(
                f"no task {task!r} in {sdist.name} (BIG-Bench Hard tasks: {', '.join(BBH_TASKS)}; "
                "some have subtasks, e.g. logical_deduction/three_objects)"
            )
    try:
        doc = json.loads(cached.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StreetlampError(f"{cached} is not a readable task.json ({e}); delete it to extract it again") from None
    qs = parse_task_json(doc, task)
    qs.source = str(cached)
    if not qs.questions:
        subs = [s.get("name") for s in doc.get("subtasks", []) if isinstance(s, dict)] if isinstance(doc, dict) else []
        raise StreetlampError(
            f"BIG-Bench task {task!r} has no multiple-choice examples"
            + (
                f"; it has subtasks: {', '.join(str(s).split(':')[-1] for s in subs)} (use bbh:{task}/SUBTASK)"
                if subs
                else ""
            )
        )
    return qs


def load_questions(spec: str) -> Questions:
    """``bbh:TASK[/SUBTASK]`` or a ``.jsonl`` path."""
    if spec.startswith("bbh:"):
        return load_bbh(spec[4:])
    p = Path(spec)
    if p.suffix != ".jsonl":
        raise StreetlampError(
            f"--data {spec!r}: give bbh:TASK (a BIG-Bench Hard task) or a .jsonl file "
            "(question, choices, answer per line)"
        )
    return read_jsonl(p)
