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
    return 0


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
    adapter = load(args.model)
    if args.device != "cpu":
        adapter.hf_model.to(args.device)
    target = Target(parse_target(adapter, args.target),
                    parse_target(adapter, args.contrast) if args.contrast else None, args.quantity)
    res = explain(adapter, args.text, out, target=target, layer=args.layer, head=args.head, methods=methods,
                  overwrite=args.overwrite, truncate=args.truncate, seed=args.seed, batch_size=args.batch_size)
    print(f"model: {adapter.name} ({adapter.kind}, {adapter.n_layers} layers x {adapter.n_heads} heads)")
    for line in res.summary:
        print(line)
    print(f"output: {res.out}/ (manifest.json, arrays.safetensors, PNG heatmaps"
          + (", methods_comparison.png, kendall_tau.csv)" if res.explanations else ")"))
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
    s.set_defaults(func=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    try:
        return int(args.func(args))
    except StreetlampError as e:
        print(f"streetlamp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("streetlamp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
