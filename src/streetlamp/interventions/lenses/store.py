"""Lens folders: streetlamp's own, and the tuned-lens package's, each read with its checks.

**streetlamp's lens folder** (what ``streetlamp lens-fit`` writes into its run folder):

* ``lens.safetensors``: ``A.{r}`` ``[d_model, d_model]`` and ``b.{r}`` ``[d_model]`` (float64) for the rows
  ``r = 0 .. n_layers - 1`` that are not the identity (row 0: the residual entering layer 0; row ``r``:
  ``resid_post`` of layer ``r - 1``); the readout is ``W_U · norm_f(A_r h + b_r)``; a Jacobian lens stores
  ``A.{r} = J_r`` and no ``b``; ``mean`` ``[n_layers + 1, d_model]`` (float64, optional): each row's mean
  residual over the fit corpus's training tokens (positions from 1: the document separator at 0 is left
  out), the baseline of ``lens --check-variant baseline --baseline mean``;
* ``lens.json``: ``format`` (``"streetlamp-lens"``), ``format_version`` (1), ``kind`` (tuned / jacobian),
  ``model`` (``name``, ``family``, ``n_layers``, ``d_model``, ``vocab``, ``unembed_sha256``: sha256 of the
  unembedding as float32 bytes), ``rows`` (what a row is), ``training`` (how it was fitted) and
  ``sha256`` of ``lens.safetensors`` (a changed byte is refused as corrupt).

**The tuned-lens package's folder** (``TunedLens.save``, AlignmentResearch/tuned-lens): ``config.json``
(``base_model_name_or_path``, ``d_model``, ``num_hidden_layers``, ``bias``, ``unembed_hash``, ``lens_type``
``"linear_tuned_lens"``) and ``params.pt``, a ``torch.save`` of the translators' state dict:
``{i}.weight`` ``[d, d]`` and ``{i}.bias`` ``[d]`` for ``i = 0 .. num_hidden_layers - 1``, translator ``i``
acting on ``hidden_states[i]`` (our row ``i``) **residually**: ``h + W_i h + b_i``, so ``A_i = I + W_i``.
``params.pt`` is a pickle, and streetlamp reads weights from safetensors (or GGUF) only: such a folder is
refused in one line unless the user opts in (``lens --allow-pt``, or once, ``lens-fit --convert DIR``, which
writes it as streetlamp's lens folder). Opted in, it is read with ``torch.load(weights_only=True)``, whose
unpickler builds tensors and plain containers only and refuses anything else (no code from the file runs).
Its ``unembed_hash`` is the package's own hash, not comparable with ours: it is recorded, not checked.

**The Jacobian lens's reference artifact** (anthropics/jacobian-lens, the files on the Hub; its layout as
TransformerLens's ``JacobianLens.load`` documents it): a folder holding one ``.pt`` file, a ``torch.save``
of ``{"J": {layer: [d, d]}, "n_prompts", "source_layers", "d_model", "metadata"?}``, ``J[l]`` acting on the
output of block ``l`` (our row ``l + 1``) as ``J[l] @ h``, target the final block's output before the final
norm; read, like ``params.pt``, only with ``allow_pt``. Row 0 (the embedding) has no matrix there and reads
as the logit lens, with a warning.

**Refused, one line each:** a missing folder or file, unreadable JSON or tensors, a changed
``lens.safetensors`` (sha256), a lens of another shape (layers or ``d_model``), a tensor of the wrong
shape or not finite, a lens of another kind than the one asked for, a model without a readout (a
classifier, an encoder). A lens fitted on another unembedding of the same shape loads with a warning
(``Lens.info["warning"]``): a float16 copy of the same model hashes differently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...errors import StreetlampError
from ...models.readout import check_lens
from ...store.files import folder_file, umask_mode, write_json
from .base import Lens, unembed_hash

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

FORMAT = "streetlamp-lens"
FORMAT_VERSION = 1
LENS_JSON, LENS_FILE = "lens.json", "lens.safetensors"
ROWS = "row 0: the residual entering layer 0 (the embedding); row r: resid_post of layer r-1; row n_layers (the final residual) is the identity"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_record(adapter: ModelAdapter) -> dict[str, Any]:
    return {
        "name": adapter.name,
        "family": adapter.family.name,
        "n_layers": adapter.n_layers,
        "d_model": adapter.d_model,
        "vocab": adapter.n_outputs,
        "unembed_sha256": unembed_hash(adapter),
    }


def save_lens(folder: Path, lens: Lens, adapter: ModelAdapter, training: dict[str, Any]) -> dict[str, Any]:
    """Write ``lens.safetensors`` and ``lens.json`` into ``folder`` (a run folder being staged); returns the record."""
    from safetensors.torch import save_file

    folder = Path(folder)
    save_file({k: v.cpu() for k, v in lens.to_arrays().items()}, str(folder / LENS_FILE))
    umask_mode(folder / LENS_FILE)
    record = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": lens.kind,
        "model": model_record(adapter),
        "rows": ROWS,
        "training": training,
        "sha256": _sha256(folder / LENS_FILE),
    }
    write_json(folder / LENS_JSON, record)
    return record


def _refuse(folder: Path, why: str) -> StreetlampError:
    return StreetlampError(f"lens folder {folder}: {why}")


def _read_json(folder: Path, name: str) -> dict[str, Any]:
    path = folder_file(folder, name)
    assert path is not None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _refuse(folder, f"{name} is not readable JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(obj, dict):
        raise _refuse(folder, f"{name} is not a JSON object")
    return obj


def _check_shape(folder: Path, adapter: ModelAdapter, n_layers: Any, d_model: Any, name: Any) -> None:
    if n_layers != adapter.n_layers or d_model != adapter.d_model:
        raise _refuse(
            folder,
            f"fitted for {name!r} ({n_layers} layers, d_model {d_model}); {adapter.name} has "
            f"{adapter.n_layers} layers, d_model {adapter.d_model}: a lens reads only the model it was fitted on",
        )


def _tensor(folder: Path, key: str, t: Any, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise _refuse(folder, f"tensor {key} has shape {got}, expected {shape}")
    t = t.detach().to("cpu", torch.float64)
    if not torch.isfinite(t).all():
        raise _refuse(folder, f"tensor {key} has values that are not finite")
    return t


def load_lens(folder: Path | str, adapter: ModelAdapter, kind: str | None = None, allow_pt: bool = False) -> Lens:
    """The lens in ``folder`` (streetlamp's, or the tuned-lens package's) for ``adapter``; ``kind``: the kind
    the user asked for (tuned / jacobian), refused when the folder holds another; ``allow_pt``: the user
    opted in to reading the tuned-lens package's pickled ``params.pt``."""
    check_lens(adapter)
    folder = Path(folder)
    if not folder.is_dir():
        raise StreetlampError(f"lens folder {folder} does not exist (or is not a folder)")
    if folder_file(folder, LENS_JSON, missing_ok=True) is not None:
        lens = _load_ours(folder, adapter)
    elif folder_file(folder, "config.json", missing_ok=True) is not None:
        lens = _load_tuned_lens_package(folder, adapter, allow_pt)
    elif len(pts := sorted(p.name for p in folder.glob("*.pt") if p.is_file())) == 1:
        lens = _load_jlens_reference(folder, pts[0], adapter, allow_pt)
    else:
        raise _refuse(
            folder,
            f"no lens here: expected {LENS_JSON} and {LENS_FILE} (streetlamp lens-fit) or "
            "config.json and params.pt (the tuned-lens package), or one .pt file (the Jacobian lens's reference format)",
        )
    if kind is not None and lens.kind != kind:
        raise _refuse(folder, f"it holds a {lens.kind} lens, not a {kind} lens")
    return lens


