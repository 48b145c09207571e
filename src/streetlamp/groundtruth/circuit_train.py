"""A 2-layer attention-only GPT-2 trained here on an induction task; its previous-token and induction heads
found by ablation (issue 24 item 6).

Model: GPT-2, 2 layers, 4 heads, d_model 64, the word-level tokenizer of :mod:`.circuits` (``w0 .. w15``,
``[BOS]`` prepended); attention-only: the MLPs' weights are zero and frozen (their output is exactly 0).
Data (:func:`batch`): ``[BOS] prefix s s filler`` for a random sequence ``s`` of 3 .. 7 distinct words after
a prefix of 0 .. 4 other words, seeded (a fixed period or offset would let a layer-0 head copy by position
alone: with ``[BOS] s s`` and ``|s| = 6`` it did); the loss is the cross-entropy of the second copy's
tokens after its first (the only predictable ones). Training: Adam, fixed seed, CPU, a
3,000 steps (:data:`STEPS`, under a minute on one core); cached as ``models/weights/circuit-induction/`` (``model.safetensors``,
``config.json``, the tokenizer, ``training.json``).

Heads by ablation (:func:`find_heads`): patch each head's output with its value on the corrupted prompts
(the first copy replaced by other words) and measure the drop of the logit difference; the induction
heads are the layer-1 heads whose drop is at least half of the largest layer-1 drop, the previous-token
heads the same in layer 0. Their attention patterns are recorded beside (the mean attention of a query
to the previous position, and of a second-copy query to the position after its token's first
occurrence). The known circuit: every edge among ``embed``, those heads and the logits.

What the model learned is not the textbook route alone (measured, ``training.json`` and docs/circuits.md):
its layer-0 heads found by ablation attend to the previous position only weakly and also write to the
logits directly (exact patching puts the largest edges there), so the known circuit is the heads and
every edge among them, not the prev-token-v -> induction-k edges by name.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

import torch

from ..interventions.circuits.graph import Graph
from ..models.adapter import ModelAdapter
from .circuits import WORDS, KnownCircuit, gpt2_config, tokenizer
from .train import WEIGHTS_DIR

NAME = "circuit-induction"
LENGTH = 6
TOTAL = 1 + 4 + 2 * 7  # [BOS], the longest prefix, two copies of the longest sequence
STEPS = 3000
LR = 3e-3
SEED = 0


def weights_dir() -> Path:
    return WEIGHTS_DIR / NAME


def batch(rng: torch.Generator, n: int, fixed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [n, TOTAL], target mask [n, TOTAL])``: ``[BOS] prefix s s filler``, ``s`` of 3 .. 7 distinct
    words and a prefix of 0 .. 4 other words (the period and the offset vary, so no positional shortcut
    predicts the second copy); ``fixed``: ``s`` of LENGTH words, no prefix. The mask marks the second
    copy's tokens after its first (the predictable ones)."""
    ids = torch.zeros(n, TOTAL, dtype=torch.long)
    mask = torch.zeros(n, TOTAL, dtype=torch.bool)
    for i in range(n):
        L = LENGTH if fixed else int(torch.randint(3, 8, (1,), generator=rng))
        r = 0 if fixed else int(torch.randint(0, 5, (1,), generator=rng))
        perm = (torch.randperm(len(WORDS), generator=rng) + 3).tolist()
        s, others = perm[:L], perm[L:]
        fill = [others[int(j)] for j in torch.randint(0, len(others), (TOTAL - 1 - 2 * L,), generator=rng)]
        ids[i] = torch.tensor([2] + fill[:r] + s + s + fill[r:])
        mask[i, 1 + r + L + 1 : 1 + r + 2 * L] = True
    return ids, mask


