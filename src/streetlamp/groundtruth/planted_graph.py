"""Ground truth for attribution graphs (issue 39, Must-have 4): a tiny model with a planted feature circuit.

A two-layer Llama (float64, the tiny word-level tokenizer, every norm's gain 1, no biases but the MLP's fixed
``up`` bias) whose computation on its prompt is known by construction. The residual stream has orthogonal
coordinate blocks: the planted encoder directions ``e_i`` (coordinates ``0..m-1``), the planted decoder
directions ``d_i`` (``m..2m-1``) and one read-out direction ``r`` (coordinate ``2m``):

- **Layer 0** writes nothing from attention (``o_proj = 0``); its MLP is by construction the transcoder
  ``W_enc = [e_i]``, ``b_enc = 0``, ``W_dec = [d_i]``, ``b_dec = 0`` (``gate = E``, ``up = 0`` with bias 1,
  ``down = Dᵀ``, ReLU: ``mlp(x) = Σ_i relu(e_i · x) d_i``). Token ``t`` embeds to ``e_{f(t)}``: the
  **source** word activates feature ``A``, the **query** (last) word feature ``Q``, a **distractor** word
  feature ``B`` and every other word feature ``C`` (special tokens embed to 0).
- **Layer 1** has one live head, ``H`` (the others have zero ``W_Q`` and zero ``o_proj`` columns). Its
  query reads ``d_Q`` and its key reads ``d_A`` into the same head direction ``u`` (the slowest-rotating
  RoPE pair, so the match barely depends on the distance): the **planted QK match**, a score of about
  ``qk · 31 / √8`` from the query word to the source word and 0 elsewhere. Its value reads ``d_A`` and its
  output writes ``r``: the head **moves feature A** from the source to the query position. Layer 1's MLP is 0
  (no transcoder there: its output, zero, is its error node).
- The LM head maps ``r`` to the **target** word's logit (``readout · r``; every other row 0).

So the graph's path to the target logit is ``token(source) → A @ (0, source) → [H] → logit(target)``; the
cross-position edge ``A → logit`` is carried by ``H`` alone; H's score from the query to the source is the
bilinear term between ``Q`` (query side) and ``A`` (key side); ``B``, ``C`` and ``Q`` have no edge to the logit
in the graph (attention frozen), while in the real model zeroing ``Q`` removes the match and with it the
answer: the mechanism a frozen-attention graph hides, and the one its QK attribution names.

``key=B`` plants the wrong match (the key reads ``d_B``): the head then attends to the distractor, whose value is
0, and moves only the small share ``1/(e^s + n - 1)`` of A; the tests check that the QK attribution names
``(Q, B)`` there and nothing at the source, so a recovered pair is the planted one, not an artefact of the path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.adapter import ModelAdapter
from ..models.features import Dictionary, FeatureSet

__all__ = ["PlantedGraph", "planted_graph_model"]

PROMPT = "john went to the store and mary gave a drink"
SOURCE, DISTRACTOR, QUERY, TARGET = "mary", "store", "drink", "paris"
A, B, Q, C = 0, 1, 2, 3  # the planted features' indices
NAMES = {A: "A (source)", B: "B (distractor)", Q: "Q (query)", C: "C (filler)"}


@dataclass
class PlantedGraph:
    adapter: ModelAdapter
    ids: torch.Tensor  # the prompt's token ids
    source: int  # the source word's position (feature A, the key)
    distractor: int  # feature B's position
    query: int  # the last position (feature Q)
    target: int  # the target word's token id
    head: int  # the live head of layer 1
    encoder: torch.Tensor  # [m, d] e_i
    decoder: torch.Tensor  # [m, d] d_i
    readout: torch.Tensor  # [d] r

    def dictionary(self) -> Dictionary:
        """Layer 0's MLP as the transcoder it is by construction."""
        m = int(self.encoder.shape[0])
        return Dictionary(
            0,
            "mlp",
            W_enc=self.encoder.T.clone(),
            b_enc=torch.zeros(m, dtype=torch.float64),
            W_dec=self.decoder.clone(),
            b_dec=torch.zeros(self.encoder.shape[1], dtype=torch.float64),
        )

    def feature_set(self) -> FeatureSet:
        return FeatureSet({(0, "mlp"): self.dictionary()}, source="planted-graph", model=self.adapter.name)


def planted_graph_model(
    d_model: int = 16,
    heads: int = 2,
    qk: float = 0.8,
    value: float = 1.0,
    readout: float = 3.0,
    live_head: int = 0,
    key: int = A,
) -> PlantedGraph:
    """The model above, with its layer-0 transcoder attached. ``qk`` scales W_Q and W_K (the match's strength),
    ``value`` W_V, ``readout`` the target's unembedding row, ``key`` the feature whose decoder direction the key
    reads (A: the planted match; another feature plants the match elsewhere)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..models.families.base import decoder_config
    from ..models.tiny import family_tokenizer

    m = 4
    if d_model < 2 * m + 1:
        raise ValueError(f"d_model must hold {m} encoder, {m} decoder and 1 read-out coordinates")
    tok = family_tokenizer("llama")
    cfg = decoder_config(tok, 2, heads, d_model)
    cfg.update(intermediate_size=m, hidden_act="relu", mlp_bias=True, num_key_value_heads=heads)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).double().eval()
    hd = d_model // heads
    eye = torch.eye(d_model, dtype=torch.float64)
    enc, dec, r = eye[:m], eye[m : 2 * m], eye[2 * m]
    vocab = tok.get_vocab()
    special = set(tok.all_special_ids)
    emb = torch.zeros(len(tok), d_model, dtype=torch.float64)
    for t in range(len(tok)):
        if t not in special:
            emb[t] = enc[C]
    emb[vocab[SOURCE]], emb[vocab[DISTRACTOR]], emb[vocab[QUERY]] = enc[A], enc[B], enc[Q]
    u = torch.zeros(hd, dtype=torch.float64)
    u[hd // 2 - 1] = 1.0  # the last RoPE pair's first coordinate: the lowest frequency
    rows = slice(live_head * hd, (live_head + 1) * hd)
    L0, L1 = model.model.layers
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (L0.input_layernorm, L0.post_attention_layernorm, L1.input_layernorm):
            norm.weight.fill_(1.0)
        L1.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.copy_(emb)
        L0.mlp.gate_proj.weight.copy_(enc)
        L0.mlp.up_proj.bias.fill_(1.0)
        L0.mlp.down_proj.weight.copy_(dec.T)
        L1.self_attn.q_proj.weight[rows] = qk * torch.outer(u, dec[Q])
        L1.self_attn.k_proj.weight[rows] = qk * torch.outer(u, dec[key])
        L1.self_attn.v_proj.weight[rows] = value * torch.outer(u, dec[A])
        L1.self_attn.o_proj.weight[:, rows] = torch.outer(r, u)
        model.lm_head.weight[vocab[TARGET]] = readout * r
    adapter = ModelAdapter(model, tok, "planted-graph")
    ids = adapter.encode([PROMPT]).input_ids[0]
    words = [tok.convert_ids_to_tokens(int(i)) for i in ids]
    pg = PlantedGraph(
        adapter,
        ids,
        words.index(SOURCE),
        words.index(DISTRACTOR),
        len(words) - 1,
        vocab[TARGET],
        live_head,
        enc.clone(),
        dec.clone(),
        r.clone(),
    )
    assert words[-1] == QUERY and words.count(SOURCE) == 1
    adapter.attach_features(pg.feature_set())
    return pg
