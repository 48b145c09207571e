"""``cite``: one question over a context of sources; every method's source scores, the court, the cost."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...data.sources import read_sources
from ...errors import StreetlampError
from ...methods import citation as C
from ...models.adapter import Inputs, ModelAdapter
from ...models.chunked import QKStore, fused_long
from ..base import Lines

Row = tuple[str, str, str, float]


@dataclass
class Cited:
    """One question's attribution: the layout, the answer and its log-probability, each method's source
    scores (and token scores where it has them), its cost, the court's rows and ContextCite's surrogate."""

    sources: list[str]
    lay: C.Layout
    cut: list[int]
    answer: str
    generated: bool
    logprob: float
    token_logprobs: list[float]
    greedy: list[int]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    costs: dict[str, C.Cost] = field(default_factory=dict)
    court: list[dict[str, Any]] = field(default_factory=list)
    cc: C.ContextCite | None = None
    lds_cost: C.Cost | None = None

    @property
    def forced(self) -> bool:
        """The answer is not the model's greedy continuation (some token is not its argmax)."""
        return self.greedy != self.lay.answer


def greedy_answer(adapter: ModelAdapter, lay: C.Layout, max_tokens: int) -> list[int]:
    """The model's greedy answer (:func:`~streetlamp.methods.citation.generate_answer`) with the fused kernel
    and no gradient: the default attention keeps every ``[head, query, key]`` weight of a layer (2.4 GB a
    layer at 8k tokens on SmolLM2), which a generated answer never reads."""
    with torch.no_grad(), fused_long(adapter):
        return C.generate_answer(adapter, lay, max_tokens)


def _answer_check(adapter: ModelAdapter, lay: C.Layout) -> tuple[list[float], list[int]]:
    """Each answer token's log-probability and the model's argmax at each answer position (one pass)."""
    m = len(lay.answer)
    with torch.no_grad(), fused_long(adapter):
        logits, _ = adapter.prefix_forward(Inputs.from_ids(adapter, [lay.ids()], strings=False), tail=m + 1)
    logp = torch.log_softmax(logits[0, :-1].double(), -1)
    idx = torch.tensor(lay.answer)
    return logp[torch.arange(m), idx].tolist(), logp.argmax(-1).tolist()


