"""The circuit graph: writers, readers and the edges between them (METHODS.md §9).

Every node writes to the residual stream; a reader's input is the sum of the outputs of every
earlier writer. **Writers** (in forward order): ``embed``, then per layer every head ``L{l}.H{h}``
(its output ``z_h W_O,h``, the ``layers.{l}.attn.head_out`` site) and the MLP ``L{l}.MLP`` (the
``layers.{l}.mlp.out`` site). **Readers**: per layer each head's query input ``(L{l}.H{h}, q)``, the
key and value inputs ``(·, k)`` and ``(·, v)``, the MLP input ``(L{l}.MLP, mlp)``, and at the end
``(logits, logits)``. An edge ``u -> r`` joins a writer to every later reader (a head of layer l
reads the writers before layer l; the MLP of layer l also reads layer l's heads).

Grouped-query attention: a layer with ``kv < heads`` computes each key and value once per group of
``heads / kv`` query heads, so the engine's k and v readers are the groups, ``L{l}.KV{g}`` (heads
``g * heads/kv .. (g+1) * heads/kv - 1``); without grouping they are the heads themselves. Nothing is
ever repeated per query head at the width of the residual stream. The outputs name heads only
(``L{l}.H{h}``, as the issue's tables do): :meth:`Graph.edges_table` lists a group's edge once under each
query head that reads it, with the group in ``kv_group`` and the model's edge in ``edge`` (the rows of one
edge share it: count or sum edges over unique ``edge``); :meth:`Graph.target_label` names a reader by its
heads for printing, and :meth:`Graph.reader_index` maps a head (or group) name and input back to the reader.

Constants that no writer owns (the output-projection bias ``b_O``) are added to every later reader
unchanged by any ablation.

Mixture-of-experts layers as expert nodes (``experts[l] > 0``; ``circuit --expert-nodes``): layer l's MLP
writer is split into one writer per routed expert, ``L{l}.E{e}`` (its routed, weighted output
``w_e(x_router) E_e(x_e)``, zero at the tokens not routed to it), and ``L{l}.SE`` for a shared expert (its
gated output); their sum is the block's output. Its readers: the router's input ``(L{l}.router, router)``
(it feeds the weight of every routed expert: its ``owners`` are the layer's routed experts), each expert's
input ``(L{l}.E{e}, mlp)`` and the shared expert's ``(L{l}.SE, mlp)`` (its gate reads that input too).
Like a layer's heads, a layer's experts read the writers before them (the layer's heads included), not each
other. A layer with ``experts[l] == 0`` keeps its one ``L{l}.MLP`` node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Reader:
    node: str  # the node whose input this is ("L3.H2", "L3.KV1": a key/value group, "L3.MLP", "logits")
    input: str  # q | k | v | mlp | logits
    layer: int  # n_layers for the logits
    owners: tuple[int, ...]  # writer indices this input feeds (a group's heads; the logits: none)


@dataclass(frozen=True)
class Graph:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    # per layer: routed experts as nodes (0: one MLP node); empty: none anywhere
    experts: tuple[int, ...] = ()
    shared: tuple[bool, ...] = ()  # per layer with experts: a shared expert node too
    writers: tuple[str, ...] = field(init=False)
    readers: tuple[Reader, ...] = field(init=False)
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)  # per layer: first writer, first reader

    def __post_init__(self) -> None:
        L, H, KV = self.n_layers, self.n_heads, self.n_kv_heads
        if H % KV:
            raise ValueError(f"{H} heads do not split into {KV} key/value groups")
        if self.experts and len(self.experts) != L or self.shared and len(self.shared) != len(self.experts):
            raise ValueError(f"experts {self.experts} / shared {self.shared} do not give one entry per layer ({L})")
        w = ["embed"]
        r: list[Reader] = []
        starts: list[int] = []
        G = H // KV
        for l in range(L):
            first = len(w)
            starts += [first, len(r)]
            E = self.experts[l] if self.experts else 0
            if E:
                shared = bool(self.shared and self.shared[l])
                mlp = [f"L{l}.E{e}" for e in range(E)] + ([f"L{l}.SE"] if shared else [])
            else:
                mlp = [f"L{l}.MLP"]
            w += [f"L{l}.H{h}" for h in range(H)] + mlp
            r += [Reader(f"L{l}.H{h}", "q", l, (first + h,)) for h in range(H)]
            for inp in ("k", "v"):
                for g in range(KV):
                    node = f"L{l}.H{g}" if G == 1 else f"L{l}.KV{g}"
                    r.append(Reader(node, inp, l, tuple(first + g * G + i for i in range(G))))
            m0 = first + H
            if E:
                r.append(Reader(f"L{l}.router", "router", l, tuple(range(m0, m0 + E))))
            r += [Reader(name, "mlp", l, (m0 + i,)) for i, name in enumerate(mlp)]
        starts += [len(w), len(r)]
        r.append(Reader("logits", "logits", L, ()))
        object.__setattr__(self, "writers", tuple(w))
        object.__setattr__(self, "readers", tuple(r))
        object.__setattr__(self, "_starts", tuple(starts))

    # -- sizes and index ranges -------------------------------------------------------------------
    @property
    def n_writers(self) -> int:
        return len(self.writers)

    @property
    def n_readers(self) -> int:
        return len(self.readers)

    @property
    def has_experts(self) -> bool:
        return any(self.experts)

    def attn_readers(self, layer: int) -> range:
        """Reader indices of layer ``layer``'s q, k, v inputs (q per head, then k and v per group)."""
        start = self._starts[2 * layer + 1]
        return range(start, start + self.n_heads + 2 * self.n_kv_heads)

    def mlp_reader(self, layer: int) -> int:
        """The first of layer ``layer``'s MLP readers (the one ``mlp`` reader; with experts, the router's)."""
        return self.attn_readers(layer).stop

    def mlp_readers(self, layer: int) -> range:
        """Layer ``layer``'s MLP readers: ``(L{l}.MLP, mlp)``, or the router's, each expert's and the shared
        expert's inputs."""
        return range(self.mlp_reader(layer), self._starts[2 * layer + 3])

    def mlp_writers(self, layer: int) -> slice:
        """Writer indices of layer ``layer``'s MLP node(s): ``L{l}.MLP``, or its experts (then ``L{l}.SE``)."""
        return slice(self.layer_start(layer) + self.n_heads, self._starts[2 * layer + 2])

    @property
    def logits_reader(self) -> int:
        return self.n_readers - 1

    def layer_start(self, layer: int) -> int:
        """Index of layer ``layer``'s first head among the writers (= how many writers come before it)."""
        return self._starts[2 * layer]

    def n_upstream(self, reader: int) -> int:
        """How many writers (0 .. n-1) reader ``reader`` reads."""
        r = self.readers[reader]
        if r.input == "logits":
            return self.n_writers
        if r.input in ("mlp", "router"):
            return self.layer_start(r.layer) + self.n_heads
        return self.layer_start(r.layer)

    def blocks(self) -> list[tuple[str, slice]]:
        """Writer blocks in forward order: ``embed``, then per layer ``attn{l}`` (its heads) and ``mlp{l}``
        (its MLP node, or its experts together)."""
        out = [("embed", slice(0, 1))]
        for l in range(self.n_layers):
            s = self.layer_start(l)
            out += [(f"attn{l}", slice(s, s + self.n_heads)), (f"mlp{l}", self.mlp_writers(l))]
        return out

    # -- edges ----------------------------------------------------------------------------------------
    def valid(self) -> torch.Tensor:
        """``[reader, writer]`` bool: True where the edge exists (the writer comes before the reader)."""
        m = torch.zeros(self.n_readers, self.n_writers, dtype=torch.bool)
        for i in range(self.n_readers):
            m[i, : self.n_upstream(i)] = True
        return m

    @property
    def n_edges(self) -> int:
        return int(self.valid().sum())

    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(reader, writer) indices of every edge, in row-major order of :meth:`valid`."""
        r, w = np.nonzero(self.valid().numpy())
        return r, w

    def edge_names(self) -> list[tuple[str, str, str]]:
        """(source, target, input) of every edge, in the order of :meth:`edge_index`."""
        r, w = self.edge_index()
        return [(self.writers[j], self.readers[i].node, self.readers[i].input) for i, j in zip(r, w)]

    # -- names in the outputs: heads only -------------------------------------------------------------
    def kv_group(self, reader: int) -> str:
        """``L{l}.KV{g}`` for a grouped k or v reader, else ``""``."""
        r = self.readers[reader]
        return r.node if ".KV" in r.node else ""

    def target_heads(self, reader: int) -> list[str]:
        """The node names (``L{l}.H{h}``, ``L{l}.MLP``, ``logits``) that read reader ``reader``'s input:
        every head of a key/value group, else the one node."""
        r = self.readers[reader]
        return [self.writers[o] for o in r.owners] if self.kv_group(reader) else [r.node]

    def target_label(self, reader: int) -> str:
        """How a reader is printed: its node, or a group's heads joined by ``,`` (``L3.H0,L3.H1,L3.H2``)."""
        return ",".join(self.target_heads(reader))

    def reader_index(self, target: str, input: str) -> int:
        """The reader of ``input`` at ``target``: a node name, a head of a key/value group (its group's
        k/v reader), a group ``L{l}.KV{g}`` or a :meth:`target_label`."""
        head = target.split(",")[0]
        for i, r in enumerate(self.readers):
            if r.input == input and (r.node == target or head in self.target_heads(i)):
                return i
        raise KeyError(f"no {input} input at {target}")

    def edges_table(self, scores: torch.Tensor | np.ndarray, method: str, **columns: np.ndarray):
        """A pandas DataFrame of every edge: ``source``, ``target``, ``input``, ``score``, ``method``,
        ``kv_group``, ``edge`` and any extra per-edge columns (arrays ``[reader, writer]`` like ``scores``,
        or per edge). Targets are heads: an edge into a key/value group's k or v input is one row per
        head of the group (its ``kv_group`` named; every column equal, ``edge`` its index in
        :meth:`edge_index`); other edges are one row each (``kv_group`` empty)."""
        import pandas as pd

        r, w = self.edge_index()
        s = np.asarray(scores.detach().cpu() if isinstance(scores, torch.Tensor) else scores)
        heads = [self.target_heads(i) for i in range(self.n_readers)]
        groups = [self.kv_group(i) for i in range(self.n_readers)]
        rep = np.array([len(heads[i]) for i in r])
        e = np.repeat(np.arange(len(r)), rep)
        data = {
            "source": [self.writers[j] for j in w[e]],
            "target": [t for i in r for t in heads[i]],
            "input": [self.readers[i].input for i in r[e]],
            "score": s[r, w].astype(np.float64)[e],
            "method": method,
            "kv_group": [groups[i] for i in r[e]],
            "edge": e,
        }
        for k, v in columns.items():
            a = np.asarray(v)
            data[k] = (a[r, w] if a.ndim == 2 else a)[e]
        return pd.DataFrame(data)
