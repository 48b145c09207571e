"""The one run writer of every one-shot command (``explain``, ``heads``, ``patch``, ...).

A run folder is written in three moves::

    rf = RunFolder(out, command="explain", overwrite=overwrite)  # refuses a bad --out now, before any work
    ...                                                           # the work
    with rf.staging() as w:                                       # a hidden sibling folder
        w.add_array("attention", att, axes=["layer", "head", "query", "key"], meaning="...")
        plot(..., w.path / "grid.png"); w.add_figure(file="grid.png", shows="...")
        w.write_manifest({"model": ..., "parameters": ..., "seed": ...})
    # success: the staging folder replaces ``out`` in one rename; an exception: it is removed

``manifest.json`` starts with the same header for every command (:func:`manifest_header`, also
used by the resumable :class:`~streetlamp.store.run_store.RunStore`): ``streetlamp`` (the command),
``format_version``, ``created`` (ISO-8601 UTC, :func:`utc_now`), ``command`` (the command line)
and ``versions``. Arrays go to one ``arrays.safetensors`` and are described in
``manifest["arrays"][name] = {axes, meaning, file, key, shape, dtype}``; figures in
``manifest["figures"]``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np
from safetensors.numpy import save_file

from ..errors import StreetlampError
from .files import command_line, umask_mode, versions, write_json

FORMAT_VERSION = 1
ARRAYS_FILE = "arrays.safetensors"


def utc_now() -> str:
    """The one timestamp format of every manifest: ISO-8601 in UTC, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_header(command: str) -> dict[str, Any]:
    """What every manifest starts with (run folders and the resumable run store alike)."""
    return {
        "streetlamp": command,
        "format_version": FORMAT_VERSION,
        "created": utc_now(),
        "command": command_line(),
        "versions": versions(),
    }


def default_out(kind: str) -> Path:
    """``runs/<kind>-<local time>``: the output folder when ``--out`` is not given."""
    return Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse a file, or a non-empty folder without ``overwrite``, or a folder that cannot be made there."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StreetlampError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise StreetlampError(f"output folder {out} exists and is not empty; pass --overwrite to replace it")
    check_can_create(out.parent, out)


