"""``patch`` (activation, path and attribution patching) and ``mediate`` (causal mediation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ...specs import parse_heads, split_list
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

PATCH_KINDS = ("resid_pre", "attn.out", "mlp.out", "heads")
FEATURE_KINDS = ("features", "features_error")  # interventions.patching.FEATURE_KINDS: with --features only


@dataclass
class PatchSettings(Settings):
    clean: str = option("", required=True)
    corrupt: str = option("", required=True)
    answer: str | None = option(None, help="right output (token or class); default: clean prediction")
    wrong: str | None = option(None, help="wrong output; default: corrupted prediction")
    paths: bool = option(False, help="path patching from every sender head")
    receiver: str = option("logits", help="'logits' or receiver heads L.H[,L.H]")
    receiver_pos: int | None = option(None, help="patch receivers only at this position")
    approx: bool = option(False, help="attribution patching beside real patching")
    sites: list[str] = option(
        default_factory=lambda: list(PATCH_KINDS),
        parse=split_list,
        help="what to patch: comma-separated resid_pre, attn.out, mlp.out (by layer x position), heads; with "
        "--features also features (one feature, every position) and features_error (one dictionary's error, "
        "one position)",
    )

    def check(self) -> None:
        super().check()
        bad = [k for k in self.sites if k not in PATCH_KINDS + FEATURE_KINDS]
        if bad or not self.sites:
            raise StreetlampError(f"unknown site kind(s) {bad}; choose from {', '.join(PATCH_KINDS + FEATURE_KINDS)}")
        if self.approx and not any(k in PATCH_KINDS for k in self.sites):
            raise StreetlampError(
                "--approx compares attribution with patching of resid_pre, attn.out, mlp.out or heads"
            )
        if not self.clean.strip() or not self.corrupt.strip():
            raise StreetlampError("--clean and --corrupt must not be empty")

    def validate(self, adapter: ModelAdapter) -> None:
        if self.paths:
            parse_heads(self.receiver, adapter.n_layers, adapter.n_heads)
        asked = [k for k in self.sites if k in FEATURE_KINDS]
        if asked and adapter.features is None:
            raise StreetlampError(f"--sites {','.join(asked)} patches a feature set's sites: give --features DICT")


@dataclass
class MediateSettings(Settings):
    prompts: int = option(8, ge=1, help="number of template x profession prompts")
    component: str = option(
        "attn.pattern",
        choices=("attn.pattern", "attn.z"),
        help="head site: attention weights (as Vig et al.) or the head's output",
    )

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.causal:
            raise StreetlampError("mediation compares next-token probabilities of pronouns: it needs a causal LM")


PATCH = Command(
    "patch",
    "activation patching (+ --paths path patching, --approx attribution patching); "
    "clean and corrupted texts must have the same token length",
    PatchSettings,
    lazy(__name__ + ".run", "run_patch"),
    shared=Shared(out="output folder (default runs/patch-<time>)", seed=False, features=True),
    views=("patch",),
)
MEDIATE = Command(
    "mediate",
    "causal mediation (Vig et al. 2020): TE, NIE, NDE per head and layer",
    MediateSettings,
    lazy(__name__ + ".run", "run_mediate"),
    shared=Shared(model="smollm2-135m", out="output folder (default runs/mediate-<time>)", seed=False),
    views=("mediate",),
)
