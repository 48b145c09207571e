"""Attribution views: what the model kind, not the method, turns inputs into.

A view is one explained problem: ``k`` explained outputs (rows) over ``n`` input tokens (columns). It
gives the methods everything they attribute over, so each method is written once
(:meth:`~streetlamp.methods.base.Method.attribute_view`):

* ``ids`` ``[n]`` and :meth:`View.embeddings` ``[n, d]``: the columns and the embeddings the gradient
  methods differentiate (site ``embed``; ``encoder.embed`` then ``decoder.embed`` on an encoder-decoder);
* ``allowed`` ``[k, n]``: which columns row ``j`` may see (a prefix of the columns in every view here);
* :meth:`View.scores`: ``F`` of every row over rows of embeddings ``[rows, n, d]`` (the scorer);
* :meth:`View.features` and :meth:`View.perturber`: the removal rule (which columns a row may lose, how a
  removed token leaves the input, ``F`` of every row on perturbed inputs);
* :meth:`View.attention`: the attention patterns whose explained rows the attention method reads.

The views (Inseq's ``DecoderOnlyAttributionModel`` / ``EncoderDecoderAttributionModel`` split):

* :class:`SequenceView`: one text of a classifier or a causal LM, one row (the explained position);
  ``streetlamp explain`` and every prefix of ``explain-generation`` on a causal LM use it;
* :class:`PrefixView`: a causal LM's prompt and continuation, one row per continuation token, all read
  from one pass (the model is causal, so row ``j`` sees the first ``P + j`` tokens): IG's shared path;
* :class:`Seq2SeqView`: an encoder-decoder's source and forced target, columns *source tokens, then
  decoder inputs* (the start token first), row ``j`` reads the source and decoder inputs ``0 .. j``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ..batching import chunks
from ..errors import StreetlampError
from ..models.adapter import Inputs, ModelAdapter, Target, at_least_float32
from .features import feature_groups
from .removal import EncDecRemoval, Removal
from .scorer import Scorer

if TYPE_CHECKING:
    from ..models.seq2seq import Seq2SeqAdapter


def per_target_grads(x: torch.Tensor, f: torch.Tensor, batched: bool = True) -> torch.Tensor:
    """``dF_j/dx`` for every target j of ``f`` ``[rows, k]`` computed from ``x`` ``[rows, ...]``: ``[k, rows, ...]``.

    Rows are independent inputs, so the gradient of ``sum_rows F_j`` holds each row's own gradient.
    ``batched``: one vmapped backward (``is_grads_batched``); else k backward passes, one per target,
    keeping the graph until the last (a lower peak than k at once). Both give the same values
    (tests/methods/test_gradient.py); every view's gradients come from here."""
    per_target = f.sum(0)  # [k]
    k = len(per_target)
    if batched:
        eye = torch.eye(k, dtype=per_target.dtype, device=per_target.device)
        return torch.autograd.grad(per_target, x, eye, is_grads_batched=True)[0]
    return torch.stack([torch.autograd.grad(per_target[j], x, retain_graph=j < k - 1)[0] for j in range(k)])


def ids_inputs(adapter: ModelAdapter, ids: torch.Tensor, rows: int = 1) -> Inputs:
    """An unpadded :class:`Inputs` of ``rows`` copies of the token ids ``ids`` ``[pos]``."""
    return Inputs.from_ids(adapter, [ids.view(-1).cpu()]).repeat(rows)


@dataclass
class AttentionBlock:
    """One attention site family read by the attention method: ``pattern`` ``[layer, head, query, key]``,
    ``queries`` (the query index of each row), ``columns`` (where its keys sit among the view's columns)."""

    site: str  # "" for a one-stack model, else "cross_attn" / "self_attn"
    pattern: np.ndarray
    queries: list[int]
    columns: slice
    key_axis: str = "key"


@dataclass
class Perturbed:
    """``F`` of each row on perturbed copies of a view's input (the removal rule applied)."""

    base: np.ndarray  # [k]: F on the unperturbed input
    index: np.ndarray  # [k]: the explained output of each row
    stats: dict[str, Any] = field(default_factory=dict)

    def __call__(self, absents: Sequence[np.ndarray], rows: list[int] | None = None) -> np.ndarray:
        """``[len(absents), k]`` float64: F of every row with the columns in each bool mask removed (NaN where a
        row cannot be read); ``rows``: only these rows are needed (the others may be NaN)."""
        raise NotImplementedError


