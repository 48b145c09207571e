"""The shipped `minilm-sentiment` weights load, are small, and beat the majority baseline.

The accuracy threshold is the movie accuracy measured by scripts/train_sentiment.py and written
to meta.json (minus 0.02 slack for batching/platform float noise).
"""

from __future__ import annotations

import json

import pytest
import torch

from streetlamp.models.minilm import WEIGHTS_DIR, build_minilm_classifier, package_dir

MAX_BYTES = int(10.5 * 1024 * 1024)


def _movie_sentences() -> tuple[list[str], list[int]]:
    try:
        path = package_dir("gensim") / "test" / "test_data" / "pang_lee_polarity.cor"
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"gensim test data not installed: {exc}")
    texts, labels = [], []
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.strip():
            tag, text = line.split(" ", 1)
            texts.append(text.strip())
            labels.append({"__label__neg": 0, "__label__pos": 1}[tag])
    return texts, labels


def test_weights_file_is_small():
    size = (WEIGHTS_DIR / "model.safetensors").stat().st_size
    assert size <= MAX_BYTES, f"model.safetensors is {size / 1e6:.2f} MB"


def test_meta_is_complete():
    meta = json.loads((WEIGHTS_DIR / "meta.json").read_text())
    assert meta["num_labels"] == 2
    assert meta["id2label"] == {"0": "negative", "1": "positive"}
    assert meta["trained_parameters"]
    assert 0.0 < meta["movie_eval"]["majority_baseline"] < meta["movie_eval"]["accuracy"] <= 1.0


def test_shipped_weights_beat_majority_on_movie_sentences():
    meta = json.loads((WEIGHTS_DIR / "meta.json").read_text())
    model, tok = build_minilm_classifier()
    assert model.config.id2label == {0: "negative", 1: "positive"}
    texts, labels = _movie_sentences()
    assert len(texts) == meta["movie_eval"]["n"] == 200
    torch.set_num_threads(min(2, torch.get_num_threads()))
    correct = 0
    with torch.no_grad():
        for b in range(0, len(texts), 50):
            enc = tok(texts[b : b + 50], truncation=True, max_length=256, padding=True, return_tensors="pt")
            pred = model(**enc).logits.argmax(-1).tolist()
            correct += sum(int(p == g) for p, g in zip(pred, labels[b : b + 50]))
    acc = correct / len(texts)
    majority = max(sum(labels), len(labels) - sum(labels)) / len(labels)
    assert majority == pytest.approx(meta["movie_eval"]["majority_baseline"])
    assert acc >= meta["movie_eval"]["accuracy"] - 0.02, (acc, meta["movie_eval"])
    assert acc > majority, (acc, majority)
