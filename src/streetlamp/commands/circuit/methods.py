"""Which scorer a circuit method name runs, and how many rows a forward pass takes: shared by the local
runner (:mod:`.circuit`) and the Ray actors (:mod:`.circuit_ray`), so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable

from ...errors import StreetlampError
from ...interventions.circuits import scores as S
from ...interventions.circuits import tasks as T
from ...interventions.circuits.blocks import Blocks


def rows_of(budget: int | None, pairs: T.PairSet, default: int) -> int:
    """Rows per forward pass from the ``--batch-size`` token budget (the padded length of the pairs)."""
    if budget is None:
        return default
    return max(1, budget // max(1, int(pairs.clean.input_ids.shape[1])))


def edge_scores(
    blocks: Blocks,
    pairs: T.PairSet,
    method: str,
    ablation: str,
    metric: str,
    steps: int,
    rows: int,
    reference: T.PairSet | None = None,
) -> S.EdgeScores:
    """``method``'s per-prompt scores; ``reference``: the prompts whose mean is mean ablation's value
    (default ``pairs``; ``--engine ray`` scores a batch at a time against the whole set)."""
    if method.endswith("-gim"):  # EAP / EAP-IG with GIM's backward (interventions/circuits/gim.py)
        from ...interventions.circuits.gim import gim

        with gim(blocks):
            sc = edge_scores(blocks, pairs, method.removesuffix("-gim"), ablation, metric, steps, rows, reference)
        return S.EdgeScores(method, sc.per_prompt, sc.ablation, sc.metric)
    if method == "eap":
        return S.eap(blocks, pairs, metric, ablation, batch_size=rows, reference=reference)
    if method.startswith("eap-ig-"):
        mode = method.removeprefix("eap-ig-")
        return S.eap_ig(blocks, pairs, steps, mode, metric, ablation, batch_size=rows, reference=reference)
    if method == "exact":
        return S.exact(blocks, pairs, metric, ablation, batch_size=rows, reference=reference)
    if method == "flow-routes":  # contribution-based, one clean forward (no corrupted input)
        from ...interventions.circuits.flow import flow_routes

        return flow_routes(blocks, pairs, ablation, metric)
    if method in ("eap-qk", "graddrop"):  # AtP*'s corrections
        from ...interventions.circuits import corrections as X

        fn = X.eap_qk if method == "eap-qk" else X.graddrop
        out = fn(blocks, pairs, metric, ablation, batch_size=rows, reference=reference)
        assert isinstance(out, S.EdgeScores)
        return out
    raise StreetlampError(f"unknown circuit method {method!r}")


def rescorer(
    blocks: Blocks, pairs: T.PairSet, method: str, ablation: str, metric: str, steps: int, budget: int | None
) -> Callable[[T.PairSet], S.EdgeScores]:
    """The score function of ``--resample``: ``method`` on a resampled pair set. Plain EAP under patching on
    a set with ``pairs``' clean side (the corrupt axis: only the corrupted prompts redrawn) reuses the clean
    forward and backward (:class:`.scores.EapCleanReuse`, built at the first such call: the same per-prompt
    scores); every other method and set is scored afresh."""
    reuse: list[S.EapCleanReuse] = []

    def score(p: T.PairSet) -> S.EdgeScores:
        if method == "eap" and ablation == "patch" and S.same_clean(p, pairs):
            if not reuse:
                reuse.append(S.EapCleanReuse(blocks, pairs, metric, rows_of(budget, pairs, 16)))
            return reuse[0](p)
        return edge_scores(blocks, p, method, ablation, metric, steps, rows_of(budget, p, 16))

    return score
