"""Pruning by influence and the graph's replacement and completeness scores (circuit-tracer's ``prune_graph``
and ``compute_graph_scores``, transcribed; METHODS.md §13).

- ``normalize(A)``: ``|A|`` with each row (target) divided by its sum (clamped at 1e-10): the share of a
  target's direct inputs that each source has. Everything here works on the graph's target rows
  (:attr:`Graph.rows`, features and logits); an error or token node's row is empty.
- ``influence(Â, w) = w Â + w Â² + … = w ((I − Â)^{-1} − I)``: the total (direct and indirect) influence of every
  node on the logits, from the logit weights ``w`` (the logits' probabilities at the logit nodes). The graph
  is a DAG, so the series ends after its depth.
- **node pruning**: keep the fewest nodes, by influence, whose cumulative share reaches ``node_threshold``
  (default 0.8); tokens and logits always kept. **Edge pruning**: on the node-pruned matrix, an edge's
  score is ``Â[t, s] · (influence(t) + w(t))``; keep the fewest edges whose cumulative share reaches
  ``edge_threshold`` (default 0.98). Then repeatedly drop feature and error nodes with no kept outgoing
  edge and features with no kept incoming edge (and their edges) until nothing changes.
- **replacement score**: of the influence that the tokens and the error nodes have on the logits, the
  tokens' share (error influence is influence the features did not explain).
- **completeness score**: ``Σ_n (1 − Σ_{errors} Â[n, e]) (influence(n) + w(n)) / Σ_n (influence(n) + w(n))``:
  each node's input share that does not come straight from an error node, weighted by its influence.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ...errors import StreetlampError
from .attribution import Graph

__all__ = ["Pruned", "find_threshold", "graph_scores", "influence", "normalize", "prune", "top_paths"]


def normalize(A: torch.Tensor) -> torch.Tensor:
    """``|A|`` with each row divided by its sum (float64, a new tensor: one ``[n, n]`` copy, worked in place)."""
    return _normalize_(A.to(torch.float64, copy=True))


def _normalize_(m: torch.Tensor) -> torch.Tensor:
    m.abs_()
    return m.div_(m.sum(1, keepdim=True).clamp_(min=1e-10))


def influence(
    A: torch.Tensor, weights: torch.Tensor, row_nodes: torch.Tensor | None = None, max_iter: int = 10_000
) -> torch.Tensor:
    """``w A + w A² + …`` (the rows of ``A`` are targets): each node's total influence on what ``w`` weighs.
    ``A`` is square, or the target rows ``[len(row_nodes), n_nodes]`` of the square matrix (``row_nodes``: the
    node of each row; the other rows are empty)."""
    take = (lambda v: v) if row_nodes is None else (lambda v: v[row_nodes])
    cur = take(weights.double()) @ A
    total = cur.clone()
    for _ in range(max_iter):
        cur = take(cur) @ A
        if not cur.any():
            return total
        total += cur
    raise StreetlampError("influence did not converge: the graph has a cycle")


def find_threshold(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """The score at which the scores sorted in descending order first reach ``threshold`` of their total.
    Only the positive scores are sorted (zeros add nothing to the total; an ``[n, n]`` matrix of edge scores is
    mostly zeros): a zero score is never kept, at threshold 1 either (+inf when no score is positive)."""
    s = scores.flatten()
    s = s[s > 0]
    if not s.numel():
        return torch.tensor(float("inf"), dtype=scores.dtype)
    s = torch.sort(s, descending=True).values
    cum = torch.cumsum(s, 0) / s.sum()
    i = int(torch.searchsorted(cum, torch.tensor(threshold, dtype=cum.dtype)))
    return s[min(i, len(s) - 1)]


class Pruned(NamedTuple):
    node_mask: torch.Tensor  # [n_nodes] bool
    edge_mask: torch.Tensor  # [n_rows, n_nodes] bool: the kept edges (row of Graph.rows = target, source)
    cumulative: torch.Tensor  # [n_nodes] each node's cumulative influence share in descending order
    node_influence: torch.Tensor  # [n_nodes]
    row_nodes: torch.Tensor  # [n_rows] the target node of each edge_mask row

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kept edges as (target node, source node, row of Graph.rows), by target then source."""
        r, s = np.nonzero(self.edge_mask.numpy())
        return self.row_nodes.numpy()[r], s, r


