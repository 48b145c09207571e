"""Occlusion (leave-one-out): how much ``F`` drops when one token (or word) is taken away.

``score_i = F(x) - F(x with feature i absent)`` (METHODS.md section 4; Zeiler & Fergus 2014 for
images, Li, Monroe & Jurafsky 2016 "Understanding neural networks through representation
erasure" for text). A feature is one token, or with ``group="word"`` one word (its subword
tokens together); a word's score is given to each of its tokens. Absent tokens are replaced by
[MASK] (default), [UNK] or [PAD], or deleted. The model's structural special tokens ([CLS], [SEP],
...) are not occluded unless ``occlude_special`` (their score is 0 and ``groups`` is -1 there); an
[UNK] in the text is a real token and is occluded like any other.

On a causal LM with ``kv_cache`` the unperturbed prefix is reused: occluding token i recomputes
only positions >= i (see :meth:`~streetlamp.models.adapter.ModelAdapter.prefix_forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, Method, ViewAttribution
from .long_input import LongInput, LongRow
from .long_occlusion import check_window, occlusion_spans
from .scorer import REPLACEMENTS, check_replacement, explanation_common, occlusion_replacement
from .views import SequenceView, View


@dataclass
class Occlusion(Method):
    """Leave-one-out occlusion of tokens or words.

    ``replacement``: ``mask`` | ``unk`` | ``pad`` | ``delete``; when the tokenizer lacks the token the
    fallback chain mask -> unk -> pad -> eos is used and recorded, except that a causal LM without
    [MASK] deletes the token (its stand-ins are document markers that wipe the context).
    ``group``: ``token`` or ``word``. ``kv_cache``: reuse the unperturbed prefix on causal LMs.
    On an encoder-decoder (:class:`~streetlamp.methods.views.Seq2SeqView`) one removed token gives every
    row's cell at once (forced decoding: each row's target stays the one being explained).
    """

    replacement: str = "mask"
    group: str = "token"
    occlude_special: bool = False
    kv_cache: bool = True

    name = "occlusion"
    family = "perturbation"
    description = "leave-one-out: F(x) - F(x with the token replaced by [MASK]/[UNK]/[PAD] or deleted)"
    kinds = (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)
    long_input = True

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        check_replacement(self.replacement, self.group)
        occlusion_replacement(adapter, self.replacement)

    def check_view(self, view: View) -> None:
        super().check_view(view)
        check_replacement(self.replacement, self.group)
        if self.group not in view.groups:
            raise StreetlampError(
                f"{self.name} on an encoder-decoder removes single tokens: group {self.group!r} is not built there "
                "(use 'token')"
            )
        occlusion_replacement(view.adapter, self.replacement)

    def occlude(self, view: View, batch_size: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """The method, once: ``scores`` ``[k, n]`` (F_j(x) - F_j(x without the feature of column i)), the
        feature ids ``groups`` ``[k, n]``, the perturbed values ``[features, k]`` and the record."""
        adapter = view.adapter
        used, tid, tok = occlusion_replacement(adapter, self.replacement)
        groups, feats = view.features(self.group, self.occlude_special, tid is None, coalitions=False)
        pert = view.perturber(tid, batch_size, self.kv_cache, "occlusion")
        values = pert([np.isin(np.arange(view.n), f) for f in feats])
        drop = pert.base[None, :] - values  # [features, k]
        rows = np.arange(view.k)[:, None]
        scores = np.where(groups >= 0, drop[np.maximum(groups, 0), rows] if len(feats) else 0.0, 0.0)
        rule = view.removal_rule(used, tok, self.occlude_special)
        info = {"used": used, "token": tok, "rule": rule, "base": pert.base, "index": pert.index, **pert.stats}
        return scores, groups, values, info

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        self.check_view(view)
        scores, groups, _, rec = self.occlude(view, batch_size)
        return ViewAttribution(
            {"": scores},
            {
                "removed": (
                    (groups >= 0).astype(np.uint8),
                    ["generated", "token"],
                    "1 where the token was removed for that row's occlusion score (0: not an input of the row, a "
                    "kept special token, the decoder start token or, with delete, the input the row is read after)",
                )
            },
            {
                "replacement": self.replacement,
                "replacement_used": rec["used"],
                "replacement_token": rec["token"],
                "occlude_special": self.occlude_special,
                "removal_rule": rec["rule"],
                "forward_passes": rec.get("forward_passes"),
                "base_scores": rec["base"].tolist(),
            },
        )

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out = []
        for b in range(len(inputs)):
            view = SequenceView(adapter, inputs, b, target)
            scores, groups, values, rec = self.occlude(view, batch_size)
            used, tok, rule_note = rec["used"], rec["token"], rec["rule"]
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(rec["index"][0]),
                    target,
                    arrays={"tokens": scores[0].astype(np.float32), "groups": groups[0]},
                    axes={"tokens": ["token"], "groups": ["token"]},
                    meaning={
                        "tokens": f"F(x) - F(x with the {self.group} removed); "
                        + explanation_common(self.name, used, tok, self.replacement)["replacement_note"]
                        + (f"; {rule_note}" if rule_note else ""),
                        "groups": f"occluded {self.group} id per token (-1: not occluded, e.g. special tokens"
                        + (", the explained position)" if rule_note else ")"),
                    },
                    base_score=float(rec["base"][0]),
                    perturbed_scores=values[:, 0].tolist(),
                    n_features=len(values),
                    kv_cache_used=rec["kv_cache_used"],
                    removal_rule=rule_note,
                    positions_computed=rec["positions_computed"],
                    **explanation_common(self.name, used, tok, self.replacement),
                )
            )
        return out

    # -- long inputs: occlusion by spans (:mod:`.long_occlusion`) --------------------------------------
    def check_long(self, long: LongInput) -> None:
        long.window = check_window(long.window, long.n_tokens)
        if self.replacement not in REPLACEMENTS:
            raise StreetlampError(
                f"unknown occlusion replacement {self.replacement!r}; choose one of {', '.join(REPLACEMENTS)}"
            )

    def attribute_long(self, long: LongInput) -> LongRow:
        """Span occlusion (``long.window`` tokens a span): the prefix KV cache and fused suffix passes."""
        occ = occlusion_spans(long.adapter, long.inputs, long.target, long.window, self.replacement)
        meaning = (
            f"F(x) - F(x without the token's span of {occ.window} tokens) "
            f"(F = {long.target.describe(long.adapter, occ.index)}); absent tokens: {occ.replacement}"
            + (f"; {occ.rule}" if occ.rule else "")
            + "; 0 where a token is never removed (special tokens"
            + (", the explained position)" if occ.rule else ")")
        )
        return LongRow(
            occ.tokens,
            meaning,
            {
                "occlusion.spans": (occ.spans, ["span", "start_end"], "span k covers positions start..end-1", {}),
                "occlusion.drop": (
                    occ.drop,
                    ["span"],
                    "F(x) - F(x without span k) (float64)",
                    {"base_score": occ.base, "positions_computed": occ.positions_computed},
                ),
            },
            {"occlusion_window": occ.window, "occlusion_replacement": occ.replacement},
        )
