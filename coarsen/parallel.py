"""Parallelism-preserving coarsening: acyclic matchings under a critical-path budget.

Multilevel in the spirit of Herrmann et al., "Multilevel algorithms for
acyclic partitioning of directed acyclic graphs" (SIAM J. Sci. Comput. 2019):
every round contracts a matching of edges (u, v) that keeps the coarse graph
acyclic and does not lengthen its compute critical path beyond a budget.

* Acyclic: the matching obeys the same sufficient conditions as
  :mod:`coarsen.height` (Theorem 3.5 of the Pesto paper; Herrmann's "top
  level" rule H(v) = H(u) + 1 is one of them), and the coarse heights are
  recomputed by a Kahn pass every round, which would raise
  :class:`~pesto.errors.CycleError` if that ever failed.
* Critical path: a merge is a candidate only if the longest compute path
  through the merged vertex stays <= ``(1 + eps) * C`` (C = the fine graph's
  critical path, compute only, fastest kind). Merges of one round interact
  (two merges on one path each use its slack), so the round is checked as a
  whole: while the coarse critical path exceeds the budget, the merged
  vertices on over-long paths are undone (the lower-priority half of them,
  a few times, then all: merging is monotone, so that always settles).
* Order: by the transfer time a merge hides (``beta0 + beta1 * bytes``:
  heavy edges) minus the growth of the critical path it causes
  (``order="gain"``, the default; ``order="bytes"``: heaviest edge first,
  which spends the budget early and keeps much less parallelism, see
  benchmarks/results/coarsen.md).
* Balanced vertices: merged compute <= ``cap * work / target``.
* ``partition=`` and colocation groups exactly as :mod:`coarsen.height`.

Before the rounds, every run of links u -> v with succ(u) = {v} and
pred(v) = {u} is contracted at once (up to the vertex cap): it changes no
path length and cannot close a cycle, and it takes RNN cells and other
op chains out of the rounds.

When an edge round merges (almost) nothing, a round of equal-height pairs
(siblings, same budget) is tried; then the budget grows: ``eps`` doubles
from 1% up to ``1 / keep - 1`` (the slack that still keeps ``keep`` of the
parallelism), then ``cap`` doubles up to ``max_cap``, then (unless
``strict``) ``eps`` and ``cap`` grow together by 25% a step, so the critical
path grows no more than it must, until the target is reached. The report's
``kept_at`` is the smallest vertex count at which the coarse graph still had
``keep`` of the fine graph's parallelism (work / critical path); with
``strict=True`` the run stops there instead of going below it.
"""
from __future__ import annotations

import copy
import time
from typing import NamedTuple

import numpy as np

from pesto.graph import OpGraph
from pesto.problem import GraphArrays

from .base import DEFAULT_BETA, CoarsenReport, beta_of, build_coarse, coarse_edges, kahn_heights
from .height import MergeState, _select, _select_siblings, partition_ids

__all__ = ["coarsen_parallel"]

_TOL = 1e-9
CHAIN_CAP = 0.5  # chain segments up to half the vertex cap: big vertices early cost freedom later


class _Budget:
    """The critical-path slack ``eps`` and the vertex cap, relaxed step by step."""

    def __init__(self, eps, keep, cap, max_cap, growth, strict, late=1.25):
        self.eps, self.cap, self.max_cap, self.growth, self.strict = eps, cap, max_cap, growth, strict
        self.late = late
        self.limit = 1.0 / keep - 1.0
        self.eps = min(eps, self.limit)

    def relax(self) -> bool:
        """Grow one knob; False when nothing may grow any more."""
        if self.eps < self.limit:
            self.eps = min(self.limit, self.eps * self.growth)
        elif self.cap < self.max_cap:
            self.cap = min(self.max_cap, self.cap * self.growth)
        elif self.strict or self.eps > 1e9:
            return False
        else:  # past the keep limit: grow gently, so the critical path grows as little as it must
            self.eps *= self.late
            self.cap *= self.late
        return True


def _copy_uf(uf):
    new = copy.copy(uf)
    new.parent = list(uf.parent)
    new.mask = None if uf.mask is None else list(uf.mask)
    return new


def _snapshot(st: MergeState) -> MergeState:
    """A copy of the partition state that later merges and group unions leave alone."""
    new = copy.copy(st)
    for a in ("label", "part", "comp", "mask", "cnt", "grp"):
        setattr(new, a, getattr(st, a).copy())
    new.uf = _copy_uf(st.uf)
    return new


class _Levels(NamedTuple):
    """The coarse graph of a partition state: edges, heights, CSR successors,
    vertex times, top and bottom levels and the critical path."""
    eu: np.ndarray
    ev: np.ndarray
    eb: np.ndarray
    H: list
    flat: list
    off: list
    top: np.ndarray
    bottom: np.ndarray
    cp: float


def _levels(ga, st) -> _Levels:
    eu, ev, eb = coarse_edges(ga, st.label, st.m)
    # raises CycleError if a round broke the DAG
    H, flat, off, top, bottom = kahn_heights(st.m, eu, ev, st.times(np.arange(st.m)))
    return _Levels(eu, ev, eb, H, flat, off, top, bottom, float((top + bottom).max(initial=0.0)))


