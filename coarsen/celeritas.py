"""Celeritas-style coarsening: CPD-TOPO order + breakpoint fusion, for comparison.

1. **CPD-TOPO order** (our reading of Celeritas): a topological order that
   follows the critical path depth-first: among ready ops, prefer the ones
   made ready most recently (so producer and consumer stay adjacent), then the
   largest bottom level (longest compute path to a sink).
2. **Breakpoints** (Kernighan 1971's optimal sequential partitioning): cut the
   order into contiguous segments minimising the communication cut, by a
   dynamic program over the last breakpoint within range ``R`` ops, subject
   to a memory limit per segment (persistent + output bytes) and a common
   device kind. ``f[j] = min_i f[i] + C(i, j)`` with ``C(i, j)`` the cost of
   edges leaving segment ``[i, j)`` forward, maintained incrementally in
   O(R) numpy work per op.
3. If more segments than ``target_vertices`` remain, adjacent segments with
   the smallest combined compute are fused (still contiguous, so still
   acyclic) until the target is met.

Contiguous segments of a topological order can never form a cycle.
Edge costs are ``beta0 + beta1 * bytes`` per edge with bytes > 0 (a tensor
read by two consumers in one later segment is counted twice, as Celeritas does
on edges).
"""
from __future__ import annotations

import heapq
import math
import time

import numpy as np

from pesto.dag import UnionFind, bottom_levels
from pesto.graph import OpGraph
from pesto.problem import GraphArrays

from .base import CoarsenReport, beta_of, build_coarse

__all__ = ["coarsen_celeritas", "cpd_topo_order"]


def cpd_topo_order(ga: GraphArrays) -> list[int]:
    """CPD-TOPO: depth-first along the critical path; returns op indices.

    Among ready ops, the one made ready last first, then the largest bottom
    level (compute on the fastest kind), then the smallest index. Not
    :func:`pesto.dag.priority_order`: the "made ready last" key is only known
    while the order is built.

    >>> g = OpGraph.from_edges({"s": 1, "a": 1, "b": 5, "c": 1}, [("s", "a"), ("s", "b"), ("a", "c")])
    >>> [g.names[i] for i in cpd_topo_order(GraphArrays.of(g))]
    ['s', 'b', 'a', 'c']
    """
    graph = ga.graph
    succ = graph.succ_idx()
    indeg = [len(p) for p in graph.pred_idx()]
    bl = bottom_levels(succ, ga.time.tolist(), order=graph.topo_idx())
    heap = [(0, -bl[i], i) for i in range(ga.n) if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    step = 0
    while heap:
        _, _, u = heapq.heappop(heap)
        order.append(u)
        step -= 1
        for w in succ[u]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (step, -bl[w], w))
    return order


