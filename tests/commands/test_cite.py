"""``streetlamp cite``: every method's source scores checked against independent code (direct Hugging Face
forwards, scikit-learn's Lasso, eager attention), the court against direct forwards, and every bad input
refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from streetlamp.cli import main
from streetlamp.commands.cite import METHODS
from streetlamp.methods import citation as C
from streetlamp.models.loading import load
from streetlamp.models.tiny import save_tiny

SOURCES = [
    "the movie was good",
    "mary went to the store",
    "paris is the capital of france",
    "john loved the plot but hated the acting",
    "berlin is the capital of germany",
    "the nurse said that she was very tired",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    t = tmp_path_factory.mktemp("cite")
    src = t / "s.jsonl"
    src.write_text("\n".join(json.dumps({"text": s}) for s in SOURCES) + "\n")
    return {"llama": save_tiny("llama", t / "llama", seed=1), "sources": src, "t": t}


@pytest.fixture(scope="module")
def adapter(setup: dict[str, Path]):  # noqa: ANN201
    return load(setup["llama"]).to("cpu")


def lay_of(adapter, sources=SOURCES, answer="paris") -> C.Layout:  # noqa: ANN001
    lay = C.layout(adapter, list(sources), "what is the capital of france")
    lay.answer = C.answer_ids(adapter, answer)
    return lay


def direct_logprob(adapter, ids: torch.Tensor, m: int) -> float:  # noqa: ANN001
    """The answer's log-probability from one plain Hugging Face forward (no cache, eager), in float64."""
    with torch.no_grad():
        lp = adapter.hf_model(ids[None]).logits[0].double().log_softmax(-1)
    n = len(ids)
    return sum(float(lp[n - m - 1 + j, ids[n - m + j]]) for j in range(m))


def test_methods_agree() -> None:
    assert METHODS == C.CITE_METHODS


def test_aggregate() -> None:
    t = np.array([5.0, 1, 2, 3, 4, 0.5, 9])
    spans = [(1, 4), (4, 6), (6, 7)]
    np.testing.assert_allclose(C.aggregate(t, spans), [6, 4.5, 9])
    np.testing.assert_allclose(C.aggregate(t, spans, top=2), [2.5, 2.25, 9])
    assert C.ranking(np.array([1.0, 3, 3, 0])).tolist() == [1, 2, 0, 3]


def test_leave_one_out_and_masks_against_direct_forwards(adapter) -> None:  # noqa: ANN001
    lay = lay_of(adapter, answer="paris is")  # two answer tokens: the sum of both log-probabilities
    m = len(lay.answer)
    assert m == 2
    score = C.AnswerScore(adapter, lay, batch_size=64)  # small budget: several cached blocks
    full = direct_logprob(adapter, lay.ids(), m)
    assert abs(score.full - full) < 1e-4
    loo = C.leave_one_out(score)
    for i in range(lay.n_sources):
        keep = np.ones(lay.n_sources, bool)
        keep[i] = False
        assert abs(loo[i] - (full - direct_logprob(adapter, lay.ids(keep), m))) < 1e-4
    rng = np.random.default_rng(3)
    masks = C.random_masks(rng, 12, lay.n_sources)
    got = score(masks)
    want = [direct_logprob(adapter, lay.ids(k), m) for k in masks]
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert score.scorer.n_positions < len(masks) * lay.n_tokens  # the cached prefixes were not recomputed


@pytest.mark.parametrize("alpha", [1e-4, 1e-3, 0.01])
def test_lasso_against_scikit_learn(alpha: float) -> None:
    from sklearn.linear_model import Lasso

    rng = np.random.default_rng(0)
    x = C.random_masks(rng, 40, 9).astype(np.float64)
    y = x @ (rng.normal(size=9) * (rng.random(9) < 0.5)) + 0.05 * rng.normal(size=40) - 3.0
    w, b = C.lasso(x, y, alpha)
    ref = Lasso(alpha=alpha, tol=1e-14, max_iter=1_000_000).fit(x, y)
    np.testing.assert_allclose(w, ref.coef_, atol=1e-7)
    assert abs(b - ref.intercept_) < 1e-7


def eager_rows(adapter, ids: torch.Tensor, rows: list[int]) -> np.ndarray:  # noqa: ANN001
    """``[layer, head, row, key]`` from Hugging Face's eager attention (output_attentions)."""
    with torch.no_grad():
        out = adapter.hf_model(ids[None], output_attentions=True)
    return np.stack([a[0, :, rows].double().numpy() for a in out.attentions])


