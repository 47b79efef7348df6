"""Exact joint placement and scheduling with OR-Tools CP-SAT.

The model (DESIGN.md, "The CP-SAT model"), over a (coarse) OpGraph and any Cluster:

* **Placement.** One literal per (item, allowed device), where an item is an op
  or a whole colocation group (its members share the literals, so a group can
  never be split); exactly one per item. With two allowed devices an item has a
  single boolean ``b`` (device 1 iff ``b``). Device kinds are respected by
  creating literals only for allowed devices.
* **Ops.** ``start``/``end`` variables per op and one optional interval per
  allowed device (size = compute time on that device's kind and speed) with the
  placement literal as presence; ``add_no_overlap`` per device, a redundant
  per-device load constraint ``makespan >= sum(size * literal)`` and a redundant
  cumulative (capacity = number of devices) with each op at its fastest size.
* **Communication, contended links.** Per (tensor, destination device ``e``) a
  literal ``y`` ("the tensor is sent to ``e``") equivalent to: the producer is not
  on ``e`` and some consumer is. For each possible source device ``a`` an
  optional interval of the route's time, present iff the producer is on ``a``
  and ``y``, shared start/end ``ts >= end(producer)``, ``start(consumer) >= te``
  when the consumer is on ``e`` and ``y``. The interval goes into the
  ``add_no_overlap`` of every link resource of the route ``a -> e`` (a tensor
  is sent once per destination however many consumers it has there). Links may
  serve transfers in any order; the simulator serves them first come first
  served, so the simulated makespan of a plan may exceed the model's (then the
  plan's status is downgraded to ``feasible`` and both figures are reported).
* **Communication, contention free** (``cluster.contention_free`` or
  ``contention=False``): no transfer intervals at all. Per data edge ``u -> c``
  with delay ``D`` (slowest tensor of the edge) one literal ``same`` (implies
  both on one device) and the linear ``start(c) >= end(u) + D * (1 - same)``;
  with route costs that differ between device pairs, one enforced precedence per
  pair instead. This is the classic DAG-scheduling model used by the Sinnen and
  STG sets.
* **Memory (static, conservative).** Per device: sum over its ops of persistent
  + output bytes, plus the bytes of every tensor received there, plus the
  largest temporary of its ops, <= capacity. This bounds from above the
  liveness-based peak of :func:`pesto.plan.memory_profile`, so a plan the model
  accepts never runs out of memory. Skipped when everything fits everywhere.
  Because it holds every activation all step it can reject every plan; then
  :func:`place_cpsat` retries once with the weaker ``"persistent"`` bound
  (persistent bytes + the largest output + temporary) and the simulated
  liveness peak decides (status ``infeasible`` if it is over capacity).
  ``memory_balance=f`` also bounds each device's static held bytes by ``(1 + f)``
  times the mean.
* **Objective.** Minimise the makespan, constrained to at least
  :func:`solver.bounds.lower_bound` (critical path, total work / devices).
* **Symmetry breaking.** For each set of interchangeable devices (same kind,
  memory, speed, costs, and a link structure that a swap maps onto itself),
  value precedence: taking items in topological order, the first item on device
  ``g_j`` comes after some item on ``g_{j-1}``. A hint is relabelled to obey it.
* **Aggregated transfers** (automatic above 400 transfer candidates, or
  ``aggregate=True``): one interval per (producer, destination) carrying all
  the producer's tensors sent there, back to back as the simulator sends them;
  a consumer waits for the whole batch. Much smaller, slightly pessimistic.
* **Status and bounds.** ``optimal`` means CP-SAT proved the model optimal and
  the simulated replay matched it; the problem it proves it for includes the
  static memory constraint above. With aggregated transfers the model is a
  restriction, so the plan is only ``feasible`` and the lower bound falls back
  to the explicit one (:attr:`CpsatInfo.model_status <pesto.outcome.CpsatInfo>`
  keeps CP-SAT's word).
* **Time unit.** For integer data (all compute and transfer times integral, the
  horizon below 1e8) one unit is one µs and the optimum is exact. Otherwise
  times are scaled and rounded *up*; the model's schedule is then feasible for
  the true times, and ``CpsatInfo.rounding_error_us`` bounds what rounding can
  cost; the returned ``lower_bound`` subtracts it, so it stays valid.

The returned Plan is the simulator's replay of the model's placement and
per-device order (:func:`pesto.finalize.finalize`), so it is comparable with
every other placer; its :class:`~pesto.outcome.CpsatInfo` (``plan.info``)
carries CP-SAT's status, the model's makespan and bound, and any fallback.

Code: the model is built in pieces by :class:`solver.cpsat_model.CpsatModel`
(``add_placement``, ``add_ops``, ``add_links``, ``add_cuts``, ``add_memory``,
``add_symmetry``), hinted by :mod:`solver.cpsat_hint` and searched by
:mod:`solver.cpsat_solve`; :func:`place_cpsat` below runs the phases.
"""
from __future__ import annotations