def train(
    steps: int = STEPS, seed: int = SEED, lr: float = LR, batch_size: int = 64, d_model: int = 64, heads: int = 4
):
    """``(model, tokenizer, log)``: the attention-only induction model after ``steps`` Adam steps."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    tok = tokenizer()
    cfg = gpt2_config(d_model, heads, 2, len(tok))
    model = GPT2LMHeadModel(cfg)
    for block in cast(Any, model.transformer).h:
        for p in block.mlp.parameters():
            p.data.zero_()
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    rng = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask = batch(rng, batch_size)
        logits = model(ids).logits[:, :-1]  # position t predicts t + 1
        loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    log = {"steps": steps, "seed": seed, "lr": lr, "batch_size": batch_size, "d_model": d_model, "heads": heads}
    return model, tok, {**log, "loss_every_100": losses[::100], "final_loss": losses[-1]}


def accuracy(model, n: int = 500, seed: int = 1) -> float:
    """Top-1 accuracy on the predictable tokens of fresh sequences (:func:`batch`)."""
    ids, mask = batch(torch.Generator().manual_seed(seed), n)
    with torch.no_grad():
        pred = model(ids).logits[:, :-1].argmax(-1)
    return float((pred == ids[:, 1:])[mask[:, 1:]].double().mean())


def pairs(n: int, seed: int = 0):
    """Clean ``s + s[:-1]`` -> ``s[-1]``; corrupt: the first copy other words (wrong: their last)."""
    from ..interventions.circuits.tasks import TaskPair

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = rng.sample(WORDS, 2 * LENGTH)
        s, o = w[:LENGTH], w[LENGTH:]
        out.append(TaskPair(" ".join(s + s[:-1]), " ".join(o + s[:-1]), " " + s[-1], " " + o[-1]))
    return out


def find_heads(adapter: ModelAdapter, n: int = 16, seed: int = 0) -> dict:
    """Heads by ablation (module docstring): per head the drop of the logit difference when its output is
    patched, the chosen previous-token and induction heads, and their attention scores."""
    from ..interventions.circuits import scores as S
    from ..interventions.circuits.blocks import Blocks
    from ..interventions.circuits.tasks import encode_pairs

    b = Blocks(adapter)
    g = b.graph
    p = encode_pairs(adapter, pairs(n, seed))
    drop = -S.exact_nodes(b, p).mean(0).numpy()  # [U]: m(clean) - m(node patched)
    H = adapter.n_heads
    chosen = {}
    for l, role in ((0, "previous_token"), (1, "induction")):
        s = g.layer_start(l)
        d = drop[s : s + H]
        chosen[role] = [f"L{l}.H{h}" for h in range(H) if d[h] >= 0.5 * d.max()]
    ids = batch(torch.Generator().manual_seed(seed + 7), 64, fixed=True)[0][:, : 1 + 2 * LENGTH]
    with torch.no_grad():
        att = adapter.hf_model(ids, output_attentions=True).attentions  # per layer [b, H, q, k]
    i = torch.arange(1, ids.shape[1])
    prev = {f"L{l}.H{h}": float(att[l][:, h, i, i - 1].mean()) for l in range(2) for h in range(H)}
    q = torch.arange(LENGTH + 1, 2 * LENGTH + 1)  # second-copy queries; their token's first copy is at q - L
    ind = {f"L{l}.H{h}": float(att[l][:, h, q, q - LENGTH + 1].mean()) for l in range(2) for h in range(H)}
    heads = {w: float(drop[j]) for j, w in enumerate(g.writers) if w.startswith("L") and ".H" in w}
    return {"drop": heads, **chosen, "previous_token_attention": prev, "induction_attention": ind}


def truth(found: dict, graph: Graph | None = None) -> list[tuple[str, str, str]]:
    """The known circuit: every edge among ``embed``, the heads found by ablation and the logits."""
    g = graph or Graph(2, 4, 4)
    heads = set(found["previous_token"]) | set(found["induction"])
    out = []
    for src, node, inp in g.edge_names():
        if src in heads | {"embed"} and node in heads | {"logits"} and src != node:
            out.append((src, node, inp))
    return sorted(out)


def save(out: Path | None = None, steps: int = STEPS, seed: int = SEED) -> Path:
    """Train, find the heads and cache everything in ``out`` (default the package's weights folder)."""
    out = out or weights_dir()
    model, tok, log = train(steps, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    a = ModelAdapter(model.double(), tok, NAME)
    found = find_heads(a)
    log.update({"accuracy": accuracy(model), "heads": found, "truth": truth(found), "length": LENGTH})
    (out / "training.json").write_text(json.dumps(log, indent=1))
    return out


def load(path: Path | None = None) -> tuple[ModelAdapter, dict]:
    """The cached model (float64) and its ``training.json``."""
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

    path = path or weights_dir()
    model = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").double().eval()
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    return ModelAdapter(model, tok, NAME), json.loads((path / "training.json").read_text())


def trained(n: int = 8, seed: int = 0) -> KnownCircuit:
    a, log = load()
    return KnownCircuit("trained-induction", a, pairs(n, seed), [tuple(e) for e in log["truth"]])  # type: ignore[misc]
