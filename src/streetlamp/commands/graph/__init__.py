"""``streetlamp graph PROMPT --features DICT``: the attribution graph of a prompt through transcoders (the local
replacement model: attention patterns and norm denominators frozen, errors as nodes), pruned by influence, its
replacement and completeness scores, its top paths, and its claims audited on the real model (METHODS.md §13;
the computation: :mod:`streetlamp.interventions.graphs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


def _fraction(name: str, v: float) -> None:
    if not 0 < v <= 1:
        raise StreetlampError(f"--{name} {v:g} is outside (0, 1]: it is the fraction of influence kept")


@dataclass
class GraphSettings(Settings):
    text: str = option("", positional=True)
    features: str | None = option(
        None, help="a feature-set folder with transcoders (dictionaries at 'mlp'), e.g. from features-fit (required)"
    )
    node_threshold: float = option(0.8, help="keep the fewest nodes holding this share of influence (default 0.8)")
    edge_threshold: float = option(0.98, help="keep the fewest edges holding this share of influence (default 0.98)")
    max_logits: int = option(10, ge=1, le=1000, help="at most this many logit nodes (default 10)")
    logit_prob: float = option(0.95, help="logit nodes until their cumulative probability reaches this (default 0.95)")
    max_feature_nodes: int = option(
        7500, ge=1, help="at most this many feature nodes, the most influential (circuit-tracer's default 7500)"
    )
    rows: int = option(
        4, ge=1, le=4096, help="graph rows per backward pass (the prompt repeated: memory grows with it; default 4)"
    )
    rows_memory_gb: float = option(
        8.0,
        ge=0,
        help="the graph's rows buffer ((logits + feature nodes) x (active features + errors + tokens) float32) in "
        "memory up to this many GiB, in a temporary file beyond (default 8)",
    )
    top: int = option(10, ge=1, le=1000, help="top paths printed and features / edges audited (default 10)")
    head_edges: int = option(
        50, ge=0, le=100_000, help="split this many kept cross-position edges (largest first) over heads (default 50)"
    )
    qk_heads: int = option(
        5,
        ge=0,
        le=1000,
        help="explain (QK in feature units) and audit why this many edge-carrying heads attended (default 5; "
        "needs --head-edges)",
    )
    audit: bool = option(True, flag="--no-audit", help="skip the audit on the real model")
    zero_bos: bool = option(True, flag="--keep-bos", help="give a special first token (BOS) feature and error nodes")

    def check(self) -> None:
        super().check()
        if not self.text.strip():
            raise StreetlampError("empty prompt: give the text whose next token the graph explains")
        if not self.features:
            raise StreetlampError("graph needs --features FOLDER: the transcoders the replacement model uses")
        _fraction("node-threshold", self.node_threshold)
        _fraction("edge-threshold", self.edge_threshold)
        _fraction("logit-prob", self.logit_prob)

    def validate(self, adapter: ModelAdapter) -> None:
        from ...interventions.graphs.replacement import check_replacement
        from ...models.dictionaries import load_features

        if not adapter.kind.causal:
            check_replacement(adapter)  # the kind's refusal, before reading any dictionary
        assert self.features is not None
        adapter.attach_features(load_features(self.features))
        check_replacement(adapter)
        adapter.encode([self.text])  # one line when the prompt is longer than the model's window


GRAPH = Command(
    "graph",
    "attribution graph through transcoders (frozen attention and norms, errors as nodes), pruned by influence, "
    "scored, and audited on the real model",
    GraphSettings,
    lazy(__name__ + ".run"),
    shared=Shared(model="smollm2-135m"),
    views=("graph",),
)
