"""The pipeline behind ``pesto.solve``: named stages over one shared state.

Each stage is a function ``stage(run)`` that reads and updates a :class:`Run`
and records a :class:`~pesto.solvelog.Stage` (seconds, step time, note):

=============  =================================================================
baselines      the heuristics (:data:`HEURISTICS`) on the graph the run works on
reschedule     the best ``max_starts`` plans re-ordered (:func:`search.reschedule
               <solver.search.reschedule>`); the best is the *incumbent*
coarsen        above ``target_vertices`` ops: coarsen, keeping the incumbent
               exactly representable when there is one (``partition=``)
exact          CP-SAT (or the MIP) on the (coarse) graph, hinted with the
               incumbent's projection, else the best valid baseline
expand         plans of the coarse graph mapped to every op (re-ordered when the
               pipeline reschedules); an invalid baseline plan is dropped, and said
lns            CP-SAT windows of about a hundred ops on the full graph
               (:func:`solver.lns.lns <solver.lns.lns>`) from the best plan
local search   :func:`search.refine <solver.search.refine>` from the best plan
status         the winner among the candidates, the lower bound and the status
=============  =================================================================

:data:`PIPELINES` holds the two stage lists: ``"paper"`` (coarsen, heuristics
on the coarse graph as hints, exact solve, expand: the Pesto paper) and
``"full"`` (the default for CP-SAT). ``pesto.solve`` is :func:`solve` after
loading the graph and choosing the cluster.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
>>> plan = solve(g, gpus(2), time_limit=5, workers=1)
>>> plan.log.pipeline, [s.name for s in plan.log.stages]
('paper', ['coarsen', 'baselines', 'exact', 'expand', 'status'])
>>> plan.log.winner, plan.status
('cpsat', 'optimal')
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

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
from pesto.solvelog import SolveLog, Stage

from .registry import PLACERS, accepted_options, get_placer, run_placers
from .bound_model import CHAIN_SOURCE, SIMPLE_SOURCE, comm_bound
from .bounds import lower_bound, phases
from .lns import lns
from .search import better, refine, reschedule
from .subcluster import gpu_groups

__all__ = ["HEURISTICS", "SHARES", "stage_shares", "PIPELINES", "STAGES", "Settings", "Run", "run_pipeline", "solve", "improve",
           "solve_fine", "choose", "final_status"]

#: The baselines every pipeline runs, in the order that breaks ties between equal plans.
HEURISTICS = ("expert", "metis", "m-etf", "m-sct", "heft", "celeritas", "m-topo", "single")
TOLERANCE = 1e-6  # relative; a plan within it of the lower bound is optimal
#: The full pipeline's split of ``time_limit``: exact solver, LNS, local search
#: (the rest goes to the baselines and rescheduling); see benchmarks/results/lns.md.
SHARES = (0.2, 0.4, 0.3)
PAPER_EXACT_SHARE = 0.9  # the paper pipeline's exact solve; the rest: heuristics and the bound


def stage_shares(stages: Sequence[str]) -> dict[str, float]:
    """Settings fields -> share of a budget for the search stages in
    ``stages`` (:data:`SHARES`, renormalised over those present), so a stage
    list without a stage gives its time to the others (the ablation).

    >>> stage_shares(["reschedule", "local search", "status"])
    {'exact_time': 0.0, 'lns_time': 0.0, 'search_time': 1.0}
    """
    fields = {"exact": "exact_time", "lns": "lns_time", "local search": "search_time"}
    weights = dict(zip(fields, SHARES))
    total = sum(w for k, w in weights.items() if k in stages)
    return {f: (weights[k] / total if k in stages and total else 0.0) for k, f in fields.items()}


@dataclass(frozen=True)
class Settings:
    """The options of one pipeline run.

    exact_time : seconds for the exact solver (0 skips coarsen, exact, expand)
    lns_time : seconds for the large-neighbourhood search (0 skips it)
    search_time : seconds for the local search (0 skips it)
    heuristic_time : the ``time_limit`` the baselines get (m-SCT's LP gets 15 %)
    hint : "best-heuristic", None, a placer name (the only baseline), or a Plan
        (of the graph: a start; of the solved graph: the exact solver's hint)
    coarsen_options : for :func:`coarsen.coarsen` (e.g. ``{"method": "height"}``)
    partitions : the best start placements the coarsening keeps representable
    max_starts : plans the reschedule stage re-orders
    bound_time : seconds for the communication-aware lower bound
        (:func:`solver.bound_model.comm_bound`) in the status stage; None:
        ``min(10, 0.1 * (exact_time + search_time))``; 0: the simple bound only
    time_limit : seconds for the whole run, every stage included (a
        :class:`~pesto.deadline.Deadline`); None: the stages' own budgets only
    deterministic : budgets counted in charged work (CP-SAT's deterministic
        time, a fixed cost per simulated move) instead of wall seconds, so the
        same input, seed and limit give the same plan on any load
    started : ``time.perf_counter()`` when the user's call began (the
        deadline counts from it, so pre-checks are inside ``time_limit``);
        None: when the pipeline starts
    progress : called with a line per stage (the CLI prints them)
    """

    exact_time: float
    search_time: float = 0.0
    lns_time: float = 0.0
    heuristic_time: float = 60.0
    target_vertices: int = 200
    backend: str = "cpsat"
    hint: Any = "best-heuristic"
    heuristics: tuple = HEURISTICS
    workers: int | None = None
    seed: int = 0
    coarsen_options: Mapping = field(default_factory=dict)
    partitions: int = 1
    max_starts: int = 4
    verbose: bool = False
    bound_time: float | None = None
    time_limit: float | None = None
    deterministic: bool = False
    started: float | None = None
    progress: Callable[[str], None] | None = None

    def baseline_names(self, as_starts: bool) -> list[str]:
        """The baselines to run: every heuristic, or the one named by ``hint``;
        none for ``hint=None`` or a Plan, unless they are the starts of a
        pipeline that reschedules."""
        if isinstance(self.hint, str) and self.hint != "best-heuristic":
            return [self.hint]
        if self.hint is None or (isinstance(self.hint, Plan) and not as_starts):
            return []
        return list(self.heuristics)


class Run:
    """The state the stages share: the graph and the plans found so far.

    ``work`` is the graph the exact solver sees (``graph`` until coarsened),
    ``baselines`` the heuristics' plans of ``work`` not yet candidates,
    ``starts`` extra plans of ``graph`` (a given plan), ``pool`` the
    candidates (name, plan of ``graph``) in tie-break order.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, settings: Settings, pipeline: str,
                 stages: Sequence[str], starts: Sequence[Plan] = (), deadline: Deadline | None = None):
        self.graph, self.cluster, self.s, self.pipeline = graph, cluster, settings, pipeline
        self.stage_names = tuple(stages)
        self.t0 = time.perf_counter()
        self.work, self.cg = graph, None
        self.baselines: dict[str, Plan] = {}
        self.starts: list[Plan] = list(starts)
        self.ranked: list[Plan] = []
        self.pool: list[tuple[str, Plan]] = []
        self.incumbent: Plan | None = None
        self.hint: Plan | None = None
        self.hint_note = ""
        self.solved: Plan | None = None
        self.stages: list[Stage] = []
        self.skipped: dict[str, str] = {}
        self.result: Plan | None = None
        self.deadline = deadline or Deadline(settings.time_limit, deterministic=settings.deterministic,
                                             start=settings.started)
        self.stopped = ""  # why stages were skipped or cut: "time limit", "SIGINT"...
        self.unit: float | None = None  # seconds of one m-TOPO run on the graph (the cost unit)
        self.no_exact = False  # coarsening was skipped for time: so is the exact stage

    def say(self, msg: str) -> None:
        line = f"[pesto {time.perf_counter() - self.t0:7.2f}s] {msg}"
        if self.s.verbose:
            print(line, flush=True)
        if self.s.progress is not None:
            self.s.progress(line)

    def record(self, name: str, t: float, makespan: float | None = None, note: str = "") -> None:
        self.stages.append(Stage(name, time.perf_counter() - t, makespan, note))
        if note:
            self.say(f"{name}: {note}")

    def reorders(self) -> bool:
        """Plans are re-ordered on the full graph (the pipeline has a reschedule stage)."""
        return "reschedule" in self.stage_names


