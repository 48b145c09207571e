"""The 2019 "is attention explanation?" experiments, per layer and per head, on one chunk of examples.

A pure function of (model, decision space, examples, settings), like :mod:`.pipeline`, reusing its pieces:
:func:`~streetlamp.stats.kendall_tau`, :class:`~.counterfactual.Counterfactual` (permutation, adversarial
and uniform attention), :func:`~.common.output_map` and :mod:`.prefix` (rows run after a cached prefix).

**Decision.** The model's decision is the argmax of a distribution over a *decision space*: every output
(a classifier's classes; a causal LM's vocabulary for next-token recall) or a few output ids renormalised
(a causal LM's label tokens `` negative`` / `` positive`` for zero-shot sentiment, so the decision is
binary as the classifier's). Every output change below (TVD, JS in bits, flip = argmax changed) is
measured in that space. ``F`` = the decision-space probability of the predicted decision.

**Items** are the tokens of the data's own text (``TaskExample.items``): never a special token, never the
prompt's template, and for a next-token prompt never the explained (last) position.

Per example:

* Jain & Wallace (NAACL 2019), agreement: Kendall tau-b (:func:`~streetlamp.stats.kendall_tau`, over items)
  between the explained position's attention row and (a) gradient importance ``||dF/de_i||`` (the
  registered ``saliency`` method) and (b) leave-one-out importance ``TVD(y(x without token i), y(x))``
  ([MASK] on a masked LM; on a causal LM the decoder removal rule of :mod:`~..methods.removal`, as occlusion:
  deleted, a first token replaced by the document-start token, the explained last position never removed).
  Per head (``head{L}.{H}``: that head's row) and per layer (``layer{L}``: the mean row over heads);
  ``model / tau_gradient_loo`` is the two non-attention rankings' own agreement, the ceiling to compare with.
Interventions run at the layers of ``ReplicateSettings.layers`` (default all; the taus are always computed
for every layer and head, at no extra cost).

* Jain & Wallace, counterfactual attention per layer: ``perm_tvd_median`` (the explained row of every head
  permuted), and at ``adv_layers`` evenly spaced layers ``adv_js`` / ``adv_tvd`` (see :mod:`.counterfactual`).
* Serrano & Smith (ACL 2019), per layer: zero one item in every head of the layer and renormalise
  (:func:`zero_items`), in every query row (``zero_rows="all"``) or only in the explained position's row
  (``"explained"``: the one attention distribution the 2019 models' classifier read); the top item by
  attention (mean over heads of the explained row), by gradient (``sum_{h,q} dF/dA[h,q,j]`` at the layer)
  or a random other item; ``flip_*``, ``js_*``, ``tvd_*``. Per head (examples with ``per_head``): the same
  with the item zeroed in that head only, chosen by that head's attention or at random.
* Wiegreffe & Pinter (EMNLP 2019): every attention row uniform over the allowed keys, in one layer
  (``layer{L} / uniform_*``) or in all layers (``all_layers / uniform_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..methods.registry import get_method
from ..methods.removal import Removal
from ..methods.scorer import occlusion_replacement
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from ..stats import js_divergence_t, kendall_tau, total_variation_t
from .common import ChunkTables, Rows, output_map
from .prefix import PrefixRunner, prefix_runners
from .settings import ReplicateSettings, intervention_layers


@dataclass
class TaskExample:
    index: int  # position in the run (seeds derive from it)
    id: str
    ids: list[int]
    text: str  # the model's input (the prompt)
    gold: int  # index in the decision space
    items: np.ndarray  # bool [n]
    per_head: bool = False


@dataclass(frozen=True)
class Decision:
    """The decision space: every output of the model (``candidates`` None) or these output ids, renormalised."""

    candidates: tuple[int, ...] | None = None

    def project(self, p: torch.Tensor) -> torch.Tensor:
        if self.candidates is None:
            return p
        q = p[:, list(self.candidates)]
        return q / q.sum(-1, keepdim=True)

    def target(self, pred: int) -> Target:
        """The registered methods' target with the same ranking as ``F``: a binary decision's logit
        difference (F is its sigmoid), else the output's probability."""
        c = self.candidates
        if c is None:
            return Target(index=pred)
        if len(c) == 2:
            return Target(index=c[pred], contrast=c[1 - pred], quantity="logit")
        raise ValueError("a decision space of candidates needs exactly two of them")


def adv_layers(n_layers: int, k: int) -> list[int]:
    """``k`` evenly spaced layers, first and last included (all when ``k >= n_layers``)."""
    if k <= 0:
        return []
    return sorted({int(round(x)) for x in np.linspace(0, n_layers - 1, min(k, n_layers))})


