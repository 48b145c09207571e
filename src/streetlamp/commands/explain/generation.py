"""``streetlamp explain-generation``: attribute every token a causal LM or an encoder-decoder generates.

On a causal LM, integrated gradients uses one shared interpolation path for all generated tokens
(:meth:`~streetlamp.methods.ig.IntegratedGradients.attribute_sequence`): the model is causal, so
generated token j at position P+j-1 depends only on the first P+j tokens. Every other method is
applied to each prefix in turn (prompt + generated[:j], target: token j, the chosen quantity), the
same call ``streetlamp explain`` makes. Output: one matrix ``[generated token, input token]`` per
method (cells after a target's own prefix are 0 and marked in ``allowed``), IG's completeness
record, a heatmap per method, and a manifest that says what each method explains.

On an encoder-decoder (T5, BART) the source goes through the encoder and the target (greedy, or forced)
is read by the decoder with teacher forcing; every method that declares the encoder-decoder kind runs once
over the :class:`~streetlamp.methods.views.Seq2SeqView` (:meth:`~streetlamp.methods.base.Method.attribute_view`:
the model kind supplies the embeddings, each row's inputs, the scorer and the removal rule), and the files
are those of :mod:`.generation_files`. Other methods refuse in one line (:func:`..models.seq2seq.refusal`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...errors import StreetlampError
from ...methods.base import Method, ViewAttribution
from ...methods.granularity import aggregate, units
from ...methods.ig import IntegratedGradients
from ...methods.prefixes import per_prefix
from ...methods.registry import get_method
from ...methods.views import Seq2SeqView
from ...models.adapter import Inputs, ModelAdapter, Target
from ...models.seq2seq import Seq2SeqAdapter
from ...results import Explanation
from ...store.run_folder import RunFolder
from . import MAX_NEW_TOKENS
from .generation_files import IG, figure, figure_name, write_encdec
from .steps import StepFunction, chat_continuation_ids, chat_prompt_ids

if TYPE_CHECKING:
    from . import GenerationSettings

GENERATION_IG: dict[str, Any] = {"rule": "panels", "max_steps": 1024}
# a causal LM's IG baseline here: the document-start token (<|endoftext|> on SmolLM2), chosen by the
# baseline study in docs/decoder.md
CAUSAL_IG_BASELINE: dict[str, Any] = {"baseline": "document"}
GRANULARITY_RULE = (
    "a unit's score is the sum of its tokens' scores; words from the tokenizer's leading-space / ## markers, "
    "sentences after . ! ? and whitespace, paragraphs after a blank line; special tokens are units of their own"
)


@dataclass
class GenerationResult:
    out: Path
    tokens: list[str]  # prompt + generated tokens but the last (the inputs of the last target)
    generated: list[str]
    matrix: np.ndarray  # [generated, token] of the first method
    allowed: np.ndarray
    summary: list[str] = field(default_factory=list)
    matrices: dict[str, np.ndarray] = field(default_factory=dict)  # method -> [generated, token]

    def lines(self) -> list[str]:
        figs = ", ".join(figure_name(m) for m in self.matrices) or "generation.png"
        return [*self.summary, f"output: {self.out}/ (manifest.json, arrays.safetensors, {figs})"]

    def _repr_html_(self) -> str:  # a notebook shows the run's report inline
        from ...report.viewer import iframe_html

        return iframe_html(self.out)


def text_ids(adapter: ModelAdapter, prompt: str, text: str) -> list[int]:
    """The ids of ``text`` as the tokenizer splits ``prompt + text``; an error when that split does not
    start with the prompt's own ids (the continuation would merge into the prompt's last token)."""
    if not text:
        raise StreetlampError("empty continuation")
    p = adapter.encode(prompt).input_ids[0].tolist()
    full = adapter.encode(prompt + text).input_ids[0].tolist()
    if full[: len(p)] != p or len(full) <= len(p):
        raise StreetlampError(
            f"the continuation {text!r} does not re-tokenise after the prompt (prompt + continuation splits the "
            "prompt's tokens differently); start it at a token boundary, e.g. with a space"
        )
    unk = adapter.tokenizer.unk_token_id
    if unk is not None and unk in full[len(p) :]:
        raise StreetlampError(
            f"the continuation {text!r} has text this tokenizer cannot encode (it becomes the unknown token)"
        )
    return full[len(p) :]


def build_methods(
    methods: list[str] | None,
    method_params: dict[str, dict[str, Any]] | None,
    ig_params: dict[str, Any] | None,
    ig_defaults: dict[str, Any],
) -> dict[str, Method]:
    """The methods of ``explain-generation`` (both model kinds), built with their parameters: ``ig_defaults`` under
    ``--ig-params`` / ``--method-params``' IG entry (the settings' check() refuses them given twice)."""
    methods = list(methods or [IG])
    mp = dict(method_params or {})
    mp[IG] = {**ig_defaults, **(ig_params or mp.get(IG) or {})}
    return {name: get_method(name, **mp.get(name, {})) for name in methods}


def check_length(adapter: ModelAdapter, continuation: list[int]) -> None:
    """A forced continuation (ids, or a text as this tokenizer splits it): 1..MAX_NEW_TOKENS tokens of the
    vocabulary (``--new-tokens`` is declared 1..MAX_NEW_TOKENS with its field)."""
    if not 1 <= len(continuation) <= MAX_NEW_TOKENS:
        raise StreetlampError(f"the continuation must be 1..{MAX_NEW_TOKENS} tokens (got {len(continuation)})")
    bad = [t for t in continuation if not 0 <= int(t) < adapter.n_outputs]
    if bad:
        raise StreetlampError(f"token id {bad[0]} out of range: the vocabulary has {adapter.n_outputs} ids")


def run_generation(
    adapter: ModelAdapter, s: GenerationSettings, out: RunFolder | Path, options: Any = None
) -> GenerationResult:
    """``streetlamp explain-generation``: the memory check, then :func:`explain_generation`."""
    from ...models.memory import check_memory

    cont = s.continuation
    length = len(adapter.encode(s.prompt + cont).input_ids[0]) if cont and not s.chat else None
    n = length if length is not None else max(adapter.encode(s.prompt).lengths) + s.new_tokens
    check_memory(adapter, n, bool(options.force) if options is not None else False, record_attention=False)
    return explain_generation(adapter, s, out)


def explain_generation(
    adapter: ModelAdapter,
    s: GenerationSettings,
    out: RunFolder | Path,
    *,
    continuation_ids: Sequence[int] | None = None,
) -> GenerationResult:
    """Each method of ``s.methods`` attributing each generated token (greedy, ``s.new_tokens``, or the forced
    ``s.continuation``: a text re-tokenised after the prompt; or, from Python, ``continuation_ids``) over the
    prompt and earlier tokens. The settings are checked and validated before (``check``/``validate``).

    Step functions (:mod:`.steps`): ``quantity`` prob / logprob / logit, ``kl_divergence`` (perturbation
    methods), minus a ``contrast_token``'s, or minus the log-prob after a ``contrast_prompt``. ``chat``
    applies the tokenizer's chat template to the prompt; ``granularity`` adds word / sentence / paragraph
    matrices (sums over each unit's tokens, :mod:`~streetlamp.methods.granularity`)."""
    prompt, new_tokens, methods, quantity = s.prompt, s.new_tokens, s.methods, s.quantity
    batch_size, seed = s.batch_size, s.seed
    ig_params, method_params = s.ig_params, s.method_params
    contrast_token, contrast_prompt = s.contrast_token, s.contrast_prompt
    chat, granularity = s.chat, s.granularity
    continuation: list[int] | str | None = list(continuation_ids) if continuation_ids is not None else s.continuation
    rf = RunFolder.of(out, "explain-generation")
    if adapter.kind.view == "source_target":  # source -> target: the same matrices and files, over the seq2seq view
        return _encoder_decoder(
            adapter, prompt, rf, new_tokens, continuation, methods, quantity, batch_size, seed, ig_params, method_params
        )
    # defaults for this command: a causal LM's IG integrands have narrow spikes and the shared path
    # must converge for its hardest target (SmolLM2 IOI prompt, 6 tokens: Clenshaw–Curtis left a
    # relative completeness error of 7.8 after 256 steps; panels reached 2e-4 with 845 evaluations)
    built = build_methods(methods, method_params, ig_params, {**GENERATION_IG, **CAUSAL_IG_BASELINE})
    methods = list(built)
    for m in built.values():
        m.check(adapter)
    step = StepFunction.build(adapter, quantity, contrast_token, contrast_prompt, chat)
    prompt_ids = chat_prompt_ids(adapter, prompt) if chat else adapter.encode(prompt).input_ids[0]
    prompt_len = len(prompt_ids)
    forced = continuation is not None
    if isinstance(continuation, str):
        if chat:
            continuation = chat_continuation_ids(adapter, prompt, prompt_ids.tolist(), continuation)
        else:
            continuation = text_ids(adapter, prompt, continuation)
    if continuation is not None:
        check_length(adapter, continuation)
    if prompt_len + (len(continuation) if continuation else new_tokens) > adapter.max_positions:
        raise StreetlampError(f"prompt and continuation exceed the model's {adapter.max_positions} positions")
    t0 = time.time()
    gen_ids = [int(i) for i in continuation] if continuation is not None else adapter.generate(prompt_ids, new_tokens)
    stopped = None if forced else ("eos" if gen_ids[-1] in adapter.eos_token_ids else "new_tokens")
    full = torch.cat([prompt_ids.cpu(), torch.tensor(gen_ids, dtype=torch.long)])
    k, width = len(gen_ids), len(full) - 1
    rows: dict[str, list[Explanation]] = {}
    for name, m in built.items():
        if isinstance(m, IntegratedGradients):
            rows[name] = m.attribute_sequence(
                adapter,
                prompt,
                gen_ids,
                target=Target(contrast=step.contrast, quantity=step.quantity),  # type: ignore[arg-type]
                batch_size=batch_size,
                batched_grads=True,
            )
        else:
            rows[name] = per_prefix(adapter, m, full, prompt_len, step.quantity, batch_size, seed, step.contrast)
    step_values = step.values(adapter, full, prompt_len)
    secs = time.time() - t0
    allowed = np.zeros((k, width), np.uint8)
    for j in range(k):
        allowed[j, : prompt_len + j] = 1
    matrices = {name: _matrix(exps, k, width) for name, exps in rows.items()}
    generated = [cast(str, adapter.tokenizer.decode([i])) for i in gen_ids]  # one id -> one str
    tokens = list(Inputs.from_ids(adapter, [full[:-1]]).tokens[0])
    labels = [adapter.token_label(t) for t in tokens]
    ig_exps = rows.get(IG)
    res = GenerationResult(rf.out, tokens, generated, matrices[methods[0]], allowed, matrices=matrices)
    with rf.staging() as w:
        for name, mat in matrices.items():
            w.add_array(
                f"{name}.matrix",
                mat,
                axes=["generated", "token"],
                meaning=f"IG of the {quantity} of generated token j (row) over the token embeddings of its inputs "
                "(columns: prompt, then earlier generated tokens); one shared path (attribute_sequence)"
                if name == IG
                else f"{name} of generated token j (row; target: that token, {quantity} where the method uses the "
                "target) applied to its own prefix (columns: prompt, then earlier generated tokens)",
            )
        w.add_array(
            "allowed",
            allowed,
            axes=["generated", "token"],
            meaning="1 where the token is an input of "
            "that row's target (earlier positions); 0 cells of the matrix are not inputs",
        )
        if ig_exps is not None:
            w.add_array(
                "completeness",
                np.stack([e.arrays["completeness"] for e in ig_exps]).astype(np.float64),
                axes=["generated", "quantity"],
                meaning="[delta, delta/|dF|, F(e), F(e'), sum IG] per generated token",
            )
        w.add_array(
            "generated_ids",
            np.asarray(gen_ids, np.int64),
            axes=["generated"],
            meaning="vocabulary ids of the generated tokens",
        )
        w.add_array(
            "step_values",
            step_values,
            axes=["generated"],
            meaning=f"the explained step function at the unedited input, per generated token: {step.explains}",
        )
        grain: dict[str, Any] = {"level": granularity}
        if granularity != "token":
            unit, unit_labels = units(adapter, full[:-1].tolist(), granularity)
            grain.update(rule=GRANULARITY_RULE, units=unit_labels, unit_of_token=unit.tolist())
            for name, mat in matrices.items():
                w.add_array(
                    f"{name}.matrix.{granularity}",
                    aggregate(mat, unit).astype(np.float32),
                    axes=["generated", granularity],
                    meaning=f"{name}.matrix summed over each {granularity}'s tokens (columns: manifest granularity.units)",
                )
        for name, mat in matrices.items():
            figure(mat, allowed, labels, generated, w.path / figure_name(name), name)
            w.add_figure(
                file=figure_name(name),
                shows=f"{'IG' if name == IG else name} per generated token (rows) over input tokens, each row "
                "divided by its max |score|; grey: not an input of that row",
            )
        parameters: dict[str, Any] = {
            "quantity": quantity,
            "step_function": step.describe(),
            "chat_template": chat,
            "granularity": grain,
            "new_tokens": k,
            "batch_size": batch_size,
            "seed": seed,
        }
        if ig_exps is not None:
            parameters[IG] = built[IG].params()
        if methods != [IG]:
            parameters["methods"] = {name: m.params() for name, m in built.items()}
        body: dict[str, Any] = {
            "model": adapter.describe(),
            "prompt": prompt,
            "prompt_tokens": prompt_len,
            "tokens": tokens,
            "token_labels": labels,
            "generated": generated,
            "generated_ids": gen_ids,
            "continuation": "given" if forced else "greedy",
            "stopped_at": stopped,
            "parameters": parameters,
            "per_token": [
                {
                    "generated": g,
                    "converged": e.info["converged"],
                    "steps": e.info["steps"],
                    "relative_completeness_error": e.info["relative_completeness_error"],
                }
                for g, e in zip(generated, ig_exps)
            ]
            if ig_exps is not None
            else [{"generated": g} for g in generated],
        }
        if ig_exps is not None:
            body["gradient_evaluations"] = ig_exps[0].info["gradient_evaluations"]
        if methods != [IG]:  # the IG-only manifest stays as it was
            body["methods"] = {name: _explains(name, exps, quantity) for name, exps in rows.items()}
        w.write_manifest({**body, "seconds": round(secs, 2), "seed": seed})
    how = ", ".join(
        f"IG one shared path, {ig_exps[0].info['gradient_evaluations']} gradient evaluations"
        if n == IG and ig_exps is not None
        else f"{n} per prefix"
        for n in methods
    )
    res.summary.append(
        f"prompt: {prompt!r} -> continuation {''.join(generated)!r} ({k} tokens, "
        f"{'given' if forced else 'greedy, ended by EOS' if stopped == 'eos' else 'greedy'}; {quantity}; {how}; "
        f"{secs:.1f} s)"
    )
    res.summary.append(f"step function: {step.explains}" + ("; prompt in the chat template" if chat else ""))
    if ig_exps is not None:
        res.summary.append(f"IG baseline: {ig_exps[0].info.get('baseline_used', built[IG].params().get('baseline'))}")
    for name, mat in matrices.items():
        if len(matrices) > 1:
            res.summary.append(f"{name}:")
        for j, g in enumerate(generated):
            row = mat[j, : int(allowed[j].sum())]
            top = np.argsort(-np.abs(row), kind="stable")[:3]
            flag = name == IG and ig_exps is not None and not ig_exps[j].info["converged"]
            res.summary.append(
                f"  {g!r:>14} <- "
                + ", ".join(f"{labels[i]!r}@{i} {row[i]:+.3f}" for i in top)
                + ("  (IG tolerance not reached)" if flag else "")
            )
    return res


def _matrix(exps: list[Explanation], k: int, width: int) -> np.ndarray:
    matrix = np.zeros((k, width), np.float32)
    for j, e in enumerate(exps):
        matrix[j, : len(e.scores)] = e.scores
    return matrix


def _explains(name: str, exps: list[Explanation], quantity: str) -> dict[str, Any]:
    """What a method's matrix holds: its scores' meaning (last row) and each row's explained target."""
    return {
        "array": f"{name}.matrix",
        "figure": figure_name(name),
        "scores": exps[-1].meaning.get("tokens", ""),
        "explained": [e.info.get("target", {}).get("explained") for e in exps],
        "quantity": quantity,
        "how": "one shared IG path over the whole sequence" if name == IG else "the method applied to each prefix",
    }


def _encoder_decoder(
    adapter: ModelAdapter,
    source: str,
    rf: RunFolder,
    new_tokens: int,
    continuation: list[int] | str | None,
    methods: list[str] | None,
    quantity: str,
    batch_size: int | None,
    seed: int,
    ig_params: dict[str, Any] | None,
    method_params: dict[str, dict[str, Any]] | None,
) -> GenerationResult:
    """explain-generation on an encoder-decoder: each method's ``attribute_view`` over the source and the target."""
    s2s = cast(Seq2SeqAdapter, adapter)
    built = build_methods(methods, method_params, ig_params, GENERATION_IG)
    src = adapter.encode(source).input_ids[0]
    target = Target(quantity=cast(Any, quantity))
    probe = Seq2SeqView(s2s, src, [s2s.decoder_start_token_id], target)  # the kind's checks, before decoding
    for m in built.values():
        m.check_view(probe)
    forced = continuation is not None
    if isinstance(continuation, str):
        continuation = s2s.target_ids(continuation)
    if continuation is not None:
        check_length(adapter, continuation)
    if len(continuation or []) > adapter.max_positions or new_tokens > adapter.max_positions:
        raise StreetlampError(f"the target exceeds the model's {adapter.max_positions} positions")
    t0 = time.time()
    gen = [int(i) for i in continuation] if continuation is not None else s2s.generate(src, new_tokens)
    stopped = None if forced else ("eos" if gen[-1] in s2s.eos_token_ids else "new_tokens")
    view = Seq2SeqView(s2s, src, gen, target)
    results: dict[str, ViewAttribution] = {
        name: m.attribute_view(view, batch_size=batch_size, seed=seed) for name, m in built.items()
    }
    secs = time.time() - t0
    tokens, generated, summary, matrices = write_encdec(
        rf,
        view,
        source,
        results,
        built,
        forced=forced,
        stopped=stopped,
        quantity=quantity,
        batch_size=batch_size,
        seed=seed,
        secs=secs,
    )
    first = next(iter(matrices))
    res = GenerationResult(rf.out, tokens, generated, matrices[first], view.allowed, matrices=matrices)
    res.summary.extend(summary)
    return res
