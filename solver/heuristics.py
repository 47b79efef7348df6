"""List-scheduling heuristics: Baechi's m-TOPO, m-ETF and m-SCT, Celeritas, HEFT.

Every placer here is ``place_xxx(graph, cluster) -> Plan`` (m-SCT adds its LP limits): it
computes a placement and a per-device order with its own time estimates
(comm ``beta0 + beta1 * bytes`` on each route, queued on the route's links in
the order transfers are booked, a tensor sent once per remote device), then
calls :func:`pesto.finalize.fit_memory`, which
simulates that order so every plan's makespan is the simulator's.
:attr:`HeuristicInfo.estimated_makespan <pesto.outcome.HeuristicInfo>` keeps
the placer's own estimate.

Constraints: an op runs only on devices of its kinds; a colocation group is
placed as a whole on first touch (its first placed member pins the group, and
the memory check reserves the whole group's persistent bytes); memory follows
Baechi's accounting (:mod:`pesto.memory`). When memory fits nowhere an op goes
to the allowed device with the most free memory; the plan is then repaired by
simulation (:func:`pesto.finalize.fit_memory`) and, only if no repair fits,
returned over capacity with status ``"infeasible"`` and the best-effort ops in
its :class:`~pesto.outcome.MemoryInfo` (see :mod:`pesto.memory`, same for every heuristic).

Each placer declares only the options it uses (all are deterministic): m-SCT
takes ``time_limit`` / ``lp_time_limit`` for its LP; every one takes a
``deadline`` (:class:`pesto.deadline.Deadline`, optional) that its loops check
every :data:`~pesto.deadline.CHECK_EVERY` ops: once it has passed (or the
solve is interrupted) the placer raises :class:`~pesto.deadline.Stopped`
instead of finishing. Their time estimates come from one
:class:`pesto.engine.Timeline`.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 1, "b": 5, "c": 5, "d": 1},
...                        [("a", "b", 0), ("a", "c", 0), ("b", "d", 0), ("c", "d", 0)])
>>> plan = place_m_etf(g, gpus(2, beta=(0.0, 0.0)))
>>> plan.makespan, plan.placement["b"] != plan.placement["c"]
(7.0, True)
"""
from __future__ import annotations

import dataclasses
import heapq
import time

from pesto.cluster import Cluster
from pesto.deadline import CHECK_EVERY, Deadline
from pesto.dag import bottom_levels, priority_order
from pesto.engine import Timeline
from pesto.finalize import fit_memory
from pesto.graph import OpGraph
from pesto.memory import MemoryTracker
from pesto.outcome import HeuristicInfo
from pesto.plan import Plan
from pesto.problem import Problem

__all__ = ["place_m_topo", "place_m_etf", "place_m_sct", "place_celeritas", "place_heft",
           "favourite_children", "bottom_level_order", "heft_ranks"]

EPS = 1e-9


def _tick(deadline: Deadline | None, k: int) -> None:
    """Every :data:`CHECK_EVERY` steps, raise ``Stopped`` once ``deadline`` passed."""
    if deadline is not None and k % CHECK_EVERY == 0:
        deadline.check()


def _candidates(prob: Problem, mem: MemoryTracker, i: int) -> list[int]:
    d = mem.unit_dev[prob.unit[i]]
    return [d] if d >= 0 else prob.allowed[i]


def _finish(graph, cluster, prob, mem, times, order, placer, t0, info=None, deadline=None):
    """The simulated plan (memory repaired), with the placer's own estimate in its HeuristicInfo."""
    info = dataclasses.replace(info or HeuristicInfo(), estimated_makespan=times.makespan())
    return fit_memory(graph, cluster, list(times.place), order=order, placer=placer, t0=t0,
                      info=(info,), forced=mem.forced, deadline=deadline)