def _stats_fn(decision: Decision, ref: torch.Tensor, owner: np.ndarray) -> Callable:
    """Reduce a group's output distributions to [argmax, TVD, JS] in the decision space vs its example's."""

    def fn(group: list[int], p: torch.Tensor) -> torch.Tensor:
        y = decision.project(p)
        r = ref[owner[group]].to(p.device)
        return torch.stack([y.argmax(-1).double(), total_variation_t(y, r), js_divergence_t(y, r)], 1)

    return fn


def _keep_edit(keeps: list[np.ndarray], layer: int, n_heads: int, qpos: list[int] | None = None):
    """Edit builder: row ``i`` multiplies the layer's pattern by ``keeps[i]`` (``[heads, n]``: 0 = zeroed key)
    and renormalises -- in every query row, or (``qpos``) only in query row ``qpos[i]``."""

    def build(group: list[int], width: int) -> dict:
        k = torch.ones((len(group), n_heads, width), dtype=torch.float32)
        for r, i in enumerate(group):
            k[r, :, : keeps[i].shape[-1]] = torch.as_tensor(keeps[i], dtype=torch.float32)
        q = None if qpos is None else torch.tensor([qpos[i] for i in group])

        def fn(p: torch.Tensor) -> torch.Tensor:
            z = p * k.to(p.device, p.dtype)[:, :, None, :]
            s = z.sum(-1, keepdim=True)
            z = torch.where(s > 0, z / s.clamp_min(torch.finfo(p.dtype).tiny), p)
            if q is None:
                return z
            onehot = torch.nn.functional.one_hot(q.to(p.device), p.shape[-2]).to(p.dtype)[:, None, :, None]
            return p * (1 - onehot) + onehot * z

        return {f"layers.{layer}.attn.pattern": fn}

    return build


def zero_items(
    adapter: ModelAdapter,
    ids: Sequence[Sequence[int]],
    plan: Sequence[tuple[int, int | None, int]],
    layer: int,
    explained_only: bool,
    prefix: Sequence[PrefixRunner] | None,
    budget: int | None,
    stats: Callable,
) -> np.ndarray:
    """Serrano & Smith's zeroing: plan row ``(b, h, j)`` zeroes key ``j`` of text ``b`` at ``layer`` in head
    ``h`` (``None``: every head) and renormalises, in every query row or (``explained_only``) only in the
    explained position's row. ``stats(plan rows, probs)`` reduces each row's output (:func:`_stats_fn`).

    The explained row of a causal LM is its last position: no other position reads it, so with ``prefix`` that
    row runs alone after the text's KV cache (one position instead of ``n``; the same numbers)."""
    keeps = []
    for b, h, j in plan:
        k = np.ones((adapter.n_heads, len(ids[b])), np.float32)
        k[slice(None) if h is None else h, j] = 0.0
        keeps.append(k)
    owner = [b for b, _, _ in plan]
    if explained_only and prefix is not None:
        out = np.zeros((len(plan), 3))
        for b in dict.fromkeys(owner):
            mine = [i for i, o in enumerate(owner) if o == b]
            n = len(ids[b])
            out[mine] = prefix[b].map(
                [n - 1] * len(mine),
                [[ids[b][-1]]] * len(mine),
                lambda g, p, mine=mine: stats([mine[r] for r in g], p),  # type: ignore[misc]
                3,
                _keep_edit([keeps[i] for i in mine], layer, adapter.n_heads),
            )
        return out
    qpos = [adapter.explained_position(len(ids[b])) for b in owner] if explained_only else None
    edit = _keep_edit(keeps, layer, adapter.n_heads, qpos)
    return output_map(adapter, [ids[b] for b in owner], budget, stats, 3, edit)


def _top(scores: np.ndarray, items: np.ndarray) -> int:
    idx = np.flatnonzero(items)
    return int(idx[np.argmax(np.asarray(scores)[idx])])  # first maximum: ties go to the earlier token


def _other(rng: np.random.Generator, items: np.ndarray, not_this: int) -> int:
    idx = [int(j) for j in np.flatnonzero(items) if j != not_this]
    return int(rng.choice(idx)) if idx else not_this


