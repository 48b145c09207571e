"""The one rule of every resumable command (``evaluate``, ``atlas``, ``cot``, ``replicate``, ``circuit``'s
checkpoint): **a part counts as done only when it reads**.

A part is written atomically (:func:`~streetlamp.store.run_store.atomic_write`), but a run folder can still
be damaged afterwards: a full disk, a copy cut short, a file truncated by hand. Every resumable reader asks
:func:`part_done` (or reads through :func:`read_part`) instead of testing that the file exists: a part that
does not read whole is reported in one warning line, removed, and computed again. Every read goes through
:func:`~streetlamp.store.files.folder_file`, so a part (or its folder) that is a symlink out of the run
folder is refused, never followed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StreetlampError
from .files import folder_file


def _read_parquet(p: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(p)


def _read_safetensors(p: Path) -> Any:
    from safetensors.numpy import load_file

    return load_file(str(p))


def _read_csv(p: Path) -> Any:
    import pandas as pd

    return pd.read_csv(p)


def _read_jsonl(p: Path) -> list[Any]:
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def _read_json(p: Path) -> Any:
    return json.loads(p.read_text(encoding="utf-8"))


READERS: dict[str, Callable[[Path], Any]] = {
    ".parquet": _read_parquet,
    ".safetensors": _read_safetensors,
    ".csv": _read_csv,
    ".jsonl": _read_jsonl,
    ".json": _read_json,
}


def read_part(folder: Path | str, name: str, read: Callable[[Path], Any] | None = None) -> Any | None:
    """``read(path)`` of part ``name`` of run folder ``folder`` (by default the reader of its suffix), or
    None when it is missing or damaged. A damaged part (it does not read: truncated, garbled) is reported
    in one warning line and removed, so that the caller computes it again; a part that cannot be opened
    at all (no permission) is one :class:`StreetlampError`, nothing removed."""
    p = folder_file(folder, name, missing_ok=True)
    if p is None:
        return None
    reader = read or READERS[Path(name).suffix]
    try:
        return reader(p)
    except PermissionError as e:
        raise StreetlampError(f"{Path(folder) / name} cannot be read ({e.strerror or e})") from None
    except Exception as e:  # noqa: BLE001 - any decoding failure means the part is damaged
        why = " ".join(str(e).split())[:120]
        print(
            f"streetlamp: warning: {Path(folder) / name} is damaged ({type(e).__name__}: {why}); computing it again",
            file=sys.stderr,
        )
        p.unlink(missing_ok=True)
        return None


def part_done(folder: Path | str, name: str) -> bool:
    """Whether part ``name`` exists and reads whole (a damaged one is warned about and removed)."""
    return read_part(folder, name) is not None