def _rank_key(p: Plan):
    return (p.status == "infeasible", p.makespan if p.makespan is not None else float("inf"))


def choose(pool: Sequence[tuple[str, Plan]]) -> tuple[str, Plan]:
    """The winner among candidates: memory-feasible first, then the shortest
    step; on a tie (within 1e-9 µs) the earlier candidate (:func:`search.better
    <solver.search.better>`)."""
    name, best = pool[0]
    for k, p in pool[1:]:
        if better(p, best):
            name, best = k, p
    return name, best


def final_status(plan: Plan, bound: float, *, proved_optimal: bool, exact_ran: bool,
                 interrupted: bool = False) -> str:
    """The one status rule: ``infeasible`` if the plan breaks memory;
    ``optimal`` if an exact solver proved it on the graph itself or its step
    is within :data:`TOLERANCE` of ``bound``; else ``feasible`` when an exact
    stage ran, ``heuristic`` when none did; ``interrupted`` instead of these
    two when the user stopped the solve.

    >>> final_status(Plan({}, {}, makespan=10.0), 10.0, proved_optimal=False, exact_ran=False)
    'optimal'
    >>> final_status(Plan({}, {}, makespan=11.0), 10.0, proved_optimal=False, exact_ran=True)
    'feasible'
    """
    if plan.status == "infeasible":
        return "infeasible"
    if proved_optimal or plan.makespan <= bound + TOLERANCE * max(1.0, bound):
        return "optimal"
    if interrupted:
        return "interrupted"
    return "feasible" if exact_ran else "heuristic"


# -- stages ---------------------------------------------------------------------------
#: Run time of each heuristic relative to m-TOPO's on the same graph (layered
#: DAGs of 100k ops, one core); m-SCT's LP time limit comes on top.
HEURISTIC_SPEED = {"single": 0.3, "metis": 0.6, "m-topo": 1.0, "m-etf": 1.8, "heft": 2.4, "expert": 2.5,
                   "celeritas": 3.0, "m-sct": 3.0}
