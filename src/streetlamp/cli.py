"""The ``streetlamp`` command: a thin layer, each subcommand one library call."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .errors import StreetlampError
from .settings import (
    BenchmarkSettings,
    EvaluateSettings,
    ExplainSettings,
    GenerationSettings,
    HeadsSettings,
    MediateSettings,
    PatchSettings,
    PruneSettings,
    Settings,
)

if TYPE_CHECKING:
    from .models.adapter import Quantity


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def cmd_models(args: argparse.Namespace) -> int:
    from .models.loading import DEFAULT_MODEL, EMBEDDED

    for name, e in EMBEDDED.items():
        mark = " (default)" if name == DEFAULT_MODEL else ""  # once: the descriptions do not say it
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
    print('\nset parameters with --method-params \'{"METHOD": {"PARAM": VALUE}}\' (explain, evaluate)')
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
        raise StreetlampError(
            f"{flag} must be a JSON object"
            + (' of objects, e.g. {"integrated_gradients": {"rule": "panels"}}' if flag == "--method-params" else "")
        )
    stray = [k for k in mparams if k not in methods]
    if stray:
        raise StreetlampError(
            f"{flag} names {', '.join(map(repr, stray))}, not among the methods of this run ({', '.join(methods)})"
        )
    for name, params in mparams.items():
        get_method(name, **params)  # unknown parameter names: a clear error now
    return mparams


def _load(args: argparse.Namespace, settings: Settings):
    """Load the model, then check every setting against it: all before any output exists."""
    from .models.loading import load

    device_map = getattr(args, "device_map", None)
    if device_map is None and (getattr(args, "max_memory", None) or getattr(args, "offload_folder", None)):
        raise StreetlampError("--max-memory and --offload-folder need --device-map auto")
    if device_map is not None and args.device != "cpu":
        raise StreetlampError("--device and --device-map exclude each other: the map places the model")
    max_memory = parse_max_memory(getattr(args, "max_memory", None)) if device_map else None
    adapter = load(args.model)
    if not isinstance(settings, GenerationSettings):
        from .models.seq2seq import require_one_stack

        require_one_stack(adapter, args.command)
    if device_map is not None:
        adapter.dispatch(max_memory, args.offload_folder, args.dtype)
    else:
        adapter.to(args.device, args.dtype)
    settings.validate(adapter)
    return adapter


def _print(res) -> int:
    for line in res.lines():
        print(line)
    _print_report(res.out)
    return 0


def _print_report(out: Path) -> None:
    """Every command that writes a run folder says where its report is."""
    if (Path(out) / "report.html").exists():
        print(f"report: {Path(out) / 'report.html'}")


def _run_folder(args: argparse.Namespace, command: str, kind: str | None = None):
    from .store.run_folder import RunFolder, default_out

    return RunFolder(args.out or default_out(kind or command), command, args.overwrite)


def cmd_explain(args: argparse.Namespace) -> int:
    from .methods.registry import parse_methods
    from .models.adapter import Target
    from .runners.explain import default_methods, explain, parse_target

    methods = parse_methods(args.methods) if args.methods else default_methods()
    s = ExplainSettings.from_args(args, methods=methods, method_params=parse_method_params(args.method_params, methods))
    out = _run_folder(args, "explain")
    adapter = _load(args, s)
    from .models.memory import check_memory

    long = args.rows is not None or args.layers is not None or args.heads is not None  # docs/long-context.md
    if not long and args.occlusion_window is not None:
        raise StreetlampError("--occlusion-window is for long inputs: give it with --rows/--layers/--heads")
    if not long:
        check_memory(adapter, max(adapter.encode(s.text, truncate=s.truncate).lengths), args.force)
    target = Target(
        parse_target(adapter, s.target),
        parse_target(adapter, s.contrast) if s.contrast else None,
        cast("Quantity", s.quantity),
    )  # argparse choices
    if long:
        from .runners.explain_long import explain_long

        kw = dict(layers=args.layers, heads=args.heads, rows=args.rows, target=target, truncate=s.truncate)
        kw["occlusion_window"] = args.occlusion_window
        kw["occlusion_replacement"] = s.method_params.get("occlusion", {}).get("replacement", "mask")
        return _print(explain_long(adapter, s.text, out, methods=methods if args.methods else None, **kw))
    return _print(
        explain(
            adapter,
            s.text,
            out,
            target=target,
            layer=s.layer,
            head=s.head,
            methods=s.methods,
            truncate=s.truncate,
            seed=s.seed,
            batch_size=s.batch_size,
            method_params=s.method_params,
        )
    )


def cmd_attention_row(args: argparse.Namespace) -> int:
    from .runners.explain_long import print_row

    return print_row(Path(args.dir), args.layer, args.row, args.heads, args.column)


def cmd_explain_generation(args: argparse.Namespace) -> int:
    from .methods.registry import parse_methods
    from .runners.generation import explain_generation

    methods = parse_methods(args.methods)
    ig_params = parse_method_params(
        args.ig_params and f'{{"integrated_gradients": {args.ig_params}}}', ["integrated_gradients"], "--ig-params"
    ).get("integrated_gradients", {})
    if ig_params and "integrated_gradients" not in methods:
        raise StreetlampError("--ig-params given but integrated_gradients is not among --methods")
    method_params = parse_method_params(args.method_params, methods)
    s = GenerationSettings.from_args(args, ig_params=ig_params, methods=methods, method_params=method_params)
    out = _run_folder(args, "explain-generation", "generation")
    adapter = _load(args, s)
    from .models.memory import check_memory

    length = len(adapter.encode(s.prompt + s.continuation).input_ids[0]) if s.continuation and not s.chat else None
    n = length if length is not None else max(adapter.encode(s.prompt).lengths) + s.new_tokens
    check_memory(adapter, n, args.force, record_attention=False)
    return _print(
        explain_generation(
            adapter,
            s.prompt,
            out,
            new_tokens=s.new_tokens,
            continuation=s.continuation,
            methods=s.methods,
            quantity=s.quantity,
            batch_size=s.batch_size,
            seed=s.seed,
            ig_params=s.ig_params,
            method_params=s.method_params,
            contrast_token=s.contrast_token,
            contrast_prompt=s.contrast_prompt,
            chat=s.chat,
            granularity=s.granularity,
        )
    )


def cmd_heads(args: argparse.Namespace) -> int:
    from .models.adapter import Target
    from .runners.explain import parse_target
    from .runners.heads import run_heads

    s = HeadsSettings.from_args(args, attribution=not args.no_attribution)
    out = _run_folder(args, "heads")
    adapter = _load(args, s)
    target = Target(parse_target(adapter, s.target), None, "prob")
    return _print(
        run_heads(
            adapter,
            out,
            text=s.text,
            data=s.data,
            ablation=s.ablation,
            target=target,
            seed=s.seed,
            limit=s.limit,
            attribution=s.attribution,
            sample=s.sample,
            batch_size=s.batch_size,
        )
    )


def cmd_prune(args: argparse.Namespace) -> int:
    from .runners.heads import run_prune

    s = PruneSettings.from_args(args, orders=[o.strip() for o in args.order.split(",") if o.strip()])
    out = _run_folder(args, "prune")
    adapter = _load(args, s)
    return _print(
        run_prune(
            adapter,
            out,
            data=s.data,
            orders=s.orders,
            seeds=s.seeds,
            step=s.step,
            limit=s.limit,
            seed=s.seed,
            batch_size=s.batch_size,
        )
    )


def cmd_patch(args: argparse.Namespace) -> int:
    from .runners.explain import parse_target
    from .runners.patch import run_patch

    s = PatchSettings.from_args(args, sites=[k.strip() for k in args.sites.split(",") if k.strip()])
    out = _run_folder(args, "patch")
    adapter = _load(args, s)
    return _print(
        run_patch(
            adapter,
            out,
            clean=s.clean,
            corrupt=s.corrupt,
            answer=parse_target(adapter, s.answer),
            wrong=parse_target(adapter, s.wrong),
            paths=s.paths,
            receivers=s.receiver,
            receiver_pos=s.receiver_pos,
            approx=s.approx,
            kinds=tuple(s.sites),
            batch_size=s.batch_size,
        )
    )


def cmd_lens(args: argparse.Namespace) -> int:
    from .runners.explain import parse_target
    from .runners.lens import run_lens

    s = Settings.from_args(args)
    out = _run_folder(args, "lens")
    adapter = _load(args, s)
    res = run_lens(
        adapter,
        out,
        text=args.text,
        index=parse_target(adapter, args.target),
        head=args.head,
        query=args.query,
        types_length=args.types_length,
        types_seqs=args.types_seqs,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    for t in res["tables"]:
        print(f"\n{t['title']}\n  " + " | ".join(t["columns"]))
        for row in t["rows"]:
            print("  " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    print(f"\noutput: {out.out}/")
    _print_report(out.out)
    return 0


def cmd_mediate(args: argparse.Namespace) -> int:
    from .runners.patch import run_mediate

    s = MediateSettings.from_args(args)
    out = _run_folder(args, "mediate")
    adapter = _load(args, s)
    return _print(run_mediate(adapter, out, n_prompts=s.prompts, head_site=s.component, batch_size=s.batch_size))


def cmd_replicate(args: argparse.Namespace) -> int:
    from .evaluation.replicate import ReplicateSettings
    from .models.loading import load
    from .runners.replicate import parse_data, replicate

    data = parse_data(args.data)
    if args.device_map is not None or args.max_memory or args.offload_folder:
        raise StreetlampError(
            "replicate runs on one device: give --device, not --device-map / --max-memory / --offload-folder"
        )
    s = ReplicateSettings(
        seed=args.seed,
        batch_size=args.batch_size,
        permutations=args.permutations,
        adv_steps=args.adv_steps,
        adv_layers=args.adv_layers,
        eps=args.eps,
        head_examples=args.head_examples,
        layers=args.layers,
        zero_rows=args.zero_rows,
        exclude_first=args.exclude_first,
    )
    adapter = load(args.model)
    adapter.to(args.device, args.dtype)
    return _print(
        replicate(args.model, data, Path(args.out), s, limit=args.limit, chunk_size=args.chunk_size, adapter=adapter)
    )


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .methods.registry import parse_methods
    from .runners.evaluate import evaluate

    methods = parse_methods(args.methods)
    s = EvaluateSettings.from_args(
        args, methods=methods, method_params=parse_method_params(args.method_params, methods)
    )
    return _print(
        evaluate(
            args.model,
            s.data,
            Path(args.out),
            s.eval_settings(),
            limit=s.limit,
            sample=s.sample,
            chunk_size=s.chunk_size,
            engine=s.engine,
            ray_address=s.ray_address,
            workers=s.workers,
            device=args.device,
            text_column=s.text_column,
            label_column=s.label_column,
        )
    )


def cmd_benchmark(args: argparse.Namespace) -> int:
    from .groundtruth.tasks import parse_tasks
    from .methods.registry import list_methods, parse_methods
    from .runners.benchmark import benchmark

    s = BenchmarkSettings.from_args(
        args, tasks=parse_tasks(args.tasks), methods=parse_methods(args.methods) if args.methods else list_methods()
    )
    out = _run_folder(args, "benchmark")
    return _print(
        benchmark(
            out,
            s.tasks,
            s.methods,
            n_examples=s.n_examples,
            seed=s.seed,
            device=args.device,
            batch_size=s.batch_size,
            quantity=s.quantity,
        )
    )


def shared_options(
    *,
    model: str | None,
    out: str,
    out_required: bool = False,
    overwrite: bool = True,
    seed: bool = True,
    dtype: bool = True,
    force: bool = False,
) -> argparse.ArgumentParser:
    """The options several commands share, each declared here once (a parent parser per command, so
    defaults and help can differ: mediate's model is smollm2-135m, evaluate's --out is required).
    ``force``: the command checks the memory estimate (models/memory.py) and --force skips that check;
    a command without the check has no --force (it would claim to skip a check that never ran)."""
    p = argparse.ArgumentParser(add_help=False)
    if model is not None:
        p.add_argument("--model", default=model, help=f"embedded name or checkpoint folder (default {model})")
    p.add_argument("--out", required=out_required, default=None, help=out)
    if overwrite:
        p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    if seed:
        p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="token budget per forward pass (rows x padded length; default 1024 on CPU)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 ...")
    if dtype:
        p.add_argument(
            "--dtype",
            default="float32",
            choices=["float32", "bfloat16", "float16"],
            help="model weights' dtype (bfloat16/float16 for GPUs; scores are returned as float32)",
        )
        if force:
            p.add_argument(
                "--force", action="store_true", help="run even when the memory estimate says it will not fit"
            )
        p.add_argument(
            "--device-map",
            choices=["auto"],
            default=None,
            help="spread the model over GPUs, CPU and disk (accelerate); see --max-memory, --offload-folder",
        )
        p.add_argument("--max-memory", default=None, help="with --device-map: e.g. '0=20GiB,cpu=30GiB'")
        p.add_argument("--offload-folder", default=None, help="with --device-map: where layers that do not fit go")
    return p


def parse_max_memory(text: str | None) -> dict[int | str, str] | None:
    """``'0=20GiB,cpu=30GiB'`` -> ``{"0": "20GiB", "cpu": "30GiB"}`` (accelerate's max_memory)."""
    if text is None:
        return None
    out: dict[int | str, str] = {}
    for part in text.split(","):
        dev, _, size = part.strip().partition("=")
        if not dev or not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)", size.strip()) or not re.fullmatch(r"cpu|\d+", dev):
            raise StreetlampError(f"--max-memory {text!r}: give device=size pairs, e.g. '0=20GiB,cpu=30GiB'")
        out[int(dev) if dev.isdigit() else dev] = size.strip()
    return out


