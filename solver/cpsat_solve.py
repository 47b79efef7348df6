"""Search a :class:`solver.cpsat_model.CpsatModel` and read its answer as a Plan.

:func:`solve` hints the model (the given plan, else a greedy list schedule),
runs CP-SAT and returns the simulator's replay of the model's placement and
per-device order (:func:`pesto.finalize.finalize`), or, when the search found
nothing, the hint's plan saying why (:attr:`CpsatInfo.fallback
<pesto.outcome.CpsatInfo>`). Either carries a :class:`~pesto.outcome.CpsatInfo`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time

from ortools.sat.python import cp_model

from pesto.deadline import Deadline, wall_net
from pesto.errors import InfeasibleError
from pesto.outcome import CpsatInfo
from pesto.plan import Plan
from pesto.simulate import simulate
from pesto.finalize import finalize

from .bounds import greedy_plan

__all__ = ["solve", "search", "colour_intervals", "deterministic_parameters", "interleave", "STATUS"]

STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
          cp_model.INFEASIBLE: "infeasible", cp_model.MODEL_INVALID: "unknown",
          cp_model.UNKNOWN: "unknown"}
NO_PROBING_ABOVE = 3000  # model variables


def solve(model, *, time_limit: float = 60, workers: int | None = None, seed: int = 0,
          hint: Plan | None = None, log: bool = False, deadline: Deadline | None = None) -> Plan:
    """Hint, search and read ``model``; see :func:`solver.cpsat.place_cpsat`.

    Raises
    ------
    InfeasibleError
        The model is infeasible and there is no hint to fall back to.
    RuntimeError
        CP-SAT says the model is invalid (a bug).
    """
    t0 = time.perf_counter() - model.build_time
    g, cl = model.graph, model.cluster
    rejected = None
    if hint is not None and not model.set_hint(hint):
        rejected, hint = hint.placer or "plan", None  # not a valid plan here
    if hint is None:
        hint = greedy_plan(g, cl)
        model.set_hint(hint)
    if deadline is not None and deadline.expired():  # stopped or out of time: do not start a search
        return _fallback(model, hint, CpsatInfo(stopped=deadline.reason or "deadline"), t0)
    solver = cp_model.CpSolver()
    if deadline is not None:
        time_limit = deadline.budget(time_limit)
    _parameters(solver.parameters, model, time_limit=time_limit, workers=workers, seed=seed, log=log)
    if deadline is not None and deadline.deterministic:
        deterministic_parameters(solver.parameters, time_limit)
    code = search(solver, model.model, deadline)
    if deadline is not None:
        deadline.charge(solver.deterministic_time)
    if code == cp_model.MODEL_INVALID:  # a bug, not a time-out: say it loudly
        raise RuntimeError(f"CP-SAT model invalid: {model.model.validate()}")
    info = _info(model, solver, code, hint, rejected)
    if info.model_status in ("optimal", "feasible"):
        return _read_plan(model, solver, code, info, t0)
    return _fallback(model, hint, info, t0)


def search(solver, cp: cp_model.CpModel, deadline: Deadline | None = None) -> int:
    """``solver.solve`` in a worker thread (CP-SAT releases the GIL), so the
    main thread stays responsive: Ctrl-C (:class:`KeyboardInterrupt`) or an
    interrupted ``deadline`` stops the search within a fraction of a second
    (``stop_search``). Set ``catch_sigint_signal = False`` on the solver
    first (OR-Tools otherwise leaves its handler installed after a solve,
    swallowing later Ctrl-Cs). Every CP-SAT search of Pesto goes through here."""
    out: dict = {}

    def work():
        try:
            out["code"] = _solve_once(solver, cp)
        except BaseException as exc:  # re-raised in the calling thread
            out["error"] = exc

    worker = threading.Thread(target=work, name="pesto-cp-sat", daemon=True)
    with deadline.stopping(solver.stop_search) if deadline is not None else contextlib.nullcontext():
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.05)
                if deadline is not None and (deadline.interrupted or deadline.net_passed()):
                    # again each time: a stop_search before the worker's solve has begun is
                    # a no-op in OR-Tools (no search to stop yet), so an interrupt landing
                    # in that window was lost and the search ran its whole limit
                    solver.stop_search()
        except KeyboardInterrupt:
            solver.stop_search()
            worker.join()
            raise
    if "error" in out:
        raise out["error"]
    return out["code"]


def _solve_once(solver, cp) -> int:
    """``solver.solve``; an exception from inside OR-Tools (its presolve raised
    ``IndexError: raw_hash_map<>::at`` on an infeasible bin-packing of
    persistent memory, OR-Tools 9.15) is retried once without presolve, and
    never reaches the user raw."""
    try:
        return solver.solve(cp)
    except (IndexError, KeyError, ValueError) as exc:
        first = f"{type(exc).__name__}: {exc}"
    solver.parameters.cp_model_presolve = False
    try:
        return solver.solve(cp)
    except (IndexError, KeyError, ValueError) as exc:
        raise RuntimeError(f"CP-SAT failed inside OR-Tools ({first}; without presolve: "
                           f"{type(exc).__name__}: {exc})") from None


def _parameters(p, model, *, time_limit, workers, seed, log) -> None:
    p.max_time_in_seconds = float(time_limit)
    p.num_workers = int(workers or os.cpu_count() or 1)
    p.random_seed = int(seed)
    p.log_search_progress = bool(log)
    p.catch_sigint_signal = False  # interrupts are ours: see _search
    # Stronger cumulative reasoning: closes P|prec|Cmax bounds (STG) that the
    # default propagation leaves open; cheap on these model sizes.
    p.use_timetable_edge_finding_in_cumulative = True
    p.use_overload_checker_in_cumulative = True
    p.use_hard_precedences_in_cumulative = True
    if len(model.model.proto.variables) > NO_PROBING_ABOVE:
        # on big (coarse DNN) models probing costs seconds before the first
        # solution and rarely pays back within a minute
        p.cp_model_probing_level = 0


def deterministic_parameters(p, budget: float) -> None:
    """Reproducible search: CP-SAT's deterministic time (about a second of
    one core per unit) bounds it instead of the wall clock, and its workers
    interleave in a fixed order. The wall limit stays as a safety net,
    :func:`pesto.deadline.wall_net` of the budget: if it ever
    cuts the search, the run is no longer reproducible (with one second, a
    search of a tenth of a deterministic second was cut on a loaded machine:
    sweep 4, ``M_det_api_twice``)."""
    p.max_deterministic_time = float(budget)
    p.max_time_in_seconds = wall_net(budget)
    interleave(p)


def interleave(p) -> None:
    """Workers in a fixed order (``interleave_search``), for parameters ``p``
    whose ``num_workers`` is set: several workers (or ``0``, all cores) only.
    One worker searches deterministically alone, and OR-Tools 9.15's
    interleaved search of one worker corrupts memory on some models (a
    segmentation fault or ``free(): invalid next size`` in the slice model's
    deterministic solve: ``tests/test_cpsat_deterministic.py``)."""
    p.interleave_search = p.num_workers != 1


def _info(model, solver, code, hint: Plan, rejected: str | None) -> CpsatInfo:
    """CP-SAT's word on the search and the model's figures."""
    cl = model.cluster
    return CpsatInfo(
        model_status=STATUS.get(code, "unknown"), cpsat_status=solver.status_name(code), hint_rejected=rejected,
        scale=model.scale, exact_units=model.exact, horizon_units=model.horizon,
        rounding_error_us=model.rounding_units / model.scale, explicit_lower_bound=model.lb,
        hint_used=hint.placer or "plan", workers=solver.parameters.num_workers,
        contended_model=model.contended, pure_cumulative=model.pure, aggregated_transfers=model.aggregated,
        memory_constraints=model.memory_active,
        symmetric_groups=[[cl.devices[k].name for k in grp] for grp in model.sym_groups],
        num_variables=len(model.model.proto.variables), num_constraints=len(model.model.proto.constraints),
        solve_time=solver.wall_time, build_time=model.build_time)


def restrictions(model) -> str:
    """How ``model`` forbids plans that are valid ("" if it does not), so
    that its bound and its proof of optimality hold only for the plans it
    allows: aggregated transfers (a consumer waits for its producer's whole
    batch), the static memory model when it may cut a valid plan
    (:meth:`~solver.cpsat_model.CpsatModel._static_cuts`: it holds every
    activation all step, so it can forbid a plan whose liveness peak fits;
    its bound then exceeded such a plan's step) and a memory balance."""
    parts = ["aggregated transfers"] if model.aggregated else []
    if model.memory_active and model.memory_balance is not None:
        parts.append("memory balance")
    elif model.memory_active and model.static_cuts:
        parts.append("static memory")
    return ", ".join(parts)


def _read_plan(model, solver, code, info: CpsatInfo, t0: float) -> Plan:
    """The simulated replay of the solution's placement and start order."""
    p = model.problem
    status = STATUS[code]
    bound = solver.best_objective_bound
    lb = max(model.lb, (bound - model.rounding_units) / model.scale)
    restricted = restrictions(model)
    if restricted:
        # a restriction of the problem (consumers wait for the whole batch; every
        # activation held all step): its bound and optimality do not carry over
        lb = model.lb
        if status == "optimal":
            status = "feasible"
        info = dataclasses.replace(info, restricted_model=restricted)
    model_ms = solver.objective_value / model.scale
    topo_pos = {i: r for r, i in enumerate(p.topo)}
    start = [solver.value(v) for v in model.start]
    end = [solver.value(v) for v in model.end]
    if model.pure:
        dev = colour_intervals(start, end, p.nd, topo_pos)
    else:
        dev = {i: k for i in range(p.n) for k, lit in model.x[i].items() if solver.boolean_value(lit)}
    placement = {p.names[i]: p.dev_names[dev[i]] for i in range(p.n)}
    seq = sorted(range(p.n), key=lambda i: (start[i], end[i], topo_pos[i]))
    info = dataclasses.replace(info, model_makespan=model_ms, best_bound_units=bound)
    above = model_ms + 1e-6 * max(1.0, model_ms)  # FCFS links in the simulator lost against the model's order
    plan = finalize(model.graph, model.cluster, placement, order=[p.names[i] for i in seq], placer="cpsat",
                    t0=t0, status=status, lower_bound=lb)
    if plan.status != "infeasible" and plan.makespan > above:
        info = dataclasses.replace(info, simulated_above_model=True)
        plan = plan.replace(status="feasible")
    return plan.replace(info=plan.info + (info,))


def _fallback(model, hint: Plan, info: CpsatInfo, t0: float) -> Plan:
    """No solution: the hint's plan, saying why (``info.fallback``)."""
    status = info.model_status
    why = ("model proved infeasible" if status == "infeasible" else
           f"not searched: {info.stopped}" if info.stopped else "no solution within the time limit")
    if status == "infeasible" and hint is None:
        raise InfeasibleError("no placement satisfies the static memory model", culprit="memory")
    base = hint if hint.has_times else simulate(model.graph, model.cluster, hint).to_plan(placer=hint.placer)
    info = dataclasses.replace(info, fallback=why, fallback_placer=hint.placer)
    if status != "infeasible":
        status = base.status if base.status in ("heuristic", "infeasible") else "unknown"
    return base.replace(placer="cpsat", lower_bound=model.lb, status=status,
                        wall_time=time.perf_counter() - t0, info=base.info + (info,))


def colour_intervals(start, end, nd: int, topo_pos) -> dict[int, int]:
    """Devices for a cumulative schedule of capacity ``nd``: greedy interval
    colouring by start (ties by end, then topological position), each op on
    the free device that became free last.

    Examples
    --------
    >>> colour_intervals([0, 0, 2], [2, 3, 4], 2, {0: 0, 1: 1, 2: 2})
    {0: 0, 1: 1, 2: 0}
    """
    free = [0] * nd
    dev = {}
    for i in sorted(range(len(start)), key=lambda i: (start[i], end[i], topo_pos[i])):
        ok = [k for k in range(nd) if free[k] <= start[i]]
        k = min(ok, key=lambda k: (-free[k], k)) if ok else min(range(nd), key=lambda k: free[k])
        dev[i] = k
        free[k] = max(free[k], end[i])
    return dev
