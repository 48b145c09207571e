"""A resumable run folder::

    RUN/manifest.json                   settings (model, data + sha256, methods + parameters, seed, ...)
                                        and package versions; ``settings`` must match to resume
    RUN/metrics/part-000012.parquet     one row per example x method x metric (example_id, method,
                                        metric, value), one part file per completed chunk
    RUN/arrays/<example_id>.safetensors raw per-example arrays (scores, curves, outputs; the tokens as
                                        text in ``token_labels.json``: UTF-8 JSON bytes, uint8)

Atomicity: every file is written to a hidden temporary name in the same folder and moved into
place with ``os.replace``; the Parquet part of a chunk is written last, so a chunk counts as done
exactly when its part exists. A run killed at any moment (SIGKILL included) leaves at worst
temporary files, which are ignored and cleaned up on the next start. The reader deduplicates on
(example_id, method, metric), keeping the last part's value, so even two writers cannot duplicate
rows. Read it with plain pandas: ``pd.read_parquet("RUN/metrics")`` (or DuckDB:
``SELECT * FROM 'RUN/metrics/*.parquet'``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import StreetlampError
from .files import folder_file, folder_files, save_arrays, to_jsonable
from .parts import part_done
from .run_folder import manifest_header

SCHEMA = pa.schema(
    [("example_id", pa.string()), ("method", pa.string()), ("metric", pa.string()), ("value", pa.float64())]
)
KEY = ["example_id", "method", "metric"]


def atomic_write(path: Path, write) -> None:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a hidden temporary file beside it, which is
    fsynced and then renamed over ``path`` (a killed writer leaves the old file or none, never half of one)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # a symlink planted under this name is removed, never written through
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def create_exclusive(path: Path, text: str) -> bool:
    """Write ``path`` whole, only if it does not exist: False (nothing written) when another writer made it
    first. The text goes to a hidden temporary file that is hard-linked to ``path`` (``link`` fails when the
    name exists, so of two runs creating one run folder at once exactly one manifest lands)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        tmp.write_text(text, encoding="utf-8")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


_atomic_write = atomic_write  # the old private name, kept for callers on other branches


