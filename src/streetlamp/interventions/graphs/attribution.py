"""Attribution graphs: the direct linear effects between the nodes of the local replacement model
(:mod:`.replacement`) on one prompt, read by batched backward passes (circuit-tracer's algorithm, transcribed).

Nodes, in circuit-tracer's order (so the adjacency and its Neuronpedia JSON are the same object):
``[features (layer, position, feature) ascending, errors (layer-major: layer·n + position), token embeddings
(position), logits (by probability)]``. ``adjacency[target, source]`` is the direct effect of the source on
the target through the frozen model. Only features and logits are targets (errors and tokens are sources
only), so a graph stores ``rows`` ``[features + logits, n_nodes]``: ``rows[graph.row(t), s]`` is
``adjacency[t, s]`` (the square matrix would be mostly empty rows: at 2,048 tokens 31 · 2,048 of them):

- a source writes ``v`` into the residual stream: a feature ``a_s W_dec[s]`` (at its layer's MLP output),
  an error node its error vector, a token its embedding (the ``embed`` site); the edge is ``g · v`` with
  ``g`` the gradient of the target at that site through the replacement model (attention patterns and norm
  denominators frozen, every MLP output a fixed node: so the gradient passes no other node);
- a feature target is its pre-activation less ``b_enc``, ``W_enc[:, t] · x`` at its MLP input (for an
  active ReLU / JumpReLU / TopK feature the activation's slope there is 1); a logit target is the demeaned
  logit ``(W_U[i] − mean_j W_U[j]) · h`` at the LM head's (frozen-normed) input ``h``, before any soft-cap;
- logits: the most probable next tokens, at most ``max_logits``, the fewest whose cumulative probability
  reaches ``logit_prob`` (circuit-tracer's ``compute_salient_logits``: top ``max_logits`` by probability,
  cut after the first whose running sum reaches the threshold; defaults 10 and 0.95);
- with ``zero_bos`` (circuit-tracer's default) a first token that is a special token (BOS) has no feature
  nodes and zero error vectors (its residual stream is the same on every prompt); its token node keeps its
  embedding and its edges, as circuit-tracer's.

Rows are computed in batches: the prompt is repeated ``batch_size`` times, one target per copy, one
backward pass per batch from the retained forward graph. Every row holds the columns of every active
feature (plus errors, tokens); with more active features than ``max_feature_nodes``, features are visited in
order of their influence on the logits as estimated from the rows so far (recomputed every
``update_interval`` × 256 rows, as circuit-tracer's defaults; its ``compute_partial_influences``) and the graph keeps the
visited ones. Memory is ``rows × active features``, never ``width × width``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...errors import StreetlampError
from ...models.adapter import Inputs, ModelAdapter
from ...models.features import feature_site
from ...progress import bar as progress_bar
from .replacement import check_replacement, freeze_edits, frozen_norms, frozen_weights, transcoder_layers

__all__ = ["Graph", "Replacement", "RowStore", "attribute", "salient_logits"]

# features visited between two influence rankings: update_interval x circuit-tracer's default batch of 256 rows
# (independent of how many rows one backward pass here holds)
QUEUE_BATCH = 256
# the active features' written vectors (a_s W_dec[s]) held up to this many bytes; beyond, projected per pass
DECODER_MEMORY = 2**30
# the rows buffer in memory up to this many bytes; larger, in a temporary file (memory-mapped)
ROWS_MEMORY = 8 * 2**30


@dataclass
class Graph:
    """An unpruned attribution graph (rows: targets, columns: sources), in circuit-tracer's node order."""

    ids: list[int]  # the prompt's token ids
    tokens: list[str]  # their labels
    features: np.ndarray  # [n_features, 3] (layer, position, feature index) of the graph's feature nodes
    activations: np.ndarray  # [n_features]
    n_layers: int
    logit_ids: np.ndarray  # [n_logits]
    logit_probs: np.ndarray  # [n_logits]
    logit_labels: list[str]
    rows: torch.Tensor  # [n_features + n_logits, n_nodes] float32: the targets' rows of adjacency[target, source]
    error_norms: np.ndarray  # [n_layers, n_pos] ‖error vector‖ (0 where zeroed)
    n_active: int = 0  # active features on the prompt (the graph holds all of them, or the most influential)
    info: dict = field(default_factory=dict)

    @property
    def n_pos(self) -> int:
        return len(self.ids)

    @property
    def n_features(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_logits(self) -> int:
        return int(self.logit_ids.shape[0])

    @property
    def error_start(self) -> int:
        return self.n_features

    @property
    def token_start(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_start(self) -> int:
        return self.token_start + self.n_pos

    @property
    def n_nodes(self) -> int:
        return self.logit_start + self.n_logits

    def kind(self, i: int) -> str:
        if i < self.error_start:
            return "feature"
        if i < self.token_start:
            return "error"
        if i < self.logit_start:
            return "token"
        return "logit"

    def where(self, i: int) -> tuple[int, int]:
        """(layer, position) of node ``i``: tokens at layer -1, logits at layer n_layers (last position)."""
        k = self.kind(i)
        if k == "feature":
            return int(self.features[i, 0]), int(self.features[i, 1])
        if k == "error":
            return divmod(i - self.error_start, self.n_pos)
        if k == "token":
            return -1, i - self.token_start
        return self.n_layers, self.n_pos - 1

    def positions(self) -> np.ndarray:
        """Every node's position (:meth:`where`'s second value), as one array."""
        n, L = self.n_pos, self.n_layers
        return np.concatenate(
            [self.features[:, 1], np.tile(np.arange(n), L), np.arange(n), np.full(self.n_logits, n - 1)]
        ).astype(np.int64)

    def label(self, i: int) -> str:
        k = self.kind(i)
        l, p = self.where(i)
        if k == "feature":
            return f"L{l} F{int(self.features[i, 2])} @{p}"
        if k == "error":
            return f"L{l} error @{p}"
        if k == "token":
            return f"token {self.tokens[p]!r} @{p}"
        return f"logit {self.logit_labels[i - self.logit_start]!r}"

    @property
    def row_nodes(self) -> torch.Tensor:
        """The node of each of :attr:`rows` (the features, then the logits)."""
        return torch.cat([torch.arange(self.n_features), torch.arange(self.logit_start, self.n_nodes)])

    def row(self, node: int) -> int | None:
        """The row of ``node`` in :attr:`rows`; None for an error or token node (a source only)."""
        if node < self.error_start:
            return node
        if node >= self.logit_start:
            return self.n_features + node - self.logit_start
        return None

    def weight(self, target: int, source: int) -> float:
        """``adjacency[target, source]``: the direct effect of ``source`` on ``target``."""
        r = self.row(target)
        return 0.0 if r is None else float(self.rows[r, source])

    @property
    def adjacency(self) -> torch.Tensor:
        """The square ``[n_nodes, n_nodes]`` matrix (zero rows for errors and tokens), built on each call: for
        small graphs and checks; the graph's own code reads :attr:`rows`."""
        A = torch.zeros(self.n_nodes, self.n_nodes, dtype=self.rows.dtype)
        A[self.row_nodes] = self.rows
        return A

    def logit_weights(self) -> torch.Tensor:
        w = torch.zeros(self.n_nodes, dtype=torch.float64)
        w[self.logit_start :] = torch.as_tensor(self.logit_probs, dtype=torch.float64)
        return w


@torch.no_grad()
def salient_logits(probs: torch.Tensor, max_logits: int = 10, logit_prob: float = 0.95) -> torch.Tensor:
    """circuit-tracer's choice: the ``max_logits`` most probable tokens, cut after the first whose cumulative
    probability reaches ``logit_prob``."""
    top_p, top_i = torch.topk(probs, min(max_logits, probs.shape[-1]))
    cut = int(torch.searchsorted(torch.cumsum(top_p, 0), torch.tensor(logit_prob, dtype=top_p.dtype))) + 1
    return top_i[:cut]


class _Block:
    """One layer's active features: column ``start + i`` is feature ``idx[i]`` at position ``pos[i]``, writing
    ``val[i] W_dec[idx[i]]``; :meth:`columns` gives ``g[b, pos[i]] · val[i] W_dec[idx[i]]`` for a batch of
    gradients ``g [m, n, d]``, each position's gradient read once (a gather per feature would copy it once per
    feature). Two layouts, the same numbers to float rounding:

    - ``padded``: the written vectors laid out by position, padded to the most features any position has, met
      by one batched product per layer (``m · positions · k · d`` flops; ``active features × d`` floats held);
    - projected (``padded=False``): the gradients projected on the whole decoder, ``g W_decᵀ``, and the active
      entries read out (``m · positions · width · d`` flops, width / k times more; nothing held but indices),
      for prompts whose written vectors would not fit (2,048 tokens of SmolLM2 with TopK 32 at 30 layers:
      1.97 M vectors, 4.5 GB)."""

    def __init__(
        self,
        layer: int,
        start: int,
        pos: torch.Tensor,
        idx: torch.Tensor,
        val: torch.Tensor,
        W_dec: torch.Tensor,
        padded: bool,
        n_pos: int,
    ) -> None:
        self.layer, self.start, self.size = layer, start, len(pos)
        self.pos_u, counts = torch.unique_consecutive(pos, return_counts=True)  # pos is sorted
        which = torch.repeat_interleave(torch.arange(len(self.pos_u), device=pos.device), counts)
        self.every_position = len(self.pos_u) == n_pos and bool(
            (self.pos_u == torch.arange(n_pos, device=pos.device)).all()
        )
        self.padded: torch.Tensor | None = None
        if padded:
            kmax = int(counts.max())
            slot = torch.arange(len(pos), device=pos.device) - torch.repeat_interleave(
                torch.cumsum(counts, 0) - counts, counts
            )
            self.padded = W_dec.new_zeros(len(self.pos_u), kmax, W_dec.shape[-1])
            self.padded[which, slot] = val[:, None] * W_dec[idx]
            self.which, self.slot = which, slot
        else:
            self.which, self.idx, self.val, self.W_dec = which, idx, val, W_dec

    def columns(self, g: torch.Tensor) -> torch.Tensor:
        """``[m, size]``: ``g[b, pos[i]] · val[i] W_dec[idx[i]]`` for a batch of gradients ``g [m, n, d]``."""
        gp = g if self.every_position else g[:, self.pos_u]  # [m, positions, d]
        if self.padded is not None:
            prod = torch.bmm(gp.transpose(0, 1), self.padded.transpose(1, 2))  # [positions, m, kmax]
            return prod[self.which, :, self.slot].t()  # [m, size]: feature i at (which[i], slot[i])
        return (gp @ self.W_dec.t())[:, self.which, self.idx] * self.val


class Replacement:
    """One retained forward pass of the replacement model on ``batch`` copies of the prompt, its active nodes and
    the vectors they write (``record``: extra sites kept in the graph, e.g. a layer's ``resid_pre`` as a
    target). :meth:`rows` turns target scalars (one per copy) into rows over every active node."""

    def __init__(
        self,
        adapter: ModelAdapter,
        ids: torch.Tensor,
        batch: int,
        zero_bos: bool,
        record: tuple[str, ...] = (),
        cut_heads: bool = False,
    ) -> None:
        fs = adapter.features
        assert fs is not None
        self.adapter = adapter
        self.sinks: dict[str, torch.Tensor] = {}
        self.stash: dict[int, torch.Tensor] = {}
        self.layers = transcoder_layers(adapter)
        edits = freeze_edits(adapter, self.sinks, self.stash)
        # cut_heads: every head's OV path cut for gradients (values detached, a zero leaf added: the gradient
        # there is what a value written at that (layer, position, head) does downstream with no other head on
        # its way); the live values kept in v_stash (their gradients reach the nodes with no head on the way)
        self.v_stash: dict[int, torch.Tensor] = {}
        self.v_sinks: dict[int, torch.Tensor] = {}
        if cut_heads:
            for l in range(adapter.n_layers):
                edits[f"layers.{l}.attn.v"] = self._cut(l)
        rec = ["embed"] + [feature_site(l, "mlp", e) for l in self.layers for e in (False, True)]
        rec += [f"layers.{l}.mlp.out" for l in range(adapter.n_layers) if l not in self.layers] + list(record)
        head = adapter.hf_model.get_output_embeddings()
        seen: dict[str, torch.Tensor] = {}
        hook = head.register_forward_pre_hook(lambda m, args: seen.__setitem__("h", args[0]))
        inputs = Inputs.from_ids(adapter, [ids.tolist()] * batch, strings=False)
        try:
            with frozen_norms(adapter), frozen_weights(adapter):
                fwd = adapter.forward(inputs, record=rec, edit=edits, keep_grad=True, grad=True)
        finally:
            hook.remove()
        self.cache = fwd.cache
        self.logits = fwd.logits[0].detach()
        self.h = seen["h"][:, -1]  # [batch, d]: the LM head's input at the last position
        self.sites = ["embed"] + [f"layers.{l}.mlp.out" for l in range(adapter.n_layers)]
        self.leaves = [self.sinks[s] for s in self.sites]
        n, L = int(ids.shape[0]), adapter.n_layers
        self.n, self.L = n, L
        self.skip_bos = bool(zero_bos and n > 1 and int(ids[0]) in adapter.special_ids)
        first = 1 if self.skip_bos else 0
        # active features (row 0 of the batch): their scaled decoder vectors a_s W_dec[s] and positions, one block
        # of consecutive columns per layer (features are sorted by layer, position, index)
        self.feats: list[tuple[int, int, int]] = []
        acts: list[torch.Tensor] = []
        self.blocks: list[_Block] = []
        found: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        errors = torch.zeros(L, n, adapter.d_model, dtype=torch.float64)
        for l in range(L):
            if l in self.layers:
                a = self.cache[feature_site(l, "mlp")][0].detach()
                err = self.cache[feature_site(l, "mlp", True)][0].detach()
                tc = fs.get(l, "mlp")
                assert tc is not None
                W_dec = tc.params(a)["W_dec"]
                assert W_dec is not None
                a = a.clone()
                a[:first] = 0
                # every nonzero latent is a node (row-major: by position, then feature index): a JumpReLU latent
                # with θ < 0 fires below zero, and its a W_dec is in no error (circuit-tracer's to_sparse()
                # nodes); ReLU and TopK latents are >= 0, where this is a > 0
                pos, idx = torch.nonzero(a, as_tuple=True)
                if pos.numel():
                    val = a[pos, idx]
                    found.append((l, pos, idx, val, W_dec))
                    self.feats.extend(zip([l] * len(pos), pos.tolist(), idx.tolist()))
                    acts.append(val.double().cpu())
            else:
                err = self.cache[f"layers.{l}.mlp.out"][0].detach()
            errors[l, first:] = err[first:].double().cpu()
        self.acts = torch.cat(acts).numpy() if acts else np.zeros(0, dtype=np.float64)
        self.n_act = len(self.feats)
        padded = self.n_act * adapter.d_model * 4 <= DECODER_MEMORY
        self.W_dec = {l: W for l, _, _, _, W in found}
        start = 0
        for l, pos, idx, val, W_dec in found:
            self.blocks.append(_Block(l, start, pos, idx, val, W_dec, padded, n))
            start += len(pos)
        self.errors = errors
        self.err_dev = errors.to(self.h.device, self.h.dtype)
        # every token keeps its embedding as its node's vector, the special first one too (circuit-tracer's
        # token_vectors = W_E[tokens]: zero_bos zeroes that position's features and errors, not its token node)
        self.embed_vals = self.cache["embed"][0].detach().clone()
        self.n_cols = self.n_act + L * n + n  # features, errors, tokens

    def release(self) -> None:
        """Drop the retained forward pass (its graph, cache and sinks); the nodes' values stay."""
        self.cache, self.leaves, self.blocks, self.W_dec = {}, [], [], {}
        self.h = self.h.detach()
        self.sinks.clear()
        self.stash.clear()
        self.v_stash.clear()
        self.v_sinks.clear()

    def _cut(self, layer: int):  # noqa: ANN202 - an edit function
        def fn(v: torch.Tensor) -> torch.Tensor:
            self.v_stash[layer] = v
            z = torch.zeros_like(v, requires_grad=True)
            self.v_sinks[layer] = z
            return v.detach() + z

        return fn

    def grads(self, scalar: torch.Tensor) -> list[torch.Tensor]:
        gs = torch.autograd.grad(scalar, self.leaves, retain_graph=True, allow_unused=True)
        return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(gs, self.leaves)]

    def rows(self, parts: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows ``[len(parts), n_cols]`` (float32 unless ``dtype``): ``parts[b]`` is a scalar of batch copy ``b``;
        each row is the direct effect of every node on it through the replacement model."""
        g = self.grads(torch.stack(parts).sum())
        m, n, L, n_act = len(parts), self.n, self.L, self.n_act
        out = torch.zeros(m, self.n_cols, dtype=dtype)
        g_embed, g_mlp = g[0][:m], g[1:]
        for blk in self.blocks:
            out[:, blk.start : blk.start + blk.size] = blk.columns(g_mlp[blk.layer][:m]).to(dtype).cpu()
        for l in range(L):
            e0 = n_act + l * n
            out[:, e0 : e0 + n] = torch.einsum("bnd,nd->bn", g_mlp[l][:m], self.err_dev[l]).to(dtype).cpu()
        out[:, n_act + L * n :] = torch.einsum("bnd,nd->bn", g_embed[:m], self.embed_vals).to(dtype).cpu()
        return out

    def rows_at(self, parts: list[torch.Tensor], graph: Graph, nodes: list[int]) -> torch.Tensor:
        """:meth:`rows` at the columns of graph ``nodes`` only (features, errors, tokens), float64
        ``[len(parts), len(nodes)]``: each node's written vector dotted with the gradient at its site, no
        other column computed."""
        g = self.grads(torch.stack(parts).sum())
        m, n_act = len(parts), self.n_act
        out = torch.zeros(m, len(nodes), dtype=torch.float64)
        for j, node in enumerate(nodes):
            c = self.column(graph, node)
            if c < n_act:
                l, p, f = self.feats[c]
                site, vec = 1 + l, float(self.acts[c]) * self.W_dec[l][f]
            elif c < n_act + self.L * self.n:
                l, p = divmod(c - n_act, self.n)
                site, vec = 1 + l, self.err_dev[l, p]
            else:
                p = c - n_act - self.L * self.n
                site, vec = 0, self.embed_vals[p]
            out[:, j] = (g[site][:m, p] @ vec.to(g[site].dtype)).double().cpu()
        return out

    def column(self, graph: Graph, node: int) -> int:
        """The column of graph node ``node`` (a feature, error or token) among this pass's columns."""
        if node < graph.error_start:
            if not hasattr(self, "_col_of"):
                self._col_of = {f: i for i, f in enumerate(self.feats)}
            l, p, f = (int(v) for v in graph.features[node])
            return self._col_of[(l, p, f)]
        return self.n_act + node - graph.error_start

    def target(self, graph: Graph, node: int, b: int) -> torch.Tensor:
        """Graph target ``node`` (a feature's pre-activation less b_enc, or a demeaned logit) in batch copy ``b``."""
        if node >= graph.logit_start:
            W_U = self.adapter.hf_model.get_output_embeddings().weight.detach()
            i = int(graph.logit_ids[node - graph.logit_start])
            return self.h[b] @ (W_U[i] - W_U.mean(0)).to(self.h.dtype)
        l, p, f = (int(v) for v in graph.features[node])
        return self.stash[l][b, p, f]


def attribute(
    adapter: ModelAdapter,
    ids: torch.Tensor,
    *,
    max_logits: int = 10,
    logit_prob: float = 0.95,
    batch_size: int = 4,
    max_feature_nodes: int | None = None,
    update_interval: int = 4,
    zero_bos: bool = True,
    progress: bool = False,
    rows_memory: float = ROWS_MEMORY,
) -> Graph:
    """The attribution graph of the attached transcoders on ``ids`` (one prompt, 1-D token ids). The rows
    buffer (``(logits + feature nodes) × (active features + errors + tokens)`` float32) stays in memory up to
    ``rows_memory`` bytes and goes to a temporary file beyond (:class:`RowStore`)."""
    check_replacement(adapter)
    ids = ids.view(-1).cpu()
    n, L = int(ids.shape[0]), adapter.n_layers
    if n > adapter.max_positions:
        raise StreetlampError(f"the prompt has {n} tokens but {adapter.name} takes at most {adapter.max_positions}")
    if not 0 < logit_prob <= 1 or max_logits < 1:
        raise StreetlampError("logit selection: max_logits >= 1 and 0 < logit_prob <= 1")
    B = max(1, int(batch_size))
    ctx = Replacement(adapter, ids, B, zero_bos)
    feats, n_act, n_cols = ctx.feats, ctx.n_act, ctx.n_cols
    feat_arr = np.array(feats, dtype=np.int64).reshape(-1, 3)

    # the logits: circuit-tracer's salient set, demeaned unembedding columns as the targets
    probs = torch.softmax(ctx.logits.double(), -1)
    logit_ids = salient_logits(probs, max_logits, logit_prob).cpu()
    W_U = adapter.hf_model.get_output_embeddings().weight.detach()
    demeaned = (W_U[logit_ids.to(W_U.device)] - W_U.mean(0, keepdim=True)).to(ctx.h.dtype)  # [k, d]
    K = len(logit_ids)

    def rows_for(targets: list[tuple[str, int]]) -> torch.Tensor:
        """Rows for targets ("feature", index into feats) or ("logit", k)."""
        parts = []
        for b, (kind, i) in enumerate(targets):
            if kind == "logit":
                parts.append(ctx.h[b] @ demeaned[i])
            else:
                l, p, f = feats[i]
                parts.append(ctx.stash[l][b, p, f])
        return ctx.rows(parts)

    cap = n_act if max_feature_nodes is None else min(n_act, int(max_feature_nodes))
    row_node = torch.zeros(K + cap, dtype=torch.long)  # row -> column (node) index in the full order
    row_abs = torch.zeros(K + cap, dtype=torch.float32)  # each row's sum of |entries| (the influence's normaliser)
    layer_of = torch.as_tensor(feat_arr[:, 0])
    bar = progress_bar(total=K + cap, desc="graph rows", disable=not progress)

    def fill(rows: RowStore, st: int, targets: list[tuple[str, int]], nodes: torch.Tensor) -> None:
        r = rows_for(targets)
        rows.write(st, torch.cat([r, r.new_zeros(len(targets), K)], 1))  # a logit is nobody's source
        row_node[st : st + len(targets)] = nodes
        row_abs[st : st + len(targets)] = r.abs().sum(1)
        bar.update(len(targets))

    rows = RowStore(K + cap, n_cols + K, rows_memory)
    try:
        for s in range(0, K, B):
            idx = list(range(s, min(K, s + B)))
            fill(rows, s, [("logit", i) for i in idx], torch.tensor(idx) + n_cols)
        st = K
        visited = torch.zeros(n_act, dtype=torch.bool)
        logit_p = torch.as_tensor(probs[logit_ids.to(probs.device)].cpu(), dtype=torch.float64)
        while int(visited.sum()) < cap:
            if cap == n_act:
                pending = torch.arange(n_act)
            else:
                infl = partial_influences(rows, logit_p, row_node[:st], row_abs[:st], n_cols)
                rank = torch.argsort(infl[:n_act], descending=True, stable=True)
                pending = rank[~visited[rank]][: min(update_interval * QUEUE_BATCH, cap - int(visited.sum()))]
                # rows of one ranking are all computed before the next: batched by layer (a backward pass goes down
                # from the batch's highest layer), which changes no row
                pending = pending[torch.argsort(layer_of[pending], descending=True, stable=True)]
            for s in range(0, len(pending), B):
                chunk = pending[s : s + B]
                fill(rows, st, [("feature", int(i)) for i in chunk], chunk)
                visited[chunk] = True
                st += len(chunk)
        bar.bar.close()
        ctx.release()  # before the graph's rows are gathered: the retained pass is not needed any more

        selected = torch.nonzero(visited).view(-1)
        keep_cols = torch.cat([selected, torch.arange(n_act, n_cols + K)])
        pos_of = torch.full((n_cols + K,), -1, dtype=torch.long)
        pos_of[keep_cols] = torch.arange(len(keep_cols))
        n_sel = len(selected)
        target_row = pos_of[row_node[:st]]  # a feature's row = its node; logit k's row = n_sel + k
        target_row[target_row >= n_sel] -= L * n + n
        adj = torch.zeros(n_sel + K, len(keep_cols), dtype=torch.float32)
        for s, blk in rows.blocks(st):  # gathered in row blocks: no second [rows, every column] copy
            adj[target_row[s : s + blk.shape[0]]] = blk[:, keep_cols]
        on_disk = rows.on_disk
    finally:
        rows.close()
    sel = selected.numpy()
    labels = [adapter.token_label(t) for t in adapter.tokenizer.convert_ids_to_tokens(ids.tolist())]
    return Graph(
        ids=ids.tolist(),
        tokens=labels,
        features=feat_arr[sel],
        activations=ctx.acts[sel],
        n_layers=L,
        logit_ids=logit_ids.numpy(),
        logit_probs=logit_p.numpy(),
        logit_labels=[adapter.output_label(int(i)) for i in logit_ids],
        rows=adj,
        error_norms=ctx.errors.norm(dim=-1).numpy(),
        n_active=n_act,
        info={
            "zero_bos": ctx.skip_bos,
            "batch_size": B,
            "max_feature_nodes": max_feature_nodes,
            "rows_on_disk": on_disk,
            "rows_bytes": 4 * (K + cap) * (n_cols + K),
        },
    )


class RowStore:
    """The graph's rows buffer, a zero float32 ``[n_rows, n_cols]`` matrix: in memory when it takes at most
    ``in_memory`` bytes, else in a temporary file (written and read in row blocks; removed by :meth:`close`),
    so the graph's memory stays bounded by its other parts and the rows cost disk and page-cache traffic
    instead (each influence re-ranking reads the rows computed so far twice)."""

    def __init__(self, n_rows: int, n_cols: int, in_memory: float = float("inf")) -> None:
        self.shape = (n_rows, n_cols)
        size = 4 * n_rows * n_cols
        self.mem: torch.Tensor | None = None
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        if size <= in_memory:
            self.mem = torch.zeros(n_rows, n_cols, dtype=torch.float32)
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="streetlamp-graph-rows-")
        free = shutil.disk_usage(self.tmp.name).free
        if size > free:
            self.close()
            raise StreetlampError(
                f"the graph's rows take {size / 2**30:.1f} GiB, more than the {in_memory / 2**30:.1f} GiB allowed in "
                f"memory, and the temporary folder has {free / 2**30:.1f} GiB free: lower --max-feature-nodes or "
                "raise --rows-memory-gb"
            )
        self.file = open(Path(self.tmp.name) / "rows.f32", "w+b")  # noqa: SIM115 - closed by close()
        self.file.truncate(size)  # a sparse file: zeros

    @classmethod
    def wrap(cls, rows: torch.Tensor) -> RowStore:
        store = cls.__new__(cls)
        store.shape, store.mem, store.tmp = tuple(rows.shape), rows, None  # type: ignore[assignment]
        return store

    @property
    def on_disk(self) -> bool:
        return self.mem is None

    def write(self, start: int, block: torch.Tensor) -> None:
        """Rows ``start …`` ← ``block`` (whole rows)."""
        if self.mem is not None:
            self.mem[start : start + block.shape[0]] = block
            return
        self.file.seek(4 * start * self.shape[1])
        self.file.write(block.to(torch.float32).contiguous().numpy().tobytes())

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` (a view in memory, a fresh tensor from the file)."""
        if self.mem is not None:
            return self.mem[start:stop]
        n = self.shape[1]
        self.file.seek(4 * start * n)
        out = torch.empty(stop - start, n, dtype=torch.float32)
        self.file.readinto(out.numpy().data)  # type: ignore[arg-type]
        return out

    def blocks(self, stop: int, target_bytes: int = 1 << 26) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, rows[start:start + step])`` for the rows ``:stop``, ~``target_bytes`` at a time."""
        step = max(1, target_bytes // (4 * self.shape[1]))
        for s in range(0, stop, step):
            yield s, self.read(s, min(stop, s + step))

    def close(self) -> None:
        self.mem = None
        if self.tmp is not None:
            if hasattr(self, "file"):
                self.file.close()
            self.tmp.cleanup()
            self.tmp = None


def partial_influences(
    rows: RowStore | torch.Tensor, logit_p: torch.Tensor, row_node: torch.Tensor, row_abs: torch.Tensor, n_cols: int
) -> torch.Tensor:
    """Influence on the logits of every column, from the rows computed so far (circuit-tracer's
    ``compute_partial_influences``: ``prod ← prod[row_node] @ Â``, ``Â = |rows| / rowsum``, from the logits'
    probabilities, summed until it vanishes; a DAG, so at most its depth).

    ``prod[row_node]`` reads only the nodes that have rows, so the sum is ``(Σ_k P_k) @ Â`` where ``P_k`` lives on
    the rows and ``P_{k+1} = P_k @ Â[:, row_node]``: the iteration runs on the square ``rows × rows`` block and the
    wide ``Â`` is read once, in row chunks, never copied whole. ``rows[:, :n_cols]`` are the source columns;
    a row whose node is ``n_cols + k`` is logit ``k``. ``rows``: the first ``len(row_node)`` rows of a
    :class:`RowStore` (or a tensor of them)."""
    store = rows if isinstance(rows, RowStore) else RowStore.wrap(rows)
    m = len(row_node)
    inv = 1.0 / row_abs.clamp(min=1e-8)
    is_feature = row_node < n_cols
    sub = torch.empty(m, m, dtype=torch.float32)  # Â[r, column of row r'] (a logit's column is zero: nobody's source)
    for s, blk in store.blocks(m):
        sub[s : s + blk.shape[0]] = blk[:, row_node]
    sub.abs_().mul_(inv[:, None])
    P = torch.zeros(m, dtype=torch.float32)
    P[~is_feature] = logit_p.float()[row_node[~is_feature] - n_cols]
    total = P.clone()
    for _ in range(10_000):
        P = P @ sub
        if not P.any():
            break
        total += P
    else:
        raise StreetlampError("influence did not converge: the graph has a cycle")
    w = total * inv
    infl = torch.zeros(n_cols, dtype=torch.float32)
    for s, blk in store.blocks(m):
        infl += w[s : s + blk.shape[0]] @ blk[:, :n_cols].abs()
    return infl
