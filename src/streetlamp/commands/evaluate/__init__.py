"""``evaluate`` (faithfulness over a dataset, resumable run store) and ``benchmark`` (ground truth)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import StreetlampError
from ...settings import Settings, Shared, at_least, layers_of, option
from ...specs import layer_spec, parse_method_params, parse_tasks
from ..base import Command
from ..checks import check_method_params, parse_methods

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class EvaluateSettings(Settings):
    """``evaluate``'s settings; :meth:`eval_settings` gives the part stored in the run store
    (:class:`~streetlamp.evaluation.pipeline.EvalSettings`, compared on resume)."""

    data: str = option("", required=True, help="movies, tweets, drugs, a .csv/.tsv/.jsonl file or an ERASER folder")
    methods: list[str] = option(
        default_factory=lambda: ["attention"], parse=parse_methods, help="comma-separated method names, or 'all'"
    )
    method_params: dict[str, dict[str, Any]] = option(
        default_factory=dict,
        parse=parse_method_params,
        help='JSON, e.g. {"integrated_gradients": {"steps": 16}}, or integrated_gradients.steps=16',
    )
    limit: int | None = option(None, help="first N examples only")
    sample: int | None = option(None, help="N examples drawn with --seed (kept in file order)")
    text_column: str | None = option(None)
    label_column: str | None = option(None)
    truncate: bool = option(False, help="cut texts longer than the model's positions (default: skip)")
    replacement: str = option("delete", choices=("delete", "mask"), help="how erasure removes tokens")
    flip_layers: str = option("last", help="decision-flip layers: last, all or a layer number")
    cf_layers: str = option("last", help="counterfactual-attention layers: last, all or a number")
    eps: float = option(0.01, help="adversarial attention: max output change (TVD)")
    permutations: int = option(10)
    adv_steps: int = option(40)
    chunk_size: int = option(16, help="examples per stored chunk (unit of resumption)")
    engine: str = option("local", choices=("local", "ray"))
    ray_address: str | None = option(None, help="existing Ray cluster (e.g. auto, ray://head:10001)")
    workers: int | None = option(None, help="Ray actors (one model each)")
    answer_tokens: int = option(
        0, help="causal LM: also score every token of the greedy N-token answer (forced decoding; docs/decoder.md)"
    )
    soft: bool = option(True, flag="--no-soft", help="skip soft erasure (Soft-NC/NS, pi-Soft-NC/NS: on by default)")
    soft_samples: int = option(10, help="soft erasure: Bernoulli masks per example, method and variant")
    soft_pi: float = option(0.5, help="pi-Soft-NC/NS: expected retained fraction of the tokens, in (0, 1]")
    ffidelity_train: str = option(
        "", help="F-Fidelity: fine-tune a copy with random masking on this data (evaluated texts left out)"
    )
    ffidelity_beta: float = option(0.5, help="F-Fidelity: largest masked fraction, in training and measuring")
    ffidelity_epochs: int = option(2, help="F-Fidelity: fine-tuning epochs")
    ffidelity_lr: float = option(3e-5, help="F-Fidelity: AdamW learning rate")
    ffidelity_samples: int = option(4, help="F-Fidelity: random subsets per removal ratio")
    ffidelity_max_train: int = option(1000, help="F-Fidelity: at most N training examples (drawn with --seed)")
    randomisation: str = option(
        "", help="model-randomisation sanity check: cascading, independent or both (explains again per stage)"
    )
    randomisation_target: str = option(
        "prediction",
        help="what a randomised copy explains: prediction (its own) or trained (the trained model's prediction)",
    )
    smooth_mprt: int = option(
        0, help="Smooth MPRT: mean of N explanations (N-1 on noisy embeddings) before comparing; 0 = off"
    )
    smooth_mprt_noise: float = option(0.1, help="Smooth MPRT: noise std as a fraction of the embeddings' range")
    smooth_mprt_stages: str = option("all", help="Smooth MPRT: all, or stages (head,top,layer.N,embed)")
    efficient_mprt: bool = option(False, help="Efficient MPRT: entropy rise, trained vs fully randomised model")
    efficient_mprt_bins: int = option(10, help="Efficient MPRT: histogram bins of the entropy")

    def check(self) -> None:
        super().check()
        check_method_params(self.method_params, self.methods)
        if not 0 <= self.answer_tokens <= 64:
            raise StreetlampError(f"--answer-tokens must be 0..64 (got {self.answer_tokens})")
        layer_spec(self.flip_layers, "--flip-layers")
        layer_spec(self.cf_layers, "--cf-layers")
        if self.replacement not in ("delete", "mask"):
            raise StreetlampError("--replacement must be 'delete' or 'mask'")
        if self.engine not in ("local", "ray"):
            raise StreetlampError(f"unknown engine {self.engine!r}: local or ray")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        at_least(self.limit, 1, "--limit")
        at_least(self.sample, 1, "--sample")
        at_least(self.chunk_size, 1, "--chunk-size")
        at_least(self.permutations, 1, "--permutations")
        at_least(self.adv_steps, 1, "--adv-steps")
        at_least(self.workers, 1, "--workers")
        if not self.eps > 0:
            raise StreetlampError(f"--eps must be positive (got {self.eps})")
        from ...evaluation.soft import check_soft

        check_soft(self.soft_samples, self.soft_pi)
        if self.ffidelity_train:
            self._ffidelity().check()
        if self.randomisation or self.efficient_mprt or self.smooth_mprt or self.randomisation_target != "prediction":
            from ...evaluation.randomisation import check_settings

            check_settings(self)

    def eval_settings(self) -> Any:
        """The stored part (:class:`~streetlamp.evaluation.pipeline.EvalSettings`)."""
        from ...evaluation.counterfactual import Counterfactual
        from ...evaluation.pipeline import EvalSettings

        cf = Counterfactual(eps=self.eps, n_permutations=self.permutations, steps=self.adv_steps)
        return EvalSettings(
            methods=self.methods,
            method_params=self.method_params,
            seed=self.seed,
            batch_size=self.batch_size,
            replacement=self.replacement,
            flip_layers=self.flip_layers,
            cf_layers=self.cf_layers,
            counterfactual=cf.__dict__.copy(),
            truncate=self.truncate,
            answer_tokens=self.answer_tokens,
            soft=self.soft,
            soft_samples=self.soft_samples,
            soft_pi=self.soft_pi,
            randomisation=self.randomisation,
            randomisation_target=self.randomisation_target,
            smooth_mprt=self.smooth_mprt,
            smooth_mprt_noise=self.smooth_mprt_noise,
            smooth_mprt_stages=self.smooth_mprt_stages,
            efficient_mprt=self.efficient_mprt,
            efficient_mprt_bins=self.efficient_mprt_bins,
            ffidelity=self._ffidelity().__dict__.copy() if self.ffidelity_train else {},
        )

    def _ffidelity(self) -> Any:
        from ...evaluation.ffidelity import FFidelity

        return FFidelity(
            train=self.ffidelity_train,
            beta=self.ffidelity_beta,
            epochs=self.ffidelity_epochs,
            lr=self.ffidelity_lr,
            samples=self.ffidelity_samples,
            max_train=self.ffidelity_max_train,
        )

    def validate(self, adapter: ModelAdapter) -> None:
        layers_of(adapter, self.flip_layers, "--flip-layers")
        layers_of(adapter, self.cf_layers, "--cf-layers")


def run_evaluate(adapter: ModelAdapter | None, s: EvaluateSettings, out: Path, opts: Any) -> Any:
    """The runner loads the model itself (and each Ray worker its own) and validates against it."""
    from .run import evaluate

    given = None if isinstance(opts.model, (str, Path)) else opts.model  # the Python API may pass an adapter
    return evaluate(
        given.name if given is not None else opts.model,
        s.data,
        out,
        s.eval_settings(),
        limit=s.limit,
        sample=s.sample,
        chunk_size=s.chunk_size,
        engine=s.engine,
        ray_address=s.ray_address,
        workers=s.workers,
        device=opts.device,
        text_column=s.text_column,
        label_column=s.label_column,
        adapter=given,
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
    n_examples: int = option(50, help="generated texts per task (default 50)")
    quantity: str = option(
        "logit",
        choices=("prob", "logit", "logprob"),
        help="explained quantity of the predicted class (default logit: these models saturate)",
    )

    def check(self) -> None:
        super().check()
        at_least(self.n_examples, 1, "--n-examples")


def run_benchmark(adapter: None, s: BenchmarkSettings, out: Any, opts: Any) -> Any:
    from ...methods.registry import list_methods
    from .benchmark import benchmark

    return benchmark(
        out,
        s.tasks,
        s.methods or list_methods(),
        n_examples=s.n_examples,
        seed=s.seed,
        device=opts.device,
        batch_size=s.batch_size,
        quantity=s.quantity,
    )


STORE_OUT = "run folder; the same command resumes it"
EVALUATE = Command(
    "evaluate",
    "faithfulness of methods over a dataset, in a resumable run store",
    EvaluateSettings,
    run_evaluate,
    shared=Shared(out=STORE_OUT, out_required=True, overwrite=False, placement=False),
    needs_model=False,
    writes="store",
    views=("evaluate",),
)
BENCHMARK = Command(
    "benchmark",
    "ground truth: which methods recover planted tokens (normal vs deceptive)",
    BenchmarkSettings,
    run_benchmark,
    shared=Shared(takes_model=False, out="output folder", out_required=True, placement=False),
    needs_model=False,
    views=("benchmark",),
)