#: Re-ordering one plan (the reschedule stage: up to four candidate orders),
#: and one candidate order, in m-TOPO runs.
RESCHEDULE_RUNS, CANDIDATE_RUNS = 1.0, 0.8
#: The least each search stage needs, in m-TOPO runs, with the status stage
#: after it (its lower bound and final check: :data:`STATUS_RUNS`): coarsen
#: also pays for expanding and re-ordering the exact plan (+ 1 s of CP-SAT),
#: LNS and local search for a final simulation. A stage predicted past the
#: deadline is skipped, and said in its note.
STAGE_RUNS = {"coarsen": 4.0, "lns": 1.5, "local search": 1.5}
#: The share of the time left that the "one group" stage gives its inner solve,
#: and the least it needs to be worth running.
GROUP_SHARE = 0.3
GROUP_MIN_SECONDS = 2.0
#: The final check of the winning plan, in m-TOPO runs.
CHECK_RUNS = 1.0
#: The critical-path phase bound and its heads and tails (:func:`solver.bounds.phases`), in m-TOPO runs.
CHAIN_RUNS = 2.0
#: The status stage: the simple bound and choosing the winner (half a run), the
#: phase bound and the final check, in m-TOPO runs.
STATUS_RUNS = 0.5 + CHAIN_RUNS + CHECK_RUNS
#: The communication-aware bound's model building, in m-TOPO runs (its time
#: limit bounds the search only): it runs when that fits before the final check.
COMM_BOUND_RUNS = 4.0
#: The heuristic run first, without the deadline: the plan every stop returns;
#: then the one that is the best on most graphs (benchmarks/results/baselines.md).
FIRST_HEURISTICS = ("m-topo", "m-etf")


def baselines(run: Run) -> None:
    """The heuristics on ``run.work``; a given Plan of it joins the starts.

    The first of :data:`FIRST_HEURISTICS` runs first and, whatever the clock
    says, to its end (the plan any stop returns); only an interrupt stops it,
    and with no plan made yet the solve raises :class:`KeyboardInterrupt`
    (the CLI exits 130 writing nothing). Each other one only when its predicted time
    (:data:`HEURISTIC_SPEED` times the first one's) fits in what is left
    after re-ordering one plan and the status stage (:data:`RESCHEDULE_RUNS`,
    :data:`STATUS_RUNS`), and it is stopped (``Stopped``, named in
    ``log.skipped``) if it still runs then or the user interrupts. In
    deterministic mode none is skipped for time (a wall-clock rule would
    change the plan from run to run); an interrupt still stops them.
    """
    t = time.perf_counter()
    s, dl = run.s, run.deadline
    if isinstance(s.hint, Plan):
        if set(s.hint.placement) == set(run.work.names):
            run.starts.insert(0, s.hint)
        else:
            run.hint_note = "given plan does not cover the graph; ignored"
    # m-SCT's LP grows quadratically; cap it so the heuristics stay a small share
    limit = max(0.1, dl.budget(s.heuristic_time))
    lp_limit = max(1.0, 0.15 * limit)
    names = s.baseline_names(run.reorders())
    names = [k for k in FIRST_HEURISTICS if k in names] + [k for k in names if k not in FIRST_HEURISTICS]
    _warm_up(run)
    plans, errors, unit = {}, {}, None
    for name in names:
        if dl.interrupted and not plans:
            break  # interrupted before any plan: nothing more starts (KeyboardInterrupt below)
        sub = dl.interrupts_only()
        if plans:  # the first plan is made whatever the clock says (an interrupt stops it)
            why, sub = _heuristic_room(dl, name, unit, lp_limit)
            if why:
                errors[name] = f"skipped: {why}"
                continue
        t1 = time.perf_counter()
        got, err = run_placers(run.work, run.cluster, [name], say=run.say, time_limit=limit, seed=s.seed,
                               deadline=sub, extra={"m-sct": {"lp_time_limit": lp_limit}})
        if got and unit is None:
            unit = (time.perf_counter() - t1) / HEURISTIC_SPEED.get(name, 1.0)
        plans.update(got)
        errors.update(err)
    if not plans and dl.interrupted:  # nothing to return: stop as Python does on Ctrl-C
        raise KeyboardInterrupt(f"{dl.reason} before any plan existed")
    run.deadline.charge(HEURISTIC_COST * REPLAY_COST_PER_OP * run.work.num_ops * (len(plans) + len(errors)))
    order = {k: i for i, k in enumerate(s.baseline_names(run.reorders()))}
    run.baselines = dict(sorted(plans.items(), key=lambda kv: order[kv[0]]))  # ties: HEURISTICS order
    if run.work is run.graph:
        run.unit = unit
    run.skipped.update(errors)
    best = min((p.makespan for p in plans.values()), default=None)
    run.record("baselines", t, best, f"{len(plans)} plans of {run.work.num_ops} ops")


