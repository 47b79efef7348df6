"""Local search on the full graph: rescheduling and moving groups of ops.

Coarsening makes the exact solve tractable but costs parallelism: a coarse
vertex runs its members back to back, and the expanded plan keeps the coarse
order. Two cheap passes on the *full* graph win much of it back:

* :func:`reschedule` keeps a placement and picks the best per-device order
  among TF's FIFO, a list schedule by placed rank (longest path to the exit
  under the placement, transfers included:
  :meth:`~pesto.problem.Problem.placed_bottom_levels`), the given order, and a
  list schedule that follows the given plan's start times where it can;
* :func:`refine` moves groups of ops (coarse vertices of a partition-aware
  coarsening, colocation groups joined) between devices, keeps a move when
  the simulated step time drops and memory still fits, and ends with
  :func:`reschedule`.

Both return a Plan from :func:`pesto.finalize.finalize` (simulated, fixed
order), never worse than the plan they start from, with a
:class:`~pesto.outcome.RescheduleInfo` / :class:`~pesto.outcome.RefineInfo`. The recipes that call
them live in :mod:`solver.recipes`.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 5, "b": 5, "c": 5, "d": 5}, [("a", "b", 8), ("c", "d", 8)])
>>> c = gpus(2, beta=(1.0, 0.0))
>>> start = reschedule(g, c, {op: "/GPU:0" for op in g.names})
>>> start.makespan
20.0
>>> refine(g, c, start, time_limit=5).makespan
10.0
"""
from __future__ import annotations

import random
import time
from typing import Mapping, Sequence

import numpy as np

import coarsen
from pesto.cluster import Cluster
from pesto.dag import UnionFind
from pesto.engine import ReplayResult, replay
from pesto.graph import OpGraph
from pesto.kernels import placed_ranks
from pesto.outcome import RefineInfo, RescheduleInfo
from pesto.plan import Plan
from pesto.deadline import REPLAY_COST_PER_OP, Deadline
from pesto.problem import Problem
from pesto.simulate import run_peak, simulate
from pesto.finalize import carried, finalize


__all__ = ["reschedule", "refine", "slack", "move_groups", "better", "CANDIDATES", "SINGLE_OPS_UP_TO"]

CANDIDATES = ("fifo", "rank", "given", "given-list")
SINGLE_OPS_UP_TO = 2048  # above this, single-op moves cost more than a search can afford


def slack(graph: OpGraph, cluster: Cluster, sched) -> list[float]:
    """Per op (``graph.names`` order): how much later it could start without
    delaying the step, in ``sched``'s placement and per-device order (transfer
    delays at the route's time, link queueing ignored). Zero on the critical
    path; :func:`refine` tries moving the least slack units first.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> from pesto.simulate import simulate
    >>> g = OpGraph.from_edges({"a": 1, "b": 5, "c": 1}, [("a", "b", 0), ("a", "c", 0)])
    >>> s = simulate(g, gpus(2), {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"})
    >>> slack(g, gpus(2), s)
    [0.0, 0.0, 4.0]
    """
    prob = Problem.of(graph, cluster)
    idx = prob.index
    dev = prob.placement_index(sched.placement)
    st = [sched.start[nm] for nm in prob.names]
    fi = [sched.finish[nm] for nm in prob.names]
    ran = [[idx[o] for o in seq] for seq in sched.order.values()]
    return _slack(prob, dev, st, fi, ran, sched.makespan)


