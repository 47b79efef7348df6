"""Pesto's height-based batch merging (paper section 3.3, Theorem 3.5).

Heights come from a Kahn pass that removes all sources at once: roots have
height 1 and every edge goes strictly up (H(v) >= H(u) + 1). Each round sorts
the edges by transfer bytes (largest first; ties: smaller merged compute
first, to keep parallelism), greedily picks a matching of edges (u, v) that
satisfy the sufficient conditions of Theorem 3.5

(i)   the selected edges form a matching;
(ii)  |succ(u)| = 1, or |pred(v)| = 1, or H(v) = H(u) + 1, or every other
      successor w of u has H(w) > H(v);
(iii) for selected pairs i != j, not (H(u_i) == H(v_j) + d_j and
      (u_i, v_j) in E), with d_j = H(u_j) - H(v_j); i.e. no edge from u_i to
      v_j when u_i and u_j are at the same height (the paper's Figure 6),

merges them all, recomputes the heights and repeats until the target vertex
count is reached or nothing qualifies.

Why this never closes a cycle: a cycle in the merged graph needs a
"backward jump" inside some merged pair (enter at v_j, leave from u_j), which
loses H(v_j) - H(u_j) height; every fine edge gains at least 1. Pairs with
|succ(u)| = 1 or |pred(v)| = 1 cannot be entered at v and left at u. A pair
of the "other successors" kind is left through some w with H(w) > H(v): jump
plus exit gains > 0. A tight pair (H(v) = H(u) + 1) plus its exit edge gains
>= 0, with 0 only if the exit edge goes u_i -> v_j with H(u_i) = H(u_j), which
(iii) forbids. So the height change around any cycle would be > 0: no cycle.
The heights of the next round are recomputed by the same Kahn pass, which
would raise :class:`~pesto.errors.CycleError` if this ever failed.

Option ``order="gain"`` sorts the candidates instead by the transfer time a
merge saves (``beta0 + beta1 * bytes``) minus the growth of the compute
critical path it causes; the conditions and everything else are unchanged.

Parallelism is kept by caps on a merged vertex's compute time (fastest kind)
and op count (TF-Pesto: 12 ms and 80 ops). When a round merges (almost)
nothing the caps double, up to ``max_cap_growth`` times. Ops whose allowed
device kinds do not intersect are never merged, and a merge is refused when
it would leave a (united) colocation group with no common kind.

If edge merging stalls above the target (e.g. many independent ops), rounds
of *sibling* merges pair vertices at the same height (no path can join two
vertices of equal height, and a round of only equal-height merges changes no
height along any path, so it cannot close a cycle), smallest compute first.
"""
from __future__ import annotations

import time

import numpy as np

from pesto.dag import UnionFind
from pesto.graph import OpGraph
from pesto.problem import GraphArrays

from .base import DEFAULT_BETA, CoarsenReport, beta_of, build_coarse, coarse_edges, kahn_heights, path_levels

__all__ = ["coarsen_height", "select_pairs", "theorem35_ok", "MergeState"]

CAP_TIME_US = 12000.0  # TF-Pesto: 12 ms of compute per merged vertex
CAP_OPS = 80


