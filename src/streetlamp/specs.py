"""Every user-string parser in one low module: layers, heads, rows, indices, memory, method
parameters, tasks and data names. Nothing here imports a model, torch or a registry: what a
parser checks against (the registered tasks, the model's layer count) is passed in, so the CLI can
parse and refuse a bad string before anything heavy is imported. Each raises
:class:`~streetlamp.errors.StreetlampError` with one line naming the flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from .errors import StreetlampError


def split_list(spec: str | list[str] | None) -> list[str]:
    """``"a, b,,c"`` (or a list, from Python) -> ``["a", "b", "c"]`` (blank items dropped)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or [])
    return [str(s).strip() for s in items if str(s).strip()]


def parse_names(spec: str | None, known: Iterable[str], *, what: str, all_word: str | None = "all") -> list[str]:
    """A comma-separated choice among ``known`` (``all_word`` or nothing: all of them), each name once."""
    known = list(known)
    if all_word is not None and (not spec or spec == all_word):
        return known
    names = split_list(spec)
    for n in names:
        if n not in known:
            raise StreetlampError(f"unknown {what} {n!r}; {what}s: {', '.join(known)}")
    if not names:
        raise StreetlampError(f"no {what} named")
    return names


def parse_tasks(spec: str | None, known: Iterable[str]) -> list[str]:
    """``--tasks``: ``all`` (or nothing) or comma-separated ground-truth task names."""
    return parse_names(spec, known, what="task")


def parse_data(spec: str, known: Iterable[str]) -> list[str]:
    """``replicate --data``: comma-separated bundled dataset names, each once, in the order given."""
    known = tuple(known)
    names = split_list(spec)
    bad = [x for x in names if x not in known]
    if not names or bad:
        raise StreetlampError(f"--data takes a comma-separated list of {', '.join(known)} (got {spec!r})")
    return list(dict.fromkeys(names))


def layer_spec(spec: str, flag: str = "layers") -> str:
    """A layer choice without the model: ``last``, ``all`` or a layer number (range checked with the model)."""
    if spec in ("last", "all"):
        return spec
    try:
        int(spec)
    except (TypeError, ValueError):
        raise StreetlampError(f"{flag} must be last, all or a layer number (got {spec!r})") from None
    return spec


def lens_spec(spec: str | tuple | None) -> tuple[str, str | None]:
    """``lens --lens``: ``logit``, ``tuned:DIR`` or ``jacobian:DIR`` -> (kind, folder or None)."""
    if spec is None or spec == "logit" or (isinstance(spec, tuple) and spec[0] == "logit"):
        return ("logit", None)
    if isinstance(spec, tuple):
        spec = ":".join(str(x) for x in spec)
    kind, sep, folder = str(spec).partition(":")
    if kind not in ("tuned", "jacobian") or not sep or not folder:
        raise StreetlampError(f"--lens takes logit, tuned:DIR or jacobian:DIR (got {spec!r})")
    return (kind, folder)


def parse_indices(spec: str | None, n: int, flag: str, what: str) -> list[int]:
    """``"0,5,-1"`` or ``"all"``/None -> sorted distinct indices in 0..n-1 (negatives count from the end)."""
    if spec is None or spec == "all":
        return list(range(n))
    out: set[int] = set()
    for part in spec.split(","):
        try:
            i = int(part)
        except ValueError:
            raise StreetlampError(f"{flag} takes comma-separated {what} numbers or 'all' (got {part!r})") from None
        if not -n <= i < n:
            raise StreetlampError(f"{flag} {i} out of range: the model has {what}s 0..{n - 1} (or -1..-{n})")
        out.add(i % n)
    return sorted(out)