def _slack(prob: Problem, dev, st, fi, ran, end: float) -> list[float]:
    """:func:`slack` on index arrays (``ran``: per device, the ops in the order they ran)."""
    n = prob.n
    nxt = [-1] * n
    for seq in ran:
        for a, b in zip(seq, seq[1:]):
            nxt[a] = b
    outs = [[(j, prob.comm(dev[i], dev[j], nb)) for j, nb in prob.outs[i]] for i in range(n)]
    latest = [0.0] * n  # latest finish
    topo_pos = [0] * n
    for r, i in enumerate(prob.topo):
        topo_pos[i] = r
    # reverse of the start order is a reverse topological order of DAG + device chains
    for i in sorted(range(n), key=lambda k: (st[k], fi[k], topo_pos[k]), reverse=True):
        lf = end
        for j, delay in outs[i]:
            v = latest[j] - (fi[j] - st[j]) - delay
            if v < lf:
                lf = v
        j = nxt[i]
        if j >= 0:
            v = latest[j] - (fi[j] - st[j])
            if v < lf:
                lf = v
        latest[i] = lf
    return [max(0.0, latest[i] - fi[i]) for i in range(n)]


def _given_priority(graph: OpGraph, plan: Plan) -> list[float]:
    """Priority that replays ``plan`` where it can: earlier start = higher."""
    if plan.start is not None:
        return [-float(plan.start[nm]) for nm in graph.names]
    pos = {op: k for seq in plan.order.values() for k, op in enumerate(seq)}
    return [-float(pos[nm]) for nm in graph.names]


def better(a: Plan, b: Plan | None) -> bool:
    """``a`` beats ``b``: fits memory when ``b`` does not, else a step shorter
    by more than 1e-9 µs (so on a tie the plan already held stays).

    >>> better(Plan({}, {}, makespan=5.0), Plan({}, {}, makespan=6.0, status="infeasible"))
    True
    >>> better(Plan({}, {}, makespan=5.0), Plan({}, {}, makespan=5.0))
    False
    """
    if b is None:
        return True
    fa, fb = a.status != "infeasible", b.status != "infeasible"
    if fa != fb:
        return fa
    return a.makespan < b.makespan - 1e-9


def _candidate_order(graph, cluster, cand, placement, given_plan, given_order):
    """The per-device order of one reschedule candidate; None means TF's FIFO
    and ``False`` that the candidate does not apply (no given order)."""
    if cand == "fifo":
        return None
    if cand == "given":
        return False if given_order is None else {d: list(s) for d, s in given_order.items()}
    if cand == "given-list":
        if given_plan is None and given_order is None:
            return False
        prio = _given_priority(graph, given_plan if given_plan is not None else Plan(placement, given_order))
    else:  # "rank": longest path to the exit under this placement
        prob = Problem.of(graph, cluster)
        prio = prob.placed_bottom_levels(prob.placement_index(placement))
    return simulate(graph, cluster, placement, mode="fifo", priority=prio, memory=False).order


