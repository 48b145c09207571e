"""Tiny random feature sets for the tiny Llama (d_model 32), in streetlamp's own format: what command tests
(manifests, the device matrix) pass to ``--features``."""

from __future__ import annotations

from pathlib import Path


def tiny_dictionary(folder: Path) -> Path:
    """A random transcoder at layer 1 of the tiny Llama (d_model 32), in streetlamp's format."""
    import torch

    from streetlamp.models.dictionaries import save_features
    from streetlamp.models.features import Dictionary, FeatureSet

    g = torch.Generator().manual_seed(0)
    d = Dictionary(
        1,
        "mlp",
        torch.randn(32, 64, generator=g) / 6,
        torch.zeros(64),
        torch.randn(64, 32, generator=g) / 8,
        torch.zeros(32),
    )
    save_features(FeatureSet({(1, "mlp"): d}, "random"), folder)
    return folder


def tiny_transcoders(folder: Path) -> Path:
    """Random transcoders at both layers of the tiny llama (d_model 32) for ``graph``."""
    import torch

    from streetlamp.models.dictionaries import save_features
    from streetlamp.models.features import Dictionary, FeatureSet

    g = torch.Generator().manual_seed(0)
    dicts = {
        (l, "mlp"): Dictionary(
            l,
            "mlp",
            torch.randn(32, 48, generator=g) / 6,
            torch.zeros(48) - 0.2,
            torch.randn(48, 32, generator=g) / 7,
            torch.zeros(32),
        )
        for l in range(2)
    }
    save_features(FeatureSet(dicts, source="random"), folder)
    return folder
