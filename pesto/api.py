"""``pesto.solve``: the whole pipeline in one call.

Load the graph, choose a cluster, check feasibility, coarsen, run the fast
heuristics for a hint, solve exactly, expand to every op, simulate, compare
with the heuristics on the full graph, check, and return the best plan.

Examples
--------
>>> import pesto
>>> g = pesto.OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
>>> plan = pesto.solve(g, gpus=2, time_limit=5, workers=1)
>>> plan.status, plan.makespan <= 90.0
('optimal', True)
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .cluster import Cluster, gpus as _gpus, v100x2_nvlink
from .errors import InvalidGraphError
from .graph import OpGraph
from .plan import Plan, check_plan

__all__ = ["solve", "load_graph", "default_cluster", "HEURISTICS"]

HEURISTICS = ("m-etf", "m-topo", "m-sct", "celeritas", "heft", "metis", "expert", "single")


def load_graph(graph) -> OpGraph:
    """An OpGraph from an OpGraph, a ``networkx.DiGraph`` (attributes as in
    :meth:`OpGraph.from_networkx`) or a JSON path / string."""
    if isinstance(graph, OpGraph):
        return graph
    if isinstance(graph, (str, Path)):
        return OpGraph.from_json(str(graph))
    try:
        import networkx as nx
    except ImportError:  # pragma: no cover
        nx = None
    if nx is not None and isinstance(graph, nx.DiGraph):
        return OpGraph.from_networkx(graph)
    raise InvalidGraphError(f"cannot read a graph from {type(graph).__name__}; "
                            "give an OpGraph, a networkx.DiGraph or a JSON path")


def default_cluster(graph: OpGraph, n: int = 2) -> Cluster:
    """2 V100 over NVLink for ``n == 2``, else ``gpus(n)``; a ``/CPU:0`` is added
    only when some op cannot run on a GPU."""
    need_cpu = any("GPU" not in op.kinds for op in graph.ops)
    if n == 2:
        return v100x2_nvlink(with_cpu=need_cpu)
    return _gpus(n, with_cpu=need_cpu)


def _expand(cg, graph, cluster, plan: Plan, placer: str, status: str, t0: float) -> Plan:
    """A coarse plan mapped to every fine op and simulated in its fixed order."""
    from solver.common import finalize

    fine = cg.expand(plan) if cg is not None else plan
    return finalize(graph, cluster, dict(fine.placement), order={d: list(o) for d, o in fine.order.items()},
                    placer=placer, t0=t0, status=status if plan.status != "infeasible" else "infeasible",
                    stats=dict(plan.stats))


def solve(graph, gpus: int = 2, *, cluster: Cluster | None = None, time_limit: float = 60,
          target_vertices: int = 200, backend: str = "cpsat", hint: Any = "best-heuristic",
          workers: int | None = None, seed: int = 0, coarsen_method: str = "height",
          pipeline: str = "full", verbose: bool = False) -> Plan:
    """Place and schedule ``graph`` on ``gpus`` GPUs (or on ``cluster``).

    Parameters
    ----------
    graph : OpGraph, networkx.DiGraph or str/Path (JSON)
    gpus : int
        Number of GPUs for the default cluster (ignored if ``cluster`` is given).
    cluster : Cluster, optional
    time_limit : float
        Seconds for the exact search (heuristics and coarsening come on top).
    target_vertices : int
        Coarsen when the graph has more ops than this.
    backend : {"cpsat", "mip"} or any placer name
    hint : "best-heuristic", None, a placer name, or a Plan of the solved graph
    workers : int, optional
        CP-SAT workers (default all CPUs).
    seed : int
    coarsen_method : str
        ``coarsen.coarsen`` method ("height", "baechi", "celeritas").
    pipeline : {"full", "paper"}
        For graphs larger than ``target_vertices``. ``"paper"``: coarsen,
        heuristics on the coarse graph as hints, exact solve, expand (the
        Pesto paper). ``"full"`` (default): heuristics on the full graph, the
        best ones re-ordered; coarsening that keeps the best plan exactly
        representable (``partition=``), CP-SAT hinted with it, expand,
        re-order; then local search on the full graph
        (:func:`solver.refine.solve_fine`). ``time_limit`` is split 30 % CP-SAT,
        60 % local search. Graphs of at most ``target_vertices`` ops are solved
        exactly either way.
    verbose : bool
        Print progress and the solver log.

    Returns
    -------
    Plan
        For every op of ``graph``, simulated in its fixed order and checked.
        ``stats["winner"]`` names the placer whose plan won, ``stats["candidates"]``
        the simulated makespan of every candidate on the full graph;
        ``lower_bound`` is valid for the full graph (critical path, work per
        device; plus the solver's bound when the graph was not coarsened).

    Raises
    ------
    InfeasibleError
        Before any solving, naming the op, group or "total" that cannot fit.
    """
    from solver import get_placer, run_placers
    from pesto.memory import check_feasible
    from solver.bounds import lower_bound

    t0 = time.perf_counter()

    def say(msg):
        if verbose:
            print(f"[pesto {time.perf_counter() - t0:7.2f}s] {msg}", flush=True)

    graph = load_graph(graph)
    cluster = cluster if cluster is not None else default_cluster(graph, gpus)
    check_feasible(graph, cluster)
    stats: dict[str, Any] = {"ops": graph.num_ops, "cluster": cluster.name}

    if pipeline not in ("full", "paper"):
        raise ValueError(f"pipeline must be 'full' or 'paper', got {pipeline!r}")
    if graph.num_ops > target_vertices and pipeline == "full" and backend == "cpsat":
        return _solve_large(graph, cluster, stats, hint=hint, time_limit=time_limit,
                            target_vertices=target_vertices, workers=workers, seed=seed,
                            coarsen_method=coarsen_method, t0=t0, say=say)

    # coarsen
    cg, work = None, graph
    if graph.num_ops > target_vertices:
        try:
            import coarsen
            try:  # the cluster only informs the coarsener's CCR report
                cg = coarsen.coarsen(graph, target_vertices, method=coarsen_method, cluster=cluster)
            except TypeError:
                cg = coarsen.coarsen(graph, target_vertices, method=coarsen_method)
            work = cg.graph
            stats["coarsen"] = {"method": coarsen_method, "vertices": work.num_ops,
                                "seconds": time.perf_counter() - t0}
            say(f"coarsened {graph.num_ops} ops to {work.num_ops} vertices ({coarsen_method})")
        except (ImportError, AttributeError) as exc:
            stats["coarsen"] = f"unavailable ({exc}); solved the graph as given"
            say(stats["coarsen"])
    stats["vertices"] = work.num_ops

    # heuristics (on the solved graph), for the hint and as candidates
    names = []
    if hint == "best-heuristic":
        names = list(HEURISTICS)
    elif isinstance(hint, str):
        names = [hint]
    heur, errors = run_placers(work, cluster, names, say=say, time_limit=time_limit, seed=seed)
    if errors:
        stats["heuristic_errors"] = errors
    hint_plan = None
    if isinstance(hint, Plan):
        if set(hint.placement) == set(work.names):
            hint_plan = hint
        else:
            stats["hint"] = "given plan does not cover the solved graph; ignored"
    elif heur:
        valid = [p for p in heur.values() if check_plan(work, cluster, p, check_memory=False).ok]
        ok = [p for p in valid if p.status != "infeasible"] or valid
        hint_plan = min(ok, key=lambda p: p.makespan) if ok else None
    if hint_plan is not None:
        stats["hint"] = hint_plan.placer or "plan"

    # exact solve
    opts = {"time_limit": time_limit, "seed": seed}
    if backend == "cpsat":
        opts.update(workers=workers, hint=hint_plan, log=verbose)
    elif backend == "mip":
        opts.update(workers=workers, hint=hint_plan)
    t_solve = time.perf_counter()
    solved = get_placer(backend)(work, cluster, **opts)
    say(f"{backend}: {solved.summary()}")
    stats["solver"] = {"status": solved.status, "makespan": solved.makespan, "lower_bound": solved.lower_bound,
                       "seconds": time.perf_counter() - t_solve,
                       **{k: v for k, v in solved.stats.items() if isinstance(v, (int, float, str, bool))}}

    # every candidate on the full graph
    coarse = cg is not None
    sol_status = solved.status if not coarse or solved.status in ("infeasible", "heuristic") else "feasible"
    cands = {backend: _expand(cg, graph, cluster, solved, backend, sol_status, t0) if coarse else solved}
    for name, p in heur.items():
        cands[name] = _expand(cg, graph, cluster, p, name, p.status, t0) if coarse else p
    bad = {}
    for k in list(cands):
        rep = check_plan(graph, cluster, cands[k], check_memory=cands[k].status != "infeasible")
        if not rep.ok and k != backend:  # a broken baseline plan is dropped, and said
            bad[k] = rep.violations[:3]
            del cands[k]
    if bad:
        stats["invalid_candidates"] = bad
    stats["candidates"] = {k: p.makespan for k, p in cands.items()}
    feasible = {k: p for k, p in cands.items() if p.status != "infeasible"} or cands
    winner = min(feasible, key=lambda k: (feasible[k].makespan, k != backend))
    best = feasible[winner]
    stats["winner"] = winner

    lb = lower_bound(graph, cluster)
    if coarse:
        stats["coarse_lower_bound"] = solved.lower_bound
        stats["coarse_status"] = solved.status
    elif solved.lower_bound is not None and solved.status != "infeasible":
        lb = max(lb, solved.lower_bound)
    status = best.status
    if status == "optimal" and best.makespan > lb + 1e-6 * max(1.0, lb) + (
            solved.stats.get("rounding_error_us", 0.0) if winner == backend else 0.0):
        status = "feasible"  # e.g. FCFS replay above the model's optimum
    report = check_plan(graph, cluster, best, check_memory=best.status != "infeasible")
    report.raise_if_invalid()
    stats.update({k: v for k, v in best.stats.items() if k not in stats})
    plan = best.replace(placer="pesto", lower_bound=lb, status=status, wall_time=time.perf_counter() - t0,
                        stats=stats)
    say(plan.summary())
    return plan


def _solve_large(graph: OpGraph, cluster: Cluster, stats: dict, *, hint, time_limit, target_vertices,
                 workers, seed, coarsen_method, t0, say) -> Plan:
    """The default pipeline for graphs above ``target_vertices`` (see ``pipeline``)."""
    from solver.bounds import lower_bound
    from solver.refine import solve_fine

    extra = []
    if isinstance(hint, Plan):
        if set(hint.placement) == set(graph.names):
            extra.append(hint)
        else:
            stats["hint"] = "given plan does not cover the graph; ignored"
    fine = solve_fine(graph, cluster, time_limit=time_limit, target_vertices=target_vertices,
                      workers=workers, seed=seed, extra_starts=extra,
                      coarsen_options={"method": coarsen_method})
    log = dict(fine.stats.get("improve", {}))
    say(f"starts {log.get('starts')}; CP-SAT {log.get('cpsat')}; refined {log.get('refined')}")
    stats["pipeline"] = "full"
    stats["improve"] = log
    stats["vertices"] = log.get("vertices")
    stats["candidates"] = {**log.get("starts", {}), "cpsat": log.get("cpsat_expanded"),
                           "refine": log.get("refined")}
    stats["winner"] = log.get("winner")
    report = check_plan(graph, cluster, fine, check_memory=fine.status != "infeasible")
    report.raise_if_invalid()
    lb = lower_bound(graph, cluster)
    if fine.status == "infeasible":
        status = "infeasible"
    elif fine.makespan <= lb * (1 + 1e-9):
        status = "optimal"
    else:
        status = "feasible"
    stats.update({k: v for k, v in fine.stats.items() if k not in stats})
    plan = fine.replace(placer="pesto", lower_bound=lb, status=status,
                        wall_time=time.perf_counter() - t0, stats=stats)
    say(plan.summary())
    return plan