def reschedule(graph: OpGraph, cluster: Cluster, placement, *, candidates: Sequence[str] = CANDIDATES,
               given_order: Mapping[str, Sequence[str]] | None = None, placer: str | None = None,
               status: str = "heuristic", deadline: Deadline | None = None, **fields) -> Plan:
    """The best per-device order for a fixed placement.

    Parameters
    ----------
    placement : mapping op -> device, or a Plan
        With a Plan, its order is the ``"given"`` candidate (unless
        ``given_order`` is passed) and its times guide ``"given-list"``.
    candidates : names among ``"fifo"`` (TF's ready queue), ``"rank"`` (list
        schedule by placed rank, :meth:`Problem.placed_bottom_levels
        <pesto.problem.Problem.placed_bottom_levels>`), ``"given"``
        (``given_order`` as is), ``"given-list"`` (list schedule preferring
        ops that start earlier in the given plan; it may fill idle gaps the
        given order leaves). Candidates that need a given order are skipped
        without one.
    given_order : per-device op sequences, optional
    placer, status, fields
        For the returned Plan (``placer`` defaults to the Plan's, else
        "reschedule"; a Plan's ``info`` and ``stats`` are carried over).
    deadline : pesto.deadline.Deadline, optional
        The ``"given"`` candidate is tried first (it wins ties), and once the
        deadline has passed no further one is (one always is);
        ``RescheduleInfo.cut`` then says why.

    Returns
    -------
    Plan
        Simulated in its fixed order (the winner's order replayed gives the
        same times); memory-feasible candidates beat infeasible ones, then the
        shortest step wins. Its :class:`~pesto.outcome.RescheduleInfo` has
        every candidate's step, the winner and any cut.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 9, "c": 1, "d": 1},
    ...                        [("a", "b", 0), ("c", "d", 0), ("d", "b", 0)])
    >>> p = reschedule(g, gpus(1), {op: "/GPU:0" for op in g.names}, candidates=("rank",))
    >>> p.makespan, dict(p.info_of(RescheduleInfo).candidates)
    (12.0, {'rank': 12.0})
    """
    t0 = time.perf_counter()
    given_plan = placement if isinstance(placement, Plan) else None
    if given_plan is not None:
        placement = given_plan.placement
        if given_order is None:
            given_order = given_plan.order
        placer = placer or given_plan.placer
        fields.setdefault("stats", dict(given_plan.stats))
        fields.setdefault("info", given_plan.info)
    placement = dict(placement)
    placer = placer or "reschedule"
    cut = None
    unknown = [c for c in candidates if c not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown reschedule candidates {unknown}; choose among {CANDIDATES}")
    seen: dict[str, float] = {}
    best = None
    if deadline is not None and given_order is not None and "given" in candidates:
        # the given order first (one simulation, never worse than the start), then
        # the others while there is time; with none left, the given order only
        candidates = ("given",) + tuple(c for c in candidates if c != "given")
    for cand in candidates:
        if best is not None and deadline is not None and deadline.expired():
            cut = deadline.reason or "time limit"
            break
        order = _candidate_order(graph, cluster, cand, placement, given_plan, given_order)
        if order is False:
            continue
        plan = finalize(graph, cluster, placement, order=order, placer=placer, t0=t0, status=status, **fields)
        if order is None:  # FIFO: fix the order it ran in, so the plan replays exactly
            plan = plan.replace(order={d: tuple(s) for d, s in plan.order.items()})
        seen[cand] = plan.makespan
        if better(plan, best):
            best, won = plan, cand
    if best is None:
        raise ValueError("no reschedule candidate applies (give 'fifo' or 'rank', or a given order)")
    info = RescheduleInfo(candidates=seen, schedule=won, cut=cut)
    return best.replace(wall_time=time.perf_counter() - t0, info=best.info + (info,))


# -- local search ---------------------------------------------------------------------
def _raw_units(graph: OpGraph, cluster: Cluster, placement, groups, targets) -> list[list[list[int]]]:
    """Levels of units before colocation closure (see :func:`move_groups`)."""
    idx = graph.index
    n = graph.num_ops
    if groups is None:
        levels, sizes = [], set()
        for tgt in sorted(targets):
            if tgt >= n:
                break
            cg = coarsen.coarsen(graph, tgt, partition=dict(placement), cluster=cluster)
            if cg.graph.num_ops not in sizes:
                sizes.add(cg.graph.num_ops)
                levels.append([[idx[o] for o in ms] for ms in cg.members.values()])
        if n <= SINGLE_OPS_UP_TO:
            levels.append([[i] for i in range(n)])
        return levels
    if hasattr(groups, "get"):
        by: dict = {}
        for op, lab in groups.items():
            by.setdefault(lab, []).append(idx[op])
        return [list(by.values())]
    return [[[idx[o] for o in g] for g in groups]]


def _close_colocation(units: list[list[int]], col: list[int], n: int) -> list[list[int]]:
    """``units`` plus a single-op unit for every op in none, with units that
    share a colocation group joined (in order of their first unit)."""
    covered = {i for ms in units for i in ms}
    units = list(units) + [[i] for i in range(n) if i not in covered]
    uf = UnionFind(len(units))
    owner: dict = {}
    for u, ms in enumerate(units):
        for i in ms:
            if col[i] >= 0:
                uf.union(owner.setdefault(col[i], u), u)
    merged: dict = {}
    for u, ms in enumerate(units):
        merged.setdefault(uf.find(u), []).extend(ms)
    return [sorted(set(ms)) for ms in merged.values()]


def move_groups(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str], groups=None, *,
                targets: Sequence[int] = (2, 8, 32, 128, 512, 2048)) -> list[list[list[int]]]:
    """Levels of move units (lists of op indices), coarse to fine.

    ``groups``: a list of op-name lists, a mapping op -> label, or None for
    the vertices of partition-aware coarsenings (``partition=placement``) to
    each of ``targets`` vertices below the op count, then single ops on graphs
    of at most ``SINGLE_OPS_UP_TO`` ops. Every unit is closed under colocation (units
    sharing a colocation group are joined), so any move keeps groups whole.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "c": 1}, [("a", "b", 0), ("b", "c", 0)])
    >>> move_groups(g, gpus(2), {}, groups=[["a", "b"]])
    [[[0, 1], [2]]]
    """
    gid: dict = {}
    col = [gid.setdefault(op.colocation_group, len(gid)) if op.colocation_group is not None else -1
           for op in graph.ops]
    return [_close_colocation(units, col, graph.num_ops)
            for units in _raw_units(graph, cluster, placement, groups, targets)]


