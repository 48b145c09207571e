"""The measured differences quoted in docs/graphs.md ("Checked against circuit-tracer"): not a test (no
``test_`` file name, so the suite does not collect it); run ``pytest -q -s tests/interventions/
measure_graph_circuit_tracer.py`` (a path given on the command line is collected). Reuses the comparison's
fixture (test_graph_circuit_tracer.py)."""

from __future__ import annotations

import numpy as np
import torch

from tests.interventions.test_graph_circuit_tracer import MAX_NODES, QUEUE, U32, Pair, pairs  # noqa: F401


def test_measure(pairs: dict[str, Pair]) -> None:  # noqa: F811 - the imported fixture
    for name, p in pairs.items():
        g, t = p.ours, p.theirs
        sel = t["selected_features"].numpy()
        acts = t["activation_values"].double().numpy()[sel]
        da = np.abs(g.activations - acts).max() / np.abs(acts).max()
        lg = p.logits.double()
        dl = float((lg - t["tl_logits"].double()).abs().max() / lg.abs().max())
        dp = float(np.abs(g.logit_probs - t["logit_probs"].double().numpy()).max())
        A, B = g.adjacency.double(), t["adjacency"].double()
        d = (A - B).abs()
        beyond = float((d - 2 * U32 * B.abs()).clamp(min=0).max() / B.abs().max())
        print(
            f"{name}: {g.n_active} active, {g.n_nodes} nodes, {int((B != 0).sum())} edges, "
            f"{int((g.activations < 0).sum())} negative; activations {da:.2g}, logits {dl:.2g} (of the largest), "
            f"probabilities {dp:.2g}; edges: max |diff| {float(d.max()):.2g} on a largest {float(B.abs().max()):.3g} "
            f"({float(d.max() / B.abs().max()):.2g}), beyond the two float32 roundings {beyond:.2g} of the largest"
        )
    p = pairs["max_nodes"]
    n = p.ours.n_active
    first = p.theirs["influences_0"][:n]
    f = p.theirs["active_features"].numpy()
    zero = (first == 0).numpy()
    late = (f[:, 0] == 1) & (f[:, 1] < p.ours.n_pos - 1)
    print(
        f"influence exactly 0 at the first ranking: {int(zero.sum())}; the layer-1 features before the last "
        f"position: {int(late.sum())}; the same set: {bool((zero == late).all())}"
    )
    visited = torch.zeros(n, dtype=torch.bool)
    for r, mine in enumerate(p.rankings):
        b, a = p.theirs[f"influences_{r}"][:n].double(), mine[:n].double()
        rel = float(((a - b).abs() / torch.maximum(a, b).clamp(min=1e-300)).max())
        order = torch.argsort(b, descending=True, stable=True)
        order = order[~visited[order]]
        q = min(QUEUE, MAX_NODES - int(visited.sum()))
        gap = (float(b[order[q - 1]]) - float(b[order[q]])) / float(b[order[q - 1]])
        print(
            f"ranking {r}: influences {rel:.2g} apart (relative), cut gap {gap:.2g} (relative), "
            f"{int((b[order] > 0).sum())} unvisited features with nonzero influence"
        )
        visited[order[:q]] = True
