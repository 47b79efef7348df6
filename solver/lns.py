"""CP-SAT large-neighbourhood search on the full graph.

:func:`lns` repeatedly frees a *window* of :data:`WINDOW` ops of the incumbent
schedule, solves their placement and order exactly against the rest of the
schedule (:func:`solver.lns_model.solve_window`: fixed ops as release times,
deadlines and busy intervals, later ops as tails), writes the window back and
keeps the plan only if the simulator (:func:`pesto.engine.replay`, fixed
per-device order) says the step got shorter and memory still fits.

Window kinds, taken in turn (``kinds``):

========  ======================================================================
slice     the ops starting around a time ``t`` of the incumbent (all devices)
critical  zero-slack ops around ``t`` (:func:`solver.search.slack`), filled
          up with the least-slack ops starting in the same time span
pair      the ops of two devices around ``t``: the one idle at ``t`` and the
          busiest one nearby (only with three devices or more)
========  ======================================================================

``t`` is drawn where time is lost: inside an idle gap of a device (weighted by
its length), or uniformly with probability ``UNIFORM``. A colocation unit
moves only when every member is in the window (members starting within the
window's time span are added); otherwise its ops keep their device.

Examples
--------
Two independent chains all on one GPU: the window puts one chain on the other GPU.

>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> from solver.search import reschedule
>>> g = OpGraph.from_edges({"a": 5, "b": 5, "c": 5, "d": 5}, [("a", "b", 8), ("c", "d", 8)])
>>> c = gpus(2, beta=(1.0, 0.0))
>>> start = reschedule(g, c, {op: "/GPU:0" for op in g.names})
>>> p = lns(g, c, start, time_limit=10, max_windows=3)
>>> start.makespan, p.makespan, p.info_of(LnsInfo).kept >= 1
(20.0, 10.0, True)
"""
from __future__ import annotations

import random
import time
from bisect import bisect_left
from typing import Sequence

from pesto.cluster import Cluster
from pesto.engine import replay
from pesto.errors import InvalidPlanError
from pesto.graph import OpGraph
from pesto.outcome import LnsInfo
from pesto.plan import Plan
from pesto.deadline import REPLAY_COST_PER_OP, Deadline
from pesto.problem import Problem
from pesto.simulate import simulate
from pesto.finalize import finalize

from .lns_model import solve_window
from .search import slack

__all__ = ["lns", "KINDS", "UNIFORM", "WINDOW"]

KINDS = ("slice", "critical", "pair")
WINDOW = 120  # ops per window (the default; sizes compared in benchmarks/results/lns.md, "Window size")
UNIFORM = 0.25  # share of windows centred on a uniformly drawn time, not an idle gap
WALL_FACTOR = 3  # wall-clock cap per window, in deterministic seconds (a loaded machine runs 2-10x slower)


class _Incumbent:
    """The incumbent schedule as index arrays, with its tails, slack and idle gaps."""

    def __init__(self, prob: Problem, plan: Plan):
        self.prob = prob
        sched = simulate(prob.graph, prob.cluster, plan, mode="order")
        names, dn = prob.names, prob.dev_names
        self.dev = prob.placement_index(sched.placement)
        self.st = [sched.start[nm] for nm in names]
        self.fi = [sched.finish[nm] for nm in names]
        self.order = [[prob.index[o] for o in sched.order.get(d, ())] for d in dn]
        self.makespan = sched.makespan
        tid = {t[0]: k for k, t in enumerate(prob.tensors)}
        di = prob.dev_index
        self.xfers = []  # the engine's form: (producer, tensor, bytes, dst, start, finish, consumers there)
        for x in sched.transfers:
            k = tid[x.tensor]
            _, i, nbytes, cons = prob.tensors[k]
            d = di[x.dst]
            self.xfers.append((i, k, nbytes, d, x.start, x.finish, [j for j in cons if self.dev[j] == d]))
        self.over = sum(max(0, sched.peak_memory[d.name] - d.memory) for d in prob.cluster.devices)
        self.slack = slack(prob.graph, prob.cluster, sched)
        self.tail = [max(0.0, self.makespan - self.st[i] - self.slack[i]) for i in range(prob.n)]
        self.by_start = sorted(range(prob.n), key=lambda i: (self.st[i], self.fi[i]))
        self.starts = [self.st[i] for i in self.by_start]
        self.gaps = []  # (length, device, time)
        for d, seq in enumerate(self.order):
            for a, b in zip(seq, seq[1:]):
                if self.st[b] - self.fi[a] > 1e-9:
                    self.gaps.append((self.st[b] - self.fi[a], d, self.fi[a]))
        self.plan = sched

    def plan_of(self) -> tuple[dict, dict]:
        prob = self.prob
        dn, names = prob.dev_names, prob.names
        placement = {names[i]: dn[d] for i, d in enumerate(self.dev)}
        return placement, {dn[d]: [names[i] for i in seq] for d, seq in enumerate(self.order)}