def parse_rows(spec: str | None, n: int, explained: int, flag: str = "--rows") -> list[int]:
    """``--rows``: comma-separated ``last``, ``explained``, ``N`` (negative from the end) or ``A:B``
    (positions A..B-1) -> sorted distinct query positions; default the explained position. ``flag``: the
    option the messages name (``attention-row --row``)."""
    if spec is None:
        return [explained]
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if part == "last":
                out.add(n - 1)
            elif part == "explained":
                out.add(explained)
            elif ":" in part:
                a, b = (int(x) if x else d for x, d in zip(part.split(":", 1), (0, n)))
                if not (0 <= a < b <= n):
                    raise StreetlampError(f"{flag} {part} out of range: the text has positions 0..{n - 1}")
                out.update(range(a, b))
            else:
                i = int(part)
                if not -n <= i < n:
                    raise StreetlampError(f"{flag} {i} out of range: the text has positions 0..{n - 1}")
                out.add(i % n)
        except ValueError:
            raise StreetlampError(f"{flag} takes last, explained, N or A:B, comma-separated (got {part!r})") from None
    return sorted(out)


def parse_heads(spec: str, n_layers: int, n_heads: int) -> list[tuple[int, int]] | None:
    """``patch --receiver``: ``logits`` (None) or ``L.H[,L.H...]`` within the model's layers and heads."""
    if spec in ("", "logits"):
        return None
    out = []
    for part in spec.split(","):
        try:
            layer, head = (int(x) for x in part.strip().split("."))
        except ValueError:
            raise StreetlampError(f"bad receiver {part!r}: write LAYER.HEAD, e.g. 9.6, or 'logits'") from None
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise StreetlampError(f"receiver {part} out of range: layers 0..{n_layers - 1}, heads 0..{n_heads - 1}")
        out.append((layer, head))
    return out


def parse_layers(spec: str, n_layers: int) -> list[str]:
    """``probe --layers``: ``all`` (embed + every layer), ``embed,0,3``, ``2-5`` -> site prefixes (``embed`` or layer numbers)."""
    if spec == "all":
        return ["embed"] + [str(i) for i in range(n_layers)]
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if part == "embed":
            out.append("embed")
        elif "-" in part and all(x.isdigit() for x in part.split("-", 1)):
            a, b = (int(x) for x in part.split("-", 1))
            out += [str(i) for i in range(a, b + 1)]
        elif part.isdigit():
            out.append(part)
        else:
            raise StreetlampError(f"--layers {spec!r}: use all, embed, layer numbers or ranges like 2-5")
    for p in out:
        if p != "embed" and not 0 <= int(p) < n_layers:
            raise StreetlampError(f"layer {p} out of range: the model has layers 0..{n_layers - 1}")
    if not out:
        raise StreetlampError("no layer named")
    return list(dict.fromkeys(out))


SWEEP_KINDS = ("hidden", "rank", "weight_decay", "dropout")


def parse_sweep(spec: str | None) -> tuple[str, list[float]] | None:
    if not spec or spec == "none":
        return None
    kind, _, vals = spec.partition(":")
    if kind not in SWEEP_KINDS or not vals:
        raise StreetlampError(f"--sweep is KIND:v1,v2,... with KIND in {', '.join(SWEEP_KINDS)} (got {spec!r})")
    try:
        values = [float(v) for v in vals.split(",") if v.strip()]
    except ValueError:
        raise StreetlampError(f"--sweep values must be numbers (got {vals!r})") from None
    if kind in ("hidden", "rank") and any(v < 1 or v != int(v) for v in values):
        raise StreetlampError(f"--sweep {kind} values must be whole numbers >= 1")
    return kind, values


_SIZE = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B)")


def parse_max_memory(text: str | None) -> dict[int | str, str] | None:
    """``'0=20GiB,cpu=30GiB'`` -> ``{0: "20GiB", "cpu": "30GiB"}`` (accelerate's max_memory)."""
    if text is None:
        return None
    out: dict[int | str, str] = {}
    for part in text.split(","):
        dev, _, size = part.strip().partition("=")
        if not dev or not _SIZE.fullmatch(size.strip()) or not re.fullmatch(r"cpu|\d+", dev):
            raise StreetlampError(f"--max-memory {text!r}: give device=size pairs, e.g. '0=20GiB,cpu=30GiB'")
        out[int(dev) if dev.isdigit() else dev] = size.strip()
    return out


