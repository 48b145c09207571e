"""Long context: peak memory and time to record the explained row and its rollout, against Hugging
Face eager ``output_attentions=True``; exactness against a float64 reference where one fits.

Every case runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``, which torch's
allocations count in, unlike tracemalloc) is its own. Modes per (model, length):

* ``ours``: one forward with chunked attention keeping the explained row of every layer and head
  plus every layer's q/k on disk (``commands.explain.long.record``), then ``rollout_row`` from q/k;
* ``fused``: a forward with the fused kernel and no weights (``chunked.fused_long``), for scale;
* ``hf``: ``model(..., output_attentions=True)`` with Hugging Face's eager attention, run only when
  its estimate (``L·H·S²`` float32 returned + one layer's scores, probabilities and the mask) fits
  this session's share of the machine (:data:`HF_LIMIT`); otherwise the estimate is reported;
* ``ref``: float64 reference where it fits (``S <= 2048``): Hugging Face's eager attention in float64
  (each layer's weights captured by a hook and reduced at once), rollout by the existing
  ``rollout_matrix(residual_attention(...))``; compared with what ``ours`` wrote (float32).

Models: ``tiny-deep`` (Llama, 24 layers, 4 query / 2 key-value heads, d_model 64), ``smollm2-shape``
(Llama of SmolLM2-135M's shape: 30 layers, 9 / 3 heads, d_model 576, d_ffn 1536, vocab 49152, random
weights, positions raised to 32768) and ``smollm2-135m`` (the real model, up to its 8192 positions).

    OMP_NUM_THREADS=2 python benchmarks/bench_longctx.py --lengths 2048,8192,32768 \\
        --jsonl docs/measurements/longctx.jsonl --table docs/measurements/longctx.md
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

GIB = float(1 << 30)
HF_LIMIT = 10 * GIB  # this session's share of the shared 24 GiB machine (the brief: never over ~12 GiB)
REF_MAX_TOKENS = 2048
# --device/--dtype reach the per-case subprocesses through the environment
DEVICE = os.environ.get("LONGCTX_DEVICE", "cpu")
DTYPE = os.environ.get("LONGCTX_DTYPE", "float32")
MODELS = ("tiny-deep", "smollm2-shape", "smollm2-135m", "smollm2-shape-1layer")
MAX_TOKENS = {"smollm2-135m": 8192}
SHAPES = {
    "tiny-deep": dict(hidden_size=64, num_hidden_layers=24, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128),
    "smollm2-shape": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True),
}  # fmt: skip
# one layer of SmolLM2's shape: per-layer time and the peak memory at lengths where the 30-layer
# pass does not finish on 2 shared cores in the time available (the peak does not grow with depth:
# layers run one after another; time does, linearly)
SHAPES["smollm2-shape-1layer"] = {**SHAPES["smollm2-shape"], "num_hidden_layers": 1}


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: kilobytes


def build(model: str, n: int, dtype: str = "float32"):  # noqa: ANN201
    """(adapter, inputs) for ``n`` tokens: random ids for the random-weight shapes, real text for SmolLM2."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from streetlamp.models.adapter import Inputs, ModelAdapter

    if model == "smollm2-135m":
        import streetlamp

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import text_of_length

        adapter = streetlamp.load("smollm2-135m")
        adapter.hf_model.to(DEVICE, getattr(torch, dtype))
        return adapter, adapter.encode(text_of_length(adapter, n))
    from streetlamp.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer(encoder=False)
    cfg = dict(SHAPES[model])
    cfg.setdefault("vocab_size", len(tok))
    torch.manual_seed(0)
    hf = LlamaForCausalLM(
        LlamaConfig(max_position_embeddings=32768, pad_token_id=0, bos_token_id=2, eos_token_id=3, **cfg)
    )
    hf = hf.to(DEVICE, getattr(torch, dtype))
    adapter = ModelAdapter(hf.eval(), tok, model)
    ids = torch.randint(5, len(tok), (n,), generator=torch.Generator().manual_seed(1)).tolist()
    return adapter, Inputs.from_ids(adapter, [ids])