def cite(
    adapter: ModelAdapter,
    sources: list[str],
    question: str,
    answer: str | None,
    s: Any,
    scratch: Path,
    prefix: str = "",
) -> Cited:
    """Every method of ``s.methods`` on one question (``scratch``: a folder inside the run's staging folder
    for the attention recordings; emptied before returning)."""
    lay = C.layout(adapter, sources, question, prefix=prefix)
    if answer is not None:
        lay.answer = C.answer_ids(adapter, answer)
    lay, cut = C.fit_window(adapter, lay, s.truncate, s.max_answer_tokens)
    generated = answer is None
    if generated:
        lay.answer = greedy_answer(adapter, lay, s.max_answer_tokens)
    lps, greedy = _answer_check(adapter, lay)
    res = Cited(
        sources[: lay.n_sources],
        lay,
        cut,
        str(adapter.tokenizer.decode(lay.answer)).strip(),
        generated,
        float(sum(lps)),
        lps,
        greedy,
    )
    methods = list(s.methods)
    score = C.AnswerScore(adapter, lay, s.batch_size)
    spans = lay.spans
    rows = list(range(lay.answer_start, lay.n_tokens))
    recorded = [m for m in ("attention", "attention_nosink", "rollout") if m in methods]
    if "attntrace" in methods and s.attntrace_samples == 0:
        recorded.append("attntrace")
    try:
        if recorded:
            folder = scratch / "recording"
            with C.counting(adapter) as rec_cost:
                att, rec = C.attention_rows(adapter, lay.ids(), rows, folder, keep_qk="rollout" in methods)
            mean = C.mean_rows(att)
            if "attention" in methods:
                res.tokens["attention"], res.scores["attention"] = mean, C.aggregate(mean, spans)
                res.costs["attention"] = rec_cost
            if "attention_nosink" in methods:
                t = C.mean_rows(att, sink=False)
                res.tokens["attention_nosink"], res.scores["attention_nosink"] = t, C.aggregate(t, spans)
                res.costs["attention_nosink"] = rec_cost
            if "attntrace" in methods and s.attntrace_samples == 0:
                res.scores["attntrace"] = C.aggregate(mean, spans, s.attntrace_top)
                res.costs["attntrace"] = rec_cost
            if "rollout" in methods:
                with C.counting(adapter) as c:
                    t = C.rollout_tokens(adapter, lay, QKStore(folder, rec.describe(), adapter.device))
                c.seconds += rec_cost.seconds
                c.forward_passes += rec_cost.forward_passes
                res.tokens["rollout"], res.scores["rollout"], res.costs["rollout"] = t, C.aggregate(t, spans), c
            shutil.rmtree(folder, ignore_errors=True)
        if "attntrace" in methods and s.attntrace_samples > 0:
            with C.counting(adapter) as c:
                res.scores["attntrace"] = C.attntrace(
                    adapter, lay, scratch, s.attntrace_samples, s.attntrace_fraction, s.attntrace_top, s.seed, None
                )
            res.costs["attntrace"] = c
        for name in ("gradient_x_input", "integrated_gradients", "attnlrp"):
            if name in methods:
                params = {"steps": s.ig_steps, "adaptive": False} if name == "integrated_gradients" else {}
                with C.counting(adapter) as c:
                    t = C.gradient_tokens(adapter, name, lay, params, s.batch_size, s.seed)
                res.tokens[name], res.scores[name], res.costs[name] = t, C.aggregate(t, spans), c
        if "contextcite" in methods:
            rng = np.random.default_rng(s.seed)
            masks = C.random_masks(rng, s.ablations, lay.n_sources)
            held = C.random_masks(rng, s.held_out, lay.n_sources)
            score.forget()
            with C.counting(adapter) as c:
                vals = score(masks)
                w, b = C.lasso(masks.astype(np.float64), vals, s.alpha)
            c.ablation_rows = len({m.tobytes() for m in masks})
            res.costs["contextcite"], res.scores["contextcite"] = c, w
            with C.counting(adapter) as c2:
                hv = score(held) if s.held_out else np.zeros(0)
            res.lds_cost = c2
            pred = b + held.astype(np.float64) @ w
            res.cc = C.ContextCite(masks, vals, w, b, held, hv, C.lds(pred, hv) if s.held_out else float("nan"))
        if "leave_one_out" in methods:
            score.forget()
            with C.counting(adapter) as c:
                res.scores["leave_one_out"] = C.leave_one_out(score)
            c.ablation_rows = lay.n_sources
            res.costs["leave_one_out"] = c
        res.scores = {m: res.scores[m] for m in methods}  # the methods' order, whichever ran first
        score.forget()
        res.court = C.court(score, res.scores, tuple(s.court))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return res


# -- tables --------------------------------------------------------------------------------------------------
def sources_table(res: Cited) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "source": range(res.lay.n_sources),
            "text": res.sources,
            "n_tokens": [len(x) for x in res.lay.sources],
            "first_token": [a for a, _ in res.lay.spans],
            "end_token": [b for _, b in res.lay.spans],
        }
    )


def scores_table(res: Cited) -> pd.DataFrame:
    """Long format: one row per method x source, with the source's rank under the method (1 = top)."""
    out = []
    for name, sc in res.scores.items():
        rank = np.empty(len(sc), dtype=np.int64)
        rank[C.ranking(sc)] = np.arange(1, len(sc) + 1)
        out += [{"method": name, "source": i, "score": float(v), "rank": int(rank[i])} for i, v in enumerate(sc)]
    return pd.DataFrame(out, columns=["method", "source", "score", "rank"])


def cost_table(res: Cited) -> pd.DataFrame:
    rows = [{"method": k, **vars(v)} for k, v in res.costs.items()]
    if res.lds_cost is not None:
        rows.append({"method": "contextcite_lds_held_out", **vars(res.lds_cost)})
    return pd.DataFrame(rows, columns=["method", "forward_passes", "passes_with_gradient", "ablation_rows", "seconds"])


TABLE_MEANING = {
    "sources.csv": "the sources in context order: text, token count, [first_token, end_token) in the full text",
    "scores.csv": "each method's score of each source (higher: more credited) and its rank (1 = top; ties: earlier first)",
    "court.csv": "per method and k: the answer's log-probability with its top-k sources removed and with only them "
    "kept, and each one's drop from the log-probability with every source",
    "cost.csv": "per method: base-model forward passes (those with autograd on counted apart), ablated rows "
    "evaluated, wall seconds (rollout includes the recording pass it reads)",
}


