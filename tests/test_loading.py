"""Checkpoint folders of every family: save, reload through streetlamp.load, same outputs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import streetlamp
from streetlamp.models.tiny import FAMILY_KINDS, save_tiny, tiny_model

from .conftest import TEXTS


@pytest.mark.parametrize("family", sorted(FAMILY_KINDS))
def test_save_reload_same_logits(family: str, tmp_path: Path) -> None:
    path = save_tiny(family, tmp_path / family, seed=4)
    adapter = streetlamp.load(str(path))
    assert adapter.kind == FAMILY_KINDS[family] and adapter.family.name == family
    ref_model, _ = tiny_model(family, seed=4)
    inputs = adapter.encode(TEXTS)
    with torch.no_grad():
        ref = ref_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    torch.testing.assert_close(adapter.forward(inputs).logits, adapter.select_logits(ref, inputs),
                               atol=1e-5, rtol=1e-5)
    assert adapter.hf_model.config._attn_implementation == "streetlamp"


def test_pickled_weights_refused(tmp_path: Path) -> None:
    path = save_tiny("bert", tmp_path / "b")
    for f in path.glob("*.safetensors"):
        f.unlink()
    torch.save({}, path / "pytorch_model.bin")
    with pytest.raises(streetlamp.StreetlampError, match="safetensors"):
        streetlamp.load(str(path))


def test_unknown_name_lists_embedded() -> None:
    with pytest.raises(streetlamp.StreetlampError, match="minilm-sentiment, smollm2-135m"):
        streetlamp.load("gpt-17")


@pytest.mark.slow
def test_smollm_cache_is_reused(smollm: streetlamp.ModelAdapter) -> None:
    import time

    from streetlamp.models.loading import cache_dir

    assert (cache_dir() / "smollm2-135m" / "model.safetensors").exists()
    t = time.perf_counter()
    again = streetlamp.load("smollm2-135m")
    assert time.perf_counter() - t < 15  # dequantisation takes ~20 s; the cache a fraction of that
    inputs = again.encode("The capital of France is")
    assert again.output_label(int(again.forward(inputs).logits[0].argmax())).strip() == "Paris"
