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

from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import Method
from .features import feature_groups
from .removal import Removal
from .scorer import Scorer, check_replacement, explanation_common, occlusion_replacement


@dataclass
class Occlusion(Method):
    """Leave-one-out occlusion of tokens or words.

    ``replacement``: ``mask`` | ``unk`` | ``pad`` | ``delete``; when the tokenizer lacks the token the
    fallback chain mask -> unk -> pad -> eos is used and recorded, except that a causal LM without
    [MASK] deletes the token (its stand-ins are document markers that wipe the context).
    ``group``: ``token`` or ``word``. ``kv_cache``: reuse the unperturbed prefix on causal LMs.
    """

    replacement: str = "mask"
    group: str = "token"
    occlude_special: bool = False
    kv_cache: bool = True

    name = "occlusion"
    family = "perturbation"
    description = "leave-one-out: F(x) - F(x with the token replaced by [MASK]/[UNK]/[PAD] or deleted)"

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        check_replacement(self.replacement, self.group)
        occlusion_replacement(adapter, self.replacement)

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        used, tid, tok = occlusion_replacement(adapter, self.replacement)
        rule = Removal.of(adapter, tid)
        rule_note = rule.describe(adapter)
        out = []
        for b, n in enumerate(inputs.lengths):
            ids = inputs.input_ids[b, :n].cpu()
            groups, feats = feature_groups(
                adapter, ids.tolist(), inputs.tokens[b], self.group, self.occlude_special, rule.protected(n)
            )
            scorer = Scorer(adapter, ids, target, batch_size, use_cache=self.kv_cache, desc="occlusion")
            absent = [groups == k for k in range(len(feats))]
            values = scorer([rule.row(ids, a) for a in absent])
            drop = scorer.base - values
            scores = np.where(groups >= 0, drop[np.maximum(groups, 0)] if len(feats) else 0.0, 0.0)
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    int(scorer.index[0]),
                    target,
                    arrays={"tokens": scores.astype(np.float32), "groups": groups},
                    axes={"tokens": ["token"], "groups": ["token"]},
                    meaning={
                        "tokens": f"F(x) - F(x with the {self.group} removed); "
                        + explanation_common(self.name, used, tok, self.replacement)["replacement_note"]
                        + (f"; {rule_note}" if rule_note else ""),
                        "groups": f"occluded {self.group} id per token (-1: not occluded, e.g. special tokens"
                        + (", the explained position)" if rule.keep_last else ")"),
                    },
                    base_score=scorer.base,
                    perturbed_scores=values.tolist(),
                    n_features=len(feats),
                    kv_cache_used=scorer.use_cache,
                    removal_rule=rule_note,
                    positions_computed=scorer.n_positions,
                    **explanation_common(self.name, used, tok, self.replacement),
                )
            )
        return out
