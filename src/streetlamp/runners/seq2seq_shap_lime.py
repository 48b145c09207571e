"""Kernel SHAP and LIME for ``explain-generation`` on an encoder-decoder: coalitions of source and target tokens.

Row ``j`` (target token ``y_j``, forced decoding) is one SHAP / LIME problem over its own features: the
source tokens but the tokenizer's structural specials, then decoder inputs ``1 .. j`` (the earlier
target tokens; under ``delete`` not input ``j``, the one ``y_j`` is read after). A coalition's absent
features are removed by the rule of :mod:`.seq2seq_occlusion` (replaced by ``replacement``, or deleted:
later decoder inputs move left and ``y_j`` is read after the last one left), and ``F_j`` is read on the
source and decoder inputs ``0 .. j``. The fit is the single-sequence method's own
(:meth:`~streetlamp.methods.shap_lime.Shap.fit`, :meth:`~streetlamp.methods.shap_lime.Lime.fit`): with
``2^M - 2 <= n_samples`` Kernel SHAP enumerates every coalition and gives the exact Shapley values.
Each row draws its coalitions from ``numpy.random.default_rng([seed, j])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..batching import chunks
from ..errors import StreetlampError
from ..methods.scorer import check_replacement
from ..methods.shap_lime import _Sampled
from ..models.adapter import Target
from ..models.seq2seq import Seq2SeqAdapter
from .seq2seq_occlusion import rule_text


@dataclass
class SampledResult:
    matrix: np.ndarray  # [k, S+k]: each feature's coefficient in its row; 0 where not a feature
    features: np.ndarray  # [k, S+k] uint8: 1 where the token is a feature of that row
    info: dict


def check_params(adapter: Seq2SeqAdapter, method: _Sampled) -> tuple[str, int | None, str | None]:
    check_replacement(method.replacement, method.group)
    if method.group != "token":
        raise StreetlampError(
            f"{method.name} on an encoder-decoder perturbs single tokens: group 'word' is not built there (use 'token')"
        )
    if not isinstance(method.n_samples, int) or method.n_samples < 2:
        raise StreetlampError(f"{method.name}: n_samples must be an integer >= 2, got {method.n_samples!r}")
    return adapter.replacement_token(method.replacement)


def seq2seq_sampled(
    adapter: Seq2SeqAdapter,
    src: torch.Tensor,
    gen: list[int],
    method: _Sampled,
    target: Target,
    batch_size: int | None = None,
    seed: int = 0,
) -> SampledResult:
    """SHAP or LIME coefficients of every row over its source and decoder-input features."""
    used, tid, token = check_params(adapter, method)
    src = src.cpu()
    dec = adapter.decoder_inputs(gen)
    S, k = len(src), len(gen)
    src_feats = [i for i in range(S) if not adapter.special_mask(src)[i]]
    if tid is None and len(src_feats) == S:
        raise StreetlampError("deleting every source token would leave the encoder no input: use a replacement")
    matrix = np.zeros((k, S + k))
    features = np.zeros((k, S + k), np.uint8)
    rows: list[dict[str, Any]] = []
    for j in range(k):
        dec_feats = list(range(1, j + 1 if tid is not None else j))
        cols = src_feats + [S + i for i in dec_feats]
        m = len(cols)
        if m == 0:
            rows.append({"features": 0})
            continue
        method.check_samples(m)
        d = dec[: j + 1]
        index = torch.tensor([gen[j]], dtype=torch.long)

        def value(z: np.ndarray, d: torch.Tensor = d, index: torch.Tensor = index) -> np.ndarray:
            pairs = []
            for present in np.asarray(z, dtype=bool):
                gone_s = [src_feats[a] for a in np.flatnonzero(~present[: len(src_feats)])]
                gone_d = [dec_feats[a] for a in np.flatnonzero(~present[len(src_feats) :])]
                pairs.append((_remove(src, gone_s, tid), _remove(d, gone_d, tid)))
            return _scores(adapter, pairs, index, target, batch_size)

        with torch.no_grad():
            f_full = float(adapter.score(adapter.run(src.view(1, -1), d.view(1, -1)).logits[0, -1:], index, target)[0])
        phi, _, _, _, info = method.fit(m, value, f_full, np.random.default_rng([seed, j]))
        matrix[j, cols] = phi
        features[j, cols] = 1
        rows.append({"features": m, "F": f_full, **info})
    return SampledResult(
        matrix,
        features,
        {
            "replacement": method.replacement,
            "replacement_used": used,
            "replacement_token": token,
            "removal_rule": rule_text(used, token, False),
            "rows": rows,
        },
    )


def _remove(ids: torch.Tensor, gone: list[int], tid: int | None) -> torch.Tensor:
    if not gone:
        return ids
    if tid is None:
        keep = torch.ones(len(ids), dtype=torch.bool)
        keep[gone] = False
        return ids[keep]
    out = ids.clone()
    out[gone] = tid
    return out


def _scores(
    adapter: Seq2SeqAdapter,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    index: torch.Tensor,
    target: Target,
    batch_size: int | None,
) -> np.ndarray:
    """F at the last decoder position of each (source, decoder inputs) pair, batched by shape and budget."""
    out = np.zeros(len(pairs))
    shapes: dict[tuple[int, int], list[int]] = {}
    for n, (s, d) in enumerate(pairs):
        shapes.setdefault((len(s), len(d)), []).append(n)
    for (ls, ld), members in shapes.items():
        for sl in chunks(len(members), ls + ld, batch_size, adapter.device):
            idx = members[sl]
            with torch.no_grad():
                logits = adapter.run(
                    torch.stack([pairs[n][0] for n in idx]), torch.stack([pairs[n][1] for n in idx])
                ).logits[:, -1]
            out[idx] = adapter.score(logits, index.repeat(len(idx)), target).double().cpu().numpy()
    return out
