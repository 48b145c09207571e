"""``atlas``: every head across a corpus, where it looks beside what removing it changes (issue 25)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class AtlasSettings(Settings):
    data: str = option(
        "",
        required=True,
        help="comma-separated: movies, tweets, drugs, .txt/.csv/.tsv/.jsonl files (what evaluate reads)",
    )
    ablation: str = option(
        "mean",
        choices=("mean", "zero", "resample"),
        help="mean: attn.z's mean over the corpus read (default); zero; resample: another sequence's",
    )
    exact_share: float = option(
        1.0,
        ge=0,
        le=1,
        help="share of (head, sequence) pairs ablated exactly, drawn at random (1: all; else an attribution estimate for all)",
    )
    exact_top: int = option(
        5, ge=0, help="with --exact-share < 1: also ablate each head's N top-estimated sequences exactly"
    )
    limit: int | None = option(None, ge=1, help="first N sequences only")
    sample: int | None = option(None, ge=1, help="N sequences drawn with --seed")
    truncate: bool = option(False, help="cut sequences longer than the model's positions (default: refuse)")
    max_tokens: int | None = option(None, ge=2, help="cut every sequence to its first N tokens")
    chunk_size: int = option(16, ge=1, help="sequences per stored chunk (unit of resumption)")
    floor: float = option(1e-3, gt=0, help="KL (nats) below which an effect is within noise of zero")
    striking: float = option(0.5, gt=0, le=1, help="prominence at or above which a pattern counts as striking")
    top_k: int = option(4, ge=1, help="sequences per head shown by prominence and by effect")
    compare_task: str | None = option(
        None,
        help="also ablate every head on a narrow task (ioi, greater-than, induction or a CSV of pairs) and "
        "correlate its task effect with its corpus effect: task_compare.csv",
    )
    compare_prompts: int = option(16, ge=1, help="--compare-task: its first N prompts")
    engine: str = option("local", choices=("local", "ray"))
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto)")
    workers: int | None = option(None, ge=1, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        if not self.data.strip(",").strip():
            raise StreetlampError("give --data (movies, tweets, drugs or a file)")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        t = self.compare_task
        if t is not None and t not in ("ioi", "greater-than", "induction"):
            if not t.lower().endswith(".csv") or not Path(t).is_file():
                raise StreetlampError(
                    f"--compare-task {t!r}: give ioi, greater-than, induction or an existing .csv file of pairs"
                )
        if self.ablation == "resample" and (self.limit == 1 or self.sample == 1):
            raise StreetlampError(
                "--ablation resample takes a head's activation from another sequence: give at least 2"
            )

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.modality == "image":
            raise StreetlampError(f"atlas reads text corpora; {adapter.name} is an image model")
        if self.engine == "ray" and adapter.features is not None:
            raise StreetlampError(
                "--features with --engine ray: each Ray actor loads the model by name, without the feature set; "
                "run the atlas with --engine local"
            )


ATLAS = Command(
    "atlas",
    "every head across a corpus: where it looks (pattern statistics) beside what removing it changes (ablation)",
    AtlasSettings,
    lazy(__name__ + ".run", "run_atlas"),
    shared=Shared(out="run folder; the same command resumes it", out_required=True, overwrite=False, features=True),
    writes="store",
    views=("atlas",),
)
