"""A head's usefulness on a narrow task (issue 25 item 7's third question), beside the atlas' corpus effect.

A task is pairs of a clean and a corrupted prompt with an answer and a wrong answer
(:mod:`.circuits.tasks`: ``ioi``, ``greater-than``, ``induction``, or a CSV). Its metric is the logit
difference ``LD = logit(answer) - logit(wrong)`` at the explained position (the circuit literature's).
Every head (l, h) is ablated on every clean prompt, at ``layers.{l}.attn.z`` at every position as the
atlas ablates it, two ways:

* ``ablate``: the atlas' own replacement (its corpus mean, or zero): the same intervention whose
  corpus-wide effect the atlas measures, only the prompts differ;
* ``patch``: the head's activation on the pair's corrupted prompt (activation patching: the node
  effect of circuit discovery; needs corrupted prompts of the clean prompts' token length).

The head's task effect is the mean over prompts of ``LD(ablated) - LD(clean)`` (negative: the head
helps the task). Each row is one forward pass started at layer ``l`` (:mod:`.atlas_midstack`), the LM
head only at the explained position; rows of one layer batched by the token budget.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batching import rows_per_batch
from ..models.adapter import ModelAdapter
from . import atlas_effects as E
from .atlas_midstack import layer_output_arity, start_at
from .circuits.tasks import PairSet

WAYS = ("ablate", "patch")


def task_effects(
    adapter: ModelAdapter,
    pairs: PairSet,
    ablation: str,
    mean: np.ndarray | None,
    ways: tuple[str, ...] = WAYS,
    batch_size: int | None = None,
) -> dict[str, np.ndarray]:
    """``{"ld_clean": [n], way: [n, L, H]}``: the clean logit difference of each prompt and, per way
    (module docstring), each head's ablated logit difference minus the clean one."""
    L, H, n = adapter.n_layers, adapter.n_heads, len(pairs)
    inp = pairs.clean
    clean = E.clean_run(adapter, inp)
    ans, wrong = pairs.answer, pairs.wrong

    def ld(logits: torch.Tensor, rows: list[int]) -> np.ndarray:
        r = torch.arange(len(rows), device=logits.device)
        a, w = ans[rows].to(logits.device), wrong[rows].to(logits.device)
        return (logits.double()[r, a] - logits.double()[r, w]).cpu().numpy()

    with torch.no_grad():
        out: dict[str, np.ndarray] = {"ld_clean": ld(adapter.forward(inp).logits, list(range(n)))}
    arity = layer_output_arity(adapter, inp)
    corrupt_z = E.clean_run(adapter, pairs.corrupt).z if "patch" in ways else {}
    m = torch.from_numpy(mean) if mean is not None else None
    for way in ways:
        res = np.zeros((n, L, H))
        for l in range(L):
            if way == "patch":
                repl = corrupt_z[l]
            else:
                repl = E.replacement(ablation, clean.z[l], None if m is None else m[l])
            jobs = sorted(((b, h) for b in range(n) for h in range(H)), key=lambda bh: inp.lengths[bh[0]])
            step = rows_per_batch(int(inp.input_ids.shape[1]), batch_size, adapter.device)
            for s in range(0, len(jobs), step):
                part = jobs[s : s + step]
                rows = [b for b, _ in part]
                sub = inp.select(rows)
                w = int(sub.input_ids.shape[1])
                edit = E.head_edit(repl[rows, :w], [h for _, h in part])
                with torch.no_grad(), start_at(adapter, l, clean.resid[l][rows, :w], arity):
                    d = ld(adapter.forward(sub, edit={f"layers.{l}.attn.z": edit}).logits, rows)
                for k, (b, h) in enumerate(part):
                    res[b, l, h] = d[k] - out["ld_clean"][b]
        out[way] = res
    return out