def check_can_create(where: Path | str, out: Path | str | None = None) -> None:
    """Refuse, before any work, an output that cannot be written: ``where`` (the folder that will hold the
    output, made with its parents if missing) under a file, or under a folder this process cannot write
    (read-only, no permission: tried by making and removing an empty hidden folder, which is what the
    writers do; a mode check alone would pass for root or on a read-only mount)."""
    where = Path(where)
    shown = Path(out) if out is not None else where
    base = where
    while not base.exists() and not base.is_symlink() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise StreetlampError(f"cannot write {shown}: {base} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".streetlamp-probe-"))
    except OSError as e:
        raise StreetlampError(f"cannot write {shown}: {base} is not writable ({e.strerror or e})") from None


def check_store_out(out: Path | str) -> None:
    """The output of a resumable command (written in place, part by part): refused before any work when
    it is a file or when it (or the folder that will hold it) cannot be written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StreetlampError(f"{out} exists and is not a folder")
    check_can_create(out if out.is_dir() else out.parent, out)


def manifest_table(df: Any, title: str, note: str | None = None, max_rows: int = 500) -> dict[str, Any]:
    """A table as ``manifest["tables"]`` holds it for the report's generic view: ``{title, note, columns, rows}``
    with the first ``max_rows`` rows of the DataFrame ``df`` (the whole table is its CSV/Parquet file; the note
    says how many rows the page shows), missing values as ``null``, numpy scalars as Python numbers."""
    shown = df.head(max_rows)
    rows = [
        [None if (isinstance(v, float) and v != v) else (v.item() if isinstance(v, np.generic) else v) for v in r]
        for r in shown.itertuples(index=False, name=None)
    ]
    if len(df) > max_rows:
        note = f"{note + ' ' if note else ''}(the first {max_rows} of {len(df)} rows; the file holds them all)"
    return {"title": title, "note": note, "columns": [str(c) for c in df.columns], "rows": rows}


class RunWriter:
    """The staging folder of a :class:`RunFolder`: collects arrays and figures, writes the manifest once."""

    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self.arrays: dict[str, np.ndarray] = {}
        self.described: dict[str, dict[str, Any]] = {}
        self.figures: list[dict[str, Any]] = []
        self.manifest: dict[str, Any] | None = None

    def _open(self) -> None:
        if self.manifest is not None:
            raise RuntimeError("the manifest is already written: add arrays and figures before write_manifest")

    def add_array(
        self, name: str, array: Any, *, axes: list[str], meaning: str, same_as: str | None = None, **info: Any
    ) -> None:
        """One array of ``arrays.safetensors``, with one axis name per dimension and what it holds.

        ``same_as``: an array added before that may hold the same values (the attention method's copy of
        the run's attention). When shape, dtype and every value match, the bytes are stored once: the
        manifest entry of ``name`` names the stored ``key`` and says ``same_as``."""
        self._open()
        a = np.asarray(array, order="C")  # keeps a 0-d array 0-d (ascontiguousarray makes it 1-d)
        if len(axes) != a.ndim:
            raise ValueError(f"array {name!r} of shape {a.shape} needs one axis name per dimension, got {axes}")
        if name in self.described:
            raise ValueError(f"array {name!r} added twice")
        key = name
        other = self.arrays.get(self.described.get(same_as, {}).get("key", "")) if same_as else None
        if other is not None and other.shape == a.shape and other.dtype == a.dtype and np.array_equal(other, a):
            key = self.described[cast(str, same_as)]["key"]
            info = {**info, "same_as": same_as}
        else:
            self.arrays[name] = a
        self.described[name] = {
            "axes": list(axes),
            "meaning": meaning,
            **info,
            "file": ARRAYS_FILE,
            "key": key,
            "shape": list(a.shape),
            "dtype": str(a.dtype),
        }

    def add_arrays(self, arrays: dict[str, Any], described: dict[str, dict[str, Any]]) -> None:
        """``add_array`` for every name of ``described`` (``{name: {"axes": [...], "meaning": "..."}}``)."""
        for k, d in described.items():
            self.add_array(k, arrays[k], **d)

    def add_figure(self, *, file: str, shows: str, **info: Any) -> None:
        """Record a figure the caller saved as ``self.path / file``."""
        self._open()
        if not (self.path / file).exists():
            raise FileNotFoundError(f"figure {file} was not saved into the run folder")
        self.figures.append({"file": file, "shows": shows, **info})

    def write_manifest(self, body: dict[str, Any]) -> dict[str, Any]:
        """Write ``arrays.safetensors`` (if arrays were added) and ``manifest.json``: the header, then
        ``body``, then ``arrays`` and ``figures`` (when any were added). Called once."""
        self._open()
        header = manifest_header(self.command)
        versions_ = header.pop("versions")
        manifest = {**header, **body}
        if self.arrays:
            save_file(self.arrays, str(self.path / ARRAYS_FILE))  # C-ordered in add_array; 0-d stays 0-d
            umask_mode(self.path / ARRAYS_FILE)
            manifest["arrays"] = self.described
        if self.figures:
            manifest["figures"] = self.figures
        manifest["versions"] = versions_
        write_json(self.path / "manifest.json", manifest)
        self.manifest = manifest
        return manifest


class RunFolder:
    """One command's output folder: checked at construction, written atomically by :meth:`staging`."""

    def __init__(self, out: Path | str, command: str, overwrite: bool = False) -> None:
        self.out = Path(out)
        self.command = command
        self.overwrite = overwrite
        check_out_dir(self.out, overwrite)  # refuse before any work

    @classmethod
    def of(cls, out: RunFolder | Path | str, command: str, overwrite: bool = False) -> RunFolder:
        """``out`` itself when it is already a RunFolder (the CLI checks before loading the model)."""
        return out if isinstance(out, RunFolder) else cls(out, command, overwrite)

    @contextmanager
    def staging(self) -> Iterator[RunWriter]:
        """A hidden temporary sibling of ``out``; moved into place when the block succeeds, removed if not."""
        check_out_dir(self.out, self.overwrite)  # again: something may have appeared during the work
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f".{self.out.name}.partial-"))
        try:
            w = RunWriter(tmp, self.command)
            yield w
            if w.manifest is None:
                raise RuntimeError(f"{self.command}: the run folder was staged without write_manifest")
            self.after_write(tmp)
            umask_mode(tmp)  # private (0700) while partial; as mkdir would make it once in place
            self._move_into_place(tmp)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _move_into_place(self, tmp: Path) -> None:
        if not self.overwrite:
            self._claim(tmp)
            return
        if not self.out.exists():
            os.replace(tmp, self.out)
            return
        # a rename cannot replace a non-empty folder: swap through a second hidden name
        old = Path(tempfile.mkdtemp(dir=self.out.parent, prefix=f".{self.out.name}.old-"))
        os.replace(self.out, old / "run")
        try:
            os.replace(tmp, self.out)
        except BaseException:
            os.replace(old / "run", self.out)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)

    def _claim(self, tmp: Path) -> None:
        """Move ``tmp`` to ``out`` only when ``out`` is absent or an empty folder, decided atomically: a run
        that finished into the same ``out`` meanwhile (checked at the start, swapped at the end) is never
        replaced without ``--overwrite``. ``mkdir`` claims the name (it fails when anything holds it);
        ``rename`` onto a folder succeeds only when that folder is empty (POSIX), so of two runs racing for
        one ``out`` exactly one lands and the other refuses, whichever order their steps interleave."""
        made = False
        try:
            os.mkdir(self.out)
            made = True
        except FileExistsError:
            pass
        try:
            os.replace(tmp, self.out)
        except OSError as e:
            if made:
                with contextlib.suppress(OSError):
                    os.rmdir(self.out)  # ours and still empty: leave no trace
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            raise StreetlampError(
                f"output folder {self.out} was written by someone else while this run worked; it is kept as it "
                "is and this run's results are not written (rerun with --overwrite to replace it)"
            ) from None

    def after_write(self, path: Path) -> None:
        """Runs on the complete staging folder just before it moves into place (its files are final).
        Storage never renders: ``report.html`` is written by the command pipeline after the run
        (:func:`streetlamp.commands.base.write_report_or_warn`), so ``store/`` imports no ``report/``."""
        self._write_report(path)

    def _write_report(self, path: Path) -> None:
        """A hook for a subclass (nothing by default)."""
