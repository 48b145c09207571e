"""Exact maximum flow on the layered attention graph (attention flow, Abnar & Zuidema 2020).

The graph has nodes ``(l, i)``, ``l = 0..L``, ``i = 0..S-1`` and an edge ``(l-1, j) -> (l, i)`` of
capacity ``caps[l-1, i, j]`` (``caps[l-1] = Â_l``, rows = the receiving position). ``Flow[i, j]`` is
the value of a maximum flow from ``(0, j)`` to ``(L, i)``.

Algorithm: Dinic's blocking flows on the *dense* layered representation, compiled with numba,
in float64 (no integer scaling, so values agree with networkx's float max-flow to ~1e-12).
Each node's arcs are implicit: forward arcs ``(l, i) -> (l+1, m)`` with residual
``caps[l, m, i] - flow[l, m, i]``, backward arcs ``(l, i) -> (l-1, j)`` with residual
``flow[l-1, i, j]``. Residuals at or below ``EPS`` count as saturated (zero-capacity edges, e.g.
the causal mask's, are never used). Layer-0 nodes other than the source and layer-L nodes other
than the sink carry no flow in any feasible flow, so they are never visited. Each pair is an
independent max-flow problem (a super-source would give the flow of a set, not per-pair values).

Cost per pair: one BFS is ``O(L·S²)``; Dinic needs few phases on these graphs (measured in
``benchmarks/bench_flow.py``), so a row of S pairs costs roughly ``O(phases · L · S³)``.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a dependency; the pure-Python fallback only keeps imports working without it
    from numba import njit
except ImportError:  # pragma: no cover

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        def wrap(f):
            return f

        return wrap if not args or not callable(args[0]) else args[0]


EPS = 1e-13


@njit(cache=True, nogil=True, inline="always")
def _residual(caps: np.ndarray, flow: np.ndarray, a: int, b: int, S: int) -> float:
    la = a // S
    lb = b // S
    if lb == la + 1:
        return caps[la, b - lb * S, a - la * S] - flow[la, b - lb * S, a - la * S]
    return flow[lb, a - la * S, b - lb * S]


@njit(cache=True, nogil=True)
def _max_flow_pair(
    caps: np.ndarray,
    src: int,
    sink: int,
    flow: np.ndarray,
    level: np.ndarray,
    ptr: np.ndarray,
    queue: np.ndarray,
    stack: np.ndarray,
    eps: float,
) -> float:
    L = caps.shape[0]
    S = caps.shape[1]
    flow[:] = 0.0
    total = 0.0
    n_nodes = (L + 1) * S
    s_node = src
    t_node = L * S + sink
    upper = min(caps[0, :, src].sum(), caps[L - 1, sink, :].sum())
    while True:
        # BFS levels in the residual graph
        level[:] = -1
        level[s_node] = 0
        head = 0
        tail = 0
        queue[tail] = s_node
        tail += 1
        while head < tail:
            u = queue[head]
            head += 1
            l = u // S
            i = u - l * S
            lu = level[u]
            if l < L:
                if l == L - 1:  # forward only to the sink
                    v = t_node
                    if level[v] < 0 and caps[l, sink, i] - flow[l, sink, i] > eps:
                        level[v] = lu + 1
                        queue[tail] = v
                        tail += 1
                else:
                    for m in range(S):
                        v = (l + 1) * S + m
                        if level[v] < 0 and caps[l, m, i] - flow[l, m, i] > eps:
                            level[v] = lu + 1
                            queue[tail] = v
                            tail += 1
            if 1 < l <= L - 1 or (l == 1 and L > 1):
                for j in range(S):
                    v = (l - 1) * S + j
                    if l - 1 == 0 and j != src:
                        continue
                    if level[v] < 0 and flow[l - 1, i, j] > eps:
                        level[v] = lu + 1
                        queue[tail] = v
                        tail += 1
        if level[t_node] < 0:
            break
        ptr[:n_nodes] = 0
        # blocking flow: DFS with current-arc pointers (arcs 0..S-1 forward, S..2S-1 backward);
        # after an augmentation the search resumes at the tail of the first saturated arc
        depth = 0
        stack[0] = s_node
        while True:
            u = stack[depth]
            if u == t_node:
                bott = 1e300
                for d in range(depth):
                    r = _residual(caps, flow, stack[d], stack[d + 1], S)
                    if r < bott:
                        bott = r
                first = depth
                for d in range(depth):
                    a = stack[d]
                    b = stack[d + 1]
                    la = a // S
                    lb = b // S
                    if lb == la + 1:
                        flow[la, b - lb * S, a - la * S] += bott
                    else:
                        flow[lb, a - la * S, b - lb * S] -= bott
                    if first == depth and _residual(caps, flow, a, b, S) <= eps:
                        first = d
                total += bott
                depth = first
                continue
            l = u // S
            i = u - l * S
            advanced = False
            while ptr[u] < 2 * S:
                a = ptr[u]
                if a < S:
                    if l < L and (l < L - 1 or a == sink):
                        v = (l + 1) * S + a
                        if level[v] == level[u] + 1 and caps[l, a, i] - flow[l, a, i] > eps:
                            advanced = True
                            break
                else:
                    j = a - S
                    if l >= 1 and l < L and (l > 1 or j == src):
                        v = (l - 1) * S + j
                        if level[v] == level[u] + 1 and flow[l - 1, i, j] > eps:
                            advanced = True
                            break
                ptr[u] += 1
            if advanced:
                stack[depth + 1] = v
                depth += 1
            else:
                level[u] = -2  # dead end for the rest of this phase
                if depth == 0:
                    break
                depth -= 1
                ptr[stack[depth]] += 1
        if total >= upper * (1.0 - 1e-13):
            break  # the source or sink cut is saturated: this is the maximum
    return total


@njit(cache=True, nogil=True)
def _flow_pairs(caps: np.ndarray, sinks: np.ndarray, srcs: np.ndarray, eps: float) -> np.ndarray:
    L = caps.shape[0]
    S = caps.shape[1]
    n = (L + 1) * S
    flow = np.zeros_like(caps)
    level = np.empty(n, np.int64)
    ptr = np.zeros(n, np.int64)
    queue = np.empty(n, np.int64)
    stack = np.empty(L + 2 + 2 * n, np.int64)
    out = np.empty(sinks.shape[0], np.float64)
    for p in range(sinks.shape[0]):
        if L == 1:
            out[p] = caps[0, sinks[p], srcs[p]]
        else:
            out[p] = _max_flow_pair(caps, srcs[p], sinks[p], flow, level, ptr, queue, stack, eps)
    return out


def layered_max_flow(caps: np.ndarray, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
    """``Flow[i, j]`` for output positions ``rows`` (all when None): ``[len(rows), S]`` float64.

    ``caps``: ``[L, S, S]`` nonnegative capacities, ``caps[l-1, i, j]`` on edge ``(l-1, j) -> (l, i)``.
    """
    caps = np.ascontiguousarray(caps, dtype=np.float64)
    if caps.ndim != 3 or caps.shape[1] != caps.shape[2]:
        raise ValueError(f"capacities must be [layer, S, S], got {caps.shape}")
    if np.any(caps < 0) or not np.all(np.isfinite(caps)):
        raise ValueError("capacities must be finite and nonnegative")
    S = caps.shape[1]
    rows = np.arange(S) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
    sinks = np.repeat(rows, S).astype(np.int64)
    srcs = np.tile(np.arange(S, dtype=np.int64), len(rows))
    return _flow_pairs(caps, sinks, srcs, EPS).reshape(len(rows), S)


def networkx_graph(caps: np.ndarray):
    """The same layered graph as a networkx DiGraph (nodes ``(l, i)``), for the reference computation."""
    import networkx as nx

    L, S, _ = caps.shape
    g = nx.DiGraph()
    for l in range(1, L + 1):
        for i in range(S):
            for j in range(S):
                g.add_edge((l - 1, j), (l, i), capacity=float(caps[l - 1, i, j]))
    return g