def one_group(run: Run) -> None:
    """On a cluster of several GPU groups (hosts: :func:`solver.subcluster.gpu_groups`),
    this pipeline on the first group alone (with the non-GPU devices) for
    :data:`GROUP_SHARE` of the time left; its plan joins the starts. On a slow
    network the best plan often stays on one host, and a search among all
    GPUs rarely walks back there (NMT-2x1024, 2 hosts x 2 GPUs, 25 GbE: 74.6 ms
    from the whole cluster in 20 s, 64.7 ms on one host in 5 s). The inner
    solve runs on a share of this solve's deadline: same clock, same
    interrupts."""
    t = time.perf_counter()
    groups = gpu_groups(run.cluster)
    if not groups or run.s.hint != "best-heuristic" or run.work is not run.graph:
        return
    budget = GROUP_SHARE * run.deadline.left()
    if budget < GROUP_MIN_SECONDS:
        run.record("one group", t, None, f"skipped: {budget:.1f} s for it")
        return
    others = [d.name for d in run.cluster.devices if d.kind != "GPU"]
    sub = run.cluster.subset(groups[0] + others)
    settings = dataclasses.replace(run.s, **_budgets(budget, full=True), progress=None, started=None)
    inner = run_pipeline(run.graph, sub, PIPELINES["full"], settings, name="full",
                         deadline=run.deadline.sub(budget))
    plan = finalize(run.graph, run.cluster, inner.placement, order=inner.order, t0=t,
                    placer=f"{inner.placer}@{groups[0][0]}")
    run.starts.append(plan)
    run.record("one group", t, plan.makespan, f"{len(sub)} of {len(run.cluster)} devices ({groups[0][0]}...)")


def _warm_up(run: Run) -> None:
    """Build what every simulation of ``run.work`` shares (the problem
    arrays, the engine's tables, its compiled loop) before timing the first
    heuristic, whose time is the cost unit of the later stages."""
    try:
        prob = Problem.of(run.work, run.cluster)
    except InfeasibleError:
        return  # each heuristic names it in log.skipped
    replay(prob, [a[0] for a in prob.allowed])


def _heuristic_room(dl: Deadline, name: str, unit: float | None, lp_limit: float):
    """Why heuristic ``name`` is skipped ("" to run it), and the deadline it
    runs under: the solve's, less what the later stages need (``unit``:
    seconds of one m-TOPO run)."""
    if dl.interrupted:
        return dl.reason, None
    if dl.deterministic or unit is None:
        return "", dl
    need = HEURISTIC_SPEED.get(name, max(HEURISTIC_SPEED.values())) * unit
    need += lp_limit if name == "m-sct" else 0.0
    room = dl.left() - (RESCHEDULE_RUNS + STATUS_RUNS) * unit
    if need > room:
        return f"out of time (needs ~{need:.1f} s, {max(0.0, room):.1f} s left)", None
    return "", dl.sub(room)


def reschedule_starts(run: Run) -> None:
    """The best ``max_starts`` starts and baselines re-ordered; the best is the incumbent."""
    t = time.perf_counter()
    starts = run.starts + list(run.baselines.values())
    if not starts:
        raise ValueError("the reschedule stage needs at least one start plan")
    # each start costs about 4 simulations; with little time left, only the best is re-ordered,
    # past the deadline none that has times (a heuristic's plan is simulated already)
    dl = run.deadline
    few = dl.left() < 0.2 * (run.s.time_limit or float("inf"))
    k = 1 if few else max(1, run.s.max_starts)
    if run.unit and not dl.deterministic and dl.left() < float("inf"):  # as many as fit before the status stage
        k = max(1, min(k, int((dl.left() - STATUS_RUNS * run.unit) / (RESCHEDULE_RUNS * run.unit))))
    chosen = sorted(starts, key=_rank_key)[:k]
    ranked, cut = [], 0
    sub = dl  # the status stage keeps its time; no candidate order starts that would eat it
    if run.unit is not None and not dl.deterministic:
        sub = dl.sub(max(0.0, dl.left() - (STATUS_RUNS + CANDIDATE_RUNS) * run.unit))
    for p in chosen:
        if sub.expired() and p.has_times and p.makespan is not None:
            ranked.append(p)
            cut += 1
        else:
            ranked.append(reschedule(run.graph, run.cluster, p, deadline=sub))
            cut += ranked[-1].info_of(RescheduleInfo).cut is not None
    run.ranked = sorted(ranked, key=_rank_key)
    run.pool = [(p.placer, p) for p in run.ranked]
    run.baselines, run.starts = {}, []
    run.incumbent = run.ranked[0]
    note = f"; {cut} of {len(chosen)} not or partly re-ordered: {dl.reason or 'time limit'}" if cut else ""
    run.record("reschedule", t, run.incumbent.makespan, f"incumbent {run.incumbent.placer}{note}")


def _coarsen(run: Run, partition=None):
    """The one call of :func:`coarsen.coarsen` (``partition``: placements to keep)."""
    extra = {} if partition is None else {"partition": partition}
    return coarsen.coarsen(run.graph, run.s.target_vertices, cluster=run.cluster, **extra,
                           **dict(run.s.coarsen_options))


def coarsen_graph(run: Run) -> None:
    """Above ``target_vertices`` ops, ``run.work`` becomes a coarse graph; with
    an incumbent, one that keeps it (and the next best starts) representable,
    and the exact solver's hint is its projection."""
    t = time.perf_counter()
    s, graph = run.s, run.graph
    if s.exact_time <= 0 or graph.num_ops <= s.target_vertices:
        run.hint = run.incumbent
        run.record("coarsen", t, None, "skipped" if s.exact_time <= 0 else "not needed")
        return
    note = ""
    if run.incumbent is not None:
        parts = [dict(p.placement) for p in run.ranked[:max(1, s.partitions)]]
        try:
            cg = _coarsen(run, partition=parts)
        except ValueError:  # a method without partition support (celeritas)
            cg = None
        if cg is None or cg.graph.num_ops > 2 * s.target_vertices:
            # a fragmented placement (e.g. list schedulers alternating devices) blocks
            # merging: coarsen freely, the hint is then the majority projection
            note = f"; partition-aware gave {cg.graph.num_ops if cg is not None else 'none'}"
            cg = _coarsen(run)
        run.hint = cg.project(run.incumbent, run.cluster)
    else:
        cg = _coarsen(run)
    run.cg, run.work = cg, cg.graph
    run.record("coarsen", t, None, f"{graph.num_ops} ops to {cg.graph.num_ops} vertices{note}")


