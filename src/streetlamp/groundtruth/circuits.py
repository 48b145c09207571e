"""Circuits whose edges are known: planted attention-only GPT-2 models built by hand (issue 24 item 6).

The residual stream is laid out in blocks of one-hot dimensions: ``TOK`` (the token), ``POS`` (the
position), ``PREV`` (the previous token, written by a previous-token head) and ``SCR`` (a scratch copy of
the token, written by a distractor). Every layer's input is then a sum of exactly ``n`` unit one-hots
(n = 2 before layer 0, 4 before layer 1), so its LayerNorm is the same affine map at every position and
in every prompt: ``LN(x) = (x - μ) / σ`` with μ = n/d and σ fixed. Each projection is set to
``W = σ · M`` with bias ``b = (μ/σ) 1ᵀW`` so that ``LN(x) W + b = x M`` exactly, for the map ``M`` of the
head's design (GPT-2's Conv1D: ``y = x W + b``). The MLPs are zero (attention-only).

Heads (2 per layer, ``dh = d / 2``; attention scores of the matches ``A² / √dh`` ≈ 32, so the softmax is
saturated to within ``e^-32``):

* ``L0.H0`` previous-token head: query ``POS i``, key ``POS j`` shifted (matches ``j = i - 1``), value
  ``TOK`` -> writes ``PREV``.
* ``L0.H1`` distractor: attends to itself, value ``TOK`` -> writes ``SCR`` (read by no one).
* ``L1.H0`` distractor: a previous-token head that writes ``2 · TOK`` of the previous token (it raises that
  token's logit, so it contributes strongly to the prediction, but never reads a corrupted position from
  the last query).
* ``L1.H1`` the planted head. ``induction``: query ``TOK``, key ``PREV`` (matches the position after the
  earlier occurrence of the current token), value ``TOK`` -> writes ``4 · TOK`` (the copied token's logit).
  ``copy``: every query matches the key at position 1 (the first word), value ``TOK`` -> ``4 · TOK``.

Tasks and their circuit under patching (the edges whose corrupted value changes the metric; every other
edge carries the same value in the clean and corrupted runs, or a value no weight reads):

* ``induction``: clean ``[BOS] w1 .. wL w1 .. w(L-1)`` -> ``wL``; corrupt: the first copy replaced by other
  words. Edges: ``embed -> L0.H0 (v)``, ``L0.H0 -> L1.H1 (k)``, ``embed -> L1.H1 (v)``, ``L1.H1 -> logits``.
  The induction head's softmax is saturated at the match: a first-order score of its key edge is about 0
  (the case AtP*'s QK fix is for).
* ``copy``: clean ``[BOS] x f1 .. fn`` -> ``x``; corrupt: ``x`` replaced. Edges: ``embed -> L1.H1 (v)``,
  ``L1.H1 -> logits``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from ..interventions.circuits.graph import Graph
from ..interventions.circuits.tasks import TaskPair

WORDS = [f"w{i}" for i in range(16)]
SPECIALS = ["[PAD]", "[UNK]", "[BOS]"]
N_POS = 24
D_MODEL = 96
SCORE = 15.0  # query/key amplitude: a matching score is SCORE² / √dh
PLANTED = ("induction", "copy")


def tokenizer():
    """A word-level tokenizer over ``w0 .. w15`` that prepends ``[BOS]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[BOS]"
    )


def gpt2_config(d_model: int, heads: int, layers: int, vocab: int, n_inner: int = 4):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab,
        n_positions=N_POS,
        n_embd=d_model,
        n_layer=layers,
        n_head=heads,
        n_inner=n_inner,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=2,
        eos_token_id=2,
        pad_token_id=0,
    )


def _ln_sigma(n: int, d: int, eps: float) -> float:
    return math.sqrt(n / d * (1 - n / d) + eps)


