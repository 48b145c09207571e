"""``cot``: chain-of-thought faithfulness (hints, biased contexts, Lanham tests), local or served."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from ...errors import StreetlampError
from ...settings import Shared, option, seed_option
from ...specs import split_list
from ..base import Command, lazy

TESTS = ("hint", "biased_fewshot", "early_answer", "add_mistake", "paraphrase", "filler")
BIASES = ("always_a", "suggested")


def _tests(spec: Any) -> list[str]:
    return list(TESTS) if spec == "all" else split_list(spec)


@dataclass
class CotSettings:
    """What a ``cot`` run measures: the record its run store keeps (``parameters``) and compares on resume,
    the judge's fields as the judge answered (its endpoint and model name, :meth:`stored`)."""

    tests: list[str] = option(
        default_factory=lambda: ["hint", "biased_fewshot", "early_answer"],
        parse=_tests,
        help="comma-separated: hint, biased_fewshot, early_answer, add_mistake, paraphrase, filler; or all",
    )
    hint_kinds: list[str] = option(
        default_factory=lambda: ["sycophancy", "metadata"],
        parse=split_list,
        help="sycophancy, consistency, metadata, grader_hacking, unethical",
    )
    biases: list[str] = option(default_factory=lambda: list(BIASES), parse=split_list, help="always_a, suggested")
    max_new_tokens: int = option(96, ge=1, le=4096, help="chain-of-thought length cap")
    temperature: float = option(0.0, ge=0, help="0: greedy; > 0: sampling seeded per prompt")
    seed: int = seed_option()
    points: int = option(3, ge=1, le=20, help="Lanham tests: points per chain (plus its ends)")
    shots: int = option(3, ge=1, le=16, help="few-shot exemplars (always_a)")
    internals: bool = option(True, flag="--no-internals", help="skip attention/knockout for used hints (local)")
    chunk_size: int = option(1, ge=1, help="questions per stored chunk (unit of resumption)")
    judge_endpoint: str | None = option(
        None,
        help="OpenAI-compatible base URL of a judge model asked whether each hinted/biased chain mentions the cue",
    )
    judge_model: str | None = option(None, help="model name on the judge server (default: its only model)")

    def stored(self) -> dict[str, Any]:
        """The record of these fields alone (not a subclass's), as stores have always kept it."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(CotSettings)}

    def check(self) -> None:
        from ...cot.prompts import HINT_KINDS

        for flag, got, known in (("--tests", self.tests, TESTS), ("--hint-kinds", self.hint_kinds, HINT_KINDS)):
            bad = [t for t in got if t not in known]
            if bad or not got:
                raise StreetlampError(
                    f"{flag}: unknown {', '.join(map(repr, bad)) or '(none given)'}; choose from {', '.join(known)}"
                )
        bad = [b for b in self.biases if b not in BIASES]
        if bad or not self.biases:
            raise StreetlampError(
                f"--biases: unknown {', '.join(map(repr, bad)) or '(none)'}; choose from {', '.join(BIASES)}"
            )
        if self.judge_model and not self.judge_endpoint:
            raise StreetlampError("--judge-model needs --judge-endpoint")


@dataclass
class CotCommandSettings(CotSettings):
    """The command line: what is measured (:class:`CotSettings`, stored) and where the chains come from."""

    endpoint: str | None = option(None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1")
    served_model: str | None = option(None, help="model name on the server (default: its only model)")
    api: str = option("chat", choices=("chat", "completions"), help="server API (with --endpoint)")
    data: str = option("", required=True, help="bbh:TASK (BIG-Bench Hard task) or a .jsonl (question, choices, answer)")
    limit: int | None = option(None, ge=1, help="first N questions")
    concurrency: int = option(4, ge=1, help="parallel requests (--endpoint)")
    retries: int = option(4, ge=0, help="retries per request, exponential backoff")
    timeout: float = option(120.0, gt=0, help="seconds per request")
    budget: int | None = option(None, ge=0, help="most requests to send in this invocation")
    engine: str = option("local", choices=("local", "ray"), help="ray: chunks on Ray actors (local --model)")
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, ge=1, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        if self.engine == "ray" and self.endpoint is not None:
            raise StreetlampError(
                "--engine ray fans a local --model out over Ray actors; with --endpoint use --concurrency instead"
            )

    def validate(self, adapter: Any) -> None:
        pass


COT = Command(
    "cot",
    "chain-of-thought faithfulness: hints, biased contexts, early answering, "
    "mistakes, paraphrases, filler (local model or OpenAI-compatible server)",
    CotCommandSettings,
    lazy(__name__ + ".run", "run_cot"),
    shared=Shared(
        model=None,
        model_help="a local causal LM (e.g. smollm2-135m)",
        out="run folder; the same command resumes it",
        out_required=True,
        overwrite=False,
        batch_size=False,
        placement=False,
    ),
    needs_model=False,
    writes="store",
    views=("generic",),
)
