"""``evaluate`` (faithfulness over a dataset, resumable run store) and ``benchmark`` (ground truth)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import StreetlampError
from ...evaluation.settings import EvalSettings
from ...settings import Settings, Shared, option
from ...specs import parse_tasks
from ..base import Command, lazy
from ..checks import check_method_params, parse_methods


@dataclass
class EvaluateSettings(EvalSettings):
    """``evaluate``'s settings: what is measured (:class:`~streetlamp.evaluation.settings.EvalSettings`,
    the part the run store keeps and compares on resume) and, here, the data, its selection and where the
    run goes."""

    data: str = option("", required=True, help="movies, tweets, drugs, a .csv/.tsv/.jsonl file or an ERASER folder")
    limit: int | None = option(None, ge=1, help="first N examples only")
    sample: int | None = option(None, ge=1, help="N examples drawn with --seed (kept in file order)")
    text_column: str | None = option(None)
    label_column: str | None = option(None)
    chunk_size: int = option(16, ge=1, help="examples per stored chunk (unit of resumption)")
    engine: str = option("local", choices=("local", "ray"))
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, ge=1, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        check_method_params(self.method_params, self.methods)
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        if self.ffidelity_train and self.engine != "local":
            raise StreetlampError(
                "--ffidelity-train runs on the local engine only (the fine-tuned copy lives in the run)"
            )


def _tasks(spec: Any) -> list[str]:
    from ...groundtruth.tasks import TASKS

    return parse_tasks(spec, TASKS)


@dataclass
class BenchmarkSettings(Settings):
    tasks: list[str] = option(
        default_factory=lambda: _tasks("all"),
        parse=_tasks,
        help="comma-separated: keyword,order,negation,together (default all)",
    )
    methods: list[str] | None = option(
        None, parse=parse_methods, help="comma-separated method names (default: every registered)"
    )
    n_examples: int = option(50, ge=1, help="generated texts per task (default 50)")
    quantity: str = option(
        "logit",
        choices=("prob", "logit", "logprob"),
        help="explained quantity of the predicted class (default logit: these models saturate)",
    )


STORE_OUT = "run folder; the same command resumes it"
EVALUATE = Command(
    "evaluate",
    "faithfulness of methods over a dataset, in a resumable run store",
    EvaluateSettings,
    lazy(__name__ + ".run", "evaluate"),
    shared=Shared(out=STORE_OUT, out_required=True, overwrite=False, placement=False),
    needs_model=False,
    writes="store",
    views=("evaluate",),
)
BENCHMARK = Command(
    "benchmark",
    "ground truth: which methods recover planted tokens (normal vs deceptive)",
    BenchmarkSettings,
    lazy(__name__ + ".benchmark", "run"),
    shared=Shared(takes_model=False, out="output folder", out_required=True, placement=False),
    needs_model=False,
    views=("benchmark",),
)
