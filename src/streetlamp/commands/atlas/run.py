"""``streetlamp atlas``: every head across a corpus, where it looks beside what removing it changes.

Run folder (a resumable store, :class:`~streetlamp.store.RunStore`; the same command resumes it and a
killed run recomputes no finished chunk)::

    RUN/manifest.json              settings (compared on resume), the ablation and its reference, the rules
    RUN/parts/stats-N.parquet      pass 1, per chunk: statistics per (sequence, layer, head)
    RUN/parts/zsum-N.safetensors   pass 1, per chunk: sum of attn.z over its real tokens (the corpus mean)
    RUN/parts/estimate-N.parquet   pass 2: attribution estimate and DLA per (sequence, layer, head)
    RUN/parts/exact-N.parquet      pass 3: exact ablation of the chosen pairs
    RUN/atlas.parquet              one row per (layer, head, sequence): every statistic and effect
    RUN/heads.csv                  one row per head: means, light-against-use correlation, flags
    RUN/arrays.safetensors         the view's arrays (per-head summary, each head's top sequences' patterns)
    RUN/task_compare.csv           --compare-task: per head, its narrow-task effect beside its corpus effect

Chunk ``c`` holds the sequences ranked ``c·chunk_size ..`` by token count (a batch pads to its longest row).

Which pairs are exact: all when ``exact_share >= 1``; else ``round(share · pairs)`` drawn at random
(seeded) plus each head's ``exact_top`` pairs with the largest ``|dlogp_est|``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import StreetlampError
from ...interventions.atlas_chunks import Chunk, Context, work
from ...interventions.atlas_stats import STATS
from ...interventions.atlas_use import SINK_EPS, sink_share
from ...models.adapter import ModelAdapter
from ...progress import bar as progress_bar
from ...store.files import folder_file, save_arrays
from ...store.parts import part_done, read_part
from ...store.run_store import RunStore, atomic_write
from . import outputs
from .task import compare_task as compare
from .task import lines as task_lines
from .task import task_pairs_of

if TYPE_CHECKING:
    from ...settings import RunOptions
    from . import AtlasSettings


@dataclass
class AtlasResult:
    out: Path
    summary: pd.DataFrame
    computed: dict[str, int] = field(default_factory=dict)  # pass -> chunks computed now
    task: dict[str, Any] | None = None  # --compare-task: manifest["task_compare"]

    def lines(self) -> list[str]:
        s = self.summary
        lit = s[s.streetlight].sort_values("prominence", ascending=False)
        if lit.empty:
            lit = s.assign(_r=s.prominence.rank(ascending=False) + s.effect.rank()).sort_values("_r").head(5)
        used = s[s.unremarkable_used].sort_values("effect", ascending=False)
        if used.empty:
            used = s.assign(_r=s.prominence.rank() + s.effect.rank(ascending=False)).sort_values("_r").head(5)

        def fmt(d: pd.DataFrame) -> str:
            return ", ".join(
                f"{r.layer}.{r.head} (prominence {r.prominence:.2f}, KL {r.effect:.2g})" for r in d.head(5).itertuples()
            )

        return [
            f"most prominent, least used heads{'' if s.streetlight.any() else ' (none flagged; closest)'}: {fmt(lit)}",
            f"unremarkable but used heads{'' if s.unremarkable_used.any() else ' (none flagged; closest)'}: {fmt(used)}",
            f"{int(s.streetlight.sum())} streetlight heads, {int(s.unremarkable_used.sum())} unremarkable-but-used, "
            f"{int(s.estimate_poor.sum())} with a poor attribution estimate, of {len(s)}",
            f"Sink1^{SINK_EPS:g} = {sink_share(s):.3f}: {int(s.sink_head.sum())} of {len(s)} heads attend to the first "
            f"token more than {SINK_EPS:g} on average over every query (Gu et al. 2024, arXiv 2410.10781; theirs on "
            "64-token inputs: --max-tokens 64)",
            *(task_lines(self.task) if self.task else []),
            "chunks computed now: " + ", ".join(f"{k} {v}" for k, v in self.computed.items()),
            f"output: {self.out}/ (atlas.parquet, heads.csv, manifest.json, report.html)",
        ]

    def _repr_html_(self) -> str:
        from ...report.viewer import iframe_html

        return iframe_html(self.out)


def read_corpus(spec: str, limit: int | None, sample: int | None, seed: int) -> tuple[list[str], list[str]]:
    """``(ids, texts)`` of ``spec``: one or more comma-separated data specs ``evaluate`` (and ``heads``) read."""
    from ...data import sample_indices
    from ..heads.run import load_texts

    ids: list[str] = []
    texts: list[str] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        t, _ = load_texts(part)
        ids += [f"{Path(part).stem}:{i}" for i in range(len(t))]
        texts += t
    if not texts:
        raise StreetlampError(f"--data {spec!r} has no text")
    keep = sample_indices(len(texts), sample, seed) if sample is not None else list(range(len(texts)))[:limit]
    return [ids[i] for i in keep], [texts[i] for i in keep]


def tokenize(
    adapter: ModelAdapter, texts: list[str], truncate: bool, max_tokens: int | None
) -> tuple[list[list[int]], int]:
    """Token ids of each text (special tokens as the tokenizer adds them), cut to ``max_tokens`` when given;
    a text longer than the model's positions is refused unless ``truncate``. Returns ``(ids, n_cut)``."""
    room = min(adapter.max_positions, max_tokens or adapter.max_positions)
    out, cut, too_long = [], 0, 0
    for t in texts:
        ids = list(adapter.tokenizer(t)["input_ids"])
        if len(ids) > adapter.max_positions and not truncate:
            too_long += 1
        if len(ids) > room:
            cut += 1
            ids = list(adapter.tokenizer(t, truncation=True, max_length=room)["input_ids"])
        out.append(ids)
    if too_long:
        raise StreetlampError(
            f"{too_long} sequence(s) are longer than {adapter.name}'s {adapter.max_positions} positions: "
            "give --truncate (or --max-tokens N) to cut them"
        )
    return out, cut


