"""The recipes behind ``pesto.solve``: lists of passes run over one shared state.

:data:`RECIPES` holds the two recipes: ``"paper"`` (coarsen, heuristics
on the coarse graph as hints, exact solve, expand: the Pesto paper) and
``"full"`` (the default for CP-SAT). :data:`PASSES` maps a pass's name to
its function ``fn(run, deadline)`` (:mod:`solver.passes`, "one group"
here, "status" in :mod:`solver.status`). :func:`run_passes` runs a
recipe: before each pass the :class:`~solver.budget.Budget` grants it a
deadline or skips it, and says why. ``pesto.solve`` is :func:`solve` after
loading the graph, choosing the cluster and building the
:class:`~solver.options.SolveOptions`; :func:`improve` and
:func:`solve_fine` are the full recipe without / with its heuristics.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
>>> plan = solve(g, gpus(2), SolveOptions(time_limit=5, workers=1))
>>> plan.log.recipe, [s.name for s in plan.log.passes]
('paper', ['coarsen', 'heuristics', 'exact', 'expand', 'status'])
>>> plan.log.winner, plan.status
('cpsat', 'optimal')
"""
from __future__ import annotations

import gc
import time
from typing import Callable, Mapping, Sequence

from pesto.cluster import Cluster
from pesto.deadline import Deadline
from pesto.finalize import finalize
from pesto.graph import OpGraph, gc_frozen
from pesto.plan import Plan, percent

from .bounds import TOLERANCE, reached
from .budget import COSTS, GROUP_MIN_SECONDS, Budget, Cost, Skip
from .options import SHARES, SolveOptions
from .registry import HEURISTICS
from .passes import (Run, Trace, heuristics_pass, coarsen_graph, exact, expand, local_search, lns_pass,
                     needs_coarsening, reschedule_starts)
from .status import final_status, status
from .subcluster import gpu_groups

__all__ = ["HEURISTICS", "SHARES", "RECIPES", "PASSES", "SolveOptions", "Run", "new_run", "run_passes",
           "run_recipe", "solve", "improve", "solve_fine", "final_status", "stop_if_optimal", "standing"]


def one_group(run: Run, deadline: Deadline) -> None:
    """On a cluster of several GPU groups (hosts: :func:`solver.subcluster.gpu_groups`),
    the full recipe on the first group alone (with the non-GPU devices)
    for its grant (:data:`~solver.budget.GROUP_SHARE` of the time left); its
    plan joins the starts. On a slow network the best plan often stays on one
    host, and a search among all GPUs rarely walks back there
    (benchmarks/results/hosts.md). The inner solve runs on the grant: same
    clock, same interrupts, the same cost unit."""
    t = time.perf_counter()
    groups = gpu_groups(run.cluster)
    if not groups or run.options.hint != "best-heuristic" or run.coarse is not None:
        return
    if deadline.seconds < GROUP_MIN_SECONDS:
        run.trace.record("one group", t, None, f"skipped: {deadline.seconds:.1f} s for it")
        return
    others = [d.name for d in run.cluster.devices if d.kind != "GPU"]
    sub = run.cluster.subset(groups[0] + others)
    options = run.options.replace(time_limit=deadline.seconds, exact_time=None, lns_time=None, search_time=None,
                                  heuristic_time=None, progress=None, started=None)
    inner = run_recipe(run.graph, sub, RECIPES["full"], options, name="full", deadline=deadline,
                         unit=run.budget.unit)
    plan = finalize(run.graph, run.cluster, inner.placement, order=inner.order, t0=t,
                    placer=f"{inner.placer}@{groups[0][0]}")
    run.plans.starts.append(plan)
    run.trace.record("one group", t, plan.makespan, f"{len(sub)} of {len(run.cluster)} devices ({groups[0][0]}...)")


PASSES: Mapping[str, Callable[[Run, Deadline], Plan | None]] = {
    "heuristics": heuristics_pass, "one group": one_group, "reschedule": reschedule_starts,
    "coarsen": coarsen_graph, "exact": exact, "expand": expand, "lns": lns_pass, "local search": local_search,
    "status": status}
RECIPES = {"paper": ("coarsen", "heuristics", "exact", "expand", "status"),
           "full": ("heuristics", "one group", "reschedule", "coarsen", "exact", "expand", "lns", "local search",
                    "status")}


