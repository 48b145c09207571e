"""F-Fidelity (Zheng et al., ICLR 2025): fidelity measured on a copy of the classifier fine-tuned so that
masked inputs are in distribution.

**Fine-tuning (explanation-agnostic).** A ``copy.deepcopy`` of the classifier is trained on the
``--ffidelity-train`` data (the examples whose text is also evaluated are left out): every epoch, every
example gets ``k`` of its rankable tokens, ``k`` uniform in ``0..floor(beta * m)``, chosen uniformly,
replaced by the mask token (:meth:`~streetlamp.models.adapter.ModelAdapter.replacement_token`
``"mask"``); cross-entropy on the gold labels, AdamW, dropout on. The copy is written to the run
folder as ``ffidelity/model.safetensors`` with ``ffidelity/training.json`` (settings, data hash, loss
per epoch, seconds, accuracy of the copy and of the original on the evaluated examples, plain and with
a beta-fraction masked) and read back on resume; the model being evaluated, and any embedded or saved
checkpoint, are never written.

**Measuring.** The explanations are the original model's (of its prediction ``c``). For a removal
ratio ``xi`` the top set ``T`` is the ``max(1, round(xi * m))`` highest-ranked rankable tokens; a
removal masks a uniformly drawn subset of ``ceil(beta * |T|)`` tokens of ``T`` (so no input has more
than a beta-fraction masked: the fine-tuned copy has seen such inputs), ``samples`` subsets per ratio:

* ``ffid_plus@xi = F_r(x) - mean F_r(x with the subset of T masked)`` (high = faithful);
* ``ffid_minus@xi = F_r(x) - mean F_r(x with a ceil(beta * |R|) subset of R = rest masked)`` (low =
  faithful; NaN when nothing is left outside ``T``);
* ``ffid_aopc_plus`` / ``ffid_aopc_minus``: their means over the ratios;

with ``F_r`` the fine-tuned copy's probability of ``c``. The paper states fidelity with the predicted
label's indicator as well as with probabilities; this module uses probabilities, like ``evaluate``'s
hard metrics.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter
from .common import output_prob_of, rank_desc

RATIOS = (0.1, 0.3, 0.5, 0.7, 0.9)
FOLDER = "ffidelity"


@dataclass
class FFidelity:
    train: str = ""  # the fine-tuning data (a dataset name or file); "" = off
    beta: float = 0.5  # the largest masked fraction, in fine-tuning and in every measured input
    epochs: int = 2
    lr: float = 3e-5
    batch: int = 16
    samples: int = 4  # random subsets per ratio
    max_train: int = 1000  # at most this many training examples (drawn with the run seed)


def check_adapter(adapter: ModelAdapter) -> None:
    if not adapter.kind.labels or adapter.modality != "text":
        raise StreetlampError(f"--ffidelity-train fine-tunes a text classifier; {adapter.name} is a {adapter.kind}")


def _mask_rows(ids: list[int], rankable: np.ndarray, beta: float, rng: np.random.Generator, rep: int) -> list[int]:
    pos = np.flatnonzero(rankable)
    k = int(rng.integers(0, int(math.floor(beta * len(pos))) + 1))
    out = list(ids)
    for i in rng.choice(pos, size=k, replace=False):
        out[int(i)] = rep
    return out


def _accuracy(adapter: ModelAdapter, rows: list[list[int]], gold: list[int], budget: int | None) -> float:
    from .common import output_probs

    if not rows:
        return float("nan")
    return float((output_probs(adapter, rows, budget).argmax(-1) == np.asarray(gold)).mean())


def fine_tune(
    adapter: ModelAdapter,
    train: list[tuple[list[int], int]],
    held_out: list[tuple[list[int], int]],
    cfg: FFidelity,
    seed: int,
    budget: int | None = None,
) -> tuple[ModelAdapter, dict[str, Any]]:
    """A fine-tuned copy of ``adapter``'s classifier (random token masking) and its training record."""
    check_adapter(adapter)
    if not train:
        raise StreetlampError("--ffidelity-train: no training examples left once the evaluated texts are left out")
    rep = int(adapter.replacement_token("mask")[1])  # type: ignore[arg-type]
    hf = copy.deepcopy(adapter.hf_model)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(hf.parameters(), lr=cfg.lr)
    dev = adapter.device
    losses = []
    t0 = time.perf_counter()
    hf.train()
    for _epoch in range(cfg.epochs):
        order = rng.permutation(len(train))
        total, count = 0.0, 0
        for start in range(0, len(order), cfg.batch):
            batch = [train[i] for i in order[start : start + cfg.batch]]
            rows = [_mask_rows(ids, ~adapter.special_mask(ids), cfg.beta, rng, rep) for ids, _ in batch]
            inp = Inputs.from_ids(adapter, rows, strings=False)
            logits = hf(input_ids=inp.input_ids.to(dev), attention_mask=inp.attention_mask.to(dev)).logits
            y = torch.tensor([g for _, g in batch], device=logits.device)
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        losses.append(total / count)
    hf.eval()
    seconds = time.perf_counter() - t0
    tuned = ModelAdapter(hf, adapter.tokenizer, f"{adapter.name} (F-Fidelity fine-tuned copy)", adapter.source)
    rng_eval = np.random.default_rng(seed + 1)
    rows = [ids for ids, _ in held_out]
    gold = [g for _, g in held_out]
    masked = [_mask_rows(ids, ~adapter.special_mask(ids), cfg.beta, rng_eval, rep) for ids in rows]
    record = {
        "settings": asdict(cfg),
        "seed": seed,
        "n_train": len(train),
        "n_held_out": len(held_out),
        "train_ids_sha256": hashlib.sha256(json.dumps(train).encode()).hexdigest(),
        "loss_per_epoch": losses,
        "seconds": seconds,
        "accuracy": {
            "fine_tuned": _accuracy(tuned, rows, gold, budget),
            "original": _accuracy(adapter, rows, gold, budget),
            "fine_tuned_masked": _accuracy(tuned, masked, gold, budget),
            "original_masked": _accuracy(adapter, masked, gold, budget),
        },
    }
    return tuned, record