class View:
    """Base of the attribution views; see the module docstring."""

    groups: ClassVar[tuple[str, ...]] = ("token",)  # feature groupings the removal rule builds

    adapter: ModelAdapter
    ids: torch.Tensor  # [n] on the CPU
    target: Target
    allowed: np.ndarray  # [k, n] uint8
    batched_grads: bool = True

    @property
    def k(self) -> int:
        return int(self.allowed.shape[0])

    @property
    def n(self) -> int:
        return int(self.allowed.shape[1])

    @property
    def single(self) -> bool:
        """One text, one explained output: the shape ``Method.attribute`` returns as an Explanation."""
        return False

    @property
    def lengths(self) -> list[int]:
        """Columns each row sees (a prefix of the columns)."""
        return [int(r.sum()) for r in self.allowed]

    def index(self) -> torch.Tensor:
        """``[k]`` the explained output of each row (on the device)."""
        raise NotImplementedError

    def embeddings(self) -> torch.Tensor:
        """``[n, d]`` the embeddings of the columns (no graph)."""
        raise NotImplementedError

    def scores(self, emb: torch.Tensor, grad: bool, input_row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, F [rows, k])`` for rows of column embeddings ``emb`` ``[rows, n, d]``; ``x`` is the leaf the
        gradient is taken from when ``grad``. ``input_row``: a row of ``emb`` that is the view's own input
        (:meth:`embeddings`, unchanged); a view whose explained output is still unresolved (the prediction of
        a :class:`SequenceView`) reads it from that row of this pass instead of a forward pass of its own."""
        raise NotImplementedError

    def gradients(self, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``F [k]`` and ``dF_j/de`` ``[k, n, d]`` at the embeddings ``e`` ``[n, d]``."""
        x, f = self.scores(e[None], True)
        return f.detach()[0], per_target_grads(x, f, self.batched_grads)[:, 0]

    def special(self) -> np.ndarray:
        """Bool ``[n]``: the structural special tokens ([CLS], [SEP], BOS, T5's ``</s>``; not [UNK])."""
        return self.adapter.special_mask(self.ids)

    def device(self) -> torch.device:
        return self.adapter.device

    # -- the removal rule ---------------------------------------------------------------------------
    def features(
        self, group: str, include_special: bool, delete: bool, coalitions: bool
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``groups`` ``[k, n]`` (feature id of each column in row j, -1: not a feature of the row) and the
        columns of each feature. ``delete``: absent tokens are deleted (the rule may then protect more);
        ``coalitions``: several features may be absent at once (SHAP, LIME)."""
        raise NotImplementedError

    def perturber(self, token_id: int | None, batch_size: int | None, use_cache: bool, desc: str) -> Perturbed:
        raise NotImplementedError

    def removal_rule(self, used: str, token: str | None, include_special: bool) -> str | None:
        """The removal rule in words for the output (None where it is plain deletion/replacement)."""
        raise NotImplementedError

    def rng(self, seed: int, j: int) -> np.random.Generator:
        """The generator row ``j`` draws its coalitions from."""
        return np.random.default_rng([seed, j])

    # -- attention ----------------------------------------------------------------------------------
    def attention_stack(self) -> tuple[int, int, str]:
        """(layers, heads, what) of the attention the attention method reads, for its range checks."""
        raise NotImplementedError

    def attention(self) -> tuple[list[AttentionBlock], dict[str, tuple[np.ndarray, list[str], str]]]:
        """The attention blocks of the explained rows, and extra arrays (name, axes, meaning)."""
        raise NotImplementedError


# ---- one text of a classifier or a causal LM -------------------------------------------------------------
class SequenceView(View):
    """One text (its real tokens) of a classifier or causal LM, one row: the explained position."""

    groups = ("token", "word")
    batched_grads = False  # one target: the plain backward

    def __init__(self, adapter: ModelAdapter, inputs: Inputs, b: int, target: Target) -> None:
        self.adapter, self.inputs, self.b, self.target = adapter, inputs, b, target
        n = inputs.lengths[b]
        self.ids = inputs.input_ids[b, :n].cpu()
        self.tokens = list(inputs.tokens[b])
        self.allowed = np.ones((1, n), np.uint8)
        self._index: torch.Tensor | None = None

    @property
    def single(self) -> bool:
        return True

    def index(self) -> torch.Tensor:
        if self._index is None:
            one = ids_inputs(self.adapter, self.ids)
            with torch.no_grad():
                logits = self.adapter.forward(one).logits
            self._index = self.adapter.resolve(one, self.target, logits.view(1, -1)).view(1).to(self.device())
        return self._index

    def embeddings(self) -> torch.Tensor:
        with torch.no_grad():
            return self.adapter.embed_tokens(self.ids.to(self.device()))

    def scores(self, emb: torch.Tensor, grad: bool, input_row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        rows = emb.shape[0]
        x = emb.detach().requires_grad_(grad)
        fwd = self.adapter.forward(
            ids_inputs(self.adapter, self.ids, rows), edit={"embed": lambda e: x.to(e.dtype)}, grad=grad
        )
        if self._index is None and input_row is not None:  # the prediction from this pass: no forward of its own
            one = ids_inputs(self.adapter, self.ids)
            row = fwd.logits[input_row].detach().view(1, -1)
            self._index = self.adapter.resolve(one, self.target, row).view(1).to(self.device())
        idx = torch.full((rows,), int(self.index()[0]), dtype=torch.long, device=fwd.logits.device)
        f = self.adapter.score(fwd.logits, idx, self.target)
        return x, (f if grad else f.detach())[:, None]

    def features(
        self, group: str, include_special: bool, delete: bool, coalitions: bool
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        # deletion on a causal LM never removes the explained last position (Removal.keep_last)
        protected = Removal.of(self.adapter, None).protected(self.n) if delete else np.zeros(self.n, dtype=bool)
        groups, feats = feature_groups(self.adapter, self.ids.tolist(), self.tokens, group, include_special, protected)
        return groups[None], feats

    def perturber(self, token_id: int | None, batch_size: int | None, use_cache: bool, desc: str) -> Perturbed:
        return _SequencePerturbed(self, token_id, batch_size, use_cache, desc)

    def removal_rule(self, used: str, token: str | None, include_special: bool) -> str | None:
        return Removal.of(self.adapter, None).describe(self.adapter) if used == "delete" else None

    def rng(self, seed: int, j: int) -> np.random.Generator:
        return np.random.default_rng(seed)  # per text: a text gets the same samples alone or in a batch

    def attention_stack(self) -> tuple[int, int, str]:
        return self.adapter.n_layers, self.adapter.n_heads, "the model"

    def recorded(self, att: torch.Tensor, allowed: torch.Tensor, index: torch.Tensor) -> SequenceView:
        """Use the attention ``[layer, head, query, key]`` and mask ``[query, key]`` of this text from a batch
        recording (:func:`~streetlamp.methods.attention.record_attention`) and its resolved output."""
        self._recording = (att, allowed)
        self._index = index.view(1).to(self.device())
        return self

    def attention(self) -> tuple[list[AttentionBlock], dict[str, tuple[np.ndarray, list[str], str]]]:
        a, n = self.adapter, self.n
        rec = getattr(self, "_recording", None)
        if rec is None:
            one = self.inputs.select([self.b])
            fwd = a.forward(one, record=["layers.*.attn.pattern"])
            att = torch.stack([fwd.cache[f"layers.{l}.attn.pattern"][0] for l in range(a.n_layers)])
            rec = (att, fwd.cache["allowed"][0])
            if self._index is None:
                self._index = a.resolve(one, self.target, fwd.logits).view(1).to(self.device())
        pattern = at_least_float32(rec[0][:, :, :n, :n]).cpu().numpy()
        allowed = rec[1][:n, :n].cpu().numpy().astype(np.uint8)
        pos = a.explained_position(n)
        return [AttentionBlock("", pattern, [pos], slice(0, n))], {
            "allowed": (allowed, ["query", "key"], "1 where the mask lets the query see the key (padding, causal)")
        }


class _SequencePerturbed(Perturbed):
    def __init__(self, view: SequenceView, token_id: int | None, batch_size: int | None, use_cache: bool, desc: str):
        self.view = view
        self.rule = Removal.of(view.adapter, token_id)
        self.scorer = Scorer(view.adapter, view.ids, view.target, batch_size, use_cache=use_cache, desc=desc)
        super().__init__(np.array([self.scorer.base]), self.scorer.index.cpu().numpy().reshape(1))
        view._index = self.scorer.index.view(1).to(view.device())
        self._note()

    def _note(self) -> None:
        s = self.scorer
        self.stats.update(kv_cache_used=s.use_cache, positions_computed=s.n_positions, rows=s.n_rows)

    def __call__(self, absents: Sequence[np.ndarray], rows: list[int] | None = None) -> np.ndarray:
        values = self.scorer([self.rule.row(self.view.ids, a) for a in absents])
        self._note()
        return values[:, None]


# ---- a causal LM's prompt and continuation (IG's shared path) -------------------------------------------
class PrefixView(View):
    """A causal LM's prompt ``[P]`` and continuation ``[k]``: columns prompt + continuation but its last
    token, row ``j`` the continuation token ``j`` read at position ``P - 1 + j`` (it sees ``P + j`` columns)."""

    def __init__(
        self, adapter: ModelAdapter, prompt_ids: torch.Tensor, cont: list[int], target: Target, batched: bool
    ) -> None:
        dev = adapter.device
        self.adapter, self.target, self.batched_grads = adapter, target, batched
        self.P, k = len(prompt_ids), len(cont)
        ids = torch.cat([prompt_ids.to(dev), torch.tensor(cont[:-1], dtype=torch.long, device=dev)])
        self.ids_dev, self.ids = ids, ids.cpu()
        self.pos = torch.arange(self.P - 1, self.P - 1 + k, device=dev)
        self._index = torch.tensor(cont, dtype=torch.long, device=dev)
        self.allowed = np.zeros((k, len(ids)), np.uint8)
        for j in range(k):
            self.allowed[j, : self.P + j] = 1

    def index(self) -> torch.Tensor:
        return self._index

    def embeddings(self) -> torch.Tensor:
        with torch.no_grad():
            return self.adapter.embed_tokens(self.ids_dev)

    def scores(self, emb: torch.Tensor, grad: bool, input_row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = emb.detach().requires_grad_(grad)
        rows, k = x.shape[0], self.k
        logits = self.adapter.logits_at(
            self.ids_dev.expand(rows, -1), self.pos, edit={"embed": lambda v: x.to(v.dtype)}, grad=grad
        )  # [rows, k, vocab]
        f = self.adapter.score(logits.reshape(rows * k, -1), self._index.repeat(rows), self.target).view(rows, k)
        return x, f


# ---- an encoder-decoder's source and target ---------------------------------------------------------------
class Seq2SeqView(View):
    """An encoder-decoder's source ``[S]`` and forced target ``[k]`` (teacher forcing: decoder inputs
    ``[start, y_0 .. y_{k-2}]``, ``y_j`` read after decoder input ``j``). Columns: source, then decoder inputs."""

    adapter: Seq2SeqAdapter

    def __init__(self, adapter: Seq2SeqAdapter, src: torch.Tensor, target_ids: list[int], target: Target) -> None:
        self.adapter = adapter
        self.target = target
        self.src = src.cpu()
        self.dec = self.adapter.decoder_inputs(target_ids)
        self.S, k = len(self.src), len(target_ids)
        self.ids = torch.cat([self.src, self.dec])
        self._index = torch.tensor(target_ids, dtype=torch.long, device=adapter.device)
        self.allowed = np.zeros((k, self.S + k), np.uint8)
        for j in range(k):
            self.allowed[j, : self.S + j + 1] = 1

    def index(self) -> torch.Tensor:
        return self._index

    def embeddings(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([self.adapter.embed(self.src), self.adapter.embed(self.dec, decoder=True)])

    def scores(self, emb: torch.Tensor, grad: bool, input_row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = emb.detach().requires_grad_(grad)
        rows, S, k = x.shape[0], self.S, self.k
        logits = self.adapter.run(src_embeds=x[:, :S], tgt_embeds=x[:, S:], grad=grad).logits  # [rows, k, vocab]
        f = self.adapter.score(logits.reshape(rows * k, -1), self._index.repeat(rows), self.target).view(rows, k)
        return x, f

    def features(
        self, group: str, include_special: bool, delete: bool, coalitions: bool
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        S, k = self.S, self.k
        keep_src = self.adapter.special_mask(self.src) if not include_special else np.zeros(S, dtype=bool)
        member = self.allowed.astype(bool).copy()
        member[:, :S] &= ~keep_src
        member[:, S] = False  # the decoder start token is never removed
        if delete:  # nor, for row j, decoder input j (the one y_j is read after)
            member[np.arange(k), S + np.arange(k)] = False
        used = np.flatnonzero(member.any(0))
        if delete and coalitions and np.all(member[:, :S].any(0)):
            raise StreetlampError("deleting every source token would leave the encoder no input: use a replacement")
        if delete and not coalitions and S == 1 and member[:, 0].any():
            raise StreetlampError("deleting the only source token leaves the encoder no input: use a replacement")
        fid = np.full(S + k, -1, dtype=np.int32)
        fid[used] = np.arange(len(used), dtype=np.int32)
        groups = np.where(member, fid[None], -1).astype(np.int32)
        return groups, [np.array([c]) for c in used]

    def perturber(self, token_id: int | None, batch_size: int | None, use_cache: bool, desc: str) -> Perturbed:
        return _Seq2SeqPerturbed(self, token_id, batch_size)

    def removal_rule(self, used: str, token: str | None, include_special: bool) -> str | None:
        return EncDecRemoval.describe(used, token, include_special)

    def attention_stack(self) -> tuple[int, int, str]:
        return self.adapter.n_decoder_layers, self.adapter.n_decoder_heads, "the decoder"

    def attention(self) -> tuple[list[AttentionBlock], dict[str, tuple[np.ndarray, list[str], str]]]:
        a, S, k = self.adapter, self.S, self.k
        fwd = a.run(self.src.view(1, -1), self.dec.view(1, -1), record=["*.pattern"])
        blocks = []
        extra: dict[str, tuple[np.ndarray, list[str], str]] = {}
        for fam, cols in (("cross_attn", slice(0, S)), ("self_attn", slice(S, S + k))):
            full = torch.stack([fwd.cache[f"decoder.layers.{l}.{fam}.pattern"][0] for l in range(a.n_decoder_layers)])
            pattern = full.double().cpu().numpy()  # [layer, head, k, keys]
            axis = "source" if fam == "cross_attn" else "decoder_input"
            blocks.append(AttentionBlock(fam, pattern, list(range(k)), cols, axis))
            extra[f"{fam}.all"] = (
                pattern,
                ["layer", "head", "generated", axis],
                f"decoder {fam} pattern of every layer and head; row j is decoder input j, the query that "
                "predicts generated token j",
            )
        enc = torch.stack([fwd.cache[f"encoder.layers.{l}.attn.pattern"][0] for l in range(a.n_encoder_layers)])
        extra["encoder"] = (
            enc.double().cpu().numpy(),
            ["layer", "head", "source", "source"],
            "encoder self-attention of every layer and head (independent of the target)",
        )
        return blocks, extra


class _Seq2SeqPerturbed(Perturbed):
    """The encoder-decoder removal rule (:class:`~streetlamp.methods.removal.EncDecRemoval`): a source token
    is replaced or deleted; a decoder input too, later decoder inputs then move left and ``y_j`` is read after
    the last one left. Perturbed inputs of equal shape are batched within the token budget."""

    def __init__(self, view: Seq2SeqView, token_id: int | None, batch_size: int | None) -> None:
        self.view, self.tid, self.batch_size = view, token_id, batch_size
        with torch.no_grad():
            logits = view.adapter.run(view.src.view(1, -1), view.dec.view(1, -1)).logits[0]
            base = view.adapter.score(logits, view.index(), view.target).double().cpu().numpy()
        super().__init__(base, view.index().cpu().numpy(), {"forward_passes": 1})

    def __call__(self, absents: Sequence[np.ndarray], rows: list[int] | None = None) -> np.ndarray:
        v, tid = self.view, self.tid
        S, k = v.S, v.k
        rows = list(range(k)) if rows is None else rows
        dec = v.dec[: max(rows) + 1]
        out = np.full((len(absents), k), np.nan)
        cases: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []
        for absent in absents:
            a_src, a_dec = np.asarray(absent[:S], bool), np.asarray(absent[S : S + len(dec)], bool)
            s_row = EncDecRemoval.remove(v.src, a_src, tid)
            if len(s_row) == 0:
                raise StreetlampError("deleting every source token would leave the encoder no input: use a replacement")
            d_row = EncDecRemoval.remove(dec, a_dec, tid)
            read = [
                -1 if tid is None and a_dec[j] else (j - int(a_dec[:j].sum()) if tid is None else j)
                for j in range(len(dec))
            ]
            cases.append((s_row, d_row, [read[j] if j in rows else -1 for j in range(len(dec))]))
        shapes: dict[tuple[int, int], list[int]] = {}
        for c, (s_row, d_row, _) in enumerate(cases):
            shapes.setdefault((len(s_row), len(d_row)), []).append(c)
        index = v.index()
        for (ls, ld), members in shapes.items():
            for sl in chunks(len(members), ls + ld, self.batch_size, v.device()):
                group = members[sl]
                with torch.no_grad():
                    logits = v.adapter.run(
                        torch.stack([cases[c][0] for c in group]), torch.stack([cases[c][1] for c in group])
                    ).logits
                self.stats["forward_passes"] += 1
                rr, pos, js = [], [], []
                for r, c in enumerate(group):
                    for j, p in enumerate(cases[c][2]):
                        if p >= 0:
                            rr.append(r)
                            pos.append(p)
                            js.append(j)
                f = v.adapter.score(logits[rr, pos], index[js], v.target).double().cpu().numpy()
                for r, j, val in zip(rr, js, f):
                    out[group[r], j] = val
        return out
