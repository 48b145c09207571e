"""Feature dashboards (``streetlamp features``): what a dictionary's latents do on a text and across a corpus.

**Reading a text.** Every text (the user's and each corpus text) is read as features-fit trains: the
document separator (:meth:`~streetlamp.models.adapter.ModelAdapter.empty_context_token`) then the text's
tokens without special tokens, cut to ``seq_len``. Position 0 (the separator, an attention sink with
atypical activations) is in no statistic and no ranking. A feature's activation at a token is its latent
at the spliced site ``layers.{l}.resid_pre.features`` / ``layers.{l}.mlp.features`` (with nothing edited
the spliced model is the model, so this is the dictionary's encoding of the site's input).

**Over the corpus** (:class:`Tracker`, bounded memory: nothing grows with the number of tokens):

- *density*: the fraction of real tokens where the feature's activation is > 0 (counts, exact);
- *top contexts*: the ``top_k`` sequences with the largest per-sequence maximum (ties: lower corpus index
  first), kept by a merge per batch (``O(features × top_k)``);
- *deciles*: over the sequences where the feature fires (per-sequence maximum > 0), the boundaries
  ``q_k = quantile(maxima, k / 10)``, k = 1..9 (numpy's linear interpolation), computed on a uniform
  reservoir sample of ``reservoir`` such sequences (Algorithm R, seeded): exact when at most
  ``reservoir`` sequences fire, an estimate otherwise (recorded). A sequence's decile is
  ``1 + #{k : max ≥ q_k}`` (10 = the top tenth); ``per_decile`` sequences per decile are drawn (seeded)
  from the reservoir's members of that decile.

The shown sequences' activations at every token are then recomputed in a second, small pass (at most
``features × (top_k + 10 per_decile)`` sequences), so nothing per token is kept while streaming.

**Through the unembedding** (:func:`decoder_logits`): the decoder direction ``d = W_dec[f]`` (what the latent
adds to the residual stream per unit of activation) read by the LM head through the final norm taken as a
fixed linear map: ``logits = W_U (γ ⊙ d)`` for RMSNorm, ``W_U (γ ⊙ (d − mean(d)))`` for LayerNorm; the
norm's ``1 / rms`` (``1 / σ``) scale is left out (it multiplies every logit of the direction by the same
positive number, so which tokens are promoted and suppressed, and their order, is unchanged), and so are
the norm's bias, ``b_U`` and any final soft-cap (the same for every feature; monotone). Promoted: the
largest entries; suppressed: the smallest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import StreetlampError
from ..models.features import FeatureSet, feature_site

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

__all__ = [
    "SKIP",
    "DashCorpus",
    "FeatureRef",
    "Tracker",
    "dashboard_corpus",
    "decile_of",
    "decoder_logits",
    "feature_activations",
    "parse_feature_ids",
    "read_ids",
    "set_activations",
]

SKIP = 1  # position 0 (the document separator) is in no statistic


@dataclass(frozen=True)
class FeatureRef:
    """Latent ``index`` of the dictionary at (``layer``, ``where``); named ``L{layer}.{where}.{index}``."""

    layer: int
    where: str
    index: int

    @property
    def name(self) -> str:
        return f"L{self.layer}.{self.where}.{self.index}"

    @property
    def site(self) -> str:
        return feature_site(self.layer, self.where)


def parse_feature_ids(spec: str, fs: FeatureSet) -> list[FeatureRef]:
    """``L10.mlp.123,L3.resid_pre.7`` (the ``L`` optional) checked against the set: one line where an id is
    malformed, names no dictionary of the set, or is out of its width."""
    out: list[FeatureRef] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        bits = part.split(".")
        layer_s = bits[0][1:] if bits[0][:1] in ("L", "l") else bits[0]
        if len(bits) != 3 or not layer_s.isdigit() or not bits[2].isdigit():
            raise StreetlampError(
                f"--feature-ids {part!r}: write a feature as L<layer>.<site>.<index>, e.g. L1.mlp.5 (site resid_pre "
                "or mlp)"
            )
        layer, where, index = int(layer_s), bits[1], int(bits[2])
        d = fs.get(layer, where)
        if d is None:
            have = ", ".join(f"L{x.layer}.{x.where}" for x in fs)
            raise StreetlampError(f"--feature-ids {part}: the feature set has no dictionary there (it has {have})")
        if index >= d.width:
            raise StreetlampError(
                f"--feature-ids {part}: feature {index} out of range: the dictionary at L{layer}.{where} has "
                f"features 0..{d.width - 1}"
            )
        ref = FeatureRef(layer, where, index)
        if ref not in out:
            out.append(ref)
    if not out:
        raise StreetlampError("--feature-ids: no feature given")
    return out


def read_ids(adapter: ModelAdapter, text: str, seq_len: int | None = None, sep: int | None = None) -> list[int]:
    """The separator (``sep``: the model's, looked up when None), then ``text``'s tokens without special tokens
    (cut so the row has ``seq_len`` tokens)."""
    ids = [int(i) for i in adapter.tokenizer(text, add_special_tokens=False)["input_ids"]]
    row = [adapter.empty_context_token() if sep is None else sep, *ids]
    return row[:seq_len] if seq_len is not None else row


@dataclass
class DashCorpus:
    """Token rows (separator first), the source of each, and the texts read per source."""

    rows: list[list[int]]
    sources: list[str]
    spec: str
    seq_len: int
    seed: int
    counts: dict[str, dict] = field(default_factory=dict)

    def describe(self) -> dict:
        return {
            "spec": self.spec,
            "sequences": len(self.rows),
            "seq_len": self.seq_len,
            "tokens": int(sum(len(r) - SKIP for r in self.rows)),
            "sources": self.counts,
            "sampling": "each source's texts shuffled with the seed, then taken in turn (one text of each source "
            "while it lasts); each text read after the document separator, cut to seq_len tokens; texts with no "
            "token skipped",
        }


def dashboard_corpus(adapter: ModelAdapter, spec: str, n: int, seq_len: int, seed: int) -> DashCorpus:
    """``n`` texts of the named sources (features-fit's ``--data``: mix, tweets, drugs, movies, recall, bigbench
    or a .csv/.jsonl file), taken in turn from each source shuffled with ``seed``."""
    from .activations import source_texts

    texts = source_texts(spec)
    rng = np.random.default_rng(seed)
    order = {k: [v[i] for i in rng.permutation(len(v))] for k, v in texts.items()}
    used = dict.fromkeys(order, 0)
    rows: list[list[int]] = []
    sources: list[str] = []
    tokens = dict.fromkeys(order, 0)
    sep = adapter.empty_context_token()  # once: it reads the whole vocabulary
    while len(rows) < n:
        live = [k for k in order if used[k] < len(order[k])]
        if not live:
            break
        for k in live:
            if len(rows) >= n:
                break
            text = order[k][used[k]]
            used[k] += 1
            row = read_ids(adapter, text, seq_len, sep)
            if len(row) <= SKIP:
                continue
            rows.append(row)
            sources.append(k)
            tokens[k] += len(row) - SKIP
    if not rows:
        raise StreetlampError(f"--data {spec}: no text with a token in it")
    counts = {k: {"texts_read": used[k], "texts_available": len(order[k]), "tokens": tokens[k]} for k in order}
    return DashCorpus(rows, sources, spec, seq_len, seed, counts)


@torch.no_grad()
def set_activations(adapter: ModelAdapter, rows: Sequence[Sequence[int]]) -> dict[tuple[int, str], np.ndarray]:
    """Every dictionary's latents ``[batch, pos, width]`` (float64, NaN at padding) for unpadded ``rows``."""
    from ..models.adapter import Inputs

    fs = adapter.features
    assert fs is not None
    inputs = Inputs.from_ids(adapter, rows, strings=False)
    sites = {(d.layer, d.where): feature_site(d.layer, d.where) for d in fs}
    cache = adapter.forward(inputs, record=list(sites.values())).cache
    pad = ~inputs.attention_mask.bool().numpy()
    out = {}
    for key, s in sites.items():
        a = cache[s].double().cpu().numpy()
        a[pad] = np.nan
        out[key] = a
    return out


@torch.no_grad()
def feature_activations(
    adapter: ModelAdapter, rows: Sequence[Sequence[int]], feats: Sequence[FeatureRef]
) -> tuple[np.ndarray, np.ndarray]:
    """``(acts [batch, pos, F] float64, mask [batch, pos] bool)``: the features' activations, and where a
    position is a real token past the separator (only the dictionaries holding ``feats`` are spliced)."""
    from ..models.adapter import Inputs

    inputs = Inputs.from_ids(adapter, rows, strings=False)
    sites = sorted({f.site for f in feats})
    cache = adapter.forward(inputs, record=sites).cache
    acts = np.stack([cache[f.site][..., f.index].double().cpu().numpy() for f in feats], -1)
    mask = inputs.attention_mask.bool().numpy().copy()
    mask[:, :SKIP] = False
    return acts, mask


def decile_of(value: float | np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``1 + #{k : value ≥ bounds[k]}`` (1..10 for nine boundaries)."""
    return 1 + np.searchsorted(np.asarray(bounds), np.asarray(value), side="right")


class Tracker:
    """Streaming statistics of ``n`` features over sequences (module docstring); memory
    ``O(n × (top_k + reservoir))`` whatever the corpus."""

    def __init__(self, n: int, top_k: int, reservoir: int, seed: int) -> None:
        self.n, self.top_k, self.R, self.seed = n, top_k, reservoir, seed
        self.tokens = 0
        self.sequences = 0
        self.active = np.zeros(n, np.int64)
        self.seq_active = np.zeros(n, np.int64)
        self.sum_active = np.zeros(n)
        self.max = np.full(n, -np.inf)
        # top contexts: value, sequence, position (rows sorted by value desc, sequence asc)
        self.top = [np.zeros((0, 3)) for _ in range(n)]
        self.res = [np.zeros((0, 3)) for _ in range(n)]  # reservoir of firing sequences: value, sequence, pos
        self.seen = np.zeros(n, np.int64)  # firing sequences offered to the reservoir
        self.rngs = [np.random.default_rng([seed, 11, f]) for f in range(n)]  # one per feature: batch-free

    def update(self, seq: np.ndarray, acts: np.ndarray, mask: np.ndarray) -> None:
        """One batch: ``seq [b]`` corpus indices, ``acts [b, pos, n]``, ``mask [b, pos]`` (positions counted)."""
        m3 = mask[..., None]
        self.tokens += int(mask.sum())
        self.sequences += len(seq)
        a = np.where(m3, acts, -np.inf)
        fires = a > 0
        self.active += fires.sum((0, 1))
        self.sum_active += np.where(fires, a, 0.0).sum((0, 1))
        seq_max = a.max(1)  # [b, n]
        arg = a.argmax(1)
        self.max = np.maximum(self.max, seq_max.max(0))
        for f in range(self.n):
            hit = np.flatnonzero(seq_max[:, f] > 0)
            if not len(hit):
                continue
            self.seq_active[f] += len(hit)
            new = np.stack([seq_max[hit, f], seq[hit].astype(float), arg[hit, f].astype(float)], 1)
            both = np.concatenate([self.top[f], new])
            order = np.lexsort((both[:, 1], -both[:, 0]))[: self.top_k]
            self.top[f] = both[order]
            for row in new:  # in stream order: the sample depends on the seed and the order, not the batches
                c = int(self.seen[f])
                self.seen[f] += 1
                if c < self.R:
                    self.res[f] = np.concatenate([self.res[f], row[None]])
                else:
                    j = int(self.rngs[f].integers(0, c + 1))
                    if j < self.R:
                        self.res[f][j] = row

    def bounds(self, f: int) -> np.ndarray:
        """The nine decile boundaries of feature ``f`` (empty where it never fires)."""
        v = self.res[f][:, 0]
        return np.quantile(v, np.arange(1, 10) / 10) if len(v) else np.zeros(0)

    def exact(self, f: int) -> bool:
        return bool(self.seen[f] <= self.R)

    def decile_samples(self, f: int, per_decile: int) -> dict[int, np.ndarray]:
        """``per_decile`` reservoir members of each decile (drawn with ``[seed, 13, f]``; in corpus order)."""
        r = self.res[f]
        if not len(r):
            return {}
        d = decile_of(r[:, 0], self.bounds(f))
        rng = np.random.default_rng([self.seed, 13, f])
        out = {}
        for k in range(1, 11):
            idx = np.flatnonzero(d == k)
            idx = idx[np.argsort(r[idx, 1], kind="stable")]
            if len(idx):
                pick = np.sort(rng.choice(len(idx), size=min(per_decile, len(idx)), replace=False))
                out[k] = r[idx[pick]]
        return out


def stream(
    adapter: ModelAdapter,
    rows: Sequence[Sequence[int]],
    feats: Sequence[FeatureRef],
    tracker: Tracker,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Every row through the model in batches of ``batch_size`` (rows of similar length together: in order of
    length, ties in corpus order), each batch's activations into ``tracker`` then dropped."""
    order = np.argsort([len(r) for r in rows], kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        acts, mask = feature_activations(adapter, [rows[i] for i in idx], feats)
        tracker.update(np.asarray(idx), acts, mask)
        if progress is not None:
            progress(len(idx))


def decoder_logits(adapter: ModelAdapter, feats: Sequence[FeatureRef]) -> np.ndarray | None:
    """``[F, vocab]`` float64: each feature's decoder direction through the final norm's gain (centred for
    LayerNorm) and the unembedding (module docstring); None where the model has no LM readout."""
    from ..models.readout import final_norm, unembedding

    fs = adapter.features
    assert fs is not None
    if not adapter.kind.causal or adapter.family.readout is None:
        return None
    norm = final_norm(adapter)
    w_u, _ = unembedding(adapter)
    dirs = []
    for f in feats:
        d = fs.get(f.layer, f.where)
        assert d is not None
        dirs.append(d.W_dec[f.index].double())
    D = torch.stack(dirs).to(norm.weight.device)
    v = norm.linear(D, torch.ones(1, dtype=torch.float64, device=D.device))
    return (v @ w_u.double().to(v.device).t()).cpu().numpy()
