"""Integrated gradients over the token embeddings (site ``embed``).

Sundararajan, Taly & Yan, ICML 2017, "Axiomatic Attribution for Deep Networks"::

    IG_i = Σ_d (e_i,d − e'_i,d) · ∫₀¹ ∂F(e' + α(e − e'))/∂e_i,d dα

with the integral replaced by a quadrature rule ``Σ_k w_k g(α_k)`` on [0, 1] (the rules, their
errors and the adaptive step control are in :mod:`streetlamp.methods.quadrature`).

Baselines ``e'``: ``pad`` (default; [PAD] embedding, what Captum's LayerIntegratedGradients uses with
its default all-zero baseline ids on BERT), ``zero`` (on pre-norm decoders the all-zero embedding
is a degenerate point: with rules that evaluate alpha = 0 the gradient there is not finite and
streetlamp stops with a clear error), ``mask`` ([MASK] embedding; tokenizers
without a mask token fall back to [PAD], recorded in ``info["baseline_used"]``). With
``keep_special=True`` (default) the model's structural special tokens ([CLS], [SEP], BOS, ...; not
[UNK], which stands for real text) keep their own embedding in the baseline, so they get exactly
zero attribution. All interpolation rows are batched within the
token budget ``batch_size`` (rows × length), one forward + backward per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target
from ..results import Explanation
from .base import CAUSAL_LM, CLASSIFIER, ENCODER_DECODER, Method, ViewAttribution
from .gradient import embed_ids, ids_inputs
from .quadrature import RULES, PathCache, first_nodes, integrate_adaptive
from .views import PrefixView, SequenceView, View, per_target_grads

# unk: inseq's default (its baseline ids are the unk token); document: the document-start token of a causal LM
# (methods/removal.sink_token: <|endoftext|> on GPT-2 / SmolLM2), explain-generation's default (docs/decoder.md)
BASELINES = ("zero", "pad", "mask", "unk", "document")


ZERO_TOKEN_EMBEDDING = (
    " (the zero vector in this model: on a pre-norm model the RMSNorms make F step very close to the "
    "baseline, a step global rules miss and only rule 'panels' bisects to; the completeness error says how "
    "much is missed; choose baseline 'mask' or another token)"
)


def rule_of(rule: str, rec: dict) -> str:
    """The rule in words: ``auto`` names the rule the coarse pass chose (or, at fixed steps, Clenshaw–Curtis)."""
    if rule != "auto":
        return rule
    return f"auto -> {rec.get('rule_used', 'clenshaw_curtis')}"


@dataclass
class IntegratedGradients(Method):
    """Integrated gradients over the token embedding (site ``embed``); see the module docstring."""

    baseline: str = "pad"
    rule: str = "auto"
    steps: int = 16
    adaptive: bool = True
    tolerance: float = 1e-3
    max_steps: int = 256
    keep_special: bool = True

    name = "integrated_gradients"
    family = "gradient"
    description = "integrated gradients over token embeddings, completeness error recorded, adaptive steps"
    needs_gradients = True
    reports_completeness = True
    kinds = (CLASSIFIER, CAUSAL_LM, ENCODER_DECODER)

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self._check_model(adapter)

    def check_view(self, view: View) -> None:
        super().check_view(view)
        self._check_model(view.adapter)

    def _check_model(self, adapter: ModelAdapter) -> None:
        self.check_params()
        if self.baseline == "document" and not adapter.kind.causal:
            raise StreetlampError("IG baseline 'document' (the document-start token) is for causal LMs")

    def check_params(self) -> None:
        """The parameter checks that need no model."""
        if self.rule not in RULES:
            raise StreetlampError(f"unknown IG rule {self.rule!r}; choose one of {', '.join(RULES)}")
        if self.baseline not in BASELINES:
            raise StreetlampError(f"unknown IG baseline {self.baseline!r}; choose one of {', '.join(BASELINES)}")
        if self.steps < 1 or self.max_steps < self.steps:
            raise StreetlampError(
                f"IG needs 1 <= steps <= max_steps (got steps={self.steps}, max_steps={self.max_steps})"
            )
        if not self.tolerance > 0:
            raise StreetlampError(f"IG tolerance must be > 0 (got {self.tolerance})")
        if self.rule == "romberg" and self.steps & (self.steps - 1):
            raise StreetlampError(f"rule 'romberg' needs steps a power of 2 (got {self.steps})")
        if self.rule == "panels" and self.steps % 4:
            raise StreetlampError(f"rule 'panels' needs steps divisible by 4 (got {self.steps}): 5-point Boole panels")

    # -- baselines ---------------------------------------------------------------------------
    def baseline_embedding(self, adapter: ModelAdapter, ids: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, str]:
        tok = adapter.tokenizer
        if self.baseline == "zero":
            eb, used = torch.zeros_like(e), "zero vector"
        else:
            tid, used = (tok.mask_token_id, f"{tok.mask_token} embedding") if self.baseline == "mask" else (None, "")
            if self.baseline == "document":
                from .removal import sink_token

                tid = sink_token(adapter)
                used = f"document-start token {tok.convert_ids_to_tokens(int(tid))!r} embedding"
            elif self.baseline == "unk" and tok.unk_token_id is not None:
                tid, used = tok.unk_token_id, f"{tok.unk_token} embedding (inseq's baseline)"
            if tid is None:
                if self.baseline == "mask":
                    used = "no mask token in this tokenizer: fell back to "
                tid = adapter.pad_token_id
                used += f"pad token {tok.convert_ids_to_tokens(int(tid))!r} embedding"
            eb = embed_ids(adapter, torch.full_like(ids, int(tid)))
            if not bool(eb.abs().amax() > 0):  # e.g. Gemma initialises the padding row of its embedding to 0
                used += ZERO_TOKEN_EMBEDDING
        if self.keep_special:
            special = torch.as_tensor(adapter.special_mask(ids), device=e.device)
            eb = torch.where(special.view(-1, 1), e, eb)
            used += "; structural special tokens kept at their own embedding"
        return eb, used

    # -- the method, once, over the attribution view -------------------------------------------
    def integrate(self, view: View, batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict, str]:
        """IG of every row of ``view`` over one straight path from the baseline to the columns' embeddings:
        ``ig`` ``[k, n]``, ``F`` at the input and the baseline ``[2, k]``, the quadrature record, the baseline
        used. Every row shares the path: row j depends only on the columns it sees, so its IG over the
        shared path is the IG of its own inputs."""
        adapter = view.adapter
        e = view.embeddings()
        eb, used = self.baseline_embedding(adapter, view.ids.to(adapter.device), e)

        def grad_fn(emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # alpha = 1 is e itself (PathCache): a view that still has to resolve its explained output reads it there
            hit = (emb == e).flatten(1).all(1).nonzero()
            x, f = view.scores(emb, True, int(hit[0, 0]) if len(hit) else None)
            return f.detach().T, per_target_grads(x, f, view.batched_grads)  # F [targets, rows]

        path = PathCache(e, eb, grad_fn, batch_size, adapter.device)
        first = first_nodes(self.rule, self.steps, self.adaptive)
        if 0.0 in first and 1.0 in first:  # F at both ends comes with the first pass's gradients (no extra pass)
            path.evaluate(first)
            fends = torch.stack([path.fvals[1.0], path.fvals[0.0]])
        else:
            with torch.no_grad():
                _, fends = view.scores(torch.stack([e, eb]), False)
        ig, rec = integrate_adaptive(
            path,
            fends[0] - fends[1],
            fends.abs().amax(0),
            self.rule,
            self.steps,
            self.adaptive,
            self.tolerance,
            self.max_steps,
            view.lengths,
        )
        return ig, fends, rec, used

    def attribute_view(self, view: View, *, batch_size: int | None = None, seed: int = 0) -> ViewAttribution:
        self.check_view(view)
        ig, fends, rec, used = self.integrate(view, batch_size)
        comp = np.array(
            [
                [rec["delta"][j], rec["relative_error"][j], float(fends[0, j]), float(fends[1, j])]
                + [rec["sum_attributions"][j]]
                for j in range(view.k)
            ],
            dtype=np.float64,
        )
        return ViewAttribution(
            {"": ig.detach().cpu().numpy() * view.allowed},
            {"completeness": (comp, ["generated", "quantity"], "[delta, delta/|dF|, F(e), F(e'), sum IG] per row")},
            {"baseline_used": used, "rec": rec},
        )

    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out = []
        for b in range(len(inputs)):
            view = SequenceView(adapter, inputs, b, target)
            ig, fends, rec, used = self.integrate(view, batch_size)
            index = int(view.index()[0])
            out.append(self._explanation(adapter, inputs, b, index, target, ig[0], fends[0, 0], fends[1, 0], rec, used))
        return out

    def _explanation(
        self,
        adapter: ModelAdapter,
        inputs: Inputs,
        b: int,
        index: int,
        target: Target,
        ig: torch.Tensor,
        fe: torch.Tensor,
        fb: torch.Tensor,
        rec: dict,
        used: str,
        j: int = 0,
        **extra: object,
    ) -> Explanation:
        comp = np.array(
            [rec["delta"][j], rec["relative_error"][j], float(fe), float(fb), rec["sum_attributions"][j]],
            dtype=np.float64,
        )
        info = {k: v for k, v in rec.items() if k not in ("delta", "relative_error", "sum_attributions")}
        return self.explanation(
            adapter,
            inputs,
            b,
            index,
            target,
            arrays={"tokens": ig.cpu().numpy().astype(np.float32), "completeness": comp},
            axes={"tokens": ["token"], "completeness": ["quantity"]},
            meaning={
                "tokens": f"integrated gradients over the token embedding (site embed), {rule_of(self.rule, rec)}, "
                f"baseline {used}; sums to F(e) - F(baseline) up to the completeness error",
                "completeness": "[delta = |sum IG - (F(e) - F(e'))|, delta / |F(e) - F(e')|, F(e), F(e'), sum IG]",
            },
            site="embed",
            baseline_used=used,
            completeness_error=rec["delta"][j],
            relative_completeness_error=rec["relative_error"][j],
            F_input=float(fe),
            F_baseline=float(fb),
            **info,
            **extra,
        )

    # -- several generated tokens sharing forward passes ----------------------------------------
    def attribute_sequence(
        self,
        adapter: ModelAdapter,
        prompt: str,
        continuation: Sequence[int] | int,
        *,
        target: Target = Target(),
        batch_size: int | None = None,
        batched_grads: bool = False,
    ) -> list[Explanation]:
        """IG for each token of ``continuation`` (ids, or a number of greedily generated tokens).

        One interpolation path over the whole sequence serves every target (the model is causal,
        so target j at position P+j−1 depends only on the first P+j tokens and their straight path
        is the prefix of the full path): one forward per chunk of steps, then one backward per
        target (``retain_graph``) or one vmapped backward (``batched_grads=True``). Returns one
        Explanation per continuation token, scores over all tokens before it. ``target`` supplies
        the quantity and an optional contrast; its ``index`` is ignored.
        """
        self.check(adapter)
        if not adapter.kind.causal:
            raise StreetlampError("attribute_sequence needs a causal LM")
        prompt_ids = adapter.encode(prompt).input_ids[0].to(adapter.device)
        cont = adapter.generate(prompt_ids, continuation) if isinstance(continuation, int) else list(continuation)
        if not cont:
            raise StreetlampError("attribute_sequence: no continuation tokens")
        for t in cont:
            if not 0 <= int(t) < adapter.n_outputs:
                raise StreetlampError(f"token id {t} out of range: the vocabulary has {adapter.n_outputs} ids")
        P, k = len(prompt_ids), len(cont)
        view = PrefixView(adapter, prompt_ids, [int(t) for t in cont], target, batched_grads)
        ids = view.ids_dev
        lengths = view.lengths
        ig, fends, rec, used = self.integrate(view, batch_size)
        out = []
        for j in range(k):
            pre = ids_inputs(adapter, ids[: lengths[j]].cpu())
            out.append(
                self._explanation(
                    adapter,
                    pre,
                    0,
                    int(cont[j]),
                    Target(int(cont[j]), target.contrast, target.quantity),
                    ig[j, : lengths[j]],
                    fends[0, j],
                    fends[1, j],
                    rec,
                    used,
                    j=j,
                    position=P - 1 + j,
                    generated_index=j,
                    shared_path=True,
                )
            )
        return out
