"""The named sites are the same for every family; pinned here. Every registered family gets them: a family
registered at test time is checked too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streetlamp.methods.lrp import RULE_FAMILIES
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.attention_block import DECOMPOSE
from streetlamp.models.families import FAMILIES, Family, TinySpec
from streetlamp.models.kinds import ENCODER_DECODER
from streetlamp.models.readout import READOUT
from streetlamp.models.relevance import GATED_FAMILIES
from streetlamp.models.sites import site_axes
from streetlamp.models.tiny import ENCODER_DECODER_FAMILY_KINDS, FAMILY_KINDS, IMAGE_FAMILY_KINDS, tiny_model
from tests.conftest import TEXTS

PINNED = ["embed"] + [
    f"layers.{l}.{s}"
    for l in range(2)
    for s in ("resid_pre", "attn.v", "attn.pattern", "attn.z", "attn.head_out", "attn.out", "mlp.out", "resid_post")
]


MOE_SITES = ("router.logits", "router.weights", "experts.out")


def test_site_names_pinned(tiny: ModelAdapter) -> None:
    moe = tiny.family.experts
    if moe is None:
        assert tiny.site_names == PINNED
        return
    extra = MOE_SITES + (("shared_expert.out",) if moe.shared_expert is not None else ())
    order = (
        "resid_pre",
        "attn.v",
        "attn.pattern",
        "attn.z",
        "attn.head_out",
        "attn.out",
        *extra,
        "mlp.out",
        "resid_post",
    )
    assert tiny.site_names == ["embed"] + [f"layers.{l}.{s}" for l in range(2) for s in order]
    assert tiny.family.name in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")  # the MoE families, pinned


def test_site_shapes(tiny: ModelAdapter) -> None:
    inputs = tiny.encode(TEXTS)
    f = tiny.forward(inputs, record=["*"])
    b, s = inputs.input_ids.shape
    h, d = tiny.n_heads, tiny.d_model
    d_head = getattr(tiny.hf_model.config, "head_dim", None) or d // h  # Gemma: not d_model / heads
    for l in range(2):
        assert f.cache[f"layers.{l}.attn.pattern"].shape == (b, h, s, s)
        assert f.cache[f"layers.{l}.attn.z"].shape == (b, s, h, d_head)
        assert f.cache[f"layers.{l}.attn.v"].shape == (b, s, h, d_head)
        # z is the attention-weighted sum of values, per head
        z = torch.einsum("bhqk,bkhd->bqhd", f.cache[f"layers.{l}.attn.pattern"], f.cache[f"layers.{l}.attn.v"])
        torch.testing.assert_close(z, f.cache[f"layers.{l}.attn.z"], atol=1e-5, rtol=1e-5)
        assert f.cache[f"layers.{l}.attn.head_out"].shape == (b, s, h, d)
        for k in ("attn.out", "mlp.out", "resid_post", "resid_pre"):
            assert f.cache[f"layers.{l}.{k}"].shape == (b, s, d)
    assert f.cache["embed"].shape == (b, s, d)
    n_exp = int(
        getattr(tiny.hf_model.config, "num_experts", 0) or getattr(tiny.hf_model.config, "num_local_experts", 0)
    )
    sizes = {"batch": b, "pos": s, "query": s, "key": s, "head": h, "d_head": d_head, "d_model": d, "expert": n_exp}
    for name in tiny.site_names:  # the documented axes of every site are its real axes
        assert f.cache[name].shape == tuple(sizes[a] for a in site_axes(name)), name
    # resid_post of layer 0 is what enters layer 1
    torch.testing.assert_close(f.cache["layers.0.resid_post"], f.cache["layers.1.resid_pre"])


# -- the family registry: a family is one object plus one registry line ------------------------------
def _toy_family() -> Family:
    """A test-only family: Llama's facts under a new model type, whose tiny recipe builds a model of that
    type (a config and model class that are Llama's, renamed), as a newly supported architecture would be."""
    from transformers import LlamaConfig, LlamaForCausalLM

    class ToyConfig(LlamaConfig):
        model_type = "toy-llama"

    class ToyForCausalLM(LlamaForCausalLM):
        config_class = ToyConfig

    def build(tok, layers: int, heads: int, d_model: int):
        cfg = ToyConfig(
            hidden_size=d_model,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=2 * d_model,
            max_position_embeddings=64,
            vocab_size=len(tok),
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            tie_word_embeddings=False,
            initializer_range=0.2,
        )
        return ToyForCausalLM(cfg)

    return dataclasses.replace(FAMILIES["llama"], name="toy-llama", tiny=TinySpec("causal_lm", build))


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> ModelAdapter:
    """The toy family registered for one test (one registry line), its tiny model in float64."""
    monkeypatch.setitem(FAMILIES, "toy-llama", _toy_family())
    model, tok = tiny_model("toy-llama", seed=1)
    assert model.config.model_type == "toy-llama"
    return ModelAdapter(model.double(), tok, "tiny-toy-llama")


def test_a_family_registered_at_test_time_gets_the_sites_and_passes_conformance(toy: ModelAdapter) -> None:
    """Registering a family object is all it takes: the adapter finds its modules, the sites are the
    pinned names with their documented shapes, the per-fact tables include it, and methods run on it."""
    from tests.methods.test_conformance import test_conformance
    from tests.methods.test_lrp import test_conservation_ledger

    assert toy.family.name == "toy-llama" and toy.family is FAMILIES["toy-llama"]
    assert "toy-llama" in FAMILY_KINDS and "toy-llama" in GATED_FAMILIES and "toy-llama" in RULE_FAMILIES
    assert READOUT["toy-llama"] == FAMILIES["llama"].readout and DECOMPOSE["toy-llama"].kind == "rmsnorm"
    test_site_names_pinned(toy)
    test_site_shapes(toy)
    for method in ("attention", "gradient_x_input", "occlusion", "alti"):
        test_conformance(method, toy)
    test_conservation_ledger("toy-llama")  # AttnLRP's full ledger: its gated-MLP rule is found from the object
    # the same weights behind Llama's own class give the same logits: the family object alone decides
    twin = LlamaForCausalLM(
        LlamaConfig(**{k: v for k, v in toy.hf_model.config.to_dict().items() if k != "model_type"})
    )
    twin.load_state_dict(toy.hf_model.state_dict())
    twin = twin.double().eval()
    ids = toy.encode(TEXTS[0]).input_ids
    with torch.no_grad():
        want = twin(input_ids=ids).logits[0, -1]
    got = toy.forward(toy.encode(TEXTS[0])).logits[0]
    assert float(want.abs().max()) > 1e-3
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def test_a_family_without_rules_is_refused_by_attnlrp_from_its_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """The AttnLRP status is a fact of the object: the same toy family marked as refused is refused, with its reason."""
    from streetlamp.errors import StreetlampError
    from streetlamp.methods.lrp import AttnLRP

    fam = dataclasses.replace(_toy_family(), attnlrp_refusal="a toy reason")
    monkeypatch.setitem(FAMILIES, "toy-llama", fam)
    model, tok = tiny_model("toy-llama", seed=1)
    a = ModelAdapter(model, tok, "tiny-toy-llama")
    assert "toy-llama" not in RULE_FAMILIES
    with pytest.raises(StreetlampError, match="not toy-llama \\(a toy reason\\)"):
        AttnLRP().check(a)


def test_every_registered_family_is_complete() -> None:
    """Each registry entry is its model type's family, with a tiny recipe (so the tiny-model tests, the site
    pins and the conformance suite cover it), and the per-fact tables are views of the objects. The
    encoder-decoders (two stacks) are in the registry too, outside the single-stack tables."""
    for name, f in FAMILIES.items():
        assert f.name == name and f.tiny is not None
        if f.stacks == 2:
            assert f.encoder_decoder is not None and f.tiny.kind is ENCODER_DECODER and f.norm is None
            assert name in ENCODER_DECODER_FAMILY_KINDS and name not in FAMILY_KINDS and name not in RULE_FAMILIES
            continue
        assert f.norm is not None and f.tiny.kind.stacks == 1 and name not in ENCODER_DECODER_FAMILY_KINDS
        assert (name in FAMILY_KINDS) == (f.modality == "text") and (name in IMAGE_FAMILY_KINDS) == (
            f.modality == "image"
        )
        assert DECOMPOSE[name] is f.norm and READOUT.get(name) is f.readout
        assert (name in GATED_FAMILIES) == f.gated_mlp and (name in RULE_FAMILIES) == (f.attnlrp_refusal is None)
        assert f.normed_attention_output == (f.norm.placement == "sandwich")
    # every single-stack text family has a tiny model
    assert sorted(FAMILY_KINDS) == sorted(n for n in FAMILIES if n != "vit" and FAMILIES[n].stacks == 1)
    assert sorted(ENCODER_DECODER_FAMILY_KINDS) == ["bart", "t5"]
    assert [n for n in FAMILIES if FAMILIES[n].attention_hooks] == ["deberta-v2"]
    assert [n for n in FAMILIES if FAMILIES[n].embed_hook] == ["vit"]