def test_attntrace_against_eager_attention(adapter, tmp_path: Path) -> None:  # noqa: ANN001
    lay = lay_of(adapter)
    rows = list(range(lay.answer_start, lay.n_tokens))
    att = eager_rows(adapter, lay.ids(), rows)
    got, _ = C.attention_rows(adapter, lay.ids(), rows, tmp_path / "r")
    np.testing.assert_allclose(got, att, atol=1e-6)
    # AttnTrace without subsampling: mean over layers, heads, answer rows; the mean of each source's top 2
    mean = att.mean((0, 1, 2))
    want = [np.sort(mean[s:e])[-2:].mean() for s, e in lay.spans]
    np.testing.assert_allclose(C.attntrace(adapter, lay, tmp_path, 0, 0.4, 2, 0, got), want, atol=1e-6)
    # with subsampling: each subset's own pass, averaged over the subsets that held the source
    rng = np.random.default_rng(7)
    total, count = np.zeros(lay.n_sources), np.zeros(lay.n_sources)
    for _ in range(3):
        idx = np.sort(rng.permutation(lay.n_sources)[: int(lay.n_sources * 0.5)])
        sub = C.Layout(lay.head, [lay.sources[i] for i in idx], lay.tail, lay.answer)
        a = eager_rows(adapter, sub.ids(), list(range(sub.answer_start, sub.n_tokens))).mean((0, 1, 2))
        for k, (s, e) in zip(idx, sub.spans):
            total[k] += np.sort(a[s:e])[-2:].mean()
            count[k] += 1
    want = np.where(count > 0, total / np.maximum(count, 1), 0)
    np.testing.assert_allclose(C.attntrace(adapter, lay, tmp_path, 3, 0.5, 2, 7, None), want, atol=1e-6)
    # the sink set aside: every row renormalised over keys 1.. before the mean
    nosink = (att[..., 1:] / (1 - att[..., :1])).mean((0, 1, 2))
    np.testing.assert_allclose(C.mean_rows(got, sink=False)[1:], nosink, atol=1e-6)


def run(setup: dict[str, Path], out: Path, *extra: str) -> int:
    return main(
        ["cite", "--model", str(setup["llama"]), "--context", str(setup["sources"]), "--out", str(out)]
        + ["--question", "what is the capital of france", "--ablations", "8", "--held-out", "4"]
        + ["--attntrace-samples", "2", "--ig-steps", "4", *extra]
    )


def test_run_folder_and_court(setup: dict[str, Path], adapter, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "run"
    assert run(setup, out, "--answer", "paris") == 0
    printed = capsys.readouterr().out
    assert "forced" in printed  # the random tiny model does not answer paris
    m = json.loads((out / "manifest.json").read_text())
    assert m["answer"]["forced"] and m["methods"] == list(METHODS)
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores.method) == set(METHODS) and len(scores) == len(METHODS) * len(SOURCES)
    court = pd.read_csv(out / "court.csv")
    cost = pd.read_csv(out / "cost.csv")
    assert set(cost.method) >= set(METHODS) and (cost.seconds > 0).all()
    assert cost.set_index("method").loc["gradient_x_input", "passes_with_gradient"] >= 1
    lay = lay_of(adapter)
    full = direct_logprob(adapter, lay.ids(), 1)
    assert abs(m["answer"]["logprob"] - full) < 1e-4
    for _, r in court[court.method == "leave_one_out"].iterrows():
        top = [int(x) for x in str(r.top_sources).split()]
        keep = np.ones(len(SOURCES), bool)
        keep[top] = False
        assert abs(r.logprob_without_top_k - direct_logprob(adapter, lay.ids(keep), 1)) < 1e-4
        assert abs(r.logprob_only_top_k - direct_logprob(adapter, lay.ids(~keep), 1)) < 1e-4
        loo = scores[scores.method == "leave_one_out"].sort_values("rank")
        assert top == loo.source.tolist()[: r.k]
    assert set(court.k) == {1, 3, 5}


