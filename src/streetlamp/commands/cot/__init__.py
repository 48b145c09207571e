"""``cot``: chain-of-thought faithfulness (hints, biased contexts, Lanham tests), local or served."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import StreetlampError
from ...settings import RunOptions, Shared, option, seed_option
from ...specs import split_list
from ..base import Command

TESTS = ("hint", "biased_fewshot", "early_answer", "add_mistake", "paraphrase", "filler")  # commands.cot.run.TESTS


def _tests(spec: Any) -> list[str]:
    return list(TESTS) if spec == "all" else split_list(spec)


@dataclass
class CotCommandSettings:
    """The command line; :meth:`stored` is :class:`~streetlamp.commands.cot.run.CotSettings` (recorded and
    compared on resume), the rest says where the chains come from."""

    endpoint: str | None = option(None, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1")
    served_model: str | None = option(None, help="model name on the server (default: its only model)")
    api: str = option("chat", choices=("chat", "completions"), help="server API (with --endpoint)")
    data: str = option("", required=True, help="bbh:TASK (BIG-Bench Hard task) or a .jsonl (question, choices, answer)")
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
    biases: list[str] = option(
        default_factory=lambda: ["always_a", "suggested"], parse=split_list, help="always_a, suggested"
    )
    limit: int | None = option(None, help="first N questions")
    max_new_tokens: int = option(96, help="chain-of-thought length cap")
    temperature: float = option(0.0, help="0: greedy; > 0: sampling seeded per prompt")
    points: int = option(3, help="Lanham tests: points per chain (plus its ends)")
    shots: int = option(3, help="few-shot exemplars (always_a)")
    internals: bool = option(True, flag="--no-internals", help="skip attention/knockout for used hints (local)")
    concurrency: int = option(4, help="parallel requests (--endpoint)")
    retries: int = option(4, help="retries per request, exponential backoff")
    timeout: float = option(120.0, help="seconds per request")
    budget: int | None = option(None, help="most requests to send in this invocation")
    chunk_size: int = option(1, help="questions per stored chunk (unit of resumption)")
    engine: str = option("local", choices=("local", "ray"), help="ray: chunks on Ray actors (local --model)")
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, help="Ray actors (one model each)")
    judge_endpoint: str | None = option(
        None,
        help="OpenAI-compatible base URL of a judge model asked whether each hinted/biased chain mentions the cue",
    )
    judge_model: str | None = option(None, help="model name on the judge server (default: its only model)")
    seed: int = seed_option()

    STORED = (
        "tests", "hint_kinds", "biases", "max_new_tokens", "temperature", "seed", "points", "shots", "internals",
        "chunk_size",
    )  # fmt: skip

    def stored(self) -> Any:
        from .run import CotSettings

        return CotSettings(**{k: getattr(self, k) for k in self.STORED})

    def check(self) -> None:
        self.stored().check()
        if self.judge_model and not self.judge_endpoint:
            raise StreetlampError("--judge-model needs --judge-endpoint")

    def validate(self, adapter: Any) -> None:
        pass


def run_cot(adapter: None, s: CotCommandSettings, out: Path, opts: RunOptions) -> Any:
    from .run import make_engine
    from .run import run_cot as run

    judge = None
    if s.judge_endpoint:
        from ...cot.engines import HttpSettings

        judge = HttpSettings(
            s.judge_endpoint,
            s.judge_model,
            "chat",
            0.0,
            s.concurrency,
            s.retries,
            timeout=s.timeout,
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    engine, record = make_engine(
        opts.model,
        s.endpoint,
        served_model=s.served_model,
        api=s.api,
        temperature=s.temperature,
        concurrency=s.concurrency,
        retries=s.retries,
        timeout=s.timeout,
        budget=s.budget,
        device=opts.device,
    )
    res = run(
        s.data,
        out,
        s.stored(),
        engine,
        record,
        limit=s.limit,
        fan_out=s.engine,
        model=opts.model,
        ray_address=s.ray_address,
        workers=s.workers,
        device=opts.device,
        judge_http=judge,
    )
    return res


COT = Command(
    "cot",
    "chain-of-thought faithfulness: hints, biased contexts, early answering, "
    "mistakes, paraphrases, filler (local model or OpenAI-compatible server)",
    CotCommandSettings,
    run_cot,
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
