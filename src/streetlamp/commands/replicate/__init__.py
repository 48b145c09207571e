"""``replicate``: Jain & Wallace, Serrano & Smith, Wiegreffe & Pinter per layer and head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StreetlampError
from ...settings import RunOptions, Settings, Shared, option
from ...specs import parse_data
from ..base import Command

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

DATASETS = (
    "movies",
    "tweets",
    "recall",
)  # commands.replicate.run.DATASETS (the same: tests/commands/test_cli_commands.py)


def _data(spec: Any) -> list[str]:
    return parse_data(spec if isinstance(spec, str) else ",".join(spec), DATASETS)


@dataclass
class ReplicateCommandSettings(Settings):
    """The command line; :meth:`stored` is the part the run store records and compares on resume
    (:class:`~streetlamp.evaluation.replicate.ReplicateSettings`)."""

    data: list[str] = option(
        default_factory=lambda: list(DATASETS), parse=_data, help="comma-separated: movies, tweets, recall"
    )
    limit: int | None = option(None, help="N examples per dataset, drawn with --seed")
    permutations: int = option(3, help="random permutations per layer")
    adv_steps: int = option(8, help="adversarial attention: optimiser steps")
    adv_layers: int = option(3, help="adversarial attention at K evenly spaced layers")
    eps: float = option(0.01, help="adversarial attention: max output change (TVD)")
    head_examples: int = option(0, help="per dataset, the first K examples also get per-head zeroing (-1: all)")
    layers: str = option("all", help="layers with interventions: all, every:K or a comma list")
    zero_rows: str = option(
        "all",
        choices=("all", "explained"),
        help="Serrano & Smith's zeroing in every query row of the layer (default) or only the explained "
        "position's row (on a causal LM that row runs alone after the text's KV cache: far cheaper)",
    )
    exclude_first: bool = option(
        False,
        help="the sequence's first token is never an item (ranked, removed or zeroed): on a decoder without BOS "
        "(SmolLM2) whose prompt starts with the data (recall), the attention sink; a BOS is never an item anyway",
    )
    chunk_size: int = option(4, help="examples per stored chunk (unit of resumption)")

    def stored(self) -> Any:
        from ...evaluation.replicate import ReplicateSettings

        keep = set(ReplicateSettings.__dataclass_fields__)
        return ReplicateSettings(**{k: v for k, v in self.to_dict().items() if k in keep})


def one_device(opts: RunOptions) -> None:
    if opts.device_map is not None or opts.max_memory or opts.offload_folder:
        raise StreetlampError(
            "replicate runs on one device: give --device, not --device-map / --max-memory / --offload-folder"
        )


def run_replicate(adapter: ModelAdapter, s: ReplicateCommandSettings, out: Path, opts: RunOptions) -> Any:
    from .run import replicate

    return replicate(str(opts.model), s.data, out, s.stored(), limit=s.limit, chunk_size=s.chunk_size, adapter=adapter)


REPLICATE = Command(
    "replicate",
    "Jain & Wallace, Serrano & Smith, Wiegreffe & Pinter per layer and head (docs/replication.md)",
    ReplicateCommandSettings,
    run_replicate,
    shared=Shared(
        model="smollm2-135m", out="run folder; the same command resumes it", out_required=True, overwrite=False
    ),
    writes="store",
    one_stack=False,
    check_options=one_device,
)