def run_cite(adapter: ModelAdapter, s: Any, out: Any, options: Any) -> Lines:
    sources = read_sources(s.context, s.split)
    with out.staging() as w:
        res = cite(adapter, sources, s.question, s.answer, s, w.path / ".scratch")
        tables = {
            "sources.csv": sources_table(res),
            "scores.csv": scores_table(res),
            "court.csv": pd.DataFrame(res.court, columns=C.COURT_COLUMNS),
            "cost.csv": cost_table(res),
        }
        for name, df in tables.items():
            df.to_csv(w.path / name, index=False)
        names = list(res.scores)
        w.add_array(
            "scores",
            np.array([res.scores[m] for m in names], np.float64).reshape(len(names), res.lay.n_sources),
            axes=["method", "source"],
            meaning="each method's source scores (methods in manifest['methods'] order)",
        )
        for name, t in res.tokens.items():
            w.add_array(
                f"tokens.{name}",
                t.astype(np.float32),
                axes=["token"],
                meaning=f"{name}'s token scores over the full text (summed over answer tokens) before aggregation",
            )
        if res.cc is not None:
            w.add_array(
                "contextcite.masks",
                res.cc.masks.astype(np.uint8),
                axes=["ablation", "source"],
                meaning="1 = source kept",
            )
            w.add_array(
                "contextcite.logprob",
                res.cc.values,
                axes=["ablation"],
                meaning="the answer's log-probability under each mask",
            )
            w.add_array(
                "contextcite.held_masks",
                res.cc.held_masks.astype(np.uint8),
                axes=["held_out", "source"],
                meaning="held-out masks (1 = kept)",
            )
            w.add_array(
                "contextcite.held_logprob",
                res.cc.held_values,
                axes=["held_out"],
                meaning="the answer's log-probability under each held-out mask",
            )
        tokens = adapter.tokenizer.convert_ids_to_tokens(res.lay.ids().tolist())
        w.write_manifest(
            {
                "model": adapter.describe(),
                "question": s.question,
                "answer": {
                    "text": res.answer,
                    "generated": res.generated,
                    "forced": res.forced,
                    "tokens": adapter.tokenizer.convert_ids_to_tokens(res.lay.answer),
                    "logprob": res.logprob,
                    "token_logprobs": res.token_logprobs,
                    "greedy": adapter.tokenizer.convert_ids_to_tokens(res.greedy),
                },
                "sources": {
                    "file": str(s.context),
                    "split": s.split if not str(s.context).endswith(".jsonl") else "jsonl",
                    "n": res.lay.n_sources,
                    "cut": res.cut,
                    "cut_note": f"--truncate dropped sources {res.cut} (from the end) to fit the model's window"
                    if res.cut
                    else None,
                    "spans": res.lay.spans,
                },
                "n_tokens": res.lay.n_tokens,
                "tokens": [adapter.token_label(t) for t in tokens],
                "template": {"head": C.HEAD, "tail": C.TAIL, "source": "{text}\\n, each tokenised alone"},
                "methods": names,
                "contextcite": None
                if res.cc is None
                else {
                    "lds": res.cc.lds,
                    "intercept": res.cc.intercept,
                    "ablations": s.ablations,
                    "held_out": s.held_out,
                    "alpha": s.alpha,
                },
                "parameters": {k: v for k, v in s.to_dict().items() if k not in ("context", "question", "answer")},
                "files": TABLE_MEANING,
                "seed": s.seed,
            }
        )
    return Lines(lines(res), out.out)


def lines(res: Cited) -> list[str]:
    how = (
        "generated"
        if res.generated
        else ("forced: not the model's greedy answer" if res.forced else "given; the model's greedy answer")
    )
    out = [f"answer {res.answer!r} ({how}), log-probability {res.logprob:.3f}"]
    if res.cut:
        out.append(f"--truncate: dropped sources {res.cut[0]}..{res.cut[-1]} ({len(res.cut)}) to fit the window")
    names = list(res.scores)
    out.append("source  " + "  ".join(f"{m[:12]:>12}" for m in names) + "  text")
    for i, text in enumerate(res.sources):
        vals = "  ".join(f"{res.scores[m][i]:12.4g}" for m in names)
        out.append(f"{i:6d}  {vals}  {text[:50]}")
    top1 = [r for r in res.court if r["k"] == 1]
    if top1:
        out.append("court (k=1): drop without the top source / drop keeping only it")
        out += [f"  {r['method']:>22}  {r['drop_without_top_k']:8.3f}  {r['drop_only_top_k']:8.3f}" for r in top1]
    if res.cc is not None:
        out.append(f"ContextCite LDS on {len(res.cc.held_values)} held-out masks: {res.cc.lds:.3f}")
    return out