def new_run(graph: OpGraph, cluster: Cluster, passes: Sequence[str], options: SolveOptions, *, name: str = "",
            starts: Sequence[Plan] = (), deadline: Deadline | None = None, unit: float | None = None) -> Run:
    """The state of a run of ``passes`` (see :func:`run_recipe`), before any pass ran.

    Raises
    ------
    ValueError
        The recipe does not end with ``"status"``, or names an unknown pass.
    """
    if not passes or passes[-1] != "status":
        raise ValueError(f"a recipe ends with the 'status' pass, got {list(passes)}")
    unknown = [st for st in passes if st not in PASSES]
    if unknown:
        raise ValueError(f"unknown passes {unknown}; known: {list(PASSES)}")
    deadline = deadline or Deadline(options.time_limit, deterministic=options.deterministic,
                                    start=options.started)
    wants = options.pass_seconds(name)
    costs = dict(COSTS)
    if not needs_coarsening(graph, options, wants["exact"]):
        costs["coarsen"] = Cost()  # nothing to coarsen: the pass costs nothing
    budget = Budget(deadline, passes, wants, costs, unit=unit)
    run = Run(graph, cluster, options, name, tuple(passes), budget, Trace(options))
    run.plans.starts.extend(starts)
    return run


def run_passes(run: Run, passes: Sequence[str] | None = None) -> Plan | None:
    """Run ``passes`` (default: the run's whole list) in order, each under its
    grant or skipped with the reason in its note; returns the status pass's
    plan (None if it did not run). Interrupts (SIGINT, SIGTERM) stop the
    running pass at its next check."""
    result = None
    with run.budget.deadline.catching_signals(), gc_frozen():
        for st in passes or run.passes:
            stop_if_optimal(run)
            grant = run.budget.grant(st)
            if isinstance(grant, Skip):
                run.budget.skip(st, grant)
                run.trace.record(st, time.perf_counter(), None, grant.note)
                run.trace.say(f"{st}: {grant.note}")
                continue
            seconds = "" if grant.seconds == float("inf") else f" ({grant.seconds:.1f} s granted)"
            run.trace.granted[st] = grant.seconds
            run.trace.say(f"{st}: start{seconds} | {standing(run)}")
            n, t = len(run.trace.passes), time.perf_counter()
            gc.freeze()  # what earlier passes made (plans of every op) lives on too
            result = PASSES[st](run, grant)
            note = run.trace.passes[-1].note if len(run.trace.passes) > n else "nothing to do"
            run.trace.say(f"{st}: done in {time.perf_counter() - t:.2f} s{': ' + note if note else ''}"
                          f" | {standing(run)}")
    return result


def stop_if_optimal(run: Run) -> None:
    """Finish the run early (:meth:`Budget.finish <solver.budget.Budget.finish>`:
    the search passes left are skipped) once its incumbent is within
    :data:`~solver.bounds.TOLERANCE` of the lower bound known so far (critical
    path / work from the start, the exact solver's once it solved the graph
    itself), or once the exact solver proved its plan optimal on the graph
    itself (the incumbent is that plan or better): no pass can improve it.
    Never on stagnation: a pass that found nothing new does not stop the run."""
    step = run.best_step
    if step is None or run.budget.finished:
        return
    if reached(step, run.bound):
        run.budget.finish(f"stopped early: incumbent within {TOLERANCE:g} of the lower bound ({run.bound_source})")
    elif run.coarse is None and run.solved is not None and run.solved.status == "optimal":
        run.budget.finish(f"stopped early: {run.options.backend} proved the incumbent optimal on the graph itself")


def standing(run: Run) -> str:
    """The progress tail: the incumbent's step, the best bound so far and the gap, in ms."""
    step, bound = run.best_step, run.bound
    if step is None:
        return f"no incumbent yet, bound {bound / 1000:.3f} ms"
    gap = max(0.0, (step - bound) / step) if step > 0 else 0.0
    return f"incumbent {step / 1000:.3f} ms, bound {bound / 1000:.3f} ms, gap {percent(gap)}"


