"""TransformerLens 4's edge attribution patching on a local Hugging Face folder, run by the test-only
``.tl-venv`` interpreter (tests/interventions/test_circuit_transformerlens.py): never imported by streetlamp.

Usage: ``.tl-venv/bin/python tests/helpers/tl_peer.py MODEL_DIR PAIRS.json OUT.json``. PAIRS.json:
``{"clean": [[ids]], "corrupt": [[ids]], "answer": [..], "wrong": [..]}``. TransformerLens takes the
gradient on its *corrupt* run and scores ``(a_clean - a_corrupt) · g``; streetlamp's EAP takes it at the
clean run and scores ``(z̃ - z) · g``. So TL is called with the roles swapped (its clean = our corrupt),
which makes its score ours. Its edges are per position; they are summed here. OUT.json: the version and
``[[writer, reader, input, score]]`` in streetlamp's names.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch
from transformers import AutoTokenizer


def name(node) -> tuple[str, str]:
    k = node.kind
    if k == "embed":
        return "embed", ""
    if k == "attn_head_out":
        return f"L{node.layer}.H{node.head}", ""
    if k == "mlp_out":
        return f"L{node.layer}.MLP", ""
    if k in ("q_input", "k_input", "v_input"):
        return f"L{node.layer}.H{node.head}", k[0]
    if k == "mlp_in":
        return f"L{node.layer}.MLP", "mlp"
    return "logits", "logits"


def main() -> None:
    model_dir, pairs_file, out_file = sys.argv[1:4]
    pairs = json.loads(open(pairs_file).read())
    tok = AutoTokenizer.from_pretrained(model_dir)
    bridge = TransformerBridge.boot_transformers(model_dir, dtype=torch.float64, tokenizer=tok, device="cpu")
    bridge.eval()
    total: dict[tuple[str, str, str], float] = {}
    for i in range(len(pairs["clean"])):
        a, w = pairs["answer"][i], pairs["wrong"][i]

        def metric(logits: torch.Tensor, a: int = a, w: int = w) -> torch.Tensor:
            return logits[0, -1, a] - logits[0, -1, w]

        res = attribution_patch(
            bridge,
            torch.tensor([pairs["corrupt"][i]]),  # TL's clean: our corrupted prompt (see the docstring)
            torch.tensor([pairs["clean"][i]]),  # TL's corrupt: our clean prompt (the gradient is taken here)
            metric,
            EdgeAttributionConfig(granularity="edge"),
        )
        for (src, dst), s in res.edge_scores.items():
            key = (name(src)[0], *name(dst))
            total[key] = total.get(key, 0.0) + float(s) / len(pairs["clean"])
    rows = [[k[0], k[1], k[2], v] for k, v in sorted(total.items())]
    open(out_file, "w").write(json.dumps({"version": version("transformer-lens"), "edges": rows}))


if __name__ == "__main__":
    main()