# -- cite-bench ------------------------------------------------------------------------------------------------
def normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def answered(adapter: ModelAdapter, lay: C.Layout, expected: str) -> tuple[bool, str]:
    """Whether the model's greedy answer starts with the expected one (case and punctuation aside)."""
    n = len(C.answer_ids(adapter, expected)) + 2
    try:
        got = str(adapter.tokenizer.decode(greedy_answer(adapter, lay, n))).strip()
    except StreetlampError:
        return False, ""
    g, e = normal(got), normal(expected)
    return g == e or g.startswith(e + " "), got


def judge(
    scores: dict[str, np.ndarray], planted: list[int], ks: tuple[int, ...] = (1, 3)
) -> dict[str, dict[str, float]]:
    """Per method: ``top{k}_hit`` (a planted source among the top k) and ``top{k}_recall`` (the fraction of
    the planted sources among the top k)."""
    out: dict[str, dict[str, float]] = {}
    for m, s in scores.items():
        order = C.ranking(s).tolist()
        out[m] = {}
        for k in ks:
            top = set(order[:k])
            out[m][f"top{k}_hit"] = float(any(p in top for p in planted))
            out[m][f"top{k}_recall"] = len(top & set(planted)) / len(planted)
    return out


def bench_question(adapter: ModelAdapter, q: Any, s: Any, scratch: Path) -> tuple[dict[str, Any], list[Row]]:
    """One question of the benchmark: its JSON record and its metric rows (the model's answer checked first;
    the methods run only when it is the expected one)."""
    prefix = str(q.extra.get("answer_prefix", ""))
    lay = C.layout(adapter, q.sources, q.question, prefix=prefix)
    try:
        lay, cut = C.fit_window(adapter, lay, s.truncate, s.max_answer_tokens)
        if set(cut) & set(q.planted):
            raise StreetlampError(f"--truncate dropped sources {cut[0]}..{cut[-1]}, a planted one among them")
    except StreetlampError as e:
        return {"id": q.id, "kind": q.kind, "skipped": str(e)}, [(q.id, "-", "skipped", 1.0)]
    ok, got = answered(adapter, lay, q.answer)
    rec: dict[str, Any] = {"id": q.id, "kind": q.kind, "answer": q.answer, "greedy": got, "correct": ok}
    rec.update({"planted": q.planted, "n_sources": lay.n_sources, "n_tokens": lay.n_tokens + 2, "cut": cut})
    rows: list[Row] = [(q.id, "-", "correct", float(ok))]
    if ok:
        res = cite(adapter, q.sources, q.question, q.answer, s, scratch, prefix)
        rec["n_tokens"] = res.lay.n_tokens
        for m, d in judge(res.scores, q.planted).items():
            rows += [(q.id, m, k, v) for k, v in d.items()]
        for r in res.court:
            rows += [(q.id, r["method"], f"drop_without_top{r['k']}", r["drop_without_top_k"])]
            rows += [(q.id, r["method"], f"drop_only_top{r['k']}", r["drop_only_top_k"])]
        for m, cost in res.costs.items():
            rows += [(q.id, m, "seconds", cost.seconds), (q.id, m, "forward_passes", cost.forward_passes)]
        if res.cc is not None:
            rows.append((q.id, "contextcite", "lds", res.cc.lds))
        rec["scores"] = {m: v.tolist() for m, v in res.scores.items()}
    return rec, rows


def bench_chunk(
    adapter: ModelAdapter, chunk: list[Any], s: Any, scratch: Path | None = None
) -> tuple[list[dict[str, Any]], list[Row]]:
    """A chunk of questions: their records and metric rows. The local engine and each Ray actor run this
    (``scratch``: where attention recordings go; None: a temporary folder of the machine that runs it)."""
    import tempfile

    own = scratch is None
    where = Path(tempfile.mkdtemp(prefix="streetlamp-cite-")) if scratch is None else scratch
    records, rows = [], []
    try:
        for q in chunk:
            rec, r = bench_question(adapter, q, s, where / "q")
            records.append(rec)
            rows += r
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)
    return records, rows


# what the store's settings leave out: how the run is computed, not what (a run resumes on either engine)
NOT_STORED = ("limit", "chunk_size", "engine", "ray_address", "workers")


