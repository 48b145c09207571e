"""The one mask rule (models/masks.py) against transformers' own mask functions, cell by cell, and the
chunked pass's shortcuts (key range, mask bands) against the rule itself."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.masking_utils import (
    bidirectional_mask_function,
    causal_mask_function,
    sliding_window_bidirectional_overlay,
    sliding_window_overlay,
)

from streetlamp.models.masks import allowed, key_range, mask_bands, rule_mask

CPU = torch.device("cpu")


def peer(q_len: int, k_len: int, causal: bool, window: int | None) -> torch.Tensor:
    """transformers' mask functions, one cell at a time; the queries are the last q_len of k_len positions.
    Its bidirectional window is inclusive (|i - j| <= w), streetlamp's exclusive (|i - j| < w)."""
    off = k_len - q_len
    out = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i, j in itertools.product(range(q_len), range(k_len)):
        q = i + off
        ok = causal_mask_function(0, 0, q, j) if causal else bidirectional_mask_function(0, 0, q, j)
        if window:
            ok = ok and (
                sliding_window_overlay(window) if causal else sliding_window_bidirectional_overlay(window - 1)
            )(0, 0, q, j)
        out[i, j] = bool(ok)
    return out


# (causal, q_len, k_len): a causal query block may follow a KV cache (k_len > q_len); bidirectional
# queries and keys are the same positions
SHAPES = [
    (True, 1, 1),
    (True, 1, 7),
    (True, 5, 5),
    (True, 3, 8),
    (True, 8, 8),
    (False, 1, 1),
    (False, 5, 5),
    (False, 8, 8),
]


@pytest.mark.parametrize("window", [None, 1, 3, 9])
@pytest.mark.parametrize("causal,q_len,k_len", SHAPES)
def test_the_rule_is_transformers_masks(causal: bool, window: int | None, q_len: int, k_len: int) -> None:
    want = peer(q_len, k_len, causal, window)
    got = allowed(0, q_len, 0, k_len, causal, window, CPU, offset=k_len - q_len)
    assert torch.equal(got, want)
    m = rule_mask(q_len, k_len, causal, window, CPU)
    if m is None:  # nothing masked: the eager path and the fused kernel skip the mask
        assert bool(want.all())
    else:
        assert m.shape == (1, 1, q_len, k_len) and torch.equal(m[0, 0], want)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 2, 5])
def test_chunk_shortcuts_follow_the_rule(causal: bool, window: int | None) -> None:
    """Outside key_range every key is masked; outside the mask bands every key of the range is allowed;
    a sub-block of the rule is the rule of the whole read at those cells."""
    n = 13
    whole = allowed(0, n, 0, n, causal, window, CPU)
    assert torch.equal(whole, peer(n, n, causal, window))
    for r0, r1 in [(0, 4), (3, 7), (9, 13), (0, 13)]:
        k0, k1 = key_range(r0, r1, n, causal, window)
        rows = whole[r0:r1]
        assert not bool(rows[:, :k0].any()) and not bool(rows[:, k1:].any())
        inside = torch.ones(n, dtype=torch.bool)
        for a, b in mask_bands(r0, r1, k0, k1, causal, window):
            inside[a:b] = False
            assert torch.equal(allowed(r0, r1, a, b, causal, window, CPU), whole[r0:r1, a:b])
        assert bool(rows[:, k0:k1][:, inside[k0:k1]].all())
