"""Fine-level improvement of a plan: rescheduling and local search.

Coarsening makes the exact solve tractable but costs parallelism: a coarse
vertex runs its members back to back, and the expanded plan keeps the coarse
order. Two cheap passes on the *full* graph win much of it back:

* :func:`reschedule` keeps a placement and picks the best per-device order
  among TF's FIFO, a list schedule by upward rank (longest path to the exit,
  transfers included), the given order, and a list schedule that follows the
  given plan's start times where it can;
* :func:`refine` moves groups of ops (coarse vertices of a partition-aware
  coarsening, colocation groups joined) between devices, keeps a move when
  the simulated step time drops and memory still fits, and ends with
  :func:`reschedule`.

Both return a Plan from :func:`solver.common.finalize` (simulated, fixed
order), never worse than the plan they start from.

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

from pesto.cluster import Cluster
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.simulate import simulate

from .common import finalize
from pesto.problem import Problem

__all__ = ["reschedule", "refine", "improve", "solve_fine", "upward_ranks", "slack", "move_groups", "CANDIDATES"]

CANDIDATES = ("fifo", "rank", "given", "given-list")
SINGLE_OPS_UP_TO = 2048  # above this, single-op moves cost more than a search can afford


class _Ranker:
    """Upward ranks of many placements of one (graph, cluster): the edge lists,
    durations and route costs are built once."""

    def __init__(self, graph: OpGraph, cluster: Cluster):
        devs = cluster.devices
        nd = len(devs)
        idx = graph.index
        tb = {t.name: t.bytes for t in graph.tensors}
        self.outs: list[list] = [[] for _ in graph.names]
        for e in graph.edges:
            self.outs[idx[e.src]].append((idx[e.dst], sum(tb[t] for t in e.tensors)))
        self.dur = [[op.compute[d.kind] / d.speed if d.kind in op.kinds else float("inf") for d in devs]
                    for op in graph.ops]
        self.beta = [[(0.0, 0.0) if a == b else (lambda r: (r.beta0, r.beta1))(
            cluster.route(devs[a].name, devs[b].name)) for b in range(nd)] for a in range(nd)]
        self.rtopo = list(reversed(graph.topo_idx()))

    def __call__(self, dev: Sequence[int]) -> list[float]:
        outs, dur, beta = self.outs, self.dur, self.beta
        rank = [0.0] * len(dev)
        for i in self.rtopo:
            best = 0.0
            a = dev[i]
            ba = beta[a]
            for j, nb in outs[i]:
                v = rank[j]
                b = dev[j]
                if a != b and nb > 0:
                    b0, b1 = ba[b]
                    v += b0 + b1 * nb
                if v > best:
                    best = v
            rank[i] = dur[i][a] + best
        return rank


def upward_ranks(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str]) -> list[float]:
    """Per op (in ``graph.names`` order): longest path from its start to the end
    of the step, with compute on its device and a transfer on every edge whose
    ends sit on different devices (per edge: ``beta0 + beta1 * bytes``).

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    >>> upward_ranks(g, gpus(2, beta=(1.0, 0.01)), {"a": "/GPU:0", "b": "/GPU:1"})
    [7.0, 3.0]
    """
    di = cluster.index
    return _Ranker(graph, cluster)([di[placement[nm]] for nm in graph.names])


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
    names = graph.names
    idx = graph.index
    n = len(names)
    devs = cluster.devices
    pl = sched.placement
    st = [sched.start[nm] for nm in names]
    fi = [sched.finish[nm] for nm in names]
    nxt = [-1] * n
    for seq in sched.order.values():
        for a, b in zip(seq, seq[1:]):
            nxt[idx[a]] = idx[b]
    tb = {t.name: t.bytes for t in graph.tensors}
    outs: list[list] = [[] for _ in range(n)]
    route: dict = {}
    for e in graph.edges:
        a, b = pl[e.src], pl[e.dst]
        nb = sum(tb[t] for t in e.tensors)
        delay = 0.0
        if a != b and nb > 0:
            r = route.get((a, b))
            if r is None:
                r = route[(a, b)] = cluster.route(a, b)
            delay = r.beta0 + r.beta1 * nb
        outs[idx[e.src]].append((idx[e.dst], delay))
    end = sched.makespan
    latest = [0.0] * n  # latest finish
    # reverse of the start order is a reverse topological order of DAG + device chains
    topo_pos = [0] * n
    for r, i in enumerate(graph.topo_idx()):
        topo_pos[i] = r
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


def _better(a: Plan, b: Plan | None) -> bool:
    """``a`` beats ``b``: fits memory when ``b`` does not, else a shorter step."""
    if b is None:
        return True
    fa, fb = a.status != "infeasible", b.status != "infeasible"
    if fa != fb:
        return fa
    return a.makespan < b.makespan - 1e-9


def reschedule(graph: OpGraph, cluster: Cluster, placement, *, candidates: Sequence[str] = CANDIDATES,
               given_order: Mapping[str, Sequence[str]] | None = None, placer: str | None = None,
               status: str = "heuristic", **fields) -> Plan:
    """The best per-device order for a fixed placement.

    Parameters
    ----------
    placement : mapping op -> device, or a Plan
        With a Plan, its order is the ``"given"`` candidate (unless
        ``given_order`` is passed) and its times guide ``"given-list"``.
    candidates : names among ``"fifo"`` (TF's ready queue), ``"rank"`` (list
        schedule by :func:`upward_ranks`), ``"given"`` (``given_order`` as
        is), ``"given-list"`` (list schedule preferring ops that start earlier
        in the given plan; it may fill idle gaps the given order leaves).
        Candidates that need a given order are skipped without one.
    given_order : per-device op sequences, optional
    placer, status, fields
        For the returned Plan (``placer`` defaults to the Plan's, else "reschedule").

    Returns
    -------
    Plan
        Simulated in its fixed order (the winner's order replayed gives the
        same times); memory-feasible candidates beat infeasible ones, then the
        shortest step wins. ``stats["reschedule"]`` has every candidate's step.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 9, "c": 1, "d": 1},
    ...                        [("a", "b", 0), ("c", "d", 0), ("d", "b", 0)])
    >>> p = reschedule(g, gpus(1), {op: "/GPU:0" for op in g.names}, candidates=("rank",))
    >>> p.makespan, p.stats["reschedule"]
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
    placement = dict(placement)
    placer = placer or "reschedule"
    stats = dict(fields.pop("stats", {}) or {})
    unknown = [c for c in candidates if c not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown reschedule candidates {unknown}; choose among {CANDIDATES}")
    seen: dict[str, float] = {}
    best = None
    for cand in candidates:
        order = None
        if cand == "given":
            if given_order is None:
                continue
            order = {d: list(s) for d, s in given_order.items()}
        elif cand in ("rank", "given-list"):
            if cand == "given-list":
                if given_plan is None and given_order is None:
                    continue
                src = given_plan if given_plan is not None else Plan(placement, given_order)
                prio = _given_priority(graph, src)
            else:
                prio = upward_ranks(graph, cluster, placement)
            sched = simulate(graph, cluster, placement, mode="fifo", priority=prio, memory=False)
            order = sched.order
        plan = finalize(graph, cluster, placement, order=order if order is not None else None,
                        placer=placer, t0=t0, status=status, stats=stats, **fields)
        if order is None:  # FIFO: fix the order it ran in, so the plan replays exactly
            plan = plan.replace(order={d: tuple(s) for d, s in plan.order.items()})
        seen[cand] = plan.makespan
        if _better(plan, best):
            best, won = plan, cand
    if best is None:
        raise ValueError("no reschedule candidate applies (give 'fifo' or 'rank', or a given order)")
    return best.replace(wall_time=time.perf_counter() - t0,
                        stats={**best.stats, "reschedule": seen, "schedule": won})


# -- local search ---------------------------------------------------------------------
def move_groups(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str], groups=None, *,
                targets: Sequence[int] = (2, 8, 32, 128, 512, 2048)) -> list[list[list[int]]]:
    """Levels of move units (lists of op indices), coarse to fine.

    ``groups``: a list of op-name lists, a mapping op -> label, or None for
    the vertices of partition-aware coarsenings (``partition=placement``) to
    each of ``targets`` vertices below the op count, then single ops on graphs
    of at most ``SINGLE_OPS_UP_TO`` ops. Every unit is closed under colocation (units
    sharing a colocation group are joined), so any move keeps groups whole.
    """
    idx = graph.index
    n = graph.num_ops
    levels_raw: list[list[list[int]]] = []
    if groups is None:
        import coarsen

        sizes = set()
        for tgt in sorted(targets):
            if tgt >= n:
                break
            cg = coarsen.coarsen(graph, tgt, partition=dict(placement), cluster=cluster)
            if cg.graph.num_ops not in sizes:
                sizes.add(cg.graph.num_ops)
                levels_raw.append([[idx[o] for o in ms] for ms in cg.members.values()])
        if n <= SINGLE_OPS_UP_TO:
            levels_raw.append([[i] for i in range(n)])
    elif hasattr(groups, "get"):
        by: dict = {}
        for op, lab in groups.items():
            by.setdefault(lab, []).append(idx[op])
        levels_raw.append(list(by.values()))
    else:
        levels_raw.append([[idx[o] for o in g] for g in groups])
    gid: dict = {}
    col = [gid.setdefault(op.colocation_group, len(gid)) if op.colocation_group is not None else -1
           for op in graph.ops]
    levels = []
    for units in levels_raw:
        parent = list(range(len(units)))

        def find(a):
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        owner: dict = {}
        for u, ms in enumerate(units):
            for i in ms:
                if col[i] >= 0:
                    o = owner.setdefault(col[i], u)
                    ra, rb = find(o), find(u)
                    if ra != rb:
                        parent[rb] = ra
        # every op not in any unit moves alone (or with its colocation group)
        covered = {i for ms in units for i in ms}
        for i in range(n):
            if i not in covered:
                units.append([i])
                parent.append(len(parent))
                if col[i] >= 0 and col[i] in owner:
                    parent[-1] = find(owner[col[i]])
                elif col[i] >= 0:
                    owner[col[i]] = len(units) - 1
        merged: dict = {}
        for u, ms in enumerate(units):
            merged.setdefault(find(u), []).extend(ms)
        levels.append([sorted(set(ms)) for ms in merged.values()])
    return levels


