"""Attribution graph cost (issue 39): one prompt through SmolLM2-135M with a transcoder at every layer.

No trained transcoder set ships (docs/features-fit.md: 30 layers take hours here), so the set is random with
its encoder biases calibrated on the prompt itself so that each latent fires on ``--l0 / --width`` of the
tokens (about ``--l0`` active features per token and layer, the sparsity of circuit-tracer's released sets).
The cost of a graph is set by the number of active features and of visited rows, not by what they mean,
so the time and memory are those of a trained set of the same width and L0; the graph itself means nothing.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/bench_graph.py [--tokens 64] [--width 4096] [--l0 32]
        [--features DIR] [--audit] [--extra "--rows 1 --max-feature-nodes 300 --rows-memory-gb 0"]

``--features DIR``: a trained set (e.g. ``features-fit``'s folder) instead of the random one; the prompt is
``--tokens`` tokens of a repeated review sentence (``common.text_of_length``) either way.

Prints the seconds and the peak resident memory of ``streetlamp graph`` (a child process: its own peak),
with the number of active features, and the load average.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load, text_of_length  # noqa: E402


def calibrated_set(adapter, text: str, width: int, l0: int, folder: Path, seed: int = 0) -> int:
    """Random transcoders at every layer of ``adapter``, biases set so each latent fires on l0 / width of the
    prompt's tokens; written to ``folder``; returns the number of (token, layer, feature) activations."""
    from streetlamp.models.dictionaries import save_features
    from streetlamp.models.features import Dictionary, FeatureSet

    ins: dict[int, torch.Tensor] = {}
    hooks = [
        adapter.layer_modules[l].mlp.register_forward_pre_hook(lambda m, a, l=l: ins.__setitem__(l, a[0][0].detach()))
        for l in range(adapter.n_layers)
    ]
    try:
        with torch.no_grad():
            adapter.hf_model(input_ids=adapter.encode([text]).input_ids)
    finally:
        for h in hooks:
            h.remove()
    g = torch.Generator().manual_seed(seed)
    d = adapter.d_model
    dicts, active = {}, 0
    for l in range(adapter.n_layers):
        W_enc = torch.randn(d, width, generator=g) / d**0.5
        pre = ins[l].float() @ W_enc  # [tokens, width]
        b_enc = -torch.quantile(pre, 1 - l0 / width, dim=0)
        active += int(((pre + b_enc) > 0).sum())
        W_dec = torch.randn(width, d, generator=g) / width**0.5
        dicts[(l, "mlp")] = Dictionary(l, "mlp", W_enc, b_enc, W_dec, torch.zeros(d))
    save_features(FeatureSet(dicts, source=f"random, calibrated to L0 {l0} on the prompt"), folder)
    return active


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--l0", type=int, default=32)
    ap.add_argument("--audit", action="store_true", help="also run the audit on the real model")
    ap.add_argument("--extra", default="", help="more graph options, e.g. '--max-feature-nodes 2000'")
    ap.add_argument(
        "--features",
        default=None,
        help="an existing transcoder folder (e.g. a features-fit run) instead of the random set",
    )
    a = ap.parse_args()
    import streetlamp

    adapter = streetlamp.load(a.model)
    text = text_of_length(adapter, a.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.features) if a.features else Path(tmp) / "tc"
        active = 0 if a.features else calibrated_set(adapter, text, a.width, a.l0, folder)
        del adapter
        cmd = [sys.executable, "-m", "streetlamp", "graph", text, "--model", a.model, "--features", str(folder)]
        cmd += ["--out", str(Path(tmp) / "run")] + ([] if a.audit else ["--no-audit"]) + a.extra.split()
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        secs = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB (Linux)
        if r.returncode:
            print(r.stderr[-2000:])
            raise SystemExit(r.returncode)
        print("\n".join(r.stdout.strip().splitlines()[:6]))
    where = (
        f"transcoders from {a.features}"
        if a.features
        else f"{a.width}-wide transcoders at every layer, {active} active features (L0 {a.l0} per token and layer)"
    )
    print(
        f"graph {a.model}: {a.tokens} tokens, {where}{', audit' if a.audit else ''} {a.extra}: {secs:.0f} s, peak "
        f"{peak:.2f} GiB (the graph command's process); {load()}"
    )


if __name__ == "__main__":
    main()
