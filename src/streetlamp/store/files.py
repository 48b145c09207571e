"""File helpers shared by every writer: safetensors arrays, JSON, the command line, package versions, and
:func:`folder_file`, the one gate through which every reader of a run folder it did not write opens a file."""

from __future__ import annotations

import json
import os
import platform
import stat
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from ..errors import StreetlampError


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("streetlamp", "torch", "transformers", "numpy", "safetensors", "captum", "matplotlib"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def to_jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    return x


def umask_mode(path: Path | str) -> None:
    """Give a file written by safetensors (which creates it 0600), or a folder made by ``mkdtemp`` (0700),
    the mode ``open()`` / ``mkdir`` would: 0666 / 0777 less the umask, so a run folder and its arrays are as
    readable as its CSVs and manifest."""
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~_umask())


def _umask() -> int:
    try:  # Linux states it; setting and restoring it would race with other threads creating files
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    umask_mode(path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    return load_file(str(path))


TOKEN_LABELS = "token_labels.json"  # per-example array: the tokens as text, UTF-8 JSON (safetensors holds numbers)


def labels_array(labels: list[str]) -> np.ndarray:
    """The tokens of one example as the uint8 array stored under ``TOKEN_LABELS``."""
    return np.frombuffer(json.dumps(list(labels), ensure_ascii=False).encode("utf-8"), np.uint8).copy()


def labels_of(a: np.ndarray) -> list[str]:
    """The inverse of :func:`labels_array`."""
    out = json.loads(np.asarray(a, np.uint8).tobytes().decode("utf-8"))
    if not isinstance(out, list) or not all(isinstance(t, str) for t in out):
        raise ValueError("token_labels.json does not hold a list of strings")
    return out


def write_json(path: Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def command_line() -> list[str]:
    return [os.path.basename(sys.argv[0])] + sys.argv[1:]


def folder_file(folder: Path | str, name: object, *, kind: str = "file", missing_ok: bool = False) -> Path | None:
    """The real path of ``name`` (a path relative to run folder ``folder``, as a manifest names it), or
    one clear :class:`StreetlampError` when reading it could leak a file of this machine.

    A run folder may come from elsewhere (copied, downloaded): what its manifest names is untrusted. A
    name is refused when it is absolute, when it leads outside ``folder`` once every symlink and ``..``
    is resolved (``../run2/x.csv`` beside ``run`` included: the test is per path component), or when it
    is not a regular file (``kind="file"``; a FIFO would block the reader, a device would stream) or
    not a folder (``kind="dir"``). A symlink that stays inside the folder is followed. Missing: ``None``
    when ``missing_ok``, else an error. The caller opens the returned path, never ``folder / name``."""
    folder = Path(folder)
    if not isinstance(name, (str, os.PathLike)) or not str(name) or "\x00" in str(name):
        raise StreetlampError(f"{folder}: {name!r} is not a file name")
    shown = str(name)
    if Path(name).is_absolute():
        raise StreetlampError(
            f"{folder}: refusing {shown!r}: an absolute path (a run folder may name only files inside itself)"
        )
    root = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(folder / name))
    if not target.is_relative_to(root):
        raise StreetlampError(
            f"{folder}: refusing {shown!r}: it leads outside the run folder (to {target}); "
            "a run folder may name only files inside itself"
        )
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if missing_ok:
            return None
        raise StreetlampError(f"{folder}: {shown} is missing") from None
    except OSError as e:
        raise StreetlampError(f"{folder}: {shown} cannot be read ({e.strerror or e})") from None
    if kind == "dir":
        if not stat.S_ISDIR(mode):
            raise StreetlampError(f"{folder}: refusing {shown!r}: not a folder")
    elif not stat.S_ISREG(mode):
        raise StreetlampError(f"{folder}: refusing {shown!r}: not a regular file")
    return target


def folder_files(folder: Path | str, sub: str, pattern: str) -> list[Path]:
    """The regular files ``folder/sub/pattern`` (sorted by name), each through :func:`folder_file`:
    a ``sub`` that is a symlink out of the folder, or a matching entry that is one, is refused."""
    d = folder_file(folder, sub, kind="dir", missing_ok=True)
    if d is None:
        return []
    names = sorted(p.name for p in (Path(folder) / sub).glob(pattern))
    return [p for n in names if (p := folder_file(folder, f"{sub}/{n}")) is not None]
