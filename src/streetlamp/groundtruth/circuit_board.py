"""The circuit part of the ground-truth leaderboard: each circuit method's edge precision and recall
against a known circuit, at each circuit size (issue 24 item 6).

Known circuits (:func:`known_circuits`): the two planted models of :mod:`.circuits` (``planted-copy``,
``planted-induction``: edges known by construction) and the trained attention-only induction model of
:mod:`.circuit_train` (``trained-induction``: its previous-token and induction heads found by ablation).
For every method the circuit at size k is the engine's (:func:`streetlamp.interventions.circuits.
faithfulness.circuit`: the top-k edges by |score|, pruned); precision = |found ∩ truth| / |found|,
recall = |found ∩ truth| / |truth|; the same over the heads and MLPs the circuits join (``node_precision``,
``node_recall``). Sizes: the fractions of the sweep and ``k = |truth|`` (the row with
``size_fraction`` = |truth| / edges and ``at_truth_size`` True).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..interventions.circuits import corrections as X
from ..interventions.circuits import faithfulness as F
from ..interventions.circuits import flow as FL
from ..interventions.circuits import scores as S
from ..interventions.circuits.blocks import Blocks
from ..interventions.circuits.graph import Graph
from ..interventions.circuits.tasks import PairSet, encode_pairs
from .circuits import KnownCircuit, edge_mask, planted

COLUMNS = [
    "model",
    "method",
    "size_fraction",
    "at_truth_size",
    "n_edges_requested",
    "n_edges",
    "precision",
    "recall",
    "node_precision",
    "node_recall",
    "truth_edges",
    "graph_edges",
    "n_prompts",
    "error",
]
SIZES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
METHODS = ("eap", "eap-ig-inputs", "eap-ig-activations", "exact", "flow-routes", "eap-qk", "graddrop")


def _graddrop(b: Blocks, p: PairSet) -> S.EdgeScores:
    out = X.graddrop(b, p)
    assert isinstance(out, S.EdgeScores)  # per_layer=False: one score set
    return out


def method_scores(name: str) -> Callable[[Blocks, PairSet], S.EdgeScores]:
    """The edge-score function of a method name (the engine's; patching ablation, logit difference)."""
    table: dict[str, Callable[[Blocks, PairSet], S.EdgeScores]] = {
        "eap": lambda b, p: S.eap(b, p),
        "eap-ig-inputs": lambda b, p: S.eap_ig(b, p, steps=5),
        "eap-ig-activations": lambda b, p: S.eap_ig(b, p, steps=5, mode="activations"),
        "exact": lambda b, p: S.exact(b, p),
        "flow-routes": lambda b, p: FL.flow_routes(b, p),
        "eap-qk": lambda b, p: X.eap_qk(b, p),
        "graddrop": _graddrop,
    }
    if name not in table:
        raise ValueError(f"no circuit method {name!r} on the leaderboard; have {sorted(table)}")
    return table[name]


def nodes_of(graph: Graph, mask: torch.Tensor) -> set[str]:
    """The heads and MLPs a circuit joins (a key/value group's reader counted as its heads)."""
    out: set[str] = set()
    for i, j in zip(*np.nonzero(mask.numpy())):
        out.add(graph.writers[j])
        out |= {graph.writers[o] for o in graph.readers[i].owners}
    return out - {"embed"}


def _node_pr(graph: Graph, found: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    f, t = nodes_of(graph, found), nodes_of(graph, truth)
    tp = len(f & t)
    return (tp / len(f) if f else float("nan")), (tp / len(t) if t else float("nan"))


def known_circuits(n: int = 8, seed: int = 0, trained: bool = True) -> list[KnownCircuit]:
    out = [planted("copy", n, seed), planted("induction", n, seed)]
    if trained:
        from .circuit_train import trained as load_trained

        out.append(load_trained(n, seed))
    return out


def score_rows(kc: KnownCircuit, methods: list[str], sizes: tuple[float, ...] = SIZES) -> list[dict]:
    """Leaderboard rows of one known circuit: per method and size, precision and recall."""
    b = Blocks(kc.adapter)  # type: ignore[arg-type]
    g = b.graph
    pairs = encode_pairs(kc.adapter, kc.pairs)  # type: ignore[arg-type]
    truth = edge_mask(g, kc.truth)
    nt, E = int(truth.sum()), g.n_edges
    rows = []
    for name in methods:
        base = {"model": kc.name, "method": name, "truth_edges": nt, "graph_edges": E, "n_prompts": len(pairs)}
        try:
            sc = method_scores(name)(b, pairs)
        except Exception as e:  # a method that fails is reported, as on the token leaderboard
            rows.append({**base, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
            continue
        ks = [(fr, max(1, int(round(fr * E))), False) for fr in sizes] + [(nt / E, nt, True)]
        for fr, k, at in sorted(ks):
            found = F.circuit(g, sc.mean, k)
            p, r = F.precision_recall(found, truth)
            np_, nr = _node_pr(g, found, truth)
            rows.append(
                {
                    **base,
                    "size_fraction": fr,
                    "at_truth_size": at,
                    "n_edges_requested": k,
                    "n_edges": int(found.sum()),
                    "precision": p,
                    "recall": r,
                    "node_precision": np_,
                    "node_recall": nr,
                    "error": "",
                }
            )
    return rows


def circuit_leaderboard(
    methods: list[str] | tuple[str, ...] = METHODS, n: int = 8, seed: int = 0, trained: bool = True
) -> list[dict]:
    return [r for kc in known_circuits(n, seed, trained) for r in score_rows(kc, list(methods))]