def save_copy(folder: Path, tuned: ModelAdapter, record: dict) -> None:
    """``ffidelity/model.safetensors`` and ``training.json``, each written to a temporary name first."""
    from safetensors.torch import save_model

    d = folder / FOLDER
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / ".model.safetensors.tmp"
    save_model(tuned.hf_model, str(tmp))
    tmp.replace(d / "model.safetensors")
    (d / ".training.json.tmp").write_text(json.dumps(record, indent=2))
    (d / ".training.json.tmp").replace(d / "training.json")


def load_copy(folder: Path, adapter: ModelAdapter) -> tuple[ModelAdapter, dict] | None:
    """The saved copy over a deepcopy of ``adapter``'s model, or None when there is none yet."""
    from safetensors.torch import load_model

    d = folder / FOLDER
    if not (d / "model.safetensors").is_file() or not (d / "training.json").is_file():
        return None
    hf = copy.deepcopy(adapter.hf_model)
    load_model(hf, str(d / "model.safetensors"))
    hf.eval()
    name = f"{adapter.name} (F-Fidelity fine-tuned copy)"
    return ModelAdapter(hf, adapter.tokenizer, name, adapter.source), json.loads((d / "training.json").read_text())


@dataclass
class FFidPlan:
    rows: list[list[int]]
    has_minus: list[bool]
    n_rankable: int

    @staticmethod
    def build(
        ids: list[int], scores: np.ndarray, special: np.ndarray, rep: int, cfg: FFidelity, rng: np.random.Generator
    ) -> FFidPlan:
        order = rank_desc(np.asarray(scores, np.float64), ~special)
        m = len(order)
        rows: list[list[int]] = []
        has_minus: list[bool] = []
        if m == 0:
            return FFidPlan(rows, has_minus, 0)
        for xi in RATIOS:
            top, rest = order[: max(1, int(round(xi * m)))], order[max(1, int(round(xi * m))) :]
            has_minus.append(len(rest) > 0)
            for pool in (top, rest if len(rest) else top):  # a placeholder pool when nothing is left (NaN)
                k = int(math.ceil(cfg.beta * len(pool)))
                for _ in range(cfg.samples):
                    row = list(ids)
                    for i in rng.choice(pool, size=k, replace=False):
                        row[int(i)] = rep
                    rows.append(row)
        return FFidPlan(rows, has_minus, m)

    def metrics(self, f_full: float, f_rows: np.ndarray, samples: int) -> dict[str, float]:
        if self.n_rankable == 0:
            return {}
        f = f_rows.reshape(len(RATIOS), 2, samples).mean(-1)
        out: dict[str, float] = {}
        plus, minus = f_full - f[:, 0], np.where(self.has_minus, f_full - f[:, 1], np.nan)
        for xi, p, q in zip(RATIOS, plus, minus):
            out[f"ffid_plus@{xi}"] = float(p)
            out[f"ffid_minus@{xi}"] = float(q)
        out["ffid_aopc_plus"] = float(plus.mean())
        out["ffid_aopc_minus"] = float(np.nanmean(minus)) if np.isfinite(minus).any() else float("nan")
        return out


def ffidelity_metrics(
    tuned: ModelAdapter,
    ids: list[list[int]],
    scores: dict[str, list[np.ndarray]],
    specials: list[np.ndarray],
    pred: np.ndarray,
    cfg: FFidelity,
    seeds: list[int],
    budget: int | None,
) -> tuple[dict[tuple[str, int], dict[str, float]], np.ndarray]:
    """F-Fidelity of every (method, example) on the fine-tuned copy, and its probabilities of the full inputs."""
    rep = int(tuned.replacement_token("mask")[1])  # type: ignore[arg-type]
    full = output_prob_of(tuned, ids, budget, pred.tolist())
    plans: list[tuple[str, int, FFidPlan, int]] = []
    rows: list[list[int]] = []
    owner: list[int] = []
    for mi, name in enumerate(scores):
        for b in range(len(ids)):
            p = FFidPlan.build(
                ids[b], scores[name][b], specials[b], rep, cfg, np.random.default_rng(seeds[b] * 31 + mi)
            )
            plans.append((name, b, p, len(rows)))
            rows += p.rows
            owner += [b] * len(p.rows)
    out: dict[tuple[str, int], dict[str, float]] = {}
    f = output_prob_of(tuned, rows, budget, pred[np.asarray(owner, int)].tolist()) if rows else np.zeros(0)
    for name, b, p, start in plans:
        out[(name, b)] = p.metrics(float(full[b]), f[start : start + len(p.rows)], cfg.samples)
    return out, full
