"""The files of an ``explain-generation`` run: the heatmap of each method and, for an encoder-decoder, the
arrays, manifest and summary lines (columns *source tokens, then decoder inputs*, the start token first).

The numbers come from the methods themselves (:meth:`~streetlamp.methods.base.Method.attribute_view` over a
:class:`~streetlamp.methods.views.Seq2SeqView`); nothing here computes an attribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ...methods.base import ViewAttribution  # noqa: E402
from ...methods.views import Seq2SeqView  # noqa: E402
from ...report.compare import normalise_rows  # noqa: E402
from ...store.run_folder import RunFolder  # noqa: E402

IG = "integrated_gradients"


def figure_name(method: str) -> str:
    return "generation.png" if method == IG else f"generation_{method}.png"


def figure(
    matrix: np.ndarray, allowed: np.ndarray, labels: list[str], generated: list[str], path: Path, method: str = IG
) -> None:
    m = np.ma.masked_where(allowed == 0, normalise_rows(matrix.astype(np.float64)))
    k, n = m.shape
    fig, ax = plt.subplots(figsize=(min(3 + 0.45 * n, 30), 1.4 + 0.4 * k))
    ax.set_facecolor("#d9d9d9")
    im = ax.imshow(m, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n), labels, rotation=90, fontsize=8)
    ax.set_yticks(range(k), [repr(g) for g in generated], fontsize=8)
    ax.set_xlabel("input token")
    ax.set_ylabel("generated token")
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    short = "IG" if method == IG else method
    cb.set_label(f"{short} / max |{short}| of the row (signed)", fontsize=8)
    title = "Integrated gradients" if method == IG else method
    ax.set_title(f"{title} of each generated token (grey: not one of its inputs)", fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


ENCDEC_MEANING = {
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
}


def encdec_matrices(name: str, r: ViewAttribution) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """A method's matrices and extra arrays under their run-folder names (``attention.cross_attn``, ...)."""
    mats = {(f"{name}.{site}" if site else name): m for site, m in r.matrices.items()}
    extra = {f"{name}.{k}": v for k, v in r.arrays.items() if k != "completeness"}
    return mats, extra


def write_encdec(
    rf: RunFolder,
    view: Seq2SeqView,
    source: str,
    results: dict[str, ViewAttribution],
    built: dict[str, Any],
    *,
    forced: bool,
    stopped: str | None,
    quantity: str,
    batch_size: int | None,
    seed: int,
    secs: float,
) -> tuple[list[str], list[str], list[str], dict[str, np.ndarray]]:
    """Write the encoder-decoder run folder; returns (tokens, generated, summary lines, matrices)."""
    adapter, S, k = view.adapter, view.S, view.k
    gen = view.index().tolist()
    tok = adapter.tokenizer
    tokens = [str(t) for t in tok.convert_ids_to_tokens(view.ids.tolist())]
    labels = [adapter.token_label(t) for t in tokens]
    generated = [str(tok.decode([i])) for i in gen]
    matrices: dict[str, np.ndarray] = {}
    extra: dict[str, tuple] = {}
    for name, r in results.items():
        mats, more = encdec_matrices(name, r)
        matrices.update(mats)
        extra.update(more)
    ig = results.get(IG)
    with rf.staging() as w:
        for name, mat in matrices.items():
            w.add_array(
                f"{name}.matrix", mat.astype(np.float32), axes=["generated", "token"], meaning=ENCDEC_MEANING[name]
            )
            figure(mat, view.allowed, labels, generated, w.path / figure_name(name), name)
            w.add_figure(
                file=figure_name(name),
                shows=f"{name} per generated token (rows) over source then decoder-input tokens, each row divided by "
                "its max |score|; grey: not an input of that row",
            )
        for name, (arr, axes, meaning) in extra.items():
            w.add_array(name, arr.astype(np.float32), axes=axes, meaning=meaning)
        w.add_array(
            "allowed",
            view.allowed,
            axes=["generated", "token"],
            meaning="1 where the token is an input of that row's target (the whole source, decoder inputs 0..j)",
        )
        if ig is not None:
            w.add_array(
                "completeness",
                ig.arrays["completeness"][0],
                axes=["generated", "quantity"],
                meaning="[delta, delta/|dF|, F(e), F(e'), sum IG] per generated token",
            )
        w.add_array("generated_ids", np.asarray(gen, np.int64), axes=["generated"], meaning="the target token ids")
        parameters: dict[str, Any] = {"quantity": quantity, "new_tokens": k, "batch_size": batch_size, "seed": seed}
        parameters["methods"] = {name: m.params() for name, m in built.items()}
        for name, r in results.items():
            if name in ("occlusion", "shap", "lime"):
                parameters["methods"][name].update(r.info)
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
            "methods": {name: {"array": f"{name}.matrix", "scores": ENCDEC_MEANING[name]} for name in matrices},
        }
        if ig is not None:
            rec = ig.info["rec"]
            body["baseline_used"] = ig.info["baseline_used"]
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
    summary = [
        f"source: {source!r} -> target {tok.decode(gen)!r} ({k} tokens, {how}; "
        f"{quantity}; {', '.join(matrices)}; {secs:.1f} s)"
    ]
    for name, mat in matrices.items():
        if len(matrices) > 1:
            summary.append(f"{name}:")
        for j, word in enumerate(generated):
            row = mat[j, : S + j + 1]
            top = np.argsort(-np.abs(row), kind="stable")[:3]
            summary.append(
                f"  {word!r:>14} <- "
                + ", ".join(f"{'src' if i < S else 'tgt'}:{labels[i]!r}@{i} {row[i]:+.3f}" for i in top)
            )
    return tokens, generated, summary, matrices