class MergeState:
    """The current partition as arrays indexed by coarse vertex (no OpGraph)."""

    def __init__(self, ga: GraphArrays, part: np.ndarray | None = None):
        self.ga = ga
        self.m = ga.n
        self.label = np.arange(ga.n, dtype=np.int64)
        # partition label per vertex (merges stay inside a label); all 0 when none
        self.part = np.zeros(ga.n, dtype=np.int64) if part is None else np.asarray(part, dtype=np.int64).copy()
        self.comp = ga.comp.copy()
        self.mask = ga.mask.copy()
        self.cnt = np.ones(ga.n, dtype=np.int64)
        self.grp = ga.group.copy()  # union-find node of the vertex's group, or -1
        self.uf = UnionFind(len(ga.group_mask), masks=ga.group_mask)
        bits = 1 << np.arange(ga.K, dtype=np.int64)
        self._bits = bits

    def times(self, a, b=None):
        """Compute time (fastest kind allowed by all) of vertices ``a`` (merged with ``b``)."""
        comp = self.comp[a] if b is None else self.comp[a] + self.comp[b]
        mask = self.mask[a] if b is None else self.mask[a] & self.mask[b]
        ok = (mask[:, None] & self._bits[None, :]) != 0
        t = np.where(ok, comp, np.inf).min(axis=1) if self.ga.K else np.zeros(len(mask))
        return t

    def group_ok(self, u: int, v: int) -> bool:
        """Merging u and v leaves every colocation group with a common kind;
        if so, unite their groups now (selection is greedy and final)."""
        gu, gv = int(self.grp[u]), int(self.grp[v])
        if gu < 0 and gv < 0:
            return True
        uf = self.uf
        both = int(self.mask[u]) & int(self.mask[v])
        if gu >= 0 and gv >= 0:
            ru, rv = uf.find(gu), uf.find(gv)
            if uf.mask[ru] & uf.mask[rv] & both == 0:
                return False
            r = uf.union(ru, rv)
        else:
            r = uf.find(gu if gu >= 0 else gv)
            if uf.mask[r] & both == 0:
                return False
        uf.mask[r] &= both
        return True

    def merge(self, U: np.ndarray, V: np.ndarray) -> None:
        """Merge each V[i] into U[i] and relabel 0..m'-1. The V are distinct and
        no U is a V; a U may repeat (a whole cluster merged into one vertex)."""
        m = self.m
        np.add.at(self.comp, U, self.comp[V])
        np.bitwise_and.at(self.mask, U, self.mask[V])
        np.add.at(self.cnt, U, self.cnt[V])
        gV = self.grp[V]
        take = gV >= 0  # a vertex keeps one group id (the groups were united by group_ok)
        self.grp[U[take]] = np.where(self.grp[U[take]] >= 0, self.grp[U[take]], gV[take])
        rep = np.arange(m)
        rep[V] = U
        keep = np.ones(m, dtype=bool)
        keep[V] = False
        newid = np.cumsum(keep) - 1
        mp = newid[rep]
        self.label = mp[self.label]
        self.comp, self.mask, self.cnt, self.grp = (self.comp[keep], self.mask[keep], self.cnt[keep],
                                                    self.grp[keep])
        self.part = self.part[keep]  # U and V share their label
        self.m = int(keep.sum())


def _excl_min(m, key, other, val):
    """Per edge i: min of ``val[j]`` over the edges j with ``key[j] == key[i]`` and
    ``other[j] != other[i]`` (inf if none). (key, other) pairs are unique."""
    E = len(key)
    if E == 0:
        return np.zeros(0)
    o = np.lexsort((val, key))
    sk, sval, so = key[o], np.asarray(val, dtype=float)[o], other[o]
    start = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    min1 = np.full(m, np.inf)
    arg1 = np.full(m, -1)
    min2 = np.full(m, np.inf)
    min1[sk[start]] = sval[start]
    arg1[sk[start]] = so[start]
    sec = start + 1
    has2 = sec < E
    has2[has2] &= sk[sec[has2]] == sk[start[has2]]
    min2[sk[start[has2]]] = sval[sec[has2]]
    return np.where(other == arg1[key], min2[key], min1[key])


def _other_min(m, eu, ev, H):
    """Per edge: min height over the other successors of its source (inf if none)."""
    return _excl_min(m, eu, ev, H[ev])


