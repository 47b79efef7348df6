"""A placement (+ order) as a simulated, memory-checked Plan.

Every placer, heuristic or exact, ends with :func:`finalize`, so all plans are
comparable: the makespan is the simulator's (fixed order, or TF's FIFO) and
peak memory the liveness-based one of :func:`pesto.memory.memory_profile`.
:func:`fit_memory` is the heuristics' variant: it repairs a placement over
memory by simulation (:func:`pesto.memory.peak_repair`) before giving up.

It lives above :mod:`pesto.simulate` (it simulates), so it is not in
:mod:`pesto.memory`, which :mod:`pesto.plan` and :mod:`pesto.simulate` import.
"""
from __future__ import annotations

import time
from typing import Mapping, Sequence

from .cluster import Cluster
from .deadline import Deadline
from .graph import OpGraph
from .memory import MEMORY_NOTE, peak_repair
from .outcome import MemoryInfo
from .plan import Plan
from .problem import Problem
from .simulate import simulate

__all__ = ["finalize", "fit_memory", "carried", "MEMORY_ROUNDS"]

MEMORY_ROUNDS = 10  # at most this many re-simulations in fit_memory


def finalize(graph: OpGraph, cluster: Cluster, placement: Mapping[str, str], *,
             order: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
             placer: str, t0: float, status: str = "heuristic", mode: str | None = None,
             info: tuple = (), **fields) -> Plan:
    """Simulate ``placement`` and return the Plan with times.

    Parameters
    ----------
    order : per-device mapping, or one global op sequence, or None
        None runs TF's default FIFO; a global sequence is split per device.
    t0 : float
        ``time.perf_counter()`` when the placer started (for ``wall_time``).
    status : str
        Becomes ``"infeasible"`` if the simulated peak memory exceeds a
        device's capacity (the plan is still returned, honestly flagged, with
        a :class:`~pesto.outcome.MemoryInfo` naming the over-full devices).
    info : tuple of pesto.outcome.Outcome
        The plan's outcomes; a :class:`~pesto.outcome.MemoryInfo` among them
        is replaced by this simulation's.
    fields : further Plan fields (lower_bound, stats...).

    Examples
    --------
    >>> import time
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    >>> c = gpus(2, beta=(1.0, 0.01))   # 100 bytes: 2 µs
    >>> p = finalize(g, c, {"a": "/GPU:0", "b": "/GPU:1"}, placer="demo", t0=time.perf_counter())
    >>> p.makespan, p.status, p.placer
    (7.0, 'heuristic', 'demo')
    >>> small = finalize(g, c.with_memory(50), {"a": "/GPU:0", "b": "/GPU:1"}, placer="demo",
    ...                  t0=time.perf_counter())
    >>> small.status, small.info_of(MemoryInfo).over
    ('infeasible', mappingproxy({'/GPU:0': 100, '/GPU:1': 100}))
    """
    if order is None:
        sched = simulate(graph, cluster, dict(placement), mode="fifo")
    else:
        if not isinstance(order, Mapping):
            per: dict[str, list[str]] = {}
            for op in order:
                per.setdefault(placement[op], []).append(op)
            order = per
        sched = simulate(graph, cluster, Plan(placement, order), mode=mode or "order")
    over = {d.name: sched.peak_memory[d.name] for d in cluster.devices
            if sched.peak_memory[d.name] > d.memory}
    stats, info = carried(fields.pop("stats", None) or {}, info)
    if over:
        status = "infeasible"
        info += (MemoryInfo(over=over),)
    return sched.to_plan(placer=placer, status=status, wall_time=time.perf_counter() - t0,
                         stats=stats, info=info, **fields)


