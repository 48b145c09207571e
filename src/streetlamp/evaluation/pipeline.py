"""Everything measured for one chunk of examples: a pure function of (model, examples, settings),
so the local and the Ray engine produce the same rows.

Rows are ``(example_id, method, metric, value)``; ``method`` is a registered method, a decision-flip
ranking (``attention_items``, ``gradient_items``, ``attention_x_gradient_items``, ``random``), a pair
``a|b`` (agreement), ``counterfactual_attention``, ``uniform_attention`` or ``model``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ..methods.registry import get_method
from ..methods.removal import Removal
from ..models.adapter import Forward, Inputs, ModelAdapter, Target
from ..stats import total_variation
from ..store.files import TOKEN_LABELS, labels_array
from .agreement import pairwise_taus
from .common import ChunkTables, Rows, evaluate_params, output_prob_of
from .counterfactual import Counterfactual
from .erasure import ErasurePlan
from .flip import attention_item_scores, decision_flip, flip_layers
from .frozen import FrozenRecords
from .plausibility import plausibility, rationale_mask
from .settings import EvalSettings

__all__ = ["ChunkExample", "EvalSettings", "evaluate_chunk"]

FLIP_NAMES = {
    "attention": "attention_items",
    "gradient": "gradient_items",
    "attention_x_gradient": "attention_x_gradient_items",
}


@dataclass
class ChunkExample:
    index: int  # position in the dataset (seeds derive from it, not from the chunk)
    id: str
    ids: list[int]  # token ids, special tokens included
    text: str
    gold: int
    rationale: tuple[tuple[int, int], ...] | None = None
    truncated: bool = False


TOP_K = 20


def distribution(name: str, p: np.ndarray) -> dict[str, np.ndarray]:
    """A class distribution is stored whole; a vocabulary (causal LM) as its top 20 ids and probs."""
    if p.shape[-1] <= 1000:
        return {name: p.astype(np.float32)}
    top = np.argsort(-p, kind="stable")[:TOP_K]
    return {f"{name}.top_ids": top.astype(np.int64), f"{name}.top": p[top].astype(np.float32)}


def pattern_site(layer: int) -> str:
    return f"layers.{layer}.attn.pattern"


def reference_pass(
    adapter: ModelAdapter, inputs: Inputs, sites: list[str], records: FrozenRecords, below: int
) -> tuple[Forward, np.ndarray]:
    """The one forward pass of the unchanged texts (one padded batch) that several metrics read: the output
    distributions ``[texts, n_outputs]`` float64 (from its logits), the attention ``sites`` kept in the graph
    (the decision flip's item gradients; the counterfactuals' starting pattern) and, into ``records``, the
    outputs of the layers below ``below`` that the edited rows replay (frozen.py)."""
    with records.capture(adapter, inputs, below):
        fwd = adapter.forward(inputs, record=sites, keep_grad=True, grad=True)
    return fwd, torch.softmax(fwd.logits.detach().double(), -1).cpu().numpy()


def evaluate_chunk(
    adapter: ModelAdapter, examples: list[ChunkExample], s: EvalSettings, tuned: ModelAdapter | None = None
) -> tuple[Rows, dict[str, dict[str, np.ndarray]]]:
    """``tuned``: the F-Fidelity fine-tuned copy (evaluation/ffidelity.py), when ``s.ffidelity`` asks for it."""
    tables = ChunkTables([e.id for e in examples])
    if not examples:
        return tables.out()
    add, arrays = tables.add, tables.arrays
    budget = s.batch_size
    ids = [e.ids for e in examples]
    # the runner tokenised each text once; every step below reads these ids
    inputs = Inputs.from_ids(adapter, ids, [e.text for e in examples], [e.truncated for e in examples])
    seeds = [s.seed * 1_000_003 + e.index for e in examples]
    # the unchanged texts run once: their output distribution, the decision flip's attention items (the
    # gradient at the flip layers' patterns), the counterfactuals' starting pattern at the layers they share
    # with the flip, and the lower layers every edited row of flip, permutation and adversarial search replays
    layers = flip_layers(adapter, s.flip_layers)
    cf_layers = flip_layers(adapter, s.cf_layers)
    records = FrozenRecords()
    shared_cf = [l for l in cf_layers if l in layers]
    below = max([min(layers), *shared_cf])
    ref, probs = reference_pass(adapter, inputs, [pattern_site(l) for l in layers], records, below)
    pred = probs.argmax(-1)
    items = attention_item_scores(adapter, inputs, pred.tolist(), layers, fwd=ref)
    atts = {l: ref.cache[pattern_site(l)].detach() for l in shared_cf}
    del ref  # its graph
    specials = [adapter.special_mask(r) for r in ids]
    for b, e in enumerate(examples):
        add(e.id, "model", "prob", probs[b, pred[b]])
        add(e.id, "model", "correct", pred[b] == e.gold)
        add(e.id, "model", "n_tokens", len(e.ids))
        add(e.id, "model", "truncated", e.truncated)
        arrays[e.id]["input_ids"] = np.asarray(e.ids, np.int64)
        arrays[e.id][TOKEN_LABELS] = labels_array(inputs.labels[b])  # the report shows tokens, not ids
        arrays[e.id].update(distribution("probs", probs[b]))

    # -- explanations (the prediction is explained), then erasure metrics -------------------------
    scores: dict[str, list[np.ndarray]] = {}
    for name in s.methods:
        params = evaluate_params(s.method_params, name, adapter.kind)
        m = get_method(name, **params)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exps = m.attribute(adapter, inputs, target=Target(), batch_size=budget, seed=s.seed)
        own = s.method_params.get(name, {})
        redo = [b for b, ex in enumerate(exps) if ex.info.get("converged") is False] if params != own else []
        for w in caught:  # the rule chosen here that missed is redone below: its warning would mislead
            if not (redo and "relative completeness error" in str(w.message)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if redo:  # the run's own parameters (IG: rule auto) for the examples the evaluate rule did not converge on
            again = get_method(name, **own).attribute(
                adapter, inputs.select(redo), target=Target(), batch_size=budget, seed=s.seed
            )
            for b, ex in zip(redo, again):
                exps[b] = ex
        scores[name] = [np.asarray(ex.scores, np.float64) for ex in exps]
    rep = adapter.replacement_token(s.replacement)[1]
    removal = Removal.of(adapter, rep)  # a decoder: the sink and the explained position stay (methods/removal.py)
    plans: list[tuple[str, int, ErasurePlan, int]] = []
    all_rows: list[list[int]] = []
    for name in s.methods:
        for b in range(len(examples)):
            p = ErasurePlan.build(ids[b], scores[name][b], specials[b], rep, removal)
            plans.append((name, b, p, len(all_rows)))
            all_rows += p.rows
    f_rows = np.zeros(0)
    if all_rows:  # F of every planned row = probability of the original prediction of its example
        owner = np.repeat([pp[1] for pp in plans], [len(pp[2].rows) for pp in plans]).astype(int)
        f_rows = output_prob_of(adapter, all_rows, budget, pred[owner])
    for name, b, p, start in plans:
        e = examples[b]
        met, arr = p.metrics(float(probs[b, pred[b]]), f_rows[start : start + len(p.rows)])
        for k, v in met.items():
            add(e.id, name, k, v)
        arrays[e.id][f"{name}.tokens"] = scores[name][b].astype(np.float32)
        for key, arr_v in arr.items():
            arrays[e.id][f"{name}.{key}"] = arr_v
    if s.soft or s.randomisation or s.efficient_mprt or tuned is not None:  # soft erasure, randomisation, F-Fidelity
        from .confounds import add_confound_metrics

        add_confound_metrics(tables, examples, s, tuned, adapter, inputs, scores, specials, removal, probs, seeds)

    # -- agreement and plausibility --------------------------------------------------------------
    for b, e in enumerate(examples):
        keep = ~specials[b]
        for (x, y), t in pairwise_taus({n: scores[n][b] for n in s.methods}, specials[b]).items():
            add(e.id, f"{x}|{y}", "kendall_tau", t)
        if e.rationale is not None:
            gold = rationale_mask(adapter, e.text, e.ids, e.rationale)
            if gold is not None and gold.any():
                for n in s.methods:
                    for k, v in plausibility(scores[n][b][keep], gold[keep]).items():
                        add(e.id, n, k, v)
                arrays[e.id]["rationale"] = gold.astype(np.uint8)

    # -- decision flip ---------------------------------------------------------------------------
    rankings = [dict(items[b], **{f"method:{n}": scores[n][b] for n in s.methods}) for b in range(len(examples))]
    flips = decision_flip(adapter, inputs, probs, rankings, layers, seeds, budget, records)
    for b, e in enumerate(examples):
        for rname, d in flips[b].items():
            mname = rname[7:] if rname.startswith("method:") else FLIP_NAMES.get(rname, rname)
            for k, v in d.items():
                add(e.id, mname, k, v)

    # -- the whole answer (causal LM, --answer-tokens N) ------------------------------------------
    if s.answer_tokens:
        from .answer import evaluate_answers

        built = {n: get_method(n, **evaluate_params(s.method_params, n, adapter.kind)) for n in s.methods}
        answers = evaluate_answers(adapter, ids, built, s.answer_tokens, removal, budget, s.seed)
        for e, (_answer, mets, arr) in zip(examples, answers):
            arrays[e.id].update(arr)
            for name, d in mets.items():
                for k, v in d.items():
                    add(e.id, name, k, v)

    # -- counterfactual attention and the uniform baseline ---------------------------------------
    cf = Counterfactual(**s.counterfactual)
    for l in cf_layers:
        att = atts.pop(l, None)
        if att is None:
            with torch.no_grad():  # one forward records the pattern both the permutations and the search start from
                att = adapter.forward(inputs, record=[pattern_site(l)]).cache[pattern_site(l)]
        perm = cf.permutations(adapter, inputs, probs, l, seeds, budget, att=att, records=records)
        adv_js, adv_tvd = cf.adversarial(adapter, inputs, probs, l, seeds, att=att, records=records)
        for b, e in enumerate(examples):
            add(e.id, "counterfactual_attention", f"perm_tvd_median@{l}", perm[b])
            add(e.id, "counterfactual_attention", f"adv_js@{l}", adv_js[b])
            add(e.id, "counterfactual_attention", f"adv_tvd@{l}", adv_tvd[b])
            add(e.id, "counterfactual_attention", f"adv_exists@{l}", adv_js[b] >= cf.js_threshold)
    uni = cf.uniform(adapter, inputs, budget)
    uni_tv = total_variation(uni, probs)
    for b, e in enumerate(examples):
        add(e.id, "uniform_attention", "tvd", uni_tv[b])
        add(e.id, "uniform_attention", "flip", uni[b].argmax() != pred[b])
        add(e.id, "uniform_attention", "correct", uni[b].argmax() == e.gold)
        arrays[e.id].update(distribution("uniform_probs", uni[b]))
    return tables.out()
