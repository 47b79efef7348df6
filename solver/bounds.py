"""Lower bounds and a quick greedy plan (memory pre-checks: :func:`pesto.memory.check_feasible`).

Everything here is cheap (linear or near-linear in the graph) and is used by
the exact solvers and :func:`pesto.solve` before any search.

* :func:`lower_bound` = max(critical path with each op at its fastest allowed
  device, total fastest work / number of devices, work forced onto one kind /
  number of devices of that kind). Communication is ignored, so it is valid
  for every placement and every link model.
* :func:`energetic_bound` strengthens it by energetic reasoning: for a
  makespan ``T``, each op must run between its head (longest path before it)
  and ``T`` minus its tail; if, in some time window, the parts of the ops that
  must fall inside exceed what the devices can do there, no schedule of
  length ``T`` exists (still communication free, so valid for every link model).
* :func:`chain_bound` cuts the step into phases along the critical path:
  ops that follow one path op and precede a later one must all run between
  the two, so the step is at least the sum of the chosen path ops plus, per
  phase, max(its path length, its work per device). A dynamic programme
  picks the path ops that give the largest sum. It catches what the two
  above miss on layered graphs: a serial stretch (a feed-forward chain, a
  loss) between parallel ones cannot borrow their idle devices.
* :func:`greedy_plan` is a small earliest-finish-time list scheduler used as a
  fallback hint when nothing better is given.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("a", "c")])
>>> lower_bound(g, gpus(2))
6.0
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pesto.cluster import Cluster
from pesto.deadline import Deadline
from pesto.dag import bottom_levels, priority_order, top_levels
from pesto.engine import Timeline
from pesto.graph import OpGraph
from pesto.problem import INF, Problem
from pesto.finalize import finalize


__all__ = ["TOLERANCE", "reached", "lower_bound", "energetic_bound", "chain_bound", "chain_heads", "ChainHeads",
           "greedy_plan"]

ENERGY_OPS = 3000         # energetic reasoning keeps the longest ops (dropping ops only relaxes)
ENERGY_TERMS = 4_000_000  # (window, op) terms per makespan test
CHAIN_WINDOW = 256        # chain_bound: a phase spans at most this many path ops (fewer only weakens it)

#: Relative: a plan whose step is within it of a lower bound is optimal.
TOLERANCE = 1e-6


def reached(step: float | None, bound: float) -> bool:
    """A plan of step time ``step`` (µs; None: no plan to improve) is within
    :data:`TOLERANCE` of the lower bound ``bound``: it is optimal.

    >>> reached(100.00005, 100.0), reached(100.001, 100.0)
    (True, False)
    """
    return step is None or step <= bound + TOLERANCE * max(1.0, bound)


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """A makespan lower bound valid for every placement (µs)."""
    if graph.num_ops == 0:
        return 0.0
    prob = Problem.of(graph, cluster)
    # per op, the devices whose kind it allows (its own kinds, not its group's)
    allowed = [[d for d, x in enumerate(row) if x != INF] for row in prob.dur]
    fastest = [min(row[d] for d in al) if al else 0.0 for row, al in zip(prob.dur, allowed)]
    cp = max(top_levels(prob.pred, fastest, order=prob.topo))
    work = sum(fastest) / prob.nd
    # Work that can only go to devices of one kind shares those devices.
    kinds = [d.kind for d in cluster.devices]
    forced = 0.0
    for kind in set(kinds):
        mine = {k for k, kk in enumerate(kinds) if kk == kind}
        w = sum(f for f, al in zip(fastest, allowed) if al and set(al) <= mine)
        forced = max(forced, w / len(mine))
    return float(max(cp, work, forced))


def stopped(deadline: Deadline | None) -> bool:
    """The solve ``deadline`` belongs to was interrupted (Ctrl-C): a bound's
    search ends with what it proved so far (the status pass runs past the
    limit by design, so only the interrupt stops it)."""
    return deadline is not None and deadline.interrupted


def energetic_bound(graph: OpGraph, cluster: Cluster, *, upper: float | None = None,
                    time_limit: float = 5.0, max_steps: int | None = None,
                    phased: ChainHeads | None = None, deadline: Deadline | None = None) -> float:
    """The smallest makespan not refuted by energetic reasoning, at least :func:`lower_bound` (µs).

    For a candidate makespan ``T``, op ``i`` (its fastest time ``p``) starts
    no earlier than its head ``r`` (longest path of fastest times before it)
    and no later than ``T - q - p`` (``q``: its tail). Its *mandatory* part in a
    window ``[a, b)`` is its least overlap with the window over those starts
    (at one of the two extreme starts: the overlap is concave in the start).
    If the mandatory parts in a window exceed ``devices * (b - a)``, no schedule
    of length ``T`` exists. A bisection between the simple bound and
    ``upper`` (default: the total work) returns the largest ``T`` so refuted,
    or the simple bound. Windows are taken between quantiles of the ops'
    extreme start and end times; on large graphs only the ``ENERGY_OPS``
    longest ops count (fewer ops and windows only weaken the test). With
    ``phased`` (:func:`chain_heads` of the same graph and cluster), heads and
    tails are the larger of the longest paths and what the phases prove.
    The bisection stops when ``deadline`` (the solve's) is interrupted.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 4, "b": 4, "c": 4, "d": 1, "e": 1},
    ...                        [("a", "d"), ("b", "d"), ("c", "d"), ("d", "e")])
    >>> lower_bound(g, gpus(3)), round(energetic_bound(g, gpus(3)), 3)   # a, b, c end at 4 at best
    (6.0, 6.0)
    >>> lower_bound(g, gpus(2)), round(energetic_bound(g, gpus(2)), 3)   # two of them run in turn
    (7.0, 10.0)
    """
    t0 = time.perf_counter()
    simple = lower_bound(graph, cluster)
    if graph.num_ops == 0:
        return simple
    prob = Problem.of(graph, cluster)
    fastest = [prob.fastest(i) for i in range(prob.n)]
    top = top_levels(prob.pred, fastest, order=prob.topo)
    bot = bottom_levels(prob.succ, fastest, order=prob.topo)
    keep = sorted(range(prob.n), key=lambda i: -fastest[i])[:ENERGY_OPS]
    p = np.array([fastest[i] for i in keep])
    r = np.array([top[i] for i in keep]) - p
    q = np.array([bot[i] for i in keep]) - p
    if phased is not None:
        r, q = np.maximum(r, phased.head[keep]), np.maximum(q, phased.tail[keep])
    grid = max(4, min(96, int((2 * ENERGY_TERMS / max(1, len(keep))) ** 0.5)))
    lo, hi = simple, float(upper) if upper is not None else float(sum(fastest))
    if hi <= lo or not _refuted(lo, r, p, q, prob.nd, grid):
        return simple
    steps = 0
    while hi - lo > 1e-6 * hi and time.perf_counter() - t0 < time_limit and steps != max_steps \
            and not stopped(deadline):
        steps += 1
        mid = 0.5 * (lo + hi)
        if _refuted(mid, r, p, q, prob.nd, grid):
            lo = mid
        else:
            hi = mid
    return float(lo)


def chain_bound(graph: OpGraph, cluster: Cluster, *, window: int = CHAIN_WINDOW) -> float:
    """A makespan lower bound from phases along the critical path, at least :func:`lower_bound` (µs).

    Take the critical path ``p_0 .. p_k-1`` (fastest compute times) and
    choose some of its ops as *separators*. An op that descends from one
    separator and precedes the next can only run between the two, and the
    separators run one after another, so every schedule lasts at least::

        sum(separators' times) + sum over phases of max(path between, work / devices)

    (ops beside no such pair are dropped, which only relaxes). *Work* is the
    fastest compute of the phase's ops, per device and per device kind, as
    in :func:`lower_bound`. A dynamic programme over the path picks the
    separators that give the largest sum; a phase spans at most ``window``
    path ops. Communication is ignored, so the bound holds for every
    placement and link model.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> ops = {"a": 1, "b": 4, "c": 4, "d": 4, "e": 1, "f": 4, "g": 4, "h": 4, "i": 1}
    >>> edges = [("a", x) for x in "bcd"] + [(x, "e") for x in "bcd"] \\
    ...       + [("e", x) for x in "fgh"] + [(x, "i") for x in "fgh"]
    >>> g = OpGraph.from_edges(ops, edges)   # two forks of three, joined by e
    >>> lower_bound(g, gpus(2)), chain_bound(g, gpus(2))   # a, e, i idle a device each
    (13.5, 15.0)
    """
    return max(lower_bound(graph, cluster), chain_heads(graph, cluster, window=window).value)


@dataclass(frozen=True)
class ChainHeads:
    """What the phase programme of :func:`chain_bound` proves for every schedule.

    value : the makespan bound (µs); not below :func:`lower_bound` but for
        rounding (with no separator the programme takes lower_bound's own
        terms, critical path and work per device and per kind, on the same
        or longer op times: a colocation group can only narrow an op's
        devices), so it is not computed again here
    head : per op, the earliest it can start (µs): after the end of the last
        critical-path op among its ancestors, which the programme bounds
    tail : per op, the least time from its end to the makespan (µs): the
        same programme run on the reversed graph, from the first
        critical-path op among its descendants
    """

    value: float
    head: np.ndarray
    tail: np.ndarray


def chain_heads(graph: OpGraph, cluster: Cluster, *, window: int = CHAIN_WINDOW) -> ChainHeads:
    """:func:`chain_bound` with the heads and tails it proves on the way
    (:class:`ChainHeads`); :func:`energetic_bound` tightens its windows with them.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 2, "c": 2, "d": 1, "e": 3},
    ...                        [("a", "d"), ("b", "d"), ("c", "d"), ("d", "e")])
    >>> ph = chain_heads(g, gpus(2))
    >>> i = {name: k for k, name in enumerate(g.names)}
    >>> ph.value, float(ph.head[i["e"]]), float(ph.tail[i["a"]])   # a, b, c take 4 on 2 devices
    (7.0, 4.0, 4.0)
    """
    if graph.num_ops == 0:
        return ChainHeads(0.0, np.zeros(0), np.zeros(0))
    prob = Problem.of(graph, cluster)
    fast = np.array([prob.fastest(i) for i in range(prob.n)])
    path = _critical_path(prob, fast)
    first, after = _path_span(prob, path)
    share = _work_shares(prob, cluster, fast)
    k, along = len(path), fast[path]
    ends = _phase_programme(along, first, after, share, window)            # ends[j] <= end of path op j
    rest = _phase_programme(along[::-1], k - 1 - after, k - 1 - first, share, window)  # from a start to the end
    head = np.where(first >= 0, ends[np.maximum(first, 0)], 0.0)
    tail = np.where(after < k, rest[np.maximum(k - 1 - after, 0)], 0.0)
    head[path] = np.maximum(head[path], ends[:k] - along)
    tail[path] = np.maximum(tail[path], rest[:k][::-1] - along)
    return ChainHeads(float(ends[k]), head, tail)


def _critical_path(prob: Problem, fast) -> list[int]:
    """A longest path (op indices in order) by the times ``fast``."""
    top = top_levels(prob.pred, fast.tolist(), order=prob.topo)
    i = int(np.argmax(top))
    path = [i]
    while prob.pred[i]:
        i = max(prob.pred[i], key=lambda p: top[p])
        path.append(i)
    return path[::-1]


def _path_span(prob: Problem, path: list[int]):
    """Per op, the last path position among its ancestors (-1: none) and the
    first among its descendants (``len(path)``: none). Ancestors on a path
    form a prefix of it and descendants a suffix, so these two say which
    path ops an op is comparable with."""
    k = len(path)
    pos = np.full(prob.n, -1)
    pos[path] = np.arange(k)
    first = np.full(prob.n, -1)
    after = np.full(prob.n, k)
    for i in prob.topo:
        for p in prob.pred[i]:
            v = max(first[p], pos[p])
            if v > first[i]:
                first[i] = v
    for i in reversed(prob.topo):
        for q in prob.succ[i]:
            v = after[q] if pos[q] < 0 else min(after[q], pos[q])
            if v < after[i]:
                after[i] = v
    return first, after


def _work_shares(prob: Problem, cluster: Cluster, fast):
    """Rows of per-op work per device: over all devices, then over each kind's
    devices for the ops that can only run there (the terms of :func:`lower_bound`)."""
    kinds = [d.kind for d in cluster.devices]
    groups = [set(range(prob.nd))] + [{d for d, k in enumerate(kinds) if k == kind} for kind in sorted(set(kinds))]
    share = np.zeros((len(groups), prob.n))
    for r, grp in enumerate(groups):
        inside = np.array([set(prob.allowed[i]) <= grp for i in range(prob.n)])
        share[r, inside] = fast[inside] / len(grp)
    return share


def _phase_programme(along, first, after, share, window: int) -> np.ndarray:
    """The dynamic programme of :func:`chain_bound`: ``best[j]`` bounds the
    end of path op ``j`` in every schedule (``best[k]``: the makespan), with
    ``-1`` a virtual start."""
    k = len(along)
    prefix = np.concatenate([[0.0], np.cumsum(along)])   # prefix[j]: path time before op j
    by_after = np.argsort(after, kind="stable")
    filled = np.zeros((share.shape[0], k + 1))           # column a + 1: work of ops with first == a
    total = np.zeros(share.shape[0])
    best = np.zeros(k + 1)
    nxt = 0
    for j in range(k + 1):
        while nxt < len(by_after) and after[by_after[nxt]] <= j:  # ops that end before op j
            u = by_after[nxt]
            filled[:, first[u] + 1] += share[:, u]
            total += share[:, u]
            nxt += 1
        here = along[j] if j < k else 0.0
        value = max(prefix[j], total.max())               # no separator before j
        lo = max(0, j - window)
        if j > lo:                                        # last separator i in [lo, j)
            work = filled[:, lo + 1:j + 1][:, ::-1].cumsum(axis=1)[:, ::-1].max(axis=0)
            i = np.arange(lo, j)
            value = max(value, float(np.max(best[i] + np.maximum(prefix[j] - prefix[i + 1], work))))
        best[j] = value + here
    return best


def _refuted(T: float, r, p, q, devices: int, grid: int) -> bool:
    """Whether energetic reasoning shows that no schedule ends by ``T``."""
    late = T - q - p
    if np.any(late < r - 1e-9 * T):
        return True
    pts = np.unique(np.concatenate([r, late, r + p, late + p]).clip(0.0, T))
    if len(pts) > grid:
        pts = np.unique(np.quantile(pts, np.linspace(0.0, 1.0, grid)))
    for k, a in enumerate(pts[:-1]):
        b = pts[k + 1:, None]
        early = np.maximum(0.0, np.minimum(b, r + p) - np.maximum(a, r))
        lazy = np.maximum(0.0, np.minimum(b, late + p) - np.maximum(a, late))
        need = np.minimum(early, lazy).sum(axis=1)
        if np.any(need > devices * (b[:, 0] - a) + 1e-9 * T):
            return True
    return False


def greedy_plan(graph: OpGraph, cluster: Cluster, *, placer: str = "greedy"):
    """Earliest-finish-time list scheduling (contention-free estimate), then simulated.

    Ready ops are taken by decreasing bottom level (fastest compute; ties:
    lower index) and put on the device where they finish first on a
    contention-free :class:`pesto.engine.Timeline`; colocated ops follow the
    device of the first member placed; a device is skipped when its static
    held bytes (persistent + outputs) would exceed its memory (unless no
    device fits). Returns a Plan via :func:`pesto.finalize.finalize`.
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    dur = prob.dur
    fastest = [min(row) for row in dur]
    bottom = bottom_levels(prob.succ, fastest, order=prob.topo)
    tl = Timeline(prob, links="free")
    unit_dev = [-1] * len(prob.members)
    held = [0] * prob.nd
    seq = priority_order(prob.succ, prob.pred, [-b for b in bottom])  # largest bottom level first
    for i in seq:
        u = prob.unit[i]
        cands = [unit_dev[u]] if unit_dev[u] >= 0 else prob.allowed[i]
        need = prob.persistent[i] + prob.out[i]
        fits = [k for k in cands if held[k] + need <= prob.cap[k]] or cands
        best = None
        for k in fits:
            s = tl.earliest(i, k)
            if best is None or s + dur[i][k] < best[0]:
                best = (s + dur[i][k], s, k)
        _, s, k = best
        tl.commit(i, k, s)
        held[k] += need
        if unit_dev[u] < 0:
            unit_dev[u] = k
    names = graph.names
    placement = {names[i]: prob.dev_names[tl.place[i]] for i in range(prob.n)}
    pos = {i: r for r, i in enumerate(seq)}
    order = [names[i] for i in sorted(seq, key=lambda i: (tl.start[i], pos[i]))]
    return finalize(graph, cluster, placement, order=order, placer=placer, t0=t0)