import dataclasses
import time

from pesto.cluster import Cluster
from pesto.deadline import Deadline, Stopped
from pesto.graph import OpGraph
from pesto.outcome import CpsatInfo
from pesto.plan import Plan
from pesto.simulate import simulate

from .bounds import greedy_plan

from .cpsat_model import CpsatModel, symmetric_groups

__all__ = ["place_cpsat", "CpsatModel", "symmetric_groups"]

MIN_PHASE_SECONDS = 1.0  # a retry or exact phase gets at least this much search time


def place_cpsat(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, workers: int | None = None,
                seed: int = 0, hint: Plan | None = None, memory_balance: float | None = None,
                log: bool = False, contention: bool = True, symmetry: bool = True,
                aggregate: bool | None = None, memory: bool | str = True, deadline: Deadline | None = None) -> Plan:
    """Optimal (or best found) placement and schedule by CP-SAT.

    Parameters
    ----------
    graph, cluster
    time_limit : float
        Seconds for the search (model building not included).
    workers : int, optional
        CP-SAT search workers; default the number of CPUs.
    seed : int
    hint : Plan, optional
        A plan to start from (placement + order); default a greedy list schedule.
        If the search finds nothing in time, this plan is returned with
        ``CpsatInfo.fallback`` saying why.
    memory_balance : float, optional
        Bound each device's static held bytes by ``(1 + memory_balance)`` x mean.
    log : bool
        Print CP-SAT's search log.
    contention : bool
        Model link congestion (False: contention-free model, faster; the plan is
        still simulated with contention).
    deadline : pesto.deadline.Deadline, optional
        The whole solve's clock: the search ends when it does (or when it is
        interrupted), whatever ``time_limit`` says; Ctrl-C also ends the
        search (:class:`KeyboardInterrupt` is raised after it stopped).
    symmetry, aggregate, memory : see :class:`CpsatModel`. When the static
        memory model is infeasible, the search is repeated once with
        ``memory="persistent"`` (``CpsatInfo.memory_model`` says which held).
        When transfers were aggregated automatically and that model was solved
        to optimality with time left, the exact per-tensor model continues from
        its plan for the rest of the time to prove a valid bound
        (``CpsatInfo.phases``).

    Returns
    -------
    Plan
        ``status`` optimal / feasible / infeasible / unknown (or the fallback's);
        ``lower_bound`` = max(CP-SAT's bound, explicit bound), valid for the
        true (unrounded) times; ``plan.info_of(CpsatInfo)`` has CP-SAT's
        status and the model figures (``stats``: their view).

    Raises
    ------
    InfeasibleError
        From the pre-checks (culprit named), or the model is infeasible and no hint exists.
    TypeError
        An unknown option.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 10), ("a", "c", 10)])
    >>> p = place_cpsat(g, gpus(2, beta=(1.0, 0.0)), time_limit=10, workers=1)
    >>> p.status, p.makespan
    ('optimal', 6.0)
    """
    t0 = time.perf_counter()
    build = dict(contention=contention, memory_balance=memory_balance, symmetry=symmetry)
    # one clock for the phases after the first: the solve's (a work clock in
    # deterministic mode) or our own; the first search always runs
    clock = deadline.sub(time_limit) if deadline is not None else Deadline(time_limit)
    search = dict(workers=workers, seed=seed, log=log, deadline=deadline)

    def left() -> float:
        return clock.left()

    try:  # building checks the deadline: many devices make a big model
        model = CpsatModel(graph, cluster, aggregate=aggregate, memory=memory, deadline=deadline, **build)
    except Stopped as exc:
        return _not_built(graph, cluster, hint, exc.reason, t0)
    plan = model.solve(time_limit=time_limit, hint=hint, **search)
    memory_note = model.memory_mode
    if plan.info_of(CpsatInfo).proved_infeasible and model.memory_mode == "static":
        # The static bound holds every activation all step; retry with the
        # persistent bound and let the simulated liveness peak judge the plan.
        try:
            model = CpsatModel(graph, cluster, aggregate=aggregate, memory="persistent", deadline=deadline, **build)
        except Stopped as exc:
            return _not_built(graph, cluster, hint, exc.reason, t0)
        plan = model.solve(time_limit=max(MIN_PHASE_SECONDS, left()), hint=hint, **search)
        memory_note = "persistent (static model infeasible)"
    if (aggregate is None and model.aggregated and plan.info_of(CpsatInfo).model_status == "optimal"
            and left() >= MIN_PHASE_SECONDS):
        # The aggregated model is a restriction; with time left, the exact
        # per-tensor model starts from its plan to prove a valid bound.
        try:
            exact_model = CpsatModel(graph, cluster, aggregate=False, memory=model.memory_mode,
                                     deadline=deadline, **build)
            plan = _after_exact_phase(plan, exact_model.solve(time_limit=left(), hint=plan, **search))
        except Stopped:
            pass  # the aggregated model's plan stands
    return _with_info(plan, memory_model=memory_note).replace(wall_time=time.perf_counter() - t0)