def _load_ours(folder: Path, adapter: ModelAdapter) -> Lens:
    from safetensors.torch import load_file

    rec = _read_json(folder, LENS_JSON)
    if rec.get("format") != FORMAT:
        raise _refuse(folder, f"{LENS_JSON} is not a streetlamp lens (format {rec.get('format')!r})")
    if not isinstance(rec.get("format_version"), int) or rec["format_version"] > FORMAT_VERSION:
        raise _refuse(folder, f"{LENS_JSON} has format_version {rec.get('format_version')!r}; this streetlamp reads 1")
    kind = rec.get("kind")
    if kind not in ("tuned", "jacobian"):
        raise _refuse(folder, f"{LENS_JSON} names an unknown lens kind {kind!r}")
    m = rec.get("model")
    if not isinstance(m, dict):
        raise _refuse(folder, f"{LENS_JSON} has no model record")
    _check_shape(folder, adapter, m.get("n_layers"), m.get("d_model"), m.get("name"))
    path = folder_file(folder, LENS_FILE, missing_ok=True)
    if path is None:
        raise _refuse(folder, f"{LENS_FILE} is missing")
    if _sha256(path) != rec.get("sha256"):
        raise _refuse(folder, f"{LENS_FILE} does not match the sha256 in {LENS_JSON} (a corrupt or changed file)")
    try:
        arrays = load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError (a subclass of Exception) on a bad header
        raise _refuse(folder, f"{LENS_FILE} is not readable ({type(e).__name__})") from None
    L, d = adapter.n_layers, adapter.d_model
    known = {f"A.{r}" for r in range(L)} | {f"b.{r}" for r in range(L)} | {"mean"}
    extra = sorted(set(arrays) - known)
    if extra:
        raise _refuse(folder, f"{LENS_FILE} holds unknown tensors {extra[:3]}")
    A = [_tensor(folder, f"A.{r}", arrays[f"A.{r}"], (d, d)) if f"A.{r}" in arrays else None for r in range(L)]
    b = [_tensor(folder, f"b.{r}", arrays[f"b.{r}"], (d,)) if f"b.{r}" in arrays else None for r in range(L)]
    mean = _tensor(folder, "mean", arrays["mean"], (L + 1, d)) if "mean" in arrays else None
    info = {"folder": str(folder), "format": FORMAT, "model": m, "training": rec.get("training", {})}
    if m.get("unembed_sha256") != unembed_hash(adapter):
        info["warning"] = (
            f"the lens was fitted on {m.get('name')!r}, whose unembedding differs from {adapter.name}'s "
            "(another model of the same shape, or another dtype of this one)"
        )
    return Lens(kind, L, d, A, b, info, mean)