def run_recipe(graph: OpGraph, cluster: Cluster, passes: Sequence[str], options: SolveOptions, *,
                 name: str = "", starts: Sequence[Plan] = (), deadline: Deadline | None = None,
                 unit: float | None = None) -> Plan:
    """Run the named ``passes`` in order; the last must be ``"status"``.

    Parameters
    ----------
    name : the recipe's name, for ``plan.log.recipe`` and the pass
        times (:meth:`SolveOptions.pass_seconds`: "full" shares, others
        the paper's, unless the options give them)
    starts : plans of ``graph`` to start from (beside the heuristics)
    deadline : a pass's share of an outer solve (its clock and
        interrupts); default: a new one from ``options``
    unit : the cost unit, if an outer solve measured it

    Returns the winning plan of ``graph`` with ``plan.log`` (a
    :class:`~pesto.solvelog.SolveLog`).
    """
    run = new_run(graph, cluster, passes, options, name=name, starts=starts, deadline=deadline, unit=unit)
    return run_passes(run)


def solve(graph: OpGraph, cluster: Cluster, options: SolveOptions) -> Plan:
    """Choose the recipe (:meth:`SolveOptions.recipe_for`) and run it
    (``pesto.solve`` without loading or pre-checks; see :func:`pesto.api.solve`).

    ``"full"`` gives its search passes :data:`SHARES` of ``time_limit``,
    ``"paper"`` its :data:`~solver.options.PAPER_EXACT_SHARE` to the exact
    solver; the heuristics, the re-ordering and the lower bound use the rest,
    and a pass never runs past the deadline.

    Raises
    ------
    ValueError
        ``hint=None`` with the full recipe on a graph above ``target_vertices``.
    """
    name = options.recipe_for(graph)
    return run_recipe(graph, cluster, RECIPES[name], options, name=name)


def improve(graph: OpGraph, cluster: Cluster, starts: Sequence[Plan], *, target_vertices: int = 200,
            cpsat_time: float = 20, refine_time: float = 20, lns_time: float = 0.0, workers: int | None = None,
            seed: int = 0, coarsen_options: Mapping | None = None, partitions: int = 1,
            max_starts: int = 4) -> Plan:
    """The full recipe after its heuristics (and the one-group pass),
    from given ``starts`` (plans of ``graph``): reschedule the ``max_starts``
    best, coarsen keeping the incumbent (and the next ``partitions - 1``)
    representable, CP-SAT for ``cpsat_time`` (0 skips it), expand, LNS for
    ``lns_time`` (0, the default, skips it), refine for ``refine_time`` (0
    skips it); no overall time limit. Never worse than the best rescheduled start.
    """
    options = SolveOptions(time_limit=None, exact_time=cpsat_time, search_time=refine_time, lns_time=lns_time,
                           target_vertices=target_vertices, workers=workers, seed=seed,
                           coarsen_options=dict(coarsen_options or {}), partitions=partitions, max_starts=max_starts)
    passes = [st for st in RECIPES["full"] if st not in ("heuristics", "one group")]
    return run_recipe(graph, cluster, passes, options, name="full", starts=starts)


def solve_fine(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, target_vertices: int = 200,
               workers: int | None = None, seed: int = 0, extra_starts: Sequence[Plan] = (),
               heuristics: Sequence[str] = HEURISTICS, cpsat_share: float = SHARES[0],
               lns_share: float = SHARES[1], refine_share: float = SHARES[2],
               coarsen_options: Mapping | None = None) -> Plan:
    """The full recipe: ``heuristics`` on the full graph (one that raises
    a :class:`~pesto.errors.PestoError` is skipped, named in
    ``plan.log.skipped``), ``extra_starts`` joining them, then the passes of
    :func:`improve` with ``time_limit`` split between CP-SAT, LNS and
    refinement (no overall deadline: each pass has its seconds).

    >>> from pesto.cluster import gpus
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(300)}  # a 20 x 15 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(300) for j in (i + 15, i + 16) if j < 300])
    >>> p = solve_fine(g, gpus(2), time_limit=2, target_vertices=40, workers=1)
    >>> p.makespan <= min(p.log.candidates.values())
    True
    """
    options = SolveOptions(time_limit=None, exact_time=cpsat_share * time_limit, lns_time=lns_share * time_limit,
                           search_time=refine_share * time_limit, heuristic_time=time_limit,
                           target_vertices=target_vertices, heuristics=tuple(heuristics), workers=workers,
                           seed=seed, coarsen_options=dict(coarsen_options or {}))
    return run_recipe(graph, cluster, RECIPES["full"], options, name="full", starts=extra_starts)