class _Search:
    """The state of one :func:`refine` run: the placement as a device index
    per op (an int64 array, what the compiled engine reads without a copy),
    the best step found from it, and the best placement ever seen."""

    def __init__(self, graph: OpGraph, cluster: Cluster, place, start: Plan, *, seed: int,
                 deadline: Deadline, max_evals: int | None, with_fifo: bool):
        self.graph, self.cluster = graph, cluster
        self.prob = prob = Problem.of(graph, cluster)
        self.rng = random.Random(seed)
        self.deadline, self.max_evals, self.with_fifo = deadline, max_evals, with_fifo
        self.eval_cost = REPLAY_COST_PER_OP * len(place) * (2 if with_fifo else 1)
        self.work = [prob.fastest(i) for i in range(prob.n)]
        self.place = place = np.array(place, dtype=np.int64)
        self.best_sched, self.sched_place = self.score(place), place.copy()
        self.best = min(self.best_sched.makespan, start.makespan)
        self.base_over = self.over(start.peak_memory)
        self.evals, self.accepted, self.kicks = 1, 0, 0
        self.per_level: list[int] = []
        self.stop = False
        self._slack_of: tuple = (None, None)
        self.glob, self.glob_place, self.glob_over = self.best, place.copy(), self.base_over

    def placement(self, place) -> dict[str, str]:
        dn = self.prob.dev_names
        return dict(zip(self.prob.names, [dn[k] for k in place.tolist()]))

    def over(self, peak) -> float:
        """Bytes over capacity, summed over devices."""
        return float(sum(max(0, peak[d.name] - d.memory) for d in self.cluster.devices))

    def memory_over(self, place) -> float:
        """Bytes over capacity under TF's FIFO schedule of ``place``."""
        return self.over(run_peak(self.prob, place, replay(self.prob, place, policy="fifo")))

    def score(self, place) -> ReplayResult:
        """The schedule of ``place`` by placed rank (with ``with_fifo``, or TF's FIFO if shorter).

        The engine's compiled replay straight on the index arrays: no names,
        no Schedule, so a move on a 36k-op graph costs milliseconds."""
        prob = self.prob
        a = replay(prob, place, policy="priority", priority=placed_ranks(prob, place))
        if not self.with_fifo:
            return a
        b = replay(prob, place, policy="fifo")
        return a if a.makespan <= b.makespan else b

    def targets(self, ms: list[int]) -> list[int]:
        """Devices every member of a unit may run on."""
        ok = set(range(self.prob.nd))
        for i in ms:
            ok &= set(self.prob.allowed[i])
        return sorted(ok)

    def descend(self, levels) -> None:
        """Sweep the levels, coarse to fine, again while some level improved."""
        outer = True
        while outer and not self.stop:
            outer = False
            for lv, units in enumerate(levels):
                if len(self.per_level) <= lv:
                    self.per_level.append(0)
                improved = True
                while improved and not self.stop:
                    improved = self.sweep(lv, units)
                    outer = outer or improved

    def sweep(self, lv: int, units) -> bool:
        """Try every unit of one level on every other device; True if a move was kept."""
        # least slack first (critical units), then the heaviest, random among equals
        run = self.best_sched
        if self._slack_of[0] is not run:  # slack costs more than a move: once per schedule
            self._slack_of = (run, _slack(self.prob, self.sched_place.tolist(), run.start, run.finish,
                                          run.ran, run.makespan))
        sl = self._slack_of[1]
        key = [(round(min(sl[i] for i in ms), 3), -sum(self.work[i] for i in ms)) for ms in units]
        seq = list(range(len(units)))
        self.rng.shuffle(seq)
        seq.sort(key=lambda u: key[u])
        improved = False
        for u in seq:
            ms = units[u]
            for d in self.targets(ms):
                if (self.place[ms] == d).all():
                    continue
                if self.deadline.expired() or (
                        self.max_evals is not None and self.evals >= self.max_evals):
                    self.stop = True
                    break
                improved = self.try_move(ms, d, lv) or improved
            if self.stop:
                break
        return improved

    def try_move(self, ms: list[int], d: int, lv: int) -> bool:
        """Move unit ``ms`` to device ``d``; keep it if the step drops and memory still fits."""
        place = self.place
        old = place[ms]  # a copy (fancy indexing)
        place[ms] = d
        sched = self.score(place)
        self.evals += 1
        self.deadline.charge(self.eval_cost)
        new = sched.makespan
        if new < self.best - 1e-6 * max(1.0, self.best):
            o = self.memory_over(place)
            if o <= self.base_over:
                self.best, self.base_over, self.best_sched, self.sched_place = new, o, sched, place.copy()
                self.accepted += 1
                self.per_level[lv] += 1
                return True
        place[ms] = old
        return False

    def keep_if_best(self) -> None:
        if self.best < self.glob - 1e-6 * max(1.0, self.glob):
            self.glob, self.glob_place, self.glob_over = self.best, self.place.copy(), self.base_over

    def kick(self, levels) -> None:
        """Move 1-3 random units of the best placement ever seen; search on from there
        unless that breaks memory more than the best did."""
        rng = self.rng
        pool = [u for u in levels if len(u) >= 4] or levels
        units = pool[rng.randrange(len(pool))]
        place = self.glob_place.copy()
        for u in rng.sample(range(len(units)), min(len(units), rng.randint(1, 3))):
            d = rng.choice(self.targets(units[u]))
            place[units[u]] = d
        self.kicks += 1
        o = self.memory_over(place)
        if o > self.glob_over:
            self.place = self.glob_place.copy()
            return
        self.place = place
        self.best_sched, self.sched_place = self.score(place), place.copy()
        self.evals += 1
        self.best, self.base_over = self.best_sched.makespan, o