def _merged_path(st, eu, ev, H, flat, off, tcomb, levels=None):
    """Per edge (u, v): length of the longest compute path through the vertex
    that merging u and v would make (other vertices unchanged); and the
    current critical path. ``levels``: the (top, bottom) levels if known."""
    m = st.m
    t = st.times(np.arange(m))
    top, bottom = path_levels(m, flat, off, H, t.tolist()) if levels is None else levels
    # start: u's own, or the latest other input of v
    fin = top + t
    v_in = -_excl_min(m, ev, eu, -fin[eu])
    start = np.maximum(top[eu], v_in)
    # after: the longest tail of u's other successors or of v's successors
    u_out = -_excl_min(m, eu, ev, -bottom[ev])
    tail = np.maximum(np.maximum(u_out, 0.0), bottom[ev] - t[ev])
    return start + tcomb + tail, float((top + bottom).max(initial=0.0))


def _select(st: MergeState, eu, ev, eb, H, flat, off, *, rule, cap_time, cap_ops, budget,
            order="bytes", beta=DEFAULT_BETA, path_limit=None, levels=None):
    """Greedy matching for one round. Returns arrays (U, V).

    ``order="bytes"``: candidates by transfer bytes, largest first (ties:
    smaller merged compute). ``order="gain"``: by the transfer time saved
    (``beta0 + beta1 * bytes``) minus the growth of the critical path that the
    merge would cause, largest first. ``path_limit``: only edges whose merged
    vertex lies on no compute path longer than this (each merge judged alone;
    :mod:`coarsen.parallel` checks the round as a whole). ``levels``: the
    current (top, bottom) levels, if known.
    """
    m = st.m
    Ha = np.asarray(H, dtype=np.int64)
    outdeg = np.bincount(eu, minlength=m)
    indeg = np.bincount(ev, minlength=m)
    tcomb = st.times(eu, ev)
    ok = ((st.mask[eu] & st.mask[ev]) != 0) & (st.cnt[eu] + st.cnt[ev] <= cap_ops) & (tcomb <= cap_time)
    ok &= st.part[eu] == st.part[ev]
    simple = (outdeg[eu] == 1) | (indeg[ev] == 1)
    if rule == "height":
        cond = simple | (Ha[ev] == Ha[eu] + 1) | (_other_min(m, eu, ev, Ha) > Ha[ev])
    elif rule == "baechi":
        cond = simple
    else:
        raise ValueError(f"unknown rule {rule!r}")
    pw = cp = None
    if path_limit is not None:
        pw, cp = _merged_path(st, eu, ev, H, flat, off, tcomb, levels)
        ok &= pw <= path_limit
    cand = np.flatnonzero(ok & cond)
    if len(cand) == 0 or budget <= 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if order == "gain":
        if pw is None:
            pw, cp = _merged_path(st, eu, ev, H, flat, off, tcomb, levels)
        comm = np.where(eb[cand] > 0, beta[0] + beta[1] * eb[cand], 0.0)
        gain = comm - np.maximum(0.0, pw[cand] - cp)
        o = np.lexsort((tcomb[cand], -gain))
    elif order == "bytes":
        o = np.lexsort((tcomb[cand], -eb[cand]))
    else:
        raise ValueError(f"order must be 'bytes' or 'gain', got {order!r}")
    cand = cand[o]
    cu, cv = eu[cand].tolist(), ev[cand].tolist()
    matched = bytearray(m)
    U, V = [], []
    if rule == "height":
        # predecessor lists for condition (iii)
        po = np.argsort(ev, kind="stable")
        pflat = eu[po].tolist()
        poff = np.searchsorted(ev[po], np.arange(m + 1)).tolist()
        # (iii) bookkeeping, updated once per selected pair (O(deg) each, so a hub
        # costs its degree once per round, not once per candidate):
        # src_block[x]: x is a predecessor of a selected v_j with H(x) == H(u_j);
        # dst_block: {v * HM + h}: v is a successor of a selected u_j with H(u_j) == h.
        src_block = bytearray(m)
        dst_block = set()
        HM = max(H, default=0) + 1
    has_groups = bool((st.grp >= 0).any())
    for u, v in zip(cu, cv):
        if matched[u] or matched[v]:
            continue
        if rule == "height":
            hu = H[u]
            if src_block[u] or v * HM + hu in dst_block:
                continue
        if has_groups and not st.group_ok(u, v):
            continue
        matched[u] = matched[v] = 1
        U.append(u)
        V.append(v)
        if len(U) >= budget:
            break
        if rule == "height":
            for x in pflat[poff[v]:poff[v + 1]]:
                if H[x] == hu:
                    src_block[x] = 1
            for w in flat[off[u]:off[u + 1]]:
                dst_block.add(w * HM + hu)
    return np.array(U, dtype=np.int64), np.array(V, dtype=np.int64)


