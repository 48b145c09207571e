"""``streetlamp lens-fit``: a tuned or Jacobian lens fitted on a corpus, written as a lens folder.

The run folder holds the lens (``lens.json`` + ``lens.safetensors``, :mod:`streetlamp.interventions.lenses.store`),
``heldout_kl.csv`` (per residual row: the mean KL(final ‖ lens) over the held-out tokens for the logit lens
and the fitted lens, nats), the same as arrays and a table, and ``manifest.json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ...data.loaders import load_dataset
from ...errors import StreetlampError
from ...interventions.lenses.base import Lens, row_label
from ...interventions.lenses.fit import corpus_sequences, fit_dtype, fit_jacobian, fit_tuned, heldout_kl, row_means
from ...interventions.lenses.store import LENS_FILE, LENS_JSON, save_lens
from ...models.adapter import ModelAdapter
from ...store.run_folder import RunFolder

if TYPE_CHECKING:
    from . import LensFitSettings

ESTIMATOR = {
    "tuned": "Adam on sum over rows of mean-token KL(p_final || W_U norm_f(h + W_r h + b_r)), W_r = b_r = 0 at the start",
    "converted": "not fitted here: read from another lens folder (the tuned-lens package's params.pt: A_r = I + W_r, "
    "b_r; the Jacobian lens's reference .pt: A_{l+1} = J[l])",
    "jacobian": "VJP per cotangent v on the final residual at every target position p' >= skip at once; "
    "J_r = mean over source positions p >= skip of sum_{p' >= p} dh_final[p'] / dh_r[p] "
    "(exact: d one-hot cotangents; probes k: k Rademacher cotangents, J ~ (1/k) sum v v^T J)",
}


class LensFitResult:
    def __init__(self, out: Path, values: dict[str, Any]) -> None:
        self.out, self.values = out, values

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def lines(self) -> list[str]:
        v = self.values
        t = v["training"]
        head = [
            f"{v['kind']} lens of {v['model']}: {t['train_tokens']} training tokens "
            f"({t['train_sequences']} sequences of {t['seq_len']}), {t['seconds']:.1f} s; held-out KL on "
            f"{v['heldout_tokens']} tokens (nats):",
            f"  row | layer | logit lens | {v['kind']} lens",
        ]
        body = [f"  {r['row']} | {r['layer']} | {r['kl_logit']:.4g} | {r['kl_' + v['kind']]:.4g}" for r in v["rows"]]
        return [*head, *body, "", f"lens folder: {self.out}/ (use: streetlamp lens TEXT --lens {v['kind']}:{self.out})"]


def run_lens_fit(
    adapter: ModelAdapter, s: LensFitSettings, out: RunFolder | Path, options: Any = None
) -> LensFitResult:
    """Fit the lens ``s.lens`` and write the lens folder (the settings checked and validated before)."""
    rf = RunFolder.of(out, "lens-fit")
    dtype = fit_dtype(adapter)
    ds = load_dataset(s.data, labels=False)  # a corpus: text alone is enough
    seqs = corpus_sequences(adapter, [e.text for e in ds.examples], s.seq_len, s.seed)
    if seqs.shape[0] <= s.heldout:
        raise StreetlampError(
            f"--data {s.data} gives {seqs.shape[0]} sequences of {s.seq_len} tokens: not more than --heldout {s.heldout}"
        )
    held, train = seqs[-s.heldout :], seqs[: -s.heldout]
    if s.max_seqs is not None:
        train = train[: s.max_seqs]
    t0 = time.perf_counter()
    losses: list[float] = []
    if s.convert is not None:
        from ...interventions.lenses.store import load_lens

        lens = load_lens(s.convert, adapter, s.lens, allow_pt=True)
        used, presented = 0, 0
        params = {
            "converted_from": str(s.convert),
            "source_format": lens.info["format"],
            "source_model": lens.info["model"],
        }
    elif s.lens == "tuned":
        lens, losses = fit_tuned(adapter, train, steps=s.steps, lr=s.lr, batch_seqs=s.batch_seqs, seed=s.seed)
        used = min(train.shape[0], s.steps * s.batch_seqs)
        params = {"steps": s.steps, "lr": s.lr, "batch_seqs": s.batch_seqs, "optimizer": "Adam"}
        presented = s.steps * s.batch_seqs * s.seq_len
    else:
        lens = fit_jacobian(
            adapter, train, probes=s.probes, skip_first=s.skip_first, dim_batch=s.dim_batch, seed=s.seed
        )
        used = train.shape[0]
        per = adapter.d_model if s.probes == 0 else s.probes
        params = {
            "probes": s.probes,
            "cotangents_per_sequence": per,
            "exact": s.probes == 0,
            "skip_first": s.skip_first,
            "dim_batch": s.dim_batch,
            "source_positions": used * (s.seq_len - s.skip_first),
        }
        presented = used * s.seq_len
    seconds = time.perf_counter() - t0
    lens.mean = row_means(adapter, train)  # the baseline of `lens --check-variant baseline --baseline mean`

    kl = heldout_kl(adapter, {"logit": Lens.logit(adapter), s.lens: lens}, held)
    L = adapter.n_layers
    rows = [
        {
            "row": r,
            "layer": row_label(r),
            "kl_logit": float(kl["kl"]["logit"][r]),
            f"kl_{s.lens}": float(kl["kl"][s.lens][r]),
            "heldout_tokens": kl["tokens"],
        }
        for r in range(L + 1)
    ]
    training = {
        "kind": s.lens,
        "estimator": ESTIMATOR["converted" if s.convert else s.lens],
        "data": {"name": ds.name, "source": ds.source, "sha256": ds.hash(), "examples": len(ds.examples)},
        "seq_len": s.seq_len,
        "train_sequences": used,
        "train_tokens": used * s.seq_len,
        "tokens_presented": presented,
        "heldout_sequences": s.heldout,
        "dtype": str(dtype).replace("torch.", ""),
        "accumulation": "float64",
        "seed": s.seed,
        "seconds": seconds,
        "mean": f"mean residual per row over the {train.shape[0]} training sequences' tokens at positions >= 1 "
        "(float64), stored as `mean`",
        **params,
    }
    with rf.staging() as w:
        save_lens(w.path, lens, adapter, training)
        pd.DataFrame(rows).to_csv(w.path / "heldout_kl.csv", index=False)
        arrays = {"heldout_kl.logit": kl["kl"]["logit"], f"heldout_kl.{s.lens}": kl["kl"][s.lens]}
        described = {
            k: {
                "axes": ["row(0=embedding, r=after layer r-1)"],
                "meaning": f"mean KL(final || {k.split('.')[1]} lens) over {kl['tokens']} held-out tokens, nats",
            }
            for k in arrays
        }
        if losses:
            arrays["training.loss"] = np.asarray(losses)
            described["training.loss"] = {
                "axes": ["step"],
                "meaning": "training loss per Adam step: sum over rows of the mean token KL (nats)",
            }
        w.add_arrays({k: np.asarray(v, np.float64) for k, v in arrays.items()}, described)
        w.write_manifest(
            {
                "model": adapter.describe(),
                "parameters": {"lens": s.lens, "data": s.data, **training},
                "seed": s.seed,
                "summary": {"kind": s.lens, "heldout_tokens": kl["tokens"], "train_tokens": used * s.seq_len},
                "tables": [
                    {
                        "title": f"held-out KL(final || lens) per layer, nats ({kl['tokens']} tokens)",
                        "columns": list(rows[0]),
                        "rows": [list(r.values()) for r in rows],
                    }
                ],
                "files": {
                    LENS_JSON: "the lens: kind, model record, training record, sha256 of lens.safetensors",
                    LENS_FILE: "the lens maps A.{row} [d, d] and b.{row} [d] (float64; a missing one is I / 0) and mean [row, d], "
                    "each row's mean residual over the training tokens",
                    "heldout_kl.csv": "per row: mean KL(final || logit lens) and KL(final || fitted lens) on held-out tokens",
                },
            }
        )
    return LensFitResult(
        Path(rf.out),
        {
            "kind": s.lens,
            "model": adapter.name,
            "training": training,
            "rows": rows,
            "heldout_tokens": kl["tokens"],
            "lens": lens,
        },
    )
