"""F-Fidelity (evaluation/ffidelity.py) on a tiny classifier: the fine-tuned copy (training, saving,
reloading, the original untouched) and the metric against a direct computation."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from streetlamp.cli import main
from streetlamp.evaluation.ffidelity import RATIOS, FFidelity, FFidPlan, fine_tune, load_copy, save_copy
from streetlamp.models.adapter import ModelAdapter
from streetlamp.models.tiny import save_tiny, tiny_model
from tests.helpers.weights import weights_hash


def files_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


POS = ["the movie was good", "i loved it", "a great film", "very fun story", "the acting was great"]
NEG = ["the movie was bad", "i hated it", "a terrible film", "very boring story", "the plot was bad"]


def _data(adapter: ModelAdapter) -> list[tuple[list[int], int]]:
    out = []
    for texts, label in ((POS, 2), (NEG, 0)):
        out += [(adapter.tokenizer(t)["input_ids"], label) for t in texts]
    return out


def test_fine_tuned_copy_learns_saves_and_leaves_the_original(tmp_path: Path) -> None:
    m, t = tiny_model("bert", seed=4)
    adapter = ModelAdapter(m, t, "tiny-bert")
    before = weights_hash(adapter.hf_model)
    data = _data(adapter)
    cfg = FFidelity(train="x", beta=0.5, epochs=25, lr=5e-3, batch=4)
    tuned, record = fine_tune(adapter, data, data, cfg, seed=0)
    assert weights_hash(adapter.hf_model) == before  # the original model is not trained
    assert weights_hash(tuned.hf_model) != before
    losses = record["loss_per_epoch"]
    assert len(losses) == 25 and losses[-1] < 0.5 * losses[0]
    assert record["accuracy"]["fine_tuned"] == 1.0 > record["accuracy"]["original"]
    assert record["n_train"] == 10 and record["seconds"] > 0
    save_copy(tmp_path, tuned, record)
    assert (tmp_path / "ffidelity" / "model.safetensors").is_file()
    back = load_copy(tmp_path, adapter)
    assert back is not None
    assert weights_hash(back[0].hf_model) == weights_hash(tuned.hf_model)
    assert back[1]["loss_per_epoch"] == losses
    assert weights_hash(adapter.hf_model) == before
    assert load_copy(tmp_path / "elsewhere", adapter) is None


def test_ffidelity_rows_and_metrics_against_a_direct_computation() -> None:
    m, t = tiny_model("bert", seed=5)
    m = m.double()
    with torch.no_grad():
        m.classifier.weight.mul_(300)
    a = ModelAdapter(m, t, "tiny-bert")
    ids = a.tokenizer("the movie was not good but the acting was great")["input_ids"]
    special = a.special_mask(ids)
    scores = np.random.default_rng(2).standard_normal(len(ids))
    cfg = FFidelity(train="x", beta=0.5, samples=3)
    rep = a.tokenizer.mask_token_id
    plan = FFidPlan.build(ids, scores, special, rep, cfg, np.random.default_rng(0))
    m_r = int((~special).sum())
    order = [i for i in np.argsort(-scores, kind="stable") if not special[i]]
    assert len(plan.rows) == len(RATIOS) * 2 * cfg.samples
    for r, xi in enumerate(RATIOS):
        n_top = max(1, int(round(xi * m_r)))
        top, rest = set(order[:n_top]), set(order[n_top:])
        for half, pool in ((0, top), (1, rest)):
            for j in range(cfg.samples):
                row = plan.rows[(r * 2 + half) * cfg.samples + j]
                masked = {i for i, (x, y) in enumerate(zip(row, ids)) if x != y}
                assert masked <= pool and len(masked) == math.ceil(cfg.beta * len(pool))
                assert all(row[i] == rep for i in masked)

    def prob(row: list[int], c: int) -> float:
        with torch.no_grad():
            return float(torch.softmax(m(input_ids=torch.tensor([row])).logits.double(), -1)[0, c])

    with torch.no_grad():
        full_p = torch.softmax(m(input_ids=torch.tensor([ids])).logits.double(), -1)[0]
    c = int(full_p.argmax())
    f_rows = np.array([prob(r, c) for r in plan.rows])
    met = plan.metrics(float(full_p[c]), f_rows, cfg.samples)
    for r, xi in enumerate(RATIOS):
        plus = float(full_p[c]) - np.mean(f_rows[(2 * r) * cfg.samples : (2 * r + 1) * cfg.samples])
        assert met[f"ffid_plus@{xi}"] == pytest.approx(plus, abs=1e-12)
    assert abs(met["ffid_aopc_plus"]) > 1e-6  # the masked inputs move the output
    assert met["ffid_aopc_plus"] == pytest.approx(np.mean([met[f"ffid_plus@{x}"] for x in RATIOS]), abs=1e-15)


def test_evaluate_with_ffidelity_saves_the_copy_and_resumes(tmp_path: Path) -> None:
    from streetlamp.commands.evaluate import EvaluateSettings
    from streetlamp.commands.evaluate.run import evaluate
    from streetlamp.settings import RunOptions

    ckpt = save_tiny("bert", tmp_path / "bert", seed=1)
    ckpt_hash = files_hash(ckpt)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"{x},pos\n" for x in POS) + "".join(f"{x},neg\n" for x in NEG))
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,pos\nthe plot was boring,neg\na fun film,pos\n")
    s = EvaluateSettings(
        data=str(data),
        chunk_size=2,
        methods=["attention", "occlusion"],
        soft=False,
        ffidelity_train=str(train),
        ffidelity_epochs=1,
        ffidelity_samples=2,
    )
    assert s.ffidelity == FFidelity(train=str(train), epochs=1, samples=2).__dict__  # the stored layout
    r = evaluate(None, s, tmp_path / "run", RunOptions(model=str(ckpt)))
    rec = json.loads((tmp_path / "run" / "ffidelity" / "training.json").read_text())
    assert rec["n_train"] == 9  # "the movie was good" is evaluated, so left out of the training data
    assert rec["n_held_out"] == 3
    df = r.summary
    for k in ("ffid_aopc_plus", "ffid_aopc_minus", "ffid_plus@0.5"):
        assert set(df[df.metric == k].method) == {"attention", "occlusion"}
    assert set(df[df.method == "ffidelity_model"].metric) == {"prob", "correct"}
    assert "## F-Fidelity: the fine-tuned copy" in (tmp_path / "run" / "summary.md").read_text()
    stamp = (tmp_path / "run" / "ffidelity" / "model.safetensors").stat().st_mtime_ns
    again = evaluate(None, s, tmp_path / "run", RunOptions(model=str(ckpt)))
    assert again.n_computed_chunks == 0
    assert (tmp_path / "run" / "ffidelity" / "model.safetensors").stat().st_mtime_ns == stamp  # not retrained
    assert files_hash(ckpt) == ckpt_hash  # the evaluated checkpoint is never written


def test_ffidelity_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    base = ["evaluate", "--data", "movies", "--out", str(out)]
    assert main([*base, "--model", "minilm-sentiment", "--ffidelity-train", "movies", "--ffidelity-beta", "0"]) == 2
    assert "--ffidelity-beta" in capsys.readouterr().err
    gpt2 = save_tiny("gpt2", tmp_path / "gpt2", seed=1)
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe movie was good,good\n")
    code = main(
        ["evaluate", "--data", str(data), "--out", str(out), "--model", str(gpt2), "--ffidelity-train", str(data)]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fine-tunes a text classifier" in err[-1]
    assert not out.exists()