def _name(kind: str, c: int, ext: str = "parquet") -> str:
    return f"parts/{kind}-{c:06d}.{ext}"


def _part(store: RunStore, kind: str, c: int, ext: str = "parquet") -> Path:
    """Where a part is written (``parts/`` checked to be inside the run folder when the store opens)."""
    return store.folder / _name(kind, c, ext)


def _read(store: RunStore, kind: str, c: int, ext: str = "parquet") -> Any:
    """A part as it reads, through the store's rule (inside the folder, damaged = not done)."""
    got = read_part(store.folder, _name(kind, c, ext))
    if got is None:
        raise StreetlampError(f"{store.folder}: {_name(kind, c, ext)} went missing during the run")
    return got


def _done(store: RunStore, kind: str, n_chunks: int) -> set[int]:
    """The chunks of pass ``kind`` whose parts read (the stats pass writes two: its zsum and its stats)."""
    both = ("zsum",) if kind == "stats" else ()
    return {
        c
        for c in range(n_chunks)
        if all(part_done(store.folder, _name(k, c, "safetensors")) for k in both)
        and part_done(store.folder, _name(kind, c))
    }


def _write_table(path: Path, cols: dict[str, np.ndarray]) -> None:
    table = pa.table({k: pa.array(v) for k, v in cols.items()})
    atomic_write(path, lambda p: pq.write_table(table, p))


