"""``streetlamp features-audit``: do the features most active on a task's prompts move the output when edited,
as attribution patching predicts? (METHODS.md §13; the computation: :mod:`streetlamp.interventions.features`.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

AUDIT_EDITS = ("patch", "zero", "mean", "steer")
BUILTIN_TASKS = ("ioi", "sentiment", "greater-than", "induction")


@dataclass
class FeaturesAuditSettings(Settings):
    features: str = option("", help="the feature set: a folder of dictionaries (features.json + safetensors)")
    task: str = option(
        "ioi", help="prompt pairs: ioi, sentiment, greater-than, induction, or a CSV with clean,corrupt,answer,wrong"
    )
    limit: int = option(16, ge=1, le=10_000, help="first N prompt pairs (default 16)")
    top: int = option(32, ge=1, le=100_000, help="audit N features (default 32), chosen by --select")
    select: str = option(
        "active",
        choices=("active", "attribution"),
        help="active: the largest mean activation over the clean prompts' tokens; attribution: the largest "
        "|attribution of zero-ablating the feature| (all features from one backward)",
    )
    edits: str = option(
        "patch,zero,steer",
        help="comma list of patch (the corrupted prompt's activation), zero, mean (over the clean prompts' tokens, "
        "pooled over positions), steer",
    )
    error: str = option(
        "recomputed",
        choices=("recomputed", "frozen", "both"),
        help="the error term of dictionaries downstream of the edit: recomputed (the real model downstream) or "
        "frozen at the clean run's value",
    )
    metric: str = option("logit_diff", choices=("logit_diff", "prob_diff"), help="answer minus wrong answer")
    steer: float = option(
        1.0, finite=True, help="steering: alpha = STEER x the feature's largest activation on the prompts (default 1)"
    )
    top_k: int = option(10, ge=1, le=10_000, help="the top-k features by attribution and by exact effect compared")
    floor: float = option(
        0.05, ge=0, help="a zero-ablation effect (in the metric's units) below which an active feature is 'unused'"
    )
    bootstrap: int = option(1000, ge=10, le=100_000, help="bootstrap resamples of the prompts for the intervals")

    def edit_list(self) -> list[str]:
        return [e.strip() for e in self.edits.split(",") if e.strip()]

    def errors(self) -> list[str]:
        return ["recomputed", "frozen"] if self.error == "both" else [self.error]

    def check(self) -> None:
        super().check()
        if not self.features:
            raise StreetlampError("--features DICT is required: the folder of dictionaries to audit")
        if not Path(self.features).is_dir():
            raise StreetlampError(f"--features {self.features}: not a folder")
        bad = [e for e in self.edit_list() if e not in AUDIT_EDITS] or (["(none)"] if not self.edit_list() else [])
        if bad:
            raise StreetlampError(
                f"--edits {self.edits!r}: unknown {', '.join(bad)}; choose from {', '.join(AUDIT_EDITS)}"
            )
        if self.task not in BUILTIN_TASKS and not (self.task.lower().endswith(".csv") and Path(self.task).is_file()):
            raise StreetlampError(f"--task {self.task!r}: give {', '.join(BUILTIN_TASKS)} or an existing .csv of pairs")

    def validate(self, adapter: ModelAdapter) -> None:
        from .run import attach, pairs_of

        if not adapter.kind.causal:
            raise StreetlampError("features-audit reads a next-token logit difference: it needs a causal LM")
        attach(adapter, self.features)
        pairs_of(adapter, self)


FEATURES_AUDIT = Command(
    "features-audit",
    "features most active on a task's prompts: attribution patching vs exact patching/ablation, and steering",
    FeaturesAuditSettings,
    lazy(__name__ + ".run"),
    shared=Shared(),
    views=("generic",),
)