def carried(stats: Mapping, info: tuple) -> tuple[dict, tuple]:
    """``stats`` and ``info`` of a plan without its memory verdict (a
    :class:`~pesto.outcome.MemoryInfo` holds for one simulation only): what a
    plan made from it carries over.

    >>> carried({"memory_over": {"/GPU:0": 9}, "note": 1}, (MemoryInfo(over={"/GPU:0": 9}),))
    ({'note': 1}, ())
    """
    stale = MemoryInfo.view_keys()
    return ({k: v for k, v in stats.items() if k not in stale},
            tuple(o for o in info if not isinstance(o, MemoryInfo)))


def _overrun(prob: Problem, plan: Plan) -> int:
    return sum(max(0, b - prob.cap[prob.dev_index[d]]) for d, b in (plan.peak_memory or {}).items())


def fit_memory(graph: OpGraph, cluster: Cluster, place: list[int], *, order, placer: str, t0: float,
               info: tuple = (), forced=(), repair: bool = True, deadline: Deadline | None = None) -> Plan:
    """The plan of ``place`` (simulated by :func:`finalize`), repaired while
    its simulated peak is over capacity.

    Whole colocation units move off over-full devices
    (:func:`pesto.memory.peak_repair`) and the placement is simulated again,
    at most :data:`MEMORY_ROUNDS` times: first every move the static estimate
    asks for, then, once a round makes the overrun worse (timed peaks move
    with the schedule), one move at a time from the best placement so far,
    never retrying a unit whose move did not help. Returns the first plan
    that fits, else the one least over capacity: a heuristic returns an
    over-memory plan only when no repair fits. Its
    :class:`~pesto.outcome.MemoryInfo` names the ops ``forced`` by the
    placer (op indices, named) with a note, and the units moved
    (``moved_units``). ``place`` ends as that plan's placement. With
    ``deadline``, no repair round starts once it has passed (the best plan
    so far is returned; ``repair_cut`` says why).

    Parameters
    ----------
    order : op indices in the order to run them, or None (TF's FIFO)
    info : the placer's outcomes, for the plan
    forced : op indices the placer put on a device best effort
    repair : False: simulate only (the single-device heuristic)

    Examples
    --------
    >>> import time
    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op(x, {"GPU": 1.0}, persistent_bytes=40) for x in "abc"])
    >>> p = fit_memory(g, gpus(2, memory=100), [0, 0, 0], order=None, placer="demo", t0=time.perf_counter())
    >>> p.status, p.info_of(MemoryInfo).moved_units
    ('heuristic', 1)
    """
    prob = Problem.of(graph, cluster)
    names = graph.names
    seq = None if order is None else [names[i] for i in order]
    start = list(place)

    def run():
        placement = {names[i]: prob.dev_names[place[i]] for i in range(prob.n)}
        plan = finalize(graph, cluster, placement, order=seq, placer=placer, t0=t0, info=info)
        return _overrun(prob, plan), plan

    best = (*run(), list(place))
    skip: set = set()
    one = None  # None: all moves per round; 1 after a round that did not help
    cut = None
    for _ in range(MEMORY_ROUNDS if repair else 0):
        if best[0] == 0:
            break
        if deadline is not None and deadline.expired():
            cut = deadline.reason or "time limit"
            break
        place[:] = best[2]
        if not peak_repair(prob, place, best[1].peak_memory, max_moves=one, skip=skip):
            break
        over, plan = run()
        if over < best[0]:
            best = (over, plan, list(place))
        else:
            skip.update(prob.unit[i] for i in range(prob.n) if place[i] != best[2][i])
            one = 1
    over, plan, place[:] = best
    moved = len({prob.unit[i] for i in range(prob.n) if place[i] != start[i]})
    noted = over and (forced or repair)
    if not (cut or moved or noted):
        return plan
    mem = plan.info_of(MemoryInfo) or MemoryInfo()
    mem = MemoryInfo(over=mem.over, repair_cut=cut, moved_units=moved or None,
                     forced=tuple(names[i] for i in list(forced)[:50]) if noted else None,
                     forced_count=len(forced) if noted else None, note=MEMORY_NOTE if noted else None)
    return plan.replace(info=tuple(o for o in plan.info if not isinstance(o, MemoryInfo)) + (mem,))
