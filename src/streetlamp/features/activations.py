"""A model's own activations at a dictionary's site, streamed over a corpus in shards (METHODS.md §13).

**The corpus** (:func:`build_corpus`): texts of the named sources (``tweets``, ``drugs``, ``movies``,
``recall``, ``bigbench``, a ``.csv``/``.tsv``/``.jsonl`` file; ``mix`` = tweets, drugs, movies and BIG-Bench
task text when its archive or cache is present) and, optionally, text the model generates itself from
varied prompts (sampled, seeded). Each source's texts are shuffled with the seed; the mixer then takes the
next text of the source with the fewest tokens so far (ties in the order named), so the sources contribute
equal token counts until one runs out. Each text follows the document separator; the stream is packed into
sequences of ``seq_len`` tokens (the incomplete tail dropped) and the sequences are permuted with the
seed. The last ``heldout`` sequences are held out for the metrics. How many tokens came from each source
is recorded (:meth:`Corpus.describe`).

**The stream** (:func:`stream`): training consumes sequences in a fixed order that depends only on the
seed: global sequence ``i`` is training sequence ``perm_e[i mod n]`` of epoch ``e = i div n`` (``perm_e`` a
seeded permutation per epoch, the identity for epoch 0, whose order is the corpus's own). Shard ``b`` is
sequences ``[b B, (b + 1) B)``: one forward pass records the site at every requested layer, position 0 of
each sequence (an attention sink whose activations are atypical) is dropped, and the shard's tokens are
shuffled by a generator seeded with ``(seed, b)``. So shard ``b`` is the same whether the stream starts
at 0 or resumes at ``b``: a resumed fit sees no token twice and misses none. Only one shard's activations
are in memory at a time (``B (seq_len - 1)`` tokens × layers × ``d_in + d_out``).

**The site** (:func:`site_activations`): an SAE (``resid_pre``) reads and reconstructs
``layers.{l}.resid_pre``; a transcoder (``mlp``) reads the MLP's input (what the family's MLP module
receives: after the pre-MLP norm of a pre-norm family) and reconstructs its output (``layers.{l}.mlp.out``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import StreetlampError

if TYPE_CHECKING:
    from ..models.adapter import ModelAdapter

__all__ = [
    "MIX",
    "Corpus",
    "Shard",
    "bigbench_texts",
    "build_corpus",
    "generate_texts",
    "sequence_order",
    "site_activations",
    "source_texts",
    "stream",
]

MIX = ("tweets", "drugs", "movies", "bigbench")  # what ``mix`` names; bigbench only where present
SKIP_FIRST = 1  # positions dropped at the start of every sequence (the attention sink)


@dataclass
class Corpus:
    """Packed token sequences ``[n, seq_len]`` (train first, then the held-out ones) and their sources."""

    sequences: torch.Tensor
    heldout: int
    seq_len: int
    seed: int
    sources: dict[str, dict] = field(default_factory=dict)  # name -> {texts, tokens, note}

    @property
    def train(self) -> torch.Tensor:
        return self.sequences[: self.sequences.shape[0] - self.heldout]

    @property
    def held(self) -> torch.Tensor:
        return self.sequences[self.sequences.shape[0] - self.heldout :]

    def describe(self) -> dict:
        return {
            "seq_len": self.seq_len,
            "sequences": int(self.sequences.shape[0]),
            "train_sequences": int(self.train.shape[0]),
            "heldout_sequences": self.heldout,
            "tokens_per_sequence_used": self.seq_len - SKIP_FIRST,
            "train_tokens_per_epoch": int(self.train.shape[0]) * (self.seq_len - SKIP_FIRST),
            "sources": self.sources,
            "mixing": "the next text of the source with the fewest tokens so far (each source shuffled with the "
            "seed); packed after the document separator into sequences, permuted with the seed",
        }


def bigbench_texts() -> list[str] | None:
    """Every BIG-Bench task input of the tasks extracted to the cache (``make bigbench`` and one
    ``cot --data bbh:TASK`` extract them), or None where none is there."""
    from ..cot.data import BBH_TASKS, extract_tasks, find_sdist
    from ..models.loading import cache_dir

    root = cache_dir() / "bigbench"
    files = sorted(root.glob("**/task.json")) if root.is_dir() else []
    if not files:
        sdist = find_sdist()
        if sdist is None:
            return None
        extract_tasks(sdist, list(BBH_TASKS), root)
        files = sorted(root.glob("**/task.json"))
    out: list[str] = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError):
            continue
        for ex in doc.get("examples", []) if isinstance(doc, dict) else []:
            if isinstance(ex, dict) and isinstance(ex.get("input"), str) and ex["input"].strip():
                out.append(ex["input"].strip())
    return out or None


def source_texts(spec: str) -> dict[str, list[str]]:
    """``{source: texts}`` of a comma-separated spec (``mix`` expands to :data:`MIX`; bigbench is skipped
    there when absent, refused when named alone and absent)."""
    from ..data.loaders import load_dataset

    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise StreetlampError("give a corpus: mix, tweets, drugs, movies, recall, bigbench or a .csv/.jsonl file")
    out: dict[str, list[str]] = {}
    for name in names:
        for n in MIX if name == "mix" else (name,):
            if n in out:
                continue
            if n == "bigbench":
                bb = bigbench_texts()
                if bb is None:
                    if name == "mix":
                        continue
                    raise StreetlampError(
                        "bigbench: no BIG-Bench task text in the cache and no archive (make bigbench fetches it)"
                    )
                out[n] = bb
            else:
                out[n] = [e.text for e in load_dataset(n, labels=False).examples]
    return out


@torch.no_grad()
def generate_texts(
    adapter: ModelAdapter, prompts: Sequence[str], n_tokens: int, seed: int, max_new: int = 64
) -> list[str]:
    """About ``n_tokens`` tokens the model samples itself (temperature 1, top-k 50, seeded), ``max_new`` per
    prompt, cycling over ``prompts`` (each cut to its first 6 words)."""
    if n_tokens <= 0:
        return []
    tok = adapter.tokenizer
    out: list[str] = []
    got = 0
    g = torch.Generator().manual_seed(seed)
    i = 0
    while got < n_tokens:
        words = prompts[i % len(prompts)].split()[:6]
        i += 1
        ids = [adapter.empty_context_token(), *tok(" ".join(words), add_special_tokens=False)["input_ids"]]
        x = torch.tensor([ids], device=adapter.device)
        new: list[int] = []
        for _ in range(min(max_new, n_tokens - got)):
            logits = adapter.hf_model(input_ids=x, use_cache=False).logits[0, -1].float().cpu()
            top = torch.topk(logits, 50)
            p = torch.softmax(top.values, -1)
            nxt = int(top.indices[torch.multinomial(p, 1, generator=g)])
            if nxt in adapter.eos_token_ids:
                break
            new.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]], device=x.device)], 1)
        got += len(new)
        out.append(str(tok.decode(ids[1:] + new)))
    return out


def build_corpus(
    adapter: ModelAdapter,
    spec: str,
    *,
    tokens: int,
    seq_len: int,
    heldout: int,
    seed: int,
    generated: int = 0,
) -> Corpus:
    """At most ``tokens`` training tokens per epoch plus ``heldout`` sequences, mixed from ``spec`` (and
    ``generated`` tokens of the model's own text); fewer where the sources hold fewer (training then
    runs several epochs over them)."""
    if seq_len <= SKIP_FIRST:
        raise StreetlampError(f"--seq-len {seq_len}: a sequence needs more than {SKIP_FIRST} token")
    texts = source_texts(spec)
    rng = np.random.default_rng(seed)
    if generated > 0:
        prompts = [t for ts in texts.values() for t in ts[:50]] or ["The"]
        texts["generated"] = generate_texts(adapter, prompts, generated, seed)
    shuffled = {k: [v[i] for i in rng.permutation(len(v))] for k, v in texts.items()}
    want = (tokens // (seq_len - SKIP_FIRST) + 1 + heldout) * seq_len
    sep = adapter.empty_context_token()
    stream_ids: list[int] = []
    counts = dict.fromkeys(shuffled, 0)
    used = dict.fromkeys(shuffled, 0)
    names = list(shuffled)
    tok = adapter.tokenizer
    while len(stream_ids) < want:
        live = [n for n in names if used[n] < len(shuffled[n])]
        if not live:
            break
        n = min(live, key=lambda k: (counts[k], names.index(k)))
        text = shuffled[n][used[n]]
        used[n] += 1
        ids = tok(text, add_special_tokens=False)["input_ids"]
        piece = [sep, *(int(i) for i in ids)]
        stream_ids.extend(piece)
        counts[n] += len(piece)
    n_seq = len(stream_ids) // seq_len
    if n_seq <= heldout:
        raise StreetlampError(
            f"the corpus {spec!r} gives {n_seq} sequences of {seq_len} tokens: not more than the {heldout} held out"
        )
    seqs = torch.tensor(stream_ids[: n_seq * seq_len], dtype=torch.long).view(n_seq, seq_len)
    seqs = seqs[torch.as_tensor(rng.permutation(n_seq))]
    sources = {
        k: {"texts": used[k], "texts_available": len(shuffled[k]), "tokens": counts[k]} for k in shuffled if used[k]
    }
    return Corpus(seqs, heldout, seq_len, seed, sources)


def sequence_order(n: int, first: int, count: int, seed: int) -> np.ndarray:
    """Training-sequence indices of global sequences ``first .. first + count`` (epoch 0 in corpus order,
    every later epoch a permutation seeded with ``(seed, epoch)``)."""
    out = np.empty(count, dtype=np.int64)
    perms: dict[int, np.ndarray] = {}
    for j, i in enumerate(range(first, first + count)):
        e = i // n
        if e not in perms:
            perms[e] = np.arange(n) if e == 0 else np.random.default_rng([seed, e]).permutation(n)
        out[j] = perms[e][i % n]
    return out


def _mlp_module(adapter: ModelAdapter, layer: int) -> torch.nn.Module:
    from ..models.sites import submodule

    if adapter.family.mlp is None:
        raise StreetlampError(
            f"{adapter.family.name}: a transcoder needs the MLP's input as one module's input, and this family's MLP "
            "is split across modules around a post-norm; use --kind sae"
        )
    return submodule(adapter.layer_modules[layer], adapter.family.mlp)


@torch.no_grad()
def site_activations(
    adapter: ModelAdapter, ids: torch.Tensor, layers: Sequence[int], where: str
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (input, target)}``, each ``[rows, pos, d]`` on the model's device, of unpadded rows ``ids``:
    the dictionary's input and what it reconstructs (resid_pre twice for an SAE; the MLP's input and
    ``mlp.out`` for a transcoder)."""
    from ..models.adapter import Inputs

    inputs = Inputs.from_ids(adapter, ids, strings=False)
    if where == "resid_pre":
        sites = [f"layers.{l}.resid_pre" for l in layers]
        cache = adapter.forward(inputs, record=sites).cache
        return {l: (cache[s], cache[s]) for l, s in zip(layers, sites, strict=True)}
    if where != "mlp":
        raise StreetlampError(f"a dictionary reads resid_pre or mlp, not {where!r}")
    got: dict[int, torch.Tensor] = {}
    handles = []
    for l in layers:

        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, l: int = l) -> None:
            got[l] = args[0] if args else kwargs["hidden_states"]

        handles.append(_mlp_module(adapter, l).register_forward_pre_hook(hook, with_kwargs=True))
    try:
        sites = [f"layers.{l}.mlp.out" for l in layers]
        cache = adapter.forward(inputs, record=sites).cache
    finally:
        for h in handles:
            h.remove()
    return {l: (got[l], cache[s]) for l, s in zip(layers, sites, strict=True)}