def refine(graph: OpGraph, cluster: Cluster, plan: Plan, *, groups=None, time_limit: float = 10,
           seed: int = 0, max_evals: int | None = None, targets: Sequence[int] = (2, 8, 32, 128, 512, 2048),
           candidates: Sequence[str] = CANDIDATES, with_fifo: bool = False, kicks: int = 1000) -> Plan:
    """Local search on the full graph: move groups of ops to other devices.

    Each move sends one unit (see :func:`move_groups`) to another device whose
    kind every member allows; the placement is scored by a list schedule by
    upward rank (with ``with_fifo``, also TF's FIFO, the better counting: twice
    the cost per move). Units are tried least slack first (:func:`slack`). A move is kept when the
    step gets shorter and no device goes over its memory (or, if the start
    already is over, the overflow does not grow). Levels go coarse to fine;
    a level is passed over again while it improves. When no move helps and
    time is left, the best placement is kicked (1-3 random units moved) and
    the search goes on from there, at most ``kicks`` times (iterated local
    search; the best placement ever seen is kept). The result is
    :func:`reschedule`-d (the start plan's order is a candidate when the
    placement did not change) and is never worse than ``plan`` (re-simulated).

    Parameters
    ----------
    plan : Plan
        A plan of ``graph`` (placement and order; times not needed).
    groups : see :func:`move_groups`
    time_limit : float
        Seconds for the search (the final reschedule comes on top).
    seed : int
        Order in which units are tried; with ``max_evals`` the result is
        deterministic (a time limit may stop the search earlier on a slower
        machine).
    max_evals : int, optional
        Stop after this many scored placements.
    targets : vertex counts of the partition-aware coarsenings giving the move
        units (see :func:`move_groups`); ignored with ``groups``.
    candidates : orders for the final :func:`reschedule`.

    Returns
    -------
    Plan
        ``placer="refine"``; ``stats["refine"]`` has the evaluations, accepted
        moves and the step before and after.
    """
    t0 = time.perf_counter()
    rng = random.Random(seed)
    prob = Problem(graph, cluster)
    names = graph.names
    n = graph.num_ops
    devs = cluster.devices
    cap = [d.memory for d in devs]
    di = cluster.index
    # the start, as a fixed-order plan
    start = finalize(graph, cluster, dict(plan.placement), order={d: list(s) for d, s in plan.order.items()},
                     placer="refine", t0=t0, status="heuristic")

    def over(peak) -> float:
        return float(sum(max(0, peak[d.name] - d.memory) for d in devs))

    ranker = _Ranker(graph, cluster)
    work = [min(prob.dur[i][d] for d in prob.allowed[i]) for i in range(n)]
    dnames = [d.name for d in devs]

    def score(place: list[int]):
        pl = dict(zip(names, [dnames[k] for k in place]))
        a = simulate(graph, cluster, pl, mode="fifo", priority=ranker(place), memory=False)
        if not with_fifo:
            return a
        b = simulate(graph, cluster, pl, mode="fifo", memory=False)
        return a if a.makespan <= b.makespan else b

    place = [di[plan.placement[nm]] for nm in names]
    best_sched = score(place)
    best = min(best_sched.makespan, start.makespan)
    base_over = over(start.peak_memory)
    evals, accepted = 1, 0
    per_level: list[int] = []
    deadline = t0 + time_limit
    levels = move_groups(graph, cluster, plan.placement, groups, targets=targets)
    allowed = prob.allowed
    stop = False
    glob, glob_place, glob_over = best, place[:], base_over
    n_kicks = 0
    while True:
        outer = True
        while outer and not stop:  # sweep the levels again while some level improved
            outer = False
            for lv, units in enumerate(levels):
                if len(per_level) <= lv:
                    per_level.append(0)
                improved = True
                while improved and not stop:
                    improved = False
                    # least slack first (critical units), then the heaviest, random among equals
                    sl = slack(graph, cluster, best_sched)
                    key = [(round(min(sl[i] for i in ms), 3), -sum(work[i] for i in ms)) for ms in units]
                    seq = list(range(len(units)))
                    rng.shuffle(seq)
                    seq.sort(key=lambda u: key[u])
                    for u in seq:
                        ms = units[u]
                        ok = set(range(len(devs)))
                        for i in ms:
                            ok &= set(allowed[i])
                        for d in sorted(ok):
                            if all(place[i] == d for i in ms):
                                continue
                            if time.perf_counter() >= deadline or (max_evals is not None and evals >= max_evals):
                                stop = True
                                break
                            old = [place[i] for i in ms]
                            for i in ms:
                                place[i] = d
                            sched = score(place)
                            new = sched.makespan
                            evals += 1
                            if new < best - 1e-6 * max(1.0, best):
                                pl = {names[i]: devs[place[i]].name for i in range(n)}
                                o = over(simulate(graph, cluster, pl, mode="fifo").peak_memory)
                                if o <= base_over:
                                    best, base_over, best_sched = new, o, sched
                                    accepted += 1
                                    per_level[lv] += 1
                                    improved = outer = True
                                    continue
                            for i, p in zip(ms, old):
                                place[i] = p
                        if stop:
                            break
        if best < glob - 1e-6 * max(1.0, glob):
            glob, glob_place, glob_over = best, place[:], base_over
        if stop or n_kicks >= kicks:
            break
        # converged: kick the best placement (move a few random units) and search again
        pool = [u for u in levels if len(u) >= 4] or levels
        units = pool[rng.randrange(len(pool))]
        place = glob_place[:]
        for u in rng.sample(range(len(units)), min(len(units), rng.randint(1, 3))):
            ms = units[u]
            ok = set(range(len(devs)))
            for i in ms:
                ok &= set(allowed[i])
            d = rng.choice(sorted(ok))
            for i in ms:
                place[i] = d
        n_kicks += 1
        pl = {names[i]: devs[place[i]].name for i in range(n)}
        o = over(simulate(graph, cluster, pl, mode="fifo").peak_memory)
        if o > glob_over:
            place = glob_place[:]
            continue
        best_sched = score(place)
        evals += 1
        best, base_over = best_sched.makespan, o
    place = glob_place
    final_pl = {names[i]: devs[place[i]].name for i in range(n)}
    out = reschedule(graph, cluster, final_pl, candidates=[c for c in candidates if c in ("fifo", "rank")],
                     placer="refine")
    if _better(start, out):
        # the start wins (its order was better than any rescheduled one)
        out = reschedule(graph, cluster, start, candidates=candidates, placer="refine")
        if _better(start, out):
            out = start
    stats = dict(plan.stats)
    stats["refine"] = {"evaluations": evals, "accepted": accepted, "start_makespan": start.makespan,
                       "makespan": out.makespan, "levels": [len(u) for u in levels],
                       "accepted_per_level": per_level, "kicks": n_kicks,
                       "seconds": time.perf_counter() - t0}
    return out.replace(placer="refine", wall_time=time.perf_counter() - t0, stats={**out.stats, **stats})