def loo_tvd(
    adapter: ModelAdapter, decision: Decision, examples: Sequence[TaskExample], probs: torch.Tensor, budget: int | None
) -> list[np.ndarray]:
    """Leave-one-out importance of every item, ``TVD(y(x without i), y(x))`` in the decision space (0 elsewhere).

    The token is removed as occlusion removes it (:class:`~..methods.removal.Removal`): [MASK] on a masked LM;
    on a causal LM it is deleted, except that a removed first token is replaced by the document-start token
    (the attention sink stays at position 0) and the explained last position is never removed (score 0; it
    is never an item). One padded batch of full rows (on CPU the per-call cost of a cached-prefix row per
    deletion outweighed the positions it saves)."""
    _, tid, _ = occlusion_replacement(adapter, "mask")
    removal = Removal.of(adapter, tid)
    out = [np.zeros(len(e.ids)) for e in examples]
    rows, owner, where = [], [], []
    for b, e in enumerate(examples):
        ids = torch.tensor(e.ids)
        for j in np.flatnonzero(e.items & ~removal.protected(len(e.ids))):
            absent = np.zeros(len(e.ids), bool)
            absent[j] = True
            rows.append(removal.row(ids, absent).tolist())
            owner.append(b)
            where.append((b, int(j)))
    if rows:
        res = output_map(adapter, rows, budget, _stats_fn(decision, probs, np.array(owner)), 3)
        for r, (b, k) in enumerate(where):
            out[b][k] = res[r, 1]
    return out