def _with_info(plan: Plan, **changes) -> Plan:
    """``plan`` with its last :class:`CpsatInfo` changed."""
    info = plan.info_of(CpsatInfo)
    k = max(i for i, o in enumerate(plan.info) if o is info)
    return plan.replace(info=plan.info[:k] + (dataclasses.replace(info, **changes),) + plan.info[k + 1:])


def _not_built(graph: OpGraph, cluster: Cluster, hint: Plan | None, reason: str, t0: float) -> Plan:
    """The deadline passed (or the solve was interrupted) while the model was
    built: the hint's plan (else a greedy one), saying so."""
    base = hint if hint is not None else greedy_plan(graph, cluster)
    if not base.has_times:
        base = simulate(graph, cluster, base).to_plan(placer=base.placer)
    status = base.status if base.status in ("heuristic", "infeasible") else "unknown"
    info = CpsatInfo(fallback=f"not searched: {reason} (while building the model)", fallback_placer=base.placer,
                     stopped=reason)
    return base.replace(placer="cpsat", status=status, wall_time=time.perf_counter() - t0, info=base.info + (info,))


def _after_exact_phase(aggregated: Plan, exact: Plan) -> Plan:
    """The better of the aggregated model's plan and the exact model's, with
    the exact model's bound when it found a solution."""
    exact_info = exact.info_of(CpsatInfo)
    solved = exact_info.solved
    lb = max(aggregated.lower_bound, exact.lower_bound if solved else aggregated.lower_bound)
    best = exact if solved and exact.makespan <= aggregated.makespan + 1e-9 else aggregated
    status = best.status if best is exact else "feasible"
    phases = {"aggregated": aggregated.makespan, "exact": exact.makespan, "exact_status": exact_info.model_status}
    return _with_info(best.replace(lower_bound=lb, status=status), phases=phases)