# -- the whole fine-level pipeline ------------------------------------------------------
def improve(graph: OpGraph, cluster: Cluster, starts: Sequence[Plan], *, target_vertices: int = 200,
            cpsat_time: float = 20, refine_time: float = 20, workers: int | None = None, seed: int = 0,
            coarsen_options: Mapping | None = None, partitions: int = 1, max_starts: int = 4) -> Plan:
    """Best-of pipeline around a good full-graph plan (what ``pesto.solve`` can call).

    1. the ``max_starts`` best plans of ``starts`` (plans of ``graph`` with
       times, e.g. Expert and other heuristics on the full graph) are
       :func:`reschedule`-d; the best is the *incumbent*;
    2. the graph is coarsened with ``partition=`` the incumbent's placement
       (plus the next ``partitions - 1`` best placements), so the incumbent is
       exactly representable; :meth:`CoarseGraph.project` gives the CP-SAT hint
       (if that partition leaves more than ``2 * target_vertices`` vertices,
       the graph is coarsened without it and the hint is the majority vote);
    3. CP-SAT on the coarse graph (``cpsat_time``), expanded, rescheduled;
    4. :func:`refine` from the better of that and the incumbent (``refine_time``).

    Returns the best plan found (never worse than the best rescheduled start),
    with ``stats["improve"]``: the step after each stage and their seconds.
    Skips CP-SAT (steps 2-3) when ``cpsat_time <= 0`` or the graph has at most
    ``target_vertices`` ops (then CP-SAT runs on the graph itself).
    """
    import coarsen
    from solver.cpsat import place_cpsat

    t0 = time.perf_counter()
    log: dict = {}
    if not starts:
        raise ValueError("improve needs at least one start plan")
    def rank_key(p):
        return (p.status == "infeasible", p.makespan if p.makespan is not None else float("inf"))

    # reschedule only the best few (each costs 4 simulations of the full graph)
    chosen = sorted(starts, key=rank_key)[:max(1, max_starts)]
    resched = sorted((reschedule(graph, cluster, p) for p in chosen), key=rank_key)
    inc = resched[0]
    log["starts"] = {p.placer: p.makespan for p in resched}
    log["incumbent"] = (inc.placer, inc.makespan)
    log["t_reschedule"] = time.perf_counter() - t0
    best = inc
    if cpsat_time > 0:
        t = time.perf_counter()
        if graph.num_ops > target_vertices:
            parts = [dict(p.placement) for p in resched[:max(1, partitions)]]
            try:
                cg = coarsen.coarsen(graph, target_vertices, partition=parts, cluster=cluster,
                                     **dict(coarsen_options or {}))
            except ValueError:  # a method without partition support (celeritas)
                cg = None
            if cg is None or cg.graph.num_ops > 2 * target_vertices:
                # a fragmented placement (e.g. list schedulers alternating devices) blocks
                # merging: coarsen freely, the hint is then the majority projection
                log["partition_vertices"] = cg.graph.num_ops if cg is not None else None
                cg = coarsen.coarsen(graph, target_vertices, cluster=cluster, **dict(coarsen_options or {}))
            work, hint = cg.graph, cg.project(inc, cluster)
        else:
            cg, work, hint = None, graph, inc
        log["vertices"] = work.num_ops
        log["t_coarsen"] = time.perf_counter() - t
        t = time.perf_counter()
        sol = place_cpsat(work, cluster, time_limit=cpsat_time, workers=workers, seed=seed, hint=hint)
        log["t_cpsat"] = time.perf_counter() - t
        log["cpsat"] = (sol.status, sol.makespan, sol.lower_bound)
        fine = cg.expand(sol) if cg is not None else sol
        cand = reschedule(graph, cluster, fine, placer="cpsat")
        log["cpsat_expanded"] = cand.makespan
        if _better(cand, best):
            best = cand
    if refine_time > 0:
        t = time.perf_counter()
        ref = refine(graph, cluster, best, time_limit=refine_time, seed=seed)
        log["t_refine"] = time.perf_counter() - t
        log["refined"] = ref.makespan
        if _better(ref, best):
            best = ref
    log["seconds"] = time.perf_counter() - t0
    log["winner"] = best.placer
    return best.replace(wall_time=log["seconds"], stats={**best.stats, "improve": log})


