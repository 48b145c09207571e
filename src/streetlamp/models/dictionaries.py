"""Reading and writing feature sets (``--features DICT``): weights through safetensors only, never a pickle.

:func:`load_features` reads a folder in one of the formats it recognises by what the folder holds:

- **streetlamp** (``features.json`` + one ``.safetensors`` per dictionary), written by :func:`save_features`
  (``streetlamp features-fit`` writes it);
- **SAELens** (``cfg.json`` + ``sae_weights.safetensors``, what ``SAE.save_model`` writes; or a folder of
  such folders, one per layer): architectures ``standard``, ``topk``, ``jumprelu`` (SAEs on the residual
  stream) and ``transcoder``, ``skip_transcoder``, ``jumprelu_transcoder``, ``jumprelu_skip_transcoder``;
- **circuit-tracer** transcoder sets (``config.yaml`` with ``model_kind: transcoder_set``,
  ``feature_input_hook``, ``feature_output_hook`` and one ``layer_{i}.safetensors`` per layer, what
  ``TranscoderSet.to_safetensors`` and circuit-tracer's cache write).

Both read TransformerLens hook names; :data:`TL_HOOKS` is the one table mapping them onto streetlamp's
sites (docs/feature-sets.md). What a format can say and streetlamp cannot express (a gated SAE, a
per-token input norm, a hook between the attention and the MLP's norm, a cross-layer transcoder) is
refused in one line naming it.

Every file a folder names is read through :func:`~streetlamp.store.files.folder_file` (never outside the
folder); a truncated or corrupt weights file, a pickle, a missing tensor or a tensor of the wrong shape is
one clear line (:class:`~streetlamp.errors.StreetlampError`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import StreetlampError
from ..store.files import folder_file, write_json
from .features import ACTIVATIONS, FEATURE_SITES, Dictionary, FeatureSet

if TYPE_CHECKING:
    from .adapter import ModelAdapter

__all__ = ["FORMAT", "TL_HOOKS", "load_features", "read_safetensors", "save_features"]

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


def _load_streetlamp(folder: Path, adapter: ModelAdapter | None = None) -> FeatureSet:
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


# -- TransformerLens hook names -> streetlamp's sites -------------------------------------------------------
@dataclass(frozen=True)
class Hook:
    """What a TransformerLens hook ``blocks.{l}.<name>`` is in streetlamp's terms: ``role`` ``resid`` (an SAE
    reads and writes the residual stream there: ``layers.{l + offset}.resid_pre``), ``mlp_in`` (a transcoder
    reads the MLP's input there) or ``mlp_out`` (a transcoder writes the MLP's output there); ``fold``:
    ``norm`` where the hook sits inside the pre-MLP norm, before its gain (and bias), which streetlamp folds
    into the encoder given the model; ``sandwich``: refused on a family whose MLP output is normalised before
    it joins the residual stream (Gemma: TransformerLens's ``hook_mlp_out`` is after that norm, streetlamp's
    ``mlp.out`` before it)."""

    role: str
    offset: int = 0
    fold: str | None = None


# The one table: SAELens's ``hook_name`` / ``hook_name_out`` and circuit-tracer's ``feature_input_hook`` /
# ``feature_output_hook`` (TransformerLens names, ``blocks.{l}.`` before each; circuit-tracer's omit it).
# A hook not listed (``hook_resid_mid``: the residual stream between the attention and the pre-MLP norm,
# ``hook_attn_out``, ``attn.hook_z``, ...) is refused, named.
TL_HOOKS: dict[str, Hook] = {
    "hook_resid_pre": Hook("resid"),
    "hook_resid_post": Hook("resid", offset=1),  # layer l's output is layer l + 1's input
    "hook_mlp_in": Hook("mlp_in"),
    "mlp.hook_in": Hook("mlp_in"),
    "ln2.hook_normalized": Hook("mlp_in", fold="norm"),
    "hook_mlp_out": Hook("mlp_out", fold="sandwich"),
    "mlp.hook_out": Hook("mlp_out"),
}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
# why the hooks streetlamp cannot splice at are refused (the rest: "not a site streetlamp splices at")
_UNMAPPED = {
    "hook_resid_mid": "the residual stream between the attention and the pre-MLP norm, which streetlamp's "
    "transcoders do not read (they read the MLP's input, after the norm: hook_mlp_in or ln2.hook_normalized)",
    "hook_attn_out": "the attention output: streetlamp splices dictionaries at resid_pre and the MLP only",
}


def tl_hook(name: object, where: str) -> tuple[int, str, Hook]:
    """``blocks.{l}.<hook>`` -> ``(l, hook, Hook)``, or one clear line naming a hook streetlamp cannot map."""
    m = _BLOCK.match(name) if isinstance(name, str) else None
    if m is None:
        raise StreetlampError(f"{where}: hook {name!r} is not a TransformerLens block hook (blocks.<layer>.<hook>)")
    layer, hook = int(m.group(1)), m.group(2)
    h = TL_HOOKS.get(hook)
    if h is None:
        why = _UNMAPPED.get(hook, "not a site streetlamp splices dictionaries at")
        raise StreetlampError(
            f"{where}: hook {name!r} refused: {why}; streetlamp maps {', '.join(TL_HOOKS)} (docs/feature-sets.md)"
        )
    return layer, hook, h


def _pre_mlp_norm(adapter: ModelAdapter, layer: int, where: str, hook: str) -> Any:
    from .readout import Norm
    from .sites import submodule

    c = adapter.family.circuit
    if c is None:
        raise StreetlampError(
            f"{where}: {hook} reads the pre-MLP norm before its gain, and streetlamp does not know where "
            f"{adapter.family.name}'s pre-MLP norm is: use a dictionary on hook_mlp_in"
        )
    return Norm.of(submodule(adapter.layer_modules[layer], c.mlp_norm), adapter.family.norm_offset)


def _fold_norm(d: Dictionary, adapter: ModelAdapter | None, where: str, hook: str) -> Dictionary:
    """A transcoder reading ``n`` (the pre-MLP norm's output before its gain g and bias β) as one reading the
    MLP's input ``u = g n + β``: ``n W + b = u (W / g) + (b − (β / g) W)``. Needs the model (its g and β)."""
    if adapter is None:
        raise StreetlampError(
            f"{where}: {hook} is the pre-MLP norm before its gain, which streetlamp folds into the encoder "
            "given the model: load it with the model (--features with --model, or load_features(folder, adapter))"
        )
    if not 0 <= d.layer < adapter.n_layers:
        return d  # FeatureSet.check says so, in its words
    norm = _pre_mlp_norm(adapter, d.layer, where, hook)
    g = norm.weight.detach().to("cpu", torch.float64)
    if g.shape[0] != d.d_in:
        return d  # FeatureSet.check refuses the width
    if bool((g == 0).any()):
        raise StreetlampError(f"{where}: {hook}: the pre-MLP norm of layer {d.layer} has a zero gain; cannot fold it")
    W = d.W_enc.to(torch.float64)
    b = d.b_enc.to(torch.float64)
    if norm.bias is not None:
        b = b - (norm.bias.detach().to("cpu", torch.float64) / g) @ W
    return Dictionary(
        d.layer,
        d.where,
        W_enc=W / g[:, None],
        b_enc=b,
        W_dec=d.W_dec,
        b_dec=d.b_dec,
        activation=d.activation,
        k=d.k,
        threshold=d.threshold,
        b_dec_in=d.b_dec_in,
        W_skip=d.W_skip,
    )


def _place(
    hooks: tuple[str, str | None], where: str, kind: str, adapter: ModelAdapter | None
) -> tuple[int, str, str | None]:
    """``(layer, where, fold)`` of a dictionary reading at ``hooks[0]`` and writing at ``hooks[1]`` (None: an
    SAE, which writes where it reads); ``kind`` is what the format calls it (``SAE``, ``transcoder``)."""
    l_in, h_in, hk_in = tl_hook(hooks[0], where)
    if hooks[1] is None:
        if hk_in.role != "resid":
            raise StreetlampError(
                f"{where}: an {kind} on {hooks[0]}: streetlamp splices SAEs on the residual stream only "
                "(hook_resid_pre, hook_resid_post); a dictionary on the MLP must be a transcoder"
            )
        layer = l_in + hk_in.offset
        if adapter is not None and layer == adapter.n_layers:
            raise StreetlampError(
                f"{where}: {hooks[0]} is the model's last residual stream (after its last layer), which "
                "streetlamp does not splice at"
            )
        return layer, "resid_pre", None
    l_out, h_out, hk_out = tl_hook(hooks[1], where)
    if hk_in.role != "mlp_in" or hk_out.role != "mlp_out" or l_in != l_out:
        raise StreetlampError(
            f"{where}: a {kind} reading {hooks[0]} and writing {hooks[1]}: streetlamp's transcoders read one "
            "layer's MLP input (hook_mlp_in, mlp.hook_in, ln2.hook_normalized) and write its output "
            "(hook_mlp_out, mlp.hook_out)"
        )
    if hk_out.fold == "sandwich" and adapter is not None and adapter.family.readout is not None:
        if adapter.family.readout.mlp_out is not None:
            raise StreetlampError(
                f"{where}: {hooks[1]} is {adapter.family.name}'s MLP output after its post-MLP norm; streetlamp's "
                "transcoders write the MLP's own output (mlp.hook_out)"
            )
    return l_in, "mlp", hk_in.fold


# -- SAELens -------------------------------------------------------------------------------------------------
SAELENS_CFG, SAELENS_WEIGHTS = "cfg.json", "sae_weights.safetensors"
# SAELens architecture -> (streetlamp activation, a transcoder, a skip transcoder)
SAELENS_ARCHS: dict[str, tuple[str, bool, bool]] = {
    "standard": ("relu", False, False),
    "topk": ("topk", False, False),
    "jumprelu": ("jumprelu", False, False),
    "transcoder": ("relu", True, False),
    "skip_transcoder": ("relu", True, True),
    "jumprelu_transcoder": ("jumprelu", True, False),
    "jumprelu_skip_transcoder": ("jumprelu", True, True),
}
_SAELENS_REFUSED = {
    "gated": "its gate path and magnitude path are two encoders",
    "batchtopk": "a training architecture (SAELens saves it for inference as jumprelu)",
    "matryoshka_batchtopk": "a training architecture (SAELens saves it for inference as jumprelu)",
    "abstopk": "TopK by absolute value keeps negative latents",
    "temporal": "its latents read earlier positions",
    "matching_pursuit": "its latents are chosen one after another against a residual",
}


def _json(folder: Path, name: str) -> dict:
    path = folder_file(folder, name)
    assert path is not None
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StreetlampError(f"{folder}: {name} is not JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise StreetlampError(f"{folder}: {name} is not a JSON object")
    return cfg


def _saelens_one(folder: Path, adapter: ModelAdapter | None) -> tuple[Dictionary, dict]:
    where = str(folder)
    cfg = _json(folder, SAELENS_CFG)
    meta: dict = cfg["metadata"] if isinstance(cfg.get("metadata"), dict) else {}

    def get(*keys: str) -> Any:
        # SAELens < 6 kept these at the top level under older names (its handle_pre_6_0_config)
        return next((c[k] for k in keys for c in (meta, cfg) if c.get(k) is not None), None)

    arch = cfg.get("architecture") or "standard"
    fn_kwargs: dict = cfg["activation_fn_kwargs"] if isinstance(cfg.get("activation_fn_kwargs"), dict) else {}
    if arch == "standard" and (cfg.get("activation_fn") or cfg.get("activation_fn_str")) == "topk":
        arch = "topk"
    if arch not in SAELENS_ARCHS:
        why = _SAELENS_REFUSED.get(arch, "not one streetlamp knows")
        raise StreetlampError(
            f"{where}: SAELens architecture {arch!r} refused: {why}; streetlamp reads {', '.join(SAELENS_ARCHS)}"
        )
    act, transcoder, skip = SAELENS_ARCHS[arch]
    norm = cfg.get("normalize_activations")
    if norm in (True, "expected_average_only_in"):
        norm = "expected_average_only_in"  # SAELens's inference SAE applies no run-time norm for it either
    elif norm not in (None, False, "none"):
        raise StreetlampError(
            f"{where}: normalize_activations={norm!r} refused: a per-token norm of the input is not an affine "
            "encoder; streetlamp reads 'none' (and 'expected_average_only_in', which SAELens folds into the weights)"
        )
    if cfg.get("reshape_activations") not in (None, "none") or get("hook_head_index") is not None:
        raise StreetlampError(f"{where}: a per-head SAE (hook_z, hook_head_index) refused: streetlamp has no such site")
    hook_in = get("hook_name", "hook_point")
    hook_out = get("hook_name_out") if transcoder else None
    if transcoder and hook_out is None:
        raise StreetlampError(f"{where}: a SAELens transcoder without metadata.hook_name_out (where it writes)")
    layer, site, fold = _place((hook_in, hook_out), where, "transcoder" if transcoder else "SAE", adapter)
    w = read_safetensors(folder, SAELENS_WEIGHTS)
    at = f"{folder}/{SAELENS_WEIGHTS}"
    W_enc, b_enc, W_dec, b_dec = (_tensor(w, k, at) for k in ("W_enc", "b_enc", "W_dec", "b_dec"))
    assert W_enc is not None and b_enc is not None and W_dec is not None and b_dec is not None
    d_in, d_sae = cfg.get("d_in"), cfg.get("d_sae")
    if W_enc.ndim != 2 or (d_in, d_sae) != tuple(W_enc.shape):
        raise StreetlampError(
            f"{where}: cfg.json says d_in={d_in}, d_sae={d_sae}, but W_enc has shape {tuple(W_enc.shape)}"
        )
    scaling = w.get("scaling_factor")
    if scaling is not None and not torch.equal(scaling, torch.ones_like(scaling)):
        raise StreetlampError(f"{where}: a finetuning scaling factor (scaling_factor) refused: fold it first")
    threshold = w.get("threshold")
    if threshold is None and "log_threshold" in w:
        threshold = torch.exp(w["log_threshold"])
    if act == "jumprelu":
        if threshold is None:
            raise StreetlampError(f"{where}: a {arch} SAE without a threshold")
        # SAELens's JumpReLU is relu(z)·[z > θ]: with θ < 0 that is z·[z > 0]
        threshold = threshold.clamp(min=0)
    k = None
    if act == "topk":
        k = cfg.get("k", fn_kwargs.get("k"))
        if not isinstance(k, int) or isinstance(k, bool):
            raise StreetlampError(f"{where}: a TopK SAE without an integer k")
        if cfg.get("rescale_acts_by_decoder_norm"):
            # SAELens ranks z·|W_dec row| and decodes a/|W_dec row|: the same latents with the norms folded
            n = W_dec.norm(dim=-1)
            W_enc, b_enc, W_dec = W_enc * n, b_enc * n, W_dec / n[:, None]
    W_skip = w.get("W_skip") if skip else None
    if skip and W_skip is None:
        raise StreetlampError(f"{where}: a {arch} without W_skip")
    try:
        d = Dictionary(
            layer,
            site,  # type: ignore[arg-type]
            W_enc=W_enc,
            b_enc=b_enc,
            W_dec=W_dec,
            b_dec=b_dec,
            activation=act,  # type: ignore[arg-type]
            k=k,
            threshold=threshold if act == "jumprelu" else None,
            b_dec_in=bool(cfg.get("apply_b_dec_to_input", not transcoder)) and not transcoder,
            W_skip=None if W_skip is None else W_skip.T,  # SAELens: x @ W_skip.T, W_skip [d_out, d_in]
        )
    except StreetlampError as err:
        raise StreetlampError(f"{where}: {err}") from None
    if fold == "norm":
        d = _fold_norm(d, adapter, where, str(hook_in))
    info = {
        "architecture": arch,
        "hook_name": hook_in,
        **({"hook_name_out": hook_out} if hook_out else {}),
        "normalize_activations": norm or "none",
        "model_name": get("model_name"),
        "sae_lens_version": get("sae_lens_version"),
    }
    return d, info


def _saelens_folders(folder: Path) -> list[Path]:
    if folder_file(folder, SAELENS_CFG, missing_ok=True) is not None:
        return [folder]
    return sorted(
        p.parent for p in folder.glob(f"*/{SAELENS_CFG}") if folder_file(folder, f"{p.parent.name}/{SAELENS_CFG}")
    )


def _load_saelens(folder: Path, adapter: ModelAdapter | None = None) -> FeatureSet:
    """One SAELens SAE or transcoder (``cfg.json`` + ``sae_weights.safetensors``), or a folder of them."""
    out: dict[tuple[int, str], Dictionary] = {}
    infos = []
    models = set()
    for sub in _saelens_folders(folder):
        d, info = _saelens_one(sub, adapter)
        if (d.layer, d.where) in out:
            raise StreetlampError(f"{folder}: two dictionaries at layer {d.layer} ({d.where})")
        out[(d.layer, d.where)] = d
        infos.append({"folder": str(sub.relative_to(folder)) if sub != folder else ".", **info})
        if info["model_name"]:
            models.add(info["model_name"])
    model = models.pop() if len(models) == 1 else None
    return FeatureSet(out, source=str(folder), format="saelens", model=model, info={"saes": infos})


# -- circuit-tracer ------------------------------------------------------------------------------------------
CIRCUIT_TRACER_CFG = "config.yaml"
_LAYER_FILE = re.compile(r"^layer_(\d+)\.safetensors$")


def _load_circuit_tracer(folder: Path, adapter: ModelAdapter | None = None) -> FeatureSet:
    """A circuit-tracer transcoder set: ``config.yaml`` (``model_kind: transcoder_set``, the feature input and
    output hooks, optionally ``transcoders``: one file per layer, in layer order) and ``layer_{i}.safetensors``
    (``W_enc [width, d_model]``, ``W_dec [width, d_model]``, ``b_enc``, ``b_dec``, optional ``W_skip``
    applied as ``x W_skipᵀ`` and ``activation_function.threshold`` for JumpReLU)."""
    import yaml

    path = folder_file(folder, CIRCUIT_TRACER_CFG)
    assert path is not None
    try:
        cfg = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise StreetlampError(f"{folder}: {CIRCUIT_TRACER_CFG} is not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise StreetlampError(f"{folder}: {CIRCUIT_TRACER_CFG} is not a mapping")
    kind = cfg.get("model_kind", "transcoder_set")
    if kind != "transcoder_set":
        raise StreetlampError(
            f"{folder}: circuit-tracer model_kind {kind!r} refused: streetlamp reads per-layer transcoder sets "
            "(a cross-layer transcoder's latents write to every later layer, which one dictionary per site cannot say)"
        )
    hooks = cfg.get("feature_input_hook"), cfg.get("feature_output_hook")
    if not all(isinstance(h, str) for h in hooks):
        raise StreetlampError(f"{folder}: {CIRCUIT_TRACER_CFG} needs feature_input_hook and feature_output_hook")
    files: list[tuple[int, str]]
    listed = cfg.get("transcoders")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
            raise StreetlampError(f"{folder}: {CIRCUIT_TRACER_CFG}: transcoders must be a list of file names")
        for f in listed:
            if "://" in f:
                raise StreetlampError(
                    f"{folder}: transcoder {f!r} is remote; streetlamp downloads nothing: put the files in the folder"
                )
            if not f.endswith(".safetensors"):
                raise StreetlampError(f"{folder}: transcoder {f!r} refused: safetensors only")
        files = list(enumerate(listed))
    else:
        found = [(int(m.group(1)), p.name) for p in folder.iterdir() if (m := _LAYER_FILE.match(p.name))]
        files = sorted(found)
    if not files:
        raise StreetlampError(f"{folder}: a circuit-tracer set with no layer_<i>.safetensors")
    out: dict[tuple[int, str], Dictionary] = {}
    for layer, name in files:
        where = f"{folder}/{name}"
        l_hooks = tuple(f"blocks.{layer}.{h}" for h in hooks)
        l, site, fold = _place(l_hooks, where, "transcoder", adapter)  # type: ignore[arg-type]
        w = read_safetensors(folder, name)
        if "w_enc" in w or "affine_skip_connection" in w:
            raise StreetlampError(
                f"{where}: Gemma Scope 2's key names (w_enc, w_dec): convert with circuit-tracer's "
                "save_transcoders_to_cache first (it writes W_enc, W_dec)"
            )
        W_enc, b_enc, W_dec, b_dec = (_tensor(w, k, where) for k in ("W_enc", "b_enc", "W_dec", "b_dec"))
        assert W_enc is not None and b_enc is not None and W_dec is not None and b_dec is not None
        width, d_model = b_enc.shape[0], b_dec.shape[0]
        if tuple(W_enc.shape) != (width, d_model):
            raise StreetlampError(f"{where}: W_enc has shape {tuple(W_enc.shape)}, expected ({width}, {d_model})")
        if tuple(W_dec.shape) == (d_model, width) and width != d_model:
            W_dec = W_dec.T  # circuit-tracer < 0.2 stored W_dec as [d_model, width]
        threshold = w.get("activation_function.threshold")
        if threshold is not None and threshold.ndim == 0:
            threshold = threshold.expand(width)
        W_skip = w.get("W_skip")
        try:
            d = Dictionary(
                l,
                site,  # type: ignore[arg-type]
                W_enc=W_enc.T,
                b_enc=b_enc,
                W_dec=W_dec,
                b_dec=b_dec,
                activation="jumprelu" if threshold is not None else "relu",
                threshold=threshold,
                W_skip=None if W_skip is None else W_skip.T,  # circuit-tracer: x @ W_skip.T
            )
        except StreetlampError as err:
            raise StreetlampError(f"{where}: {err}") from None
        if fold == "norm":
            d = _fold_norm(d, adapter, where, l_hooks[0])
        if (l, site) in out:
            raise StreetlampError(f"{folder}: two transcoders at layer {l}")
        out[(l, site)] = d
    info = {
        "feature_input_hook": hooks[0],
        "feature_output_hook": hooks[1],
        **{k: cfg[k] for k in ("model_name", "scan") if isinstance(cfg.get(k), str)},
    }
    model = cfg.get("model_name") if isinstance(cfg.get("model_name"), str) else None
    return FeatureSet(out, source=str(folder), format="circuit-tracer", model=model, info=info)


def _has(name: str) -> Any:
    return lambda folder: folder_file(folder, name, missing_ok=True) is not None


# the formats, each recognised by what marks it (the first that matches reads the folder)
READERS: list[tuple[str, Any, Any]] = [
    (INDEX, _has(INDEX), _load_streetlamp),
    (CIRCUIT_TRACER_CFG, _has(CIRCUIT_TRACER_CFG), _load_circuit_tracer),
    (SAELENS_CFG, lambda folder: bool(_saelens_folders(folder)), _load_saelens),
]


def load_features(path: Path | str, adapter: ModelAdapter | None = None) -> FeatureSet:
    """The feature set in folder ``path`` (its format recognised by what it holds), or one clear line.
    ``adapter``: the model it will splice into; needed where a format's hook sits before a norm's gain
    (``ln2.hook_normalized``: folded into the encoder) and to refuse hooks that mean something else on the
    model's family. It does not attach the set (:meth:`ModelAdapter.attach_features` does, after checking)."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        suffix = folder.suffix.lower()
        if suffix in (".pt", ".pth", ".bin", ".pkl", ".ckpt"):
            raise StreetlampError(f"--features {path}: a pickle ({suffix}) refused: safetensors only, in a folder")
    if not folder.is_dir():
        raise StreetlampError(f"--features {path}: not a folder (a feature set is a folder of safetensors files)")
    for _, holds, read in READERS:
        if holds(folder):
            return read(folder, adapter)
    markers = ", ".join(m for m, _, _ in READERS)
    raise StreetlampError(
        f"--features {path}: no feature set there (looked for {markers}, or SAELens folders holding {SAELENS_CFG})"
    )