def _select_siblings(st: MergeState, H, *, cap_time, cap_ops, budget, levels=None, path_limit=None):
    """Pairs of vertices at the same height with compatible kinds, smallest first.

    ``levels=(top, bottom)`` and ``path_limit``: only pairs whose merged
    vertex (start at the later top level) lies on no compute path longer than
    ``path_limit``, each pair judged alone.
    """
    Ha = np.asarray(H)
    t = st.times(np.arange(st.m))
    if path_limit is not None:
        top, bottom = levels

        def fits(a, b):  # the merged time is on the pair's common fastest kind
            tab = float(st.times(np.array([a]), np.array([b]))[0])
            return max(top[a], top[b]) + tab + max(bottom[a] - t[a], bottom[b] - t[b]) <= path_limit
    else:
        def fits(a, b):
            return True
    part = st.part
    o = np.lexsort((t, part, Ha))  # equal partition labels adjacent within a height
    U, V = [], []
    prev = -1
    cnt, mask = st.cnt, st.mask
    has_groups = bool((st.grp >= 0).any())
    for i in o.tolist():
        if prev >= 0 and H[prev] == H[i] and part[prev] == part[i] and mask[prev] & mask[i] \
                and cnt[prev] + cnt[i] <= cap_ops \
                and t[prev] + t[i] <= cap_time and fits(prev, i) and (not has_groups or st.group_ok(prev, i)):
            U.append(prev)
            V.append(i)
            prev = -1
            if len(U) >= budget:
                break
        else:
            prev = i
    return np.array(U, dtype=np.int64), np.array(V, dtype=np.int64)


