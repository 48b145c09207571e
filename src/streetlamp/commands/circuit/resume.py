"""Resume an interrupted ``streetlamp circuit`` run without recomputing what it finished.

The finished stages (each method's edge scores, each method's faithfulness sweep, each method's resamples
along each ``--resample`` axis, on either engine: ``--engine ray`` checkpoints each axis as its actor
returns it, the paths table) are
kept in a hidden sibling of the output folder, ``.<out>.resume/``, which is the resumable store of
``evaluate`` (:class:`~streetlamp.store.RunStore`: one chunk per stage, its arrays and JSON record
written atomically, the Parquet part last, so a stage counts as done exactly when its part exists). The
store's settings are the run's settings and its pairs: a rerun with the same ones reloads the done
stages; with other ones the stale checkpoint is discarded and the run starts afresh. The checkpoint is
removed once the run folder is in place."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import StreetlampError
from ...store import RunStore
from ...store.files import folder_file
from ...store.parts import read_part
from ...store.run_store import safe_name


def resume_folder(out: Path) -> Path:
    return out.parent / f".{out.name}.resume"


class Checkpoint:
    def __init__(self, out: Path, settings: dict) -> None:
        self.folder = resume_folder(Path(out))
        try:
            self.store = RunStore.open(self.folder, settings, {}, command="circuit")
        except StreetlampError:  # another run's (or a damaged) checkpoint: start afresh
            shutil.rmtree(self.folder, ignore_errors=True)
            self.store = RunStore.open(self.folder, settings, {}, command="circuit")
        self.done = self.store.done_chunks()
        self._records = {int(r["chunk"]): r for r in self.store.records()}

    def get(self, chunk: int) -> tuple[dict, dict[str, np.ndarray]] | None:
        """The record and arrays of a finished stage, or None."""
        if chunk not in self.done or chunk not in self._records:
            return None
        name = f"arrays/{safe_name(f'stage{chunk}')}.safetensors"
        if folder_file(self.store.folder, name, missing_ok=True) is None:
            return self._records[chunk], {}  # a stage without arrays
        arrays = read_part(self.store.folder, name)  # a damaged one: warned about, computed again
        return None if arrays is None else (self._records[chunk], arrays)

    def put(self, chunk: int, record: dict, arrays: dict[str, np.ndarray]) -> None:
        self.store.write_records(chunk, [{**record, "chunk": chunk}])
        self.store.write_chunk(
            chunk, [("circuit", str(record.get("stage", chunk)), "done", 1.0)], {f"stage{chunk}": arrays}
        )
        self.done.add(chunk)
        self._records[chunk] = {**record, "chunk": chunk}

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def cached(ck: Checkpoint, chunk: int, compute: Any, save: Any, load: Any) -> Any:
    """``load(record, arrays)`` of a finished stage, else ``compute()`` saved as ``save(value) -> (record,
    arrays)``."""
    got = ck.get(chunk)
    if got is not None:
        return load(*got)
    value = compute()
    ck.put(chunk, *save(value))
    return value
