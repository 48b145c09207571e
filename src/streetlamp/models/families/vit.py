"""ViT (``ViTForImageClassification``; transformers 5: q/k/v/o_proj, mlp.fc1/fc2): patches as tokens
(:mod:`streetlamp.models.images`). ``embed`` hooks ``ViTEmbeddings`` and exposes cat([CLS], patch
embeddings) before the position embeddings."""

from __future__ import annotations

from typing import Any, cast

from ..kinds import CLASSIFIER
from .base import Family, NormPlacement, TinySpec

# The tiny ViT: 32 x 32 RGB images cut into 8 x 8 patches, so [CLS] + 16 patch tokens.
TINY_IMAGE_SIZE, TINY_PATCH = 32, 8


def _embed_hook(session: Any) -> Any:
    from ..images import vit_embed_hook  # lazy for start-up time: the registry imports without torch

    return vit_embed_hook(session)


def _processor() -> Any:
    """The Pillow image processor (no torchvision needed): resize to 32 x 32, scale to [0, 1], normalise
    with mean and std 0.5 as google/vit-base-patch16-224 does."""
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": TINY_IMAGE_SIZE, "width": TINY_IMAGE_SIZE})


def _tiny(processor: Any, layers: int, heads: int, d_model: int) -> Any:
    """ViTForImageClassification on 32 x 32 images with 8 x 8 patches; ``initializer_range`` 0.2, as for
    the tiny decoders, so attention is far from uniform."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    cfg = cast(Any, ViTConfig)(
        hidden_size=d_model,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * d_model,
        image_size=TINY_IMAGE_SIZE,
        patch_size=TINY_PATCH,
        num_channels=3,
        initializer_range=0.2,
        num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "car"},
        label2id={"cat": 0, "dog": 1, "car": 2},
    )
    model = ViTForImageClassification(cfg)
    with torch.no_grad():  # HF initialises it to 0; a trained ViT's is not, so the [MEAN] patch's embedding
        # (the projection of a zero patch: this bias) differs from IG's zero-vector baseline, as on real models
        cast(torch.Tensor, model.vit.embeddings.patch_embeddings.projection.bias).normal_(0.0, 0.2)
    return model


VIT = Family(
    "vit",
    layers="layers",
    attn="attention",
    o_proj="attention.o_proj",
    mlp_out="mlp.fc2",
    embed="embeddings",
    norm=NormPlacement("pre", "layernorm_before", "layernorm"),
    attnlrp_refusal=None,
    bidirectional=True,
    reads_cls=True,
    modality="image",
    embed_hook=_embed_hook,
    tiny=TinySpec(CLASSIFIER, _tiny, tokenizer=_processor),
)