def _breakpoints(ga: GraphArrays, order: list[int], R: int, mem_limit: float, beta) -> list[int]:
    """Segment id per position of ``order`` (Kernighan DP)."""
    n = ga.n
    pos = np.empty(n, dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(n)
    eb = np.zeros(len(ga.esrc))
    if len(ga.pu):
        # bytes per edge = sum of its tensors
        eb = np.bincount(ga.pe, weights=ga.tbytes[ga.pt], minlength=len(ga.esrc))
    w = np.where(eb > 0, beta[0] + beta[1] * eb, 0.0)
    ps, pd = pos[ga.esrc], pos[ga.edst]
    out = np.bincount(ps, weights=w, minlength=n).tolist()
    # incoming (src position, weight) per destination position
    o = np.lexsort((ps, pd))
    inc_src, inc_w, inc_dst = ps[o].tolist(), w[o].tolist(), pd[o]
    inc_off = np.searchsorted(inc_dst, np.arange(n + 1)).tolist()
    mask = ga.mask[np.asarray(order, dtype=np.int64)] if n else ga.mask
    mem = (ga.pers + ga.out)[np.asarray(order, dtype=np.int64)] if n else np.zeros(0)
    P = np.concatenate([[0.0], np.cumsum(mem, dtype=float)])
    C = np.zeros(n + 1)
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    arg = np.zeros(n + 1, dtype=np.int64)
    for j in range(n):
        lo = max(0, j + 1 - R)
        if j > lo:
            C[lo:j] += out[j]
        C[j] = out[j]
        for k in range(inc_off[j], inc_off[j + 1]):
            q = inc_src[k]
            if q >= lo and inc_w[k]:
                C[lo:q + 1] -= inc_w[k]
        seg_mask = np.bitwise_and.accumulate(mask[lo:j + 1][::-1])[::-1]
        seg_mem = P[j + 1] - P[lo:j + 1]
        feas = (seg_mask != 0) & (seg_mem <= mem_limit)
        feas[-1] = True  # a single op is always a segment
        cand = np.where(feas, f[lo:j + 1] + C[lo:j + 1], np.inf)
        k = int(np.argmin(cand))
        f[j + 1] = cand[k]
        arg[j + 1] = lo + k
    cuts = []
    j = n
    while j > 0:
        cuts.append(j)
        j = int(arg[j])
    cuts.reverse()
    seg = np.zeros(n, dtype=np.int64)
    prev = 0
    for s, c in enumerate(cuts):
        seg[prev:c] = s
        prev = c
    return seg


def _fuse_adjacent(ga: GraphArrays, order, seg: np.ndarray, target: int) -> np.ndarray:
    """Fuse adjacent segments (smallest combined compute first) down to ``target``."""
    S = int(seg.max()) + 1 if len(seg) else 0
    if S <= target:
        return seg
    ordered = np.asarray(order, dtype=np.int64)
    tim = np.bincount(seg, weights=ga.time[ordered], minlength=S).tolist()
    msk = [-1] * S
    for s, mk in zip(seg.tolist(), ga.mask[ordered].tolist()):
        msk[s] &= mk
    nxt = list(range(1, S + 1))
    prv = list(range(-1, S - 1))
    alive = [True] * S
    sets = UnionFind(S)  # a < b always: each set's root is its leftmost segment
    heap = [(tim[s] + tim[s + 1], s, s + 1) for s in range(S - 1) if msk[s] & msk[s + 1]]
    heapq.heapify(heap)
    count = S
    while count > target and heap:
        c, a, b = heapq.heappop(heap)
        if not (alive[a] and alive[b] and nxt[a] == b and c == tim[a] + tim[b]):
            continue
        tim[a] += tim[b]
        msk[a] &= msk[b]
        alive[b] = False
        sets.union(a, b)
        nxt[a] = nxt[b]
        if nxt[b] < S:
            prv[nxt[b]] = a
        count -= 1
        for x, y in ((prv[a], a), (a, nxt[a])):
            if 0 <= x and y < S and msk[x] & msk[y]:
                heapq.heappush(heap, (tim[x] + tim[y], x, y))
    _, relabel = np.unique(np.asarray([sets.find(s) for s in range(S)]), return_inverse=True)
    return relabel.ravel()[seg]


def _repair_groups(ga: GraphArrays, label: np.ndarray, report) -> np.ndarray:
    """Split segments until every (united) colocation group keeps a common kind."""
    while True:
        m = int(label.max()) + 1
        vmask = np.full(m, -1, dtype=np.int64)
        np.bitwise_and.at(vmask, label, ga.mask)
        uf = UnionFind(len(ga.group_mask), masks=ga.group_mask)
        vg = {}
        for i in np.flatnonzero(ga.group >= 0).tolist():
            c = int(label[i])
            vg.setdefault(c, int(ga.group[i]))
            uf.union(vg[c], int(ga.group[i]))
        for c, g in vg.items():
            uf.mask[uf.find(g)] &= int(vmask[c])
        bad = {c for c, g in vg.items() if uf.mask[uf.find(g)] == 0}
        if not bad:
            return label
        report.notes.append(f"split {len(bad)} segments to keep colocation groups feasible")
        split = np.isin(label, list(bad))
        label = label.copy()
        label[split] = m + np.arange(int(split.sum()))
        _, label = np.unique(label, return_inverse=True)
        label = label.ravel()


def coarsen_celeritas(graph: OpGraph, target_vertices: int = 200, *, range_: int | None = None,
                      memory_limit: float | None = None, cluster=None, beta=None, fuse: bool = True):
    """Coarsen by CPD-TOPO order and Kernighan breakpoints.

    Parameters
    ----------
    range_ : int, optional
        Longest segment in ops (the DP's range R); default ``ceil(n / target)``, so
        the DP leaves at least ``target`` segments and step 3 fuses down to it.
    memory_limit : float, optional
        Bytes (persistent + outputs) per segment; default
        ``2 * total / target`` (at least the largest op).
    fuse : bool
        Fuse adjacent segments down to the target if the DP leaves more.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(400)}  # a 20 x 20 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(400) for j in (i + 20, i + 21) if j < 400])
    >>> cg = coarsen_celeritas(g, 40)
    >>> cg.graph.num_ops <= 40
    True
    """
    t0 = time.perf_counter()
    ga = GraphArrays.of(graph)
    n = ga.n
    target = max(1, int(target_vertices))
    report = CoarsenReport("celeritas", target, n, graph.num_edges)
    beta = beta or beta_of(cluster)
    R = int(range_ or max(1, math.ceil(n / target)))
    mem = (ga.pers + ga.out).astype(float)
    if memory_limit is None:
        memory_limit = max(2.0 * float(mem.sum()) / target, float(mem.max(initial=0.0)))
    t = time.perf_counter()
    order = cpd_topo_order(ga)
    report.rounds.append({"round": 1, "kind": "cpd-topo", "vertices": n, "edges": graph.num_edges,
                          "merged": 0, "seconds": round(time.perf_counter() - t, 5)})
    t = time.perf_counter()
    seg = _breakpoints(ga, order, R, memory_limit, beta)
    S = int(seg.max()) + 1 if n else 0
    report.rounds.append({"round": 2, "kind": "breakpoints", "vertices": n, "merged": n - S,
                          "range": R, "memory_limit": memory_limit,
                          "seconds": round(time.perf_counter() - t, 5)})
    if fuse and S > target:
        t = time.perf_counter()
        seg = _fuse_adjacent(ga, order, seg, target)
        report.rounds.append({"round": 3, "kind": "fuse-adjacent", "vertices": S,
                              "merged": S - (int(seg.max()) + 1),
                              "seconds": round(time.perf_counter() - t, 5)})
    label = np.empty(n, dtype=np.int64)
    label[np.asarray(order, dtype=np.int64)] = seg
    if (ga.group >= 0).any():
        label = _repair_groups(ga, label, report)
    return build_coarse(ga, label, report, beta=beta, t0=t0)
