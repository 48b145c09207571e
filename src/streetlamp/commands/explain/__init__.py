"""``explain`` (one text: attention, methods, figures; long inputs with --rows/--layers/--heads),
``attention-row`` (one row or column of such a long-input run) and ``explain-generation`` (every
generated token over its prefix)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ...errors import StreetlampError
from ...settings import NONE, Settings, Shared, check_head, check_layer, option
from ...specs import parse_method_params, parse_params
from ..base import Command, lazy
from ..checks import check_method_params, parse_methods

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter, Quantity, Target

QUANTITIES = ("prob", "logit", "logprob")
KL = "kl_divergence"  # models.adapter.KL: explain-generation's step function against the unedited run
MAX_NEW_TOKENS = 64  # explain-generation: generated (or given) tokens explained


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
        None, ge=1, help="long inputs, --methods occlusion: tokens per occluded span (default: the text in 32 spans)"
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
        from .run import default_methods

        check_method_params(self.method_params, self.methods or default_methods())
        if not self.long and self.occlusion_window is not None:
            raise StreetlampError("--occlusion-window is for long inputs: give it with --rows/--layers/--heads")
        if self.long:
            from .long import check_methods

            if "occlusion" not in check_methods(self.methods) and self.occlusion_window is not None:
                raise StreetlampError("--occlusion-window applies to --methods occlusion")

    def validate(self, adapter: ModelAdapter) -> None:
        check_layer(adapter, self.layer)
        check_head(adapter, self.head)
        if self.long:  # the kept rows name layers, heads and positions of this model and text
            from ...specs import parse_indices, parse_rows

            parse_indices(self.layers, adapter.n_layers, "--layers", "layer")
            parse_indices(self.heads, adapter.n_heads, "--heads", "head")
            n = adapter.encode(self.text, truncate=self.truncate).lengths[0]
            parse_rows(self.rows, n, adapter.explained_position(n))

    def explained_target(self, adapter: ModelAdapter) -> Target:
        """``--target`` (default: the prediction), ``--contrast`` and ``--quantity`` for this model."""
        from ...models.adapter import Target
        from .run import parse_target

        contrast = parse_target(adapter, self.contrast) if self.contrast else None
        return Target(parse_target(adapter, self.target), contrast, cast("Quantity", self.quantity))


@dataclass
class RowSettings:
    dir: str = option("", positional=True, help="a run folder written by explain --rows")
    layer: int = option(0, required=True, help="layer (negative: from the end)")
    row: str = option("explained", help="query position: N, last or explained")
    heads: str | None = option(None, help="comma-separated heads (default all)")
    column: bool = option(False, help="the column of key position --row instead of its row")

    def check(self) -> None:
        if not self.dir.strip():
            raise StreetlampError("DIR is empty: give the run folder of explain --rows")


def _ig_params(v: Any) -> dict[str, Any]:
    return parse_params(v, "--ig-params")


@dataclass
class GenerationSettings(Settings):
    prompt: str = option("", positional=True)
    new_tokens: int = option(
        8,
        ge=1,
        le=MAX_NEW_TOKENS,
        help=f"greedy tokens to generate and explain (1..{MAX_NEW_TOKENS}; an encoder-decoder stops earlier after </s>)",
    )
    quantity: str = option("logprob", choices=(*QUANTITIES, KL))
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
        if len(set(self.methods)) != len(self.methods):
            raise StreetlampError(f"a method is named twice in {','.join(self.methods)}")
        if self.ig_params:
            check_method_params({"integrated_gradients": self.ig_params}, ["integrated_gradients"], "--ig-params")
            if "integrated_gradients" not in self.methods:
                raise StreetlampError("--ig-params given but integrated_gradients is not among --methods")
            if "integrated_gradients" in self.method_params:
                raise StreetlampError("integrated gradients' parameters given twice (--ig-params and --method-params)")
        check_method_params(self.method_params, self.methods)
        if not self.prompt.strip():
            raise StreetlampError("empty prompt")
        if self.continuation is not None and not self.continuation.strip():
            raise StreetlampError("empty --continuation")
        self.check_step()

    def check_step(self) -> None:
        """The step function: one kind of contrast, KL with perturbation methods only, a log-prob contrast prompt."""
        if self.contrast_token is not None and self.contrast_prompt is not None:
            raise StreetlampError("give --contrast-token or --contrast-prompt, not both")
        if self.quantity == KL:
            if self.contrast_token is not None or self.contrast_prompt is not None:
                raise StreetlampError(f"{KL} compares with the unedited run: no contrast")
            from ...methods.registry import REGISTRY

            other = [n for n in self.methods if REGISTRY[n].family != "perturbation"]
            if other:
                raise StreetlampError(
                    f"{KL} needs the unedited run and perturbed inputs: perturbation methods only "
                    f"(occlusion, shap, lime), not {', '.join(other)}"
                )
        if self.contrast_prompt is not None:
            if not self.contrast_prompt.strip():
                raise StreetlampError("empty --contrast-prompt")
            if self.quantity != "logprob":
                raise StreetlampError("--contrast-prompt is a difference of log-probabilities: use --quantity logprob")

    def validate(self, adapter: ModelAdapter) -> None:
        if not adapter.kind.generative:
            raise StreetlampError(
                f"explain-generation needs a causal LM or an encoder-decoder; {adapter.name} is a {adapter.kind}"
            )
        if adapter.kind.view == "source_target":
            if (
                self.contrast_token
                or self.contrast_prompt
                or self.chat
                or self.granularity != "token"
                or self.quantity == KL
            ):
                raise StreetlampError(
                    "--contrast-token, --contrast-prompt, --chat, --granularity and kl_divergence are for causal LMs"
                )
            from ...methods.registry import REGISTRY
            from ...models.kinds import ENCODER_DECODER
            from ...models.seq2seq import refusal

            for name in self.methods:
                if ENCODER_DECODER not in REGISTRY[name].kinds:
                    raise StreetlampError(refusal(name, adapter.name))
        elif self.contrast_token is not None:
            ids = adapter.tokenizer(self.contrast_token, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise StreetlampError(
                    f"--contrast-token {self.contrast_token!r} is {len(ids)} tokens for this tokenizer; give one token"
                )


EXPLAIN = Command(
    "explain",
    "explain one text: attention of every layer and head, methods, figures",
    ExplainSettings,
    lazy(__name__ + ".run", "run_explain"),
    shared=Shared(out="output folder (default runs/explain-<time>)", force=True, features=True),
    views=("explain", "explain_long"),
)
ATTENTION_ROW = Command(
    "attention-row",
    "print one attention row (or column) of a long-context explain run",
    RowSettings,
    lazy(__name__ + ".long", "run_row"),
    needs_model=False,
    writes=None,
    shared=NONE,
)
EXPLAIN_GENERATION = Command(
    "explain-generation",
    "causal LM or encoder-decoder (T5, BART): attribution of every generated (or given) token over the "
    "prompt (source) and earlier tokens, with any method (default integrated gradients, one shared path)",
    GenerationSettings,
    lazy(__name__ + ".generation", "run_generation"),
    shared=Shared(model="smollm2-135m", out="output folder (default runs/generation-<time>)", force=True),
    out_kind="generation",
    views=("explain-generation",),
    one_stack=False,
)