def test_court_sizes(setup: dict[str, Path], adapter, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """``--court 2``: only k = 2, equal to direct forwards; ``--court none``: no court rows (the header kept), no
    court forwards counted; a bad size: one line, exit 2, no folder."""
    base = ["cite", "--model", str(setup["llama"]), "--context", str(setup["sources"])]
    base += ["--question", "what is the capital of france", "--answer", "paris", "--methods", "leave_one_out"]
    two = tmp_path / "two"
    assert main([*base, "--court", "2", "--out", str(two)]) == 0
    court = pd.read_csv(two / "court.csv")
    assert court.k.tolist() == [2]
    r = court.iloc[0]
    keep = np.ones(len(SOURCES), bool)
    keep[[int(x) for x in str(r.top_sources).split()]] = False
    assert abs(r.logprob_without_top_k - direct_logprob(adapter, lay_of(adapter).ids(keep), 1)) < 1e-4
    none = tmp_path / "none"
    assert main([*base, "--court", "none", "--out", str(none)]) == 0
    empty = pd.read_csv(none / "court.csv")
    assert len(empty) == 0 and "drop_without_top_k" in empty.columns
    assert "court (k=1)" not in capsys.readouterr().out
    bad = tmp_path / "bad"
    for spec in ("0", "one"):
        assert main([*base, "--court", spec, "--out", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "--court" in err and len(err.strip().splitlines()) == 1 and not bad.exists()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "no sources"),
        ('{"text": "the movie"}\n{"text": oops}\n', "line 2: not valid JSON"),
        ('{"text": "the movie"}\n{"title": "x"}\n', "line 2: a source is"),
    ],
)
def test_bad_sources(setup: dict[str, Path], tmp_path: Path, capsys, content: str, why: str) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    out = tmp_path / "run"
    code = main(["cite", "--model", str(setup["llama"]), "--context", str(bad), "--question", "q", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_window(setup: dict[str, Path], tmp_path: Path, capsys) -> None:  # noqa: ANN001
    long = tmp_path / "long.txt"
    long.write_text(" ".join(f"{s}." for s in SOURCES * 3))  # 18 sentences: over the tiny model's 64 positions
    out = tmp_path / "run"
    argv = ["cite", "--model", str(setup["llama"]), "--context", str(long), "--question", "what is good"]
    argv += ["--answer", "paris", "--out", str(out), "--methods", "leave_one_out"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "over" not in err or "--truncate" in err
    assert "--truncate" in err and not out.exists()
    assert main([*argv, "--truncate"]) == 0
    printed = capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert m["sources"]["cut"] and "dropped sources" in printed
    assert m["n_tokens"] <= 64 and m["sources"]["n"] + len(m["sources"]["cut"]) == 18
    # cite-bench never truncates: a question over the window is skipped, its reason recorded, and counted apart
    rows = [{"sources": SOURCES * 3, "question": "what is good", "answer": "paris", "planted": [0], "kind": "long"}]
    rows.append(
        {"sources": SOURCES[:2], "question": "what is good", "answer": "zzz never", "planted": [0], "kind": "short"}
    )
    data = tmp_path / "b.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    bench = tmp_path / "bench"
    argv = ["cite-bench", "--model", str(setup["llama"]), "--data", str(data), "--out", str(bench)]
    assert main([*argv, "--methods", "leave_one_out"]) == 0
    assert "2 questions, 0 answered correctly (only those count), 1 skipped" in capsys.readouterr().out
    recs = [json.loads(x) for p in sorted((bench / "records").glob("*.jsonl")) for x in p.read_text().splitlines()]
    assert "takes at most 64" in recs[0]["skipped"] and "skipped" not in recs[1]
    # with --truncate the long question keeps the sources that fit (its planted source 0 among them)
    assert main([*argv[:-1], str(tmp_path / "bench-cut"), "--methods", "leave_one_out", "--truncate"]) == 0
    assert "0 skipped" in capsys.readouterr().out
    recs = [
        json.loads(x)
        for p in sorted((tmp_path / "bench-cut" / "records").glob("*.jsonl"))
        for x in p.read_text().splitlines()
    ]
    assert recs[0]["cut"] and recs[0]["n_sources"] + len(recs[0]["cut"]) == 18


def test_planted_benchmark_generator() -> None:
    from streetlamp.data.citebench import KINDS, generate

    qs = generate(10, words=60, seed=3)
    assert [q.kind for q in qs] == [KINDS[i % len(KINDS)] for i in range(10)]
    for q in qs:
        planted = [q.sources[i] for i in q.planted]
        assert len(q.planted) == (2 if q.kind in ("combined", "twice") else 1)
        if q.kind == "injection":
            assert "Ignore the question" in planted[0] and q.answer == "banana"
        else:
            assert any(q.answer in p for p in planted)
            assert sum(q.answer in s for s in q.sources) == (2 if q.kind == "twice" else 1)
        assert sum(len(s.split()) for s in q.sources) >= 60
    assert [q.sources for q in generate(10, words=60, seed=3)] == [q.sources for q in qs]


def test_planted_passages() -> None:
    from streetlamp.data.citebench import KINDS, generate

    qs = generate(10, words=400, seed=3, passage_words=60)
    assert [q.kind for q in qs] == [KINDS[i % len(KINDS)] for i in range(10)]
    for q in qs:
        assert 5 <= len(q.sources) <= 9  # about 400 / 60 passages
        plant = "Ignore the question" if q.kind == "injection" else q.answer
        holding = [i for i, s in enumerate(q.sources) if plant in s]
        if q.kind == "combined":  # the town's sentence holds the word, the other one names the town
            town = next(
                w
                for w in q.sources[holding[0]].split()
                if w.rstrip(".") in ("Tarsk", "Velmoor", "Quenby", "Ardith", "Holloway", "Brisca")
            )
            holding = sorted({*holding, *(i for i, s in enumerate(q.sources) if f"lives in {town}" in s)})
        assert holding == q.planted and len(q.planted) == (2 if q.kind in ("combined", "twice") else 1)
        assert all(len(q.sources[i].split()) > 20 for i in q.planted)  # inside a distractor passage
        if q.kind in ("contradicted", "injection"):  # the near miss sits in another passage
            near = "The code word of" if q.kind == "injection" else "The code word of"
            assert sum(near in s for s in q.sources) == 2 - (q.kind == "injection")
    assert [q.sources for q in generate(10, words=400, seed=3, passage_words=60)] == [q.sources for q in qs]
    assert [q.sources for q in generate(3, words=60, seed=3)] == [
        q.sources for q in generate(3, words=60, seed=3, passage_words=0)
    ]


def test_bench_resumes_and_counts_only_correct_answers(setup: dict[str, Path], tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from streetlamp.commands.cite.run import judge

    h = judge({"m": np.array([0.1, 0.9, 0.5, 0.05])}, [2, 3])["m"]
    assert h == {"top1_hit": 0.0, "top1_recall": 0.0, "top3_hit": 1.0, "top3_recall": 0.5}
    # a tiny model answers what it answers: make a benchmark whose expected answers are its own greedy ones
    from streetlamp.methods import citation as C

    ad = load(setup["llama"]).to("cpu")
    rows = []
    for i, q in enumerate(["what is good", "who went to the store", "what is the capital of france"]):
        lay = C.layout(ad, SOURCES[:4], q)
        greedy = ad.tokenizer.decode(C.generate_answer(ad, lay, 1)).strip() if i < 2 else "zzz never"
        rows.append({"sources": SOURCES[:4], "question": q, "answer": greedy, "planted": [i], "kind": f"k{i}"})
    data = tmp_path / "b.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    argv = ["cite-bench", "--model", str(setup["llama"]), "--data", str(data), "--out", str(out), "--chunk-size", "2"]
    argv += ["--methods", "attention,leave_one_out", "--max-answer-tokens", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "3 questions, 2 answered correctly" in printed
    t = pd.read_csv(out / "recall.csv")
    loo = t[(t.method == "leave_one_out") & (t.metric == "top1_hit") & (t.kind == "all")].iloc[0]
    assert loo.n == 2
    recs = [json.loads(x) for p in sorted((out / "records").glob("*.jsonl")) for x in p.read_text().splitlines()]
    want = np.mean(
        [float(C.ranking(np.array(r["scores"]["leave_one_out"]))[0] in r["planted"]) for r in recs if r["correct"]]
    )
    assert abs(loo["mean"] - want) < 1e-12
    before = sorted(p.stat().st_mtime_ns for p in (out / "metrics").glob("*.parquet"))
    assert main(argv) == 0  # resumed: every chunk done, nothing recomputed
    assert sorted(p.stat().st_mtime_ns for p in (out / "metrics").glob("*.parquet")) == before
    assert main([*argv[:-2], "--max-answer-tokens", "3"]) == 2  # other settings: refused


def test_greedy_answer_is_the_generated_one(adapter) -> None:  # noqa: ANN001
    """The fused, gradient-free generation gives the plain (default attention) generation's tokens."""
    from streetlamp.commands.cite.run import greedy_answer

    for q in ("what is the capital of france", "who went to the store", "what is good"):
        lay = C.layout(adapter, SOURCES, q)
        assert greedy_answer(adapter, lay, 4) == C.generate_answer(adapter, lay, 4)