def _best_baseline(run: Run) -> Plan | None:
    """The shortest valid baseline plan of ``run.work`` (memory-feasible first)."""
    valid = [p for p in run.baselines.values() if check_plan(run.work, run.cluster, p, check_memory=False).ok]
    ok = [p for p in valid if p.status != "infeasible"] or valid
    return min(ok, key=lambda p: p.makespan) if ok else None


def exact(run: Run) -> None:
    """The exact solver on ``run.work`` for ``exact_time`` seconds."""
    t = time.perf_counter()
    s = run.s
    if s.exact_time <= 0:
        run.record("exact", t, None, "skipped")
        return
    if run.no_exact:
        run.record("exact", t, None, "skipped: time limit (no time to coarsen and expand)")
        return
    hint = run.hint
    if hint is None and isinstance(s.hint, Plan):
        if set(s.hint.placement) == set(run.work.names):
            hint = s.hint
        else:
            run.hint_note = "given plan does not cover the solved graph; ignored"
    if hint is None:
        hint = _best_baseline(run)
    if hint is not None:
        run.hint_note = hint.placer or "plan"
    fn = get_placer(s.backend)
    opts = {"time_limit": max(0.01, run.deadline.budget(s.exact_time)), "seed": s.seed, "workers": s.workers,
            "hint": hint, "log": s.verbose, "deadline": run.deadline}
    run.solved = fn(run.work, run.cluster, **accepted_options(fn, opts))
    run.record("exact", t, run.solved.makespan, f"{s.backend} {run.solved.status} on {run.work.num_ops} vertices")


def _to_graph(run: Run, name: str, plan: Plan, status: str) -> Plan:
    """A plan of ``run.work`` as a plan of every op: re-ordered when the
    pipeline reschedules, else simulated in its fixed order."""
    fine = run.cg.expand(plan) if run.cg is not None else plan
    if run.reorders():
        return reschedule(run.graph, run.cluster, fine, placer=name)
    if run.cg is None:
        return plan
    return finalize(run.graph, run.cluster, dict(fine.placement), order={d: list(o) for d, o in fine.order.items()},
                    placer=name, t0=run.t0, status=status, stats=dict(plan.stats), info=plan.info)


def expand(run: Run) -> None:
    """The exact plan, then the baselines not yet candidates, as plans of every
    op; a baseline plan that is invalid on the full graph is dropped, and said."""
    t = time.perf_counter()
    s, solved = run.s, run.solved
    if solved is None and not run.baselines:
        run.record("expand", t, None, "skipped")
        return
    new = []
    if solved is not None:
        coarse_ok = run.cg is None or solved.status in ("infeasible", "heuristic")
        new.append((s.backend, _to_graph(run, s.backend, solved, solved.status if coarse_ok else "feasible")))
    # the baselines too: with the exact stage skipped (past the deadline) they are the only candidates
    new += [(k, _to_graph(run, k, p, p.status)) for k, p in run.baselines.items()]
    run.baselines = {}
    for k, p in new:
        rep = check_plan(run.graph, run.cluster, p, check_memory=p.status != "infeasible")
        if rep.ok or k == s.backend:  # the solver's plan is kept: the status stage raises on it
            run.pool.append((k, p))
        else:
            run.skipped[k] = "invalid plan: " + "; ".join(map(str, rep.violations[:3]))
    run.record("expand", t, new[0][1].makespan, f"{new[0][0]} on every op")


def lns_stage(run: Run) -> None:
    """:func:`~solver.lns.lns` from the best candidate for ``lns_time`` seconds."""
    t = time.perf_counter()
    if run.s.lns_time <= 0 or not run.pool:
        run.record("lns", t, None, "skipped")
        return
    best = choose(run.pool)[1]
    budget = run.s.lns_time
    if run.unit is not None and not run.deadline.deterministic:  # leave the later stages their least
        budget = min(budget, max(0.01, run.deadline.left() - (STAGE_RUNS["local search"] + STATUS_RUNS) * run.unit))
    out = lns(run.graph, run.cluster, best, time_limit=budget, seed=run.s.seed,
              workers=run.s.workers or 1, log=run.s.verbose, deadline=run.deadline)
    run.pool.append(("lns", out))
    st = out.info_of(LnsInfo)
    run.record("lns", t, out.makespan, f"{st.kept} of {st.windows} windows kept")