def _chains(ga, st, lv, cap_time) -> tuple:
    """Contract every run of links u -> v with succ(u) = {v} and pred(v) = {u}
    (segments up to ``cap_time`` of compute, one kind mask, partition label
    and group): no path changes length, none can close a cycle (a run is
    entered only at its head and left only at its tail). Returns the
    pairs (U, V) merging each segment into its head."""
    m = st.m
    outdeg = np.bincount(lv.eu, minlength=m)
    indeg = np.bincount(lv.ev, minlength=m)
    link = (outdeg[lv.eu] == 1) & (indeg[lv.ev] == 1) & (st.part[lv.eu] == st.part[lv.ev])
    nxt = np.full(m, -1, dtype=np.int64)
    nxt[lv.eu[link]] = lv.ev[link]
    has_prev = np.zeros(m, dtype=bool)
    has_prev[lv.ev[link]] = True
    t = st.times(np.arange(m)).tolist()
    mask = st.mask  # the head's mask is narrowed as the segment grows (group_ok reads it)
    nx = nxt.tolist()
    has_groups = bool((st.grp >= 0).any())
    U, V = [], []
    comp, bits = st.comp, st._bits
    for head in np.flatnonzero((nxt >= 0) & ~has_prev).tolist():
        h, th, ch, x = head, t[head], comp[head].copy(), nx[head]
        while x >= 0:
            both = int(mask[h]) & int(mask[x])
            cx = ch + comp[x]
            # the segment's time on its fastest common kind must be the plain sum: a
            # narrower kind set that makes it slower would lengthen paths
            tx = float(np.where((both & bits) != 0, cx, np.inf).min()) if both else np.inf
            if tx <= (th + t[x]) * (1 + _TOL) and tx <= cap_time and (not has_groups or st.group_ok(h, x)):
                mask[h] = both
                th, ch = tx, cx
                U.append(h)
                V.append(x)
            else:
                h, th, ch = x, t[x], comp[x].copy()
            x = nx[x]
    return np.array(U, dtype=np.int64), np.array(V, dtype=np.int64)


def _round(ga, st, lv, target, budget, C, avg, opts, only_siblings):
    """One round: select merges (edges, else equal-height pairs; never both in
    one round, the no-cycle argument needs it) and settle them under the
    budget. Returns (new state, its levels, merges kept, kind)."""
    cap_time, limit = budget.cap * avg, (1 + budget.eps) * C * (1 + _TOL)
    uf0 = _copy_uf(st.uf)  # selection unites groups as it goes; settling may undo some merges
    if not only_siblings:
        U, V = _select(st, lv.eu, lv.ev, lv.eb, lv.H, lv.flat, lv.off, rule="height", cap_time=cap_time,
                       cap_ops=1 << 62, budget=st.m - target, order=opts["order"], beta=opts["beta"],
                       path_limit=limit, levels=(lv.top, lv.bottom))
        new, nlv, k = _settle(ga, st, uf0, U, V, limit)
        if k or not opts["siblings"]:
            return new, nlv, k, "edges"
        st.uf = _copy_uf(uf0)
    U, V = _select_siblings(st, lv.H, cap_time=cap_time, cap_ops=1 << 62, budget=st.m - target,
                            levels=(lv.top, lv.bottom), path_limit=limit)
    return (*_settle(ga, st, uf0, U, V, limit), "siblings")


