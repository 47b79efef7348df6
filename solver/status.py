"""The status pass: the winner among the candidates, its lower bound, its status, the log.

:func:`status` ends every recipe (:mod:`solver.recipes`); :func:`final_status`
is the one status rule.
"""
from __future__ import annotations

import time

from pesto.deadline import Deadline
from pesto.plan import Plan, check_plan
from pesto.solvelog import SolveLog

from .bound_model import CHAIN_SOURCE, SIMPLE_SOURCE, comm_bound
from .bounds import TOLERANCE, chain_heads, lower_bound, reached
from .budget import CHAIN_RUNS, CHECK_RUNS, COMM_BOUND_RUNS, STATUS_RUNS
from .passes import Run, choose

__all__ = ["status", "final_status", "TOLERANCE"]

def final_status(plan: Plan, bound: float, *, proved_optimal: bool, exact_ran: bool,
                 interrupted: bool = False) -> str:
    """The one status rule: ``infeasible`` if the plan breaks memory;
    ``optimal`` if an exact solver proved it on the graph itself or its step
    is within :data:`TOLERANCE` of ``bound``; else ``feasible`` when an exact
    pass ran, ``heuristic`` when none did; ``interrupted`` instead of these
    two when the user stopped the solve.

    >>> final_status(Plan({}, {}, makespan=10.0), 10.0, proved_optimal=False, exact_ran=False)
    'optimal'
    >>> final_status(Plan({}, {}, makespan=11.0), 10.0, proved_optimal=False, exact_ran=True)
    'feasible'
    """
    if plan.status == "infeasible":
        return "infeasible"
    if proved_optimal or reached(plan.makespan, bound):
        return "optimal"
    if interrupted:
        return "interrupted"
    return "feasible" if exact_ran else "heuristic"


def status(run: Run, deadline: Deadline) -> Plan:
    """The winner, its lower bound and status; checked (unless, on a graph
    where the check takes over half a second (:data:`~solver.budget.CHECK_RUNS`),
    the user interrupted or the check would overrun the limit by over a
    second: then only a plan the user gave is checked, the others being the
    simulator's own; the note says so, and says when the solve ended past
    its limit by more than 10 % or 2 s). The bound is the exact solver's when
    it solved the graph itself and proved more, else the critical-path phase
    bound and :func:`~solver.bound_model.comm_bound` (communication-aware,
    for the status pass's bound time, when that fits before the final check;
    critical path / work when it is 0). It always runs: it reads the budget
    for what fits, not ``deadline``. Returns the winning plan with
    ``placer="pesto"`` and its :class:`~pesto.solvelog.SolveLog`."""
    t = time.perf_counter()
    graph, opts, solved, pool = run.graph, run.options, run.solved, run.plans.pool
    given = opts.hint
    if isinstance(given, Plan) and given.has_times and set(given.placement) == set(graph.names) \
            and not any(p is given for _, p in pool):
        pool.append((given.placer or "hint", given))  # never slower than the user's own plan
    if not pool:
        raise ValueError(f"no candidate plan: the passes {list(run.passes)} made none")
    winner, best = choose(pool)
    on_graph = solved is not None and run.coarse is None
    bound, source = _held(run, best, *_bound(run, best))
    run.raise_bound(bound, source)
    st = final_status(best, bound, exact_ran=solved is not None, interrupted=run.budget.deadline.interrupted,
                      proved_optimal=on_graph and winner == opts.backend and best.status == "optimal")
    note = st + _check(run, best)
    run.trace.record("status", t, best.makespan, note)
    budget = run.budget
    coarse = {}
    if run.coarse is not None and solved is not None:
        coarse = {"status": solved.status, "makespan": solved.makespan, "lower_bound": solved.lower_bound}
    log = SolveLog(recipe=run.name, passes=run.trace.passes, candidates={k: p.makespan for k, p in pool},
                   winner=winner, bound=bound, bound_source=source, vertices=run.work.num_ops, coarse=coarse,
                   hint=run.trace.hint, skipped=run.trace.skipped,
                   stopped=budget.deadline.reason or budget.stopped, stopped_early=budget.stopped_early,
                   deterministic=budget.deadline.deterministic, one_device=run.plans.one_device)
    result = best.replace(placer="pesto", lower_bound=bound, status=st, log=log,
                          wall_time=time.perf_counter() - run.trace.t0)
    run.trace.say(result.summary())
    return result