def local_search(run: Run) -> None:
    """:func:`~solver.search.refine` from the best candidate for ``search_time`` seconds."""
    t = time.perf_counter()
    if run.s.search_time <= 0 or not run.pool:
        run.record("local search", t, None, "skipped")
        return
    # the last search stage leaves the status stage its time for the lower bound
    reserve = _bound_time(run.s) + (STATUS_RUNS * run.unit if run.unit is not None and not run.deadline.deterministic
                                    else 0.0)
    budget = min(run.s.search_time, max(0.0, run.deadline.left() - reserve))
    ref = refine(run.graph, run.cluster, choose(run.pool)[1], time_limit=budget, seed=run.s.seed,
                 deadline=run.deadline)
    run.pool.append(("refine", ref))
    run.record("local search", t, ref.makespan, f"{ref.info_of(RefineInfo).accepted} moves kept")


def _bound_time(s: Settings) -> float:
    """Seconds for the communication-aware bound (``Settings.bound_time``)."""
    return min(10.0, 0.1 * (s.exact_time + s.search_time)) if s.bound_time is None else s.bound_time


def status(run: Run) -> None:
    """The winner, its lower bound and status; checked (unless, on a graph
    where the check takes over half a second, :data:`CHECK_RUNS`, the user
    interrupted or the check would overrun the limit by over a second: then
    only a plan the user gave is checked, the others being the simulator's
    own; the note says so, and says when the solve
    ended past its limit by more than 10 % or 2 s). The bound is the
    exact solver's when it solved the graph itself and proved more, else
    :func:`~solver.bound_model.comm_bound` (communication-aware, for
    ``bound_time`` seconds; critical path / work when that is 0)."""
    t = time.perf_counter()
    graph, s, solved = run.graph, run.s, run.solved
    if isinstance(s.hint, Plan) and s.hint.has_times and set(s.hint.placement) == set(graph.names) \
            and not any(p is s.hint for _, p in run.pool):
        run.pool.append((s.hint.placer or "hint", s.hint))  # never slower than the user's own plan
    if not run.pool:
        raise ValueError(f"no candidate plan: the stages {list(run.stage_names)} made none")
    winner, best = choose(run.pool)
    dl = run.deadline
    bound, source = lower_bound(graph, run.cluster), SIMPLE_SOURCE
    on_graph = solved is not None and run.cg is None
    if on_graph and solved.lower_bound is not None and solved.status != "infeasible" \
            and solved.lower_bound > bound:
        bound, source = solved.lower_bound, s.backend
    bound, source, phased = _cheap_bound(run, best, bound, source)
    bound_time = 0.0 if dl.interrupted else dl.budget(_bound_time(s))
    if run.unit is not None and not dl.deterministic:  # building its model, then the final check
        room = dl.left() - (STATUS_RUNS + COMM_BOUND_RUNS) * run.unit
        bound_time = min(bound_time, room) if room > 0.05 else 0.0
    if bound_time > 0.05 and best.makespan is not None and best.makespan > bound + TOLERANCE * max(1.0, bound):
        cb = comm_bound(graph, run.cluster, time_limit=bound_time, incumbent=best, workers=1, seed=s.seed,
                        deterministic=dl.deterministic, phased=phased)
        if cb.value > bound:  # (never above the makespan: the incumbent caps the model)
            bound, source = min(cb.value, best.makespan), cb.source
    st = final_status(best, bound, exact_ran=solved is not None, interrupted=dl.interrupted,
                      proved_optimal=on_graph and winner == s.backend and best.status == "optimal")
    note = st
    check = CHECK_RUNS * run.unit if run.unit is not None else 0.0  # its predicted seconds
    pressed = dl.interrupted or (not dl.deterministic and dl.left() + 1.0 < check)
    if check > 0.5 and pressed and best is not s.hint:  # a plan the simulator made: out fast
        note += f"; final check skipped: {dl.reason or 'time limit'}"
    else:
        check_plan(graph, run.cluster, best, check_memory=best.status != "infeasible").raise_if_invalid()
    over = dl.elapsed() - dl.seconds
    if not dl.deterministic and over > max(2.0, 0.1 * dl.seconds):  # the limit was not kept: say why
        note += (f"; over the time limit by {over:.1f} s: {graph.num_ops} ops need more for one plan"
                 f" (the first heuristic took {run.unit or 0.0:.1f} s)")
    coarse = {}
    if run.cg is not None and solved is not None:
        coarse = {"status": solved.status, "makespan": solved.makespan, "lower_bound": solved.lower_bound}
    run.record("status", t, best.makespan, note)
    log = SolveLog(pipeline=run.pipeline, stages=run.stages, candidates={k: p.makespan for k, p in run.pool},
                   winner=winner, bound=bound, bound_source=source, vertices=run.work.num_ops,
                   coarse=coarse, hint=run.hint_note, skipped=run.skipped, stopped=dl.reason or run.stopped,
                   deterministic=dl.deterministic)
    run.result = best.replace(placer="pesto", lower_bound=bound, status=st, log=log,
                              wall_time=time.perf_counter() - run.t0)
    run.say(run.result.summary())


def _cheap_bound(run: Run, best: Plan, bound: float, source: str):
    """The critical-path phase bound when it fits before the final check (or
    in deterministic mode), kept when above ``bound``; returns ``(bound,
    source, phases)`` (phases None when skipped) so :func:`comm_bound` need
    not repeat them."""
    dl = run.deadline
    if dl.interrupted or best.makespan is None or best.makespan <= bound + TOLERANCE * max(1.0, bound):
        return bound, source, None
    if run.unit is not None and not dl.deterministic and dl.left() < (CHAIN_RUNS + CHECK_RUNS) * run.unit:
        return bound, source, None
    phased = phases(run.graph, run.cluster)
    if phased.value > bound:
        bound, source = min(phased.value, best.makespan), CHAIN_SOURCE
    return bound, source, phased


