"""Encoder-decoders (T5, BART): every site family against Hugging Face's eager attention, in float64."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import streetlamp
from streetlamp.errors import StreetlampError
from streetlamp.methods.registry import REGISTRY, get_method
from streetlamp.models.seq2seq import SEQ2SEQ_METHODS, Seq2SeqAdapter, seq2seq_site_names
from streetlamp.models.tiny import ENCODER_DECODER_FAMILY_KINDS, save_tiny, tiny_model, tiny_seq2seq
from tests.conftest import F64_TOL

SOURCE = "the movie was not good , but the acting was great ."
TARGET = [5, 9, 7, 11, 8]  # forced target ids (any tokens of the tiny vocabulary)
FAMILIES = sorted(ENCODER_DECODER_FAMILY_KINDS)  # the registry's encoder-decoders: bart, t5


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest) -> tuple[Seq2SeqAdapter, torch.nn.Module]:
    """A tiny encoder-decoder in float64 routed through streetlamp, and its twin on HF's eager attention."""
    model, tok = tiny_seq2seq(request.param, seed=1)
    adapter = Seq2SeqAdapter(model.double(), tok, f"tiny-{request.param}")
    twin = copy.deepcopy(adapter.hf_model)
    twin.set_attn_implementation("eager")
    assert twin.config._attn_implementation == "eager" and adapter.hf_model.config._attn_implementation == "streetlamp"
    return adapter, twin.eval()


def _io(adapter: Seq2SeqAdapter) -> tuple[torch.Tensor, torch.Tensor]:
    return adapter.encode(SOURCE).input_ids, adapter.decoder_inputs(TARGET).view(1, -1)


def test_every_site_family_equals_hf_eager(pair: tuple[Seq2SeqAdapter, torch.nn.Module]) -> None:
    adapter, twin = pair
    src, dec = _io(adapter)
    fwd = adapter.run(src, dec, record=["*"])
    assert set(fwd.cache) == set(adapter.site_names)
    with torch.no_grad():
        ref = twin(input_ids=src, decoder_input_ids=dec, output_attentions=True, output_hidden_states=True)
    assert (fwd.logits - ref.logits).abs().max() <= F64_TOL
    S, T = src.shape[1], dec.shape[1]
    c = fwd.cache
    for l in range(adapter.n_encoder_layers):
        p = c[f"encoder.layers.{l}.attn.pattern"]
        assert p.shape == (1, adapter.n_heads, S, S)
        assert (p - ref.encoder_attentions[l]).abs().max() <= F64_TOL
    for l in range(adapter.n_decoder_layers):
        assert (c[f"decoder.layers.{l}.self_attn.pattern"] - ref.decoder_attentions[l]).abs().max() <= F64_TOL
        assert (c[f"decoder.layers.{l}.cross_attn.pattern"] - ref.cross_attentions[l]).abs().max() <= F64_TOL
        assert c[f"decoder.layers.{l}.cross_attn.pattern"].shape == (1, adapter.n_decoder_heads, T, S)
        # the decoder's self-attention is causal: exactly zero above the diagonal
        assert bool((c[f"decoder.layers.{l}.self_attn.pattern"][0].triu(1) == 0).all())
    # v, z, out and resid_post of each family are what the pattern and the weights make of them
    for stack, kinds, n in (
        ("encoder", ["attn"], adapter.n_encoder_layers),
        ("decoder", ["self_attn", "cross_attn"], adapter.n_decoder_layers),
    ):
        hidden = ref.encoder_hidden_states if stack == "encoder" else ref.decoder_hidden_states
        layers = adapter.encoder_layers if stack == "encoder" else adapter.decoder_layers
        for l in range(n):
            for k in kinds:
                pre = f"{stack}.layers.{l}.{k}"
                z = torch.einsum("bhqk,bkhd->bqhd", c[f"{pre}.pattern"], c[f"{pre}.v"])
                assert (z - c[f"{pre}.z"]).abs().max() <= F64_TOL
                o = layers[l].get_submodule(adapter.seq2seq.cross_o if k == "cross_attn" else adapter.seq2seq.self_o)
                assert (o(z.flatten(2)) - c[f"{pre}.out"]).abs().max() <= F64_TOL
            h = c[f"{stack}.layers.{l}.resid_post"]
            if l == n - 1 and adapter.family.name == "t5":  # HF's last hidden state is after T5's final norm
                h = getattr(adapter.hf_model, stack).final_layer_norm(h)
            assert (h - hidden[l + 1]).abs().max() <= F64_TOL


