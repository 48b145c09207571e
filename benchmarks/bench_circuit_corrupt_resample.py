"""One corrupted-inputs resample of EAP (``--resample corrupt``) on SmolLM2-135M with 64 IOI prompts, three
ways in one process, the load average beside each (issue 37 item 5):

* ``--old``: the loop before the fix, which called the score function once per size (MIB's ten: ten EAP
  passes per resample);
* one whole EAP pass per resample (clean forward, backward, corrupted forward, edge products);
* the clean forward and backward reused (``scores.EapCleanReuse`` through the command's
  ``methods.rescorer``: the corrupted forward and the edge products per resample), checked equal to the
  whole pass per prompt and edge (and the circuits at every size equal).

    /work/bin/cpu env PYTHONPATH=src .venv/bin/python benchmarks/bench_circuit_corrupt_resample.py [--old]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load  # noqa: E402

from streetlamp.commands.circuit import DEFAULT_SIZES  # noqa: E402
from streetlamp.commands.circuit.methods import edge_scores, rescorer, rows_of  # noqa: E402
from streetlamp.commands.circuit.run import _two_digit, task_pairs  # noqa: E402
from streetlamp.interventions.circuits import faithfulness as F  # noqa: E402
from streetlamp.interventions.circuits import resampling as RS  # noqa: E402
from streetlamp.interventions.circuits import tasks as T  # noqa: E402
from streetlamp.interventions.circuits.blocks import Blocks  # noqa: E402
from streetlamp.models.loading import load as load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--old", action="store_true", help="also time the loop before the fix (one EAP pass per size)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    a = load_model("smollm2-135m")

    def n_tokens(t: str) -> int:
        return len(a.tokenizer(t, add_special_tokens=False)["input_ids"])

    raw = task_pairs("ioi", args.prompts, 0, "patch", _two_digit(a), None, n_tokens)
    pairs = T.encode_pairs(a, raw)
    b = Blocks(a)
    g = b.graph
    sets = RS.corrupt_resamples(a, "ioi", raw, 2, 0)
    ks = [F.n_at(fr, g.n_edges) for fr in DEFAULT_SIZES]
    rows = rows_of(None, pairs, 16)
    print(f"SmolLM2-135M, {len(pairs)} IOI prompts x {pairs.clean.input_ids.shape[1]} positions, {g.n_edges} edges")

    def full(p: T.PairSet):
        return edge_scores(b, p, "eap", "patch", "logit_diff", 1, rows)

    if args.old:
        t, l0 = time.perf_counter(), load()
        [F.circuit(g, full(sets[0]).mean, k) for k in ks]
        print(f"before (a score pass per size, {len(ks)} sizes): {time.perf_counter() - t:.1f} s per resample, {l0}")
    t, l0 = time.perf_counter(), load()
    ref = [full(q) for q in sets]
    want = [[F.circuit(g, r.mean, k) for k in ks] for r in ref]
    print(f"one whole EAP pass: {(time.perf_counter() - t) / len(sets):.1f} s per resample, {l0}")
    fn = rescorer(b, pairs, "eap", "patch", "logit_diff", 1, None)
    t, l0 = time.perf_counter(), load()
    fn(pairs)
    print(f"reuse set-up (the clean forward and backward, once per axis): {time.perf_counter() - t:.1f} s, {l0}")
    t, l0 = time.perf_counter(), load()
    got = [fn(q) for q in sets]
    masks = [[F.circuit(g, r.mean, k) for k in ks] for r in got]
    print(f"clean run reused: {(time.perf_counter() - t) / len(sets):.1f} s per resample, {l0}")
    for x, y in zip(got, ref):
        d = float((x.per_prompt - y.per_prompt).nan_to_num().abs().max())
        print(
            f"max |reused - whole pass| over prompts and edges: {d:.3g} (scale {float(y.per_prompt.nan_to_num().abs().max()):.3g})"
        )
    same = all(torch.equal(m, w) for ms, ws in zip(masks, want) for m, w in zip(ms, ws))
    print(
        f"the same circuits at all {len(ks)} sizes: {same}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB"
    )


if __name__ == "__main__":
    main()
