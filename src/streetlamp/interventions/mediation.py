"""Causal mediation analysis of gender bias (Vig et al., NeurIPS 2020, "Investigating Gender Bias
in Language Models Using Causal Mediation Analysis").

For a prompt ``u`` ("The nurse said that") with a stereotypical and an anti-stereotypical
continuation (" she" / " he"), ``y(u) = p(anti | u) / p(stereo | u)``. The *set-gender*
intervention replaces the profession by an anti-stereotypical gendered word ("The man said
that"); ``null`` leaves the prompt as is.

* total effect ``TE = y(set) / y(null) - 1``;
* natural indirect effect of component z: ``NIE = y(null, z <- z(set)) / y(null) - 1``;
* natural direct effect: ``NDE = y(set, z <- z(null)) / y(null) - 1``.

Effects are averaged over prompts (Vig et al. average the ratios over templates and professions).
Components: each head (``attn.pattern`` by default: Vig et al. intervene on the *attention weights*
of a head, keeping its values; ``attn.z`` replaces the whole head output) and each layer
(``attn.out`` and ``mlp.out``, all positions). Both prompts must have the same token length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.adapter import ModelAdapter, at_least_float32
from . import engine
from .engine import Intervention

# Vig et al. 2020 templates (Appendix, Table 6) -- the 17 templates.
TEMPLATES = (
    "The {} said that",
    "The {} yelled that",
    "The {} whispered that",
    "The {} wanted that",
    "The {} desired that",
    "The {} wished that",
    "The {} ate because",
    "The {} ran because",
    "The {} drove because",
    "The {} slept because",
    "The {} cried because",
    "The {} laughed because",
    "The {} went home because",
    "The {} stayed up because",
    "The {} was fired because",
    "The {} was promoted because",
    "The {} yelled because",
)
# Professions with a clear occupational gender stereotype (female-, male-stereotyped); Vig et al.
# use Bolukbasi et al.'s list with crowd-sourced scores, we use a small hand-picked subset.
FEMALE = ("nurse", "secretary", "housekeeper", "receptionist", "librarian", "hairdresser", "nanny", "dancer")
MALE = ("mechanic", "carpenter", "engineer", "surgeon", "pilot", "plumber", "firefighter", "farmer")


@dataclass(frozen=True)
class Prompt:
    null: str  # "The nurse said that"
    set: str  # "The man said that"
    stereo: str  # " she"
    anti: str  # " he"


def default_prompts(adapter: ModelAdapter, n: int | None = None) -> list[Prompt]:
    """Template x profession prompts whose null and set versions have equal token length."""
    out = []
    for t in TEMPLATES:
        for prof in FEMALE + MALE:
            fem = prof in FEMALE
            p = Prompt(
                t.format(prof), t.format("man" if fem else "woman"), " she" if fem else " he", " he" if fem else " she"
            )
            a, b = adapter.encode([p.null, p.set]).lengths
            if a == b:
                out.append(p)
    if not out:
        raise StreetlampError(
            "no template/profession prompt keeps its token length under the set-gender intervention for this tokenizer"
        )
    # a fixed shuffle, so a small n still mixes templates and female-/male-stereotyped professions
    order = np.random.default_rng(0).permutation(len(out))
    out = [out[i] for i in order]
    return out[:n] if n else out


def _y(adapter: ModelAdapter, logits: torch.Tensor, stereo: int, anti: int) -> torch.Tensor:
    p = torch.softmax(at_least_float32(logits), -1)
    return p[:, anti] / p[:, stereo]


def mediation(
    adapter: ModelAdapter,
    prompts: Sequence[Prompt],
    head_site: str = "attn.pattern",
    progress: bool = False,
    batch_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Mean effects over prompts.

    Returns ``te`` scalar array ``[]``, ``head_nie``/``head_nde`` ``[layer, head]``,
    ``layer_nie``/``layer_nde`` ``[component(attn.out, mlp.out), layer]``, ``y_null``/``y_set`` ``[prompt]``.
    """
    if head_site not in ("attn.pattern", "attn.z"):
        raise StreetlampError("head component must be attn.pattern or attn.z")
    if not prompts:
        raise StreetlampError("no prompts")
    L, H = adapter.n_layers, adapter.n_heads
    head_nie = np.zeros((len(prompts), L, H))
    head_nde = np.zeros_like(head_nie)
    layer_nie = np.zeros((len(prompts), 2, L))
    layer_nde = np.zeros_like(layer_nie)
    te = np.zeros(len(prompts))
    y_null, y_set = np.zeros(len(prompts)), np.zeros(len(prompts))
    hs = [f"layers.{l}.{head_site}" for l in range(L)]
    ls = [f"layers.{l}.{k}" for k in ("attn.out", "mlp.out") for l in range(L)]
    it = list(enumerate(prompts))
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="mediation", leave=False)
    for i, pr in it:
        null, sett = adapter.encode(pr.null), adapter.encode(pr.set)
        if null.lengths[0] != sett.lengths[0]:
            raise StreetlampError(
                f"{pr.null!r} and {pr.set!r} differ in token length; mediation swaps activations position by position"
            )
        stereo, anti = adapter.token_id(pr.stereo), adapter.token_id(pr.anti)
        with torch.no_grad():
            fn = adapter.forward(null, record=hs + ls)
            fs = adapter.forward(sett, record=hs + ls)
            yn = _y(adapter, fn.logits, stereo, anti)[0]
            ys = _y(adapter, fs.logits, stereo, anti)[0]
            y_null[i], y_set[i] = float(yn), float(ys)
            te[i] = float(ys / yn - 1)
            for base, src, arr in ((null, fs.cache, head_nie), (sett, fn.cache, head_nde)):
                reps = engine.repeat_inputs(base, H)
                for l in range(L):
                    ivs = [Intervention(hs[l], engine.patch(src[hs[l]]), head=h, rows=[h]) for h in range(H)]
                    arr[i, l] = (
                        (_y(adapter, engine.run_batched(adapter, reps, ivs, batch_size).logits, stereo, anti) / yn - 1)
                        .cpu()
                        .numpy()
                    )
            for base, src, arr in ((null, fs.cache, layer_nie), (sett, fn.cache, layer_nde)):
                reps = engine.repeat_inputs(base, L)
                for c, k in enumerate(("attn.out", "mlp.out")):
                    ivs = [
                        Intervention(f"layers.{l}.{k}", engine.patch(src[f"layers.{l}.{k}"]), rows=[l])
                        for l in range(L)
                    ]
                    arr[i, c] = (
                        (_y(adapter, engine.run_batched(adapter, reps, ivs, batch_size).logits, stereo, anti) / yn - 1)
                        .cpu()
                        .numpy()
                    )
    return {
        "te": np.array(te.mean(), np.float32),
        "te_per_prompt": te.astype(np.float32),
        "head_nie": head_nie.mean(0).astype(np.float32),
        "head_nde": head_nde.mean(0).astype(np.float32),
        "layer_nie": layer_nie.mean(0).astype(np.float32),
        "layer_nde": layer_nde.mean(0).astype(np.float32),
        "y_null": y_null.astype(np.float32),
        "y_set": y_set.astype(np.float32),
    }
