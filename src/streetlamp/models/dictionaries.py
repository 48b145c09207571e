"""Reading and writing feature sets (``--features DICT``): weights through safetensors only, never a pickle.

:func:`load_features` reads a folder in one of the formats it recognises by what the folder holds:

- **streetlamp** (``features.json`` + one ``.safetensors`` per dictionary), written by :func:`save_features`
  (``streetlamp features-fit`` writes it);

Every file a folder names is read through :func:`~streetlamp.store.files.folder_file` (never outside the
folder); a truncated or corrupt weights file, a pickle, a missing tensor or a tensor of the wrong shape is
one clear line (:class:`~streetlamp.errors.StreetlampError`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import StreetlampError
from ..store.files import folder_file, write_json
from .features import ACTIVATIONS, FEATURE_SITES, Dictionary, FeatureSet

__all__ = ["FORMAT", "load_features", "read_safetensors", "save_features"]

FORMAT = "streetlamp-features"
VERSION = 1
INDEX = "features.json"


def read_safetensors(folder: Path | str, name: str) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder/name`` (a safetensors file inside ``folder``), or one clear line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder_file(folder, name)
    assert path is not None
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:2] == b"PK" or head[:1] == b"\x80":
        raise StreetlampError(f"{folder}: {name} is a pickle (a torch .pt/.bin file): refused, safetensors only")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise StreetlampError(f"{folder}: {name} is not a readable safetensors file ({err})") from None


def _tensor(weights: dict[str, torch.Tensor], key: str, where: str, required: bool = True) -> torch.Tensor | None:
    t = weights.get(key)
    if t is None and required:
        raise StreetlampError(f"{where}: no tensor {key!r} (it has {', '.join(sorted(weights)) or 'none'})")
    return t


def save_features(fs: FeatureSet, folder: Path | str, dtype: torch.dtype | None = None) -> Path:
    """Write ``fs`` to ``folder`` in streetlamp's format (each file to a temporary name, then moved), the
    weights in ``dtype`` (default: as they are; ``torch.bfloat16`` halves a shipped set)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for d in fs:
        if dtype is not None:
            d = d.to(dtype)
        name = f"layer_{d.layer:03d}_{d.where}.safetensors"
        tensors = {n: getattr(d, n).contiguous() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
        for opt in ("threshold", "W_skip"):
            if getattr(d, opt) is not None:
                tensors[opt] = getattr(d, opt).contiguous()
        tmp = folder / f".{name}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, folder / name)
        entries.append(
            {
                "layer": d.layer,
                "site": d.where,
                "activation": d.activation,
                "k": d.k,
                "b_dec_in": d.b_dec_in,
                "width": d.width,
                "d_in": d.d_in,
                "d_out": d.d_out,
                "file": name,
            }
        )
    index = {"format": FORMAT, "version": VERSION, "model": fs.model, "dictionaries": entries, "info": fs.info}
    tmp = folder / f".{INDEX}.tmp"
    write_json(tmp, index)
    os.replace(tmp, folder / INDEX)
    return folder


def _load_streetlamp(folder: Path) -> FeatureSet:
    path = folder_file(folder, INDEX)
    assert path is not None
    try:
        index: Any = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StreetlampError(f"{folder}: {INDEX} is not JSON ({err})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise StreetlampError(f"{folder}: {INDEX} is not a streetlamp feature set (format {FORMAT!r})")
    if index.get("version") != VERSION:
        raise StreetlampError(
            f"{folder}: feature-set version {index.get('version')!r}; this streetlamp reads {VERSION}"
        )
    entries = index.get("dictionaries")
    if not isinstance(entries, list) or not entries:
        raise StreetlampError(f"{folder}: {INDEX} lists no dictionaries")
    out: dict[tuple[int, str], Dictionary] = {}
    for e in entries:
        if not isinstance(e, dict):
            raise StreetlampError(f"{folder}: {INDEX}: a dictionary entry is not an object: {e!r}")
        layer, where, act = e.get("layer"), e.get("site"), e.get("activation", "relu")
        if (
            not isinstance(layer, int)
            or isinstance(layer, bool)
            or where not in FEATURE_SITES
            or act not in ACTIVATIONS
        ):
            raise StreetlampError(
                f"{folder}: {INDEX}: entry {e!r} needs an integer layer, a site in {sorted(FEATURE_SITES)} and an "
                f"activation in {list(ACTIVATIONS)}"
            )
        w = read_safetensors(folder, str(e.get("file")))
        at = f"{folder}/{e.get('file')}"
        d = Dictionary(
            layer,
            where,
            W_enc=_tensor(w, "W_enc", at),  # type: ignore[arg-type]
            b_enc=_tensor(w, "b_enc", at),  # type: ignore[arg-type]
            W_dec=_tensor(w, "W_dec", at),  # type: ignore[arg-type]
            b_dec=_tensor(w, "b_dec", at),  # type: ignore[arg-type]
            activation=act,
            k=e.get("k"),
            threshold=_tensor(w, "threshold", at, required=False),
            b_dec_in=bool(e.get("b_dec_in", False)),
            W_skip=_tensor(w, "W_skip", at, required=False),
        )
        if (layer, where) in out:
            raise StreetlampError(f"{folder}: two dictionaries at layer {layer} ({where})")
        out[(layer, where)] = d
    info: dict = index["info"] if isinstance(index.get("info"), dict) else {}
    model = index.get("model") if isinstance(index.get("model"), str) else None
    return FeatureSet(out, source=str(folder), format="streetlamp", model=model, info=info)


# the formats, each recognised by the file that marks it; the first whose marker the folder holds reads it
READERS = [(INDEX, _load_streetlamp)]


def load_features(path: Path | str) -> FeatureSet:
    """The feature set in folder ``path`` (its format recognised by what it holds), or one clear line."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise StreetlampError(f"--features {path}: not a folder (a feature set is a folder of safetensors files)")
    for marker, read in READERS:
        if folder_file(folder, marker, missing_ok=True) is not None:
            return read(folder)
    markers = ", ".join(m for m, _ in READERS)
    raise StreetlampError(f"--features {path}: no feature set there (looked for {markers})")
