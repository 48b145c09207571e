"""``replicate``: Jain & Wallace, Serrano & Smith, Wiegreffe & Pinter per layer and head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import StreetlampError
from ...evaluation.settings import ReplicateSettings
from ...settings import RunOptions, Shared, option
from ...specs import parse_data
from ..base import Command, lazy

DATASETS = (
    "movies",
    "tweets",
    "recall",
)  # commands.replicate.run.DATASETS (the same: tests/commands/test_cli_commands.py)


def _data(spec: Any) -> list[str]:
    return parse_data(spec if isinstance(spec, str) else ",".join(spec), DATASETS)


@dataclass
class ReplicateCommandSettings(ReplicateSettings):
    """The command line: what is measured (:class:`~streetlamp.evaluation.settings.ReplicateSettings`, the
    part the run store records and compares on resume) and on which data, in which chunks."""

    data: list[str] = option(
        default_factory=lambda: list(DATASETS), parse=_data, help="comma-separated: movies, tweets, recall"
    )
    limit: int | None = option(None, ge=1, help="N examples per dataset, drawn with --seed")
    chunk_size: int = option(4, ge=1, help="examples per stored chunk (unit of resumption)")


def one_device(opts: RunOptions) -> None:
    if opts.device_map is not None or opts.max_memory or opts.offload_folder:
        raise StreetlampError(
            "replicate runs on one device: give --device, not --device-map / --max-memory / --offload-folder"
        )


REPLICATE = Command(
    "replicate",
    "Jain & Wallace, Serrano & Smith, Wiegreffe & Pinter per layer and head (docs/replication.md)",
    ReplicateCommandSettings,
    lazy(__name__ + ".run", "replicate"),
    shared=Shared(
        model="smollm2-135m", out="run folder; the same command resumes it", out_required=True, overwrite=False
    ),
    writes="store",
    one_stack=False,
    check_options=one_device,
)
