"""``probe``: probes with control tasks (selectivity), MDL and amnesic probing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...settings import RunOptions, Shared, batch_size_option, option, seed_option
from ...specs import parse_split
from ..base import Command


@dataclass
class ProbeCommandSettings:
    """The command line; :meth:`stored` is :class:`~streetlamp.commands.probe.run.ProbeSettings` (the
    runner's frozen record, same field names), checked by the runner's ``check_settings``."""

    task: str = option(
        "", required=True, help="pos, upos, sentiment, deciding:TASK, negated, category, or a .jsonl/.csv file"
    )
    data: str = option("movies", help="texts for pos/upos/sentiment: movies, tweets, drugs, a file")
    layers: str = option("all", help="all (embed + every layer), or e.g. embed,0,3 or 2-5")
    site: str = option("resid_post", help="resid_post, resid_pre, attn.out or mlp.out")
    probes: str = option("linear,mlp", help="linear, linear-rankR, mlp (1 hidden layer), mlp2")
    hidden: int = option(256, help="MLP hidden size")
    weight_decay: float = option(1e-3, help="L2 on probe weights (mean loss + wd/2 |W|^2)")
    dropout: float = option(0.0)
    early_stopping: bool = option(
        True,
        flag="--no-early-stopping",
        help="MLP / rank-R probes: train --max-epochs epochs instead of stopping on the dev loss",
    )
    max_epochs: int = option(100, help="epochs of the Adam-trained probes (MLP, rank-R)")
    subtoken: str = option("first", choices=("first", "last"), help="sub-token that represents a word")
    pool: str | None = option(
        None,
        choices=("first", "last", "mean"),
        help="sentence tasks: position read (default: first for classifiers, last for causal LMs)",
    )
    split: tuple[float, float, float] = option(
        (0.6, 0.2, 0.2), parse=parse_split, help="train,dev,test fractions of the texts"
    )
    limit: int | None = option(None, help="first N texts only")
    n_examples: int = option(300, help="generated texts for deciding:TASK / negated / category")
    sweep: str | None = option(
        "hidden:4,16,64,256,1024",
        help="capacity sweep KIND:v1,v2,.. (hidden, rank, weight_decay, dropout) or none",
    )
    sweep_layer: str | None = option(None, help="layer of the sweep (default: the middle layer)")
    random_seeds: int = option(5, help="random-direction erasures per layer")
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
        from .run import check_settings

        check_settings(self.stored())

    def validate(self, adapter: Any) -> None:
        pass

    def stored(self) -> Any:
        from .run import ProbeSettings

        return ProbeSettings(**dataclasses.asdict(self))


def run_probe(adapter: None, s: ProbeCommandSettings, out: Any, opts: RunOptions) -> Any:
    """The runner loads the model itself (an embedded name, a folder or a ground-truth model)."""
    from .run import probe

    return probe(str(opts.model), s.stored(), out, overwrite=opts.overwrite, device=opts.device)


PROBE = Command(
    "probe",
    "probes with control tasks (selectivity), MDL, and amnesic probing: is what a layer holds also used?",
    ProbeCommandSettings,
    run_probe,
    shared=Shared(
        model_help="embedded name, checkpoint folder or gt-TASK-VARIANT",
        out="output folder (default runs/probe-<time>)",
        placement=False,
    ),
    needs_model=False,
    views=("generic",),
)
