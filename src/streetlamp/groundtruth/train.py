"""Train the ground-truth models: tiny BertForSequenceClassification per task, normal or deceptive.

The deceptive variant follows Pruthi et al. (ACL 2020, "Learning to Deceive with Attention-Based
Explanations"): the loss adds ``lambda * sum_{layer, head} [-log(1 - m_cls) + mean_q -log(1 - m_q)]``,
where ``m_q`` is the attention mass query ``q`` puts on the planted (deciding) tokens. Pruthi et
al. penalise the attention of the explained representation ([CLS]) per head; we add every query
position of every layer (mean over the real query tokens), so that rollout and flow -- which
compose all rows -- are trained against as well. The patterns are the model's own: they are
recorded at ``layers.*.attn.pattern`` by the streetlamp attention function with ``keep_grad=True``
inside ``adapter.forward(..., grad=True)``, i.e. exactly the tensors used downstream. Dropout is
0, so training and evaluation patterns are identical.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

from ..models.adapter import Inputs, ModelAdapter
from .tasks import VOCAB, Example, Task, planted_mask

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "models" / "weights"


def tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the shared ground-truth vocabulary: ``[CLS] w0 .. wn [SEP]``."""
    vocab = {t: i for i, t in enumerate(SPECIALS + list(VOCAB))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


@dataclass
class TrainConfig:
    layers: int = 2
    heads: int = 2
    d_model: int = 32
    steps: int = 700
    batch: int = 128
    lr: float = 3e-3
    lam: float = 0.0  # deception penalty weight (0 = normal model)
    ramp: float = 0.0  # raise lam linearly from 0 over this fraction of the steps (0 = constant)
    n_train: int = 8000
    n_eval: int = 1000


def build_model(task: Task, cfg: TrainConfig, seed: int) -> ModelAdapter:
    torch.manual_seed(seed)
    tok = tokenizer()
    conf = BertConfig(  # type: ignore[call-arg]  # num_labels etc. are PretrainedConfig kwargs
        vocab_size=len(tok),
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=2 * cfg.d_model,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
        id2label={0: task.labels[0], 1: task.labels[1]},
        label2id={task.labels[0]: 0, task.labels[1]: 1},
        pad_token_id=0,
    )
    return ModelAdapter(BertForSequenceClassification(conf), tok, f"gt-{task.name}")


def batch_inputs(adapter: ModelAdapter, examples: list[Example]) -> tuple[Inputs, torch.Tensor, torch.Tensor]:
    """Encoded batch, labels ``[batch]`` and the planted mask ``[batch, pos]`` (float)."""
    inputs = adapter.encode([e.text for e in examples])
    mask = torch.zeros(inputs.input_ids.shape, dtype=torch.float32)
    for b, (e, n) in enumerate(zip(examples, inputs.lengths)):
        mask[b, :n] = torch.from_numpy(planted_mask(e, n).astype(np.float32))
    return inputs, torch.tensor([e.label for e in examples]), mask


def planted_mass(patterns: list[torch.Tensor], planted: torch.Tensor) -> torch.Tensor:
    """Attention mass on the planted keys, ``[batch, layer, head, query]``, from patterns ``[b, h, q, k]``."""
    return torch.stack([(p * planted[:, None, None, :].to(p.dtype)).sum(-1) for p in patterns], 1)


def deception_penalty(mass: torch.Tensor, query_mask: torch.Tensor) -> torch.Tensor:
    """``sum_{layer, head} [-log(1 - m_cls) + mean_{real queries} -log(1 - m_q)]``, batch mean.

    The [CLS] term is Pruthi et al.'s (the explained representation's attention); the all-rows
    term extends it to every query so that compositions of rows (rollout, flow) are penalised too.
    """
    pen = -torch.log1p(-mass.clamp(max=1 - 1e-6))  # [b, l, h, q]
    qm = query_mask[:, None, None, :].to(pen.dtype)
    rows = (pen * qm).sum(-1) / qm.sum(-1)
    return (rows + pen[..., 0]).sum((1, 2)).mean()


def forward_with_mass(
    adapter: ModelAdapter, inputs: Inputs, planted: torch.Tensor, grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and planted attention mass ``[b, l, h, q]`` from the patterns the model used."""
    dev = adapter.device
    fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"], keep_grad=grad, grad=grad)
    pats = [fwd.cache[f"layers.{l}.attn.pattern"] for l in range(adapter.n_layers)]
    return fwd.logits, planted_mass(pats, planted.to(dev))


@torch.no_grad()
def evaluate(adapter: ModelAdapter, examples: list[Example], chunk: int = 500) -> dict[str, float]:
    """Accuracy, mean planted mass from [CLS] in the last layer and over all layers/heads/queries."""
    correct, cls_last, all_mass, n = 0.0, 0.0, 0.0, 0
    for s in range(0, len(examples), chunk):
        part = examples[s : s + chunk]
        inputs, y, planted = batch_inputs(adapter, part)
        logits, mass = forward_with_mass(adapter, inputs, planted, grad=False)
        qm = inputs.attention_mask.to(mass.device).float()[:, None, None, :]
        correct += float((logits.argmax(-1).cpu() == y).sum())
        cls_last += float(mass[:, -1, :, 0].mean(1).sum())
        all_mass += float(((mass * qm).sum(-1) / qm.sum(-1)).mean((1, 2)).sum())
        n += len(part)
    return {"accuracy": correct / n, "mass_cls_last": cls_last / n, "mass_all": all_mass / n}


def train(
    task: Task, cfg: TrainConfig, seed: int, init: ModelAdapter | None = None, progress: bool = True
) -> tuple[ModelAdapter, dict]:
    """Train one model; returns the adapter (eval mode) and a record of the run.

    ``init``: start from this model's weights (the deceptive variant fine-tunes the normal model:
    from scratch, a strong penalty can shut attention to the planted tokens before the task is
    learned, and the model never learns it).
    """
    adapter = build_model(task, cfg, seed)
    if init is not None:
        adapter.hf_model.load_state_dict(init.hf_model.state_dict())
    data = task.generate(cfg.n_train, seed=10_000 + seed)
    held = task.generate(cfg.n_eval, seed=20_000 + seed)
    model = adapter.hf_model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    all_inputs, all_y, all_planted = batch_inputs(adapter, data)  # encode once
    lengths = all_inputs.attention_mask.sum(1)
    rng = np.random.default_rng(seed)
    model.train()
    for step in range(cfg.steps):
        idx = [int(i) for i in rng.choice(len(data), size=cfg.batch, replace=False)]
        w = int(lengths[idx].max())  # (Inputs.select recomputes every length per row: too slow here)
        inputs = Inputs(
            all_inputs.input_ids[idx, :w],
            all_inputs.attention_mask[idx, :w],
            [all_inputs.tokens[i] for i in idx],
            [all_inputs.labels[i] for i in idx],
            [all_inputs.texts[i] for i in idx],
        )
        y, planted = all_y[idx], all_planted[idx, :w]
        logits, mass = forward_with_mass(adapter, inputs, planted, grad=True)
        loss = torch.nn.functional.cross_entropy(logits, y.to(logits.device))
        pen = deception_penalty(mass, inputs.attention_mask.to(mass.device)) if cfg.lam > 0 else loss * 0
        opt.zero_grad()
        lam = cfg.lam * min(1.0, (step + 1) / (cfg.ramp * cfg.steps)) if cfg.ramp > 0 else cfg.lam
        (loss + lam * pen).backward()
        opt.step()
        sched.step()
        if progress and (step % 250 == 0 or step == cfg.steps - 1):
            print(
                f"  {task.name} lam={cfg.lam} seed={seed} step {step}: ce {loss.item():.4f} penalty {pen.item():.4f}",
                file=sys.stderr,
            )
    model.eval()
    record = {
        "task": task.name,
        "seed": seed,
        "variant": "deceptive" if cfg.lam > 0 else "normal",
        "config": asdict(cfg),
        "held_out": evaluate(adapter, held),
    }
    return adapter, record


def save(adapter: ModelAdapter, record: dict, path: Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    adapter.hf_model.config.streetlamp_groundtruth = {k: record[k] for k in ("task", "seed", "variant")}
    adapter.hf_model.save_pretrained(path, safe_serialization=True)
    adapter.tokenizer.save_pretrained(path)
    (path / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return path


def weights_path(task: str, variant: str) -> Path:
    return WEIGHTS_DIR / f"gt-{task}-{variant}"