def _long(chunk: Chunk, arrays: dict[str, np.ndarray], names: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    """``[B, L, H]`` arrays as columns of rows (sequence, layer, head)."""
    B, L, H = arrays[names[0]].shape
    seq = np.repeat(np.array(chunk.index), L * H)
    lay = np.tile(np.repeat(np.arange(L), H), B)
    head = np.tile(np.arange(H), B * L)
    return {"sequence": seq, "layer": lay, "head": head, **{k: arrays[k].reshape(-1) for k in names}}


def run_atlas(adapter: ModelAdapter, s: AtlasSettings, out: Path, opts: RunOptions | None = None) -> AtlasResult:
    """The run (module docstring): ``s`` checked and validated; ``opts`` (the model's name and device for
    ``--engine ray``, whose actors each load it) may be None on the local engine."""
    model = str(opts.model) if opts is not None and isinstance(opts.model, (str, Path)) else None
    device = opts.device if opts is not None else "cpu"
    if s.engine == "ray" and opts is not None and (opts.dtype != "float32" or opts.device_map is not None):
        raise StreetlampError(
            "--engine ray loads a float32 model on each actor: --dtype and --device-map need --engine local"
        )
    seq_ids, texts = read_corpus(s.data, s.limit, s.sample, s.seed)
    ids, n_cut = tokenize(adapter, texts, s.truncate, s.max_tokens)
    N, L, H = len(ids), adapter.n_layers, adapter.n_heads
    if s.ablation == "resample" and N < 2:
        raise StreetlampError("--ablation resample takes a head's activation from another sequence: give at least 2")
    if s.engine == "ray":
        from ...extras import require

        require("ray")
        if model is None:
            raise StreetlampError("--engine ray loads the model by name on each actor: give --model NAME")
        from ..ray_engine import connect

        connect(s.ray_address, s.workers)  # before the run folder exists: an unreachable cluster is one line
    task_pairs = task_pairs_of(adapter, s.compare_task, s.compare_prompts, s.seed) if s.compare_task else None
    h = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    info = adapter.describe()
    settings = {
        "model": {
            "name": adapter.name,
            "source": adapter.source,
            "dtype": info["dtype"],
            "features": info.get("features"),
        },
        "data": {"spec": s.data, "n_sequences": N, "tokens_sha256": h},
        "ablation": s.ablation,
        "exact_share": s.exact_share,
        "exact_top": s.exact_top,
        "limit": s.limit,
        "sample": s.sample,
        "truncate": s.truncate,
        "max_tokens": s.max_tokens,
        "chunk_size": s.chunk_size,
        "chunk_order": "by_length",  # chunk c holds the sequences ranked c·size.. by token count
        "floor": s.floor,
        "striking": s.striking,
        "top_k": s.top_k,
        "seed": s.seed,
    }
    mean_note = {
        "mean": f"the mean of attn.z over every real token of the {N} sequences actually read",
        "zero": "attn.z set to 0",
        "resample": "attn.z of the same head on another sequence of the corpus (seeded), position by position",
    }[s.ablation]
    store = RunStore.open(
        Path(out),
        settings,
        {
            "model_info": info,
            "ablation": {"strategy": s.ablation, "site": "layers.{l}.attn.z, every position", "reference": mean_note},
            "n_cut_to_max_tokens": n_cut,
        },
        command="atlas",
        added={"model.dtype": "float32", "model.features": None},  # a store made before --dtype was float32
    )
    folder_file(store.folder, "parts", kind="dir", missing_ok=True)  # a parts/ symlink out: refused
    (store.folder / "parts").mkdir(exist_ok=True)
    for t in (store.folder / "parts").glob(".*.tmp-*"):
        t.unlink(missing_ok=True)
    rng = np.random.default_rng([s.seed, 1])
    source = (np.arange(N) + rng.integers(1, max(2, N), N)) % max(1, N)  # never the sequence itself (N >= 2)
    # chunks of sequences of like length (stable by corpus order): a batch pads to its longest row
    order = sorted(range(N), key=lambda i: len(ids[i]))
    chunks = []
    for start in range(0, N, s.chunk_size):
        idx = order[start : start + s.chunk_size]
        src = [ids[int(source[i])] for i in idx] if s.ablation == "resample" else []
        chunks.append(Chunk(idx, [ids[i] for i in idx], src))
    ctx = Context(ablation=s.ablation, seed=s.seed, batch_size=s.batch_size)
    computed: dict[str, int] = {}

    def run_pass(kind: str, write, pairs: dict[int, list] | None = None) -> None:
        todo = [c for c in range(len(chunks)) if c not in _done(store, kind, len(chunks))]
        computed[kind] = len(todo)
        with progress_bar(len(chunks), f"atlas {kind}", initial=len(chunks) - len(todo)) as b:
            jobs = {c: (kind, chunks[c], (pairs or {}).get(c, [])) for c in todo}
            if s.engine == "ray" and todo:
                from ..ray_engine import run_on_ray

                shipped: Any = jobs  # a job is (pass, chunk, pairs); run_on_ray hands it to ``work`` as it is
                run_on_ray(
                    str(model),
                    device,
                    ctx,
                    shipped,
                    store,
                    _Chunks(b),
                    s.ray_address,
                    s.workers,
                    work=cast(Any, work),
                    write=write,
                )
                return
            for c, job in jobs.items():
                write(c, work(adapter, job, ctx))
                b.update(1)

    def write_stats(c: int, res: dict) -> None:
        atomic_write(
            _part(store, "zsum", c, "safetensors"), lambda p: save_arrays(p, {k: res[k] for k in ("zsum", "n_tokens")})
        )
        _write_table(_part(store, "stats", c), _long(chunks[c], res, STATS))

    run_pass("stats", write_stats)
    if s.ablation == "mean":
        zs = [_read(store, "zsum", c, "safetensors") for c in range(len(chunks))]
        total = np.sum([z["zsum"] for z in zs], axis=0)
        ctx.mean = (total / sum(int(z["n_tokens"][0]) for z in zs)).astype(np.float32)

    def write_estimate(c: int, res: dict) -> None:
        cols = _long(chunks[c], res, ("dlogp_est", "dla"))
        cols["pred"] = np.repeat(res["pred"], L * H)
        _write_table(_part(store, "estimate", c), cols)

    run_pass("estimate", write_estimate)
    est = pd.concat([_read(store, "estimate", c).to_pandas() for c in range(len(chunks))], ignore_index=True)
    est = est.sort_values(["sequence", "layer", "head"]).reset_index(drop=True)
    chosen = choose_pairs(est, N, L, H, s.exact_share, s.exact_top, s.seed)
    where = {seq: (c, b) for c, ch in enumerate(chunks) for b, seq in enumerate(ch.index)}
    pairs: dict[int, list] = {}
    for seq, l, hd in chosen[["sequence", "layer", "head"]].itertuples(index=False):
        c, b = where[int(seq)]
        pairs.setdefault(c, []).append((b, int(l), int(hd)))

    def write_exact(c: int, res: dict) -> None:
        p = pairs.get(c, [])
        cols = {
            "sequence": np.array([chunks[c].index[b] for b, _, _ in p], np.int64),
            "layer": np.array([l for _, l, _ in p], np.int64),
            "head": np.array([hd for _, _, hd in p], np.int64),
        }
        for k in ("kl_explained", "dlogp", "dprob", "kl_mean", "dloss"):
            cols[k] = np.asarray(res.get(k, np.full(len(p), np.nan)), np.float64)
        _write_table(_part(store, "exact", c), cols)

    run_pass("exact", write_exact, pairs)
    finished = ("atlas.parquet", "heads.csv", "arrays.safetensors")
    if not any(computed.values()) and all(part_done(store.folder, f) for f in finished):  # nothing to redo
        summary = read_part(store.folder, "heads.csv")
    else:
        table = outputs.merge(store.folder, len(chunks), est, chosen, seq_ids, s.exact_share >= 1)
        summary = outputs.write_outputs(adapter, store, table, ids, seq_ids, ctx, settings)
    task = None
    if s.compare_task and task_pairs is not None:
        _, task = compare(adapter, store, summary, s.compare_task, task_pairs, ctx, s.seed)
    return AtlasResult(store.folder, summary, computed, task)


class _Chunks:
    """The progress bar counted in chunks (Ray's driver reports a job's length)."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def update(self, n: int = 1) -> None:
        self.bar.update(1)


def choose_pairs(est: pd.DataFrame, N: int, L: int, H: int, share: float, top: int, seed: int) -> pd.DataFrame:
    """The exactly ablated pairs with their ``audit`` label (module docstring)."""
    if share >= 1:
        return est[["sequence", "layer", "head"]].assign(audit="all")
    n = int(round(share * N * L * H))
    flat = np.random.default_rng([seed, 3]).choice(N * L * H, size=n, replace=False) if n else np.array([], int)
    rand = pd.DataFrame({"sequence": flat // (L * H), "layer": (flat // H) % L, "head": flat % H}).assign(
        audit="random"
    )
    e = est.assign(_a=est.dlogp_est.abs()).sort_values("_a", ascending=False, kind="stable")
    best = e.groupby(["layer", "head"], sort=False).head(top)[["sequence", "layer", "head"]].assign(audit="top")
    both = pd.concat([rand, best], ignore_index=True).drop_duplicates(["sequence", "layer", "head"], keep="first")
    return both.sort_values(["sequence", "layer", "head"]).reset_index(drop=True)


__all__ = ["AtlasResult", "choose_pairs", "read_corpus", "run_atlas", "tokenize"]