def safe_name(example_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", example_id)


def _diff(a: Any, b: Any, prefix: str = "", added: dict[str, Any] | None = None) -> list[str]:
    """The differences between stored settings ``a`` and new ones ``b``, as ``path: stored x, now y``. A key
    absent from ``a`` whose new value is its ``added`` default (a setting added to streetlamp after the run
    was made, at the value that reproduces the old behaviour) is no difference."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            path = f"{prefix}{k}"
            if k not in a and added is not None and path in added and b[k] == added[path]:
                continue
            out += _diff(a.get(k), b.get(k), f"{path}.", added)
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: stored {a!r}, now {b!r}"]


class RunStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.metrics_dir = self.folder / "metrics"
        self.arrays_dir = self.folder / "arrays"

    @classmethod
    def open(
        cls, folder: Path, settings: dict, extra: dict, command: str = "evaluate", added: dict[str, Any] | None = None
    ) -> RunStore:
        """Create the run folder, or reopen it when its stored settings equal ``settings`` (a setting absent
        from the stored ones is accepted at its ``added`` default: ``{"dotted.path": value}``). A new
        manifest is the common header (:func:`~streetlamp.store.run_folder.manifest_header`), then
        ``settings`` and ``extra``."""
        s = cls(folder)
        settings = to_jsonable(settings)
        mpath = s.folder / "manifest.json"
        if s.folder.exists() and not s.folder.is_dir():
            raise StreetlampError(f"{s.folder} exists and is not a folder")
        if mpath.exists() or mpath.is_symlink():
            try:
                stored = json.loads(s._manifest_path().read_text())["settings"]
            except (json.JSONDecodeError, KeyError):
                raise StreetlampError(f"{mpath} is not a streetlamp run manifest") from None
            diff = _diff(stored, json.loads(json.dumps(settings)), added=added)
            if diff:
                raise StreetlampError(
                    f"run folder {s.folder} was made with other settings ({'; '.join(diff[:3])}"
                    f"{' ...' if len(diff) > 3 else ''}); use another --out or the same settings"
                )
        elif s.folder.exists() and any(s.folder.iterdir()):
            raise StreetlampError(f"{s.folder} is not empty and has no manifest.json: not a run folder")
        for sub in ("metrics", "arrays", "records"):  # a sub-folder that is a symlink out: refused, never written
            folder_file(s.folder, sub, kind="dir", missing_ok=True)
        s.metrics_dir.mkdir(parents=True, exist_ok=True)
        s.arrays_dir.mkdir(parents=True, exist_ok=True)
        for d in (s.folder, s.metrics_dir, s.arrays_dir, s.folder / "records"):  # leftovers of a killed run
            for t in d.glob(".*.tmp-*"):
                t.unlink(missing_ok=True)
        if not mpath.exists():
            header = manifest_header(command)
            versions = header.pop("versions")
            doc = {**header, "settings": settings, **to_jsonable(extra), "versions": versions}
            text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            if not create_exclusive(mpath, text):  # another run made the folder meanwhile: compare with its
                return cls.open(folder, settings, extra, command, added)
        return s

    def _manifest_path(self) -> Path:
        """``manifest.json``, refused when it is a symlink out of the folder (a folder may come from elsewhere)."""
        p = folder_file(self.folder, "manifest.json")
        assert p is not None
        return p

    def manifest(self) -> dict:
        return json.loads(self._manifest_path().read_text())

    def part_path(self, chunk: int) -> Path:
        return self.metrics_dir / f"part-{chunk:06d}.parquet"

    def done_chunks(self) -> set[int]:
        """The chunks whose Parquet part (and JSON records, when the chunk has them) read whole: a damaged
        chunk is warned about, removed and so computed again (:mod:`streetlamp.store.parts`)."""
        done = set()
        for p in folder_files(self.folder, "metrics", "part-*.parquet"):
            rec = f"records/{p.stem}.jsonl"
            if part_done(self.folder, f"metrics/{p.name}") and (
                folder_file(self.folder, rec, missing_ok=True) is None or part_done(self.folder, rec)
            ):
                done.add(int(p.stem.split("-")[1]))
            else:  # half a chunk is no chunk: its other file goes too
                for name in (f"metrics/{p.name}", rec):
                    q = folder_file(self.folder, name, missing_ok=True)
                    if q is not None:
                        q.unlink()
        return done

    def write_chunk(
        self, chunk: int, rows: list[tuple[str, str, str, float]], arrays: dict[str, dict[str, np.ndarray]]
    ) -> None:
        """Arrays first, the Parquet part last (its presence marks the chunk done)."""
        for eid, arrs in arrays.items():
            if arrs:
                atomic_write(self.arrays_dir / f"{safe_name(eid)}.safetensors", lambda p, a=arrs: save_arrays(p, a))
        cols: list[Any] = list(zip(*rows)) if rows else [[], [], [], []]
        table = pa.table(
            {
                "example_id": pa.array(cols[0], pa.string()),
                "method": pa.array(cols[1], pa.string()),
                "metric": pa.array(cols[2], pa.string()),
                "value": pa.array([float(v) for v in cols[3]], pa.float64()),
            },
            schema=SCHEMA,
        )
        atomic_write(self.part_path(chunk), lambda p: pq.write_table(table, p))

    def write_records(self, chunk: int, records: list[dict]) -> None:
        """Per-example JSON records (text: prompts, generations) of a chunk, ``records/part-N.jsonl``;
        write them before :meth:`write_chunk` (whose Parquet part marks the chunk done)."""
        d = self.folder / "records"
        d.mkdir(exist_ok=True)
        text = "".join(json.dumps(to_jsonable(r), ensure_ascii=False) + "\n" for r in records)
        atomic_write(d / f"part-{chunk:06d}.jsonl", lambda p: p.write_text(text, encoding="utf-8"))

    def records(self) -> list[dict]:
        """The records of the done chunks, in chunk order."""
        out = []
        for c in sorted(self.done_chunks()):
            p = folder_file(self.folder, f"records/part-{c:06d}.jsonl", missing_ok=True)
            if p is not None:
                out += [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        return out

    def update_manifest(self, extra: dict) -> None:
        """Add or replace top-level manifest fields (never ``settings``), atomically."""
        doc = self.manifest()
        doc.update({k: v for k, v in to_jsonable(extra).items() if k != "settings"})
        atomic_write(
            self.folder / "manifest.json", lambda p: p.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        )

    def metrics(self) -> pd.DataFrame:
        return read_metrics(self.folder)


def read_metrics(folder: Path) -> pd.DataFrame:
    """All metric rows of a run folder, deduplicated on (example_id, method, metric)."""
    parts = folder_files(folder, "metrics", "part-*.parquet")  # each refused if it leads out of the folder
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c == "value" else "object") for c in SCHEMA.names})
    df = pd.concat([pq.read_table(p, schema=SCHEMA).to_pandas() for p in parts], ignore_index=True)
    return df.drop_duplicates(KEY, keep="last").reset_index(drop=True)
