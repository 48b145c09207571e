"""The findings table of a ``cite-bench`` run folder (docs/citation.md): per method, over the correctly answered
questions, top-1 and top-3 hit of a planted source (mean, 95% percentile bootstrap interval from
``streetlamp.stats.bootstrap_ci`` as in ``recall.csv``, and the Wilson score interval, which does not
collapse to a point when every question is a hit), the planted source's median rank, and for the signed
methods the same hit rates ranking by ``|score|``.

    python benchmarks/cite_recall_table.py runs/recall1k
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from streetlamp.stats import bootstrap_ci


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def ranks(scores: list[float], planted: list[int]) -> list[int]:
    v = np.asarray(scores, np.float64)
    order = np.lexsort((np.arange(len(v)), -v))
    pos = np.empty(len(v), int)
    pos[order] = np.arange(1, len(v) + 1)
    return [int(pos[p]) for p in planted]


def main(folder: Path) -> None:
    recs = [json.loads(x) for p in sorted((folder / "records").glob("*.jsonl")) for x in p.read_text().splitlines()]
    ok = [r for r in recs if r.get("correct")]
    by_kind: dict[str, list[int]] = {}
    for r in recs:
        if "correct" in r:
            by_kind.setdefault(r["kind"], [0, 0])
            by_kind[r["kind"]][0] += int(r["correct"])
            by_kind[r["kind"]][1] += 1
    toks = [r["n_tokens"] for r in recs if "n_tokens" in r]
    srcs = [r["n_sources"] for r in recs if "n_sources" in r]
    print(
        f"{folder}: {len(recs)} questions, {len(ok)} answered correctly "
        f"({', '.join(f'{k} {a}/{b}' for k, (a, b) in by_kind.items())}); "
        f"{min(toks)}-{max(toks)} tokens, {min(srcs)}-{max(srcs)} sources"
    )
    methods = list(ok[0]["scores"]) if ok else []
    print("\n| method | top-1 hit | top-3 hit | median rank of the best planted source |")
    print("|---|---|---|---|")
    for m in methods + [f"|{m}|" for m in ("gradient_x_input", "integrated_gradients", "attnlrp") if m in methods]:
        best = []
        for r in ok:
            s = r["scores"][m.strip("|")]
            s = [abs(x) for x in s] if m.startswith("|") else s
            best.append(min(ranks(s, r["planted"])))
        best_a = np.array(best)
        cells = []
        for k in (1, 3):
            hit = (best_a <= k).astype(float)
            mean, lo, hi, n = bootstrap_ci(hit)
            wl, wh = wilson(int(hit.sum()), n)
            cells.append(f"{int(hit.sum())}/{n} = {mean:.2f} [{lo:.2f}, {hi:.2f}] (Wilson [{wl:.2f}, {wh:.2f}])")
        print(f"| {m} | {cells[0]} | {cells[1]} | {np.median(best_a):g} |")
    if "attention" in methods and "attention_nosink" in methods:
        a = [min(ranks(r["scores"]["attention"], r["planted"])) for r in ok]
        b = [min(ranks(r["scores"]["attention_nosink"], r["planted"])) for r in ok]
        same = sum(x == y for x, y in zip(a, b))
        print(
            f"\nsink: planted rank with the sink {a}, without {b}: same in {same}/{len(ok)}, better without in "
            f"{sum(y < x for x, y in zip(a, b))}, worse in {sum(y > x for x, y in zip(a, b))}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