def run_rounds(ga: GraphArrays, target: int, report: CoarsenReport, *, rule: str = "height",
               cap_time: float = CAP_TIME_US, cap_ops: int = CAP_OPS, cap_growth: float = 2.0,
               max_cap_growth: int = 16, min_gain: float = 0.02, siblings: bool = True,
               patience: int = 8, max_rounds: int = 300, order: str = "bytes",
               beta=DEFAULT_BETA, part: np.ndarray | None = None) -> np.ndarray:
    """Merge rounds until ``target`` vertices; returns the fine -> coarse labels.

    A round is *small* when it merges fewer than ``min_gain`` of the vertices
    above target. Small rounds first double the caps (``max_cap_growth``
    times). Once the caps are spent, a small edge round is followed by a
    sibling round; the run stops after ``patience`` small rounds in a row or
    when neither kind of round merges anything. ``part`` (an int label per
    fine op) restricts every merge to ops of equal label.
    """
    st = MergeState(ga, part)
    grown = 0
    stalls = 0
    want_siblings = False
    for rnd in range(max_rounds + 1):
        if st.m <= target:
            break
        if rnd == max_rounds:
            report.notes.append(f"stopped at {st.m} vertices after {max_rounds} rounds")
            break
        t = time.perf_counter()
        eu, ev, eb = coarse_edges(ga, st.label, st.m)
        H, flat, off = kahn_heights(st.m, eu, ev)  # raises CycleError if a round broke the DAG
        if rnd:
            report.rounds[-1]["edges_after"] = len(eu)
        budget = st.m - target
        kind = "edges"
        U = V = np.zeros(0, dtype=np.int64)
        if not want_siblings:
            U, V = _select(st, eu, ev, eb, H, flat, off, rule=rule, cap_time=cap_time, cap_ops=cap_ops,
                           budget=budget, order=order, beta=beta)
        relaxed = grown >= max_cap_growth
        # never mix edge and sibling merges in one round (the no-cycle argument needs it)
        if len(U) == 0 and relaxed and siblings:
            U, V = _select_siblings(st, H, cap_time=cap_time, cap_ops=cap_ops, budget=budget)
            kind = "siblings"
        before = st.m
        if len(U):
            st.merge(U, V)
        report.rounds.append({"round": rnd + 1, "kind": kind, "vertices": before, "edges": len(eu),
                              "merged": int(len(U)), "cap_time_us": cap_time, "cap_ops": cap_ops,
                              "seconds": round(time.perf_counter() - t, 5)})
        small = len(U) < max(1, int(min_gain * (before - target)))
        want_siblings = False
        if not small or st.m <= target:
            stalls = 0
        elif grown < max_cap_growth:
            cap_time *= cap_growth
            cap_ops = int(np.ceil(cap_ops * cap_growth))
            grown += 1
        elif len(U) == 0:
            report.notes.append(f"stopped at {st.m} vertices: nothing qualifies")
            break
        else:
            stalls += 1
            if stalls >= patience:
                report.notes.append(f"stopped at {st.m} vertices: {patience} rounds in a row merged "
                                    f"less than {min_gain:.0%} of the excess")
                break
            want_siblings = siblings and kind == "edges"
    eu, ev, _ = coarse_edges(ga, st.label, st.m)
    kahn_heights(st.m, eu, ev)
    if report.rounds:
        report.rounds[-1]["edges_after"] = len(eu)
    return st.label


def coarsen_height(graph: OpGraph, target_vertices: int = 200, *, cluster=None, beta=None,
                   rule: str = "height", partition=None, **options):
    """Coarsen ``graph`` to about ``target_vertices`` by height-based batch merging.

    Parameters
    ----------
    graph : OpGraph
    target_vertices : int
    cluster : Cluster, optional
        Its first GPU route's beta gives the CCR in the report (and the
        transfer times of ``order="gain"``).
    beta : (beta0, beta1), optional
        Overrides ``cluster``.
    rule : {"height", "baechi"}
        Merge condition; "baechi" is used by :func:`coarsen.baechi.coarsen_baechi`.
    partition : mapping op -> label, or a list of such mappings, optional
        Never merge two ops whose labels differ (in any of the mappings), so a
        plan whose placement is such a partition stays exactly representable
        on the coarse graph (see :meth:`CoarseGraph.project`). Ops missing from
        a mapping get the label ``None``.
    **options
        ``cap_time`` (µs, default 12000), ``cap_ops`` (80), ``cap_growth`` (2.0),
        ``max_cap_growth`` (16 doublings), ``min_gain`` (grow caps when a round
        merges fewer than this fraction of the vertices above target),
        ``siblings`` (True), ``patience`` (8 small rounds in a row after the
        caps are spent), ``max_rounds`` (300), ``order`` ("bytes": the paper's
        order, largest transfer first; "gain": transfer time saved minus the
        critical-path growth the merge causes, which keeps more parallelism on
        RNN-like graphs; see benchmarks/results/coarsen.md).

    Returns
    -------
    CoarseGraph

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(500)}  # a 25 x 20 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(500) for j in (i + 20, i + 21) if j < 500])
    >>> cg = coarsen_height(g, 50)
    >>> cg.graph.num_ops <= 50, sum(map(len, cg.members.values()))
    (True, 500)
    """
    t0 = time.perf_counter()
    ga = GraphArrays.of(graph)
    report = CoarsenReport(rule, int(target_vertices), graph.num_ops, graph.num_edges)
    beta = beta or beta_of(cluster)
    part = partition_ids(graph, partition)
    label = run_rounds(ga, max(1, int(target_vertices)), report, rule=rule, beta=beta, part=part, **options)
    if options.get("order", "bytes") != "bytes":
        report.method += f"/{options['order']}"
    if part is not None:
        report.method += "/partition"
        report.notes.append(f"merges restricted to {int(part.max()) + 1 if len(part) else 0} partition classes")
    return build_coarse(ga, label, report, beta=beta, t0=t0)


