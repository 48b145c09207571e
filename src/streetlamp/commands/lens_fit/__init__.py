"""``lens-fit``: fit a tuned lens or a Jacobian lens of a causal LM on a corpus; the run folder is the lens folder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class LensFitSettings(Settings):
    lens: str = option("", required=True, choices=("tuned", "jacobian"), help="which lens to fit")
    data: str = option(
        "",
        required=True,
        help="the corpus: movies, tweets, drugs, recall, or a .csv/.tsv/.jsonl file with a text column",
    )
    seq_len: int = option(
        128, ge=2, help="tokens per sequence (the texts are packed, each after the document separator)"
    )
    heldout: int = option(8, ge=1, help="sequences held out for the per-layer KL")
    max_seqs: int | None = option(None, ge=1, help="use at most N training sequences (default: all the rest)")
    steps: int = option(250, ge=0, help="tuned: Adam steps")
    lr: float = option(1e-3, gt=0, help="tuned: Adam learning rate")
    batch_seqs: int = option(4, ge=1, help="tuned: sequences per step")
    probes: int = option(
        0, ge=0, help="jacobian: 0 = exact (d one-hot VJPs per sequence), k = k Rademacher probes per sequence"
    )
    skip_first: int = option(
        16, ge=0, help="jacobian: source and target positions before this are left out (attention sinks)"
    )
    dim_batch: int = option(32, ge=1, help="jacobian: cotangents per backward pass (rows of one batch)")
    convert: str | None = option(
        None,
        help="instead of fitting, convert the lens folder DIR (the tuned-lens package's config.json + params.pt, or "
        "the Jacobian lens's reference .pt: pickles, read once with torch.load weights_only=True) into this lens "
        "folder (safetensors); --data gives the held-out KL and the mean residuals",
    )

    def check(self) -> None:
        super().check()
        if self.lens == "jacobian" and self.skip_first >= self.seq_len:
            raise StreetlampError(f"--skip-first {self.skip_first} leaves no position of --seq-len {self.seq_len}")

    def validate(self, adapter: ModelAdapter) -> None:
        from ...interventions.lenses.fit import fit_dtype
        from ...models.readout import check_lens

        check_lens(adapter)
        fit_dtype(adapter)
        if self.convert is not None:
            from ...interventions.lenses.store import load_lens

            load_lens(self.convert, adapter, self.lens, allow_pt=True)  # refused before anything is written


LENS_FIT = Command(
    "lens-fit",
    "causal LM: fit a tuned lens (Adam on KL to the final output) or a Jacobian lens (corpus-averaged "
    "Jacobian, VJPs) on a corpus; held-out KL per layer; the folder is read by lens --lens KIND:DIR",
    LensFitSettings,
    lazy(__name__ + ".run", "run_lens_fit"),
    shared=Shared(model="smollm2-135m", out="the lens folder (default runs/lens-fit-<time>)"),
    views=("generic",),
)