def _settle(ga, st, uf0, U, V, limit, tries: int = 4):
    """Merge the pairs (U, V) (priority order) that keep the critical path <= ``limit``.

    Each merge was checked alone; together they may overrun (two merges on
    one path each use its slack). Merging is monotone (fewer merges never
    lengthen a path), so undoing every merged vertex that lies on a path over
    the limit settles (the state before the round meets it); first, up to
    ``tries`` times, only the worse half (by priority) of those is undone. ``uf0``: the colocation union-find
    before the selection (the kept merges' unions are redone on a copy).
    ``st`` is left alone. Returns (new state, its levels, merges kept).
    """
    keep = np.ones(len(U), dtype=bool)
    for k in range(tries + 3):
        trial = _snapshot(st)
        if (st.grp >= 0).any():
            trial.uf = _copy_uf(uf0)
            for u, v in zip(U[keep].tolist(), V[keep].tolist()):
                trial.group_ok(u, v)
        trial.merge(U[keep], V[keep])
        lv = _levels(ga, trial)
        if lv.cp <= limit or not keep.any():
            return trial, lv, int(keep.sum())
        alive = np.ones(st.m, dtype=bool)
        alive[V[keep]] = False
        newid = np.cumsum(alive) - 1
        idx = np.flatnonzero(keep)
        bad = idx[(lv.top + lv.bottom)[newid[U[idx]]] > limit]
        keep[bad if k >= tries or len(bad) == 1 else bad[len(bad) // 2:]] = False
        if k > tries:  # unreachable while every state meets the limit; never loop on a defect
            keep[:] = False


def run_parallel(ga: GraphArrays, target: int, report: CoarsenReport, *, part=None, keep: float = 0.9,
                 eps: float = 0.01, cap: float = 1.0, max_cap: float = 4.0, growth: float = 2.0,
                 strict: bool = False, siblings: bool = True, min_gain: float = 0.02,
                 order: str = "gain", patience: int = 8, max_rounds: int = 1000, chains: bool = True,
                 beta=DEFAULT_BETA) -> np.ndarray:
    """Merge rounds until ``target`` vertices (see the module docstring); returns the labels."""
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], got {keep!r}")
    st = MergeState(ga, part)
    lv = _levels(ga, st)
    C = lv.cp
    report.cp_before, report.keep, report.kept_at = C, keep, st.m
    avg = float(ga.time.sum()) / max(1, target)
    budget = _Budget(eps, keep, cap, max_cap, growth, strict)
    opts = {"order": order, "beta": beta, "siblings": siblings}
    if chains:
        t = time.perf_counter()
        st = _snapshot(st)
        U, V = _chains(ga, st, lv, budget.cap * avg * CHAIN_CAP)
        if len(U):
            st.merge(U, V)
            lv = _levels(ga, st)
            report.kept_at = st.m
        report.rounds.append({"round": 0, "kind": "chains", "vertices": ga.n, "merged": int(len(U)),
                              "eps": 0.0, "cap_time_us": budget.cap * avg,
                              "seconds": round(time.perf_counter() - t, 5)})
    stalls, want_siblings = 0, False
    for rnd in range(max_rounds):
        if st.m <= target:
            break
        t = time.perf_counter()
        before = st.m
        st, lv, merged, kind = _round(ga, st, lv, target, budget, C, avg, opts, want_siblings)
        if merged and lv.cp * keep <= C * (1 + _TOL):
            report.kept_at = st.m
        report.rounds.append({"round": rnd + 1, "kind": kind, "vertices": before, "merged": merged,
                              "eps": budget.eps, "cap_time_us": budget.cap * avg,
                              "seconds": round(time.perf_counter() - t, 5)})
        if merged >= max(1, int(min_gain * (before - target))) or st.m <= target:
            stalls, want_siblings = 0, False
            continue
        if kind == "edges" and siblings and not want_siblings:
            want_siblings = True  # a small edge round: try equal-height pairs under the same budget
            continue
        want_siblings = False
        if budget.relax():
            stalls = 0
            continue
        stalls += 1
        if not merged or stalls >= patience:
            report.notes.append(f"stopped at {st.m} vertices: " + (
                f"budget spent (eps {budget.eps:.3g}, cap {budget.cap:.3g} x mean vertex)" if not merged
                else f"{patience} rounds in a row merged less than {min_gain:.0%} of the excess"))
            break
    else:
        report.notes.append(f"stopped at {st.m} vertices after {max_rounds} rounds")
    return st.label


def coarsen_parallel(graph: OpGraph, target_vertices: int = 200, *, cluster=None, beta=None, partition=None,
                     **options):
    """Coarsen ``graph`` to about ``target_vertices``, keeping its parallelism.

    Parameters
    ----------
    graph : OpGraph
    target_vertices : int
    cluster, beta : for the report's CCR, as :func:`coarsen.height.coarsen_height`.
    partition : mapping op -> label, or a list of them, optional
        Never merge ops whose labels differ (see :func:`coarsen.height.coarsen_height`).
    **options
        ``keep`` (0.9: the parallelism fraction to keep; ``report.kept_at``
        says down to which size it was kept), ``eps`` (0.01: first critical
        path slack), ``cap`` (1.0) and ``max_cap`` (4.0): merged compute cap
        in mean vertex times (work / target), ``growth`` (2.0), ``strict``
        (False; True: stop at the smallest size keeping ``keep`` instead of
        going on to the target), ``siblings`` (True: equal-height merges when
        an edge round merges little), ``order`` ("gain" or "bytes"),
        ``chains`` (True: first contract every run of ops that only feed
        each other, which changes no path),
        ``min_gain`` (0.02), ``patience`` (8), ``max_rounds`` (1000).

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(500)}  # a 25 x 20 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(500) for j in (i + 20, i + 21) if j < 500])
    >>> cg = coarsen_parallel(g, 50)
    >>> cg.graph.num_ops <= 50, sum(map(len, cg.members.values()))
    (True, 500)
    >>> r = cg.report
    >>> r.parallelism_after <= r.parallelism_before + 1e-9
    True
    """
    t0 = time.perf_counter()
    ga = GraphArrays.of(graph)
    report = CoarsenReport("parallel", int(target_vertices), graph.num_ops, graph.num_edges)
    beta = beta or beta_of(cluster)
    part = partition_ids(graph, partition)
    label = run_parallel(ga, max(1, int(target_vertices)), report, part=part, beta=beta, **options)
    if part is not None:
        report.method += "/partition"
        report.notes.append(f"merges restricted to {int(part.max()) + 1 if len(part) else 0} partition classes")
    return build_coarse(ga, label, report, beta=beta, t0=t0)
