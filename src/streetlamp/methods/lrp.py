"""AttnLRP (Achtibat et al., ICML 2024, "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation
for Transformers"), as gradient × input under the modified backward pass of
:mod:`streetlamp.models.relevance` (the authors' "efficient" formulation in their package ``lxt``).

``tokens[i] = Σ_d e_i,d · ∂̃F/∂e_i,d`` over the token embedding ``e_i`` (site ``embed``), where
``∂̃`` is the gradient with the AttnLRP rules: softmax by Taylor at its input, the uniform rule on
both attention products and on gated MLP products, the identity rule on LayerNorm/RMSNorm
(standard deviation held constant) and on element-wise activations.

What is explained is always a **logit** (or a logit difference with ``contrast``): LRP
decomposes a logit, and the softmax over the vocabulary or classes is not part of it. A target
asking for a probability or log-prob is explained through its logit, and the output says so.

Final-logit soft-capping (Gemma 2 and 3, ``F = cap · tanh(l / cap)``): what is explained is the
model's own, **capped** logit ``F`` (the number every other method explains); the cap gets the
identity rule, so each relevance is ``F / l`` times that of the uncapped logit ``l``. The output
states ``final_logit_softcap`` (``cap``, or None) and ``F_before_cap`` (``l``).

Conservation: ``F = Σ_i tokens[i] + (position and token-type embeddings) + (biases) +
(what the attention softmaxes absorb)``; the last three are ``info["unassigned"] = F - Σ tokens``.
Tests check the full ledger term by term and compare with ``lxt`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..models.families import FamilyTable
from ..models.readout import final_softcap
from ..models.relevance import attention_edits
from ..results import Explanation
from .base import Method
from .gradient import embed_ids, ids_inputs, resolve_one, text_batches


def attnlrp_relevance(
    adapter: ModelAdapter, ids: torch.Tensor, index: int, target: Target, record: tuple[str, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Token relevance ``[pos]`` of the logit ``F`` for token ids ``[pos]``, F itself, and the
    recorded sites (kept in the graph, so callers can take further modified gradients)."""
    x = embed_ids(adapter, ids).detach().requires_grad_(True)
    edits = attention_edits(adapter.n_layers)
    edits["embed"] = lambda e: x.to(e.dtype)[None]
    with adapter.relevance_rules():
        fwd = adapter.forward(ids_inputs(adapter, ids), record=record, edit=edits, keep_grad=bool(record), grad=True)
        idx = torch.tensor([index], device=fwd.logits.device)
        f = adapter.score(fwd.logits, idx, replace(target, quantity="logit"))[0]
        (g,) = torch.autograd.grad(f, x, retain_graph=bool(record))
    return (x.detach() * g).sum(-1), f, fwd.cache


# families whose norms, activations and gated products have rules (the conservation test passes on each):
# each family's ``attnlrp_refusal`` is None (models/families); else it says why the family is refused
RULE_FAMILIES: FamilyTable[bool] = FamilyTable(lambda f: True if f.attnlrp_refusal is None else None)


@dataclass
class AttnLRP(Method):
    """AttnLRP relevance of each token embedding for the explained logit (signed; conserving up
    to the relevance that biases, position embeddings and the attention softmaxes absorb)."""

    name = "attnlrp"
    family = "gradient"
    description = "AttnLRP: layer-wise relevance of each token for the logit (gradient x input, LRP rules)"
    needs_gradients = True

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        why = adapter.family.attnlrp_refusal
        if why is not None:
            raise StreetlampError(
                f"attnlrp's rules cover {', '.join(RULE_FAMILIES)}; not {adapter.family.name} ({why})"
            )

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        explained = replace(target, quantity="logit")
        out = []
        for b, ids in text_batches(adapter, inputs):
            with torch.no_grad():
                logits = adapter.forward(ids_inputs(adapter, ids)).logits[0]
            index = resolve_one(adapter, ids, target, logits)
            r, f, _ = attnlrp_relevance(adapter, ids, index, target)
            f = f.detach()
            r64 = r.double()
            cap = final_softcap(adapter)
            before = float(cap * np.arctanh(float(f) / cap)) if cap and target.contrast is None else None
            out.append(
                self.explanation(
                    adapter,
                    inputs,
                    b,
                    index,
                    explained,
                    arrays={"tokens": r.float().cpu().numpy().astype(np.float32)},
                    axes={"tokens": ["token"]},
                    meaning={"tokens": "AttnLRP relevance of each token embedding (site embed) for the logit, signed"},
                    site="embed",
                    F=float(f),
                    relevance_sum=float(r64.sum()),
                    unassigned=float(f.double() - r64.sum()),
                    asked_quantity=target.quantity,
                    final_logit_softcap=cap,
                    F_before_cap=before,
                )
            )
        return out
