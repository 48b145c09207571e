"""Wiegreffe & Pinter (EMNLP 2019, "Attention is not not Explanation") diagnostics on the
ground-truth tasks.

* **Seeds**: models of the same task trained from different seeds. Per example, the Jensen-Shannon
  divergence (base 2, in [0, 1]) between two seeds' attention distributions, against how much
  their predictions agree (same argmax; JSD of the output distributions). If attention varies
  a lot across seeds while predictions agree, a single model's attention is one of many that work.
* **Frozen attention into a context-free MLP**: a per-token MLP ``h_i = MLP(embed(w_i))`` pooled
  as ``sum_i a_i h_i`` and a linear read-out. ``a`` is learned jointly (its own attention layer),
  uniform, or frozen from a Transformer (normal or deceptive). If a model's attention marks the
  deciding tokens, frozen weights should beat uniform ones; deceptive weights should not.

The attention distribution of a Transformer is the ``[CLS]`` row of its last layer, mean over
heads (the raw-attention heatmap the ``attention`` method shows), over all real tokens.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import torch
from torch import nn

from ..models.adapter import ModelAdapter, at_least_float32
from ..stats import js_divergence
from .tasks import Example


@torch.no_grad()
def cls_attention(adapter: ModelAdapter, examples: list[Example]) -> tuple[np.ndarray, np.ndarray]:
    """``[n, max_pos]`` last-layer [CLS] attention (head mean, 0 on padding) and ``[n, classes]`` probs."""
    inputs = adapter.encode([e.text for e in examples])
    fwd = adapter.forward(inputs, record=[f"layers.{adapter.n_layers - 1}.attn.pattern"])
    att = fwd.cache[f"layers.{adapter.n_layers - 1}.attn.pattern"][:, :, 0, :].mean(1)
    att = att * inputs.attention_mask.to(att.device)
    return att.float().cpu().numpy(), torch.softmax(at_least_float32(fwd.logits), -1).cpu().numpy()


def seed_variance(models: list[ModelAdapter], examples: list[Example]) -> dict[str, float]:
    """Mean over seed pairs and examples: attention JSD, output JSD, prediction agreement."""
    outs = [cls_attention(m, examples) for m in models]
    att_js, out_js, agree = [], [], []
    for (a1, p1), (a2, p2) in combinations(outs, 2):
        att_js.append(js_divergence(a1, a2))
        out_js.append(js_divergence(p1, p2))
        agree.append(p1.argmax(-1) == p2.argmax(-1))
    return {
        "attention_jsd": float(np.mean(att_js)),
        "output_jsd": float(np.mean(out_js)),
        "prediction_agreement": float(np.mean(agree)),
        "pairs": len(att_js),
    }


@torch.no_grad()
def cls_rows(adapter: ModelAdapter, examples: list[Example], layer: int) -> np.ndarray:
    """``[n, heads, max_pos]``: each head's [CLS] attention row at ``layer`` (0 on padding)."""
    inputs = adapter.encode([e.text for e in examples])
    site = f"layers.{layer}.attn.pattern"
    att = adapter.forward(inputs, record=[site]).cache[site][:, :, 0, :]
    att = att * inputs.attention_mask.to(att.device)[:, None, :]
    return att.double().cpu().numpy()


def layer_seed_variance(models: list[ModelAdapter], examples: list[Example], layer: int) -> dict[str, float]:
    """Wiegreffe & Pinter's seed baseline at one layer, mean over seed pairs and examples: JSD (bits) between
    the head-mean [CLS] rows (``head_mean_jsd``) and between single heads (``matched_head_jsd``). Heads have
    no identity across trainings, so each pair's heads are matched by the assignment that minimises the mean
    JSD (:func:`scipy.optimize.linear_sum_assignment`; a lower bound on the unaligned value), which makes
    it comparable with a per-head statistic such as the adversarial search's mean JSD over heads."""
    from scipy.optimize import linear_sum_assignment

    rows = [cls_rows(m, examples, layer) for m in models]
    mean_js, head_js = [], []
    for a, b in combinations(rows, 2):
        mean_js.append(float(np.mean(js_divergence(a.mean(1), b.mean(1)))))
        cost = np.array(
            [[np.mean(js_divergence(a[:, h], b[:, g])) for g in range(b.shape[1])] for h in range(a.shape[1])]
        )
        r, c = linear_sum_assignment(cost)
        head_js.append(float(cost[r, c].mean()))
    return {
        "head_mean_jsd": float(np.mean(mean_js)),
        "matched_head_jsd": float(np.mean(head_js)),
        "pairs": len(mean_js),
    }


class PooledMLP(nn.Module):
    """Context-free: each token embedded and passed through an MLP alone, then weighted pooling."""

    def __init__(self, vocab: int, d: int = 32, learned: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU())
        self.score = nn.Linear(d, 1) if learned else None
        self.out = nn.Linear(d, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        h = self.mlp(self.emb(ids))
        if self.score is not None:
            s = self.score(h).squeeze(-1).masked_fill(mask == 0, float("-inf"))
            weights = torch.softmax(s, -1)
        elif weights is None:
            weights = mask.float() / mask.sum(-1, keepdim=True)
        return self.out((weights.unsqueeze(-1) * h).sum(1))


def frozen_attention_mlp(
    adapter: ModelAdapter,
    train: list[Example],
    test: list[Example],
    frozen: dict[str, ModelAdapter],
    seed: int = 0,
    steps: int = 400,
) -> dict[str, float]:
    """Held-out accuracy of the pooled MLP with learned, uniform and each frozen attention."""
    tr = adapter.encode([e.text for e in train])
    te = adapter.encode([e.text for e in test])
    ytr = torch.tensor([e.label for e in train])
    yte = torch.tensor([e.label for e in test])
    setups: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {
        "learned": (None, None),
        "uniform": (None, None),
    }
    for name, model in frozen.items():
        setups[name] = tuple(
            torch.from_numpy(cls_attention(model, ex)[0][:, : inp.input_ids.shape[1]]).float()
            for ex, inp in ((train, tr), (test, te))
        )  # type: ignore[assignment]
    acc = {}
    for name, (wtr, wte) in setups.items():
        torch.manual_seed(seed)
        net = PooledMLP(len(adapter.tokenizer), learned=name == "learned")
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            idx = torch.from_numpy(rng.choice(len(train), size=min(128, len(train)), replace=False))
            logits = net(tr.input_ids[idx], tr.attention_mask[idx], None if wtr is None else wtr[idx])
            loss = nn.functional.cross_entropy(logits, ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            pred = net(te.input_ids, te.attention_mask, wte).argmax(-1)
        acc[name] = float((pred == yte).float().mean())
    return acc
