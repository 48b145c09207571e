"""``atlas``: every head across a corpus, where it looks beside what removing it changes (issue 25)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StreetlampError
from ...settings import Settings, Shared, at_least, option
from ..base import Command

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
        help="share of (head, sequence) pairs ablated exactly, drawn at random (1: all; else an attribution estimate for all)",
    )
    exact_top: int = option(5, help="with --exact-share < 1: also ablate each head's N top-estimated sequences exactly")
    limit: int | None = option(None, help="first N sequences only")
    sample: int | None = option(None, help="N sequences drawn with --seed")
    truncate: bool = option(False, help="cut sequences longer than the model's positions (default: refuse)")
    max_tokens: int | None = option(None, help="cut every sequence to its first N tokens")
    chunk_size: int = option(16, help="sequences per stored chunk (unit of resumption)")
    floor: float = option(1e-3, help="KL (nats) below which an effect is within noise of zero")
    striking: float = option(0.5, help="prominence at or above which a pattern counts as striking")
    top_k: int = option(4, help="sequences per head shown by prominence and by effect")
    compare_task: str | None = option(
        None,
        help="also ablate every head on a narrow task (ioi, greater-than, induction or a CSV of pairs) and "
        "correlate its task effect with its corpus effect: task_compare.csv",
    )
    compare_prompts: int = option(16, help="--compare-task: its first N prompts")
    engine: str = option("local", choices=("local", "ray"))
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto)")
    workers: int | None = option(None, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        if not self.data.strip(",").strip():
            raise StreetlampError("give --data (movies, tweets, drugs or a file)")
        if not 0 <= self.exact_share <= 1:
            raise StreetlampError(f"--exact-share must be in [0, 1] (got {self.exact_share})")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        at_least(self.limit, 1, "--limit")
        at_least(self.sample, 1, "--sample")
        at_least(self.max_tokens, 2, "--max-tokens")
        at_least(self.exact_top, 0, "--exact-top")
        at_least(self.chunk_size, 1, "--chunk-size")
        at_least(self.top_k, 1, "--top-k")
        at_least(self.workers, 1, "--workers")
        at_least(self.compare_prompts, 1, "--compare-prompts")
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
        if not self.floor > 0:
            raise StreetlampError(f"--floor must be positive (got {self.floor})")
        if not 0 < self.striking <= 1:
            raise StreetlampError(f"--striking must be in (0, 1] (got {self.striking})")

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.modality == "image":
            raise StreetlampError(f"atlas reads text corpora; {adapter.name} is an image model")


def run_atlas(adapter: ModelAdapter, s: AtlasSettings, out: Path, opts: Any) -> Any:
    from .run import run_atlas as run

    return run(
        adapter,
        out,
        data=s.data,
        ablation=s.ablation,
        exact_share=s.exact_share,
        exact_top=s.exact_top,
        limit=s.limit,
        sample=s.sample,
        truncate=s.truncate,
        max_tokens=s.max_tokens,
        chunk_size=s.chunk_size,
        floor=s.floor,
        striking=s.striking,
        top_k=s.top_k,
        seed=s.seed,
        batch_size=s.batch_size,
        engine=s.engine,
        model=str(opts.model) if isinstance(opts.model, (str, Path)) else None,
        device=opts.device,
        ray_address=s.ray_address,
        workers=s.workers,
        compare_task=s.compare_task,
        compare_prompts=s.compare_prompts,
    )


ATLAS = Command(
    "atlas",
    "every head across a corpus: where it looks (pattern statistics) beside what removing it changes (ablation)",
    AtlasSettings,
    run_atlas,
    shared=Shared(out="run folder; the same command resumes it", out_required=True, overwrite=False, placement=False),
    writes="store",
    views=("atlas",),
)