def commit() -> str:
    """The streetlamp commit measured (results from different code versions are told apart)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def progress_logger(what: str):  # noqa: ANN201
    """A callback writing ``what layer L: wall seconds since the last, CPU seconds of this process since the
    last, peak RSS, load`` to $LONGCTX_PROGRESS (if set): on a shared machine the CPU seconds say what the
    layer costs, the wall seconds what the load let it have."""
    path = os.environ.get("LONGCTX_PROGRESS")
    last = [time.perf_counter(), time.process_time()]

    def log(layer: int) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if path:
            with open(path, "a") as fh:
                fh.write(
                    f"{time.strftime('%H:%M:%S')} {what} layer {layer}: {now - last[0]:.1f} s wall, "
                    f"{cpu - last[1]:.1f} s cpu, peak {peak_gib():.3f} GiB, load {os.getloadavg()[0]:.1f}\n"
                )
        last[0], last[1] = now, cpu

    return log


def hf_estimate(adapter, n: int) -> float:  # noqa: ANN001
    L, H = adapter.n_layers, adapter.n_heads
    return (L * H * n * n + 3 * H * n * n + n * n) * 4


def run_one(model: str, n: int, mode: str, work: Path) -> dict:
    import numpy as np
    import torch

    from streetlamp.commands.explain.long import record
    from streetlamp.methods.long_rows import rollout_row
    from streetlamp.models.chunked import QKStore, Selection, fused_long

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    res0 = {"threads": torch.get_num_threads(), "load_at_start": round(os.getloadavg()[0], 1)}
    adapter, inputs = build(model, n, "float64" if mode == "ref" else DTYPE)
    if DEVICE != "cpu" or DTYPE != "float32":
        res0.update(device=DEVICE, dtype=DTYPE)
    n = inputs.lengths[0]
    pos = adapter.explained_position(n)
    res: dict = {
        "model": model,
        "tokens": n,
        "mode": mode,
        "rss_loaded_gib": round(peak_gib(), 3),
        "code": commit(),
        **res0,
    }
    if mode == "ours":
        sel = Selection(list(range(adapter.n_layers)), list(range(adapter.n_heads)), [pos])
        log = progress_logger(f"{model} {n} record")
        hooks = [
            m.register_forward_hook(lambda *_, i=i: log(i))  # type: ignore[misc]
            for i, m in enumerate(adapter.attn_modules)
        ]
        t0 = time.perf_counter()
        _, rec = record(adapter, inputs, work, sel)
        t1 = time.perf_counter()
        for h in hooks:
            h.remove()
        store = QKStore(work, rec.describe(), device=DEVICE)
        row = rollout_row(store, pos, progress=progress_logger(f"{model} {n} rollout"))
        t2 = time.perf_counter()
        (work / "section.json").write_text(json.dumps(rec.describe()))
        np.save(work / "rollout.npy", row)
        res.update(record_s=round(t1 - t0, 2), rollout_s=round(t2 - t1, 2))
        res["disk_gib"] = round(sum(p.stat().st_size for p in work.rglob("*.safetensors")) / GIB, 3)
    elif mode == "fused":
        t0 = time.perf_counter()
        with torch.no_grad(), fused_long(adapter):
            adapter.forward(inputs)
        res["forward_s"] = round(time.perf_counter() - t0, 2)
    elif mode == "hf":
        est = hf_estimate(adapter, n)
        res["estimate_gib"] = round(est / GIB, 2)
        if est > HF_LIMIT:
            res["skipped"] = f"estimate {est / GIB:.1f} GiB > {HF_LIMIT / GIB:.0f} GiB share" + (
                " (and > the machine's 24 GiB)" if est > 24 * GIB else ""
            )
            return res
        adapter.hf_model.set_attn_implementation("eager")
        t0 = time.perf_counter()
        with torch.no_grad():
            out = adapter.hf_model(input_ids=inputs.input_ids, output_attentions=True, logits_to_keep=1)
        res["forward_s"] = round(time.perf_counter() - t0, 2)
        assert len(out.attentions) == adapter.n_layers
    elif mode == "ref":
        if DEVICE != "cpu":
            raise SystemExit("the float64 reference runs on the CPU (--device cpu)")
        res.update(compare_reference(adapter, inputs, pos, work))
    res["peak_rss_gib"] = round(peak_gib(), 3)
    if DEVICE.startswith("cuda"):
        res["peak_device_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
    return res


def compare_reference(adapter, inputs, pos: int, work: Path) -> dict:  # noqa: ANN001
    """Float64 Hugging Face eager attention, reduced layer by layer; max |ours (float32) - reference|."""
    import numpy as np
    import torch
    from safetensors import safe_open

    from streetlamp.methods.rollout import residual_attention, rollout_matrix

    model = adapter.hf_model
    model.set_attn_implementation("eager")
    rows, a_hat = [], []

    def hook(module, args, output):  # noqa: ANN001, ANN202
        w = output[1][0].double()  # [H, S, S]
        rows.append(w[:, pos].numpy().copy())
        a_hat.append(residual_attention(w[None].numpy(), "mean")[0])

    handles = [m.register_forward_hook(hook) for m in adapter.attn_modules]
    try:
        with torch.no_grad():
            model(input_ids=inputs.input_ids, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    ref_rollout = rollout_matrix(np.stack(a_hat))[pos]
    section = json.loads((work / "section.json").read_text())
    err_rows = 0.0
    for s in section["shards"]:
        with safe_open(str(work / s["file"]), framework="np") as f:
            p = f.get_tensor("pattern")[:, s["rows"].index(pos)]
        err_rows = max(err_rows, float(np.abs(p.astype(np.float64) - rows[s["layer"]]).max()))
    ours = np.load(work / "rollout.npy")
    return {"max_err_rows": err_rows, "max_err_rollout": float(np.abs(ours - ref_rollout).max())}


def subprocess_case(model: str, n: int, mode: str, work: Path, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--one", model, str(n), mode, str(work)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "tokens": n, "mode": mode, "error": f"timeout after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
        return {"model": model, "tokens": n, "mode": mode, "error": f"exit {p.returncode}: {tail[0][:200]}"}
    res = json.loads(lines[-1])
    res["wall_s"] = round(wall, 1)
    return res


def table(results: list[dict]) -> str:
    head = (
        "| model | tokens | streetlamp: record row (s) | rollout row (s) | peak RSS (GiB) | q/k on disk (GiB) "
        "| fused forward (s) / peak (GiB) | HF eager output_attentions: time (s) / peak (GiB) "
        "| max err rows / rollout vs float64 |\n|" + " --- |" * 9
    )
    by: dict[tuple[str, int], dict[str, dict]] = {}
    for r in results:
        label = r["model"] + (f" ({r['device']}, {r['dtype']})" if r.get("device") else "")
        by.setdefault((label, r["tokens"]), {})[r["mode"]] = r
    out = [head]
    for (model, n), modes in by.items():
        o, f, h, ref = (modes.get(k, {}) for k in ("ours", "fused", "hf", "ref"))

        def cell(r: dict, key: str) -> str:
            return str(r.get(key, r.get("error", "–")))

        def peak(r: dict) -> str:  # on a GPU: host RSS / device peak
            dev = r.get("peak_device_gib")
            return cell(r, "peak_rss_gib") + (f" / {dev} on the device" if dev is not None else "")

        hf = h.get("skipped") or h.get("error") or (f"{h['forward_s']} / {h['peak_rss_gib']}" if h else "–")
        fu = f.get("error") or (f"{f['forward_s']} / {f['peak_rss_gib']}" if f else "–")
        ex = ref.get("error") or (
            f"{ref['max_err_rows']:.1e} / {ref['max_err_rollout']:.1e}" if ref else "no reference"
        )
        out.append(
            f"| {model} | {n} | {cell(o, 'record_s')} | {cell(o, 'rollout_s')} | {peak(o)} "
            f"| {cell(o, 'disk_gib')} | {fu} | {hf} | {ex} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=4, metavar=("MODEL", "TOKENS", "MODE", "WORK"), help=argparse.SUPPRESS)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--lengths", default="2048,8192,32768")
    ap.add_argument("--modes", default="ours,ref,fused,hf")
    ap.add_argument("--device", default=None, help="cpu (default) or cuda: where the model and the rows run")
    ap.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per case")
    ap.add_argument("--jsonl", default=None, help="append each case's result here as it finishes")
    ap.add_argument("--table", default=None, help="write the markdown table of all results in --jsonl here")
    args = ap.parse_args()
    for key, val in (("LONGCTX_DEVICE", args.device), ("LONGCTX_DTYPE", args.dtype)):
        if val:
            os.environ[key] = val  # for the subprocesses
    if args.one:
        model, n, mode, work = args.one
        print(json.dumps(run_one(model, int(n), mode, Path(work))), flush=True)
        return 0
    results = []
    for model in args.models.split(",") if args.models else []:  # --models "": only render --table
        for n in map(int, args.lengths.split(",")):
            if n > MAX_TOKENS.get(model, 32768):
                continue
            with tempfile.TemporaryDirectory(prefix="bench-longctx-") as work:
                for mode in args.modes.split(","):
                    if mode == "ref" and n > REF_MAX_TOKENS:
                        continue
                    r = subprocess_case(model, n, mode, Path(work), args.timeout)
                    print(json.dumps(r), flush=True)
                    results.append(r)
                    if args.jsonl:
                        with open(args.jsonl, "a") as fh:
                            fh.write(json.dumps(r) + "\n")
    if args.table and args.jsonl:
        rows = [json.loads(l) for l in Path(args.jsonl).read_text().splitlines() if l.strip()]
        Path(args.table).write_text(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