# -- m-TOPO ------------------------------------------------------------------------
def place_m_topo(graph: OpGraph, cluster: Cluster, *, deadline: Deadline | None = None) -> Plan:
    """Baechi m-TOPO: fill devices in topological order.

    Ops are taken in topological order and put on the current device until it
    holds its share (total op memory / number of devices; total compute when
    the graph has no memory figures) or its memory is full, then the next
    device is used. Ops whose kind the current device lacks, or that do not
    fit there, go to the first allowed device that fits. Order on each device:
    the topological order.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1, "d": 1}, [("a", "b"), ("b", "c"), ("c", "d")])
    >>> p = place_m_topo(g, gpus(2))
    >>> [p.placement[x] for x in "abcd"]
    ['/GPU:0', '/GPU:0', '/GPU:1', '/GPU:1']
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    mem = MemoryTracker(prob)
    times = Timeline(prob)
    order = prob.topo
    # memory weight: an op's outputs, plus its unit's persistent bytes when it
    # is the unit's first member (the tracker reserves them then), so the
    # shares count what each device really holds
    by_memory = sum(prob.out) + sum(prob.persistent) > 0
    base = list(prob.out) if by_memory else [prob.mean_dur(i) for i in range(prob.n)]
    # the devices filled in turn: those of the kind most ops may use
    fill = _main_devices(prob)
    share = (sum(base) + (sum(prob.persistent) if by_memory else 0)) / len(fill)
    load = [0.0] * prob.nd
    k = 0
    for step, i in enumerate(order):
        _tick(deadline, step)
        u = prob.unit[i]
        w = base[i] + (prob.unit_persistent[u] if by_memory and mem.unit_dev[u] < 0 else 0)
        cands = _candidates(prob, mem, i)
        if len(cands) == 1:
            d = cands[0]
        else:
            while k < len(fill) - 1 and load[fill[k]] + w > share + EPS and load[fill[k]] > 0:
                k += 1
            d = -1
            if fill[k] in cands and mem.fits(i, fill[k]):
                d = fill[k]
            else:
                later = [e for e in fill[k + 1:] if e in cands and mem.fits(i, e)]
                if later and fill[k] in cands:
                    k = fill.index(later[0])  # current device is full: move on
                    d = later[0]
                else:
                    fits = [e for e in cands if mem.fits(i, e)]
                    d = fits[0] if fits else mem.best_effort(i, cands)
        load[d] += w
        mem.commit(i, d)
        times.commit(i, d, times.earliest(i, d))
    return _finish(graph, cluster, prob, mem, times, order, "m-topo", t0, deadline=deadline)


def _main_devices(prob: Problem) -> list[int]:
    """Devices of the kind the most ops may run on (the GPUs, usually)."""
    devs = prob.cluster.devices
    count: dict = {}
    for op in prob.graph.ops:
        for k in op.kinds:
            count[k] = count.get(k, 0) + 1
    kinds = {d.kind for d in devs}
    best = max(kinds, key=lambda k: (count.get(k, 0), k == "GPU"))
    return [d for d in range(prob.nd) if devs[d].kind == best]


# -- m-ETF / m-SCT --------------------------------------------------------------------
def _etf(prob: Problem, mem: MemoryTracker, times: Timeline, prio, fav_parent=None,
         deadline: Deadline | None = None) -> list[int]:
    """Earliest-task-first list scheduling, O((V + E) D log V).

    Per device, ready ops wait in a heap keyed by when their inputs are
    there (``pend``) and, once the device is free by then, in a heap keyed
    by priority (``avl``). Each step takes the device whose best op starts
    first (ties: urgent op, then ``prio``), re-checks it (colocation pin,
    memory, link bookings since it was queued) and commits it. An op that
    does not fit on a device waits there until memory is freed on it; if
    only such ops are left, the highest-priority one is placed best effort.

    With ``fav_parent`` (m-SCT), an op whose favourite parent's device is
    free by the time its inputs arrive there is urgent: it is queued on that
    device only and wins ties there; if it does not fit there in memory when
    its turn comes, it is queued on its other devices too.
    """
    push, pop = heapq.heappush, heapq.heappop
    n, nd = prob.n, prob.nd
    waiting = [len(p) for p in prob.pred]
    pend: list[list] = [[] for _ in range(nd)]
    avl: list[list] = [[] for _ in range(nd)]
    blocked: list[list] = [[] for _ in range(nd)]
    blocked_used = [0] * nd
    done = [False] * n
    urgent = [-1] * n
    order: list[int] = []
    avail = times.avail

    def enqueue(i):
        cands = _candidates(prob, mem, i)
        if fav_parent is not None and fav_parent[i] >= 0:
            dp = times.place[fav_parent[i]]
            if dp in cands and avail[dp] <= times.ready(i, dp) + EPS and mem.fits(i, dp):
                urgent[i] = dp
                cands = [dp]
        for d in cands:
            push(pend[d], (times.ready(i, d), prio[i], i))

    for i in range(n):
        if waiting[i] == 0:
            enqueue(i)
    left, steps = n, 0
    while left:
        _tick(deadline, steps)
        steps += 1
        best = _first_start(avail, pend, avl, done, urgent)
        if best is None:  # only ops that fit nowhere now: best effort
            i = min((j for bl in blocked for j in bl if not done[j]), key=lambda j: prio[j])
            d = mem.best_effort(i, _candidates(prob, mem, i))
            s = times.earliest(i, d)
        else:
            s0, _, _, d = best
            if avl[d]:
                i = pop(avl[d])[3]
            else:
                i = pop(pend[d])[2]
            pin = mem.unit_dev[prob.unit[i]]
            if pin >= 0 and pin != d:  # its group went elsewhere meanwhile
                push(pend[pin], (times.ready(i, pin), prio[i], i))
                continue
            if not mem.fits(i, d):
                blocked[d].append(i)
                blocked_used[d] = mem.used[d]
                if urgent[i] == d:  # queued on its favourite parent's device only: try the others
                    urgent[i] = -1
                    for e in _candidates(prob, mem, i):
                        if e != d:
                            push(pend[e], (times.ready(i, e), prio[i], i))
                continue
            r = times.ready(i, d)
            s = max(avail[d], r)
            if s > s0 + EPS:  # links were booked since it was queued
                push(pend[d], (r, prio[i], i))
                continue
        mem.commit(i, d)
        times.commit(i, d, s)
        done[i] = True
        left -= 1
        order.append(i)
        for e in range(nd):
            if blocked[e] and mem.used[e] < blocked_used[e]:  # memory freed: retry
                for j in blocked[e]:
                    if not done[j]:
                        push(pend[e], (times.ready(j, e), prio[j], j))
                blocked[e] = []
        for j in prob.succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                enqueue(j)
    return order


def _first_start(avail, pend, avl, done, urgent):
    """m-ETF's pick: the key ``(start, urgency, priority, device)`` of the
    device whose best queued op starts first, or None when nothing is queued.
    Ops whose inputs are on a device by the time it is free move from its
    ``pend`` heap (by input arrival) to its ``avl`` heap (by priority)."""
    push, pop = heapq.heappush, heapq.heappop
    best = None
    for d in range(len(avail)):
        a = avail[d]
        pd, ad = pend[d], avl[d]
        while pd and (done[pd[0][2]] or pd[0][0] <= a + EPS):
            r, pr, i = pop(pd)
            if not done[i]:
                push(ad, (0 if urgent[i] == d else 1, pr, r, i))
        while ad and done[ad[0][3]]:
            pop(ad)
        if ad:
            key = (a, ad[0][0], ad[0][1], d)
        elif pd:
            key = (pd[0][0], 1, pd[0][1], d)
        else:
            continue
        if best is None or key < best:
            best = key
    return best


def place_m_etf(graph: OpGraph, cluster: Cluster, *, deadline: Deadline | None = None) -> Plan:
    """Baechi m-ETF: earliest task first with memory checks.

    Repeatedly schedules the (ready op, device) pair with the earliest start
    time among devices where the op fits in memory (ties: earlier finish, then
    the longer path to the end of the graph). A colocation group goes where
    its first member goes. Order on each device: the order ops were scheduled.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 2}, [])
    >>> sorted(place_m_etf(g, gpus(2)).placement.values())
    ['/GPU:0', '/GPU:1']
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    mem = MemoryTracker(prob)
    times = Timeline(prob)
    bl = prob.mean_bottom_levels()
    order = _etf(prob, mem, times, [-b for b in bl], deadline=deadline)
    return _finish(graph, cluster, prob, mem, times, order, "m-etf", t0, deadline=deadline)


