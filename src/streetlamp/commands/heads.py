"""``heads`` (ablate every head; with --data importance, attribution, attention mass) and ``prune``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import StreetlampError
from ..settings import Settings, Shared, at_least, option
from ..specs import split_list
from .base import Command

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

PRUNE_ORDERS = ("importance", "attribution", "attention", "random")


@dataclass
class HeadsSettings(Settings):
    text: str | None = option(None, positional=True, nargs="?")
    data: str | None = option(
        None, help=".txt (one per line), .csv/.jsonl with a 'text' (and 'label') column, or 'movies'"
    )
    ablation: str = option(
        "zero",
        choices=("zero", "mean", "resample"),
        help="mean/resample use the --data texts, or with a single TEXT a built-in set of 12 sentences",
    )
    target: str | None = option(None, help="class/token whose probability is F (default: prediction)")
    limit: int | None = option(None, help="use only the first N texts of --data")
    sample: int | None = option(
        None, help="use N texts of --data drawn with --seed (files sorted by label make --limit one-sided)"
    )
    attribution: bool = option(True, flag="--no-attribution", help="skip the (slow) Hao attribution column")

    def check(self) -> None:
        super().check()
        if (self.text is None) == (self.data is None):
            raise StreetlampError("give a TEXT or --data FILE")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        at_least(self.limit, 1, "--limit")
        at_least(self.sample, 1, "--sample")


def run_heads(adapter: ModelAdapter, s: HeadsSettings, out: Any, opts: Any) -> Any:
    from ..models.adapter import Target
    from ..runners.explain import parse_target
    from ..runners.heads import run_heads as run

    return run(
        adapter,
        out,
        text=s.text,
        data=s.data,
        ablation=s.ablation,
        target=Target(parse_target(adapter, s.target), None, "prob"),
        seed=s.seed,
        limit=s.limit,
        attribution=s.attribution,
        sample=s.sample,
        batch_size=s.batch_size,
    )


@dataclass
class PruneSettings(Settings):
    data: str = option(
        "",
        required=True,
        help="labelled .csv/.jsonl (text, label) or 'movies'; half of the "
        "examples (shuffled with --seed) scores heads, the other half is held out",
    )
    orders: list[str] = option(
        default_factory=lambda: list(PRUNE_ORDERS),
        flag="--order",
        parse=split_list,
        help="comma-separated: importance, attribution, attention, random",
    )
    seeds: int = option(3, help="random orders to draw")
    step: int = option(1, help="heads removed per step")
    limit: int | None = option(None)

    def check(self) -> None:
        super().check()
        bad = [o for o in self.orders if o not in PRUNE_ORDERS]
        if bad or not self.orders:
            raise StreetlampError(f"unknown order {bad[0] if bad else ''!r}; choose {', '.join(PRUNE_ORDERS)}")
        at_least(self.seeds, 0, "--seeds")
        at_least(self.step, 1, "--step")
        at_least(self.limit, 4, "--limit")

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.labels:
            raise StreetlampError("pruning measures accuracy: it needs a classifier")


def run_prune(adapter: ModelAdapter, s: PruneSettings, out: Any, opts: Any) -> Any:
    from ..runners.heads import run_prune as run

    return run(
        adapter,
        out,
        data=s.data,
        orders=s.orders,
        seeds=s.seeds,
        step=s.step,
        limit=s.limit,
        seed=s.seed,
        batch_size=s.batch_size,
    )


HEADS = Command(
    "heads",
    "ablate every head (zero/mean/resample); with --data also importance, attention attribution and attention mass",
    HeadsSettings,
    run_heads,
    shared=Shared(out="output folder (default runs/heads-<time>)"),
    views=("heads",),
)
PRUNE = Command(
    "prune",
    "remove heads one by one in a score order; held-out accuracy curves",
    PruneSettings,
    run_prune,
    shared=Shared(out="output folder (default runs/prune-<time>)"),
    views=("prune",),
)