@pytest.mark.parametrize("pair", ["t5"], indirect=True)
def test_t5_position_bias_and_scaling_matter(pair: tuple[Seq2SeqAdapter, torch.nn.Module]) -> None:
    """The equality above is not vacuous: without T5's relative bias (or with 1/sqrt(d) scaling) the
    encoder's first-layer pattern differs from Hugging Face's by far more than the tolerance."""
    adapter, twin = pair
    src, dec = _io(adapter)
    fwd = adapter.run(src, dec, record=["encoder.layers.0.attn.pattern", "encoder.embed"])
    att = adapter.encoder_layers[0].get_submodule(adapter.seq2seq.self_attn)
    x = adapter.encoder_layers[0].layer[0].layer_norm(fwd.cache["encoder.embed"])
    h, d = adapter.n_heads, att.key_value_proj_dim
    q = att.q(x).view(1, -1, h, d).transpose(1, 2)
    k = att.k(x).view(1, -1, h, d).transpose(1, 2)
    bias = att.compute_bias(src.shape[1], src.shape[1])
    ours = fwd.cache["encoder.layers.0.attn.pattern"]
    assert (torch.softmax(q @ k.transpose(2, 3) + bias, -1) - ours).abs().max() <= F64_TOL  # bias, no scaling
    assert (torch.softmax(q @ k.transpose(2, 3), -1) - ours).abs().max() > 1e-3
    assert (torch.softmax(q @ k.transpose(2, 3) * d**-0.5 + bias, -1) - ours).abs().max() > 1e-3


def test_sites_are_live_and_greedy_decoding(pair: tuple[Seq2SeqAdapter, torch.nn.Module]) -> None:
    adapter, twin = pair
    src, dec = _io(adapter)
    base = adapter.run(src, dec).logits
    uniform = {"decoder.layers.0.cross_attn.pattern": lambda p: torch.full_like(p, 1 / p.shape[-1])}
    assert (adapter.run(src, dec, edit=uniform).logits - base).abs().max() > 1e-3
    gen = adapter.generate(src[0], 4)
    with torch.no_grad():
        for j in range(4):
            d = adapter.decoder_inputs(gen[: j + 1]).view(1, -1)
            assert int(twin(input_ids=src, decoder_input_ids=d).logits[0, -1].argmax()) == gen[j]


def test_save_reload_and_site_names(tmp_path: Path) -> None:
    for fam in FAMILIES:
        path = save_tiny(fam, tmp_path / fam, seed=3)
        adapter = streetlamp.load(str(path))
        assert isinstance(adapter, Seq2SeqAdapter) and adapter.kind == "seq2seq"
        model, tok = tiny_seq2seq(fam, seed=3)
        src, dec = _io(adapter)
        with torch.no_grad():
            ref = model(input_ids=src, decoder_input_ids=dec).logits
        assert (adapter.run(src, dec).logits - ref).abs().max() <= 1e-5  # float32
        names = adapter.site_names
        assert names == seq2seq_site_names(2, 2)
        assert {"encoder.layers.1.attn.pattern", "decoder.layers.1.self_attn.pattern"} <= set(names)
        assert "decoder.layers.0.cross_attn.v" in names and "layers.0.attn.pattern" not in names
        d = adapter.describe()
        assert d["encoder_layers"] == d["decoder_layers"] == 2 and d["family"] == fam
    # an encoder-decoder checkpoint of another head is refused in one line, before any weights load
    cfg = json.loads((tmp_path / "t5" / "config.json").read_text())
    (tmp_path / "t5" / "config.json").write_text(json.dumps({**cfg, "architectures": ["T5EncoderModel"]}))
    with pytest.raises(StreetlampError, match=r"load as \*ForConditionalGeneration"):
        streetlamp.load(str(tmp_path / "t5"))


def test_site_names_of_the_other_kind_are_one_line() -> None:
    model, tok = tiny_seq2seq("bart")
    s2s = Seq2SeqAdapter(model, tok, "bart")
    with pytest.raises(StreetlampError, match="encoder.layers.0.attn.pattern") as e:
        s2s.session(record=["layers.0.attn.pattern"])
    assert "\n" not in str(e.value)
    gpt2 = streetlamp.ModelAdapter(*tiny_model("gpt2"), "gpt2")
    with pytest.raises(StreetlampError, match="layers.0.attn.pattern"):
        gpt2.session(record=["decoder.layers.0.cross_attn.pattern"])
    with pytest.raises(StreetlampError, match="encoder-decoder"):
        s2s.forward(s2s.encode("the movie"))