def replicate_chunk(
    adapter: ModelAdapter,
    decision: Decision,
    examples: list[TaskExample],
    s: ReplicateSettings,
    reuse_prefix: bool = True,
) -> tuple[Rows, dict[str, dict[str, np.ndarray]]]:
    """Every statistic of the module docstring for one chunk. ``reuse_prefix`` (causal LMs): the interventions
    on the explained row (permutations, the adversarial search, zeroing with ``zero_rows="explained"``) run the
    last position only, after each text's KV cache (:mod:`.prefix`; the same numbers as full rows)."""
    tables = ChunkTables([e.id for e in examples])
    if not examples:
        return tables.out()
    add, arrays = tables.add, tables.arrays
    budget = s.batch_size
    n_l, n_h = adapter.n_layers, adapter.n_heads
    ids = [e.ids for e in examples]
    inp = Inputs.from_ids(adapter, ids, [e.text for e in examples])
    seeds = [s.seed * 1_000_003 + e.index for e in examples]
    width = adapter.n_outputs if decision.candidates is None else len(decision.candidates)
    probs = torch.as_tensor(output_map(adapter, ids, budget, lambda g, p: decision.project(p), width))
    probs_np = probs.numpy()
    ref_stats = lambda owner: _stats_fn(decision, probs, np.asarray(owner))  # noqa: E731
    pred = probs_np.argmax(-1)

    # -- attention and dF/dA of every head (one forward and backward) --------------------------------
    sites = [f"layers.{l}.attn.pattern" for l in range(n_l)]
    fwd = adapter.forward(inp, record=sites, keep_grad=True, grad=True)
    q = decision.project(torch.softmax(at_least_float32(fwd.logits), -1))
    f = q.gather(1, torch.as_tensor(pred, dtype=torch.long).view(-1, 1).to(q.device)).sum()
    pats = [fwd.cache[x] for x in sites]
    grads = torch.autograd.grad(f, pats)
    att_layers = [p.detach() for p in pats]  # [B, H, W, W] per layer, for the counterfactuals
    pos = [adapter.explained_position(len(r)) for r in ids]
    att = [
        torch.stack([a[b, :, pos[b], : len(ids[b])] for a in att_layers]).double().cpu().numpy()
        for b in range(len(ids))
    ]
    gsum = [
        torch.stack([g[b, :, :, : len(ids[b])].sum((0, 1)) for g in grads]).double().cpu().numpy()
        for b in range(len(ids))
    ]
    del fwd, pats, grads

    # -- the two non-attention importances ----------------------------------------------------------
    sal: list[np.ndarray] = [np.zeros(0)] * len(examples)
    method = get_method("saliency")
    targets = [decision.target(int(p)) for p in pred]
    for t in dict.fromkeys(targets):
        idx = [b for b in range(len(examples)) if targets[b] == t]
        for b, x in zip(idx, method.attribute(adapter, inp.select(idx), target=t, batch_size=budget, seed=s.seed)):
            sal[b] = np.asarray(x.scores, np.float64)
    prefix = prefix_runners(adapter, ids, reuse_prefix)
    loo = loo_tvd(adapter, decision, examples, probs, budget)

    for b, e in enumerate(examples):
        ex = ~e.items
        add(e.id, "model", "correct", pred[b] == e.gold)
        add(e.id, "model", "prob", probs_np[b, pred[b]])
        add(e.id, "model", "n_tokens", len(e.ids))
        add(e.id, "model", "n_items", e.items.sum())
        add(e.id, "model", "tau_gradient_loo", kendall_tau(sal[b], loo[b], ex))
        for l in range(n_l):
            mean_row = att[b][l].mean(0)
            add(e.id, f"layer{l:02d}", "tau_attention_gradient", kendall_tau(mean_row, sal[b], ex))
            add(e.id, f"layer{l:02d}", "tau_attention_loo", kendall_tau(mean_row, loo[b], ex))
            for h in range(n_h):
                add(e.id, f"head{l:02d}.{h:02d}", "tau_attention_gradient", kendall_tau(att[b][l, h], sal[b], ex))
                add(e.id, f"head{l:02d}.{h:02d}", "tau_attention_loo", kendall_tau(att[b][l, h], loo[b], ex))
        arrays[e.id].update(
            input_ids=np.asarray(e.ids, np.int64),
            items=e.items.astype(np.uint8),
            attention=att[b].astype(np.float32),  # [layers, heads, tokens]: the explained position's rows
            saliency=sal[b].astype(np.float32),
            loo_tvd=loo[b].astype(np.float32),
            probs=probs_np[b].astype(np.float32) if width <= 1000 else probs_np[b, [pred[b]]].astype(np.float32),
        )

    # -- Serrano & Smith: zero one item per layer (every head), and per head -------------------------
    layers_i = intervention_layers(n_l, s.layers)
    explained_only = s.zero_rows == "explained"
    for l in layers_i:
        plan: list[tuple[int, int | None, int]] = []
        names: list[tuple[str, str]] = []  # (method, choice) per plan row
        for b, e in enumerate(examples):
            if not e.items.any():
                continue
            top_a = _top(att[b][l].mean(0), e.items)
            choice = {
                "top_attention": top_a,
                "top_gradient": _top(gsum[b][l], e.items),
                "random": _other(np.random.default_rng([seeds[b], l]), e.items, top_a),
            }
            for name, j in choice.items():
                plan.append((b, None, j))
                names.append((f"layer{l:02d}", name))
            if not e.per_head:
                continue
            for h in range(n_h):
                top_h = _top(att[b][l, h], e.items)
                rnd = _other(np.random.default_rng([seeds[b], l, h]), e.items, top_h)
                for name, j in (("top_attention", top_h), ("random", rnd)):
                    plan.append((b, h, j))
                    names.append((f"head{l:02d}.{h:02d}", name))
        if not plan:
            continue
        owner = [b for b, _, _ in plan]
        res = zero_items(adapter, ids, plan, l, explained_only, prefix, budget, ref_stats(owner))
        for r, ((b, _, _), (m, name)) in enumerate(zip(plan, names)):
            eid = examples[b].id
            add(eid, m, f"flip_{name}", int(res[r, 0]) != pred[b])
            if m.startswith("layer"):
                add(eid, m, f"tvd_{name}", res[r, 1])
            add(eid, m, f"js_{name}", res[r, 2])

    # -- Jain & Wallace: permuted and adversarial attention; Wiegreffe & Pinter: uniform --------------
    cf = s.counterfactual()
    adv = set(adv_layers(n_l, s.adv_layers))
    for l in sorted(set(layers_i) | adv):
        perm = cf.permutations(adapter, inp, probs_np, l, seeds, budget, decision.project, att_layers[l], prefix)
        for b, e in enumerate(examples):
            add(e.id, f"layer{l:02d}", "perm_tvd_median", perm[b])
        if l in adv:
            js, tvd = cf.adversarial(adapter, inp, probs_np, l, seeds, decision.project, att_layers[l], prefix)
            for b, e in enumerate(examples):
                add(e.id, f"layer{l:02d}", "adv_js", js[b])
                add(e.id, f"layer{l:02d}", "adv_tvd", tvd[b])
                add(e.id, f"layer{l:02d}", "adv_exists", js[b] >= cf.js_threshold)
    for name, layers in [(f"layer{l:02d}", [l]) for l in layers_i] + [("all_layers", None)]:
        u = decision.project(torch.as_tensor(cf.uniform(adapter, inp, budget, layers)))
        tv = total_variation_t(u, probs).numpy()
        for b, e in enumerate(examples):
            add(e.id, name, "uniform_tvd", tv[b])
            add(e.id, name, "uniform_flip", int(u[b].argmax()) != pred[b])
            if layers is None:
                add(e.id, name, "uniform_correct", int(u[b].argmax()) == e.gold)
    return tables.out()