def favourite_children(prob: Problem, *, time_limit: float | None = None,
                       deadline: Deadline | None = None) -> tuple[list[int], dict]:
    """SCT favourite children from the Hanen-Munier LP relaxation, solved by GLOP.

    Variables: start ``s_i``, makespan ``w`` and, per data edge ``(i, j)``,
    ``x_ij`` in [0, 1] (0: ``j`` is ``i``'s favourite child and pays no comm).
    Minimise ``w`` s.t. ``s_j >= s_i + p_i + c_ij x_ij``, ``w >= s_i + p_i``,
    every op has at most one favourite child (``sum_j x_ij >= outdeg - 1``) and
    at most one favourite parent (``sum_i x_ij >= indeg - 1``). Rounding:
    ``x_ij < 0.5`` makes ``j`` the favourite child (at most one per op by the
    constraints). ``p_i`` and ``c_ij`` are the means over allowed devices /
    device pairs.

    Returns the favourite parent of every op (-1 if none) and LP statistics.
    If GLOP fails, each op's favourite child is its heaviest-edge child.
    With ``deadline``, building the LP checks it (``Stopped``) and an
    interrupt stops GLOP (then as a time-out).
    """
    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter()
    n = prob.n
    fav_parent = [-1] * n
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if time_limit:
        solver.SetTimeLimit(int(time_limit * 1000))
    inf = solver.infinity()
    s = [solver.NumVar(0.0, inf, "") for _ in range(n)]
    w = solver.NumVar(0.0, inf, "w")
    p = [prob.mean_dur(i) for i in range(n)]
    xs: dict = {}
    out_x: list[list] = [[] for _ in range(n)]
    in_x: list[list] = [[] for _ in range(n)]
    outdeg = [sum(1 for _, nb in prob.outs[i] if nb > 0) for i in range(n)]
    indeg = [0] * n
    for i in range(n):
        for j, nb in prob.outs[i]:
            if nb > 0:
                indeg[j] += 1
    sole: dict = {}  # i's only data child whose only data parent is i: favourite for free
    for i in range(n):
        _tick(deadline, i)
        for j, nb in prob.outs[i]:
            c = prob.mean_comm(nb) if nb > 0 else 0.0
            if c > 0 and outdeg[i] == 1 and indeg[j] == 1:
                sole[i] = j
                solver.Add(s[j] - s[i] >= p[i])
            elif c > 0:
                x = solver.NumVar(0.0, 1.0, "")
                xs[(i, j)] = x
                out_x[i].append(x)
                in_x[j].append(x)
                solver.Add(s[j] - s[i] - c * x >= p[i])
            else:
                solver.Add(s[j] - s[i] >= p[i])
    for i in range(n):
        if not prob.succ[i]:
            solver.Add(w - s[i] >= p[i])
        if len(out_x[i]) > 1:
            solver.Add(solver.Sum(out_x[i]) >= len(out_x[i]) - 1)
        if len(in_x[i]) > 1:
            solver.Add(solver.Sum(in_x[i]) >= len(in_x[i]) - 1)
    solver.Minimize(w)
    build = time.perf_counter() - t0
    status = _solve_lp(solver, time_limit, deadline)
    ok = status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE)
    child = [-1] * n
    for i, j in sole.items():
        child[i], fav_parent[j] = j, i
    if ok:
        best = [1.0] * n
        for (i, j), x in xs.items():
            v = x.solution_value()
            if v < 0.5 - 1e-9 and v < best[i] and fav_parent[j] < 0:
                if child[i] >= 0:
                    fav_parent[child[i]] = -1
                child[i], best[i] = j, v
                fav_parent[j] = i
    else:
        for i in range(n):
            cand = [(nb, j) for j, nb in prob.outs[i] if nb > 0 and fav_parent[j] < 0]
            if cand:
                j = max(cand)[1]
                child[i] = j
                fav_parent[j] = i
    elapsed = time.perf_counter() - t0
    timed_out = bool(time_limit) and elapsed - build >= 0.95 * time_limit
    stats = {"lp_status": "optimal" if status == pywraplp.Solver.OPTIMAL else
             ("feasible" if ok else ("time_limit" if timed_out else "failed")),
             "lp_seconds": round(time.perf_counter() - t0, 3), "lp_build_seconds": round(build, 3),
             "lp_makespan": w.solution_value() if ok else None,
             "lp_variables": solver.NumVariables(), "lp_constraints": solver.NumConstraints(),
             "favourite_pairs": sum(1 for c in child if c >= 0)}
    return fav_parent, stats


