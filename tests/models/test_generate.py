"""Greedy generation with the KV cache (``ModelAdapter.generate``) against one full forward per token, on every
causal family's tiny model in float64, and against Hugging Face's own ``generate``."""

from __future__ import annotations

import pytest
import torch

from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import FAMILY_KINDS, tiny_model

CAUSAL = [f for f, k in FAMILY_KINDS.items() if k.causal]
TEXT = "the movie was not good , but the acting was great and i loved it"


def adapter_of(family: str) -> ModelAdapter:
    model, tok = tiny_model(family, seed=3, layers=2)
    return ModelAdapter(model.double(), tok, f"tiny-{family}")


def test_every_causal_family_is_covered() -> None:
    assert {"llama", "gpt2", "gemma2", "mistral", "mixtral", "gpt_oss"} <= set(CAUSAL)


@pytest.mark.parametrize("family", CAUSAL)
def test_cached_greedy_equals_a_full_forward_per_token(family: str) -> None:
    """The same tokens, and at every step the same next-token logits to float64 rounding: the cached path
    gives the new position the positions (RoPE, learned, sliding windows) of the full text."""
    a = adapter_of(family)
    ids = a.encode([TEXT]).input_ids[0]
    n = 12  # past the tiny Mistral/Gemma sliding windows
    cached = a.generate(ids, n, stop_at_eos=False)
    plain = a.generate(ids, n, stop_at_eos=False, kv_cache=False)
    assert cached == plain and len(cached) == n
    # the logits themselves, not only their argmax (a wrong position would often keep the argmax)
    from streetlamp.models.adapter import Inputs

    full = torch.cat([ids, torch.tensor(cached[:-1])])
    with torch.no_grad():
        want = a.hf_model(full[None]).logits[0, len(ids) - 1 :].double()
        logits, cache = a.prefix_forward(Inputs.from_ids(a, [ids], strings=False), keep_cache=True)
        got = [logits[0]]
        for step, t in enumerate(cached[:-1]):
            one = Inputs.from_ids(a, [[t]], strings=False)
            logits, cache = a.prefix_forward(one, cache, start=len(ids) + step, keep_cache=True)
            got.append(logits[0])
    scale = float(want.abs().max())
    torch.testing.assert_close(torch.stack(got).double(), want, rtol=0, atol=1e-10 * max(scale, 1.0))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_cached_greedy_equals_hugging_face_generate(family: str) -> None:
    a = adapter_of(family)
    ids = a.encode([TEXT]).input_ids[0]
    with torch.no_grad():
        hf = a.hf_model.generate(
            ids[None],
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    assert a.generate(ids, 8, stop_at_eos=False) == hf


def test_cached_greedy_stops_after_eos() -> None:
    """EOS made the argmax at the third new token: the cached path ends there with EOS kept, as the plain one."""
    a = adapter_of("llama")
    ids = a.encode([TEXT]).input_ids[0]
    free = a.generate(ids, 6, stop_at_eos=False)
    eos = sorted(a.eos_token_ids)[0]
    head = a.hf_model.get_output_embeddings()
    calls = {"n": 0}

    def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:  # the third logits computed: the third new token's
            out = out.clone()
            out[..., -1, eos] = out.abs().max() * 10 + 10
        return out

    handle = head.register_forward_hook(hook)
    try:
        got = a.generate(ids, 6)
    finally:
        handle.remove()
    assert got == free[:2] + [eos]