def partition_ids(graph: OpGraph, partition) -> np.ndarray | None:
    """Int class per op of ``graph`` (ops equal in every mapping share one), or None.

    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b"), ("b", "c")])
    >>> partition_ids(g, [{"a": 0, "b": 0, "c": 1}, {"a": "x", "b": "y", "c": "y"}]).tolist()
    [0, 1, 2]
    """
    if partition is None:
        return None
    maps = [partition] if hasattr(partition, "get") else list(partition)
    if not maps:
        return None
    ids: dict = {}
    return np.array([ids.setdefault(tuple(m.get(op) for m in maps), len(ids)) for op in graph.names],
                    dtype=np.int64)


# -- the selection on an OpGraph, for tests and teaching -------------------------------
def _arrays_of(graph: OpGraph):
    ga = GraphArrays.of(graph)
    st = MergeState(ga)
    eu, ev, eb = coarse_edges(ga, st.label, st.m)
    H, flat, off = kahn_heights(st.m, eu, ev)
    return ga, st, eu, ev, eb, H, flat, off


def select_pairs(graph: OpGraph, *, rule: str = "height", cap_time: float = float("inf"),
                 cap_ops: int = 1 << 62) -> list[tuple[str, str]]:
    """The pairs one round of batch merging would select on ``graph`` (no caps by default).

    >>> g = OpGraph.from_edges({"A": 1, "B": 1, "C": 1, "D": 1},
    ...     [("A", "C", 40), ("B", "D", 30), ("A", "D", 20), ("B", "C", 10)])
    >>> select_pairs(g)       # (A, C) and (B, D) together would close a cycle
    [('A', 'C')]
    """
    ga, st, eu, ev, eb, H, flat, off = _arrays_of(graph)
    U, V = _select(st, eu, ev, eb, H, flat, off, rule=rule, cap_time=cap_time, cap_ops=cap_ops,
                   budget=graph.num_ops)
    names = graph.names
    return [(names[u], names[v]) for u, v in zip(U.tolist(), V.tolist())]


def theorem35_ok(graph: OpGraph, pairs) -> bool:
    """Whether ``pairs`` (edges (u, v)) satisfy conditions (i)-(iii) on ``graph``.

    >>> g = OpGraph.from_edges({"A": 1, "B": 1, "C": 1, "D": 1},
    ...     [("A", "C"), ("B", "D"), ("A", "D"), ("B", "C")])
    >>> theorem35_ok(g, [("A", "C")]), theorem35_ok(g, [("A", "C"), ("B", "D")])
    (True, False)
    """
    ga, st, eu, ev, eb, H, flat, off = _arrays_of(graph)
    idx = graph.index
    P = [(idx[u], idx[v]) for u, v in pairs]
    ends = [x for p in P for x in p]
    if len(set(ends)) != len(ends):
        return False  # (i)
    succ = {i: set(flat[off[i]:off[i + 1]]) for i in range(ga.n)}
    pred_n = np.bincount(ev, minlength=ga.n)
    for u, v in P:
        if v not in succ[u]:
            return False
        others = [H[w] for w in succ[u] if w != v]
        if not (len(succ[u]) == 1 or pred_n[v] == 1 or H[v] == H[u] + 1 or all(h > H[v] for h in others)):
            return False  # (ii)
    for i, (ui, vi) in enumerate(P):
        for j, (uj, vj) in enumerate(P):
            if i != j and H[ui] == H[vj] + (H[uj] - H[vj]) and vj in succ[ui]:
                return False  # (iii)
    return True
