"""TransformerLens 4's edge attribution patching, timed: run by the test-only ``.tl-venv`` interpreter from
``bench_circuit_tl.py`` (never imported by streetlamp). Prints one JSON line: the median seconds of the
model's own forward + backward of the whole batch (Hugging Face's model that the bridge wraps, in this
process) and of ``attribution_patch(granularity="edge")`` over every pair (TransformerLens scores one pair
per forward/backward and takes a per-example metric, so the pairs are its loop), the edge count, the version.

Usage: ``.tl-venv/bin/python benchmarks/tl_eap_peer.py MODEL_DIR PAIRS.json REPEAT THREADS``.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from common import timeit  # benchmarks/common.py: torch and the standard library only, so this venv runs it
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> None:
    model_dir, pairs_file, repeat, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    pairs = json.loads(open(pairs_file).read())
    clean, corrupt = torch.tensor(pairs["clean"]), torch.tensor(pairs["corrupt"])
    ans, wrong = torch.tensor(pairs["answer"]), torch.tensor(pairs["wrong"])
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = torch.arange(len(clean))

    def fwd_bwd() -> None:
        lg = hf(clean).logits[:, -1]
        (lg[rows, ans] - lg[rows, wrong]).sum().backward()
        hf.zero_grad(set_to_none=True)

    base = timeit(fwd_bwd, repeat)[0]
    tok = AutoTokenizer.from_pretrained(model_dir)
    bridge = TransformerBridge.boot_transformers(model_dir, dtype=torch.float32, tokenizer=tok, device="cpu")
    bridge.eval()
    n_edges = [0]

    def eap() -> None:
        for i in range(len(clean)):
            a, w = int(ans[i]), int(wrong[i])

            def metric(logits: torch.Tensor, a: int = a, w: int = w) -> torch.Tensor:
                return logits[0, -1, a] - logits[0, -1, w]

            # roles swapped as in tests/helpers/tl_peer.py: the gradient at our clean prompt
            res = attribution_patch(
                bridge, corrupt[i : i + 1], clean[i : i + 1], metric, EdgeAttributionConfig(granularity="edge")
            )
            n_edges[0] = len(res.edge_scores)

    t = timeit(eap, repeat)[0]
    print(json.dumps({"version": version("transformer-lens"), "fwd_bwd": base, "eap": t, "edges": n_edges[0]}))


if __name__ == "__main__":
    main()