def parse_split(spec: str | tuple | list) -> tuple[float, float, float]:
    """``probe --split``: three fractions ``train,dev,test``."""
    if not isinstance(spec, str):
        spec = ",".join(map(str, spec))
    try:
        parts = tuple(float(x) for x in spec.split(",")) if spec.count(",") == 2 else ()
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise StreetlampError("--split is three fractions train,dev,test, e.g. 0.6,0.2,0.2")
    return parts  # type: ignore[return-value]


def _value(text: str) -> Any:
    """A pair's value: JSON where it parses (``16``, ``true``, ``[1, 2]``, ``"a"``), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


_IDENT = r"[A-Za-z_][\w-]*"
_PAIR_START = re.compile(rf",(?=\s*{_IDENT}(?:\.{_IDENT})?\s*=)")  # a comma that starts the next pair


def _pairs(spec: str, flag: str, dotted: bool) -> dict[str, Any]:
    key = re.compile(rf"{_IDENT}\.{_IDENT}" if dotted else _IDENT)
    example = "integrated_gradients.rule=panels,occlusion.replacement=unk" if dotted else "rule=panels,steps=16"
    out: dict[str, Any] = {}
    for part in _PAIR_START.split(spec):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or not key.fullmatch(name) or not value.strip() or value.strip().endswith(","):
            raise StreetlampError(
                f"{flag} {part.strip()!r}: give JSON or {'METHOD.PARAM' if dotted else 'PARAM'}=VALUE pairs, "
                f"comma-separated, e.g. {example}"
            )
        if not dotted:
            out[name] = _value(value.strip())
            continue
        method, _, param = name.partition(".")
        if param in out.setdefault(method, {}):
            raise StreetlampError(f"{flag} sets {name} twice")
        out[method][param] = _value(value.strip())
    return out


def _json_or_pairs(spec: str | dict | None, flag: str, dotted: bool) -> tuple[Any, bool]:
    """``(value, complete)``: a dict given as is or decoded JSON (``complete`` False: the caller checks its
    shape), or ``{}`` / the parsed ``param=value`` pairs (``complete`` True: already of the right shape)."""
    if isinstance(spec, dict):
        return spec, False
    if not spec or not spec.strip():
        return {}, True
    if not spec.lstrip().startswith(("{", "[")):
        return _pairs(spec.strip(), flag, dotted=dotted), True
    try:
        return json.loads(spec), False
    except json.JSONDecodeError as e:
        raise StreetlampError(f"{flag} is not JSON ({e.msg})") from None


def parse_method_params(spec: str | dict | None, flag: str = "--method-params") -> dict[str, dict[str, Any]]:
    """``--method-params``: JSON ``{"method": {"param": value}}`` or pairs
    ``method.param=value[,method.param=value...]`` (values JSON where they parse, strings otherwise).
    Only the syntax: which methods and parameters exist is checked against the registry later."""
    mparams, complete = _json_or_pairs(spec, flag, dotted=True)
    if not complete and (not isinstance(mparams, dict) or not all(isinstance(v, dict) for v in mparams.values())):
        raise StreetlampError(
            f'{flag} must be a JSON object of objects, e.g. {{"integrated_gradients": {{"rule": "panels"}}}}'
            " or integrated_gradients.rule=panels"
        )
    return mparams


def parse_params(spec: str | dict | None, flag: str) -> dict[str, Any]:
    """One method's parameters (``--ig-params``): JSON ``{"param": value}`` or ``param=value`` pairs."""
    params, complete = _json_or_pairs(spec, flag, dotted=False)
    if not complete and not isinstance(params, dict):
        raise StreetlampError(f'{flag} must be a JSON object, e.g. {{"rule": "panels", "steps": 16}}')
    return params
