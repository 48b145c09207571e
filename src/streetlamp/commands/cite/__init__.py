"""``cite`` (which source of a context did the answer come from; METHODS.md section 15) and ``cite-bench``
(the same methods over a benchmark of questions with planted sources, in the resumable run store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ...specs import split_list
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter

# methods/citation.CITE_METHODS (this module imports no torch; tests/commands/test_cite.py checks they agree)
METHODS = (
    "attention",
    "attention_nosink",
    "attntrace",
    "rollout",
    "gradient_x_input",
    "integrated_gradients",
    "attnlrp",
    "contextcite",
    "leave_one_out",
)


def parse_cite_methods(spec: str | list[str]) -> list[str]:
    names = split_list(spec)
    if names == ["all"] or not names:
        return list(METHODS)
    bad = [n for n in names if n not in METHODS]
    if bad:
        raise StreetlampError(f"unknown citation method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m in names]


def parse_court(spec: str | list[str] | list[int]) -> list[int]:
    """``"1,3,5"`` -> ``[1, 3, 5]``; ``"none"`` -> ``[]`` (no court: each question costs only its methods)."""
    names = split_list([str(x) for x in spec] if isinstance(spec, list) else spec)
    if names == ["none"]:
        return []
    try:
        ks = sorted({int(n) for n in names})
    except ValueError:
        raise StreetlampError(f"--court takes sizes like 1,3,5 or 'none', not {spec!r}") from None
    if not ks or ks[0] < 1:
        raise StreetlampError(f"--court sizes must be positive integers (or 'none'), not {spec!r}")
    return ks


@dataclass
class CiteMethodSettings(Settings):
    """The methods and their parameters (shared by ``cite`` and ``cite-bench``)."""

    methods: list[str] = option(
        default_factory=lambda: list(METHODS),
        parse=parse_cite_methods,
        help="comma-separated: " + ", ".join(METHODS) + " (default all)",
    )
    ablations: int = option(32, ge=2, le=4096, help="ContextCite: random source-ablation masks for its Lasso")
    held_out: int = option(16, ge=0, le=4096, help="ContextCite: held-out random masks for its LDS (0: none)")
    alpha: float = option(0.01, gt=0, help="ContextCite: the Lasso's L1 weight (scikit-learn's alpha)")
    attntrace_samples: int = option(
        30, ge=0, le=1000, help="AttnTrace: random source subsets averaged (0: one pass over all sources)"
    )
    attntrace_fraction: float = option(0.4, gt=0, le=1, help="AttnTrace: fraction of the sources in a subset")
    attntrace_top: int = option(5, ge=1, help="AttnTrace: a source's score is the mean of its top-K token values")
    ig_steps: int = option(16, ge=2, le=512, help="integrated gradients: Riemann steps (fixed, not adaptive)")
    court: list[int] = option(
        default_factory=lambda: [1, 3, 5],
        parse=parse_court,
        help="the court's sizes k: the answer with each method's top-k sources removed / only them kept "
        "(default 1,3,5; 'none': no court, the cheap way to measure recall at long contexts)",
    )
    max_answer_tokens: int = option(8, ge=1, le=64, help="the generated answer's length at most (no --answer)")
    truncate: bool = option(False, help="drop sources from the end when the context is over the model's window")

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.causal:
            raise StreetlampError(f"cite needs a causal LM ({adapter.name} is a {adapter.kind})")


@dataclass
class CiteSettings(CiteMethodSettings):
    context: str = option("", required=True, help="the sources: .jsonl (one per line) or a text file split by --split")
    question: str = option("", required=True, help="the question about the context")
    answer: str | None = option(None, help="the answer to attribute (default: the model's greedy answer)")
    split: str = option(
        "sentences", choices=("sentences", "paragraphs", "lines"), help="how a text file is cut into sources"
    )

    def check(self) -> None:
        super().check()
        if not self.question.strip():
            raise StreetlampError("--question must not be empty")
        if self.answer is not None and not self.answer.strip():
            raise StreetlampError("--answer must not be empty")
        from ...data.sources import read_sources

        read_sources(self.context, self.split)  # empty or malformed sources refused before the model loads


@dataclass
class CiteBenchSettings(CiteMethodSettings):
    data: str = option(
        "planted",
        help="'planted' (generated from the shipped corpora: --questions, --words) or a benchmark .jsonl "
        "(sources, question, answer, planted, kind per line)",
    )
    questions: int = option(20, ge=1, le=100_000, help="planted: number of questions (the kinds in turn)")
    words: int = option(300, ge=10, le=100_000, help="planted: distractor words per context (about)")
    passage_words: int = option(
        0,
        ge=0,
        help="planted: 0 = every sentence a source, each plant its own; N = sources are passages of about N "
        "words, each plant a sentence inside one",
    )
    limit: int | None = option(None, ge=1, help="the first N questions only")
    chunk_size: int = option(4, ge=1, help="questions per stored chunk (the unit of resumption)")
    engine: str = option(
        "local", choices=("local", "ray"), help="ray: chunks of questions on Ray actors (one model each)"
    )
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, ge=1, help="Ray actors (one model each)")

    def check(self) -> None:
        super().check()
        if self.engine == "ray":
            from ...extras import require

            require("ray")
        if self.data != "planted":
            from ...data.sources import read_questions

            read_questions(self.data)  # every malformed line refused before anything is written


CITE = Command(
    "cite",
    "which source of a context did the answer come from: attention, AttnTrace, rollout, gradients, AttnLRP, "
    "ContextCite and leave-one-out, scored per source, each judged by removing its top sources",
    CiteSettings,
    lazy(__name__ + ".run", "run_cite"),
    shared=Shared(model="smollm2-135m", out="output folder (default runs/cite-<time>)"),
    views=("cite",),
)
CITE_BENCH = Command(
    "cite-bench",
    "citation methods over a benchmark of questions with planted sources (resumable): top-k recall per method",
    CiteBenchSettings,
    lazy(__name__ + ".run", "run_bench"),
    shared=Shared(
        model="smollm2-135m", out="run folder; the same command resumes it", out_required=True, overwrite=False
    ),
    writes="store",
    views=("generic",),
)
