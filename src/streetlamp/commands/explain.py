"""``explain`` (one text: attention, methods, figures; long inputs with --rows/--layers/--heads) and
``explain-generation`` (every generated token over its prefix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import StreetlampError
from ..settings import Settings, Shared, check_head, check_layer, option
from ..specs import parse_method_params, parse_params
from .base import Command
from .checks import check_method_params, parse_methods

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

QUANTITIES = ("prob", "logit", "logprob")


@dataclass
class ExplainSettings(Settings):
    text: str = option("", positional=True, help="the text, or for an image model (ViT) an image file")
    target: str | None = option(
        None,
        help="class name/id (classifier) or one token (causal LM); default: the prediction / the predicted next token",
    )
    contrast: str | None = option(None, help="explain target minus this class/token")
    quantity: str = option("prob", choices=QUANTITIES)
    layer: int | None = option(None, help="layer for the single heatmap (default: last)")
    head: int | None = option(None, help="head for the single heatmap (default: head mean)")
    methods: list[str] | None = option(
        None,
        parse=parse_methods,
        help="comma-separated method names, or 'all' (default: attention, rollout, integrated_gradients, occlusion)",
    )
    method_params: dict[str, dict[str, Any]] = option(
        default_factory=dict,
        parse=parse_method_params,
        help='JSON per method, e.g. \'{"occlusion": {"replacement": "unk", "group": "word"}, '
        '"integrated_gradients": {"baseline": "mask", "rule": "panels"}}\', or pairs: '
        "integrated_gradients.rule=panels,occlusion.replacement=unk",
    )
    truncate: bool = option(False, help="cut texts longer than the model's positions")
    rows: str | None = option(None, help="long inputs: keep only these query rows: last, explained, N, A:B")
    layers: str | None = option(None, help="long inputs: keep rows of these layers, e.g. 0,5,-1 (default all)")
    heads: str | None = option(None, help="long inputs: keep rows of these heads, e.g. 0,3 (default all)")
    occlusion_window: int | None = option(
        None, help="long inputs, --methods occlusion: tokens per occluded span (default: the text in 32 spans)"
    )

    @property
    def long(self) -> bool:
        """Long-input mode (docs/long-context.md): only some attention rows are kept."""
        return self.rows is not None or self.layers is not None or self.heads is not None

    def check(self) -> None:
        super().check()
        if not self.text.strip():
            raise StreetlampError("empty text: give the sentence to explain")
        if self.head is not None and self.layer is None:
            raise StreetlampError("--head needs --layer")
        from ..runners.explain import default_methods

        check_method_params(self.method_params, self.methods or default_methods())
        if not self.long and self.occlusion_window is not None:
            raise StreetlampError("--occlusion-window is for long inputs: give it with --rows/--layers/--heads")

    def validate(self, adapter: ModelAdapter) -> None:
        check_layer(adapter, self.layer)
        check_head(adapter, self.head)


def run_explain(adapter: ModelAdapter, s: ExplainSettings, out: Any, opts: Any) -> Any:
    from ..models.adapter import Quantity, Target
    from ..models.memory import check_memory
    from ..runners.explain import default_methods, explain, parse_target

    if not s.long:
        check_memory(adapter, max(adapter.encode(s.text, truncate=s.truncate).lengths), opts.force)
    target = Target(
        parse_target(adapter, s.target),
        parse_target(adapter, s.contrast) if s.contrast else None,
        cast(Quantity, s.quantity),
    )
    if s.long:
        from ..runners.explain_long import explain_long

        return explain_long(
            adapter,
            s.text,
            out,
            methods=s.methods,
            layers=s.layers,
            heads=s.heads,
            rows=s.rows,
            target=target,
            truncate=s.truncate,
            occlusion_window=s.occlusion_window,
            occlusion_replacement=s.method_params.get("occlusion", {}).get("replacement", "mask"),
        )
    return explain(
        adapter,
        s.text,
        out,
        target=target,
        layer=s.layer,
        head=s.head,
        methods=s.methods or default_methods(),
        truncate=s.truncate,
        seed=s.seed,
        batch_size=s.batch_size,
        method_params=s.method_params,
    )


def _ig_params(v: Any) -> dict[str, Any]:
    return parse_params(v, "--ig-params")


@dataclass
class GenerationSettings(Settings):
    prompt: str = option("", positional=True)
    new_tokens: int = option(
        8, help="greedy tokens to generate and explain (1..64; an encoder-decoder stops earlier after </s>)"
    )
    quantity: str = option("logprob", choices=(*QUANTITIES, "kl_divergence"))
    contrast_token: str | None = option(None, help="step function: quantity(y) - quantity(this one token)")
    contrast_prompt: str | None = option(None, help="step function: log p(y | prompt) - log p(y | this prompt)")
    chat: bool = option(False, help="apply the tokenizer's chat template to the prompt")
    granularity: str = option("token", choices=("token", "word", "sentence", "paragraph"))
    continuation: str | None = option(
        None,
        help="forced decoding: explain this given continuation (causal LM: re-tokenised after the prompt; "
        "encoder-decoder: the target text, tokenised alone) instead of generating greedily",
    )
    methods: list[str] = option(
        default_factory=lambda: ["integrated_gradients"],
        parse=parse_methods,
        help="comma-separated method names, or 'all' (default: integrated_gradients); each gives one matrix",
    )
    ig_params: dict[str, Any] = option(
        default_factory=dict, parse=_ig_params, help='JSON, e.g. \'{"rule": "panels", "steps": 16}\', or rule=panels'
    )
    method_params: dict[str, dict[str, Any]] = option(
        default_factory=dict,
        parse=parse_method_params,
        help='JSON per method, e.g. \'{"occlusion": {"replacement": "unk"}}\', or occlusion.replacement=unk',
    )

    def check(self) -> None:
        super().check()
        if self.ig_params:
            check_method_params({"integrated_gradients": self.ig_params}, ["integrated_gradients"], "--ig-params")
            if "integrated_gradients" not in self.methods:
                raise StreetlampError("--ig-params given but integrated_gradients is not among --methods")
        check_method_params(self.method_params, self.methods)
        if not self.prompt.strip():
            raise StreetlampError("empty prompt")
        if self.continuation is not None and not self.continuation.strip():
            raise StreetlampError("empty --continuation")
        if not 1 <= self.new_tokens <= 64:
            raise StreetlampError(f"--new-tokens must be 1..64 (got {self.new_tokens})")

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.generative:
            raise StreetlampError(
                f"explain-generation needs a causal LM or an encoder-decoder; {adapter.name} is a {adapter.kind}"
            )


def run_generation(adapter: ModelAdapter, s: GenerationSettings, out: Any, opts: Any) -> Any:
    from ..models.memory import check_memory
    from ..runners.generation import explain_generation

    length = len(adapter.encode(s.prompt + s.continuation).input_ids[0]) if s.continuation and not s.chat else None
    n = length if length is not None else max(adapter.encode(s.prompt).lengths) + s.new_tokens
    check_memory(adapter, n, opts.force, record_attention=False)
    return explain_generation(
        adapter,
        s.prompt,
        out,
        new_tokens=s.new_tokens,
        continuation=s.continuation,
        methods=s.methods,
        quantity=s.quantity,
        batch_size=s.batch_size,
        seed=s.seed,
        ig_params=s.ig_params,
        method_params=s.method_params,
        contrast_token=s.contrast_token,
        contrast_prompt=s.contrast_prompt,
        chat=s.chat,
        granularity=s.granularity,
    )


EXPLAIN = Command(
    "explain",
    "explain one text: attention of every layer and head, methods, figures",
    ExplainSettings,
    run_explain,
    shared=Shared(out="output folder (default runs/explain-<time>)", force=True),
    views=("explain", "explain_long"),
)
EXPLAIN_GENERATION = Command(
    "explain-generation",
    "causal LM or encoder-decoder (T5, BART): attribution of every generated (or given) token over the "
    "prompt (source) and earlier tokens, with any method (default integrated gradients, one shared path)",
    GenerationSettings,
    run_generation,
    shared=Shared(model="smollm2-135m", out="output folder (default runs/generation-<time>)", force=True),
    out_kind="generation",
    views=("explain-generation",),
    one_stack=False,
)