def refine(graph: OpGraph, cluster: Cluster, plan: Plan, *, groups=None, time_limit: float = 10,
           seed: int = 0, max_evals: int | None = None, targets: Sequence[int] = (2, 8, 32, 128, 512, 2048),
           candidates: Sequence[str] = CANDIDATES, with_fifo: bool = False, kicks: int = 1000,
           deadline: Deadline | None = None) -> Plan:
    """Local search on the full graph: move groups of ops to other devices.

    Each move sends one unit (see :func:`move_groups`) to another device whose
    kind every member allows; the placement is scored by a list schedule by
    placed rank (with ``with_fifo``, also TF's FIFO, the better counting: twice
    the cost per move). Units are tried least slack first (:func:`slack`). A move is kept when the
    step gets shorter and no device goes over its memory (or, if the start
    already is over, the overflow does not grow). Levels go coarse to fine;
    a level is passed over again while it improves. When no move helps and
    time is left, the best placement is kicked (1-3 random units moved) and
    the search goes on from there, at most ``kicks`` times (iterated local
    search; the best placement ever seen is kept). The result is
    :func:`reschedule`-d, placed rank first (the order the moves were scored
    with, so a search its clock stopped keeps the step it found), then FIFO;
    the start plan's order is a candidate when the placement did not change;
    it is never worse than ``plan`` (re-simulated).

    Parameters
    ----------
    plan : Plan
        A plan of ``graph`` (placement and order; times not needed).
    groups : see :func:`move_groups`
    time_limit : float
        Seconds for the search; the final re-ordering stops on it too (after one
        candidate order: placed rank; with ``with_fifo`` both, the search's score).
    seed : int
        Order in which units are tried; with ``max_evals`` the result is
        deterministic (a time limit may stop the search earlier on a slower
        machine).
    max_evals : int, optional
        Stop after this many scored placements.
    targets : vertex counts of the partition-aware coarsenings giving the move
        units (see :func:`move_groups`); ignored with ``groups``.
    candidates : orders for the final :func:`reschedule`.
    deadline : pesto.deadline.Deadline, optional
        The whole solve's clock: the search ends at ``time_limit`` or when it
        does (an interrupt included); in deterministic mode each scored
        placement is charged to it, so the same input makes the same moves.

    Returns
    -------
    Plan
        ``placer="refine"``; its :class:`~pesto.outcome.RefineInfo` has the
        evaluations, accepted moves, the step before and after, and
        ``search_seconds`` (the time spent moving units, after building the
        levels; a diagnostic).
    """
    t0 = time.perf_counter()
    # the start, as a fixed-order plan
    start = finalize(graph, cluster, dict(plan.placement), order={d: list(s) for d, s in plan.order.items()},
                     placer="refine", t0=t0, status="heuristic")
    place = Problem.of(graph, cluster).placement_index(plan.placement)
    clock = deadline.sub(time_limit) if deadline is not None else Deadline(time_limit)
    search = _Search(graph, cluster, place, start, seed=seed, deadline=clock,
                     max_evals=max_evals, with_fifo=with_fifo)
    levels = move_groups(graph, cluster, plan.placement, groups, targets=targets)
    t_search = time.perf_counter()
    while True:
        search.descend(levels)
        search.keep_if_best()
        if search.stop or search.kicks >= kicks or clock.expired():
            break
        search.kick(levels)  # converged: kick the best placement and search again
    t_search = time.perf_counter() - t_search
    # the final orders within the clock too: past it one candidate order each (they cost
    # runs of the whole graph, which the grant's least cost does not cover: the overrun on 6.5k ops).
    # Placed rank comes first: every move was scored with it, so the one order tried past the
    # clock keeps the step the search found (FIFO first threw the moves away: the start won
    # again). With ``with_fifo`` the score was the better of both: both are tried.
    final = [c for c in ("rank", "fifo") if c in candidates]
    out = reschedule(graph, cluster, search.placement(search.glob_place), placer="refine",
                     candidates=final, deadline=None if with_fifo else clock)
    if better(start, out):
        # the start wins (its order was better than any rescheduled one)
        out = reschedule(graph, cluster, start, candidates=candidates, placer="refine", deadline=clock)
        if better(start, out):
            out = start
    info = RefineInfo(evaluations=search.evals, accepted=search.accepted, start_makespan=start.makespan,
                      makespan=out.makespan, levels=[len(u) for u in levels], accepted_per_level=search.per_level,
                      kicks=search.kicks, seconds=time.perf_counter() - t0, search_seconds=t_search)
    stats, before = carried(plan.stats, plan.info)
    return out.replace(placer="refine", wall_time=time.perf_counter() - t0,
                       stats={**stats, **out.stats}, info=before + out.info + (info,))
