"""Each command's settings: one typed dataclass, checked before any work and before any output exists.

Two checks: :meth:`check` needs nothing (ranges, choices, JSON), so the CLI runs it before loading
the model; :meth:`validate` needs the model (layers, heads, classes, model kind) and runs right
after loading it. Both raise :class:`~streetlamp.errors.StreetlampError` (one line, exit 2).
``batch_size`` is the token budget of one forward pass (:mod:`streetlamp.batching`), under that one
name from the CLI's ``--batch-size`` to the engine.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from .errors import StreetlampError

if TYPE_CHECKING:
    from .models.adapter import ModelAdapter


# -- shared checks -------------------------------------------------------------------------------------
def at_least(value: int | float | None, minimum: int | float, flag: str) -> None:
    """``value`` (when given) is at least ``minimum``."""
    if value is not None and value < minimum:
        raise StreetlampError(f"{flag} must be at least {minimum} (got {value})")


def check_layer(adapter: ModelAdapter, layer: int | None, flag: str = "--layer") -> None:
    if layer is not None and not 0 <= layer < adapter.n_layers:
        raise StreetlampError(f"{flag} {layer} out of range: the model has layers 0..{adapter.n_layers - 1}")


def check_head(adapter: ModelAdapter, head: int | None, flag: str = "--head") -> None:
    if head is not None and not 0 <= head < adapter.n_heads:
        raise StreetlampError(f"{flag} {head} out of range: the model has heads 0..{adapter.n_heads - 1}")


def layer_spec(spec: str, flag: str = "layers") -> str:
    """A layer choice without the model: ``last``, ``all`` or a layer number (checked by :func:`layers_of`)."""
    if spec in ("last", "all"):
        return spec
    try:
        int(spec)
    except (TypeError, ValueError):
        raise StreetlampError(f"{flag} must be last, all or a layer number (got {spec!r})") from None
    return spec


def layers_of(adapter: ModelAdapter, spec: str, flag: str = "layers") -> list[int]:
    """The layers a ``last`` / ``all`` / number choice means for this model; out of range is an error."""
    if layer_spec(spec, flag) == "all":
        return list(range(adapter.n_layers))
    if spec == "last":
        return [adapter.n_layers - 1]
    check_layer(adapter, int(spec), flag)
    return [int(spec)]


@dataclass
class Settings:
    """Fields shared by every command that writes a run folder."""

    seed: int = 0
    batch_size: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, **parsed: Any) -> Self:
        """The fields from the parsed command line (same names), ``parsed`` overriding raw strings."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {n: getattr(args, n) for n in names if hasattr(args, n)}
        values.update(parsed)
        s = cls(**values)
        s.check()
        return s

    def check(self) -> None:
        at_least(self.batch_size, 1, "--batch-size")

    def validate(self, adapter: ModelAdapter) -> None:
        """Checks that need the model; run after loading it and before any output."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ExplainSettings(Settings):
    text: str = ""
    target: str | None = None
    contrast: str | None = None
    quantity: str = "prob"
    layer: int | None = None
    head: int | None = None
    methods: list[str] = field(default_factory=list)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncate: bool = False

    def check(self) -> None:
        super().check()
        if not self.text.strip():
            raise StreetlampError("empty text: give the sentence to explain")
        if self.head is not None and self.layer is None:
            raise StreetlampError("--head needs --layer")

    def validate(self, adapter: ModelAdapter) -> None:
        check_layer(adapter, self.layer)
        check_head(adapter, self.head)


@dataclass
class GenerationSettings(Settings):
    prompt: str = ""
    new_tokens: int = 8
    quantity: str = "logprob"
    ig_params: dict[str, Any] = field(default_factory=dict)
    continuation: str | None = None
    methods: list[str] = field(default_factory=lambda: ["integrated_gradients"])
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self) -> None:
        super().check()
        if not self.prompt.strip():
            raise StreetlampError("empty prompt")
        if self.continuation is not None and not self.continuation.strip():
            raise StreetlampError("empty --continuation")
        if not 1 <= self.new_tokens <= 64:
            raise StreetlampError(f"--new-tokens must be 1..64 (got {self.new_tokens})")

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.kind not in ("causal_lm", "seq2seq"):
            raise StreetlampError(
                f"explain-generation needs a causal LM or an encoder-decoder; {adapter.name} is a {adapter.kind}"
            )


@dataclass
class HeadsSettings(Settings):
    text: str | None = None
    data: str | None = None
    ablation: str = "zero"
    target: str | None = None
    limit: int | None = None
    sample: int | None = None
    attribution: bool = True

    def check(self) -> None:
        super().check()
        if (self.text is None) == (self.data is None):
            raise StreetlampError("give a TEXT or --data FILE")
        if self.limit is not None and self.sample is not None:
            raise StreetlampError("give --limit (the first N) or --sample (N drawn with --seed), not both")
        at_least(self.limit, 1, "--limit")
        at_least(self.sample, 1, "--sample")


PRUNE_ORDERS = ("importance", "attribution", "attention", "random")


@dataclass
class PruneSettings(Settings):
    data: str = ""
    orders: list[str] = field(default_factory=lambda: list(PRUNE_ORDERS))
    seeds: int = 3
    step: int = 1
    limit: int | None = None

    def check(self) -> None:
        super().check()
        bad = [o for o in self.orders if o not in PRUNE_ORDERS]
        if bad or not self.orders:
            raise StreetlampError(f"unknown order {bad[0] if bad else ''!r}; choose {', '.join(PRUNE_ORDERS)}")
        at_least(self.seeds, 0, "--seeds")
        at_least(self.step, 1, "--step")
        at_least(self.limit, 4, "--limit")

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.kind != "classifier":
            raise StreetlampError("pruning measures accuracy: it needs a classifier")


PATCH_KINDS = ("resid_pre", "attn.out", "mlp.out", "heads")


@dataclass
class PatchSettings(Settings):
    clean: str = ""
    corrupt: str = ""
    answer: str | None = None
    wrong: str | None = None
    paths: bool = False
    receiver: str = "logits"
    receiver_pos: int | None = None
    approx: bool = False
    sites: list[str] = field(default_factory=lambda: list(PATCH_KINDS))

    def check(self) -> None:
        super().check()
        bad = [k for k in self.sites if k not in PATCH_KINDS]
        if bad or not self.sites:
            raise StreetlampError(f"unknown site kind(s) {bad}; choose from {', '.join(PATCH_KINDS)}")
        if not self.clean.strip() or not self.corrupt.strip():
            raise StreetlampError("--clean and --corrupt must not be empty")

    def validate(self, adapter: ModelAdapter) -> None:
        if self.paths:
            from .runners.patch import parse_heads

            parse_heads(adapter, self.receiver)


@dataclass
class MediateSettings(Settings):
    prompts: int = 8
    component: str = "attn.pattern"

    def check(self) -> None:
        super().check()
        at_least(self.prompts, 1, "--prompts")

    def validate(self, adapter: ModelAdapter) -> None:
        if adapter.kind != "causal_lm":
            raise StreetlampError("mediation compares next-token probabilities of pronouns: it needs a causal LM")


@dataclass
class EvaluateSettings(Settings):
    """``evaluate``'s command line; :meth:`eval_settings` gives the part stored in the run store
    (:class:`~streetlamp.evaluation.pipeline.EvalSettings`, compared on resume)."""

    data: str = ""
    methods: list[str] = field(default_factory=lambda: ["attention"])
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    limit: int | None = None
    sample: int | None = None
    text_column: str | None = None
    label_column: str | None = None
    truncate: bool = False
    replacement: str = "delete"
    flip_layers: str = "last"
    cf_layers: str = "last"
    eps: float = 0.01
    permutations: int = 10
    adv_steps: int = 40
    chunk_size: int = 16
    engine: str = "local"
    ray_address: str | None = None
    workers: int | None = None

    def check(self) -> None:
        super().check()
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

    def eval_settings(self) -> Any:
        """The stored part (:class:`~streetlamp.evaluation.pipeline.EvalSettings`)."""
        from .evaluation.counterfactual import Counterfactual
        from .evaluation.pipeline import EvalSettings

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
        )

    def validate(self, adapter: ModelAdapter) -> None:
        layers_of(adapter, self.flip_layers, "--flip-layers")
        layers_of(adapter, self.cf_layers, "--cf-layers")


@dataclass
class BenchmarkSettings(Settings):
    tasks: list[str] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    n_examples: int = 50
    quantity: str = "logit"

    def check(self) -> None:
        super().check()
        at_least(self.n_examples, 1, "--n-examples")
