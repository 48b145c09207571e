"""The shipped ground-truth models and the benchmark CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

import streetlamp
from streetlamp.cli import main
from streetlamp.groundtruth import leaderboard as lb
from streetlamp.groundtruth.tasks import TASKS, planted_mask
from streetlamp.groundtruth.train import weights_path
from streetlamp.methods.registry import get_method
from streetlamp.models.adapter import Target

_MODELS: dict[tuple[str, str], streetlamp.ModelAdapter] = {}


def model(task: str, variant: str) -> streetlamp.ModelAdapter:
    if (task, variant) not in _MODELS:
        _MODELS[task, variant] = streetlamp.load(weights_path(task, variant))
    return _MODELS[task, variant]


def cls_mass(adapter: streetlamp.ModelAdapter, examples: list) -> tuple[float, float]:
    """Accuracy and attention mass on the planted tokens ([CLS] row, every layer, head mean),
    computed here from the recorded patterns."""
    inputs = adapter.encode([e.text for e in examples])
    fwd = adapter.forward(inputs, record=["layers.*.attn.pattern"])
    acc = float((fwd.logits.argmax(-1) == torch.tensor([e.label for e in examples])).float().mean())
    masses = []
    for b, (e, n) in enumerate(zip(examples, inputs.lengths)):
        m = planted_mask(e, n)
        for l in range(adapter.n_layers):
            a = fwd.cache[f"layers.{l}.attn.pattern"][b, :, 0, :n].numpy()
            masses.append(a[:, m].sum(-1).mean())
    return acc, float(np.mean(masses))


@pytest.mark.parametrize("task", list(TASKS))
def test_shipped_models_accurate_and_deceptive_attention_looks_away(task: str) -> None:
    fresh = TASKS[task].generate(400, seed=777)  # never used in training (seeds 10000+, 20000+)
    acc_n, mass_n = cls_mass(model(task, "normal"), fresh)
    acc_d, mass_d = cls_mass(model(task, "deceptive"), fresh)
    # Measured on these 400 texts: accuracy 1.0 (normal) and 0.9925-1.0 (deceptive), i.e. at most 3 errors;
    # the one-sided 99.9% Clopper-Pearson lower bound of 397/400 is 0.968, so 0.95 sits below what the
    # sampling error allows and a failure means a broken model, not chance. Attention mass on the deciding
    # tokens, deceptive / normal: 0.023-0.060 measured, asserted < 0.25 (4x the largest).
    assert acc_n >= 0.95 and acc_d >= 0.95, (acc_n, acc_d)
    assert mass_d < 0.25 * mass_n, (mass_n, mass_d)


def test_shipped_weights_are_small_and_regular_checkpoints() -> None:
    total = 0
    for task in TASKS:
        for variant in ("normal", "deceptive"):
            p = weights_path(task, variant)
            assert (p / "config.json").exists() and (p / "model.safetensors").exists()
            total += sum(f.stat().st_size for f in p.iterdir())
            a = model(task, variant)
            assert type(a.hf_model).__name__ == "BertForSequenceClassification" and 2 <= a.n_layers <= 4
    assert total < 5_000_000


def test_occlusion_finds_keyword_and_random_does_not() -> None:
    """End to end on a shipped model: an oracle scores AUPRC 1; occlusion finds the single planted
    keyword of the normal model (a method that reads the model; on the logit: the probability is
    saturated at 1.0 on most texts); random stays low."""
    adapter = model("keyword", "normal")
    examples = TASKS["keyword"].generate(30, seed=9)
    inputs = adapter.encode([e.text for e in examples])
    exps = get_method("occlusion").attribute(adapter, inputs, target=Target(quantity="logit"))
    rng = np.random.default_rng(0)
    occ, rnd, orc = [], [], []
    for e, x, n in zip(examples, exps, inputs.lengths):
        rel = planted_mask(e, n)[1:-1]
        occ.append(lb.average_precision(lb.word_scores(x.scores), rel))
        rnd.append(lb.average_precision(rng.random(len(rel)), rel))
        orc.append(lb.average_precision(rel.astype(float), rel))
    assert np.mean(orc) == 1.0
    # random: one planted keyword among m word tokens, so AP = 1 / rank with the rank uniform on 1..m:
    # E = H_m / m and Var = (sum 1/r^2) / m - E^2 exactly; the mean of the 30 texts is bounded by its
    # expectation + 4 standard errors (a measured mean far above chance would mean the scoring is broken)
    ms = [int(planted_mask(e, n)[1:-1].size) for e, n in zip(examples, inputs.lengths)]
    assert all(int(planted_mask(e, n)[1:-1].sum()) == 1 for e, n in zip(examples, inputs.lengths))
    ev = [sum(1 / r for r in range(1, m + 1)) / m for m in ms]
    var = [sum(1 / r**2 for r in range(1, m + 1)) / m - x**2 for m, x in zip(ms, ev)]
    se = np.sqrt(np.sum(var)) / len(ms)
    assert abs(np.mean(rnd) - np.mean(ev)) < 4 * se
    # occlusion reads the model: its mean AP is far above random's bound (measured 1.0; random 0.31 against
    # E = 0.32, se = 0.05; the keyword model's logit moves only with the keyword); 0.9 leaves room for a
    # text where a neighbour ties it (AP 1/2 on 3 of 30 texts)
    assert np.mean(occ) > 0.9 > np.mean(ev) + 4 * se


def test_cli_benchmark_writes_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "bench"
    rc = main(
        ["benchmark", "--tasks", "keyword", "--methods", "attention,occlusion", "--n-examples", "6", "--out", str(out)]
    )
    assert rc == 0
    rows = list(csv.DictReader(open(out / "leaderboard.csv")))
    for col in (
        "task",
        "variant",
        "method",
        "average_precision",
        "auprc",
        "precision_at_k",
        "comprehensiveness",
        "sufficiency",
        "edge_share",
        "edge_share_uniform",
    ):
        assert col in rows[0]
    for r in rows:  # shares are fractions; uniform scores give 2/n, n >= 8 tokens (6+ words, [CLS], [SEP])
        assert 0 <= float(r["edge_share"]) <= 1 and 0 < float(r["edge_share_uniform"]) <= 2 / 8
    assert {(r["variant"], r["method"]) for r in rows} == {
        (v, m) for v in ("normal", "deceptive") for m in ("random", "attention", "occlusion")
    }
    assert all(r["error"] == "" for r in rows)
    assert (out / "leaderboard.png").exists() and (out / "models.csv").exists()
    assert "keyword" in capsys.readouterr().out
    assert main(["benchmark", "--tasks", "nope", "--out", str(tmp_path / "x")]) == 2
    assert main(["benchmark", "--tasks", "keyword", "--out", str(out)]) == 2  # exists, no --overwrite