def planted_model(kind: str):
    """``(model, tokenizer)``: the hand-set GPT-2 of the module docstring, float64."""
    from transformers import GPT2LMHeadModel

    if kind not in PLANTED:
        raise ValueError(f"planted circuit {kind!r}: choose from {PLANTED}")
    tok = tokenizer()
    V, S, d = len(SPECIALS) + len(WORDS), N_POS, D_MODEL
    TOK, POS, PREV, SCR = 0, V, V + S, 2 * V + S
    assert SCR + V <= d
    model = GPT2LMHeadModel(gpt2_config(d, 2, 2, V)).double().eval()
    dh = d // 2
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        base = model.transformer
        base.wte.weight[:, TOK : TOK + V] = torch.eye(V, dtype=torch.float64)
        base.wpe.weight[:, POS : POS + S] = torch.eye(S, dtype=torch.float64)
        for mod in [*(b.ln_1 for b in base.h), *(b.ln_2 for b in base.h), base.ln_f]:
            mod.weight.fill_(1.0)

        def maps(rows: list[tuple[int, int, float]]) -> torch.Tensor:
            m = torch.zeros(d, dh, dtype=torch.float64)
            for i, j, v in rows:
                m[i, j] = v
            return m

        shift = [(POS + j, j + 1, SCORE) for j in range(S - 1)]  # key of position j: slot j + 1
        own = [(POS + i, i, SCORE) for i in range(S)]  # query/key of position i: slot i
        tok_v = [(TOK + t, t, 1.0) for t in range(V)]
        design = {  # (layer, head): (query map, key map, value map, output block, output amplitude)
            (0, 0): (own, shift, tok_v, PREV, 1.0),
            (0, 1): (own, own, tok_v, SCR, 1.0),
            (1, 0): (own, shift, tok_v, TOK, 2.0),
        }
        if kind == "induction":
            design[(1, 1)] = (
                [(TOK + t, t, SCORE) for t in range(V)],
                [(PREV + t, t, SCORE) for t in range(V)],
                tok_v,
                TOK,
                4.0,
            )
        else:
            design[(1, 1)] = ([(POS + i, 0, SCORE) for i in range(S)], [(POS + 1, 0, SCORE)], tok_v, TOK, 4.0)
        for l, block in enumerate(base.h):
            n = 2 if l == 0 else 4
            sig = _ln_sigma(n, d, block.ln_1.eps)
            mu = n / d
            for h in range(2):
                qm, km, vm, out, amp = design[(l, h)]
                for part, rows in enumerate((qm, km, vm)):
                    W = sig * maps(rows)
                    cols = slice(part * d + h * dh, part * d + (h + 1) * dh)
                    block.attn.c_attn.weight[:, cols] = W
                    block.attn.c_attn.bias[cols] = (mu / sig) * W.sum(0)
                o = torch.zeros(dh, d, dtype=torch.float64)
                for t in range(V):
                    o[t, out + t] = amp
                block.attn.c_proj.weight[h * dh : (h + 1) * dh] = o
    model.tie_weights()
    model.set_attn_implementation("eager")
    return model, tok


def planted_pairs(kind: str, n: int, seed: int = 0, length: int = 5) -> list[TaskPair]:
    """The planted task's pairs (module docstring); the answer and wrong answer are words of the tokenizer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = rng.sample(WORDS, 2 * length)
        seq, other = w[:length], w[length:]
        if kind == "induction":
            clean = " ".join(seq + seq[:-1])
            corrupt = " ".join(other + seq[:-1])
            out.append(TaskPair(clean, corrupt, " " + seq[-1], " " + other[-1]))
        else:
            clean = " ".join(seq)
            corrupt = " ".join([other[0]] + seq[1:])
            out.append(TaskPair(clean, corrupt, " " + seq[0], " " + other[0]))
    return out


def edge_mask(graph: Graph, edges: list[tuple[str, str, str]]) -> torch.Tensor:
    """``[R, U]`` bool of the named edges ``(source, target, input)``."""
    names = graph.edge_names()
    r, w = graph.edge_index()
    m = torch.zeros(graph.n_readers, graph.n_writers, dtype=torch.bool)
    for e in edges:
        i = names.index(e)
        m[r[i], w[i]] = True
    return m


def planted_truth(kind: str) -> list[tuple[str, str, str]]:
    if kind == "induction":
        return [
            ("embed", "L0.H0", "v"),
            ("L0.H0", "L1.H1", "k"),
            ("embed", "L1.H1", "v"),
            ("L1.H1", "logits", "logits"),
        ]
    return [("embed", "L1.H1", "v"), ("L1.H1", "logits", "logits")]


@dataclass
class KnownCircuit:
    """A model whose circuit is known: its adapter, task pairs and the circuit's edges."""

    name: str
    adapter: object  # ModelAdapter
    pairs: list[TaskPair]
    truth: list[tuple[str, str, str]]


def planted(kind: str, n: int = 8, seed: int = 0) -> KnownCircuit:
    from ..models.adapter import ModelAdapter

    model, tok = planted_model(kind)
    return KnownCircuit(
        f"planted-{kind}",
        ModelAdapter(model, tok, f"planted-{kind}"),
        planted_pairs(kind, n, seed),
        planted_truth(kind),
    )