def _solve_lp(solver, time_limit: float | None, deadline: Deadline | None):
    """GLOP's status; within what ``deadline`` leaves, stopped by its interrupt.

    The dual simplex is 3x faster than the primal on these LPs. It is chosen as
    a typed parameter: GLOP's parameter *string* goes through OR-Tools' C++
    protobuf parser, which segfaults once TensorFlow is loaded (two protobuf
    runtimes in one process: how a Keras user calls pesto.solve)."""
    from ortools.linear_solver import pywraplp

    params = pywraplp.MPSolverParameters()
    params.SetIntegerParam(params.LP_ALGORITHM, params.DUAL)
    if deadline is None:
        return solver.Solve(params)
    deadline.check()
    if not deadline.deterministic:  # GLOP's time limit is wall time
        solver.SetTimeLimit(int(1000 * max(0.01, deadline.budget(time_limit or LP_TIME_LIMIT))))
    with deadline.stopping(solver.InterruptSolve):
        return solver.Solve(params)


LP_TIME_LIMIT = 300.0  # s; m-SCT's default LP limit when no time_limit is given


def place_m_sct(graph: OpGraph, cluster: Cluster, *, time_limit: float | None = None,
                lp_time_limit: float | None = None, deadline: Deadline | None = None) -> Plan:
    """Baechi m-SCT: favourite children from an LP (:func:`favourite_children`,
    OR-Tools GLOP), then ETF where an op goes to its favourite parent's device
    whenever that device is free by the time the op's inputs arrive (an urgent
    op, which also wins ties), and plain m-ETF otherwise. Memory as in m-ETF.
    The LP is limited to ``lp_time_limit``, else ``time_limit``, else
    ``LP_TIME_LIMIT`` seconds (GLOP's time grows about quadratically with the
    graph); on time-out every op's favourite child is its
    heaviest-edge child (``HeuristicInfo.lp_status == "time_limit"``); ``lp``
    carries the other LP figures.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 10**8), ("a", "c", 10)])
    >>> p = place_m_sct(g, gpus(2))
    >>> p.placement["a"] == p.placement["b"]
    True
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    mem = MemoryTracker(prob)
    times = Timeline(prob)
    limit = lp_time_limit or time_limit or LP_TIME_LIMIT
    fav_parent, lp = favourite_children(prob, time_limit=limit, deadline=deadline)
    bl = prob.mean_bottom_levels()
    order = _etf(prob, mem, times, [-b for b in bl], fav_parent=fav_parent, deadline=deadline)
    info = HeuristicInfo(lp_status=lp["lp_status"], lp={k: v for k, v in lp.items() if k != "lp_status"})
    return _finish(graph, cluster, prob, mem, times, order, "m-sct", t0, info=info, deadline=deadline)


# -- Celeritas ------------------------------------------------------------------------
def bottom_level_order(prob: Problem) -> list[int]:
    """The topological order that takes, among ready ops, the one with the
    largest mean bottom level (:meth:`~pesto.problem.Problem.mean_bottom_levels`;
    ties: lower index) -- Celeritas's placement order.

    Not :func:`coarsen.celeritas.cpd_topo_order`, which goes depth first (the
    op made ready last comes first) on compute-only levels.
    """
    bl = prob.mean_bottom_levels()
    return priority_order(prob.succ, prob.pred, [-b for b in bl])


def place_celeritas(graph: OpGraph, cluster: Cluster, *, deadline: Deadline | None = None) -> Plan:
    """Celeritas: CPD-TOPO order, Order-Place, then Adjusting Placement.

    1. CPD-TOPO (:func:`bottom_level_order`).
    2. Order-Place: walk that order filling the main devices (the GPUs) one
       after the other, each up to an equal share of the total compute, so
       consecutive (mostly communicating) ops share a device.
    3. Adjusting Placement: walk the order again with estimated times; an op
       stays on its Order-Place device unless it would wait there (device
       busy after its inputs arrived) longer than the extra transfer time of
       running on another device, where it would then finish earlier; it
       moves there. The wait counts from the moment its producers end (inputs
       in transit and device busy), the transfer time likewise. Colocated ops follow their group's first member.

    Memory is best effort: an op goes to a device where it fits (its planned
    device first), else to the least-used allowed device.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1, "d": 1}, [("a", "b", 8), ("c", "d", 8)])
    >>> p = place_celeritas(g, gpus(2))
    >>> p.placement["a"] == p.placement["b"], p.placement["a"] != p.placement["c"]
    (True, True)
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    order = bottom_level_order(prob)
    fill = _main_devices(prob)
    work = [min(prob.dur[i][d] for d in prob.allowed[i]) for i in range(prob.n)]
    share = sum(work) / len(fill)
    # Order-Place
    planned = [-1] * prob.n
    load = [0.0] * prob.nd
    k = 0
    for i in order:
        cands = prob.allowed[i]
        while k < len(fill) - 1 and load[fill[k]] + work[i] / 2 > share + EPS:
            k += 1
        d = fill[k] if fill[k] in cands else min(cands, key=lambda e: (load[e], e))
        planned[i] = d
        load[d] += work[i]
    # Adjusting Placement with estimated times and memory
    mem = MemoryTracker(prob)
    times = Timeline(prob)
    moved = 0
    for step, i in enumerate(order):
        _tick(deadline, step)
        cands = _candidates(prob, mem, i)
        cur = planned[i] if planned[i] in cands else cands[0]
        if len(cands) > 1:
            fits = [d for d in cands if mem.fits(i, d)]
            if cur not in fits and fits:
                cur = min(fits, key=lambda d: times.earliest(i, d) + prob.dur[i][d])
            # wait: from the moment its producers end until it can start on cur
            # (inputs in transit, device busy); extra: transfer delay elsewhere
            r0 = max((times.finish[q] for q in prob.pred[i]), default=0.0)
            s_cur = times.earliest(i, cur)
            wait = s_cur - r0
            best, best_f = cur, s_cur + prob.dur[i][cur]
            if wait > EPS:
                for d in fits:
                    if d == cur:
                        continue
                    r = times.ready(i, d)
                    extra = max(0.0, r - r0)
                    f = max(times.avail[d], r) + prob.dur[i][d]
                    if wait > extra + EPS and f < best_f - EPS:
                        best, best_f = d, f
            if best != cur:
                moved += 1
            d = best if (fits or mem.fits(i, best)) else mem.best_effort(i, cands)
        else:
            d = cands[0]
        mem.commit(i, d)
        times.commit(i, d, times.earliest(i, d))
    return _finish(graph, cluster, prob, mem, times, order, "celeritas", t0, info=HeuristicInfo(moved=moved),
                   deadline=deadline)


