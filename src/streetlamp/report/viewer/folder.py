"""Read a run folder for the report: its manifest and its array files, nothing else, checked first.

Every file is opened through :func:`~streetlamp.store.files.folder_file`: a folder from elsewhere whose
manifest names an absolute path, a ``..`` path or a symlink out of the folder is refused in one line, so
``report.html`` can never carry a file of the reporting machine."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import StreetlampError
from ...store.files import TOKEN_LABELS, folder_file, labels_of
from ...store.run_folder import FORMAT_VERSION  # the newest run-folder format this viewer reads
from .pack import SMALL, Packed, choose_codec

MAX_EXAMPLES = 500  # evaluate: per-example explanations embedded for at most this many examples


def read_manifest(folder: Path) -> tuple[dict, str]:
    """The manifest and the command that made the folder, or one clear error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StreetlampError(f"{folder} is not a folder")
    mpath = folder / "manifest.json"
    if not mpath.is_file() and not mpath.is_symlink():
        raise StreetlampError(f"{folder} is not a run folder (no manifest.json)")
    mpath = folder_file(folder, "manifest.json") or mpath
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StreetlampError(f"{mpath} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise StreetlampError(f"{mpath} is not a streetlamp run manifest (not a JSON object)")
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or version < 1:
        raise StreetlampError(f"{mpath}: format_version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise StreetlampError(
            f"{folder} was written in run-folder format {version}; this streetlamp reads up to "
            f"format {FORMAT_VERSION}: upgrade streetlamp to report it"
        )
    kind = manifest.get("streetlamp")
    if kind is None and "settings" in manifest and (folder / "metrics").is_dir():
        kind = "evaluate"  # the resumable store's manifest predates the "streetlamp" key
    if not isinstance(kind, str) or not kind:
        raise StreetlampError(f"{mpath} is not a streetlamp run manifest (no 'streetlamp' command name)")
    return manifest, kind


def _open(path: Path, folder: Path):
    """``path``: ``folder / name``, checked here (its real path is what is opened)."""
    from safetensors import safe_open

    rel = path.relative_to(folder)
    real = folder_file(folder, str(rel))
    try:
        return safe_open(str(real), framework="numpy")
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise StreetlampError(
            f"{folder}: {rel} is not a readable safetensors file "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None


def _get(f: Any, key: str, path: Path) -> np.ndarray:
    try:
        return np.asarray(f.get_tensor(key))
    except Exception as e:
        raise StreetlampError(f"{path.name}: array {key!r} cannot be read ({str(e).splitlines()[0]})") from None


def _slice(sl: Any, i: int, key: str, path: Path) -> np.ndarray:
    try:
        return np.asarray(sl[i])
    except Exception as e:
        raise StreetlampError(f"{path.name}: array {key!r} cannot be read ({str(e).splitlines()[0]})") from None


def pack_file(packed: Packed, folder: Path, rel: str, keys: list[str] | None = None, prefix: str = "") -> list[str]:
    """Pack the arrays of one safetensors file (all, or ``keys``, each of which must exist)."""
    path = folder / rel
    f = _open(path, folder)
    with f:
        have = list(f.keys())
        missing = [k for k in (keys or []) if k not in have]
        if missing:
            raise StreetlampError(f"{folder}: {rel} lacks the array(s) {', '.join(missing)} that manifest.json names")
        for k in keys if keys is not None else have:
            sl = f.get_slice(k)
            shape = list(sl.get_shape())
            if len(shape) >= 3 and np.prod(shape) > SMALL:  # a layer at a time: a long text's attention is GBs
                lo, hi, floating = math.inf, -math.inf, True
                for i in range(shape[0]):
                    c = _slice(sl, i, k, path)
                    floating = floating and np.issubdtype(c.dtype, np.floating)
                    lo, hi = min(lo, float(np.min(c))), max(hi, float(np.max(c)))
                codec = choose_codec(int(np.prod(shape)), floating, lo, hi)
                packed.add_chunks(prefix + k, shape, lambda i: _slice(sl, i, k, path), shape[0], codec)
            else:
                packed.add(prefix + k, _get(f, k, path))
    return keys if keys is not None else have


def figure_uris(folder: Path, manifest: dict) -> list[dict]:
    """The folder's PNG figures the manifest lists, as data: URIs (generic view)."""
    out = []
    for fig in manifest.get("figures") or []:
        name = fig.get("file") if isinstance(fig, dict) else fig if isinstance(fig, str) else None
        if not isinstance(name, str) or not name.lower().endswith(".png"):
            continue
        p = folder_file(folder, name, missing_ok=True)  # refuses a name leading outside the folder
        if p is not None:
            data = p.read_bytes()
            if data[:8] != b"\x89PNG\r\n\x1a\n":
                raise StreetlampError(f"{folder}: {name} is not a PNG file")
            out.append(
                {
                    "file": name,
                    "shows": fig.get("shows", "") if isinstance(fig, dict) else "",
                    "uri": "data:image/png;base64," + base64.b64encode(data).decode("ascii"),
                }
            )
    return out


def _number(s: str) -> Any:
    try:
        v = float(s)
    except ValueError:
        return s
    return v if math.isfinite(v) else None


def csv_tables(folder: Path, manifest: dict, max_rows: int = 5000) -> list[dict]:
    """CSV tables of stored numbers the manifest lists (``files`` or ``figures``), e.g. a leaderboard."""
    import csv

    listed: dict[str, str] = {}
    files = manifest.get("files")
    if isinstance(files, dict):
        listed.update({k: str(v) for k, v in files.items() if isinstance(k, str)})
    for fig in manifest.get("figures") or []:
        if isinstance(fig, dict) and isinstance(fig.get("file"), str):
            listed.setdefault(fig["file"], str(fig.get("shows", "")))
    out = []
    for name, shows in listed.items():
        if not name.lower().endswith(".csv"):
            continue
        p = folder_file(folder, name, missing_ok=True)  # refuses a name leading outside the folder
        if p is None:
            continue
        try:
            with open(p, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise StreetlampError(f"{folder}: {name} cannot be read as CSV ({e})") from None
        if rows:
            out.append(
                {
                    "file": name,
                    "shows": shows,
                    "columns": rows[0],
                    "rows": [[_number(c) for c in r] for r in rows[1 : max_rows + 1]],
                }
            )
    return out


def _clean(x: Any) -> Any:
    """JSON without NaN/Infinity (JSON.parse refuses them): they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def evaluate_extra(folder: Path, manifest: dict, packed: Packed) -> dict:
    """The resumable store: metric rows (metrics/*.parquet) and per-example arrays (arrays/*.safetensors)."""
    from ...store.run_store import read_metrics, safe_name

    try:
        df = read_metrics(folder)
    except Exception as e:
        raise StreetlampError(f"{folder}: metrics/*.parquet cannot be read ({str(e).splitlines()[0]})") from None
    examples = sorted(df.example_id.unique().tolist())
    methods = sorted(df.method.unique().tolist())
    metrics = sorted(df.metric.unique().tolist())
    ex_i = {e: i for i, e in enumerate(examples)}
    me_i = {m: i for i, m in enumerate(methods)}
    mt_i = {m: i for i, m in enumerate(metrics)}
    rows = [
        [ex_i[e], me_i[m], mt_i[t], None if not math.isfinite(v) else float(v)]
        for e, m, t, v in df[["example_id", "method", "metric", "value"]].itertuples(index=False)
    ]
    stored: dict[str, list[str]] = {}
    tokens: dict[str, list[str]] = {}
    for ex in examples[:MAX_EXAMPLES]:
        rel = f"arrays/{safe_name(ex)}.safetensors"
        if folder_file(folder, rel, missing_ok=True) is not None:
            with _open(folder / rel, folder) as f:
                keys = list(f.keys())
                if TOKEN_LABELS in keys:  # the tokens as text travel in the page's JSON, not as numbers
                    try:
                        tokens[ex] = labels_of(_get(f, TOKEN_LABELS, folder / rel))
                    except (ValueError, UnicodeDecodeError) as e:
                        raise StreetlampError(f"{folder}: {rel}: {TOKEN_LABELS} is corrupt ({e})") from None
            keys = [k for k in keys if k != TOKEN_LABELS]
            stored[ex] = pack_file(packed, folder, rel, keys=keys, prefix=f"example/{ex}/")
    return {
        "examples": examples,
        "methods": methods,
        "metrics": metrics,
        "rows": rows,
        "stored": stored,
        "tokens": tokens,
        "stored_limit": MAX_EXAMPLES if len(examples) > MAX_EXAMPLES else None,
    }


def explained_rows(packed: Packed, folder: Path, manifest: dict) -> None:
    """The explained position's attention rows, exact (float32): ranks and Kendall tau in the
    "light versus use" panel must not see ties that fixed-point storage of the full tensor makes."""
    pos = (manifest.get("explained_position") or {}).get("index")
    shape = packed.index["attention"]["shape"]
    if not isinstance(pos, int) or not 0 <= pos < shape[2]:
        return
    path = folder / "arrays.safetensors"
    with _open(path, folder) as f:
        sl = f.get_slice("attention")
        rows = np.stack([_slice(sl, i, "attention", path)[:, pos, :] for i in range(shape[0])])
    packed.add("attention@explained", rows, codec="f32")


def _shard(path: Path, folder: Path) -> np.ndarray:
    """A shard's ``pattern`` as float32 (through torch: a bfloat16 run's shards have no numpy dtype);
    ``path`` comes from :func:`folder_file`."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor("pattern").float().numpy()
    except Exception as e:  # truncated or corrupt file, or no 'pattern' in it
        raise StreetlampError(f"{path.name}: array 'pattern' cannot be read ({str(e).splitlines()[0]})") from None


MAX_LONG_ROWS = 32  # explain_long: kept rows per layer embedded in the page (the rest stay in the folder)


def long_rows(packed: Packed, folder: Path, section: dict) -> dict:
    """A long-context run's kept attention rows, one array ``rows.L{l}`` ``[row, head, key]`` per kept layer
    (a row at a time, so the page decodes only the row it shows), from the shards the manifest lists.
    At most :data:`MAX_LONG_ROWS` rows per layer travel; the others are named in ``omitted_rows``."""
    kept = section.get("kept")
    shards = section.get("shards")
    if not isinstance(kept, dict) or not isinstance(shards, list):
        raise StreetlampError(f"{folder}/manifest.json: long_context lacks 'kept' or 'shards'")
    layers: dict[int, list[tuple[list[int], Path, list[int]]]] = {}
    for sh in shards:
        if not isinstance(sh, dict) or not {"file", "layer", "rows", "heads"} <= set(sh):
            raise StreetlampError(f"{folder}/manifest.json: a long_context shard lacks file/layer/rows/heads")
        path = folder_file(folder, sh["file"])
        assert path is not None
        layers.setdefault(int(sh["layer"]), []).append(
            ([int(r) for r in sh["rows"]], path, [int(h) for h in sh["heads"]])
        )
    heads = [int(h) for h in kept.get("heads", [])]
    rows_out: dict[str, list[int]] = {}
    omitted: dict[str, int] = {}
    for layer, parts in sorted(layers.items()):
        blocks: list[np.ndarray] = []
        rows: list[int] = []
        for prow, path, pheads in sorted(parts, key=lambda t: t[0][0] if t[0] else 0):
            if pheads != heads:
                raise StreetlampError(f"{path}: its heads {pheads} differ from the kept heads {heads}")
            take = prow[: MAX_LONG_ROWS - len(rows)]
            if take:
                a = _shard(path, folder)  # [head, row, key]
                if a.shape[:2] != (len(pheads), len(prow)):
                    raise StreetlampError(
                        f"{path}: pattern has shape {list(a.shape)}, the manifest says "
                        f"{len(pheads)} heads x {len(prow)} rows"
                    )
                blocks.append(np.asarray(a[:, : len(take)], np.float32).transpose(1, 0, 2))
                rows += take
            omitted[str(layer)] = omitted.get(str(layer), 0) + len(prow) - len(take)
        if blocks:
            packed.add(f"rows.L{layer}", np.concatenate(blocks, 0))
            rows_out[str(layer)] = rows
    return {
        "layers": sorted(int(k) for k in rows_out),
        "heads": heads,
        "rows": rows_out,
        "omitted_rows": omitted,
        "max_rows": MAX_LONG_ROWS,
    }


def load_folder(folder: Path) -> tuple[dict, Packed]:
    """Everything the page needs from a run folder, every check done before anything is written."""
    folder = Path(folder)
    manifest, kind = read_manifest(folder)
    packed = Packed()
    extra: dict[str, Any] = {}
    listed = manifest.get("arrays")
    described = listed if isinstance(listed, dict) else {}
    if kind == "evaluate":
        extra["evaluate"] = evaluate_extra(folder, manifest, packed)
    elif (folder / "arrays.safetensors").exists() or described:
        keys = [
            k
            for k, v in described.items()
            if not isinstance(v, dict) or v.get("file", "arrays.safetensors") == "arrays.safetensors"
        ]
        pack_file(packed, folder, "arrays.safetensors", keys=None)
        stored = {k: described[k].get("key", k) if isinstance(described[k], dict) else k for k in keys}
        missing = [v for v in stored.values() if v not in packed.index]
        if missing:
            raise StreetlampError(
                f"{folder}: arrays.safetensors lacks the array(s) {', '.join(missing)} that manifest.json names"
            )
        for k, v in stored.items():  # an array stored once under another name (``same_as``)
            packed.index.setdefault(k, packed.index[v])
    if kind == "explain" and isinstance(manifest.get("long_context"), dict):
        kind = "explain_long"  # `explain --rows/--layers/--heads`: kept rows, no full tensor
        extra["long"] = long_rows(packed, folder, manifest["long_context"])
    if kind == "explain" and packed.index.get("attention", {}).get("codec", "f32") != "f32":
        explained_rows(packed, folder, manifest)
    if kind not in VIEWS_WITHOUT_FIGURES:
        extra["figures"] = figure_uris(folder, manifest)
        extra["csv_tables"] = csv_tables(folder, manifest)
    else:  # only the figures the arrays cannot redraw, marked for the view (an image model's overlay)
        marked = {f.get("file") for f in manifest.get("figures") or [] if isinstance(f, dict) and f.get("view") == kind}
        if marked:
            extra["figures"] = [f for f in figure_uris(folder, manifest) if f["file"] in marked]
    model = {"view": kind, "manifest": _clean(manifest), "arrays": packed.index, **_clean(extra)}
    return model, packed


VIEWS_WITHOUT_FIGURES = {"explain", "explain_long"}  # drawn from the arrays; the PNGs would only add megabytes
