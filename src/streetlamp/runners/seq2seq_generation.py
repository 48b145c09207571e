"""``streetlamp explain-generation`` on an encoder-decoder (T5, BART).

The source text goes through the encoder; the target (greedy, or forced with ``--continuation``) is
read by the decoder with teacher forcing: decoder input ``[start, y_0 .. y_{k-2}]``, target token
``y_j`` predicted after decoder input ``j``. Every matrix is ``[generated token, token]`` with the
columns *source tokens, then decoder-input tokens* (the start token first); row j's inputs are the
whole source and decoder inputs ``0 .. j`` (``allowed``).

* ``integrated_gradients``: one straight path from the baseline to the embeddings of source and decoder
  inputs together (sites ``encoder.embed`` and ``decoder.embed``), shared by every target: the decoder
  is causal, so target j does not depend on decoder inputs after j and its IG over the shared path is
  the IG of its own inputs (what the causal-LM path does over the prompt, see ``attribute_sequence``).
* ``gradient_x_input`` / ``saliency``: the gradient of each target's quantity over the same embeddings.
* ``occlusion``: leave one source token or one decoder input out, under the rule of
  :mod:`.seq2seq_occlusion` (forced decoding: the target stays the one being explained).
* ``shap`` / ``lime``: per row, coalitions of that row's source and decoder-input tokens under the same
  rule (:mod:`.seq2seq_shap_lime`).
* ``attention``: two matrices, one per decoder site family: ``attention.cross_attn`` (row j's
  cross-attention to the source, in the source columns) and ``attention.self_attn`` (row j's decoder
  self-attention to the decoder inputs, in the target columns), in the method's view (``head_mean`` of
  the last decoder layer by default); the encoder's self-attention ``[layer, head, src, src]`` is kept as
  an array (it does not depend on the target).

Rollout, attention flow, ALTI and the other methods refuse in one line (:func:`..models.seq2seq.refusal`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..errors import StreetlampError
from ..methods.attention import Attention
from ..methods.ig import IntegratedGradients, per_target_grads
from ..methods.occlusion import Occlusion
from ..methods.quadrature import PathCache, integrate_adaptive
from ..methods.shap_lime import _Sampled
from ..models.adapter import Target
from ..models.seq2seq import SEQ2SEQ_METHODS, Seq2SeqAdapter, refusal
from ..store.run_folder import RunFolder
from . import seq2seq_shap_lime as sampled
from .generation import GENERATION_IG, IG, GenerationResult, _figure, _figure_name, build_methods, check_length
from .seq2seq_occlusion import OcclusionResult, check_params, seq2seq_occlusion


def check_methods(adapter: Seq2SeqAdapter, methods: list[str]) -> None:
    for name in methods:
        if name not in SEQ2SEQ_METHODS:
            raise StreetlampError(refusal(name, adapter.name))


def target_scores(
    adapter: Seq2SeqAdapter, src: torch.Tensor, dec: torch.Tensor, index: torch.Tensor, target: Target
) -> Any:
    """``scores(emb, grad)`` -> (x, F ``[rows, k]``) for rows of joint embeddings ``[rows, S+T, d]``."""
    S, k = len(src), len(dec)

    def scores(emb: torch.Tensor, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x = emb.detach().requires_grad_(grad)
        rows = x.shape[0]
        logits = adapter.run(src_embeds=x[:, :S], tgt_embeds=x[:, S:], grad=grad).logits  # [rows, k, vocab]
        f = adapter.score(logits.reshape(rows * k, -1), index.repeat(rows), target).view(rows, k)
        return x, f

    return scores


def explain_seq2seq_generation(
    adapter: Seq2SeqAdapter,
    source: str,
    out: RunFolder | Path,
    *,
    new_tokens: int = 8,
    continuation: list[int] | str | None = None,
    methods: list[str] | None = None,
    quantity: str = "logprob",
    overwrite: bool = False,
    batch_size: int | None = None,
    seed: int = 0,
    ig_params: dict[str, Any] | None = None,
    method_params: dict[str, dict[str, Any]] | None = None,
) -> GenerationResult:
    """Each method's attribution of each target token over the source and earlier target tokens."""
    rf = RunFolder.of(out, "explain-generation", overwrite)
    if not source or not source.strip():
        raise StreetlampError("empty source text")
    if continuation is None:
        check_length(adapter, new_tokens, None)
    built = build_methods(methods, method_params, ig_params, GENERATION_IG, lambda names: check_methods(adapter, names))
    for m in built.values():
        if isinstance(m, IntegratedGradients):
            m.check_params()
        if isinstance(m, Occlusion):
            check_params(adapter, m)
        if isinstance(m, _Sampled):
            sampled.check_params(adapter, m)
        if isinstance(m, Attention):
            if not -adapter.n_decoder_layers <= m.layer < adapter.n_decoder_layers:
                raise StreetlampError(
                    f"layer {m.layer} out of range: the decoder has {adapter.n_decoder_layers} layers"
                )
            if m.view == "head" and (m.head is None or not 0 <= m.head < adapter.n_decoder_heads):
                raise StreetlampError(f"head {m.head} out of range: the decoder has {adapter.n_decoder_heads} heads")
    src = adapter.encode(source).input_ids[0]
    forced = continuation is not None
    if isinstance(continuation, str):
        continuation = adapter.target_ids(continuation)
    check_length(adapter, new_tokens, continuation)
    if len(continuation or []) > adapter.max_positions or new_tokens > adapter.max_positions:
        raise StreetlampError(f"the target exceeds the model's {adapter.max_positions} positions")
    t0 = time.time()
    gen = [int(i) for i in continuation] if continuation is not None else adapter.generate(src, new_tokens)
    dec = adapter.decoder_inputs(gen)
    S, k = len(src), len(gen)
    stopped = None if forced else ("eos" if gen[-1] in adapter.eos_token_ids else "new_tokens")
    width = S + k
    dev = adapter.device
    index = torch.tensor(gen, dtype=torch.long, device=dev)
    target = Target(quantity=cast(Any, quantity))
    allowed = np.zeros((k, width), np.uint8)
    for j in range(k):
        allowed[j, : S + j + 1] = 1
    ids = torch.cat([src, dec])
    with torch.no_grad():
        e = torch.cat([adapter.embed(src), adapter.embed(dec, decoder=True)])  # [S+T, d]
    scores = target_scores(adapter, src.to(dev), dec.to(dev), index, target)
    matrices: dict[str, np.ndarray] = {}
    extra: dict[str, tuple[np.ndarray, list[str], str]] = {}
    ig_info: dict[str, Any] | None = None
    occ: OcclusionResult | None = None
    infos: dict[str, dict] = {}
    for name, m in built.items():
        if isinstance(m, IntegratedGradients):
            eb, used = m.baseline_embedding(adapter, ids.to(dev), e)

            def grad_fn(emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                x, f = scores(emb, True)
                return f.detach().T, per_target_grads(x, f)

            with torch.no_grad():
                _, fends = scores(torch.stack([e, eb]), False)
            path = PathCache(e, eb, grad_fn, batch_size, dev)
            ig, rec = integrate_adaptive(
                path,
                fends[0] - fends[1],
                fends.abs().amax(0),
                m.rule,
                m.steps,
                m.adaptive,
                m.tolerance,
                m.max_steps,
                [S + j + 1 for j in range(k)],
            )
            matrices[name] = ig.cpu().numpy() * allowed
            comp = np.stack(
                [
                    np.array(
                        [
                            rec["delta"][j],
                            rec["relative_error"][j],
                            float(fends[0, j]),
                            float(fends[1, j]),
                            rec["sum_attributions"][j],
                        ]
                    )
                    for j in range(k)
                ]
            )
            ig_info = {"baseline_used": used, "completeness": comp, "rec": rec}
        elif isinstance(m, Occlusion):
            occ = seq2seq_occlusion(adapter, src, gen, m, target, batch_size)
            matrices[name] = occ.matrix
            extra["occlusion.removed"] = (
                occ.removed,
                ["generated", "token"],
                "1 where the token was removed for that row's occlusion score (0: not an input of the row, a kept "
                "special token, the decoder start token or, with delete, the input the row is read after)",
            )
        elif isinstance(m, _Sampled):
            sr = sampled.seq2seq_sampled(adapter, src, gen, m, target, batch_size, seed)
            matrices[name] = sr.matrix
            infos[name] = sr.info
            extra[f"{name}.features"] = (
                sr.features,
                ["generated", "token"],
                f"1 where the token is one of that row's {name} features (0: not an input of the row, a special "
                "token, the decoder start token or, with delete, the input the row is read after)",
            )
        elif name in ("gradient_x_input", "saliency"):
            x, f = scores(e[None], True)
            g = per_target_grads(x, f)[:, 0]  # [k, S+T, d]
            s = (g * e).sum(-1) if name == "gradient_x_input" else g.norm(dim=-1)
            matrices[name] = s.detach().cpu().numpy() * allowed
        else:
            att = cast(Attention, m)
            fwd = adapter.run(src.view(1, -1), dec.view(1, -1), record=["*.pattern"])
            for fam, cols in (("cross_attn", slice(0, S)), ("self_attn", slice(S, width))):
                full = torch.stack(
                    [fwd.cache[f"decoder.layers.{l}.{fam}.pattern"][0] for l in range(adapter.n_decoder_layers)]
                )  # [layer, head, k, keys]
                mat = np.zeros((k, width))
                mat[:, cols] = _view(att, full).double().cpu().numpy()
                matrices[f"attention.{fam}"] = mat
                extra[f"attention.{fam}.all"] = (
                    full.double().cpu().numpy(),
                    ["layer", "head", "generated", "source" if fam == "cross_attn" else "decoder_input"],
                    f"decoder {fam} pattern of every layer and head; row j is decoder input j, the query that "
                    "predicts generated token j",
                )
            enc = torch.stack(
                [fwd.cache[f"encoder.layers.{l}.attn.pattern"][0] for l in range(adapter.n_encoder_layers)]
            )
            extra["attention.encoder"] = (
                enc.double().cpu().numpy(),
                ["layer", "head", "source", "source"],
                "encoder self-attention of every layer and head (independent of the target)",
            )
    secs = time.time() - t0
    tok = adapter.tokenizer
    tokens = [str(t) for t in tok.convert_ids_to_tokens(ids.tolist())]
    labels = [adapter.token_label(t) for t in tokens]
    generated = [cast(str, tok.decode([i])) for i in gen]
    first = next(iter(matrices))
    res = GenerationResult(rf.out, tokens, generated, matrices[first], allowed, matrices=matrices)
    with rf.staging() as w:
        for name, mat in matrices.items():
            w.add_array(f"{name}.matrix", mat.astype(np.float32), axes=["generated", "token"], meaning=_meaning(name))
            _figure(mat, allowed, labels, generated, w.path / _figure_name(name), name)
            w.add_figure(
                file=_figure_name(name),
                shows=f"{name} per generated token (rows) over source then decoder-input tokens, each row divided by "
                "its max |score|; grey: not an input of that row",
            )
        for name, (arr, axes, meaning) in extra.items():
            w.add_array(name, arr.astype(np.float32), axes=axes, meaning=meaning)
        w.add_array(
            "allowed",
            allowed,
            axes=["generated", "token"],
            meaning="1 where the token is an input of that row's target (the whole source, decoder inputs 0..j)",
        )
        if ig_info is not None:
            w.add_array(
                "completeness",
                ig_info["completeness"],
                axes=["generated", "quantity"],
                meaning="[delta, delta/|dF|, F(e), F(e'), sum IG] per generated token",
            )
        w.add_array("generated_ids", np.asarray(gen, np.int64), axes=["generated"], meaning="the target token ids")
        parameters: dict[str, Any] = {"quantity": quantity, "new_tokens": k, "batch_size": batch_size, "seed": seed}
        parameters["methods"] = {name: m.params() for name, m in built.items()}
        if occ is not None:
            parameters["methods"]["occlusion"].update(occ.info)
        for name, info in infos.items():
            parameters["methods"][name].update(info)
        body: dict[str, Any] = {
            "model": adapter.describe(),
            "encoder_decoder": True,
            "source": source,
            "prompt": source,  # the report viewer's field
            "source_tokens": S,
            "tokens": tokens,
            "token_labels": labels,
            "columns": f"tokens[:{S}] are the source (encoder input), tokens[{S}:] the decoder inputs "
            "(start token, then the target but its last token)",
            "generated": generated,
            "generated_ids": gen,
            "continuation": "given" if forced else "greedy",
            # greedy decoding ends after the decoder's EOS, else at --new-tokens
            "stopped_at": stopped,
            "parameters": parameters,
            "methods": {name: {"array": f"{name}.matrix", "scores": _meaning(name)} for name in matrices},
        }
        if ig_info is not None:
            rec = ig_info["rec"]
            body["baseline_used"] = ig_info["baseline_used"]
            body["gradient_evaluations"] = rec["gradient_evaluations"]
            body["per_token"] = [
                {
                    "generated": g,
                    "converged": rec["converged"],
                    "steps": rec["steps"],
                    "relative_completeness_error": rec["relative_error"][j],
                }
                for j, g in enumerate(generated)
            ]
        w.write_manifest({**body, "seconds": round(secs, 2), "seed": seed})
    how = "given" if forced else ("greedy, ended by EOS" if stopped == "eos" else "greedy")
    res.summary.append(
        f"source: {source!r} -> target {tok.decode(gen)!r} ({k} tokens, {how}; "
        f"{quantity}; {', '.join(matrices)}; {secs:.1f} s)"
    )
    for name, mat in matrices.items():
        if len(matrices) > 1:
            res.summary.append(f"{name}:")
        for j, word in enumerate(generated):
            row = mat[j, : S + j + 1]
            top = np.argsort(-np.abs(row), kind="stable")[:3]
            res.summary.append(
                f"  {word!r:>14} <- "
                + ", ".join(f"{'src' if i < S else 'tgt'}:{labels[i]!r}@{i} {row[i]:+.3f}" for i in top)
            )
    return res


def _view(att: Attention, full: torch.Tensor) -> torch.Tensor:
    """The Attention method's view of ``[layer, head, query, key]`` -> ``[query, key]``."""
    if att.view == "layer_mean":
        return full.mean((0, 1))
    a = full[att.layer]
    if att.view == "head":
        return a[cast(int, att.head)]
    return a.amax(0) if att.view == "head_max" else a.mean(0)


def _meaning(name: str) -> str:
    return {
        IG: "integrated gradients of generated token j's quantity over the embeddings of the source and of the "
        "decoder inputs (one shared straight path; sums to F(e) - F(baseline) up to the completeness error)",
        "gradient_x_input": "sum_d e_i * dF_j/de_i over the source and decoder-input embeddings, signed",
        "saliency": "||dF_j/de_i||_2 over the source and decoder-input embeddings, unsigned",
        "occlusion": "F_j(x) - F_j(x with token i removed) over the source and decoder-input tokens (forced "
        "decoding; the removal rule is in the manifest's parameters.methods.occlusion.removal_rule)",
        "shap": "Kernel SHAP coefficient of token i's presence for generated token j, over that row's source and "
        "decoder-input tokens (exact Shapley values when every coalition is enumerated; removal rule in the manifest)",
        "lime": "LIME coefficient of token i's presence for generated token j, over that row's source and "
        "decoder-input tokens (removal rule in the manifest)",
        "attention.cross_attn": "cross-attention of decoder input j (the query predicting generated token j) to "
        "the source tokens (source columns; the decoder-input columns are 0)",
        "attention.self_attn": "decoder self-attention of decoder input j to decoder inputs 0..j (target columns; "
        "the source columns are 0)",
    }[name]
