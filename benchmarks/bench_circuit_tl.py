"""streetlamp's EAP against TransformerLens 4's edge attribution patching, timed (issue 24's "Speed":
no slower than TransformerLens on the same model and prompts).

TransformerLens refuses edge attribution under grouped-query attention (``_check_kv_heads_match_query_heads``:
"its K/V inputs are not per query head"), and SmolLM2-135M is grouped (9 query heads, 3 key/value groups). So
the peer runs on a GPT-2 of SmolLM2's shape, built here at random in float32 (30 layers, 9 heads, d_model
576, MLP 1536, SmolLM2's tokenizer and vocabulary), saved as a local Hugging Face folder and booted by
``TransformerBridge`` as tests/interventions/test_circuit_transformerlens.py does, on the IOI prompts.
TransformerLens lives in the test-only ``.tl-venv`` and runs in a subprocess (benchmarks/tl_eap_peer.py).
Absolute seconds of two processes on a shared machine are not comparable alone, so each side also times the
Hugging Face model's own forward + backward of the same batch in its own process and the ratios are printed
beside the seconds (and the load average).

    /work/bin/cpu env PYTHONPATH=src .venv/bin/python benchmarks/bench_circuit_tl.py [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load, threads, timeit  # noqa: E402

from streetlamp.interventions.circuits import scores as S  # noqa: E402
from streetlamp.interventions.circuits.blocks import Blocks  # noqa: E402
from streetlamp.interventions.circuits.tasks import IOI_TEMPLATES, encode_pairs, ioi  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".tl-venv" / "bin" / "python"


def gpt2_like_smollm2(tok, layers: int, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=256, n_embd=576, n_layer=layers, n_head=9, n_inner=1536,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    n_threads = threads(1)
    import streetlamp
    from streetlamp.models.adapter import ModelAdapter

    tok = streetlamp.load("smollm2-135m").tokenizer
    model = gpt2_like_smollm2(tok, args.layers)
    adapter = ModelAdapter(model, tok, "random-gpt2-smollm2-shape")
    blocks = Blocks(adapter)
    # one template, so every prompt has one length: TransformerLens' batch and ours hold no padding
    pairs = encode_pairs(adapter, ioi(args.prompts, seed=0, templates=IOI_TEMPLATES[:1]))
    g = blocks.graph
    print(
        f"model: random GPT-2 of SmolLM2-135M's shape ({args.layers} layers, 9 heads, d_model 576, float32); "
        f"{len(pairs)} IOI prompts (first template), {pairs.clean.input_ids.shape[1]} positions; {g.n_edges} edges; "
        f"{n_threads} thread(s); {load()}"
    )
    assert bool(pairs.clean.attention_mask.all()), "IOI prompts of one length: no padding for either side"
    rows = torch.arange(len(pairs))

    def fwd_bwd() -> None:
        lg = model(pairs.clean.input_ids).logits[:, -1]
        (lg[rows, pairs.answer] - lg[rows, pairs.wrong]).sum().backward()
        model.zero_grad(set_to_none=True)

    base, _, _ = timeit(fwd_bwd, repeat=args.repeat)
    ours, _, _ = timeit(lambda: S.eap(blocks, pairs, batch_size=len(pairs)), repeat=args.repeat)
    print(f"  streetlamp: forward + backward {base:.2f} s; EAP {ours:.2f} s = {ours / base:.2f} x; {load()}")
    if not PEER.exists():
        print(f"  TransformerLens: not installed in {PEER.parent.parent} (make tl-venv)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        spec = {
            "clean": pairs.clean.rows(),
            "corrupt": pairs.corrupt.rows(),
            "answer": pairs.answer.tolist(),
            "wrong": pairs.wrong.tolist(),
        }
        (Path(tmp) / "pairs.json").write_text(json.dumps(spec))
        cmd = [str(PEER), str(ROOT / "benchmarks" / "tl_eap_peer.py"), str(folder), str(Path(tmp) / "pairs.json")]
        out = subprocess.run([*cmd, str(args.repeat), str(n_threads)], capture_output=True, text=True, cwd=tmp)
    if out.returncode:
        print("  TransformerLens failed:\n" + out.stderr[-3000:])
        return
    tl = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"  TransformerLens {tl['version']}: forward + backward {tl['fwd_bwd']:.2f} s; EAP {tl['eap']:.2f} s = "
        f"{tl['eap'] / tl['fwd_bwd']:.2f} x ({tl['edges']} edges: q/k/v per head); {load()}"
    )
    print(
        f"  EAP time, TransformerLens / streetlamp: {tl['eap'] / ours:.2f} (seconds), "
        f"{(tl['eap'] / tl['fwd_bwd']) / (ours / base):.2f} (each over its own process's forward + backward)"
    )


if __name__ == "__main__":
    main()