PT_REFUSED = (
    "{name} is a pickle (torch.save) and streetlamp reads lens weights from safetensors only: convert it once "
    "with `streetlamp lens-fit --lens {kind} --convert {folder} --data D --out NEWDIR`, or pass --allow-pt to read "
    "it here (torch.load with weights_only=True)"
)


def _load_tuned_lens_package(folder: Path, adapter: ModelAdapter, allow_pt: bool = False) -> Lens:
    cfg = _read_json(folder, "config.json")
    if cfg.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens":
        raise _refuse(folder, f"config.json has lens_type {cfg.get('lens_type')!r}; only linear_tuned_lens is read")
    L, d = adapter.n_layers, adapter.d_model
    _check_shape(folder, adapter, cfg.get("num_hidden_layers"), cfg.get("d_model"), cfg.get("base_model_name_or_path"))
    path = folder_file(folder, "params.pt", missing_ok=True)
    if path is None:
        raise _refuse(folder, "params.pt is missing (the tuned-lens package saves config.json and params.pt)")
    if not allow_pt:
        raise _refuse(folder, PT_REFUSED.format(name="params.pt", kind="tuned", folder=folder))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # the restricted unpickler raises UnpicklingError, a truncated zip RuntimeError, ...
        raise _refuse(folder, f"params.pt is not a readable tensor file ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise _refuse(folder, "params.pt does not hold a state dict")
    bias = bool(cfg.get("bias", True))
    want = {f"{i}.weight" for i in range(L)} | ({f"{i}.bias" for i in range(L)} if bias else set())
    if set(state) != want:
        diff = sorted(set(state) ^ want)[:3]
        raise _refuse(folder, f"params.pt has other translator keys than {L} layers of {d} need (e.g. {diff})")
    eye = torch.eye(d, dtype=torch.float64)
    A: list[torch.Tensor | None] = [
        eye + _tensor(folder, f"{i}.weight", state[f"{i}.weight"], (d, d)) for i in range(L)
    ]
    b: list[torch.Tensor | None] = [
        _tensor(folder, f"{i}.bias", state[f"{i}.bias"], (d,)) if bias else None for i in range(L)
    ]
    info = {
        "folder": str(folder),
        "format": "tuned-lens package (config.json + params.pt)",
        "model": {"name": cfg.get("base_model_name_or_path"), "unembed_hash": cfg.get("unembed_hash")},
    }
    return Lens("tuned", L, d, A, b, info)


def _load_jlens_reference(folder: Path, name: str, adapter: ModelAdapter, allow_pt: bool) -> Lens:
    """The Jacobian lens's reference artifact (anthropics/jacobian-lens ``JacobianLens.save``, as
    TransformerLens documents it): one ``.pt`` with ``J`` ``{layer: [d, d]}`` (``J[l]`` carries the output of
    block ``l``, our row ``l + 1``, to the final block's output before the final norm, read as ``J[l] @ h``),
    ``n_prompts``, ``source_layers``, ``d_model`` and optionally ``metadata``. Rows it has no matrix for
    (always row 0, the embedding) read as the logit lens, with a warning."""
    if not allow_pt:
        raise _refuse(folder, PT_REFUSED.format(name=name, kind="jacobian", folder=folder))
    path = folder_file(folder, name)
    assert path is not None
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # the restricted unpickler raises UnpicklingError, a truncated zip RuntimeError, ...
        raise _refuse(folder, f"{name} is not a readable tensor file ({type(e).__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("J"), dict):
        raise _refuse(folder, f"{name} is not a Jacobian lens artifact (no 'J' dict of per-layer matrices)")
    L, d = adapter.n_layers, adapter.d_model
    if obj.get("d_model") != d:
        raise _refuse(
            folder,
            f"{name} is a lens for d_model {obj.get('d_model')!r}; {adapter.name} has d_model {d}: "
            "a lens reads only the model it was fitted on",
        )
    A: list[torch.Tensor | None] = [None] * L
    for layer, m in obj["J"].items():
        if not isinstance(layer, int) or not 0 <= layer < L - 1:
            raise _refuse(
                folder,
                f"{name} has a matrix for layer {layer!r}; {adapter.name}'s source layers are 0..{L - 2}: "
                "a lens reads only the model it was fitted on",
            )
        A[layer + 1] = _tensor(folder, f"J[{layer}]", m, (d, d))
    missing = [r for r in range(L) if A[r] is None]
    info: dict[str, Any] = {
        "folder": str(folder),
        "format": f"Jacobian lens reference artifact ({name})",
        "model": {"n_prompts": obj.get("n_prompts"), "metadata": obj.get("metadata")},
        "warning": f"rows {missing} (0: the embedding) have no matrix in {name}: they read as the logit lens",
    }
    return Lens("jacobian", L, d, A, [None] * L, info)


def save_tuned_lens_package(folder: Path | str, lens: Lens, model_name: str) -> None:
    """Write ``lens`` (a tuned lens) in the tuned-lens package's layout: ``config.json`` and ``params.pt``
    (``{i}.weight = A_i - I``, ``{i}.bias = b_i``, float32, for ``i = 0 .. n_layers - 1``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = lens.d_model
    eye = torch.eye(d, dtype=torch.float64)
    state = {}
    for i in range(lens.n_layers):
        a, b = lens.A[i], lens.b[i]
        state[f"{i}.weight"] = ((a if a is not None else eye) - eye).float().contiguous()
        state[f"{i}.bias"] = (b if b is not None else torch.zeros(d, dtype=torch.float64)).float().contiguous()
    torch.save(state, folder / "params.pt")
    cfg = {
        "base_model_name_or_path": model_name,
        "d_model": d,
        "num_hidden_layers": lens.n_layers,
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": None,
        "lens_type": "linear_tuned_lens",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
