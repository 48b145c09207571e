"""The ``streetlamp`` command: a thin layer, each subcommand one library call."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .errors import StreetlampError

MAIN_TEXT = "The movie was not good, but the acting was great."


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def cmd_models(args: argparse.Namespace) -> int:
    from .models.loading import DEFAULT_MODEL, EMBEDDED

    for name, e in EMBEDDED.items():
        mark = " (default)" if name == DEFAULT_MODEL else ""
        print(f"{name:<18} {e.kind:<11} {e.description}{mark}")
    print("or a path to a local Hugging Face checkpoint folder (bert, roberta, distilbert, gpt2, llama families)")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from .methods.registry import REGISTRY

    for name, cls in REGISTRY.items():
        print(f"{name:<22} {cls.family:<14} {cls.description}")
        params = cls().params()
        if params:
            print(f"{'':<37} parameters: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))
    print("\nset parameters with --method-params '{\"METHOD\": {\"PARAM\": VALUE}}' (explain, evaluate)")
    return 0


def parse_method_params(spec: str | None, methods: list[str], flag: str = "--method-params") -> dict[str, dict]:
    """``--method-params`` JSON: ``{"method": {"param": value}}`` for methods of this run; every
    parameter is checked by building the method, before any work."""
    import json

    from .methods.registry import get_method
    try:
        mparams = json.loads(spec) if spec else {}
    except json.JSONDecodeError as e:
        raise StreetlampError(f"{flag} is not JSON ({e.msg})") from None
    if not isinstance(mparams, dict) or not all(isinstance(v, dict) for v in mparams.values()):
        raise StreetlampError(f"{flag} must be a JSON object" + (" of objects, e.g. "
                              '{"integrated_gradients": {"rule": "panels"}}' if flag == "--method-params" else ""))
    stray = [k for k in mparams if k not in methods]
    if stray:
        raise StreetlampError(f"{flag} names {', '.join(map(repr, stray))}, not among the methods of this "
                              f"run ({', '.join(methods)})")
    for name, params in mparams.items():
        get_method(name, **params)  # unknown parameter names: a clear error now
    return mparams


def cmd_explain(args: argparse.Namespace) -> int:
    from .methods.registry import parse_methods
    from .models.adapter import Target
    from .models.loading import load
    from .results import check_out_dir
    from .runners.explain import explain, parse_target

    if not args.text.strip():
        raise StreetlampError("empty text: give the sentence to explain")
    out = Path(args.out) if args.out else Path("runs") / f"explain-{__import__('time').strftime('%Y%m%d-%H%M%S')}"
    check_out_dir(out, args.overwrite)
    from .runners.explain import default_methods

    methods = parse_methods(args.methods) if args.methods else default_methods()
    mparams = parse_method_params(args.method_params, methods)
    adapter = load(args.model)
    adapter.to(args.device, args.dtype)
    target = Target(parse_target(adapter, args.target),
                    parse_target(adapter, args.contrast) if args.contrast else None, args.quantity)
    res = explain(adapter, args.text, out, target=target, layer=args.layer, head=args.head, methods=methods,
                  overwrite=args.overwrite, truncate=args.truncate, seed=args.seed, batch_size=args.batch_size,
                  method_params=mparams)
    print(f"model: {adapter.name} ({adapter.kind}, {adapter.n_layers} layers x {adapter.n_heads} heads)")
    for line in res.summary:
        print(line)
    print(f"output: {res.out}/ (manifest.json, arrays.safetensors, PNG heatmaps"
          + (", methods_comparison.png, kendall_tau.csv)" if res.explanations else ")"))
    return 0


def cmd_explain_generation(args: argparse.Namespace) -> int:
    from .models.loading import load
    from .runners.generation import explain_generation

    if not args.prompt.strip():
        raise StreetlampError("empty prompt")
    out = Path(args.out) if args.out else Path("runs") / f"generation-{__import__('time').strftime('%Y%m%d-%H%M%S')}"
    from .results import check_out_dir
    check_out_dir(out, args.overwrite)
    ig_params = parse_method_params(args.ig_params and f'{{"integrated_gradients": {args.ig_params}}}',
                                    ["integrated_gradients"], "--ig-params").get("integrated_gradients", {})
    adapter = load(args.model)
    adapter.to(args.device, args.dtype)
    res = explain_generation(adapter, args.prompt, out, new_tokens=args.new_tokens, quantity=args.quantity,
                             overwrite=args.overwrite, batch_size=args.batch_size, seed=args.seed,
                             ig_params=ig_params)
    for line in res.lines:
        print(line)
    print(f"output: {res.out}/ (manifest.json, arrays.safetensors, generation.png)")
    return 0


def _heads_adapter(args: argparse.Namespace):
    from .models.loading import load

    adapter = load(args.model)
    adapter.to(args.device, getattr(args, "dtype", "float32"))
    return adapter


def _heads_out(args: argparse.Namespace, kind: str) -> Path:
    from .results import check_out_dir

    out = Path(args.out) if args.out else Path("runs") / f"{kind}-{__import__('time').strftime('%Y%m%d-%H%M%S')}"
    check_out_dir(out, args.overwrite)
    return out


def cmd_heads(args: argparse.Namespace) -> int:
    from .models.adapter import Target
    from .runners.explain import parse_target
    from .runners.heads import run_heads

    if args.text is None and args.data is None:
        raise StreetlampError("give a TEXT or --data FILE")
    out = _heads_out(args, "heads")
    adapter = _heads_adapter(args)
    target = Target(parse_target(adapter, args.target), None, "prob")
    res = run_heads(adapter, out, text=args.text, data=args.data, ablation=args.ablation, target=target,
                    seed=args.seed, limit=args.limit, overwrite=args.overwrite, attribution=not args.no_attribution,
                    sample=args.sample)
    print("heads whose ablation changes the target most (layer.head: ΔF):")
    print("  " + ", ".join(f"{r['layer']}.{r['head']}: {r['effect']:+.4f}" for r in res["ranked"][:8]))
    for k, v in res["claim"].get("spearman_vs_effect", {}).items():
        print(f"spearman({k}, |ΔF|) = {v['rho']:+.3f} (p={v['p']:.2g})")
    for note in res["notes"].values():
        print(f"note: {note}")
    print(f"output: {out}/ (manifest.json, arrays.safetensors, PNG figures)")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from .runners.heads import run_prune

    out = _heads_out(args, "prune")
    adapter = _heads_adapter(args)
    orders = [o.strip() for o in args.order.split(",") if o.strip()]
    res = run_prune(adapter, out, data=args.data, orders=orders, seeds=args.seeds, step=args.step,
                    limit=args.limit, overwrite=args.overwrite, seed=args.seed)
    for name, (x, y) in res["curves"].items():
        half = int(len(x) // 2)
        print(f"{name:<14} accuracy: all heads {y[0]:.3f}, {x[half]} removed {y[half]:.3f}, all removed {y[-1]:.3f}")
    for note in res["notes"].values():
        print(f"note: {note}")
    print(f"output: {out}/")
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    from .runners.explain import parse_target
    from .runners.patch import run_patch

    out = _heads_out(args, "patch")
    adapter = _heads_adapter(args)
    res = run_patch(adapter, out, clean=args.clean, corrupt=args.corrupt, answer=parse_target(adapter, args.answer),
                    wrong=parse_target(adapter, args.wrong), paths=args.paths, receivers=args.receiver,
                    receiver_pos=args.receiver_pos, approx=args.approx, overwrite=args.overwrite,
                    kinds=tuple(k.strip() for k in args.sites.split(",") if k.strip()))
    pair = res["pair"]
    print(f"logit difference {adapter.output_label(pair.answer)!r} - {adapter.output_label(pair.wrong)!r}: "
          f"clean {pair.ld_clean:.3f}, corrupted {pair.ld_corrupt:.3f}")
    print("heads restoring most (layer.head: fraction): " + ", ".join(
        f"{h['layer']}.{h['head']}: {h['restored']:.3f}" for h in res["summary"]["top_heads"]))
    for k, v in res["summary"].get("attribution_vs_patching", {}).items():
        print(f"attribution vs real patching, {k}: pearson {v['pearson']:.3f}")
    if "paths" in res["arrays"]:
        import numpy as np

        lost = 1.0 - res["arrays"]["paths"]  # 1 = the path does not matter; 1 - value: share of LD lost
        order = np.argsort(-np.abs(np.nan_to_num(lost, nan=0.0)), axis=None)[:6]
        print(f"paths sender -> {args.receiver} (share of the logit difference lost when only that path is "
              "corrupted): " + ", ".join(f"{i // lost.shape[1]}.{i % lost.shape[1]}: {lost.flat[i]:+.3f}"
                                         for i in order))
    print(f"output: {out}/")
    return 0


def cmd_mediate(args: argparse.Namespace) -> int:
    from .runners.patch import run_mediate

    out = _heads_out(args, "mediate")
    adapter = _heads_adapter(args)
    res = run_mediate(adapter, out, n_prompts=args.prompts, head_site=args.component, overwrite=args.overwrite)
    nie = res["head_nie"]
    top = nie.reshape(-1).argsort()[::-1][:5]
    print(f"total effect TE = {float(res['te']):.3f} (mean over {len(res['y_null'])} prompts)")
    print("heads with the largest NIE: " + ", ".join(
        f"{i // nie.shape[1]}.{i % nie.shape[1]}: {nie.reshape(-1)[i]:.3f}" for i in top))
    print(f"output: {out}/")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:

    from .evaluation.counterfactual import Counterfactual
    from .evaluation.pipeline import EvalSettings
    from .methods.registry import parse_methods
    from .runners.evaluate import evaluate

    methods = parse_methods(args.methods)
    mparams = parse_method_params(args.method_params, methods)
    cf = Counterfactual(eps=args.eps, n_permutations=args.permutations, steps=args.adv_steps)
    settings = EvalSettings(methods=methods, method_params=mparams, seed=args.seed,
                            batch_size=args.batch_size, replacement=args.replacement, flip_layers=args.flip_layers,
                            cf_layers=args.cf_layers, counterfactual=cf.__dict__.copy(), truncate=args.truncate)
    res = evaluate(args.model, args.data, Path(args.out), settings, limit=args.limit, sample=args.sample,
                   chunk_size=args.chunk_size,
                   engine=args.engine, ray_address=args.ray_address, workers=args.workers, device=args.device,
                   text_column=args.text_column, label_column=args.label_column)
    for line in res.lines:
        print(line)
    print(f"{res.n_examples} examples ({res.n_skipped} skipped: longer than the model's positions), "
          f"{res.n_computed_chunks} chunks computed now; run store: {res.out}/ (manifest.json, metrics/*.parquet, "
          "arrays/, summary.csv, summary.md, figures/)")
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:
    from .groundtruth.tasks import parse_tasks
    from .methods.registry import list_methods, parse_methods
    from .runners.benchmark import benchmark, format_rows

    tasks = parse_tasks(args.tasks)
    methods = parse_methods(args.methods) if args.methods else list_methods()
    res = benchmark(Path(args.out), tasks, methods, n_examples=args.n_examples, seed=args.seed,
                    overwrite=args.overwrite, device=args.device, batch_size=args.batch_size,
                    quantity=args.quantity)
    for line in format_rows(res):
        print(line)
    print(f"output: {res.out}/ (leaderboard.csv, models.csv, leaderboard.png, manifest.json)")
    return 0


def cmd_cot(args: argparse.Namespace) -> int:
    from .runners.cot import TESTS, CotSettings, make_engine, run_cot

    split = lambda v: [x.strip() for x in v.split(",") if x.strip()]  # noqa: E731
    tests = list(TESTS) if args.tests == "all" else split(args.tests)
    settings = CotSettings(tests=tests, hint_kinds=split(args.hint_kinds), biases=split(args.biases),
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                           points=args.points, shots=args.shots, internals=not args.no_internals,
                           chunk_size=args.chunk_size)
    settings.check()
    engine, record = make_engine(args.model, args.endpoint, served_model=args.served_model, api=args.api,
                                 temperature=args.temperature, concurrency=args.concurrency, retries=args.retries,
                                 timeout=args.timeout, budget=args.budget, device=args.device)
    res = run_cot(args.data, Path(args.out), settings, engine, record, limit=args.limit)
    for line in res.lines:
        print(line)
    print(f"{res.n_questions} questions, {res.n_computed_chunks} chunks computed now; run store: {res.out}/ "
          "(manifest.json, records/*.jsonl, metrics/*.parquet, summary.md, figures/)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .models.loading import DEFAULT_MODEL

    p = argparse.ArgumentParser(prog="streetlamp", description="What a Transformer's attention really explains.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("models", help="list the embedded models")
    s.set_defaults(func=cmd_models)
    s = sub.add_parser("methods", help="list the registered attribution methods")
    s.set_defaults(func=cmd_methods)
    s = sub.add_parser("explain", help="explain one text: attention of every layer and head, methods, figures")
    s.add_argument("text")
    s.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded name or checkpoint folder ({DEFAULT_MODEL})")
    s.add_argument("--target", default=None, help="class name/id (classifier) or one token (causal LM); "
                   "default: the prediction / the predicted next token")
    s.add_argument("--contrast", default=None, help="explain target minus this class/token")
    s.add_argument("--quantity", choices=["prob", "logit", "logprob"], default="prob")
    s.add_argument("--layer", type=int, default=None, help="layer for the single heatmap (default: last)")
    s.add_argument("--head", type=int, default=None, help="head for the single heatmap (default: head mean)")
    s.add_argument("--methods", default=None, help="comma-separated method names, or 'all' "
                   "(default: attention, rollout, integrated_gradients, occlusion)")
    s.add_argument("--out", default=None, help="output folder (default runs/explain-<time>)")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    s.add_argument("--truncate", action="store_true", help="cut texts longer than the model's positions")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=None, help="token budget knob for batched methods")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 ...")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="model weights' dtype (bfloat16 for GPUs; scores are returned as float32)")
    s.add_argument("--method-params", default=None,
                   help='JSON per method, e.g. \'{"occlusion": {"replacement": "unk", "group": "word"}, '
                        '"integrated_gradients": {"baseline": "mask", "rule": "panels"}}\'')
    s.set_defaults(func=cmd_explain)
    s = sub.add_parser("explain-generation", help="causal LM: integrated gradients of every generated token over "
                       "the prompt and earlier tokens, one shared path")
    s.add_argument("prompt")
    s.add_argument("--model", default="smollm2-135m", help="a causal LM: embedded name or checkpoint folder")
    s.add_argument("--new-tokens", type=int, default=8, help="greedy tokens to generate and explain (1..64)")
    s.add_argument("--quantity", choices=["prob", "logit", "logprob"], default="logprob")
    s.add_argument("--ig-params", default=None, help='JSON, e.g. \'{"rule": "panels", "steps": 16}\'')
    s.add_argument("--out", default=None, help="output folder (default runs/generation-<time>)")
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=None, help="token budget per forward pass")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.set_defaults(func=cmd_explain_generation)
    s = sub.add_parser("heads", help="ablate every head (zero/mean/resample); with --data also importance, "
                       "attention attribution and attention mass")
    s.add_argument("text", nargs="?", default=None)
    s.add_argument("--data", default=None, help=".txt (one per line), .csv/.jsonl with a 'text' (and 'label') "
                   "column, or 'movies'")
    s.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero",
                   help="mean/resample use the --data texts, or with a single TEXT a built-in set of 12 sentences")
    s.add_argument("--target", default=None, help="class/token whose probability is F (default: prediction)")
    s.add_argument("--limit", type=int, default=None, help="use only the first N texts of --data")
    s.add_argument("--sample", type=int, default=None, help="use N texts of --data drawn with --seed (files sorted "
                   "by label make --limit one-sided)")
    s.add_argument("--no-attribution", action="store_true", help="skip the (slow) Hao attribution column")
    s.add_argument("--model", default=DEFAULT_MODEL)
    s.add_argument("--out", default=None)
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_heads)
    s = sub.add_parser("prune", help="remove heads one by one in a score order; held-out accuracy curves")
    s.add_argument("--data", required=True, help="labelled .csv/.jsonl (text, label) or 'movies'; half of the "
                   "examples (shuffled with --seed) scores heads, the other half is held out")
    s.add_argument("--order", default="importance,attribution,attention,random",
                   help="comma-separated: importance, attribution, attention, random")
    s.add_argument("--seeds", type=int, default=3, help="random orders to draw")
    s.add_argument("--step", type=int, default=1, help="heads removed per step")
    s.add_argument("--limit", type=int, default=None)
    s.add_argument("--model", default=DEFAULT_MODEL)
    s.add_argument("--out", default=None)
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_prune)
    s = sub.add_parser("patch", help="activation patching (+ --paths path patching, --approx attribution patching); "
                       "clean and corrupted texts must have the same token length")
    s.add_argument("--clean", required=True)
    s.add_argument("--corrupt", required=True)
    s.add_argument("--answer", default=None, help="right output (token or class); default: clean prediction")
    s.add_argument("--wrong", default=None, help="wrong output; default: corrupted prediction")
    s.add_argument("--paths", action="store_true", help="path patching from every sender head")
    s.add_argument("--receiver", default="logits", help="'logits' or receiver heads L.H[,L.H]")
    s.add_argument("--receiver-pos", type=int, default=None, help="patch receivers only at this position")
    s.add_argument("--approx", action="store_true", help="attribution patching beside real patching")
    s.add_argument("--sites", default="resid_pre,attn.out,mlp.out,heads",
                   help="what to patch: comma-separated resid_pre, attn.out, mlp.out (by layer x position), heads")
    s.add_argument("--model", default=DEFAULT_MODEL)
    s.add_argument("--out", default=None)
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_patch)
    s = sub.add_parser("mediate", help="causal mediation (Vig et al. 2020): TE, NIE, NDE per head and layer")
    s.add_argument("--prompts", type=int, default=8, help="number of template x profession prompts")
    s.add_argument("--component", choices=["attn.pattern", "attn.z"], default="attn.pattern",
                   help="head site: attention weights (as Vig et al.) or the head's output")
    s.add_argument("--model", default="smollm2-135m")
    s.add_argument("--out", default=None)
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_mediate)
    s = sub.add_parser("evaluate", help="faithfulness of methods over a dataset, in a resumable run store")
    s.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded name or checkpoint folder ({DEFAULT_MODEL})")
    s.add_argument("--data", required=True, help="movies, tweets, drugs, a .csv/.tsv/.jsonl file or an ERASER folder")
    s.add_argument("--methods", default="attention", help="comma-separated method names, or 'all'")
    s.add_argument("--method-params", default=None, help='JSON, e.g. {"integrated_gradients": {"steps": 16}}')
    s.add_argument("--out", required=True, help="run folder; the same command resumes it")
    s.add_argument("--limit", type=int, default=None, help="first N examples only")
    s.add_argument("--sample", type=int, default=None, help="N examples drawn with --seed (kept in file order)")
    s.add_argument("--text-column", default=None)
    s.add_argument("--label-column", default=None)
    s.add_argument("--truncate", action="store_true", help="cut texts longer than the model's positions (default: skip)")
    s.add_argument("--replacement", choices=["delete", "mask"], default="delete", help="how erasure removes tokens")
    s.add_argument("--flip-layers", default="last", help="decision-flip layers: last, all or a layer number")
    s.add_argument("--cf-layers", default="last", help="counterfactual-attention layers: last, all or a number")
    s.add_argument("--eps", type=float, default=0.01, help="adversarial attention: max output change (TVD)")
    s.add_argument("--permutations", type=int, default=10)
    s.add_argument("--adv-steps", type=int, default=40)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=None, help="token budget per forward pass")
    s.add_argument("--chunk-size", type=int, default=16, help="examples per stored chunk (unit of resumption)")
    s.add_argument("--engine", choices=["local", "ray"], default="local")
    s.add_argument("--ray-address", default=None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    s.add_argument("--workers", type=int, default=None, help="Ray actors (one model each)")
    s.add_argument("--device", default="cpu", help="cpu, cuda ... (with ray: one GPU per actor)")
    s.set_defaults(func=cmd_evaluate)
    s = sub.add_parser("benchmark", help="ground truth: which methods recover planted tokens (normal vs deceptive)")
    s.add_argument("--tasks", default="all", help="comma-separated: keyword,order,negation,together (default all)")
    s.add_argument("--methods", default=None, help="comma-separated method names (default: every registered)")
    s.add_argument("--n-examples", type=int, default=50, help="generated texts per task (default 50)")
    s.add_argument("--quantity", choices=["prob", "logit", "logprob"], default="logit",
                   help="explained quantity of the predicted class (default logit: these models saturate)")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=None, help="token budget knob for batched methods")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 ...")
    s.set_defaults(func=cmd_benchmark)
    s = sub.add_parser("cot", help="chain-of-thought faithfulness: hints, biased contexts, early answering, "
                       "mistakes, paraphrases, filler (local model or OpenAI-compatible server)")
    s.add_argument("--model", default=None, help="a local causal LM (e.g. smollm2-135m)")
    s.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1")
    s.add_argument("--served-model", default=None, help="model name on the server (default: its only model)")
    s.add_argument("--api", choices=["chat", "completions"], default="chat", help="server API (with --endpoint)")
    s.add_argument("--data", required=True, help="bbh:TASK (BIG-Bench Hard task) or a .jsonl (question, choices, answer)")
    s.add_argument("--tests", default="hint,biased_fewshot,early_answer",
                   help="comma-separated: hint, biased_fewshot, early_answer, add_mistake, paraphrase, filler; or all")
    s.add_argument("--hint-kinds", default="sycophancy,metadata",
                   help="sycophancy, consistency, metadata, grader_hacking, unethical")
    s.add_argument("--biases", default="always_a,suggested", help="always_a, suggested")
    s.add_argument("--limit", type=int, default=None, help="first N questions")
    s.add_argument("--max-new-tokens", type=int, default=96, help="chain-of-thought length cap")
    s.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampling seeded per prompt")
    s.add_argument("--points", type=int, default=3, help="Lanham tests: points per chain (plus its ends)")
    s.add_argument("--shots", type=int, default=3, help="few-shot exemplars (always_a)")
    s.add_argument("--no-internals", action="store_true", help="skip attention/knockout for used hints (local)")
    s.add_argument("--concurrency", type=int, default=4, help="parallel requests (--endpoint)")
    s.add_argument("--retries", type=int, default=4, help="retries per request, exponential backoff")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    s.add_argument("--budget", type=int, default=None, help="most requests to send in this invocation")
    s.add_argument("--chunk-size", type=int, default=1, help="questions per stored chunk (unit of resumption)")
    s.add_argument("--out", required=True, help="run folder; the same command resumes it")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_cot)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    import warnings

    # a warning is one line for the user, not a source excerpt
    warnings.formatwarning = lambda message, category, filename, lineno, line=None: (
        f"streetlamp: warning: {message}\n")
    try:
        return int(args.func(args))
    except StreetlampError as e:
        print(f"streetlamp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("streetlamp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `streetlamp methods | head`: the reader left; no traceback
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