def run_bench(adapter: ModelAdapter, s: Any, out: Path, options: Any) -> Lines:
    from ...data.citebench import generate
    from ...data.sources import read_questions
    from ...progress import bar
    from ...store.run_store import RunStore

    model = options.model if options is not None and isinstance(options.model, (str, Path)) else None
    if s.engine == "ray":
        from ...extras import require

        require("ray")
        if model is None:
            raise StreetlampError("--engine ray loads the model by name on each actor: give --model NAME")
        if options.dtype != "float32" or options.device_map is not None:
            raise StreetlampError(
                "--engine ray loads a float32 model on each actor: --dtype and --device-map need --engine local"
            )
        from ..ray_engine import connect

        connect(s.ray_address, s.workers)  # before the run folder exists: an unreachable cluster is one line
    qs = (
        generate(s.questions, s.words, s.seed, passage_words=s.passage_words)
        if s.data == "planted"
        else read_questions(s.data)
    )
    qs = qs[: s.limit] if s.limit else qs
    settings = {k: v for k, v in s.to_dict().items() if k not in NOT_STORED}
    store = RunStore.open(
        out,
        {"settings": settings, "model": adapter.name},
        {"n_questions": len(qs)},
        command="cite-bench",
        added={"settings.passage_words": 0},  # a store made before passages: one sentence per source
    )
    scratch = out / ".scratch"
    chunks = {c: qs[lo : lo + s.chunk_size] for c, lo in enumerate(range(0, len(qs), s.chunk_size))}
    done = store.done_chunks()
    todo = {c: ch for c, ch in chunks.items() if c not in done}

    def write(c: int, result: tuple[list[dict[str, Any]], list[Row]]) -> None:
        store.write_records(c, result[0])
        store.write_chunk(c, result[1], {})

    with bar(len(qs), "cite-bench", initial=len(qs) - sum(len(ch) for ch in todo.values())) as b:
        if s.engine == "ray" and todo:
            from ..ray_engine import run_on_ray

            device = options.device if options is not None else "cpu"
            run_on_ray(str(model), device, s, todo, store, b, s.ray_address, s.workers, work=bench_chunk, write=write)
        else:
            for c, ch in todo.items():
                write(c, bench_chunk(adapter, ch, s, scratch))
                b.update(len(ch))
    shutil.rmtree(scratch, ignore_errors=True)
    table, summary = recall_table(store.metrics(), store.records())
    table.to_csv(out / "recall.csv", index=False)
    store.update_manifest({"summary": summary, "files": {"recall.csv": RECALL_MEANING}})
    lines = [
        f"cite-bench: {summary['n_questions']} questions, {summary['n_correct']} answered correctly "
        f"(only those count), {summary['n_skipped']} skipped"
    ]
    overall = table[table.kind == "all"]
    for _, r in overall.iterrows():
        lines.append(
            f"  {r.method:>22} {r.metric:>12}: {r['mean']:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] (n={int(r.n)})"
        )
    lines.append(f"recall table: {out / 'recall.csv'}")
    return Lines(lines, out)


RECALL_MEANING = (
    "per method, plant kind (all: every kind) and metric: the mean over correctly answered questions of top1_hit "
    "(the method's top source is a planted one), top3_hit, top1_recall/top3_recall (fraction of the planted "
    "sources in the method's top 1/3), drop_without_topK/drop_only_topK (the court, nats), seconds; "
    "ci_low/ci_high: 95% percentile bootstrap over questions (stats.bootstrap_ci), n: questions"
)


def recall_table(metrics: pd.DataFrame, records: list[dict]) -> tuple[pd.DataFrame, dict[str, Any]]:
    from ...stats import bootstrap_ci

    kind = {r["id"]: r["kind"] for r in records}
    correct = metrics[metrics.metric == "correct"]
    summary = {
        "n_questions": len(records),
        "n_correct": int(correct.value.sum()),
        "n_skipped": int((metrics.metric == "skipped").sum()),
        "correct_by_kind": {
            k: f"{int(correct[correct.example_id.map(kind) == k].value.sum())}/{int((correct.example_id.map(kind) == k).sum())}"
            for k in sorted(set(kind.values()))
        },
    }
    m = metrics[(metrics.method != "-")].copy()
    m["kind"] = m.example_id.map(kind)
    out = []
    for (meth, met), g in m.groupby(["method", "metric"], sort=False):
        for k, gg in [("all", g), *g.groupby("kind")]:
            mean, lo, hi, n = bootstrap_ci(gg.value.to_numpy())
            out.append({"method": meth, "metric": met, "kind": k, "mean": mean, "ci_low": lo, "ci_high": hi, "n": n})
    return pd.DataFrame(out, columns=["method", "metric", "kind", "mean", "ci_low", "ci_high", "n"]), summary
