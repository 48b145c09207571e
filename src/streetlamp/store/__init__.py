"""Run folders: :class:`RunFolder` (one-shot commands, written atomically) and :class:`RunStore`
(``evaluate``: resumable, one Parquet part per chunk). Imported lazily: the run store needs pandas
and pyarrow, a run folder does not."""

from __future__ import annotations

from typing import Any

__all__ = ["RunFolder", "RunStore", "read_metrics"]


def __getattr__(name: str) -> Any:
    if name == "RunFolder":
        from .run_folder import RunFolder

        return RunFolder
    if name in ("RunStore", "read_metrics"):
        from . import run_store

        return getattr(run_store, name)
    raise AttributeError(name)