FULL_GRAPH_HEURISTICS = ("expert", "metis", "m-etf", "m-sct", "heft", "celeritas", "m-topo", "single")


def solve_fine(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, target_vertices: int = 200,
               workers: int | None = None, seed: int = 0, extra_starts: Sequence[Plan] = (),
               heuristics: Sequence[str] = FULL_GRAPH_HEURISTICS, cpsat_share: float = 0.3,
               refine_share: float = 0.6, coarsen_options: Mapping | None = None) -> Plan:
    """Full-graph heuristics, then :func:`improve` (``time_limit`` split between
    CP-SAT and refinement). Heuristics that raise are skipped (named in
    ``stats["improve"]["heuristic_errors"]``); ``extra_starts`` (e.g. expanded
    coarse plans) join the starts.

    >>> from pesto.random_graphs import layered_dag
    >>> from pesto.cluster import gpus
    >>> g = layered_dag(300, seed=0)
    >>> p = solve_fine(g, gpus(2), time_limit=2, target_vertices=40, workers=1)
    >>> p.makespan <= min(p.stats["improve"]["starts"].values())
    True
    """
    from solver import run_placers

    # m-SCT's LP grows quadratically; cap it so the heuristics stay a small share
    plans, errors = run_placers(graph, cluster, heuristics, time_limit=time_limit, seed=seed,
                                extra={"m-sct": {"lp_time_limit": max(1.0, 0.15 * time_limit)}})
    starts = list(extra_starts) + list(plans.values())
    out = improve(graph, cluster, starts, target_vertices=target_vertices, cpsat_time=cpsat_share * time_limit,
                  refine_time=refine_share * time_limit, workers=workers, seed=seed,
                  coarsen_options=coarsen_options)
    if errors:
        out = out.replace(stats={**out.stats, "improve": {**out.stats["improve"], "heuristic_errors": errors}})
    return out