STAGES: dict[str, Callable[[Run], None]] = {
    "baselines": baselines, "one group": one_group, "reschedule": reschedule_starts,
    "coarsen": coarsen_graph, "exact": exact,
    "expand": expand, "lns": lns_stage, "local search": local_search, "status": status}
#: Stages skipped once the deadline has passed (the others are quick and needed for a plan).
SEARCH_STAGES = ("one group", "coarsen", "exact", "lns", "local search")
#: Work charged per heuristic run in deterministic mode, in replays of the graph.
HEURISTIC_COST = 20
PIPELINES = {"paper": ("coarsen", "baselines", "exact", "expand", "status"),
             "full": ("baselines", "one group", "reschedule", "coarsen", "exact", "expand", "lns", "local search",
                      "status")}


def run_pipeline(graph: OpGraph, cluster: Cluster, stages: Sequence[str], settings: Settings, *,
                 name: str = "", starts: Sequence[Plan] = (), deadline: Deadline | None = None) -> Plan:
    """Run the named ``stages`` in order; the last must be ``"status"``.
    ``deadline``: a stage's share of an outer solve (its clock and interrupts);
    default: a new one from ``settings``.

    Returns the winning plan of ``graph`` with ``plan.log`` (a
    :class:`~pesto.solvelog.SolveLog`, ``pipeline=name``).
    """
    if not stages or stages[-1] != "status":
        raise ValueError(f"a pipeline ends with the 'status' stage, got {list(stages)}")
    unknown = [st for st in stages if st not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; known: {list(STAGES)}")
    run = Run(graph, cluster, settings, name, stages, starts, deadline)
    with run.deadline.catching_signals(), _old_objects_frozen():
        for st in stages:
            if st in SEARCH_STAGES and run.deadline.expired():
                run.stopped = run.deadline.reason or "time limit"
                run.record(st, time.perf_counter(), None, f"skipped: {run.stopped}")
                continue
            short = _short_of_time(run, st)
            if short:
                run.stopped = run.stopped or "time limit"
                run.record(st, time.perf_counter(), None, f"skipped: {short}")
                continue
            gc.freeze()  # what earlier stages made (plans of every op) lives on too
            STAGES[st](run)
    return run.result


@contextlib.contextmanager
def _old_objects_frozen():
    """Keep the cyclic garbage collector off what exists before the solve (the
    graph, its arrays) and, stage by stage, off what the earlier stages made:
    on 200k ops every full collection walked millions of objects that live on
    anyway (the final check took 13 s instead of 3). Everything is handed
    back to the collector when the solve ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _short_of_time(run: Run, stage: str) -> str:
    """Why a search stage is skipped though the deadline has not passed (its
    least cost, :data:`STAGE_RUNS`, and the status stage's would overrun it),
    or "". Only with a measured cost unit and the wall clock (deterministic
    mode skips by charged work alone)."""
    if stage not in STAGE_RUNS or run.unit is None or run.deadline.deterministic:
        return ""
    if stage == "coarsen" and (run.s.exact_time <= 0 or run.graph.num_ops <= run.s.target_vertices):
        return ""  # nothing to coarsen: the stage costs nothing
    need = (STAGE_RUNS[stage] + STATUS_RUNS) * run.unit + (1.0 if stage == "coarsen" else 0.0)
    left = run.deadline.left()
    if need <= left:
        return ""
    if stage == "coarsen":
        run.no_exact = True
    return f"time limit (needs ~{need:.1f} s, {left:.1f} s left)"


def _check_combination(graph: OpGraph, pipeline: str | None, backend: str, hint, target_vertices: int,
                       time_limit: float) -> str:
    """The stage list to run, or ValueError naming an unsupported combination."""
    if pipeline not in (None, "full", "paper"):
        raise ValueError(f"pipeline must be 'full' or 'paper', got {pipeline!r}")
    for what, name in (("backend", backend), ("hint", hint)):
        if what == "backend" or (isinstance(name, str) and name != "best-heuristic"):
            if name not in PLACERS:  # a misspelt hint must not silently mean "no hint"
                raise ValueError(f"unknown placer {name!r} ({what}); known: {sorted(PLACERS)}")
    if not (hint is None or isinstance(hint, (str, Plan))):
        raise ValueError(f"hint must be 'best-heuristic', None, a placer name or a Plan, got {hint!r}")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):  # also rejects nan
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if not isinstance(target_vertices, int) or target_vertices < 1:
        raise ValueError(f"target_vertices must be a positive int, got {target_vertices!r}")
    if pipeline == "full" and backend != "cpsat":
        raise ValueError(f"pipeline='full' runs CP-SAT only; backend={backend!r} needs pipeline='paper'")
    pipeline = pipeline or ("full" if backend == "cpsat" else "paper")
    if graph.num_ops <= target_vertices:
        return "paper"  # solved exactly, no coarsening: the paper stage list
    if pipeline == "full" and hint is None:
        raise ValueError("hint=None: pipeline='full' starts from the heuristics' plans; "
                         "use pipeline='paper' to solve without a hint")
    return pipeline


def solve(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, target_vertices: int = 200,
          backend: str = "cpsat", hint: Any = "best-heuristic", workers: int | None = None, seed: int = 0,
          coarsen_method: str = "height", pipeline: str | None = None, verbose: bool = False,
          deterministic: bool = False, progress: Callable[[str], None] | None = None,
          started: float | None = None) -> Plan:
    """Choose the stage list and run it (``pesto.solve`` without loading or
    pre-checks; see :func:`pesto.api.solve` for the options).

    ``pipeline=None`` means ``"full"`` for CP-SAT and ``"paper"`` for another
    backend; graphs of at most ``target_vertices`` ops run the paper list
    (solved exactly, nothing to coarsen). ``time_limit`` bounds the whole run
    (one :class:`~pesto.deadline.Deadline`); ``"full"`` gives its search
    stages :data:`SHARES` of it (20 % exact solver, 40 % LNS, 30 % local
    search), ``"paper"`` 90 % to the exact solver; the heuristics, the
    re-ordering and the lower bound use the rest, and a stage never runs
    past the deadline.

    Raises
    ------
    ValueError
        An unknown pipeline, backend or hint, ``target_vertices < 1``, a
        ``time_limit`` that is not a positive number, or an
        unsupported combination
        (``pipeline="full"`` with another backend than CP-SAT; ``hint=None``
        with the full pipeline).
    """
    name = _check_combination(graph, pipeline, backend, hint, target_vertices, time_limit)
    settings = Settings(**_budgets(time_limit, full=name == "full"), target_vertices=target_vertices,
                        backend=backend, hint=hint, workers=workers, seed=seed,
                        coarsen_options={"method": coarsen_method}, verbose=verbose,
                        deterministic=deterministic, progress=progress, started=started)
    return run_pipeline(graph, cluster, PIPELINES[name], settings, name=name)


def _budgets(time_limit: float, *, full: bool) -> dict:
    """The stage budgets of a solve of ``time_limit`` seconds: :data:`SHARES`
    for the full pipeline, :data:`PAPER_EXACT_SHARE` to the exact solver for
    the paper's."""
    exact, lns_share, search = SHARES if full else (PAPER_EXACT_SHARE, 0.0, 0.0)
    return dict(exact_time=exact * time_limit, lns_time=lns_share * time_limit, search_time=search * time_limit,
                heuristic_time=time_limit, time_limit=time_limit)


def improve(graph: OpGraph, cluster: Cluster, starts: Sequence[Plan], *, target_vertices: int = 200,
            cpsat_time: float = 20, refine_time: float = 20, lns_time: float = 0.0, workers: int | None = None,
            seed: int = 0, coarsen_options: Mapping | None = None, partitions: int = 1,
            max_starts: int = 4) -> Plan:
    """The full pipeline after its baselines, from given ``starts`` (plans of
    ``graph``): reschedule the ``max_starts`` best, coarsen keeping the
    incumbent (and the next ``partitions - 1``) representable, CP-SAT for
    ``cpsat_time`` (0 skips it), expand, LNS for ``lns_time`` (0, the default,
    skips it), refine for ``refine_time`` (0 skips it).
    Never worse than the best rescheduled start.
    """
    settings = Settings(exact_time=cpsat_time, search_time=refine_time, lns_time=lns_time,
                        target_vertices=target_vertices, workers=workers, seed=seed, coarsen_options=dict(coarsen_options or {}),
                        partitions=partitions, max_starts=max_starts)
    stages = [st for st in PIPELINES["full"] if st not in ("baselines", "one group")]
    return run_pipeline(graph, cluster, stages, settings, name="full", starts=starts)


def solve_fine(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, target_vertices: int = 200,
               workers: int | None = None, seed: int = 0, extra_starts: Sequence[Plan] = (),
               heuristics: Sequence[str] = HEURISTICS, cpsat_share: float = SHARES[0],
               lns_share: float = SHARES[1], refine_share: float = SHARES[2],
               coarsen_options: Mapping | None = None) -> Plan:
    """The full pipeline: ``heuristics`` on the full graph (one that raises is
    skipped, named in ``plan.log.skipped``), ``extra_starts`` joining them,
    then :func:`improve` (``time_limit`` split between CP-SAT, LNS and refinement).

    >>> from pesto.cluster import gpus
    >>> from pesto.graph import OpGraph
    >>> ops = {f"n{i}": 1 + i % 7 for i in range(300)}  # a 20 x 15 grid DAG
    >>> g = OpGraph.from_edges(ops, [(f"n{i}", f"n{j}", 4096) for i in range(300) for j in (i + 15, i + 16) if j < 300])
    >>> p = solve_fine(g, gpus(2), time_limit=2, target_vertices=40, workers=1)
    >>> p.makespan <= min(p.log.candidates.values())
    True
    """
    settings = Settings(exact_time=cpsat_share * time_limit, search_time=refine_share * time_limit,
                        lns_time=lns_share * time_limit, heuristic_time=time_limit,
                        target_vertices=target_vertices, heuristics=tuple(heuristics), workers=workers,
                        seed=seed, coarsen_options=dict(coarsen_options or {}))
    return run_pipeline(graph, cluster, PIPELINES["full"], settings, name="full", starts=extra_starts)
