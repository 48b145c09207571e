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
from .base import Method
from .gradient import embed_ids, ids_inputs, resolve_one, scores_at, text_batches
from .quadrature import RULES, PathCache, integrate_adaptive

# unk: inseq's default (its baseline ids are the unk token); document: the document-start token of a causal LM
# (methods/removal.sink_token: <|endoftext|> on GPT-2 / SmolLM2), explain-generation's default (docs/decoder.md)
BASELINES = ("zero", "pad", "mask", "unk", "document")


ZERO_TOKEN_EMBEDDING = (
    " (the zero vector in this model: on a pre-norm model the first RMSNorm makes F jump within about "
    "sqrt(eps)/rms(e) of the baseline, a step no quadrature resolves; the completeness error says how much "
    "is missed; choose baseline 'mask' or another token)"
)


def per_target_grads(x: torch.Tensor, f: torch.Tensor, batched: bool = True) -> torch.Tensor:
    """``dF_j/dx`` for every target j of ``f`` ``[rows, k]`` computed from ``x`` ``[rows, ...]``: ``[k, rows, ...]``.

    Rows are independent inputs, so the gradient of ``sum_rows F_j`` holds each row's own gradient.
    ``batched``: one vmapped backward (``is_grads_batched``); else k backward passes, one per target,
    keeping the graph until the last (a lower peak than k at once). Both give the same values
    (tests/test_gradient.py); the causal-LM and encoder-decoder generation paths share this helper."""
    per_target = f.sum(0)  # [k]
    k = len(per_target)
    if batched:
        eye = torch.eye(k, dtype=per_target.dtype, device=per_target.device)
        return torch.autograd.grad(per_target, x, eye, is_grads_batched=True)[0]
    return torch.stack([torch.autograd.grad(per_target[j], x, retain_graph=j < k - 1)[0] for j in range(k)])


@dataclass
class IntegratedGradients(Method):
    """Integrated gradients over the token embedding (site ``embed``); see the module docstring."""

    baseline: str = "pad"
    rule: str = "clenshaw_curtis"
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

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.check_params()
        if self.baseline == "document" and adapter.kind != "causal_lm":
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

    # -- the one-target method ---------------------------------------------------------------
    def attribute(
        self, adapter: ModelAdapter, inputs: Inputs, *, target: Target, batch_size: int | None = None, seed: int = 0
    ) -> list[Explanation]:
        self.check(adapter)
        out = []
        for b, ids in text_batches(adapter, inputs):
            e = embed_ids(adapter, ids)
            eb, used = self.baseline_embedding(adapter, ids, e)
            with torch.no_grad():
                ends = adapter.forward(
                    ids_inputs(adapter, ids, 2), edit={"embed": lambda x: torch.stack([e, eb]).to(x.dtype)}
                )
            index = resolve_one(adapter, ids, target, ends.logits[0])
            f = adapter.score(ends.logits, torch.full((2,), index, device=ends.logits.device), target)

            def grad_fn(
                emb: torch.Tensor, index: int = index, ids: torch.Tensor = ids
            ) -> tuple[torch.Tensor, torch.Tensor]:
                f, g = scores_at(adapter, ids, emb, index, target, grad=True)
                return f[None], g[None]  # type: ignore[index]

            path = PathCache(e, eb, grad_fn, batch_size, adapter.device)
            ig, rec = integrate_adaptive(
                path,
                (f[0] - f[1]).view(1),
                f.abs().max().view(1),
                self.rule,
                self.steps,
                self.adaptive,
                self.tolerance,
                self.max_steps,
                [len(ids)],
            )
            out.append(self._explanation(adapter, inputs, b, index, target, ig[0], f[0], f[1], rec, used))
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
                "tokens": f"integrated gradients over the token embedding (site embed), {self.rule}, "
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
        if adapter.kind != "causal_lm":
            raise StreetlampError("attribute_sequence needs a causal LM")
        prompt_ids = adapter.encode(prompt).input_ids[0].to(adapter.device)
        cont = adapter.generate(prompt_ids, continuation) if isinstance(continuation, int) else list(continuation)
        if not cont:
            raise StreetlampError("attribute_sequence: no continuation tokens")
        for t in cont:
            if not 0 <= int(t) < adapter.n_outputs:
                raise StreetlampError(f"token id {t} out of range: the vocabulary has {adapter.n_outputs} ids")
        P, k = len(prompt_ids), len(cont)
        ids = torch.cat([prompt_ids, torch.tensor(cont[:-1], dtype=torch.long, device=adapter.device)])
        pos = torch.arange(P - 1, P - 1 + k, device=adapter.device)
        index = torch.tensor(cont, dtype=torch.long, device=adapter.device)
        e = embed_ids(adapter, ids)
        eb, used = self.baseline_embedding(adapter, ids, e)

        def scores(emb: torch.Tensor, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
            x = emb.detach().requires_grad_(grad)
            rows = x.shape[0]
            logits = adapter.logits_at(
                ids.expand(rows, -1), pos, edit={"embed": lambda v: x.to(v.dtype)}, grad=grad
            )  # [rows, k, vocab]
            f = adapter.score(logits.reshape(rows * k, -1), index.repeat(rows), target).view(rows, k)
            return x, f

        def grad_fn(emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, f = scores(emb, True)
            return f.detach().T, per_target_grads(x, f, batched_grads)  # F [targets, rows]

        _, fends = scores(torch.stack([e, eb]), False)
        path = PathCache(e, eb, grad_fn, batch_size, adapter.device)
        lengths = [P + j for j in range(k)]
        ig, rec = integrate_adaptive(
            path,
            fends[0] - fends[1],
            fends.abs().amax(0),
            self.rule,
            self.steps,
            self.adaptive,
            self.tolerance,
            self.max_steps,
            lengths,
        )
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
