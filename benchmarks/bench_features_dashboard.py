"""``streetlamp features``'s cost: a feature dashboard over N corpus sequences, wall time and peak memory.

Each size runs in a fresh child process (its peak RSS is its own) through the CLI: the text's features, the
corpus streamed in batches (per feature only the top contexts and the decile reservoir kept), the contexts'
second pass, the promoted tokens, the files and report.html. Bounded memory shows as a peak RSS that does not
grow with the number of sequences. Without ``--features`` the dictionaries are random transcoders of the given
``--width`` at ``--layers`` (the cost does not depend on what the latents mean, only on the width and how many
dictionaries are spliced: the corpus pass records only the dictionaries holding the shown features).

    /work/bin/cpu .venv/bin/python benchmarks/bench_features_dashboard.py --sizes 200,2000
    /work/bin/cpu .venv/bin/python benchmarks/bench_features_dashboard.py --model tiny --sizes 200,2000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load  # noqa: E402

TEXT = "When Mary and John went to the store, John gave a drink to"


def random_transcoders(folder: Path, model: str, width: int, layers: list[int]) -> Path:
    """Random transcoders whose bias is -2 rms of the layer's MLP input on TEXT: a pre-activation is about
    N(0, rms^2), so about 2% of the latents fire per token, as a trained dictionary's L0 would be."""
    import torch

    from streetlamp.features.activations import site_activations
    from streetlamp.features.dashboard import read_ids
    from streetlamp.models.dictionaries import save_features
    from streetlamp.models.features import Dictionary, FeatureSet
    from streetlamp.models.loading import load as load_model

    adapter = load_model(model)
    d = adapter.d_model
    acts = site_activations(adapter, torch.tensor([read_ids(adapter, TEXT)]), layers, "mlp")
    g = torch.Generator().manual_seed(0)
    dicts = {
        (l, "mlp"): Dictionary(
            l,
            "mlp",
            torch.randn(d, width, generator=g) / d**0.5,
            torch.full((width,), -2.0 * float(acts[l][0][0, 1:].pow(2).mean().sqrt())),
            torch.randn(width, d, generator=g) / width**0.5,
            torch.zeros(d),
        )
        for l in layers
    }
    save_features(FeatureSet(dicts, source="random"), folder)
    return folder


def child(a: argparse.Namespace, n: int) -> dict:
    from streetlamp.cli import main

    out = Path(a.work) / f"run-{n}"
    argv = ["features", TEXT, "--model", a.model_path, "--features", a.features, "--data", a.data]
    argv += ["--sequences", str(n), "--seq-len", str(a.seq_len), "--top", str(a.top), "--out", str(out)]
    argv += ["--overwrite"] + (["--batch-size", str(a.batch_size)] if a.batch_size else [])
    t0 = time.perf_counter()
    assert main(argv) == 0
    wall = time.perf_counter() - t0
    m = json.loads((out / "manifest.json").read_text())
    return {
        "sequences": m["corpus"]["sequences"],
        "tokens": m["corpus"]["tokens"],
        "seconds": round(wall, 1),
        "tokens_per_second": round(m["corpus"]["tokens"] / wall, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "report_mb": round((out / "report.html").stat().st_size / 2**20, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="an embedded model, a folder, or 'tiny' (a tiny Llama)")
    ap.add_argument("--features", default=None, help="a dictionary folder (default: random transcoders)")
    ap.add_argument("--layers", default="10,20")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--sizes", default="200,2000")
    ap.add_argument("--data", default="mix")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--child", type=int, default=None)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    if a.child is not None:
        print("RESULT " + json.dumps(child(a, a.child)), flush=True)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-features-"))
    model = a.model
    if model == "tiny":
        from streetlamp.models.tiny import save_tiny

        model = str(save_tiny("llama", work / "tiny", seed=1))
        layers = [0, 1]
    else:
        layers = [int(x) for x in a.layers.split(",")]
    features = a.features
    if features is None:
        features = str(random_transcoders(work / "dict", model, a.width, layers))
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        before = load()
        cmd = [sys.executable, __file__, "--child", str(n), "--model-path", model, "--features", features]
        cmd += ["--data", a.data, "--seq-len", str(a.seq_len), "--top", str(a.top), "--work", str(work)]
        cmd += ["--batch-size", str(a.batch_size)] if a.batch_size else []
        res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
        if res.returncode != 0 or not line:
            sys.exit(f"size {n} failed:\n{res.stderr[-3000:]}")
        r = json.loads(line[0][7:]) | {"load_before": before, "load_after": load()}
        rows.append(r)
        print(json.dumps(r), flush=True)
    info = {
        "model": a.model,
        "features": a.features or f"random transcoders width {a.width} at layers {layers}",
        "top": a.top,
        "seq_len": a.seq_len,
        "data": a.data,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "runs": rows,
    }
    if a.out:
        Path(a.out).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