def _check(t: float, name: str) -> None:
    if not 0 < t <= 1:
        raise StreetlampError(f"{name} {t:g} is outside (0, 1]: it is the fraction of influence kept")


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    _check(node_threshold, "node threshold")
    _check(edge_threshold, "edge threshold")
    A, rn = graph.rows, graph.row_nodes
    w = graph.logit_weights()
    n_keep = graph.n_logits + graph.n_pos  # tokens and logits: the last nodes
    node_inf = influence(normalize(A), w, rn)
    node_mask = node_inf >= find_threshold(node_inf, node_threshold)
    node_mask[-n_keep:] = True
    # one float64 [rows, n] at a time (the graph's own float32 rows aside): pruned, normalised and scored in place
    pruned = A.to(torch.float64, copy=True)
    pruned[~node_mask[rn]] = 0
    pruned[:, ~node_mask] = 0
    An = _normalize_(pruned)
    reach = influence(An, w, rn) + w
    edge_scores = An.mul_(reach[rn][:, None])
    edge_mask = edge_scores >= find_threshold(edge_scores, edge_threshold)
    del An, edge_scores, pruned
    nf = graph.n_features  # rows[:nf] are the features' rows
    old = node_mask.clone()
    node_mask[:-n_keep] &= edge_mask[:, :-n_keep].any(0)
    node_mask[:nf] &= edge_mask[:nf].any(1)
    while not torch.equal(node_mask, old):
        old = node_mask.clone()
        edge_mask[~node_mask[rn]] = False
        edge_mask[:, ~node_mask] = False
        node_mask[:-n_keep] &= edge_mask[:, :-n_keep].any(0)
        node_mask[:nf] &= edge_mask[:nf].any(1)
    order = torch.argsort(node_inf, descending=True, stable=True)
    cum = torch.zeros_like(node_inf)
    cum[order] = torch.cumsum(node_inf[order], 0) / node_inf.sum()
    return Pruned(node_mask, edge_mask, cum, node_inf, rn)


def graph_scores(graph: Graph) -> tuple[float, float]:
    """(replacement score, completeness score) of the unpruned graph."""
    An = normalize(graph.rows)
    rn = graph.row_nodes
    w = graph.logit_weights()
    inf = influence(An, w, rn)
    e0, t0, l0 = graph.error_start, graph.token_start, graph.logit_start
    tok, err = float(inf[t0:l0].sum()), float(inf[e0:t0].sum())
    replacement = tok / (tok + err) if tok + err > 0 else 0.0
    non_error = torch.ones(graph.n_nodes, dtype=torch.float64)  # an error or token node has no inputs at all
    non_error[rn] = 1 - An[:, e0:t0].sum(1)
    out = inf + w
    completeness = float((non_error * out).sum() / out.sum())
    return replacement, completeness


def top_paths(graph: Graph, pruned: Pruned, k: int = 10, beam: int = 256) -> list[tuple[float, list[int]]]:
    """The ``k`` kept paths into the top logit that carry most influence: a path's score is the product of
    its edges' normalised shares ``Â[t, s]`` (on the pruned graph) times the logit's weight; a path ends at a
    token or an error node. Found by a beam search backwards from the logit (``beam`` partial paths)."""
    # one float64 [rows, n], worked in place
    An = graph.rows.to(torch.float64, copy=True)
    An.mul_(pruned.edge_mask)
    An = _normalize_(An)
    start = graph.logit_start
    partial: list[tuple[float, list[int]]] = [(float(graph.logit_probs[0]), [start])]
    done: list[tuple[float, list[int]]] = []
    for _ in range(graph.n_layers + 2):
        nxt: list[tuple[float, list[int]]] = []
        for score, path in partial:
            r = graph.row(path[0])
            assert r is not None  # a path grows from a feature or the logit
            row = An[r]
            for s in torch.nonzero(row).view(-1).tolist():
                item = (score * float(row[s]), [s, *path])
                (done if graph.kind(s) in ("token", "error") else nxt).append(item)
        partial = sorted(nxt, key=lambda t: -t[0])[:beam]
        if not partial:
            break
    return sorted(done, key=lambda t: -t[0])[:k]