def _time(inc: _Incumbent, rng: random.Random) -> tuple[float, int | None]:
    """A time to centre a window on, and the device idle then (None: drawn uniformly)."""
    if not inc.gaps or rng.random() < UNIFORM:
        return rng.uniform(0.0, inc.makespan), None
    total = sum(g[0] for g in inc.gaps)
    r = rng.uniform(0.0, total)
    for length, d, t in inc.gaps:
        r -= length
        if r <= 0:
            return t, d
    return inc.gaps[-1][2], inc.gaps[-1][1]


def _around(ops: Sequence[int], starts: Sequence[float], t: float, size: int) -> list[int]:
    """The ``size`` ops of ``ops`` (sorted by start) nearest ``t`` as a contiguous run."""
    pos = bisect_left(starts, t)
    lo = max(0, min(pos - size // 2, len(ops) - size))
    return list(ops[lo:lo + size])


def _pick(kind: str, inc: _Incumbent, rng: random.Random, size: int):
    """A window (op indices) and the devices its ops may use (None: all)."""
    t, idle = _time(inc, rng)
    if kind == "slice":
        return _around(inc.by_start, inc.starts, t, size), None
    if kind == "critical":
        eps = 1e-6 * max(1.0, inc.makespan)
        crit = [i for i in inc.by_start if inc.slack[i] <= eps]
        core = _around(crit, [inc.st[i] for i in crit], t, size // 2)
        if not core:
            return [], None
        lo, hi = inc.st[core[0]], inc.st[core[-1]]
        a, b = bisect_left(inc.starts, lo), bisect_left(inc.starts, hi + 1e-9)
        rest = sorted((i for i in inc.by_start[a:b] if inc.slack[i] > eps), key=lambda i: inc.slack[i])
        return core + rest[:size - len(core)], None
    # pair: the idle device and the busiest other one among the ops around t
    near = _around(inc.by_start, inc.starts, t, size)
    busy = [0.0] * inc.prob.nd
    for i in near:
        busy[inc.dev[i]] += inc.fi[i] - inc.st[i]
    if idle is None:
        idle = min(range(inc.prob.nd), key=lambda d: (busy[d], d))
    other = max((d for d in range(inc.prob.nd) if d != idle), key=lambda d: (busy[d], -d))
    ops = [i for i in inc.by_start if inc.dev[i] in (idle, other)]
    return _around(ops, [inc.st[i] for i in ops], t, size), [idle, other]


def _close_units(prob: Problem, inc: _Incumbent, window: list[int]) -> list[int]:
    """``window`` plus the missing members of its units that start within its time span."""
    if not window:
        return window
    lo, hi = min(inc.st[i] for i in window), max(inc.st[i] for i in window)
    inw = set(window)
    out = list(window)
    for u in sorted({prob.unit[i] for i in window}):
        for j in prob.members[u]:
            if j not in inw and lo <= inc.st[j] <= hi:
                inw.add(j)
                out.append(j)
    return out


def _compose(prob: Problem, inc: _Incumbent, window: list[int], res, topo_pos) -> tuple[list, list]:
    """The placement and per-device order with the window's answer written back."""
    inw = set(window)
    hi = max(inc.st[i] for i in window)
    dev = list(inc.dev)
    for i, d in res.dev.items():
        dev[i] = d
    head: list[list] = [[] for _ in range(prob.nd)]
    tail: list[list] = [[] for _ in range(prob.nd)]
    for d, seq in enumerate(inc.order):
        for j in seq:
            if j in inw:
                continue
            if inc.st[j] <= hi:
                head[d].append((inc.st[j], topo_pos[j], j))
            else:
                tail[d].append(j)
    for i in window:
        head[dev[i]].append((res.key[i], topo_pos[i], i))
    order = [[j for _, _, j in sorted(h)] + t for h, t in zip(head, tail)]
    return dev, order


def lns(graph: OpGraph, cluster: Cluster, plan: Plan, *, time_limit: float, window: int = WINDOW,
        seed: int = 0, workers: int = 1, window_time: float = 1.0, max_windows: int | None = None,
        kinds: Sequence[str] = KINDS, links: bool | str = "alternate", log: bool = False,
        deadline: Deadline | None = None) -> Plan:
    """Large-neighbourhood search with CP-SAT windows on the full graph.

    Parameters
    ----------
    plan : Plan
        A plan of ``graph`` (placement and order); the start.
    time_limit : float
        Seconds for the search (the last window may overrun by its model build).
    window : int
        Ops per window (colocation members may add a few).
    seed : int
        Window choice and CP-SAT's seed; with ``workers=1`` and ``max_windows``
        the result is deterministic as long as each window stops on CP-SAT's
        deterministic time limit (``window_time``), not on its wall-clock
        safety net (``WALL_FACTOR`` x ``window_time``) or the end of ``time_limit``.
    workers : CP-SAT workers per window
    window_time : float
        CP-SAT's deterministic time per window (about seconds; wall time
        depends on the machine's load).
    max_windows : int, optional
        Stop after this many windows.
    kinds : window kinds to rotate through (see the module docstring)
    links : True, False or "alternate"
        On a cluster whose links contend, True: transfers hold their links in
        the window model (no-overlap per link); False: precedence delays only
        (models about 3x smaller); "alternate" (the default): every second
        window with links. Neither wins everywhere (benchmarks/results/lns.md).
    log : bool
        CP-SAT's search log.

    deadline : pesto.deadline.Deadline, optional
        The whole solve's clock: the search ends at ``time_limit`` or when it
        does (an interrupt included); in deterministic mode windows are
        bounded by deterministic time only, and their work is charged to it.

    Returns
    -------
    Plan
        ``placer="lns"``, simulated in its fixed order, never worse than
        ``plan`` re-simulated in its order; its :class:`~pesto.outcome.LnsInfo`
        has the windows tried and kept and the gain per kind.
    """
    t0 = time.perf_counter()
    clock = deadline.sub(time_limit) if deadline is not None else Deadline(time_limit)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown window kinds {unknown}; choose among {KINDS}")
    if links not in (True, False, "alternate"):
        raise ValueError(f"links must be True, False or 'alternate', got {links!r}")
    if window < 1 or time_limit < 0:
        raise ValueError(f"window must be >= 1 and time_limit >= 0, got {window}, {time_limit}")
    prob = Problem.of(graph, cluster)
    inc = _Incumbent(prob, plan)
    start_makespan = inc.makespan
    kinds = [k for k in kinds if k != "pair" or prob.nd > 2] or ["slice"]
    topo_pos = [0] * prob.n
    for r, i in enumerate(prob.topo):
        topo_pos[i] = r
    rng = random.Random(seed)
    per = {k: {"tried": 0, "kept": 0, "gain": 0.0} for k in kinds}
    cpsat: dict[str, int] = {}
    tried = 0
    while max_windows is None or tried < max_windows:
        left = clock.left()
        if left <= 0.05:
            break
        kind = kinds[tried % len(kinds)]
        tried += 1
        w, devices = _pick(kind, inc, rng, min(window, prob.n))
        w = _close_units(prob, inc, w)
        if not w:
            continue
        per[kind]["tried"] += 1
        res = solve_window(prob, inc.dev, inc.st, inc.fi, inc.tail, w, devices=devices, order=inc.order,
                           xfers=inc.xfers if links is True or (links and tried % 2 == 0) else None,
                           time_limit=min(window_time, left),
                           wall_limit=(10 * WALL_FACTOR * window_time + 5.0 if clock.deterministic
                                       else min(WALL_FACTOR * window_time, left)),
                           workers=workers, seed=seed + tried, log=log, deadline=clock)
        cpsat[res.status] = cpsat.get(res.status, 0) + 1
        if res.dev:
            clock.charge(REPLAY_COST_PER_OP * prob.n)
            new = _try(prob, inc, w, res, topo_pos)
            if new is not None:
                per[kind]["kept"] += 1
                per[kind]["gain"] += inc.makespan - new.makespan
                inc = new
    placement, order = inc.plan_of()
    info = LnsInfo(windows=sum(v["tried"] for v in per.values()), kept=sum(v["kept"] for v in per.values()),
                   start_makespan=start_makespan, makespan=inc.makespan, by_kind=per, cpsat=cpsat, window=window,
                   seconds=time.perf_counter() - t0)
    return finalize(graph, cluster, placement, order=order, placer="lns", t0=t0, stats=dict(plan.stats),
                    info=plan.info + (info,))


def _try(prob: Problem, inc: _Incumbent, window: list[int], res, topo_pos) -> _Incumbent | None:
    """The incumbent with the window's answer, if the simulator confirms a shorter
    step and memory over capacity does not grow; else None."""
    dev, order = _compose(prob, inc, window, res, topo_pos)
    if dev == inc.dev and order == inc.order:
        return None
    try:
        run = replay(prob, dev, policy="order", order=order)
    except InvalidPlanError:
        return None
    if run.makespan >= inc.makespan - 1e-9 * max(1.0, inc.makespan):
        return None
    dn, names = prob.dev_names, prob.names
    plan = Plan({names[i]: dn[d] for i, d in enumerate(dev)},
                {dn[d]: [names[i] for i in seq] for d, seq in enumerate(order)})
    new = _Incumbent(prob, plan)
    if new.over > inc.over:
        return None
    return new
