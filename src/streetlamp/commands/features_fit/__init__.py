"""``features-fit``: fit sparse dictionaries (an SAE at resid_pre or a transcoder at the MLP) per layer on the
model's own activations; the run folder is itself a dictionary folder (``--features DIR``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

KIND_SITE = {"transcoder": "mlp", "sae": "resid_pre"}
DEFAULT_SPARSITY = {"relu": 5.0, "jumprelu": 0.5, "topk": 0.0}


@dataclass
class FeaturesFitSettings(Settings):
    kind: str = option("", required=True, choices=tuple(KIND_SITE), help="transcoder (the MLP) or sae (resid_pre)")
    site: str | None = option(
        None,
        choices=("mlp", "resid_pre"),
        help="the site (default: the kind's own; a transcoder sits at mlp, an SAE at resid_pre)",
    )
    layers: str = option("all", help="all, or comma-separated layer numbers (e.g. 0,3)")
    width: int = option(4096, ge=1, help="latents per dictionary")
    activation: str = option("relu", choices=("relu", "topk", "jumprelu"), help="the latents' activation")
    k: int | None = option(None, ge=1, help="topk: latents kept per token (required for topk)")
    tokens: int = option(200_000, ge=1, help="training tokens per layer (all layers train on the same stream)")
    data: str = option(
        "mix",
        help="comma-separated corpus: mix (tweets, drugs, movies, BIG-Bench task text where cached), tweets, drugs, "
        "movies, recall, bigbench, or .csv/.jsonl files with a text column",
    )
    generated: int = option(0, ge=0, help="also this many tokens the model samples itself from corpus prompts")
    seq_len: int = option(128, ge=2, help="tokens per sequence (position 0 is not trained on)")
    heldout: int = option(16, ge=1, help="held-out sequences for the metrics")
    batch_seqs: int = option(16, ge=1, help="sequences per shard (one forward pass; the unit of checkpoints)")
    batch_tokens: int = option(1024, ge=1, help="tokens per Adam step")
    lr: float = option(1e-3, gt=0, help="Adam learning rate")
    sparsity: float | None = option(
        None,
        ge=0,
        help="L1 coefficient (relu, default 5) or L0 coefficient (jumprelu, default 0.5), in units where "
        "inputs have mean norm sqrt(d)",
    )
    warmup: int = option(100, ge=0, help="Adam steps over which the sparsity coefficient ramps up from 0")
    aux: float = option(0.0, ge=0, help="topk: weight of the aux-k loss on dead latents (0: off; SAELens uses 1)")
    dead_window: int = option(200, ge=1, help="steps without firing after which a latent counts as dead (aux-k)")
    checkpoint_every: int = option(10, ge=1, help="shards between checkpoints")
    resume: bool = option(False, help="continue the fit in --out from its checkpoint")
    stop_after: int | None = option(
        None, ge=1, help="stop (checkpointed) once N shards are done in all: fit across sessions with --resume"
    )
    save_dtype: str = option("float32", choices=("float32", "bfloat16"), help="dtype of the saved dictionaries")
    evaluate: str | None = option(
        None,
        help="no fit: measure the finished dictionary folder DIR (its layers among --layers) on the held-out "
        "sequences these settings build; give the fit's --data, --tokens, --seq-len, --heldout, --seed and "
        "--generated to get the fit's held-out text",
    )
    ce: bool = option(
        True, flag="--no-ce", help="skip the cross-entropy metrics (3 passes over the held-out text per layer)"
    )

    @property
    def where(self) -> str:
        return KIND_SITE[self.kind]

    def check(self) -> None:
        super().check()
        if self.site is not None and self.site != self.where:
            raise StreetlampError(
                f"--kind {self.kind} sits at {self.where}, not --site {self.site} (a transcoder replaces the MLP, an SAE "
                "reads resid_pre)"
            )
        if self.activation == "topk":
            if self.k is None:
                raise StreetlampError("--activation topk needs --k (latents kept per token)")
            if self.k > self.width:
                raise StreetlampError(f"--k {self.k} is more than --width {self.width}")
        elif self.k is not None:
            raise StreetlampError(f"--k is for --activation topk, not {self.activation}")
        if self.evaluate is not None and (self.resume or self.stop_after is not None):
            raise StreetlampError("--evaluate fits nothing: it takes neither --resume nor --stop-after")
        if self.heldout < 1:
            raise StreetlampError("--heldout must be at least 1")

    def validate(self, adapter: ModelAdapter) -> None:
        from ...specs import parse_indices

        if not adapter.kind.causal or adapter.kind.labels:
            raise StreetlampError(f"features-fit fits on a causal LM's activations; {adapter.name} is a {adapter.kind}")
        parse_indices(self.layers, adapter.n_layers, "--layers", "layer")
        if self.where == "mlp" and adapter.family.mlp is None:
            raise StreetlampError(
                f"{adapter.family.name}: a transcoder needs the MLP's input as one module's input, and this family's "
                "MLP is split across modules around a post-norm; use --kind sae"
            )


FEATURES_FIT = Command(
    "features-fit",
    "causal LM: fit an SAE (resid_pre) or a transcoder (the MLP) per layer on the model's activations over a "
    "corpus, with checkpoints and --resume; FVU, L0, dead/dense latents and CE recovered per layer; the folder "
    "is read by --features DIR",
    FeaturesFitSettings,
    lazy(__name__ + ".run", "run_features_fit"),
    shared=Shared(
        model="smollm2-135m",
        out="run folder, also the dictionary folder; the same command with --resume continues it",
        out_required=True,
        overwrite=False,
    ),
    writes="store",
    views=("generic",),
)
