"""Result types: thin dataclasses of raw arrays with named axes plus an ``info`` record.

Everything is saved as safetensors (arrays) + JSON (axes, meaning, metadata), so results are
readable without streetlamp.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from safetensors.numpy import load_file, save_file

from .errors import StreetlampError


@dataclass
class Explanation:
    """One method's output for one text: named raw arrays, their axes and meaning, and info."""

    method: str
    arrays: dict[str, np.ndarray]
    axes: dict[str, list[str]]
    meaning: dict[str, str]
    tokens: list[str]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k, a in self.arrays.items():
            if k not in self.axes or len(self.axes[k]) != a.ndim:
                raise ValueError(f"{self.method}: array {k!r} of shape {a.shape} needs one axis name per dimension")

    @property
    def scores(self) -> np.ndarray:
        """The token-level scores ``[token]`` (the array named ``tokens``)."""
        return self.arrays["tokens"]


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


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    return load_file(str(path))


def check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise StreetlampError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise StreetlampError(f"output folder {out} exists and is not empty; pass --overwrite to replace it")


@contextmanager
def atomic_dir(out: Path, overwrite: bool) -> Iterator[Path]:
    """Write into a temporary sibling folder; move it into place only when everything succeeded."""
    out = Path(out)
    check_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(to_jsonable(obj), indent=2, ensure_ascii=False) + "\n")


def command_line() -> list[str]:
    return [os.path.basename(sys.argv[0])] + sys.argv[1:]
