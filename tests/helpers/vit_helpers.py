"""A tiny ViT for the tests, and a shim that lets the per-family tests written for text run on it.

The shared tests (tests/methods/test_conformance.py, test_recording.py, ...) feed ``TEXTS`` through
``adapter.encode`` and compare with an eager twin called as ``twin(input_ids=..., attention_mask=...)``.
:class:`TextsAsImages` maps each text to a fixed random image (seeded by the text, so a text is
always the same image, alone or in a batch) and :class:`PixelTwin` calls the Hugging Face eager
ViT on the pixel values an id row stands for; with them those tests run unchanged on ViT.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
from PIL import Image

from streetlamp.models.adapter import Inputs, ModelAdapter
from streetlamp.models.tiny import tiny_model
from tests.conftest import eager_twin


def random_image(seed: int, size: tuple[int, int] = (40, 48)) -> Image.Image:
    """A smooth random RGB image (blobs, not noise, so nearby patches are alike as in a photo)."""
    rng = np.random.default_rng(seed)
    small = rng.random((4, 5, 3))
    big = np.kron(small, np.ones((size[0] // 4, size[1] // 5 + 1, 1)))[: size[0], : size[1]]
    return Image.fromarray((255 * big).astype(np.uint8))


class TextsAsImages(ModelAdapter):
    """A ViT adapter whose ``encode`` also takes the test texts: each becomes its own random image."""

    def encode(self, texts: Any, truncate: bool = False) -> Inputs:
        items = [texts] if isinstance(texts, str) else list(texts)
        if all(isinstance(t, str) and not t.endswith(".png") for t in items):
            return super().encode([random_image(zlib.crc32(t.encode())) for t in items])
        return super().encode(texts)


def tiny_vit(seed: int = 1, double: bool = True, shim: bool = False) -> ModelAdapter:
    model, proc = tiny_model("vit", seed=seed)
    cls = TextsAsImages if shim else ModelAdapter
    return cls(model.double() if double else model, proc, "tiny-vit")


class PixelTwin(torch.nn.Module):
    """Hugging Face's eager ViT, called like a text model: id rows -> pixel values -> ``model(...)``."""

    def __init__(self, adapter: ModelAdapter) -> None:
        super().__init__()
        self.model = eager_twin(adapter)
        self.vocab: Any = adapter.tokenizer
        self.config = self.model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kw: Any) -> Any:
        assert attention_mask is None or bool(attention_mask.all()), "images are never padded"
        dtype = next(self.model.parameters()).dtype
        return self.model(pixel_values=self.vocab.pixels(input_ids).to(dtype), **kw)


def pixel_twin(adapter: ModelAdapter) -> torch.nn.Module:
    return PixelTwin(adapter) if adapter.modality == "image" else eager_twin(adapter)
