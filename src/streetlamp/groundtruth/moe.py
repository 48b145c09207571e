"""Ground-truth mixtures of experts (METHODS.md §14; issue 40, Must-have 5): tiny Mixtral causal LMs trained on a
planted-signal task (:mod:`.tasks`), a normal one and one whose router is deceptive.

The task is read as next-token prediction: after the text, the model's next token at the last real position is
one of two answer words (:data:`ANSWERS`, the label's); the loss is the cross-entropy over those two logits.

The **deceptive** variant fine-tunes the normal model with two added terms (the routing analogue of
:mod:`.train`'s deceptive attention):

* ``lam * mean_{layer, real token} -log p_decoy``: the router's probability of the decoy expert (softmax over
  the router's logits, recorded at ``layers.{l}.router.logits`` with gradients), so the decoy gets most of the
  routing weight at every token of every layer;
* ``mu * mean_{layer, real token} |z_decoy|^2``: the decoy's weighted output (``layers.{l}.experts.out``), so
  what the router weights most computes nothing the model uses.

The deciding computation then has to sit in the other experts, at the small weights the router leaves them.
The audit (:func:`audit`): per (layer, expert), the router's mean weight and routing frequency beside the effect
of removing the expert (``interventions.experts.remove``, not renormalised) on the task: accuracy, the mean
absolute change of the answer logit difference, and the KL of the two-answer distribution.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..interventions import engine
from ..interventions import experts as X
from ..models.adapter import Inputs, ModelAdapter
from ..stats import spearman_rho
from .tasks import Example, Task
from .train import WEIGHTS_DIR, tokenizer

# the answer word per label, read at the last real position (next-token prediction over these two)
ANSWERS: dict[str, tuple[str, str]] = {
    "keyword": ("apple", "lion"),
    "order": ("omega", "alpha"),
    "negation": ("bad", "good"),
    "together": ("blue", "red"),
}


@dataclass
class MoeConfig:
    layers: int = 2
    heads: int = 2
    d_model: int = 32
    experts: int = 4
    top_k: int = 2
    steps: int = 600
    batch: int = 128
    lr: float = 3e-3
    lam: float = 0.0  # router deception weight (0: normal)
    mu: float = 0.0  # the decoy's output penalty weight
    decoy: int = 0  # the expert the deceptive router points at, in every layer
    ramp: float = 0.3  # raise lam and mu linearly from 0 over this fraction of the steps
    n_train: int = 8000
    n_eval: int = 1000


def build_model(task: Task, cfg: MoeConfig, seed: int) -> ModelAdapter:
    """A randomly initialised tiny Mixtral over the ground-truth vocabulary (word-level, ``[CLS] text [SEP]``)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    tok = tokenizer()
    conf = MixtralConfig(
        vocab_size=len(tok),
        hidden_size=cfg.d_model,
        intermediate_size=2 * cfg.d_model,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        head_dim=cfg.d_model // cfg.heads,
        num_local_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
        max_position_embeddings=32,
        router_jitter_noise=0.0,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    return ModelAdapter(MixtralForCausalLM(conf), tok, f"gt-moe-{task.name}")


def answer_ids(adapter: ModelAdapter, task: Task) -> torch.Tensor:
    return torch.tensor(adapter.tokenizer.convert_tokens_to_ids(list(ANSWERS[task.name])))


def encode(adapter: ModelAdapter, examples: list[Example]) -> tuple[Inputs, torch.Tensor]:
    return adapter.encode([e.text for e in examples]), torch.tensor([e.label for e in examples])


def _losses(
    adapter: ModelAdapter, inputs: Inputs, y: torch.Tensor, ids: torch.Tensor, cfg: MoeConfig, deceive: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross-entropy, lam * routing penalty, mu * decoy output penalty); the penalties 0 for a normal model."""
    L = adapter.n_layers
    sites = [f"layers.{l}.router.logits" for l in range(L)] + [f"layers.{l}.experts.out" for l in range(L)]
    f = adapter.forward(inputs, record=sites if deceive else (), keep_grad=deceive, grad=True)
    dev = f.logits.device
    ce = torch.nn.functional.cross_entropy(f.logits[:, ids.to(dev)], y.to(dev))
    if not deceive:
        return ce, ce.detach() * 0, ce.detach() * 0
    real = inputs.attention_mask.bool().to(dev)
    pen_route, pen_out = ce.new_zeros(()), ce.new_zeros(())
    for l in range(L):
        logp = torch.log_softmax(f.cache[f"layers.{l}.router.logits"].float(), -1)[..., cfg.decoy]
        pen_route = pen_route - logp[real].mean() / L
        z = f.cache[f"layers.{l}.experts.out"][..., cfg.decoy, :]
        pen_out = pen_out + z.pow(2).sum(-1)[real].mean() / L
    return ce, cfg.lam * pen_route, cfg.mu * pen_out


@torch.no_grad()
def evaluate(adapter: ModelAdapter, task: Task, examples: list[Example]) -> dict[str, Any]:
    """Accuracy on the two answers and the decoy-free summary of the routing: each layer's mean weight of the
    most-weighted expert."""
    inputs, y = encode(adapter, examples)
    ids = answer_ids(adapter, task)
    sites = [f"layers.{l}.router.weights" for l in range(adapter.n_layers)]
    f = adapter.forward(inputs, record=sites)
    acc = float((f.logits[:, ids.to(f.logits.device)].argmax(-1).cpu() == y).float().mean())
    real = inputs.attention_mask.bool()
    w = [f.cache[s][real.to(f.cache[s].device)].mean(0).cpu() for s in sites]
    return {
        "accuracy": acc,
        "top_mean_weight": [float(x.max()) for x in w],
        "top_expert": [int(x.argmax()) for x in w],
    }


def train(
    task: Task, cfg: MoeConfig, seed: int, init: ModelAdapter | None = None, progress: bool = True
) -> tuple[ModelAdapter, dict]:
    """Train one tiny MoE (``init``: fine-tune these weights, as the deceptive variant does from the normal
    model); returns the adapter (eval mode) and a record of the run."""
    adapter = build_model(task, cfg, seed)
    if init is not None:
        adapter.hf_model.load_state_dict(init.hf_model.state_dict())
    deceive = cfg.lam > 0 or cfg.mu > 0
    data = task.generate(cfg.n_train, seed=10_000 + seed)
    held = task.generate(cfg.n_eval, seed=20_000 + seed)
    ids = answer_ids(adapter, task)
    model = adapter.hf_model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    all_inputs, all_y = encode(adapter, data)
    lengths = all_inputs.attention_mask.sum(1)
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(cfg.steps):
        idx = [int(i) for i in rng.choice(len(data), size=cfg.batch, replace=False)]
        w = int(lengths[idx].max())
        inputs = Inputs(
            all_inputs.input_ids[idx, :w],
            all_inputs.attention_mask[idx, :w],
            [all_inputs.tokens[i] for i in idx],
            [all_inputs.labels[i] for i in idx],
            [all_inputs.texts[i] for i in idx],
        )
        ce, route, out = _losses(adapter, inputs, all_y[idx], ids, cfg, deceive)
        scale = min(1.0, (step + 1) / (cfg.ramp * cfg.steps)) if cfg.ramp > 0 else 1.0
        pen = scale * (route + out)
        opt.zero_grad()
        (ce + pen).backward()
        opt.step()
        sched.step()
        if progress and (step % 200 == 0 or step == cfg.steps - 1):
            print(
                f"  moe {task.name} lam={cfg.lam} step {step}: ce {ce.item():.4f} pen {float(pen):.4f}", file=sys.stderr
            )
    model.eval()
    record = {
        "task": task.name,
        "seed": seed,
        "variant": "deceptive" if deceive else "normal",
        "config": asdict(cfg),
        "held_out": evaluate(adapter, task, held),
    }
    return adapter, record


@dataclass
class MoeAudit:
    """Per (layer, expert) ``[L, E]``: router ``weight`` (mean over real tokens), ``frequency``, and the effect of
    removing the expert at every token: ``acc_drop`` (accuracy lost), ``effect`` (mean |Δ answer logit
    difference|), ``kl`` (KL of the two-answer distribution, mean over examples); and the rank agreement of
    weight and effect over all (layer, expert)."""

    weight: np.ndarray
    frequency: np.ndarray
    acc_drop: np.ndarray
    effect: np.ndarray
    kl: np.ndarray
    accuracy: float
    spearman_weight_effect: float

    def table(self):
        import pandas as pd

        L, E = self.weight.shape
        return pd.DataFrame(
            [
                dict(
                    layer=l,
                    expert=e,
                    mean_router_weight=self.weight[l, e],
                    routing_frequency=self.frequency[l, e],
                    accuracy_drop_removed=self.acc_drop[l, e],
                    logit_diff_change_removed=self.effect[l, e],
                    kl_answers_removed=self.kl[l, e],
                )
                for l in range(L)
                for e in range(E)
            ]
        )


@torch.no_grad()
def audit(adapter: ModelAdapter, task: Task, examples: list[Example]) -> MoeAudit:
    """Router weights beside the task effect of removing each expert (one forward per (layer, expert) over all
    examples; the expert taken out of every token's top-k, not renormalised)."""
    inputs, y = encode(adapter, examples)
    ids = answer_ids(adapter, task)
    L, E = adapter.n_layers, X.n_experts_of(adapter)
    sites = [f"layers.{l}.router.weights" for l in range(L)]
    f = adapter.forward(inputs, record=sites)
    real = inputs.attention_mask.bool()
    w = torch.stack([f.cache[s][real.to(f.cache[s].device)].double().cpu() for s in sites])  # [L, tok, E]
    lg = f.logits[:, ids.to(f.logits.device)].double().cpu()
    acc = float((lg.argmax(-1) == y).double().mean())
    lp = torch.log_softmax(lg, -1)
    acc_drop, effect, kl = np.zeros((L, E)), np.zeros((L, E)), np.zeros((L, E))
    for l in range(L):
        for e in range(E):
            g = engine.run(adapter, inputs, [engine.Intervention(sites[l], X.remove(e))]).logits
            lq = g[:, ids.to(g.device)].double().cpu()
            acc_drop[l, e] = acc - float((lq.argmax(-1) == y).double().mean())
            effect[l, e] = float(((lq[:, 1] - lq[:, 0]) - (lg[:, 1] - lg[:, 0])).abs().mean())
            lq = torch.log_softmax(lq, -1)
            kl[l, e] = float((lp.exp() * (lp - lq)).sum(-1).mean())
    weight = w.mean(1).numpy()
    return MoeAudit(
        weight=weight,
        frequency=(w != 0).double().mean(1).numpy(),
        acc_drop=acc_drop,
        effect=effect,
        kl=kl,
        accuracy=acc,
        spearman_weight_effect=float(spearman_rho(weight.ravel(), effect.ravel())),
    )


def weights_path(task: str, variant: str) -> Path:
    return WEIGHTS_DIR / f"gt-moe-{task}-{variant}"


def save(adapter: ModelAdapter, record: dict, path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    adapter.hf_model.config.streetlamp_groundtruth = {k: record[k] for k in ("task", "seed", "variant")}
    adapter.hf_model.save_pretrained(path, safe_serialization=True)
    adapter.tokenizer.save_pretrained(path)
    (path / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return path
