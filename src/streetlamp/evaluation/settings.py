"""What an ``evaluate`` and a ``replicate`` run measure, declared once: :class:`EvalSettings` is the part of the command's
settings (``commands/evaluate``: :class:`~streetlamp.commands.evaluate.EvaluateSettings` adds the data,
its selection and where the run goes) that changes a number. It is what the run store keeps and compares
on resume (:meth:`EvalSettings.to_dict`, in the layout stores have always had: the adversarial search
under ``counterfactual``, F-Fidelity under ``ffidelity``, options added later left out at their old
behaviour) and what :func:`~streetlamp.evaluation.pipeline.evaluate_chunk` reads, locally or on a Ray actor.
:class:`ReplicateSettings` is the same for ``replicate`` (:func:`~streetlamp.evaluation.replicate.replicate_chunk`).

This module imports no torch (``streetlamp --help`` reads the fields).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import StreetlampError
from ..settings import Settings, layers_of, option
from ..specs import layer_spec, parse_method_params

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter


def parse_methods(spec: str | list[str]) -> list[str]:
    """``--methods``: comma-separated registered names or ``all`` (the registry is read at run time)."""
    from ..methods.registry import parse_methods as parse

    return parse(spec if isinstance(spec, str) else ",".join(spec))


@dataclass
class EvalSettings(Settings):
    methods: list[str] = option(
        default_factory=lambda: ["attention"], parse=parse_methods, help="comma-separated method names, or 'all'"
    )
    method_params: dict[str, dict[str, Any]] = option(
        default_factory=dict,
        parse=parse_method_params,
        help='JSON, e.g. {"integrated_gradients": {"steps": 16}}, or integrated_gradients.steps=16',
    )
    truncate: bool = option(False, help="cut texts longer than the model's positions (default: skip)")
    replacement: str = option("delete", choices=("delete", "mask"), help="how erasure removes tokens")
    flip_layers: str = option("last", help="decision-flip layers: last, all or a layer number")
    cf_layers: str = option("last", help="counterfactual-attention layers: last, all or a number")
    eps: float = option(0.01, gt=0, help="adversarial attention: max output change (TVD)")
    permutations: int = option(10, ge=1)
    adv_steps: int = option(40, ge=1)
    answer_tokens: int = option(
        0,
        ge=0,
        le=64,
        help="causal LM: also score every token of the greedy N-token answer (forced decoding; docs/decoder.md)",
    )
    soft: bool = option(True, flag="--no-soft", help="skip soft erasure (Soft-NC/NS, pi-Soft-NC/NS: on by default)")
    soft_samples: int = option(10, ge=1, help="soft erasure: Bernoulli masks per example, method and variant")
    soft_pi: float = option(0.5, gt=0, le=1, help="pi-Soft-NC/NS: expected retained fraction of the tokens, in (0, 1]")
    ffidelity_train: str = option(
        "", help="F-Fidelity: fine-tune a copy with random masking on this data (evaluated texts left out)"
    )
    ffidelity_beta: float = option(
        0.5, gt=0, le=1, help="F-Fidelity: largest masked fraction, in training and measuring"
    )
    ffidelity_epochs: int = option(2, ge=1, help="F-Fidelity: fine-tuning epochs")
    ffidelity_lr: float = option(3e-5, gt=0, help="F-Fidelity: AdamW learning rate")
    ffidelity_samples: int = option(4, ge=1, help="F-Fidelity: random subsets per removal ratio")
    ffidelity_max_train: int = option(1000, ge=1, help="F-Fidelity: at most N training examples (drawn with --seed)")
    randomisation: str = option(
        "", help="model-randomisation sanity check: cascading, independent or both (explains again per stage)"
    )
    randomisation_target: str = option(
        "prediction",
        choices=("prediction", "trained"),
        help="what a randomised copy explains: prediction (its own) or trained (the trained model's prediction)",
    )
    smooth_mprt: int = option(
        0, ge=0, help="Smooth MPRT: mean of N explanations (N-1 on noisy embeddings) before comparing; 0 = off"
    )
    smooth_mprt_noise: float = option(0.1, gt=0, help="Smooth MPRT: noise std as a fraction of the embeddings' range")
    smooth_mprt_stages: str = option("all", help="Smooth MPRT: all, or stages (head,top,layer.N,embed)")
    efficient_mprt: bool = option(False, help="Efficient MPRT: entropy rise, trained vs fully randomised model")
    efficient_mprt_bins: int = option(10, ge=2, help="Efficient MPRT: histogram bins of the entropy")

    # -- the stored layout ---------------------------------------------------------------------------------
    @property
    def counterfactual(self) -> dict[str, Any]:
        """The adversarial search's settings (:class:`~streetlamp.evaluation.counterfactual.Counterfactual`)."""
        from .counterfactual import Counterfactual

        return dataclasses.asdict(Counterfactual(eps=self.eps, n_permutations=self.permutations, steps=self.adv_steps))

    @property
    def ffidelity(self) -> dict[str, Any]:
        """F-Fidelity's settings (:class:`~streetlamp.evaluation.ffidelity.FFidelity`); {} when off."""
        if not self.ffidelity_train:
            return {}
        from .ffidelity import FFidelity

        return dataclasses.asdict(
            FFidelity(
                train=self.ffidelity_train,
                beta=self.ffidelity_beta,
                epochs=self.ffidelity_epochs,
                lr=self.ffidelity_lr,
                samples=self.ffidelity_samples,
                max_train=self.ffidelity_max_train,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """What the run store keeps and compares on resume: these fields alone (not a subclass's), the
        adversarial search and F-Fidelity nested as they always were, options added after a store was made
        left out at the value that reproduces it (such a store resumes)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(EvalSettings)}
        for k in ("eps", "permutations", "adv_steps", *(k for k in d if k.startswith("ffidelity_"))):
            del d[k]
        d["method_params"] = {k: dict(v) for k, v in self.method_params.items()}
        d["methods"] = list(self.methods)
        d["counterfactual"] = self.counterfactual
        if not self.answer_tokens:  # stores written before the option compare equal on resume
            del d["answer_tokens"]
        if not self.soft:  # likewise for soft erasure, off (--no-soft)
            for k in ("soft", "soft_samples", "soft_pi"):
                del d[k]
        if not self.randomisation:
            del d["randomisation"]
        if self.randomisation_target == "prediction":  # the default: stores made before the option resume
            del d["randomisation_target"]
        if not self.smooth_mprt:  # Smooth / Efficient MPRT off: stores made before them resume
            for k in ("smooth_mprt", "smooth_mprt_noise", "smooth_mprt_stages"):
                del d[k]
        if not self.efficient_mprt:
            for k in ("efficient_mprt", "efficient_mprt_bins"):
                del d[k]
        if self.ffidelity:
            d["ffidelity"] = self.ffidelity
        return d

    # -- checks --------------------------------------------------------------------------------------------
    def check(self) -> None:
        """The measured part's checks that need no model (the methods' parameters against the registry are
        the command's: :meth:`~streetlamp.commands.evaluate.EvaluateSettings.check`)."""
        super().check()
        layer_spec(self.flip_layers, "--flip-layers")
        layer_spec(self.cf_layers, "--cf-layers")
        if self.randomisation or self.efficient_mprt or self.smooth_mprt or self.randomisation_target != "prediction":
            from .randomisation import check_settings

            check_settings(self)

    def validate(self, adapter: ModelAdapter) -> None:
        """Against the model, before the run store exists."""
        from ..methods.registry import get_method

        if adapter.modality == "image":
            raise StreetlampError(
                f"evaluate scores text datasets (erasure by token, rationales); {adapter.name} is an image model: "
                "explain, heads and serve take an image"
            )
        for name in self.methods:
            get_method(name, **self.method_params.get(name, {})).check(adapter)
        if self.answer_tokens and not adapter.kind.causal:
            raise StreetlampError(f"--answer-tokens needs a causal LM; {adapter.name} is a {adapter.kind}")
        if self.randomisation or self.efficient_mprt or self.smooth_mprt or self.randomisation_target != "prediction":
            from .randomisation import check_settings

            check_settings(self, adapter)
        if self.ffidelity_train:
            from .ffidelity import check_adapter

            check_adapter(adapter)
        layers_of(adapter, self.flip_layers, "--flip-layers")
        layers_of(adapter, self.cf_layers, "--cf-layers")


@dataclass
class ReplicateSettings(Settings):
    """What a ``replicate`` run measures: the record its run store keeps and compares on resume
    (:meth:`to_dict`); ``commands/replicate`` adds the data, its size and the chunks."""

    permutations: int = option(3, ge=1, help="random permutations per layer")
    adv_steps: int = option(8, ge=0, help="adversarial attention: optimiser steps")
    adv_layers: int = option(3, ge=0, help="adversarial attention at K evenly spaced layers")
    eps: float = option(0.01, gt=0, help="adversarial attention: max output change (TVD)")
    head_examples: int = option(0, ge=-1, help="per dataset, the first K examples also get per-head zeroing (-1: all)")
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

    def to_dict(self) -> dict[str, Any]:
        """These fields alone (not a subclass's): the stored record."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(ReplicateSettings)}

    def counterfactual(self) -> Any:
        from .counterfactual import Counterfactual

        return Counterfactual(eps=self.eps, n_permutations=self.permutations, steps=self.adv_steps)

    def validate(self, adapter: ModelAdapter) -> None:
        intervention_layers(adapter.n_layers, self.layers)


def intervention_layers(n_layers: int, spec: str) -> list[int]:
    """``all``; ``every:K`` = layers 0, K, 2K, ... and the last; or a comma list of layer numbers."""
    spec = spec.strip()
    if spec == "all":
        return list(range(n_layers))
    try:
        if spec.startswith("every:"):
            k = int(spec[6:])
            if k < 1:
                raise ValueError
            return sorted(set(range(0, n_layers, k)) | {n_layers - 1})
        out = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise StreetlampError(
            f"--layers must be all, every:K (K >= 1) or a comma list of layers (got {spec!r})"
        ) from None
    if not out or out[0] < 0 or out[-1] >= n_layers:
        raise StreetlampError(f"--layers {spec!r}: the model has layers 0..{n_layers - 1}")
    return out
