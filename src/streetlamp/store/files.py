"""File helpers shared by every writer: safetensors arrays, JSON, the command line, package versions."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file


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
