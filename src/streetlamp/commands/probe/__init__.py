"""``probe``: probes with control tasks (selectivity), MDL and amnesic probing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import StreetlampError
from ...settings import Shared, batch_size_option, option, seed_option
from ...specs import parse_split
from ..base import Command, lazy


@dataclass(frozen=True)
class ProbeSettings:
    """``probe``'s settings, recorded whole in the run's manifest (``settings``)."""

    task: str = option(
        "", required=True, help="pos, upos, sentiment, deciding:TASK, negated, category, or a .jsonl/.csv file"
    )
    data: str = option("movies", help="texts for pos/upos/sentiment: movies, tweets, drugs, a file")
    layers: str = option("all", help="all (embed + every layer), or e.g. embed,0,3 or 2-5")
    site: str = option("resid_post", help="resid_post, resid_pre, attn.out or mlp.out")
    probes: str = option("linear,mlp", help="linear, linear-rankR, mlp (1 hidden layer), mlp2")
    hidden: int = option(256, ge=1, help="MLP hidden size")
    weight_decay: float = option(1e-3, help="L2 on probe weights (mean loss + wd/2 |W|^2)")
    dropout: float = option(0.0)
    early_stopping: bool = option(
        True,
        flag="--no-early-stopping",
        help="MLP / rank-R probes: train --max-epochs epochs instead of stopping on the dev loss",
    )
    max_epochs: int = option(100, ge=1, help="epochs of the Adam-trained probes (MLP, rank-R)")
    subtoken: str = option("first", choices=("first", "last"), help="sub-token that represents a word")
    pool: str | None = option(
        None,
        choices=("first", "last", "mean"),
        help="sentence tasks: position read (default: first for classifiers, last for causal LMs)",
    )
    split: tuple[float, float, float] = option(
        (0.6, 0.2, 0.2), parse=parse_split, help="train,dev,test fractions of the texts"
    )
    limit: int | None = option(None, ge=1, help="first N texts only")
    n_examples: int = option(300, ge=2, help="generated texts for deciding:TASK / negated / category")
    sweep: str | None = option(
        "hidden:4,16,64,256,1024",
        help="capacity sweep KIND:v1,v2,.. (hidden, rank, weight_decay, dropout) or none",
    )
    sweep_layer: str | None = option(None, help="layer of the sweep (default: the middle layer)")
    random_seeds: int = option(5, ge=1, help="random-direction erasures per layer")
    erase_at: str = option(
        "items",
        choices=("items", "all"),
        help="token tasks: erase at the labelled sub-tokens (where LEACE was fitted) or at every position",
    )
    skip_first: bool = option(
        False,
        help="token tasks: leave out words at position 0 (a causal LM's attention sink, with a massive activation)",
    )
    mdl: bool = option(True, flag="--no-mdl")
    amnesic: bool = option(True, flag="--no-amnesic")
    truncate: bool = option(False)
    seed: int = seed_option()
    batch_size: int | None = batch_size_option()

    def check(self) -> None:
        from ...models.sites import LAYER_SITES, site_axes
        from ...probing.probes import parse_probes
        from ...specs import parse_sweep

        ok = [k for k in LAYER_SITES if site_axes(f"layers.0.{k}") == ["batch", "pos", "d_model"]]
        if self.site not in ok:
            raise StreetlampError(f"--site {self.site!r}: probes read [batch, pos, d_model] sites: {', '.join(ok)}")
        if abs(sum(self.split) - 1) > 1e-9 or min(self.split) <= 0:
            raise StreetlampError("--split needs three positive fractions summing to 1 (train,dev,test)")
        if self.skip_first and self.erase_at == "all":
            raise StreetlampError("--skip-first leaves position 0 unedited, --erase-at all edits it: choose one")
        parse_probes(
            self.probes, self.hidden, self.weight_decay, self.dropout, self.seed, self.early_stopping, self.max_epochs
        )
        parse_sweep(self.sweep)

    def validate(self, adapter: Any) -> None:
        pass


PROBE = Command(
    "probe",
    "probes with control tasks (selectivity), MDL, and amnesic probing: is what a layer holds also used?",
    ProbeSettings,
    lazy(__name__ + ".run", "probe"),
    shared=Shared(
        model_help="embedded name, checkpoint folder or gt-TASK-VARIANT",
        out="output folder (default runs/probe-<time>)",
        placement=False,
    ),
    needs_model=False,
    views=("generic",),
)
