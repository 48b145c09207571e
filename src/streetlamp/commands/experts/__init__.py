"""``streetlamp experts``: routing is not importance. Per (layer, expert) of a mixture-of-experts model, the router's
routing frequency and weight beside the effect of removing the expert (METHODS.md §14; the computation:
:mod:`streetlamp.interventions.experts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class ExpertsSettings(Settings):
    data: str = option(
        "movies",
        help="corpus: movies, tweets, drugs, a .txt file (one text per line) or a CSV/JSONL with a text column",
    )
    limit: int = option(16, ge=1, le=100_000, help="first N texts (default 16)")
    max_tokens: int = option(32, ge=2, le=4096, help="cut every text to its first N tokens (default 32)")
    renormalise: bool = option(
        False,
        help="when an expert is removed, rescale the token's other experts to its original total weight "
        "(default: keep their weights, so the layer's expert mass falls)",
    )
    tokens: bool = option(
        True, flag="--no-tokens", help="skip the per-token audit (one forward per layer x expert x text)"
    )
    bootstrap: int = option(1000, ge=0, le=100_000, help="bootstrap resamples of the texts for the intervals")
    floor: float = option(1e-3, gt=0, help="KL (nats) below which a removal's effect is within noise of zero")
    layers: str = option("all", help="layers whose experts are removed one at a time: comma-separated numbers or all")
    experts: str = option("all", help="experts removed one at a time (in each audited layer): numbers or all")
    top_k: int | None = option(
        None, ge=1, help="every router picks this many experts, by the family's own rule (default: the checkpoint's)"
    )
    remove: str = option(
        "",
        help="LAYER.EXPERT[,...]: experts taken out of every token's top-k in every forward (the others then audited "
        "without them); a token left with no expert is refused",
    )
    batch_tokens: int | None = option(
        None, ge=1, help="tokens per forward of the per-token removals (default: the device's budget)"
    )

    def validate(self, adapter: ModelAdapter) -> None:
        from ...interventions.experts import check_top_k, n_experts_of, parse_experts
        from ...specs import parse_indices

        if not adapter.kind.causal:
            raise StreetlampError("the expert audit compares next-token distributions: it needs a causal LM")
        n = n_experts_of(adapter)
        parse_indices(self.layers, adapter.n_layers, "--layers", "layer")
        parse_indices(self.experts, n, "--experts", "expert")
        if self.top_k is not None:
            check_top_k(adapter, self.top_k)
        gone = parse_experts(self.remove, adapter)
        for layer in sorted({l for l, _ in gone}):
            if sum(1 for l, _ in gone if l == layer) == n:
                raise StreetlampError(
                    f"--remove takes all {n} experts of layer {layer}: every token would be routed nowhere"
                )
        # fewer than all may still take every expert of some token: the audit's first forward refuses that


EXPERTS = Command(
    "experts",
    "routing vs importance: each expert's routing frequency and weight beside the effect of removing it (MoE models)",
    ExpertsSettings,
    lazy(__name__ + ".run"),
    shared=Shared(model=None, model_help="a mixture-of-experts checkpoint folder (Mixtral, Qwen-MoE, OLMoE)"),
    views=("generic",),
)