@dataclass
class Shard:
    """One shard: ``index`` (its number in the stream), the token ids it read ``[n_tokens]`` and, per layer,
    the shuffled ``(input, target)`` rows ``[n_tokens, d]`` (float32 on the model's device)."""

    index: int
    sequences: np.ndarray
    token_ids: torch.Tensor
    acts: dict[int, tuple[torch.Tensor, torch.Tensor]]


def stream(
    adapter: ModelAdapter,
    train: torch.Tensor,
    layers: Sequence[int],
    where: str,
    *,
    batch_seqs: int,
    seed: int,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[Shard]:
    """Shards ``start, start + 1, ... < stop`` (endless when None) of the seeded order (module docstring)."""
    n = int(train.shape[0])
    if n == 0:
        raise StreetlampError("no training sequence")
    b = start
    while stop is None or b < stop:
        order = sequence_order(n, b * batch_seqs, batch_seqs, seed)
        ids = train[torch.as_tensor(order)]
        raw = site_activations(adapter, ids, layers, where)
        g = torch.Generator().manual_seed(int(np.random.default_rng([seed, b, 7]).integers(2**62)))
        n_tok = ids.shape[0] * (ids.shape[1] - SKIP_FIRST)
        perm = torch.randperm(n_tok, generator=g)
        acts = {}
        for l, (x, y) in raw.items():
            xs = x[:, SKIP_FIRST:].reshape(n_tok, -1).float()
            ys = y[:, SKIP_FIRST:].reshape(n_tok, -1).float()
            p = perm.to(xs.device)
            acts[l] = (xs[p], ys[p])
        yield Shard(b, order, ids[:, SKIP_FIRST:].reshape(-1)[perm], acts)
        b += 1
