"""Counterfactual attention (Jain & Wallace, NAACL 2019, "Attention is not Explanation") and the
uniform-attention baseline (Wiegreffe & Pinter, EMNLP 2019, "Attention is not not Explanation").

All act on the attention row of the explained position (query = [CLS] for BERT-style classifiers,
the last token otherwise) in every head of one layer -- the analogue of the papers' single
attention distribution read by the classifier -- for each layer in ``layers``.

* Permutation: the row is permuted over the real keys (the same permutation for every head),
  ``n_permutations`` times; ``perm_tvd_median`` is the median total variation distance
  ``0.5 * sum |y' - y|`` of the output distribution (the paper's median output difference).
* Adversarial: maximise the mean JS divergence (bits) between the new and original rows over the
  heads subject to ``TVD(y', y) <= eps`` (eps = 0.01). The paper solves a constrained problem per
  example; here Adam optimises per-head row logits ``z`` (initialised at ``log A`` plus seeded
  N(0, 1) noise, since JS has zero gradient at ``A`` itself) on ``-JS + lam * relu(TVD - eps)`` for
  ``steps`` steps, batched over examples, keeping for each example the best iterate that satisfies
  the constraint (``adv_js``; the original row, JS = 0, is always feasible). ``adv_exists`` is
  ``adv_js >= js_threshold`` (default 0.5 bits, i.e. at least half way to disjoint supports).
* Uniform baseline: every attention row of every layer replaced by the uniform distribution over
  the keys the mask allows; ``uniform_tvd``, ``uniform_flip`` (argmax changed) and accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.adapter import Inputs, ModelAdapter, at_least_float32
from ..stats import js_divergence_t, total_variation_t
from .common import output_map, output_probs
from .frozen import FrozenRecords, frozen_below
from .prefix import PrefixRunner

# maps output distributions [rows, n_outputs] to the distributions compared (e.g. renormalised over a
# causal LM's label tokens); None compares the whole output distribution
Project = Callable[[torch.Tensor], torch.Tensor] | None


def _identity(p: torch.Tensor) -> torch.Tensor:
    return p


def _row_edit(pos: torch.Tensor, new_rows: torch.Tensor):
    """Replace row ``pos[b]`` of every head by ``new_rows[b, h, :]`` (differentiable)."""

    def fn(p: torch.Tensor) -> torch.Tensor:
        w = p.shape[-1]
        onehot = torch.nn.functional.one_hot(pos.to(p.device), p.shape[-2]).to(p.dtype)[:, None, :, None]
        return p * (1 - onehot) + onehot * new_rows[..., :w].to(p.device, p.dtype)[:, :, None, :]

    return fn


@dataclass
class Counterfactual:
    eps: float = 0.01
    n_permutations: int = 10
    steps: int = 40
    lr: float = 0.2
    lam: float = 50.0
    js_threshold: float = 0.5

    def permutations(
        self,
        adapter: ModelAdapter,
        inp: Inputs,
        probs: np.ndarray,
        layer: int,
        seeds: Sequence[int],
        budget: int | None,
        project: Project = None,
        att: torch.Tensor | None = None,
        prefix: Sequence[PrefixRunner] | None = None,
        records: FrozenRecords | None = None,
    ) -> list[float]:
        """Median output TVD over the permutations, per text. ``probs`` are the (projected)
        distributions compared; ``att`` the layer's recorded pattern when the caller has it; ``prefix``
        (causal LMs): each text's cache, so a permuted row runs the last position only; ``records``: the
        lower layers' outputs shared with other metrics of the same texts (frozen.py)."""
        rows = inp.rows()
        proj = project or _identity
        if att is None:
            with torch.no_grad():
                site = f"layers.{layer}.attn.pattern"
                att = adapter.forward(inp, record=[site]).cache[site]
        plan, new_rows, where = [], [], []
        for b, n in enumerate(inp.lengths):
            pos = adapter.explained_position(n)
            rng = np.random.default_rng([seeds[b], layer])
            row = att[b, :, pos, :n].cpu()
            for _ in range(self.n_permutations):
                perm = torch.as_tensor(rng.permutation(n))
                plan.append(rows[b])
                new_rows.append((pos, row[:, perm]))
                where.append(b)

        def build(group: list[int], width: int) -> dict:
            pos = torch.tensor([new_rows[i][0] for i in group])
            nr = torch.zeros(len(group), adapter.n_heads, width, dtype=att.dtype)
            for r, i in enumerate(group):
                nr[r, :, : new_rows[i][1].shape[1]] = new_rows[i][1]
            return {f"layers.{layer}.attn.pattern": _row_edit(pos, nr)}

        ref = torch.as_tensor(np.asarray(probs, np.float64)[np.array(where)])
        tvd = lambda group, p: total_variation_t(proj(p), ref[group].to(p.device))  # noqa: E731
        if prefix is None:  # each text's rows: its layers below ``layer`` run once (frozen.py)
            d = np.zeros(len(plan))
            for b in range(len(rows)):
                own = np.flatnonzero(np.array(where) == b)

                def tvd_b(g: list[int], p: torch.Tensor, own: np.ndarray = own) -> torch.Tensor:
                    return tvd(own[g].tolist(), p)

                def build_b(g: list[int], w: int, own: np.ndarray = own) -> dict:
                    return build(own[g].tolist(), w)

                with frozen_below(adapter, Inputs.from_ids(adapter, [rows[b]], strings=False), layer, records):
                    d[own] = output_map(adapter, [plan[i] for i in own], budget, tvd_b, 1, build_b)[:, 0]
        else:  # the edited row is the last query: positions before it are the cached text's
            d = np.zeros(len(plan))
            for b, n in enumerate(inp.lengths):
                mine = [i for i, w in enumerate(where) if w == b]

                def last_row(group: list[int], width: int, mine: list[int] = mine) -> dict:
                    nr = torch.stack([new_rows[mine[r]][1] for r in group]).to(att.dtype)
                    return {f"layers.{layer}.attn.pattern": _row_edit(torch.zeros(len(group), dtype=torch.long), nr)}

                run = prefix[b]
                d[mine] = run.map(
                    [n - 1] * len(mine),
                    [[rows[b][-1]]] * len(mine),
                    lambda g, p: tvd([mine[r] for r in g], p),
                    1,
                    last_row,
                )[:, 0]
        return [float(np.median(d[np.array(where) == b])) for b in range(len(rows))]

    def adversarial(
        self,
        adapter: ModelAdapter,
        inp: Inputs,
        probs: np.ndarray,
        layer: int,
        seeds: Sequence[int],
        project: Project = None,
        att: torch.Tensor | None = None,
        prefix: Sequence[PrefixRunner] | None = None,
        records: FrozenRecords | None = None,
    ) -> tuple[list[float], list[float]]:
        """Best feasible JS (bits) and its output TVD per text, for one layer; one padded batch, or with
        ``prefix`` (causal LMs) each text's last position alone after its cache (Adam acts per element,
        so the iterates are those of the joint batch). ``records`` as for :meth:`permutations`."""
        site = f"layers.{layer}.attn.pattern"
        dev = adapter.device
        proj = project or _identity
        if att is None:
            with torch.no_grad():
                att = adapter.forward(inp, record=[site]).cache[site]
        att = att.detach().float()
        lengths = inp.lengths
        pos = torch.tensor([adapter.explained_position(n) for n in lengths])
        width = att.shape[-1]
        real = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(dev)  # [B, W]
        orig = att[torch.arange(len(lengths)), :, pos.to(att.device)]  # [B, H, W]
        noise = torch.stack(
            [
                torch.as_tensor(
                    np.random.default_rng([s, layer, 7]).standard_normal((adapter.n_heads, width)), dtype=torch.float32
                )
                for s in seeds
            ]
        ).to(dev)
        z0 = (torch.log(orig + 1e-12) + noise).detach()
        y0 = torch.as_tensor(probs, dtype=torch.float32, device=dev)
        if prefix is not None:
            js_l, tvd_l = [], []
            for b, n in enumerate(lengths):
                run = prefix[b]

                def last(e: dict, run: PrefixRunner = run, n: int = n) -> torch.Tensor:
                    return run.logits(n - 1, [[run.ids[-1]]], e, grad=True)

                one = torch.zeros(1, dtype=torch.long)
                js_b, tvd_b = self._search(
                    z0[b : b + 1, :, :n], orig[b : b + 1, :, :n], y0[b : b + 1], last, site, one, proj
                )
                js_l.append(float(js_b[0]))
                tvd_l.append(float(tvd_b[0]))
            return js_l, tvd_l
        with frozen_below(adapter, inp, layer, records):  # the edit is at ``layer``: the layers below run once
            js, tvd = self._search(
                z0, orig, y0, lambda e: adapter.forward(inp, edit=e, grad=True).logits, site, pos, proj, real
            )
        return js.tolist(), tvd.tolist()

    def _search(
        self,
        z0: torch.Tensor,
        orig: torch.Tensor,
        y0: torch.Tensor,
        run: Callable[[dict], torch.Tensor],
        site: str,
        pos: torch.Tensor,
        proj: Callable[[torch.Tensor], torch.Tensor],
        real: torch.Tensor | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Adam on the row logits ``z`` ``[B, H, W]``; ``run(edit)`` gives the edited logits."""
        z = z0.clone().requires_grad_(True)
        opt = torch.optim.Adam([z], lr=self.lr)
        best_js = np.zeros(z.shape[0])
        best_tvd = np.zeros(z.shape[0])
        for step in range(self.steps + 1):
            zz = z if real is None else z.masked_fill(~real[:, None, :], float("-inf"))
            new = torch.softmax(zz, -1)
            with torch.enable_grad():
                logits = run({site: _row_edit(pos, new)})
            y = proj(torch.softmax(at_least_float32(logits), -1))
            d = total_variation_t(y, y0)
            js = js_divergence_t(new, orig).mean(-1)
            js_np, d_np = js.detach().cpu().numpy(), d.detach().cpu().numpy()
            ok = (d_np <= self.eps) & (js_np > best_js)
            best_js[ok], best_tvd[ok] = js_np[ok], d_np[ok]
            if step == self.steps:  # the last iterate is scored, not stepped from: no backward
                break
            loss = (-js + self.lam * torch.relu(d - self.eps)).sum()
            opt.zero_grad()
            (z.grad,) = torch.autograd.grad(loss, [z])  # the model's parameters get no .grad
            opt.step()
        return best_js, best_tvd

    def uniform(
        self, adapter: ModelAdapter, inp: Inputs, budget: int | None, layers: Sequence[int] | None = None
    ) -> np.ndarray:
        """Output distributions with uniform attention (over allowed keys) in every row of ``layers``
        (default: every layer)."""

        def build(group: list[int], width: int) -> dict:
            def fn(p: torch.Tensor) -> torch.Tensor:
                from ..models.trace import active_session

                s = active_session()
                allowed = s.cache["allowed"] if s is not None and "allowed" in s.cache else p > 0
                u = allowed.to(p.dtype)[:, None, :, :].expand_as(p)
                return u / u.sum(-1, keepdim=True).clamp_min(1)

            return {f"layers.{l}.attn.pattern": fn for l in (range(adapter.n_layers) if layers is None else layers)}

        return output_probs(adapter, inp.rows(), budget, build)
