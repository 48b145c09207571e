"""AttnLRP relevance from the authors' package ``lxt`` (2.1), on a plain Hugging Face model.

lxt 2.1 does not run unmodified on transformers 5, for two reasons:

1. ``import lxt.efficient`` imports every model patch, including its private copy of
   transformers 4's ``modeling_bert`` (``from transformers.modeling_attn_mask_utils import ...``:
   that module is gone in transformers 5, so the import fails) and ``torchvision``;
2. its ``patch_attention`` replaces ``modeling_*.ALL_ATTENTION_FUNCTIONS`` with a plain ``dict``,
   but transformers 5 calls ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` on it.

So this helper loads lxt's rule modules without the package ``__init__`` (an empty package
module with the real ``__path__``), applies lxt's own GPT-2 / Llama patch maps except the
attention entry, and for attention does the first half of lxt's ``patch_attention`` only
(``modeling_*.eager_attention_forward = lxt.wrap_attention_forward(...)``, model on ``eager``).
Every rule is lxt's code. Class patches are global, so they are undone in ``finally``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import torch


def _lxt_modules(family: str) -> tuple[types.ModuleType, types.ModuleType]:
    spec = importlib.util.find_spec("lxt")
    if spec is None or spec.origin is None:
        raise ImportError("lxt is not installed")
    root = Path(spec.origin).parent
    for name, sub in (("lxt.efficient", "efficient"), ("lxt.efficient.models", "efficient/models")):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(root / sub)]  # type: ignore[attr-defined]
            sys.modules[name] = pkg
    return importlib.import_module("lxt.efficient.patches"), importlib.import_module(f"lxt.efficient.models.{family}")


def _rules(family: str) -> tuple[types.ModuleType, dict]:
    """lxt's patch functions and the classes they patch. Mistral (no lxt module: its decoder is Llama's with a
    sliding window) gets lxt's Llama rules, each applied to the Mistral class of the same role."""
    if family != "mistral":
        patches, fam = _lxt_modules(family)
        return patches, dict(fam.attnLRP)
    from transformers.models.mistral import modeling_mistral

    patches, llama = _lxt_modules("llama")
    rules: dict = {}
    for target, patch in llama.attnLRP.items():
        if isinstance(target, types.ModuleType):
            rules[modeling_mistral] = patch
        elif target.__name__.startswith("Llama"):
            rules[getattr(modeling_mistral, "Mistral" + target.__name__.removeprefix("Llama"))] = patch
        else:
            rules[target] = patch
    return patches, rules


def lxt_relevance(model: torch.nn.Module, family: str, ids: torch.Tensor, index: int) -> tuple[torch.Tensor, float]:
    """lxt's AttnLRP relevance ``[pos]`` of logit ``index`` at the last position, and that logit."""
    patches, rules = _rules(family)
    saved: list[tuple[object, str, object]] = []
    try:
        for target, patch in rules.items():
            if isinstance(target, types.ModuleType):  # the attention entry: see the module docstring
                saved.append((target, "eager_attention_forward", target.eager_attention_forward))
                target.eager_attention_forward = patches.wrap_attention_forward(target.eager_attention_forward)
                continue
            saved.append((target, "forward", target.__dict__.get("forward")))
            assert patch(target), f"lxt could not patch {target}"
        model.set_attn_implementation("eager")
        emb = model.get_input_embeddings()(ids[None]).detach().requires_grad_(True)
        logits = model(inputs_embeds=emb).logits[0, -1]
        logits[index].backward()
        assert emb.grad is not None
        return (emb * emb.grad).sum(-1)[0].detach(), float(logits[index].detach())
    finally:
        for owner, attr, old in reversed(saved):
            if old is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