def _bound(run: Run, best: Plan) -> tuple[float, str]:
    """The lower bound and its source: the simple bound, the exact solver's
    (when it solved the graph itself), the chain bound, the communication-aware one."""
    graph, budget = run.graph, run.budget
    bound, source = run.bound, run.bound_source  # critical path / work, or the exact solver's on the graph
    bound, source, phased = _cheap_bound(run, best, bound, source)
    interrupted = budget.deadline.interrupted
    bound_time = 0.0 if interrupted else budget.deadline.budget(budget.wants.get("status", 0.0))
    if budget.predicting:  # building its model, then the final check
        room = budget.left() - budget.runs(STATUS_RUNS + COMM_BOUND_RUNS)
        bound_time = min(bound_time, room) if room > 0.05 else 0.0
    if bound_time > 0.05 and not reached(best.makespan, bound):
        cb = comm_bound(graph, run.cluster, time_limit=bound_time, incumbent=best, workers=1,
                        seed=run.options.seed, deterministic=budget.deadline.deterministic, phased=phased,
                        deadline=budget.deadline)
        if cb.value > bound:  # (never above the makespan: the incumbent caps the model)
            bound, source = min(cb.value, best.makespan), cb.source
    return bound, source


def _held(run: Run, best: Plan, bound: float, source: str) -> tuple[float, str]:
    """``(bound, source)``, unless a plan that keeps memory beats the bound:
    then it came from a model that forbids valid plans (a restricted CP-SAT
    model), and critical path / work stands instead, so that a bound never
    exceeds a valid plan's step nor makes it "optimal"."""
    if best.status == "infeasible" or reached(bound, best.makespan):
        return bound, source
    run.trace.say(f"status: the {source} bound {bound / 1000:.3f} ms exceeds the step of a valid plan "
                  f"({best.makespan / 1000:.3f} ms): not a bound of the graph, critical path / work used")
    return lower_bound(run.graph, run.cluster), SIMPLE_SOURCE


def _cheap_bound(run: Run, best: Plan, bound: float, source: str):
    """The chain bound when it fits before the final check (or
    in deterministic mode), kept when above ``bound``; returns ``(bound,
    source, phases)`` (phases None when skipped) so :func:`comm_bound` need
    not repeat them."""
    budget = run.budget
    if budget.deadline.interrupted or reached(best.makespan, bound) or not budget.fits(CHAIN_RUNS + CHECK_RUNS):
        return bound, source, None
    phased = chain_heads(run.graph, run.cluster)
    if phased.value > bound:
        bound, source = min(phased.value, best.makespan), CHAIN_SOURCE
    return bound, source, phased


def _check(run: Run, best: Plan) -> str:
    """Check the winner with :func:`~pesto.plan.check_plan` (raising if it is
    invalid) unless that is skipped for time; the note's tail: a skipped
    check, a limit not kept."""
    budget, dl = run.budget, run.budget.deadline
    note = ""
    check = CHECK_RUNS * budget.unit if budget.unit is not None else 0.0  # its predicted seconds
    pressed = dl.interrupted or (not dl.deterministic and dl.left() + 1.0 < check)
    if check > 0.5 and pressed and best is not run.options.hint:  # a plan the simulator made: out fast
        note += f"; final check skipped: {dl.reason or 'time limit'}"
    else:
        check_plan(run.graph, run.cluster, best, check_memory=best.status != "infeasible").raise_if_invalid()
    over = dl.elapsed() - dl.seconds
    if not dl.deterministic and over > max(2.0, 0.1 * dl.seconds):  # the limit was not kept: say why
        note += f"; over the time limit by {over:.1f} s: " + _why_over(run)
    return note


def _why_over(run: Run) -> str:
    """The pass that overran its grant the most (e.g. CP-SAT on a big model
    past its stop), else the graph's size against the first heuristic's time."""
    late = [(s.seconds - run.trace.granted[s.name], s) for s in run.trace.passes
            if s.name in run.trace.granted and s.seconds > run.trace.granted[s.name] + 0.5]
    if late:
        extra, slow = max(late, key=lambda x: x[0])
        return (f"the {slow.name} pass ({slow.note}) took {slow.seconds:.1f} s of a "
                f"{run.trace.granted[slow.name]:.1f} s grant")
    return (f"{run.graph.num_ops} ops need more for one plan"
            f" (the first heuristic took {run.budget.unit or 0.0:.1f} s)")
