"""features-fit's cost on SmolLM2-135M, measured: activation collection and training throughput, memory per layer.

1. **collection**: one forward pass of ``--batch-seqs`` sequences of ``--seq-len`` tokens recording the MLP's input
   and output at every layer (:func:`streetlamp.features.activations.site_activations`): tokens per second (all 30
   layers come from the same pass);
2. **training**: Adam steps of one layer's transcoder at each ``--widths`` on ``--batch-tokens`` tokens: tokens
   per second per layer, and the training state per layer (weights, Adam's two moments, gradients: 4 copies of
   ``2 d width + width + d`` float32) beside the process's peak RSS;
3. the cost of a fit of all 30 layers on ``--full`` tokens: ``T = full / collect + 30 full / train``.

    /work/bin/cpu .venv/bin/python benchmarks/bench_features_fit.py [--widths 1024,4096] [--full 1000000]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from common import load, threads  # noqa: E402

from streetlamp.features.activations import build_corpus, site_activations  # noqa: E402
from streetlamp.features.train import FitConfig, LayerFit  # noqa: E402
from streetlamp.models.loading import load as load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="1024,4096")
    ap.add_argument("--activation", default="relu")
    ap.add_argument("--batch-seqs", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--full", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "features_fit_smollm2.json"))
    a = ap.parse_args()
    n_threads = threads()
    adapter = load_model("smollm2-135m")
    L = adapter.n_layers
    corpus = build_corpus(
        adapter, "mix", tokens=a.passes * a.batch_seqs * a.seq_len, seq_len=a.seq_len, heldout=1, seed=0
    )
    layers = list(range(L))
    site_activations(adapter, corpus.train[:1, :16], layers, "mlp")  # warm-up
    t0 = time.perf_counter()
    n_tok = 0
    acts = None
    for p in range(a.passes):
        ids = corpus.train[p * a.batch_seqs : (p + 1) * a.batch_seqs]
        acts = site_activations(adapter, ids, layers, "mlp")
        n_tok += ids.numel()
    collect = n_tok / (time.perf_counter() - t0)
    assert acts is not None
    x, y = (t.reshape(-1, t.shape[-1]).float() for t in acts[L // 2])
    x, y = x[: a.batch_tokens], y[: a.batch_tokens]
    rows = []
    for w in (int(v) for v in a.widths.split(",")):
        cfg = FitConfig(where="mlp", width=w, activation=a.activation, k=32 if a.activation == "topk" else None)
        f = LayerFit(L // 2, adapter.d_model, adapter.d_model, cfg, "cpu")
        f.init_from(x, y)
        f.step(x, y, 1.0)  # warm-up
        t1 = time.perf_counter()
        for _ in range(a.steps):
            f.step(x, y, 1.0)
        train = a.steps * x.shape[0] / (time.perf_counter() - t1)
        d = adapter.d_model
        state_mib = 4 * (2 * d * w + w + d) * 4 / 2**20
        total_h = (a.full / collect + L * a.full / train) / 3600
        rows.append(
            {
                "width": w,
                "activation": a.activation,
                "collect_tokens_per_s_all_layers": collect,
                "train_tokens_per_s_per_layer": train,
                "train_state_mib_per_layer": state_mib,
                "train_state_mib_30_layers": L * state_mib,
                "saved_mib_per_layer_bf16": (2 * d * w + w + d) * 2 / 2**20,
                "hours_30_layers_at_full_tokens": total_h,
                "full_tokens": a.full,
            }
        )
    info = {
        "model": "smollm2-135m",
        "threads": n_threads,
        "load": load(),
        "batch_seqs": a.batch_seqs,
        "seq_len": a.seq_len,
        "batch_tokens": a.batch_tokens,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": rows,
        "torch": torch.__version__,
    }
    Path(a.out).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