def test_methods_conformance_on_an_encoder_decoder() -> None:
    """Every registered method either runs in explain-generation (SEQ2SEQ_METHODS) or refuses in one
    line naming why; through the one-signature ``attribute`` all of them refuse (they read one stack)."""
    model, tok = tiny_seq2seq("t5")
    adapter = Seq2SeqAdapter(model, tok, "tiny-t5")
    inputs = adapter.encode("the movie")
    from streetlamp.models.adapter import Target

    for name in REGISTRY:
        m = get_method(name)
        with pytest.raises(StreetlampError) as e:
            m.attribute(adapter, inputs, target=Target())
        msg = str(e.value)
        assert "\n" not in msg and "tiny-t5" in msg and "explain-generation runs" in msg
        if name in ("rollout", "flow", "gradient_rollout"):
            assert "two stacks joined by cross-attention" in msg
    assert set(SEQ2SEQ_METHODS) <= set(REGISTRY)


def test_gated_t5_flan_layout() -> None:
    """T5 v1.1 / Flan-T5: gated-GELU feed-forward (``wi_0``, ``wi_1``, ``wo``), untied LM head."""
    from transformers import T5Config, T5ForConditionalGeneration

    from streetlamp.models.tiny import seq2seq_tokenizer

    tok = seq2seq_tokenizer("t5")
    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
    )  # fmt: skip
    adapter = Seq2SeqAdapter(T5ForConditionalGeneration(cfg).double().eval(), tok, "flan")
    twin = copy.deepcopy(adapter.hf_model)
    twin.set_attn_implementation("eager")
    src, dec = _io(adapter)
    fwd = adapter.run(src, dec, record=["decoder.layers.1.*"])
    with torch.no_grad():
        ref = twin(input_ids=src, decoder_input_ids=dec, output_attentions=True)
    assert (fwd.logits - ref.logits).abs().max() <= F64_TOL
    assert (fwd.cache["decoder.layers.1.cross_attn.pattern"] - ref.cross_attentions[1]).abs().max() <= F64_TOL
    ff = adapter.decoder_layers[1].layer[2].DenseReluDense
    assert type(ff).__name__ == "T5DenseGatedActDense" and fwd.cache["decoder.layers.1.mlp.out"].shape == (1, 5, 32)


def test_unroutable_encoder_decoder_is_one_line() -> None:
    from transformers import BartForConditionalGeneration

    class OwnAttentionBartForConditionalGeneration(BartForConditionalGeneration):
        _can_set_attn_implementation_cached_value = False  # what transformers concludes for such a class

    model, tok = tiny_seq2seq("bart")
    with pytest.raises(StreetlampError) as e:
        Seq2SeqAdapter(OwnAttentionBartForConditionalGeneration(model.config), tok, "own")
    assert "attention cannot be routed" in str(e.value) and "\n" not in str(e.value)


def test_encoder_decoders_are_registry_families_of_their_kind() -> None:
    """T5 and BART are family objects in FAMILIES (two stacks, the encoder-decoder kind): the loader picks
    their adapter from the object, the single-stack adapter refuses them in one line, the unsupported-type
    message lists them from the registry, and the tiny recipe is the family's."""
    from streetlamp.models.adapter import ModelAdapter
    from streetlamp.models.families import FAMILIES as REGISTRY
    from streetlamp.models.families import unsupported_message
    from streetlamp.models.kinds import ENCODER_DECODER
    from streetlamp.models.loading import adapter_for
    from streetlamp.models.seq2seq import SEQ2SEQ_FAMILIES

    assert FAMILIES == sorted(n for n, f in REGISTRY.items() if f.encoder_decoder is not None) == ["bart", "t5"]
    for fam in FAMILIES:
        f = REGISTRY[fam]
        assert f.stacks == 2 and f.tiny is not None and f.tiny.kind is ENCODER_DECODER
        assert SEQ2SEQ_FAMILIES[fam] is f.encoder_decoder
        model, tok = tiny_model(fam, seed=2)
        a = adapter_for(model, tok, f"tiny-{fam}", "")
        assert isinstance(a, Seq2SeqAdapter) and a.family is f and a.kind is ENCODER_DECODER
        with pytest.raises(StreetlampError, match=f"^{fam} is an encoder-decoder: it runs through Seq2SeqAdapter"):
            ModelAdapter(model, tok, "x")
    msg = unsupported_message("nope")
    assert msg.endswith("; encoder-decoder: bart, t5") and "t5," not in msg.split("; encoder-decoder")[0]
    with pytest.raises(ValueError, match="no tiny encoder-decoder for family 'gpt2'"):
        tiny_seq2seq("gpt2")
