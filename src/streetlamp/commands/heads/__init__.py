"""``heads`` (ablate every head; with --data importance, attribution, attention mass) and ``prune``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ...specs import split_list
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

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
    limit: int | None = option(None, ge=1, help="use only the first N texts of --data")
    sample: int | None = option(
        None, ge=1, help="use N texts of --data drawn with --seed (files sorted by label make --limit one-sided)"
    )
    attribution: bool = option(True, flag="--no-attribution", help="skip the (slow) Hao attribution column")

    def check(self) -> None:
        super().check()
        if (self.text is None) == (self.data is None):
            raise StreetlampError("give a TEXT or --data FILE")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.modality == "image" and self.data is None and self.ablation != "zero":
            raise StreetlampError(
                f"--ablation {self.ablation} averages a head over reference inputs, and the built-in ones are "
                "sentences: on an image model give --data (a CSV whose text column names image files) or use "
                "--ablation zero"
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
    seeds: int = option(3, ge=0, help="random orders to draw")
    step: int = option(1, ge=1, help="heads removed per step")
    limit: int | None = option(None, ge=4)

    def check(self) -> None:
        super().check()
        bad = [o for o in self.orders if o not in PRUNE_ORDERS]
        if bad or not self.orders:
            raise StreetlampError(f"unknown order {bad[0] if bad else ''!r}; choose {', '.join(PRUNE_ORDERS)}")

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.labels:
            raise StreetlampError("pruning measures accuracy: it needs a classifier")


HEADS = Command(
    "heads",
    "ablate every head (zero/mean/resample); with --data also importance, attention attribution and attention mass",
    HeadsSettings,
    lazy(__name__ + ".run", "run_heads"),
    shared=Shared(out="output folder (default runs/heads-<time>)", features=True),
    views=("heads",),
)
PRUNE = Command(
    "prune",
    "remove heads one by one in a score order; held-out accuracy curves",
    PruneSettings,
    lazy(__name__ + ".run", "run_prune"),
    shared=Shared(out="output folder (default runs/prune-<time>)"),
    views=("prune",),
)