# -- HEFT -------------------------------------------------------------------------------
def heft_ranks(prob: Problem) -> list[float]:
    """HEFT's upward rank (Topcuoglu et al.): mean compute over allowed
    devices plus, along the longest path to a sink, the mean transfer time over
    all ordered pairs of distinct devices on every data edge.

    Unlike :meth:`~pesto.problem.Problem.mean_bottom_levels` the transfer is
    not weighted by the chance that the two ends are apart (the paper's rank).
    """
    nd = prob.nd
    pairs = [(a, b) for a in range(nd) for b in range(nd) if a != b]
    b0 = sum(prob.beta0[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    b1 = sum(prob.beta1[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    out_bytes = [dict(o) for o in prob.outs]

    def edge(i, j):
        nb = out_bytes[i][j]
        return (b0 + b1 * nb) if nb > 0 and pairs else 0.0

    return bottom_levels(prob.succ, [prob.mean_dur(i) for i in range(prob.n)], edge=edge,
                         order=prob.topo)


def place_heft(graph: OpGraph, cluster: Cluster, *, deadline: Deadline | None = None) -> Plan:
    """HEFT (Topcuoglu et al. 2002): ops by decreasing upward rank
    (:func:`heft_ranks`; ties in topological order), each on the device
    giving the earliest finish time, using the earliest idle gap on that
    device long enough for it (insertion policy,
    :meth:`pesto.engine.Timeline.earliest` with ``insert=True``). Comm by the
    cluster's routes. Memory: devices where the op does not fit are skipped;
    none left means best effort. Order on each device: by estimated start time.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 3, "b": 3}, [])
    >>> place_heft(g, gpus(2)).makespan
    3.0
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    mem = MemoryTracker(prob)
    times = Timeline(prob)
    rank = heft_ranks(prob)
    topo_pos = [0] * prob.n
    for k, i in enumerate(prob.topo):
        topo_pos[i] = k
    seq = sorted(range(prob.n), key=lambda i: (-rank[i], topo_pos[i]))
    for step, i in enumerate(seq):
        _tick(deadline, step)
        cands = _candidates(prob, mem, i)
        fits = [d for d in cands if mem.fits(i, d)] or [mem.best_effort(i, cands)]
        best = None
        for d in fits:
            s = times.earliest(i, d, insert=True)
            f = s + prob.dur[i][d]
            if best is None or f < best[0] - EPS:
                best = (f, s, d)
        f, s, d = best
        mem.commit(i, d)
        times.commit(i, d, s)
    rank_pos = {i: k for k, i in enumerate(seq)}
    order = sorted(range(prob.n), key=lambda i: (times.start[i], rank_pos[i]))
    return _finish(graph, cluster, prob, mem, times, order, "heft", t0, deadline=deadline)
