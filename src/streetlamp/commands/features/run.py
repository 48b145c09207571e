"""``streetlamp features``: tokens.csv (per token of TEXT its top active features), density.csv (per shown feature
its activation density and decile boundaries over the corpus), contexts.parquet (its top contexts and contexts
by decile, each token's activation), logits.csv (the tokens its decoder direction promotes and suppresses), the
arrays the report's view draws, and the manifest (what was read, how)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...errors import StreetlampError
from ...features.dashboard import (
    SKIP,
    FeatureRef,
    Tracker,
    dashboard_corpus,
    decile_of,
    decoder_logits,
    feature_activations,
    parse_feature_ids,
    read_ids,
    set_activations,
    stream,
)
from ...models.adapter import ModelAdapter
from ...progress import Bar
from ...store.run_folder import RunFolder, manifest_table

if TYPE_CHECKING:
    from . import FeaturesSettings

LOGIT_RULE = (
    "the decoder direction d = W_dec[f] read by the LM head through the final norm taken as a fixed linear map: "
    "W_U (gamma * d) for RMSNorm, W_U (gamma * (d - mean(d))) for LayerNorm; the norm's 1/rms (1/sigma) scale, its "
    "bias, b_U and any final soft-cap are left out (a positive factor per direction, or the same for every "
    "feature: the promoted and suppressed tokens and their order do not change); float64"
)
TABLES = {
    "tokens.csv": "one row per (token of TEXT, rank): position (0 = the text's first token; the separator read "
    "before it is not listed), token, rank, the feature (feature = L{layer}.{site}.{feature_index}) and its "
    "activation; the per_token features with the largest activation > 0 at that token, over every dictionary",
    "density.csv": "one row per shown feature: max_activation_on_text, over the corpus the tokens and sequences "
    "read, tokens_active (activation > 0), density = tokens_active / tokens, sequences_active, sequence_density, "
    "mean_activation_when_active, max_activation, and the decile boundaries q10..q90 of the per-sequence maxima of "
    "the sequences where it fires (deciles_exact: computed on all of them, else on a uniform sample of "
    "reservoir_size)",
    "contexts.parquet": "one row per (shown feature, context): group (top: the largest per-sequence maxima; decile: "
    "sampled from the sequences of that decile), rank within the group, decile (1..10, 10 the top tenth), "
    "sequence_index (in the corpus), source, max_token_index (into tokens), max_token, max_activation, context "
    "(the text with the max token between « and »), tokens and activations (the feature's activation at every "
    "token of the sequence, the separator left out)",
    "logits.csv": "one row per (shown feature, direction, rank): the vocabulary tokens its decoder direction "
    "promotes (largest logit_effect) and suppresses (smallest) through the final norm's gain and the unembedding "
    "(manifest logits)",
}


@dataclass
class FeaturesResult:
    out: Path
    features: pd.DataFrame
    logits: pd.DataFrame
    n_tokens: int
    n_sequences: int

    def lines(self) -> list[str]:
        out = [f"{self.n_tokens} tokens of TEXT; {len(self.features)} features over {self.n_sequences} corpus texts:"]
        for r in self.features.itertuples():
            up = self.logits[(self.logits.feature == r.feature) & (self.logits.direction == "promoted")].token
            out.append(
                f"  {r.feature}: max on TEXT {r.max_activation_on_text:.3g}, density {r.density:.2%} of tokens, max "
                f"{r.max_activation:.3g}" + (f"; promotes {', '.join(map(repr, up.head(5)))}" if len(up) else "")
            )
        return out + [f"output: {self.out}/ (report.html)"]


def _labels(adapter: ModelAdapter, ids: list[int]) -> list[str]:
    return [adapter.token_label(t) for t in adapter.tokenizer.convert_ids_to_tokens(ids)]


def _highlight(adapter: ModelAdapter, ids: list[int], k: int) -> str:
    dec = adapter.tokenizer.decode
    return f"{dec(ids[:k])}«{dec(ids[k : k + 1])}»{dec(ids[k + 1 :])}"


def text_tables(
    adapter: ModelAdapter, ids: list[int], per_token: int
) -> tuple[pd.DataFrame, np.ndarray, list[FeatureRef]]:
    """tokens.csv, every feature's activation on TEXT ``[pos, all features]`` (separator dropped) and the
    feature each column is."""
    fs = adapter.features
    assert fs is not None
    acts = set_activations(adapter, [ids])
    refs: list[FeatureRef] = []
    cols = []
    for d in fs:
        cols.append(acts[d.layer, d.where][0, SKIP:])
        refs += [FeatureRef(d.layer, d.where, i) for i in range(d.width)]
    cat = np.concatenate(cols, -1)
    labels = _labels(adapter, ids)[SKIP:]
    rows = []
    for p in range(cat.shape[0]):
        order = np.argsort(-cat[p], kind="stable")[:per_token]
        for rank, j in enumerate(o for o in order if cat[p, o] > 0):
            f = refs[j]
            rows.append([p, labels[p], rank + 1, f.name, f.layer, f.where, f.index, float(cat[p, j])])
    cols_ = ["position", "token", "rank", "feature", "layer", "site", "feature_index", "activation"]
    return pd.DataFrame(rows, columns=cols_), cat, refs


def run(adapter: ModelAdapter, s: FeaturesSettings, out: RunFolder, options: Any) -> FeaturesResult:
    fs = adapter.features
    assert fs is not None
    ids = read_ids(adapter, s.text)
    tokens_t, cat, refs = text_tables(adapter, ids, s.per_token)
    col = {f: j for j, f in enumerate(refs)}
    if s.feature_ids is not None:
        feats = parse_feature_ids(s.feature_ids, fs)
        selection = f"the features named by --feature-ids ({len(feats)})"
    else:
        mx = cat.max(0)
        order = [j for j in np.argsort(-mx, kind="stable")[: s.top] if mx[j] > 0]
        if not order:
            raise StreetlampError(
                "no feature of the set fires on TEXT (every activation is 0): name some --feature-ids"
            )
        feats = [refs[j] for j in order]
        selection = (
            f"the {len(feats)} features with the largest activation on TEXT's tokens (the separator left out), over "
            "every dictionary of the set"
        )
    text_acts = cat[:, [col[f] for f in feats]]  # [pos, F]
    labels = _labels(adapter, ids)[SKIP:]

    corpus = dashboard_corpus(adapter, s.data, s.sequences, s.seq_len, s.seed)
    tracker = Tracker(len(feats), s.contexts, s.reservoir, s.seed)
    bs = s.batch_size or 16
    with Bar(len(corpus.rows), "features: corpus") as bar:
        stream(adapter, corpus.rows, feats, tracker, bs, bar.update)

    # the contexts shown: per feature the top ones, then per decile; their activations from a second pass
    slots: list[list[tuple[str, int, int, float, int, int]]] = []  # group, rank, decile, value, sequence, pos
    bounds = [tracker.bounds(f) for f in range(len(feats))]
    for f in range(len(feats)):
        mine = [
            ("top", r + 1, int(decile_of(v, bounds[f])), float(v), int(q), int(p))
            for r, (v, q, p) in enumerate(tracker.top[f])
        ]
        for d, rows in tracker.decile_samples(f, s.per_decile).items():
            mine += [("decile", r + 1, d, float(v), int(q), int(p)) for r, (v, q, p) in enumerate(rows)]
        slots.append(mine)
    need = sorted({q for mine in slots for *_, q, _ in mine})
    rows_of: dict[int, np.ndarray] = {}
    with Bar(len(need), "features: contexts") as bar:
        for start in range(0, len(need), bs):
            part = need[start : start + bs]
            acts, _ = feature_activations(adapter, [corpus.rows[q] for q in part], feats)
            for b, q in enumerate(part):
                rows_of[q] = acts[b, SKIP : len(corpus.rows[q])]
            bar.update(len(part))
    n_slot = max([len(m) for m in slots] + [1])
    width = max(s.seq_len - SKIP, 1)
    ctx_seq = np.full((len(feats), n_slot), -1, np.int64)
    ctx_group = np.full((len(feats), n_slot), -1, np.int64)
    ctx_acts = np.zeros((len(feats), n_slot, width), np.float32)
    ctx_rows = []
    for f, mine in enumerate(slots):
        ft = feats[f]
        for j, (group, rank, dec, v, q, p) in enumerate(mine):
            row, sid = rows_of[q][:, f], corpus.rows[q]
            ctx_seq[f, j], ctx_group[f, j] = q, 0 if group == "top" else dec
            ctx_acts[f, j, : len(row)] = row
            toks = _labels(adapter, sid)[SKIP:]
            k = p - SKIP
            ctx_rows.append(
                {
                    "feature": ft.name,
                    "layer": ft.layer,
                    "site": ft.where,
                    "feature_index": ft.index,
                    "group": group,
                    "rank": rank,
                    "decile": dec,
                    "sequence_index": q,
                    "source": corpus.sources[q],
                    "max_token_index": k,
                    "max_token": toks[k],
                    "max_activation": v,
                    "context": _highlight(adapter, sid[SKIP:], k),
                    "tokens": toks,
                    "activations": [float(x) for x in row],
                }
            )
    contexts = pd.DataFrame(
        ctx_rows,
        columns=[
            "feature", "layer", "site", "feature_index", "group", "rank", "decile", "sequence_index", "source",
            "max_token_index", "max_token", "max_activation", "context", "tokens", "activations",
        ],
    )  # fmt: skip

    density_rows: list[dict[str, Any]] = []
    for f, ft in enumerate(feats):
        t = tracker
        qs = {f"q{10 * (k + 1)}": float(bounds[f][k]) if len(bounds[f]) else np.nan for k in range(9)}
        density_rows.append(
            {
                "feature": ft.name,
                "layer": ft.layer,
                "site": ft.where,
                "feature_index": ft.index,
                "max_activation_on_text": float(text_acts[:, f].max()),
                "sequences": t.sequences,
                "tokens": t.tokens,
                "tokens_active": int(t.active[f]),
                "density": float(t.active[f] / t.tokens) if t.tokens else np.nan,
                "sequences_active": int(t.seq_active[f]),
                "sequence_density": float(t.seq_active[f] / t.sequences) if t.sequences else np.nan,
                "mean_activation_when_active": float(t.sum_active[f] / t.active[f]) if t.active[f] else np.nan,
                "max_activation": float(t.max[f]),
                "deciles_exact": t.exact(f),
                "reservoir_size": len(t.res[f]),
                **qs,
            }
        )
    density = pd.DataFrame(density_rows)

    L = decoder_logits(adapter, feats)
    logit_rows = []
    promoted: list[list] = []
    suppressed: list[list] = []
    if L is not None:
        vocab = adapter.tokenizer.convert_ids_to_tokens(list(range(L.shape[1])))
        for f, ft in enumerate(feats):
            up = np.argsort(-L[f], kind="stable")[: s.logit_k]
            down = np.argsort(L[f], kind="stable")[: s.logit_k]
            lists = []
            for direction, idx in (("promoted", up), ("suppressed", down)):
                items = []
                for r, i in enumerate(idx):
                    tok = adapter.token_label(vocab[i]) if vocab[i] is not None else f"<{i}>"
                    logit_rows.append([ft.name, ft.layer, ft.where, ft.index, direction, r + 1, int(i), tok, L[f, i]])
                    items.append([tok, float(L[f, i])])
                lists.append(items)
            promoted.append(lists[0])
            suppressed.append(lists[1])
    logits = pd.DataFrame(
        logit_rows,
        columns=["feature", "layer", "site", "feature_index", "direction", "rank", "token_id", "token", "logit_effect"],
    )

    token_top: list[list] = [[] for _ in labels]
    for r in tokens_t.itertuples():
        token_top[r.position].append([r.feature, r.activation])
    seqs = {str(q): {"tokens": _labels(adapter, corpus.rows[q])[SKIP:], "source": corpus.sources[q]} for q in need}
    dash_feats = []
    for f, ft in enumerate(feats):
        dr = density_rows[f]
        dash_feats.append(
            {
                "name": ft.name,
                "layer": ft.layer,
                "site": ft.where,
                "index": ft.index,
                **{k: dr[k] for k in ("max_activation_on_text", "density", "tokens_active", "sequence_density")},
                **{k: dr[k] for k in ("mean_activation_when_active", "max_activation", "deciles_exact")},
                "decile_bounds": [float(x) for x in bounds[f]],
                "promoted": promoted[f] if promoted else [],
                "suppressed": suppressed[f] if suppressed else [],
            }
        )
    with out.staging() as w:
        tokens_t.to_csv(w.path / "tokens.csv", index=False)
        density.to_csv(w.path / "density.csv", index=False)
        contexts.to_parquet(w.path / "contexts.parquet", index=False)
        logits.to_csv(w.path / "logits.csv", index=False)
        w.add_array(
            "text_activations",
            text_acts.astype(np.float32),
            axes=["position", "feature"],
            meaning="each shown feature's activation at each token of TEXT (the separator left out); features in "
            "density.csv order",
        )
        w.add_array(
            "context_sequence",
            ctx_seq,
            axes=["feature", "slot"],
            meaning="the corpus sequence of each shown context (-1: empty slot); per feature the top contexts, then "
            "the decile samples (contexts.parquet order)",
        )
        w.add_array(
            "context_group",
            ctx_group,
            axes=["feature", "slot"],
            meaning="0: a top context; 1..10: its decile; -1 empty",
        )
        w.add_array(
            "context_activations",
            ctx_acts,
            axes=["feature", "slot", "position"],
            meaning="the feature's activation at every token of the context's sequence (separator left out; 0 past "
            "its end)",
        )
        w.write_manifest(
            {
                "model": adapter.name,
                "parameters": s.to_dict(),
                "seed": s.seed,
                "feature_set": fs.describe(),
                "text": s.text,
                "corpus": corpus.describe(),
                "selection": selection,
                "statistics": {
                    "activation": "the latent at the spliced site (nothing edited: the dictionary's encoding of the "
                    "site's input); every text read after the document separator, which is in no statistic",
                    "density": "fraction of the corpus's real tokens with activation > 0",
                    "contexts": "a context is a sequence, ranked by its largest activation (ties: lower corpus index)",
                    "deciles": "boundaries q10..q90 = numpy.quantile (linear) of the per-sequence maxima of the "
                    "sequences where the feature fires, on a uniform reservoir sample (Algorithm R, seeded) of "
                    f"{s.reservoir}; decile = 1 + #(boundaries <= max)",
                    "streaming": f"batches of {bs} sequences (in order of length); per feature only the top "
                    f"{s.contexts} and the reservoir are kept",
                },
                "logits": LOGIT_RULE if L is not None else "no LM readout: no promoted or suppressed tokens",
                "dashboard": {
                    "text_tokens": labels,
                    "token_top": token_top,
                    "features": dash_feats,
                    "sequences": seqs,
                },
                "files": TABLES,
                "tables": [
                    manifest_table(df, name, note=TABLES[name])
                    for name, df in (("density.csv", density), ("logits.csv", logits), ("tokens.csv", tokens_t))
                ],
            }
        )
    return FeaturesResult(out.out, density, logits, len(labels), len(corpus.rows))
