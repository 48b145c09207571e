"""``lens``: logit lens, direct logit attribution, head types; with --head the QK attribution."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ...specs import lens_spec
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class LensSettings(Settings):
    text: str = option("", positional=True)
    target: str | None = option(None, help="token whose logit is explained; default: the prediction")
    head: str | None = option(None, help="LAYER.HEAD for the QK attribution table, e.g. 9.6")
    query: int | None = option(None, ge=0, help="query position for --head (default: last)")
    types_length: int = option(20, ge=2, help="random tokens per head-type sequence (repeated)")
    types_seqs: int = option(4, ge=1, help="random sequences for the head types")
    lens: tuple[str, str | None] = option(
        ("logit", None),
        parse=lens_spec,
        help="logit (default), tuned:DIR or jacobian:DIR (a folder of lens-fit, or of the tuned-lens package)",
    )
    intervention_check: bool = option(
        False,
        flag="--check",
        help="check the lens against intervention at the last position: each layer's residual patched into a "
        "neutral context (table, lens_check.csv, check.* arrays)",
    )
    allow_pt: bool = option(
        False,
        help="read a tuned-lens package folder's pickled params.pt (torch.load, weights_only=True); without it such a "
        "folder is refused (convert it once with lens-fit --convert)",
    )
    check_variant: str | None = option(
        None,
        choices=("patch", "baseline", "both"),
        help="the check's intervention (implies --check): patch = into the neutral context (lens_check.csv), "
        "baseline = the residual replaced by --baseline in the same prompt (lens_check_baseline.csv), both",
    )
    baseline: str = option(
        "neutral",
        choices=("neutral", "mean"),
        help="--check-variant baseline: the neutral context's residual at that layer, or the mean residual of the "
        "lens's fit corpus (a lens-fit folder)",
    )
    neutral: str | None = option(None, help="--check: the neutral context (default: the document separator twice)")
    ablate: str | None = option(
        None,
        help="TOKEN: at each layer project the token's lens direction (A_l^T W_U[t]) out of the residual at the last "
        "position and measure the output (lens_coords.csv)",
    )
    swap: str | None = option(
        None,
        help="SOURCE,TARGET: at each layer exchange the two tokens' lens coordinates in the residual at the last "
        "position and measure the output (lens_coords.csv)",
    )
    alpha: float = option(1.0, help="--swap strength (1: exchange, 2: the double-strength swap)")

    def check(self) -> None:
        super().check()
        if not self.text.strip():
            raise StreetlampError("empty text: give the prompt whose next token the lens explains")
        for flag, v in (("--target", self.target), ("--neutral", self.neutral)):
            if v is not None and not v.strip():  # not a silent fall-back to the default
                raise StreetlampError(f"{flag} is empty: give a token (or leave {flag} out for the default)")
        self.head_pair()
        if self.query is not None and self.head is None:
            raise StreetlampError("--query needs --head")
        if self.ablate is not None and self.swap is not None:
            raise StreetlampError("--ablate and --swap: give one coordinate intervention per run")
        if self.swap is not None and len(self.swap.split(",")) != 2:
            raise StreetlampError(f"--swap takes SOURCE,TARGET: two tokens separated by a comma (got {self.swap!r})")
        if not (abs(self.alpha) < float("inf")) or self.alpha == 0:
            raise StreetlampError(f"--alpha must be finite and not 0 (got {self.alpha})")

        if self.baseline != "neutral" and self.check_variant not in ("baseline", "both"):
            raise StreetlampError(f"--baseline {self.baseline} applies to --check-variant baseline or both")
        if self.baseline == "mean" and self.check_variant in ("baseline", "both") and self.lens[1] is None:
            raise StreetlampError(
                "--baseline mean needs --lens tuned:DIR or jacobian:DIR (the logit lens has no fit corpus)"
            )

    def head_pair(self) -> tuple[int, int] | None:
        """``--head LAYER.HEAD`` as (layer, head); its range is checked against the model in validate()."""
        if self.head is None:
            return None
        try:
            l, h = (int(x) for x in self.head.strip().split("."))
        except ValueError:
            raise StreetlampError(f"bad --head {self.head!r}: write LAYER.HEAD, e.g. 9.6") from None
        return l, h

    def coords(self, adapter: ModelAdapter) -> tuple[str, list[int]] | None:
        """``--ablate`` / ``--swap`` as (kind, token ids), each token checked (one token of the vocabulary)."""
        if self.ablate is not None:
            return ("ablate", [adapter.parse_label(self.ablate)])
        if self.swap is not None:
            ids = [adapter.parse_label(t) for t in self.swap.split(",")]
            if ids[0] == ids[1]:
                raise StreetlampError(f"--swap {self.swap!r}: source and target are the same token")
            return ("swap", ids)
        return None

    def validate(self, adapter: ModelAdapter) -> None:
        from ...models.readout import check_lens

        check_lens(adapter)
        lh = self.head_pair()
        if lh is not None and not (0 <= lh[0] < adapter.n_layers and 0 <= lh[1] < adapter.n_heads):
            raise StreetlampError(
                f"--head {self.head} out of range: layers 0..{adapter.n_layers - 1}, heads 0..{adapter.n_heads - 1}"
            )
        if self.query is not None:
            n = adapter.encode(self.text).lengths[0]
            if self.query >= n:
                raise StreetlampError(f"--query {self.query} out of range: the text has positions 0..{n - 1}")
        if 2 * self.types_length > adapter.max_positions:
            raise StreetlampError(
                f"--types-length {self.types_length}: each head-type sequence is repeated (2 x {self.types_length} "
                f"tokens), over the model's {adapter.max_positions} positions"
            )
        self.coords(adapter)
        if self.lens[1] is not None:
            from ...interventions.lenses.store import load_lens

            lens = load_lens(self.lens[1], adapter, self.lens[0], self.allow_pt)  # refused before anything is written
            if self.baseline == "mean" and self.check_variant in ("baseline", "both") and lens.mean is None:
                raise StreetlampError(
                    f"--baseline mean: the lens folder {self.lens[1]} stores no mean residuals (a converted or older "
                    "folder); refit it with lens-fit, or use --baseline neutral"
                )


@dataclass
class LensResult:
    """What ``run_lens`` computed (its dict, as ``values``) and the run folder."""

    out: Path
    values: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def lines(self) -> list[str]:
        out = []
        for t in self.values["tables"]:
            out += ["", t["title"], "  " + " | ".join(t["columns"])]
            out += ["  " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) for row in t["rows"]]
        return [*out, "", f"output: {self.out}/"]


LENS = Command(
    "lens",
    "causal LM: logit lens, direct logit attribution, head types; with --head "
    "also why that head attends where it does (QK attribution, ablation)",
    LensSettings,
    lazy(__name__ + ".run", "run_lens"),
    shared=Shared(model="smollm2-135m", out="output folder (default runs/lens-<time>)", features=True),
    views=("lens",),
)
