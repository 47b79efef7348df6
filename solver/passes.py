"""The passes of ``pesto.solve``, each a function ``fn(run, deadline)`` over one :class:`Run`.

A pass reads and updates the run's plans, records a
:class:`~pesto.solvelog.PassLog` (seconds, step time, note) and stops by the
``deadline`` the budget granted it (:meth:`solver.budget.Budget.grant`);
the recipes and the loop that runs them are in :mod:`solver.recipes`,
the status pass in :mod:`solver.status`.

=============  =================================================================
heuristics     the heuristics on the graph the run works on (m-TOPO first)
reschedule     the best ``max_starts`` plans re-ordered (:func:`search.reschedule
               <solver.search.reschedule>`); the best is the *incumbent*
coarsen        above ``target_vertices`` ops: coarsen, keeping the incumbent
               exactly representable when there is one (``partition=``)
exact          CP-SAT (or the MIP) on the (coarse) graph, hinted with the
               incumbent's projection, else the best valid heuristic
expand         plans of the coarse graph mapped to every op (re-ordered when the
               recipe reschedules); an invalid heuristic plan is dropped, and said
lns            CP-SAT windows of :data:`solver.lns.WINDOW` ops on the full graph
               (:func:`solver.lns.lns`) from the best plan
local search   :func:`search.refine <solver.search.refine>` from the best plan
=============  =================================================================
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import coarsen
from pesto.cluster import Cluster
from pesto.deadline import REPLAY_COST_PER_OP, Deadline
from pesto.engine import replay
from pesto.errors import InfeasibleError
from pesto.finalize import finalize
from pesto.graph import OpGraph
from pesto.outcome import LnsInfo, RefineInfo, RescheduleInfo
from pesto.plan import Plan, check_plan
from pesto.problem import Problem
from pesto.solvelog import PassLog

from .bound_model import SIMPLE_SOURCE
from .bounds import lower_bound
from .common import rank
from .budget import CANDIDATE_RUNS, HEURISTIC_COST, RESCHEDULE_RUNS, Budget, Skip
from .lns import lns
from .options import SolveOptions
from .registry import accepted_options, get, run_order, run_placers
from .search import better, refine, reschedule

__all__ = ["Run", "Trace", "Candidates", "heuristics_pass", "reschedule_starts", "coarsen_graph", "exact", "expand",
           "lns_pass", "local_search", "choose", "to_graph"]


class Trace:
    """What the passes did, for the :class:`~pesto.solvelog.SolveLog`: their
    records, the placers skipped (and why), the hint; and the progress lines."""

    def __init__(self, options: SolveOptions):
        # the elapsed seconds of the progress lines count from where the time limit does
        self.t0 = options.started if options.started is not None else time.perf_counter()
        self.verbose, self.progress = options.verbose, options.progress
        self.passes: list[PassLog] = []
        self.skipped: dict[str, str] = {}
        self.hint = ""
        self.granted: dict[str, float] = {}  # pass -> the seconds its grant gave (the loop records it)

    @property
    def talks(self) -> bool:
        """Someone reads the progress lines (``verbose`` or a ``progress`` callback)."""
        return bool(self.verbose) or self.progress is not None

    def say(self, msg: str) -> None:
        """One progress line, ``[pesto  <elapsed>s] msg``: printed with ``verbose``,
        passed to the ``progress`` callback when there is one."""
        if not self.talks:
            return
        line = f"[pesto {time.perf_counter() - self.t0:7.2f}s] {msg}"
        if self.verbose:
            print(line, flush=True)
        if self.progress is not None:
            self.progress(line)

    def record(self, name: str, t: float, makespan: float | None = None, note: str = "") -> None:
        """The pass ``name`` that began at ``t`` (``time.perf_counter()``); the
        loop (:func:`solver.recipes.run_passes`) reports it."""
        self.passes.append(PassLog(name, time.perf_counter() - t, makespan, note))


@dataclass
class Candidates:
    """The plans found so far: ``starts`` (plans of the graph to start from:
    a given plan, the one-group solve's), ``heuristics`` (the heuristics'
    plans of the solved graph, not yet candidates), ``ranked`` (the
    re-ordered starts, best first: ``ranked[0]`` is the incumbent),
    ``pool`` (the candidates, (name, plan of the graph), in tie-break order)
    and ``one_device`` (the ``single`` heuristic's step, µs, when it fits)."""

    starts: list[Plan] = field(default_factory=list)
    heuristics: dict[str, Plan] = field(default_factory=dict)
    ranked: list[Plan] = field(default_factory=list)
    pool: list[tuple[str, Plan]] = field(default_factory=list)
    one_device: float | None = None   # the single heuristic's step, kept after the heuristics are spent

    @property
    def incumbent(self) -> Plan | None:
        return self.ranked[0] if self.ranked else None


@dataclass
class Run:
    """The state the passes share: the problem, the options, the budget, what
    the passes did (``trace``), the plans (``plans``), and the exact pass's
    side: the coarse graph it solves (``coarse``; None: the graph itself),
    its hint and its plan (``solved``, of :attr:`work`)."""

    graph: OpGraph
    cluster: Cluster
    options: SolveOptions
    name: str
    passes: tuple
    budget: Budget
    trace: Trace
    plans: Candidates = field(default_factory=Candidates)
    coarse: coarsen.CoarseGraph | None = None
    hint: Plan | None = None
    solved: Plan | None = None
    bound: float = 0.0
    bound_source: str = SIMPLE_SOURCE

    def __post_init__(self):
        """The cheap lower bound (critical path / work), known from the start."""
        try:
            self.bound = lower_bound(self.graph, self.cluster)
        except InfeasibleError:  # no problem arrays: the heuristics name why in log.skipped
            self.bound = 0.0

    def raise_bound(self, value: float | None, source: str) -> None:
        """A lower bound of the graph found on the way (the exact solver's on the graph itself)."""
        if value is not None and value > self.bound:
            self.bound, self.bound_source = float(value), source

    @property
    def best_step(self) -> float | None:
        """The incumbent's step time (µs): the shortest memory-feasible plan of
        the graph found so far (candidates, starts, heuristics when they are
        of the graph); None before any."""
        plans = [p for _, p in self.plans.pool] + self.plans.ranked + self.plans.starts
        if self.coarse is None:
            plans += self.plans.heuristics.values()
        steps = [p.makespan for p in plans if p.status != "infeasible" and p.makespan is not None
                 and len(p.placement) == self.graph.num_ops]
        return min(steps, default=None)

    @property
    def work(self) -> OpGraph:
        """The graph the exact solver sees: the coarse graph, or the graph."""
        return self.coarse.graph if self.coarse is not None else self.graph

    @property
    def reorders(self) -> bool:
        """Plans are re-ordered on the full graph (the recipe has a reschedule pass)."""
        return "reschedule" in self.passes


def choose(pool: Sequence[tuple[str, Plan]]) -> tuple[str, Plan]:
    """The winner among candidates: memory-feasible first, then the shortest
    step; on a tie (within 1e-9 µs) the earlier candidate (:func:`search.better
    <solver.search.better>`).

    >>> fast_oom = Plan({}, {}, makespan=5.0, status="infeasible")
    >>> choose([("a", Plan({}, {}, makespan=10.0)), ("b", Plan({}, {}, makespan=10.0)), ("c", fast_oom)])[0]
    'a'
    """
    name, best = pool[0]
    for k, p in pool[1:]:
        if better(p, best):
            name, best = k, p
    return name, best


# -- heuristics -----------------------------------------------------------------------
def heuristics_pass(run: Run, deadline: Deadline) -> None:
    """The heuristics on ``run.work``; a given Plan of it joins the starts.

    The first in :func:`~solver.registry.run_order` (m-TOPO) runs first and,
    whatever the clock says, to its end (the plan any stop returns); only an
    interrupt stops it, and with no plan made yet the solve raises
    :class:`KeyboardInterrupt` (the CLI exits 130 writing nothing). Its time
    over its ``speed`` is the cost unit (:meth:`Budget.measure
    <solver.budget.Budget.measure>`, on the full graph). Each other one runs
    under the budget's grant for its predicted time (``speed`` units, plus
    m-SCT's LP limit): skipped when that does not fit, stopped (``Stopped``,
    named in ``log.skipped``) if it still runs at the grant's end or the user
    interrupts.
    """
    t = time.perf_counter()
    opts, budget = run.options, run.budget
    if isinstance(opts.hint, Plan):
        if set(opts.hint.placement) == set(run.work.names):
            run.plans.starts.insert(0, opts.hint)
        else:
            run.trace.hint = "given plan does not cover the graph; ignored"
    # m-SCT's LP grows quadratically; cap it so the heuristics stay a small share
    limit = max(0.1, budget.deadline.budget(opts.heuristic_seconds))
    lp_limit = max(1.0, 0.15 * limit)
    _warm_up(run)
    plans, errors = {}, {}
    for name in run_order(opts.heuristic_names(run.reorders)):
        if budget.deadline.interrupted and not plans:
            break  # interrupted before any plan: nothing more starts (KeyboardInterrupt below)
        sub = budget.deadline.interrupts_only()  # the first plan is made whatever the clock says
        if plans:
            sub = budget.grant("heuristics", need=_predicted(budget, name, lp_limit))
            if isinstance(sub, Skip):
                errors[name] = sub.note
                continue
        t1 = time.perf_counter()
        got, err = run_placers(run.work, run.cluster, [name], say=run.trace.say, time_limit=limit, seed=opts.seed,
                               deadline=sub, extra={"m-sct": {"lp_time_limit": lp_limit}})
        if got and not plans and run.work is run.graph:
            budget.measure((time.perf_counter() - t1) / (get(name).speed or 1.0))
        plans.update(got)
        errors.update(err)
    if not plans and budget.deadline.interrupted:  # nothing to return: stop as Python does on Ctrl-C
        raise KeyboardInterrupt(f"{budget.deadline.reason} before any plan existed")
    budget.deadline.charge(HEURISTIC_COST * REPLAY_COST_PER_OP * run.work.num_ops * (len(plans) + len(errors)))
    order = {k: i for i, k in enumerate(opts.heuristic_names(run.reorders))}
    run.plans.heuristics = dict(sorted(plans.items(), key=lambda kv: order[kv[0]]))  # ties: the heuristics' rank
    single = plans.get("single")
    if single is not None and single.status != "infeasible" and single.makespan:
        run.plans.one_device = single.makespan   # the speed-up's reference (SolveLog.one_device)
    run.trace.skipped.update(errors)
    best = min((p.makespan for p in plans.values()), default=None)
    run.trace.record("heuristics", t, best, f"{len(plans)} plans of {run.work.num_ops} ops")


def _predicted(budget: Budget, name: str, lp_limit: float) -> float:
    """Seconds heuristic ``name`` is predicted to take (its speed in m-TOPO
    runs; m-SCT's LP limit on top)."""
    rec = get(name)
    return budget.runs(rec.speed if rec.speed is not None else 3.0) + (lp_limit if name == "m-sct" else 0.0)


def _warm_up(run: Run) -> None:
    """Build what every simulation of ``run.work`` shares (the problem
    arrays, the engine's tables, its compiled loop) before timing the first
    heuristic, whose time is the cost unit of the later passes."""
    try:
        prob = Problem.of(run.work, run.cluster)
    except InfeasibleError:
        return  # each heuristic names it in log.skipped
    replay(prob, [a[0] for a in prob.allowed])


# -- reschedule -------------------------------------------------------------------------
def reschedule_starts(run: Run, deadline: Deadline) -> None:
    """The best ``max_starts`` starts and heuristics re-ordered; the best is the
    incumbent. With little time left (under a fifth of the limit) only the
    best is; with a cost unit, only as many as fit in the grant (one
    :data:`~solver.budget.RESCHEDULE_RUNS` each), and no candidate order
    starts without :data:`~solver.budget.CANDIDATE_RUNS` before the grant's
    end; past it, a plan that has times is kept as it is."""
    t = time.perf_counter()
    starts = run.plans.starts + list(run.plans.heuristics.values())
    if not starts:
        raise ValueError("the reschedule pass needs at least one start plan")
    budget, limit = run.budget, run.options.time_limit
    few = budget.left() < 0.2 * (limit or float("inf"))
    k = 1 if few else run.options.max_starts
    if budget.predicting and deadline.left() < float("inf"):
        k = max(1, min(k, int(deadline.left() / budget.runs(RESCHEDULE_RUNS))))
    chosen = sorted(starts, key=rank)[:k]
    sub = deadline.sub(max(0.0, deadline.left() - budget.runs(CANDIDATE_RUNS))) if budget.predicting else deadline
    ranked, cut = [], 0
    for p in chosen:
        if sub.expired() and p.has_times and p.makespan is not None:
            ranked.append(p)
            cut += 1
        else:
            ranked.append(reschedule(run.graph, run.cluster, p, deadline=sub))
            cut += ranked[-1].info_of(RescheduleInfo).cut is not None
    run.plans.ranked = sorted(ranked, key=rank)
    run.plans.pool = [(p.placer, p) for p in run.plans.ranked]
    run.plans.heuristics, run.plans.starts = {}, []
    best = run.plans.incumbent
    why = budget.deadline.reason or "time limit"
    note = f"; {cut} of {len(chosen)} not or partly re-ordered: {why}" if cut else ""
    run.trace.record("reschedule", t, best.makespan, f"incumbent {best.placer}{note}")


# -- coarsen, exact, expand -------------------------------------------------------------
def needs_coarsening(graph: OpGraph, options: SolveOptions, exact_seconds: float) -> bool:
    """The coarsen pass has work: an exact pass with time, a graph above ``target_vertices``."""
    return exact_seconds > 0 and graph.num_ops > options.target_vertices


def _coarsen(run: Run, partition=None):
    """The one call of :func:`coarsen.coarsen` (``partition``: placements to keep)."""
    extra = {} if partition is None else {"partition": partition}
    return coarsen.coarsen(run.graph, run.options.target_vertices, cluster=run.cluster, **extra,
                           **dict(run.options.coarsen_options))


def coarsen_graph(run: Run, deadline: Deadline) -> None:
    """Above ``target_vertices`` ops, the run works on a coarse graph; with
    an incumbent, one that keeps it (and the next best starts)
    representable, and the exact solver's hint is its projection."""
    t = time.perf_counter()
    opts, graph, incumbent = run.options, run.graph, run.plans.incumbent
    if not needs_coarsening(graph, opts, run.budget.wants.get("exact", 0.0)):
        run.hint = incumbent
        run.trace.record("coarsen", t, None, "skipped" if run.budget.wants.get("exact", 0.0) <= 0 else "not needed")
        return
    note = ""
    if incumbent is not None:
        parts = [dict(p.placement) for p in run.plans.ranked[:opts.partitions]]
        try:
            cg = _coarsen(run, partition=parts)
        except ValueError:  # a method without partition support (celeritas)
            cg = None
        if cg is None or cg.graph.num_ops > 2 * opts.target_vertices:
            # a fragmented placement (e.g. list schedulers alternating devices) blocks
            # merging: coarsen freely, the hint is then the majority projection
            note = f"; partition-aware gave {cg.graph.num_ops if cg is not None else 'none'}"
            cg = _coarsen(run)
        run.hint = cg.project(incumbent, run.cluster)
    else:
        cg = _coarsen(run)
    run.coarse = cg
    run.trace.record("coarsen", t, None, f"{graph.num_ops} ops to {cg.graph.num_ops} vertices{note}")


def _best_heuristic(run: Run) -> Plan | None:
    """The shortest valid heuristic plan of ``run.work`` (memory-feasible first)."""
    valid = [p for p in run.plans.heuristics.values()
             if check_plan(run.work, run.cluster, p, check_memory=False).ok]
    ok = [p for p in valid if p.status != "infeasible"] or valid
    return min(ok, key=lambda p: p.makespan) if ok else None


def exact(run: Run, deadline: Deadline) -> None:
    """The exact solver on ``run.work`` for its grant (at least 10 ms)."""
    t = time.perf_counter()
    opts = run.options
    if run.budget.wants.get("exact", 0.0) <= 0:
        run.trace.record("exact", t, None, "skipped")
        return
    hint = run.hint
    if hint is None and isinstance(opts.hint, Plan):
        if set(opts.hint.placement) == set(run.work.names):
            hint = opts.hint
        else:
            run.trace.hint = "given plan does not cover the solved graph; ignored"
    if hint is None:
        hint = _best_heuristic(run)
    if hint is not None:
        run.trace.hint = hint.placer or "plan"
    fn = get(opts.backend).fn
    options = {"time_limit": max(0.01, deadline.seconds), "seed": opts.seed, "workers": opts.workers,
               "hint": hint, "log": opts.verbose >= 2, "deadline": deadline}
    run.solved = fn(run.work, run.cluster, **accepted_options(fn, options))
    if run.coarse is None and run.solved.status != "infeasible":  # its bound holds for the graph itself
        run.raise_bound(run.solved.lower_bound, opts.backend)
    run.trace.record("exact", t, run.solved.makespan,
                     f"{opts.backend} {run.solved.status} on {run.work.num_ops} vertices")


def to_graph(run: Run, name: str, plan: Plan, status: str) -> Plan:
    """A plan of ``run.work`` as a plan of every op: re-ordered when the
    recipe reschedules, else simulated in its fixed order."""
    fine = run.coarse.expand(plan) if run.coarse is not None else plan
    if run.reorders:
        return reschedule(run.graph, run.cluster, fine, placer=name)
    if run.coarse is None:
        return plan
    return finalize(run.graph, run.cluster, dict(fine.placement), order={d: list(o) for d, o in fine.order.items()},
                    placer=name, t0=run.trace.t0, status=status, stats=dict(plan.stats), info=plan.info)


def expand(run: Run, deadline: Deadline) -> None:
    """The exact plan, then the heuristics not yet candidates, as plans of every
    op; a heuristic plan that is invalid on the full graph is dropped, and said.
    (Quick: it does not stop on ``deadline``.)"""
    t = time.perf_counter()
    backend, solved = run.options.backend, run.solved
    if solved is None and not run.plans.heuristics:
        run.trace.record("expand", t, None, "skipped")
        return
    new = []
    if solved is not None:
        coarse_ok = run.coarse is None or solved.status in ("infeasible", "heuristic")
        new.append((backend, to_graph(run, backend, solved, solved.status if coarse_ok else "feasible")))
    # the heuristics too: with the exact pass skipped (past the deadline) they are the only candidates
    new += [(k, to_graph(run, k, p, p.status)) for k, p in run.plans.heuristics.items()]
    run.plans.heuristics = {}
    for k, p in new:
        rep = check_plan(run.graph, run.cluster, p, check_memory=p.status != "infeasible")
        if rep.ok or k == backend:  # the solver's plan is kept: the status pass raises on it
            run.plans.pool.append((k, p))
        else:
            run.trace.skipped[k] = "invalid plan: " + "; ".join(map(str, rep.violations[:3]))
    run.trace.record("expand", t, new[0][1].makespan, f"{new[0][0]} on every op")


# -- searches on the full graph ---------------------------------------------------------
def lns_pass(run: Run, deadline: Deadline) -> None:
    """:func:`~solver.lns.lns` from the best candidate, for its grant."""
    t = time.perf_counter()
    if run.budget.wants.get("lns", 0.0) <= 0 or not run.plans.pool:
        run.trace.record("lns", t, None, "skipped")
        return
    opts = run.options
    out = lns(run.graph, run.cluster, choose(run.plans.pool)[1], time_limit=max(0.01, deadline.seconds),
              seed=opts.seed, workers=opts.workers or 1, log=opts.verbose >= 2, deadline=deadline)
    run.plans.pool.append(("lns", out))
    info = out.info_of(LnsInfo)
    run.trace.record("lns", t, out.makespan, f"{info.kept} of {info.windows} windows kept")


def local_search(run: Run, deadline: Deadline) -> None:
    """:func:`~solver.search.refine` from the best candidate, for its grant."""
    t = time.perf_counter()
    if run.budget.wants.get("local search", 0.0) <= 0 or not run.plans.pool:
        run.trace.record("local search", t, None, "skipped")
        return
    ref = refine(run.graph, run.cluster, choose(run.plans.pool)[1], time_limit=deadline.seconds,
                 seed=run.options.seed, deadline=deadline)
    run.plans.pool.append(("refine", ref))
    run.trace.record("local search", t, ref.makespan, f"{ref.info_of(RefineInfo).accepted} moves kept")
