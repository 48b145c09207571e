"""Ground truth (issue 38, Must-have 4): a tiny model whose MLP is a sparse dictionary by construction; the
transcoder fitted on its activations recovers the planted decoder directions (cosine >= 0.99 after Hungarian
matching) and its matched latents fire on the planted features' tokens."""

from __future__ import annotations

import numpy as np
import torch

from streetlamp.features.activations import build_corpus
from streetlamp.features.train import FitConfig, fit
from streetlamp.groundtruth.planted_features import planted_model, recovery
from streetlamp.models.adapter import Inputs

from .helpers import corpus_file


def test_the_planted_mlp_is_its_dictionary(tmp_path) -> None:
    """By construction: the spliced planted transcoder's error is zero (float64 rounding)."""
    p = planted_model()
    a = p.adapter
    a.attach_features(p.feature_set())
    ids = torch.tensor([[5, 9, 12, 30, 7, 2, 40, 11]])
    err = a.forward(Inputs.from_ids(a, ids, strings=False), record=["layers.0.mlp.features_error"]).cache
    assert err["layers.0.mlp.features_error"].abs().max() < 1e-12
    a.attach_features(None)


def test_fitted_transcoder_recovers_the_planted_features(tmp_path) -> None:
    p = planted_model(n_features=12, d_model=32, seed=0)
    a = p.adapter
    corpus = build_corpus(a, str(corpus_file(tmp_path, n=300)), tokens=4000, seq_len=16, heldout=2, seed=0)
    cfg = FitConfig(
        where="mlp",
        width=24,
        activation="relu",
        sparsity=0.5,
        lr=1e-2,
        batch_seqs=16,
        batch_tokens=40,
        shards=150,
        seed=0,
    )
    fs, _ = fit(a, corpus, [0], cfg)
    assert fs is not None
    d = fs.get(0, "mlp")
    match, cos = recovery(p, d)
    assert cos.min() >= 0.99, np.round(cos, 4)
    # every planted feature is matched to its own latent, and that latent fires on the planted feature's tokens
    a.attach_features(fs)
    ids = torch.tensor([[a.empty_context_token(), *sorted(p.supports)]])
    feats = a.forward(Inputs.from_ids(a, ids, strings=False), record=["layers.0.mlp.features"]).cache
    f = feats["layers.0.mlp.features"][0, 1:]
    a.attach_features(None)
    for col, t in enumerate(sorted(p.supports)):
        for i in p.supports[t]:
            assert f[col, int(match[i])] > 0, (t, i)
