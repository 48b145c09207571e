"""How AttnLRP's skew to the ends of a text grows with its length, on SmolLM2-135M (docs/decoder.md).

For each of the first ``--texts`` reviews of a bundled data set with at least ``--max`` tokens, the
prefixes of ``--lengths`` tokens are explained (AttnLRP, the model's own next-token prediction at the
last position) and the first and last positions' shares of the total ``|relevance|`` are printed with
their multiples of a uniform share ``1/n`` and the first position's sign; gradient x input on the same
prefixes is the control. One JSON line per (text, length) with ``--json``::

    /work/bin/cpu env PYTHONPATH=src .venv/bin/python scripts/attnlrp_skew.py            # a table
    ... scripts/attnlrp_skew.py --json > docs/measurements/attnlrp-skew.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="drugs")
    ap.add_argument("--texts", type=int, default=6)
    ap.add_argument("--lengths", default="8,16,32,64,100")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    import streetlamp
    from streetlamp.data.loaders import load_dataset
    from streetlamp.methods.registry import get_method
    from streetlamp.models.adapter import Target

    torch.manual_seed(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    adapter = streetlamp.load(args.model)
    texts = []
    for ex in load_dataset(args.data).examples:
        ids = adapter.tokenizer(ex.text)["input_ids"]
        if len(ids) >= max(lengths):
            texts.append((ex.id, ids))
        if len(texts) == args.texts:
            break
    methods = {"attnlrp": get_method("attnlrp"), "gradient_x_input": get_method("gradient_x_input")}
    rows = []
    for eid, ids in texts:
        for n in lengths:
            text = adapter.tokenizer.decode(ids[:n])
            inputs = adapter.encode(text)
            row = {"example": eid, "n_tokens": int(inputs.lengths[0]), "first_token": inputs.labels[0][0]}
            for name, m in methods.items():
                t0 = time.perf_counter()
                s = np.asarray(m.attribute(adapter, inputs, target=Target())[0].scores, np.float64)
                a = np.abs(s)
                k = len(s)
                row[name] = {
                    "first_share": float(a[0] / a.sum()),
                    "first_times_uniform": float(a[0] / a.sum() * k),
                    "first_sign": float(np.sign(s[0])),
                    "last_times_uniform": float(a[-1] / a.sum() * k),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if args.json:
        return
    print(f"{args.model}, {len(texts)} texts of {args.data}; shares of sum |R| (x uniform 1/n)")
    print("n_tokens | attnlrp first share (x uniform) [sign] | attnlrp last (x) | grad x input first (x) | last (x)")
    for n in lengths:
        sel = [r for r in rows if r["n_tokens"] and abs(r["n_tokens"] - n) <= 2]
        if not sel:
            continue

        def rng(key: str, method: str) -> str:
            v = [r[method][key] for r in sel]
            return f"{min(v):.3g}-{max(v):.3g}"

        signs = sorted({int(r["attnlrp"]["first_sign"]) for r in sel})
        print(
            f"{n:>8} | {rng('first_share', 'attnlrp')} ({rng('first_times_uniform', 'attnlrp')}) {signs} | "
            f"{rng('last_times_uniform', 'attnlrp')} | {rng('first_times_uniform', 'gradient_x_input')} | "
            f"{rng('last_times_uniform', 'gradient_x_input')}"
        )


if __name__ == "__main__":
    main()
