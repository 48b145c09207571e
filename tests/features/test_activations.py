"""The activation stream (features/activations.py): the site's values against a hand-written forward, the
seeded order, shards equal whether the stream starts at 0 or resumes, the corpus mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.features.activations import SKIP_FIRST, build_corpus, sequence_order, site_activations, stream

from .helpers import adapter64, corpus_file


def test_transcoder_site_is_the_mlp_input_and_its_output() -> None:
    """The input is post_attention_layernorm(resid_pre + attn.out) (by hand); the target is the MLP of it."""
    a = adapter64("llama")
    ids = torch.tensor([[3, 9, 12, 7, 30, 11, 5, 8], [4, 14, 22, 9, 9, 31, 6, 17]])
    got = site_activations(a, ids, [0, 1], "mlp")
    from streetlamp.models.adapter import Inputs

    cache = a.forward(Inputs.from_ids(a, ids, strings=False), record=["layers.1.resid_pre", "layers.1.attn.out"]).cache
    layer = a.layer_modules[1]
    mid = cache["layers.1.resid_pre"] + cache["layers.1.attn.out"]
    norm = layer.post_attention_layernorm
    m32 = mid.float()  # Llama's RMSNorm normalises in float32, then applies its gain in the input's dtype
    h = norm.weight * (m32 * torch.rsqrt(m32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).double()
    x, y = got[1]
    torch.testing.assert_close(x, h, rtol=0, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(y, layer.mlp(x), rtol=0, atol=1e-12)
    assert x.shape == (2, 8, a.d_model)


def test_sae_site_is_resid_pre() -> None:
    a = adapter64("qwen2")
    ids = torch.tensor([[3, 9, 12, 7, 30, 11]])
    got = site_activations(a, ids, [1], "resid_pre")
    from streetlamp.models.adapter import Inputs

    want = a.forward(Inputs.from_ids(a, ids, strings=False), record=["layers.1.resid_pre"]).cache["layers.1.resid_pre"]
    assert torch.equal(got[1][0], want) and torch.equal(got[1][1], want)


def test_sequence_order_covers_each_epoch_once() -> None:
    order = sequence_order(7, 0, 21, seed=3)
    for e in range(3):
        assert sorted(order[7 * e : 7 * e + 7].tolist()) == list(range(7))
    assert order[:7].tolist() == list(range(7))  # epoch 0: the corpus's own (seeded) order
    assert order[7:14].tolist() != order[14:21].tolist()
    # any window equals the same window of a longer run (what resuming relies on)
    assert np.array_equal(sequence_order(7, 5, 9, seed=3), order[5:14])


def test_shards_resume_exactly_and_never_repeat(tmp_path) -> None:
    a = adapter64("llama")
    corpus = build_corpus(a, str(corpus_file(tmp_path)), tokens=100, seq_len=12, heldout=2, seed=0)
    n = corpus.train.shape[0]
    assert n == 100 // 11 + 1 and 6 * 3 > n  # the six shards run into a second epoch
    full = list(stream(a, corpus.train, [0, 1], "mlp", batch_seqs=3, seed=5, start=0, stop=6))
    tail = list(stream(a, corpus.train, [0, 1], "mlp", batch_seqs=3, seed=5, start=4, stop=6))
    for s, t in zip(full[4:], tail, strict=True):
        assert s.index == t.index and np.array_equal(s.sequences, t.sequences)
        assert torch.equal(s.token_ids, t.token_ids)
        for l in (0, 1):
            assert torch.equal(s.acts[l][0], t.acts[l][0]) and torch.equal(s.acts[l][1], t.acts[l][1])
    seqs = np.concatenate([s.sequences for s in full])
    first_epoch = seqs[:n]
    assert sorted(first_epoch.tolist()) == list(range(n))  # each training sequence once per epoch
    # each shard: B (seq_len - 1) tokens, position 0 dropped; the rows are a permutation of the sequences' tokens
    s = full[1]
    assert s.token_ids.numel() == 3 * (12 - SKIP_FIRST) == s.acts[0][0].shape[0]
    want = corpus.train[torch.as_tensor(s.sequences)][:, SKIP_FIRST:].reshape(-1)
    assert sorted(s.token_ids.tolist()) == sorted(want.tolist())
    # the held-out sequences are not training sequences
    assert corpus.held.shape[0] == 2 and corpus.train.shape[0] + 2 == corpus.sequences.shape[0]


def test_corpus_is_seeded_and_mixed(tmp_path) -> None:
    a = adapter64("llama")
    f1 = corpus_file(tmp_path, n=200, seed=1, name="one.csv")
    f2 = corpus_file(tmp_path, n=30, seed=2, name="two.csv")
    spec = f"{f1},{f2}"
    c1 = build_corpus(a, spec, tokens=300, seq_len=10, heldout=2, seed=0)
    c2 = build_corpus(a, spec, tokens=300, seq_len=10, heldout=2, seed=0)
    c3 = build_corpus(a, spec, tokens=300, seq_len=10, heldout=2, seed=1)
    assert torch.equal(c1.sequences, c2.sequences) and not torch.equal(c1.sequences, c3.sequences)
    src = c1.describe()["sources"]
    one, two = src[str(f1)], src[str(f2)]
    # equal shares while both have text: the counts differ by at most one text (<= 15 tokens with its separator)
    assert abs(one["tokens"] - two["tokens"]) <= 15
    assert one["tokens"] + two["tokens"] >= 10 * c1.sequences.shape[0]
    with pytest.raises(StreetlampError, match="held out"):
        build_corpus(a, str(f2), tokens=10, seq_len=400, heldout=2, seed=0)