def cmd_probe(args: argparse.Namespace) -> int:
    from .runners.probe import ProbeSettings, probe

    split = tuple(float(x) for x in args.split.split(",")) if args.split.count(",") == 2 else ()
    if len(split) != 3:
        raise StreetlampError("--split is three fractions train,dev,test, e.g. 0.6,0.2,0.2")
    settings = ProbeSettings(
        task=args.task,
        data=args.data,
        layers=args.layers,
        site=args.site,
        probes=args.probes,
        hidden=args.hidden,
        weight_decay=args.weight_decay,
        dropout=args.dropout,
        early_stopping=not args.no_early_stopping,
        max_epochs=args.max_epochs,
        subtoken=args.subtoken,
        pool=args.pool,
        limit=args.limit,
        n_examples=args.n_examples,
        split=split,
        seed=args.seed,
        mdl=not args.no_mdl,  # type: ignore[arg-type]
        amnesic=not args.no_amnesic,
        random_seeds=args.random_seeds,
        erase_at=args.erase_at,
        skip_first=args.skip_first,
        sweep=args.sweep,
        sweep_layer=args.sweep_layer,
        batch_size=args.batch_size,
        truncate=args.truncate,
    )
    res = probe(args.model, settings, _run_folder(args, "probe"), overwrite=args.overwrite, device=args.device)
    for line in res.lines:
        print(line)
    print(f"output: {res.out}/ (manifest.json, arrays.safetensors, probe.png, summary.md)")
    _print_report(res.out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report.viewer import write_report

    path = write_report(Path(args.dir))
    print(path)
    if args.open:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .models.loading import DEFAULT_MODEL, load
    from .serve import check_address, serve

    check_address(args.host, args.port, args.allow_remote)  # before loading any model
    adapters = {}
    for name in args.model or [DEFAULT_MODEL]:
        a = load(name)
        from .models.seq2seq import require_one_stack

        require_one_stack(a, "serve")
        adapters[a.name] = a.to(args.device)
    serve(adapters, args.host, args.port, args.allow_remote, args.runs, args.timeout, args.queue)
    return 0


def cmd_cot(args: argparse.Namespace) -> int:
    from .runners.cot import TESTS, CotSettings, make_engine, run_cot

    split = lambda v: [x.strip() for x in v.split(",") if x.strip()]  # noqa: E731
    tests = list(TESTS) if args.tests == "all" else split(args.tests)
    settings = CotSettings(
        tests=tests,
        hint_kinds=split(args.hint_kinds),
        biases=split(args.biases),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        points=args.points,
        shots=args.shots,
        internals=not args.no_internals,
        chunk_size=args.chunk_size,
    )
    settings.check()
    judge = None
    if args.judge_endpoint:
        import os

        from .cot.engines import HttpSettings

        judge = HttpSettings(
            args.judge_endpoint,
            args.judge_model,
            "chat",
            0.0,
            args.concurrency,
            args.retries,
            timeout=args.timeout,
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    elif args.judge_model:
        raise StreetlampError("--judge-model needs --judge-endpoint")
    engine, record = make_engine(
        args.model,
        args.endpoint,
        served_model=args.served_model,
        api=args.api,
        temperature=args.temperature,
        concurrency=args.concurrency,
        retries=args.retries,
        timeout=args.timeout,
        budget=args.budget,
        device=args.device,
    )
    res = run_cot(
        args.data,
        Path(args.out),
        settings,
        engine,
        record,
        limit=args.limit,
        fan_out=args.engine,
        model=args.model,
        ray_address=args.ray_address,
        workers=args.workers,
        device=args.device,
        judge_http=judge,
    )
    for line in res.lines:
        print(line)
    print(
        f"{res.n_questions} questions, {res.n_computed_chunks} chunks computed now; run store: {res.out}/ "
        "(manifest.json, records/*.jsonl, metrics/*.parquet, summary.md, figures/)"
    )
    _print_report(res.out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .models.loading import DEFAULT_MODEL

    p = argparse.ArgumentParser(prog="streetlamp", description="What a Transformer's attention really explains.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("models", help="list the embedded models")
    s.set_defaults(func=cmd_models)
    s = sub.add_parser("methods", help="list the registered attribution methods")
    s.set_defaults(func=cmd_methods)
    s = sub.add_parser(
        "explain",
        help="explain one text: attention of every layer and head, methods, figures",
        parents=[shared_options(model=DEFAULT_MODEL, out="output folder (default runs/explain-<time>)", force=True)],
    )
    s.add_argument("text", help="the text, or for an image model (ViT) an image file")
    s.add_argument(
        "--target",
        default=None,
        help="class name/id (classifier) or one token (causal LM); default: the prediction / the predicted next token",
    )
    s.add_argument("--contrast", default=None, help="explain target minus this class/token")
    s.add_argument("--quantity", choices=["prob", "logit", "logprob"], default="prob")
    s.add_argument("--layer", type=int, default=None, help="layer for the single heatmap (default: last)")
    s.add_argument("--head", type=int, default=None, help="head for the single heatmap (default: head mean)")
    s.add_argument(
        "--methods",
        default=None,
        help="comma-separated method names, or 'all' (default: attention, rollout, integrated_gradients, occlusion)",
    )
    s.add_argument("--truncate", action="store_true", help="cut texts longer than the model's positions")
    s.add_argument(
        "--method-params",
        default=None,
        help='JSON per method, e.g. \'{"occlusion": {"replacement": "unk", "group": "word"}, '
        '"integrated_gradients": {"baseline": "mask", "rule": "panels"}}\'',
    )
    s.add_argument("--rows", default=None, help="long inputs: keep only these query rows: last, explained, N, A:B")
    s.add_argument("--layers", default=None, help="long inputs: keep rows of these layers, e.g. 0,5,-1 (default all)")
    s.add_argument("--heads", default=None, help="long inputs: keep rows of these heads, e.g. 0,3 (default all)")
    s.add_argument(
        "--occlusion-window",
        type=int,
        default=None,
        help="long inputs, --methods occlusion: tokens per occluded span (default: the text in 32 spans)",
    )
    s.set_defaults(func=cmd_explain)
    s = sub.add_parser("attention-row", help="print one attention row (or column) of a long-context explain run")
    s.add_argument("dir", help="a run folder written by explain --rows")
    s.add_argument("--layer", type=int, required=True, help="layer (negative: from the end)")
    s.add_argument("--row", default="explained", help="query position: N, last or explained")
    s.add_argument("--heads", default=None, help="comma-separated heads (default all)")
    s.add_argument("--column", action="store_true", help="the column of key position --row instead of its row")
    s.set_defaults(func=cmd_attention_row)
    s = sub.add_parser(
        "explain-generation",
        help="causal LM or encoder-decoder (T5, BART): attribution of every generated (or given) token over the "
        "prompt (source) and earlier tokens, "
        "with any method (default integrated gradients, one shared path)",
        parents=[
            shared_options(model="smollm2-135m", out="output folder (default runs/generation-<time>)", force=True)
        ],
    )
    s.add_argument("prompt")
    s.add_argument(
        "--new-tokens",
        type=int,
        default=8,
        help="greedy tokens to generate and explain (1..64; an encoder-decoder stops earlier after </s>)",
    )
    s.add_argument("--quantity", choices=["prob", "logit", "logprob", "kl_divergence"], default="logprob")
    s.add_argument("--contrast-token", default=None, help="step function: quantity(y) - quantity(this one token)")
    s.add_argument("--contrast-prompt", default=None, help="step function: log p(y | prompt) - log p(y | this prompt)")
    s.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to the prompt")
    s.add_argument("--granularity", choices=["token", "word", "sentence", "paragraph"], default="token")
    s.add_argument(
        "--continuation",
        default=None,
        help="forced decoding: explain this given continuation (causal LM: re-tokenised after the prompt; "
        "encoder-decoder: the target text, tokenised alone) instead of generating greedily",
    )
    s.add_argument(
        "--methods",
        default="integrated_gradients",
        help="comma-separated method names, or 'all' (default: integrated_gradients); each gives one matrix",
    )
    s.add_argument("--ig-params", default=None, help='JSON, e.g. \'{"rule": "panels", "steps": 16}\'')
    s.add_argument(
        "--method-params", default=None, help='JSON per method, e.g. \'{"occlusion": {"replacement": "unk"}}\''
    )
    s.set_defaults(func=cmd_explain_generation)
    s = sub.add_parser(
        "heads",
        help="ablate every head (zero/mean/resample); with --data also importance, "
        "attention attribution and attention mass",
        parents=[shared_options(model=DEFAULT_MODEL, out="output folder (default runs/heads-<time>)")],
    )
    s.add_argument("text", nargs="?", default=None)
    s.add_argument(
        "--data", default=None, help=".txt (one per line), .csv/.jsonl with a 'text' (and 'label') column, or 'movies'"
    )
    s.add_argument(
        "--ablation",
        choices=["zero", "mean", "resample"],
        default="zero",
        help="mean/resample use the --data texts, or with a single TEXT a built-in set of 12 sentences",
    )
    s.add_argument("--target", default=None, help="class/token whose probability is F (default: prediction)")
    s.add_argument("--limit", type=int, default=None, help="use only the first N texts of --data")
    s.add_argument(
        "--sample",
        type=int,
        default=None,
        help="use N texts of --data drawn with --seed (files sorted by label make --limit one-sided)",
    )
    s.add_argument("--no-attribution", action="store_true", help="skip the (slow) Hao attribution column")
    s.set_defaults(func=cmd_heads)
    s = sub.add_parser(
        "prune",
        help="remove heads one by one in a score order; held-out accuracy curves",
        parents=[shared_options(model=DEFAULT_MODEL, out="output folder (default runs/prune-<time>)")],
    )
    s.add_argument(
        "--data",
        required=True,
        help="labelled .csv/.jsonl (text, label) or 'movies'; half of the "
        "examples (shuffled with --seed) scores heads, the other half is held out",
    )
    s.add_argument(
        "--order",
        default="importance,attribution,attention,random",
        help="comma-separated: importance, attribution, attention, random",
    )
    s.add_argument("--seeds", type=int, default=3, help="random orders to draw")
    s.add_argument("--step", type=int, default=1, help="heads removed per step")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(func=cmd_prune)
    s = sub.add_parser(
        "patch",
        help="activation patching (+ --paths path patching, --approx attribution patching); "
        "clean and corrupted texts must have the same token length",
        parents=[shared_options(model=DEFAULT_MODEL, out="output folder (default runs/patch-<time>)", seed=False)],
    )
    s.add_argument("--clean", required=True)
    s.add_argument("--corrupt", required=True)
    s.add_argument("--answer", default=None, help="right output (token or class); default: clean prediction")
    s.add_argument("--wrong", default=None, help="wrong output; default: corrupted prediction")
    s.add_argument("--paths", action="store_true", help="path patching from every sender head")
    s.add_argument("--receiver", default="logits", help="'logits' or receiver heads L.H[,L.H]")
    s.add_argument("--receiver-pos", type=int, default=None, help="patch receivers only at this position")
    s.add_argument("--approx", action="store_true", help="attribution patching beside real patching")
    s.add_argument(
        "--sites",
        default="resid_pre,attn.out,mlp.out,heads",
        help="what to patch: comma-separated resid_pre, attn.out, mlp.out (by layer x position), heads",
    )
    s.set_defaults(func=cmd_patch)
    s = sub.add_parser(
        "lens",
        help="causal LM: logit lens, direct logit attribution, head types; with --head "
        "also why that head attends where it does (QK attribution, ablation)",
        parents=[shared_options(model="smollm2-135m", out="output folder (default runs/lens-<time>)")],
    )
    s.add_argument("text")
    s.add_argument("--target", default=None, help="token whose logit is explained; default: the prediction")
    s.add_argument("--head", default=None, help="LAYER.HEAD for the QK attribution table, e.g. 9.6")
    s.add_argument("--query", type=int, default=None, help="query position for --head (default: last)")
    s.add_argument("--types-length", type=int, default=20, help="random tokens per head-type sequence (repeated)")
    s.add_argument("--types-seqs", type=int, default=4, help="random sequences for the head types")
    s.set_defaults(func=cmd_lens)
    s = sub.add_parser(
        "mediate",
        help="causal mediation (Vig et al. 2020): TE, NIE, NDE per head and layer",
        parents=[shared_options(model="smollm2-135m", out="output folder (default runs/mediate-<time>)", seed=False)],
    )
    s.add_argument("--prompts", type=int, default=8, help="number of template x profession prompts")
    s.add_argument(
        "--component",
        choices=["attn.pattern", "attn.z"],
        default="attn.pattern",
        help="head site: attention weights (as Vig et al.) or the head's output",
    )
    s.set_defaults(func=cmd_mediate)
    s = sub.add_parser(
        "evaluate",
        help="faithfulness of methods over a dataset, in a resumable run store",
        parents=[
            shared_options(
                model=DEFAULT_MODEL,
                out="run folder; the same command resumes it",
                out_required=True,
                overwrite=False,
                dtype=False,
            )
        ],
    )
    s.add_argument("--data", required=True, help="movies, tweets, drugs, a .csv/.tsv/.jsonl file or an ERASER folder")
    s.add_argument("--methods", default="attention", help="comma-separated method names, or 'all'")
    s.add_argument("--method-params", default=None, help='JSON, e.g. {"integrated_gradients": {"steps": 16}}')
    s.add_argument("--limit", type=int, default=None, help="first N examples only")
    s.add_argument("--sample", type=int, default=None, help="N examples drawn with --seed (kept in file order)")
    s.add_argument("--text-column", default=None)
    s.add_argument("--label-column", default=None)
    s.add_argument(
        "--truncate", action="store_true", help="cut texts longer than the model's positions (default: skip)"
    )
    s.add_argument("--replacement", choices=["delete", "mask"], default="delete", help="how erasure removes tokens")
    s.add_argument("--flip-layers", default="last", help="decision-flip layers: last, all or a layer number")
    s.add_argument("--cf-layers", default="last", help="counterfactual-attention layers: last, all or a number")
    s.add_argument("--eps", type=float, default=0.01, help="adversarial attention: max output change (TVD)")
    s.add_argument("--permutations", type=int, default=10)
    s.add_argument("--adv-steps", type=int, default=40)
    s.add_argument("--chunk-size", type=int, default=16, help="examples per stored chunk (unit of resumption)")
    s.add_argument("--engine", choices=["local", "ray"], default="local")
    s.add_argument("--ray-address", default=None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    s.add_argument("--workers", type=int, default=None, help="Ray actors (one model each)")
    s.add_argument(
        "--answer-tokens",
        type=int,
        default=0,
        help="causal LM: also score every token of the greedy N-token answer (forced decoding; docs/decoder.md)",
    )
    s.set_defaults(func=cmd_evaluate)
    s = sub.add_parser(
        "replicate",
        help="Jain & Wallace, Serrano & Smith, Wiegreffe & Pinter per layer and head (docs/replication.md)",
        parents=[
            shared_options(
                model="smollm2-135m", out="run folder; the same command resumes it", out_required=True, overwrite=False
            )
        ],
    )
    s.add_argument("--data", default="movies,tweets,recall", help="comma-separated: movies, tweets, recall")
    s.add_argument("--limit", type=int, default=None, help="N examples per dataset, drawn with --seed")
    s.add_argument("--permutations", type=int, default=3, help="random permutations per layer")
    s.add_argument("--adv-steps", type=int, default=8, help="adversarial attention: optimiser steps")
    s.add_argument("--adv-layers", type=int, default=3, help="adversarial attention at K evenly spaced layers")
    s.add_argument("--eps", type=float, default=0.01, help="adversarial attention: max output change (TVD)")
    s.add_argument(
        "--head-examples",
        type=int,
        default=0,
        help="per dataset, the first K examples also get per-head zeroing (-1: all)",
    )
    s.add_argument("--layers", default="all", help="layers with interventions: all, every:K or a comma list")
    s.add_argument(
        "--zero-rows",
        choices=["all", "explained"],
        default="all",
        help="Serrano & Smith's zeroing in every query row of the layer (default) or only the explained "
        "position's row (on a causal LM that row runs alone after the text's KV cache: far cheaper)",
    )
    s.add_argument(
        "--exclude-first",
        action="store_true",
        help="the sequence's first token is never an item (ranked, removed or zeroed): on a decoder without BOS "
        "(SmolLM2) whose prompt starts with the data (recall), the attention sink; a BOS is never an item anyway",
    )
    s.add_argument("--chunk-size", type=int, default=4, help="examples per stored chunk (unit of resumption)")
    s.set_defaults(func=cmd_replicate)
    s = sub.add_parser(
        "benchmark",
        help="ground truth: which methods recover planted tokens (normal vs deceptive)",
        parents=[shared_options(model=None, out="output folder", out_required=True, dtype=False)],
    )
    s.add_argument("--tasks", default="all", help="comma-separated: keyword,order,negation,together (default all)")
    s.add_argument("--methods", default=None, help="comma-separated method names (default: every registered)")
    s.add_argument("--n-examples", type=int, default=50, help="generated texts per task (default 50)")
    s.add_argument(
        "--quantity",
        choices=["prob", "logit", "logprob"],
        default="logit",
        help="explained quantity of the predicted class (default logit: these models saturate)",
    )
    s.set_defaults(func=cmd_benchmark)
    s = sub.add_parser("report", help="(re)build DIR/report.html from a run folder's manifest and arrays alone")
    s.add_argument("dir", help="a run folder written by any streetlamp command")
    s.add_argument("--open", action="store_true", help="open the report in the default browser")
    s.set_defaults(func=cmd_report)
    s = sub.add_parser("serve", help="a local web app on the report's front end: remove a token, ablate a head, live")
    s.add_argument(
        "--model",
        action="append",
        help=f"embedded name or checkpoint folder; repeat for several (default {DEFAULT_MODEL})",
    )
    s.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --allow-remote)"
    )
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--allow-remote", action="store_true", help="allow a --host other than 127.0.0.1/localhost")
    s.add_argument("--runs", default="runs/serve", help="where 'save as run folder' writes (default runs/serve)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default 300)")
    s.add_argument("--queue", type=int, default=8, help="requests that may wait per model (default 8)")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 ...")
    s.set_defaults(func=cmd_serve)
    s = sub.add_parser(
        "cot",
        help="chain-of-thought faithfulness: hints, biased contexts, early answering, "
        "mistakes, paraphrases, filler (local model or OpenAI-compatible server)",
    )
    s.add_argument("--model", default=None, help="a local causal LM (e.g. smollm2-135m)")
    s.add_argument("--endpoint", default=None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1")
    s.add_argument("--served-model", default=None, help="model name on the server (default: its only model)")
    s.add_argument("--api", choices=["chat", "completions"], default="chat", help="server API (with --endpoint)")
    s.add_argument(
        "--data", required=True, help="bbh:TASK (BIG-Bench Hard task) or a .jsonl (question, choices, answer)"
    )
    s.add_argument(
        "--tests",
        default="hint,biased_fewshot,early_answer",
        help="comma-separated: hint, biased_fewshot, early_answer, add_mistake, paraphrase, filler; or all",
    )
    s.add_argument(
        "--hint-kinds",
        default="sycophancy,metadata",
        help="sycophancy, consistency, metadata, grader_hacking, unethical",
    )
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
    s.add_argument(
        "--engine", choices=["local", "ray"], default="local", help="ray: chunks on Ray actors (local --model)"
    )
    s.add_argument("--ray-address", default=None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    s.add_argument("--workers", type=int, default=None, help="Ray actors (one model each)")
    s.add_argument(
        "--judge-endpoint",
        default=None,
        help="OpenAI-compatible base URL of a judge model asked whether each hinted/biased chain mentions the cue",
    )
    s.add_argument("--judge-model", default=None, help="model name on the judge server (default: its only model)")
    s.add_argument("--out", required=True, help="run folder; the same command resumes it")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_cot)
    s = sub.add_parser(
        "probe",
        help="probes with control tasks (selectivity), MDL, and amnesic probing: is what a layer holds also used?",
    )
    s.add_argument(
        "--task", required=True, help="pos, upos, sentiment, deciding:TASK, negated, category, or a .jsonl/.csv file"
    )
    s.add_argument("--model", default=DEFAULT_MODEL, help="embedded name, checkpoint folder or gt-TASK-VARIANT")
    s.add_argument("--data", default="movies", help="texts for pos/upos/sentiment: movies, tweets, drugs, a file")
    s.add_argument("--layers", default="all", help="all (embed + every layer), or e.g. embed,0,3 or 2-5")
    s.add_argument("--site", default="resid_post", help="resid_post, resid_pre, attn.out or mlp.out")
    s.add_argument("--probes", default="linear,mlp", help="linear, linear-rankR, mlp (1 hidden layer), mlp2")
    s.add_argument("--hidden", type=int, default=256, help="MLP hidden size")
    s.add_argument("--weight-decay", type=float, default=1e-3, help="L2 on probe weights (mean loss + wd/2 |W|^2)")
    s.add_argument("--dropout", type=float, default=0.0)
    s.add_argument(
        "--no-early-stopping",
        action="store_true",
        help="MLP / rank-R probes: train --max-epochs epochs instead of stopping on the dev loss",
    )
    s.add_argument("--max-epochs", type=int, default=100, help="epochs of the Adam-trained probes (MLP, rank-R)")
    s.add_argument("--subtoken", choices=["first", "last"], default="first", help="sub-token that represents a word")
    s.add_argument(
        "--pool",
        choices=["first", "last", "mean"],
        default=None,
        help="sentence tasks: position read (default: first for classifiers, last for causal LMs)",
    )
    s.add_argument("--split", default="0.6,0.2,0.2", help="train,dev,test fractions of the texts")
    s.add_argument("--limit", type=int, default=None, help="first N texts only")
    s.add_argument("--n-examples", type=int, default=300, help="generated texts for deciding:TASK / negated / category")
    s.add_argument(
        "--sweep",
        default="hidden:4,16,64,256,1024",
        help="capacity sweep KIND:v1,v2,.. (hidden, rank, weight_decay, dropout) or none",
    )
    s.add_argument("--sweep-layer", default=None, help="layer of the sweep (default: the middle layer)")
    s.add_argument("--random-seeds", type=int, default=5, help="random-direction erasures per layer")
    s.add_argument(
        "--erase-at",
        choices=["items", "all"],
        default="items",
        help="token tasks: erase at the labelled sub-tokens (where LEACE was fitted) or at every position",
    )
    s.add_argument(
        "--skip-first",
        action="store_true",
        help="token tasks: leave out words at position 0 (a causal LM's attention sink, with a massive activation)",
    )
    s.add_argument("--no-mdl", action="store_true")
    s.add_argument("--no-amnesic", action="store_true")
    s.add_argument("--truncate", action="store_true")
    s.add_argument("--out", default=None)
    s.add_argument("--overwrite", action="store_true")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=None, help="token budget per forward pass")
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=cmd_probe)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    import warnings

    # a warning is one line for the user, not a source excerpt
    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"streetlamp: warning: {message}\n"
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
