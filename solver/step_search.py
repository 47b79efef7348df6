"""``pesto.solve(micro_batches=M | "auto")``: the best plan over transformed steps.

A plan of a micro-batched or replicated step places a *different graph* than
the step given (:func:`pesto.step.split`,
:func:`pesto.step.replicate`), so :func:`solve_step` returns it with that
graph (:class:`StepResult`), and the plan's log says which graph it is
(``micro_batches``, ``graph_kind``, ``replicas``) and every step compared
(``steps``); :func:`step_graph` rebuilds the graph from those fields.

The candidates, all scored by the same simulator (``finalize``):

* screening, for each ``M`` tried, ``M > 1``: the GPipe and 1F1B plans of
  that ``M`` (:func:`solver.pipeline_baselines.pipeline_plan`) and the
  data-parallel plan with each replica in ``M`` slices (up to
  :data:`DP_MAX_OPS` ops); for every ``M`` (``M = 1`` too) and every divisor
  ``R`` of the GPUs with ``1 < R < GPUs``, the hybrid plan of ``R`` replicas
  each pipelined over ``GPUs / R`` GPUs (:func:`solver.hybrid.hybrid_plan`,
  ``hybrid R=2 M=4``; the same :data:`DP_MAX_OPS` cap);
* exact stages, for the counts :func:`_exact_counts` picks: the slice
  model's plan (:func:`solver.slice_model.solve_slices`, CP-SAT on a block x
  slice grid, :data:`SLICE_SHARE` of that ``M``'s time, hinted with the
  pipelines) and the pipeline (:func:`solver.pipeline.run_pipeline`) on the
  step split into ``M`` slices started from those three; ``M == 1`` (with
  ``"auto"``): the pipeline on the step as given;
* the data-parallel plan (one replica per GPU, ring all-reduce), not split.

The result is the best of them (a plan that fits memory before one that does
not, then the shortest step): never slower than any candidate. Its log's
bound is valid for the graph it places: the pipeline's, or
:func:`~solver.microbatch_bound.sample_bound` of that graph when higher or
when a baseline won (:func:`winner_bound`). An ``M`` whose split step fits no
device even at its memory floor (:func:`memory_short`) raises
:class:`~pesto.errors.MicroBatchMemoryError` when asked for alone; ``"auto"``
skips it, with the reason in ``plan.log.skipped``. ``"auto"``
screens :func:`micro_batch_counts` with the baselines and runs the exact
stages on ``M = 1`` and the best screened counts (:func:`solve_step`), so
that the whole search keeps to the time limit.

Batch marks: the step's ops carry them (:attr:`pesto.graph.Op.batch`,
``phase``, ``anchor``, ``role``), set by a front end (the facade,
:func:`pesto.api.marked`, marks a TensorFlow graph without them); a graph
with unmarked ops raises :class:`~pesto.errors.BatchMarkError` naming them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Mapping

from pesto.cluster import Cluster
from pesto.deadline import Deadline
from pesto.errors import BatchMarkError, MicroBatchMemoryError, PestoError
from pesto.graph import OpGraph
from pesto.memory import fmt_bytes
from pesto.plan import Plan
from pesto.problem import Problem
from pesto.solvelog import SolveLog, Stage
from pesto.step import replicate, split as split_step

from .microbatch_bound import SampleBound, memory_need, sample_bound
from .options import SolveOptions
from .hybrid import hybrid_plan
from .pipeline import PIPELINES, run_pipeline
from .pipeline_baselines import SCHEDULES, data_parallel_plan, gpu_names, pipeline_plan
from .slice_model import solve_slices

__all__ = ["StepResult", "solve_step", "step_graph", "micro_batch_counts", "with_marks", "memory_short",
           "winner_bound", "AUTO_MAX"]

#: ``micro_batches="auto"`` tries counts up to this many slices.
AUTO_MAX = 16
#: Seconds the pipeline gets at least for one ``M``; with less left it is skipped.
MIN_SECONDS = 0.5
#: Share of the time limit ``"auto"`` spends screening counts with the baselines.
SCREEN_SHARE = 0.35
#: Stage splits each of GPipe and 1F1B simulates per count when screening.
SCREEN_CANDIDATES = 4
#: Share of the exact phase's time every count gets first (equal parts); the
#: rest continues the count whose plan was best (racing, as successive halving).
PROBE_SHARE = 0.5
#: Counts besides ``M = 1`` that ``"auto"`` runs the exact stages on (the best screened).
EXACT_COUNTS = 2
#: Largest replicated graph (replicas x ops of the split) the data-parallel
#: baseline of ``M > 1`` is built for: beyond it the simulator's time
#: outweighs a plan that only pays off when one replica does not fit.
DP_MAX_OPS = 150_000
#: Share of one ``M``'s seconds the slice model gets (at least one second).
SLICE_SHARE = 0.4


@dataclass(frozen=True)
class StepResult:
    """The best plan of a step over micro-batch counts and data parallelism.

    Attributes
    ----------
    plan : Plan
        Over ``graph``'s ops; ``plan.log`` has ``micro_batches``,
        ``graph_kind``, ``replicas`` and ``steps``.
    graph : OpGraph
        The graph the plan places: the step, its split, or its replicated form.
    micro_batches : int
    graph_kind : str
        ``"step"``, ``"micro-batched"`` or ``"replicated"``.
    replicas : int
    steps : mapping name -> µs
        Every candidate's step (``"M=4"``, ``"gpipe M=4"``, ``"data-parallel"``).
    """

    plan: Plan
    graph: OpGraph
    micro_batches: int
    graph_kind: str
    replicas: int
    steps: Mapping[str, float]


def micro_batch_counts(micro_batches, batch_size: int | None = None) -> list[int]:
    """The counts to try: ``[M]``, or for ``"auto"`` the divisors of
    ``batch_size`` up to :data:`AUTO_MAX` (1, 2, 4, 8, 16 without one).

    >>> micro_batch_counts("auto", 24), micro_batch_counts("auto"), micro_batch_counts(3)
    ([1, 2, 3, 4, 6, 8, 12], [1, 2, 4, 8, 16], [3])
    """
    if micro_batches != "auto":
        return [int(micro_batches)]
    if batch_size is None:
        return [m for m in (1, 2, 4, 8, 16) if m <= AUTO_MAX]
    return [m for m in range(1, min(batch_size, AUTO_MAX) + 1) if batch_size % m == 0]


def with_marks(graph: OpGraph) -> OpGraph:
    """``graph``, whose every op has a batch mark (a front end sets them:
    :func:`pesto.api.marked` for a TensorFlow graph without them).

    Raises
    ------
    BatchMarkError
        Ops without a batch mark, named.
    """
    unknown = [op.name for op in graph.ops if op.batch is None]
    if unknown:
        raise BatchMarkError(f"graph {graph.name!r} has {len(unknown)} op(s) without batch marks (Op.batch): "
                             f"mark them (JSON 'batch': true/false; pesto.solve marks a TensorFlow graph)",
                             unknown)
    return graph


def step_graph(graph: OpGraph, micro_batches: int = 1, graph_kind: str = "step", replicas: int = 1) -> OpGraph:
    """The graph a plan with these log fields places (``plan.log.micro_batches``,
    ``graph_kind``, ``replicas``), rebuilt from the step ``graph``.

    Raises
    ------
    ValueError
        An unknown ``graph_kind``.
    """
    if graph_kind == "step":
        return graph
    marked = with_marks(graph)
    if graph_kind == "micro-batched":
        return split_step(marked, micro_batches).graph
    if graph_kind == "replicated":
        rep = replicate(marked, replicas).graph
        return rep if micro_batches == 1 else split_step(rep, micro_batches).graph
    raise ValueError(f"unknown graph_kind {graph_kind!r}; known: step, micro-batched, replicated")


@dataclass
class _Best:
    """The best candidate so far and every candidate's step."""

    result: StepResult | None = None
    steps: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    short: dict = field(default_factory=dict)   # M -> MicroBatchMemoryError
    bounds: dict = field(default_factory=dict)  # id(plan) -> winner_bound of that result
    t0: float = field(default_factory=time.perf_counter)

    def offer(self, name: str, plan: Plan, graph: OpGraph, m: int, kind: str, replicas: int = 1) -> None:
        self.steps[name] = plan.makespan
        if self.result is None or _rank(plan) < _rank(self.result.plan):
            self.result = StepResult(plan, graph, m, kind, replicas, {})


def _rank(plan: Plan):
    return (plan.status == "infeasible", plan.makespan)


def solve_step(graph: OpGraph, cluster: Cluster, options: SolveOptions) -> StepResult:
    """The best plan over the counts of ``options.micro_batches`` and data
    parallelism (module doc), within ``options.time_limit``.

    Two phases share the limit. **Screening**: every count's baselines
    (:func:`_screen`: its memory floor, GPipe, 1F1B, data parallel in ``M``
    slices), with ``"auto"`` within :data:`SCREEN_SHARE` of the limit (a
    count whose screening would not fit, estimated from the last one's time
    per op, is skipped and said so). **Exact**: the pipeline, started from the
    screened plans, on ``M = 1`` and the :data:`EXACT_COUNTS` counts whose
    screened plans were best, each an equal part of :data:`PROBE_SHARE` of
    the time left (a count left less than :data:`MIN_SECONDS` is skipped and
    said so), then the rest to the count whose plan was best, continued from
    it (racing: the un-split step, when it is the best, gets most of the
    limit). In deterministic mode nothing is skipped on wall time.

    Raises
    ------
    BatchMarkError
        As :func:`with_marks`.
    MicroBatchMemoryError
        A fixed ``M`` whose split step fits no device (:func:`memory_short`).
    """
    t0 = options.started if options.started is not None else time.perf_counter()
    say = options.progress or (lambda line: None)
    marked = with_marks(graph)
    counts = micro_batch_counts(options.micro_batches, options.batch_size)
    auto = options.micro_batches == "auto"
    end = None if options.time_limit is None else t0 + options.time_limit
    best = _Best()
    try:
        dp = data_parallel_plan(marked, cluster)
        best.offer("data-parallel", dp.plan, dp.graph, 1, "replicated", dp.stages)
        say(f"data-parallel: step {dp.plan.makespan / 1000:.3f} ms")
    except PestoError as exc:
        say(f"data-parallel: skipped ({exc})")
    screen_end = None if end is None or not auto or options.deterministic else \
        t0 + SCREEN_SHARE * options.time_limit
    screened = _screen_all(graph, marked, cluster, counts, screen_end, best, say, raise_short=not auto)
    if not screened and best.result is None:  # every M fits no device and no data-parallel plan
        raise next(iter(best.short.values()))
    t = time.perf_counter()
    if best.result is not None:   # the bound of the best so far: its time is kept back for the winner's
        _bound_of(best, marked, cluster, options.batch_size)
    reserve = time.perf_counter() - t
    chosen = _exact_counts(screened, auto)
    probe_end = None if end is None else \
        time.perf_counter() + (PROBE_SHARE if len(chosen) > 1 else 1.0) * (end - reserve - time.perf_counter())
    exact: dict = {}
    for k, m in enumerate(chosen):
        left = None if end is None else (probe_end - time.perf_counter()) / (len(chosen) - k)
        if left is not None and left < MIN_SECONDS and not options.deterministic and best.result is not None:
            best.skipped[f"M={m}"] = f"exact stages skipped: {max(left, 0.0):.2f} s left of the time limit"
            say(f"micro-batches {m}: exact stages skipped (time limit)")
            continue
        before = set(best.steps)
        exact[m] = _exact(screened[m], cluster, options, m, left if left is None else max(MIN_SECONDS, left), best)
        mine = {n: v for n, v in best.steps.items() if n not in before}
        say(f"micro-batches {m}: step " + ", ".join(f"{n} {v / 1000:.3f} ms" for n, v in mine.items()))
    if exact and len(chosen) > 1 and end is not None:   # a count skipped leaves its time to the best
        m = min(exact, key=lambda c: _rank(exact[c]))
        left = end - reserve - time.perf_counter()
        if left >= MIN_SECONDS or options.deterministic:
            plan = _exact(screened[m], cluster, options, m, max(MIN_SECONDS, left), best, start=exact[m])
            say(f"micro-batches {m}: the best exact count continued, step {plan.makespan / 1000:.3f} ms")
    return _finish(best, options, marked, cluster)


@dataclass
class _Screened:
    """One count after screening: the graph its exact stages place (the step
    for ``M = 1``, else the split), the plans they start from, and the best
    screened step (``inf`` when no baseline applied); ``source`` the marked
    step it was split from, ``pipes`` the GPipe/1F1B results (slice model hints)."""

    graph: OpGraph
    starts: list
    step: float
    source: OpGraph | None = None
    pipes: list = field(default_factory=list)


def _screen_all(graph: OpGraph, marked: OpGraph, cluster: Cluster, counts, screen_end: float | None,
                best: _Best, say, *, raise_short: bool) -> dict:
    """:func:`_screen` every count in ``counts`` (ascending) until
    ``screen_end``; ``{M: _Screened}`` of those screened and fitting."""
    out: dict = {}
    per_op = None   # seconds per op of the split graph, measured on the last count screened
    for m in sorted(counts):
        ops = marked.num_ops * m
        if screen_end is not None and per_op is not None and \
                time.perf_counter() + per_op * ops > screen_end:
            best.skipped[f"M={m}"] = (f"not screened: about {per_op * ops:.1f} s for {ops} ops, "
                                      f"{max(screen_end - time.perf_counter(), 0.0):.1f} s of the screening share left")
            say(f"micro-batches {m}: skipped (screening time)")
            continue
        t = time.perf_counter()
        s = _screen(graph if m == 1 else marked, cluster, m, best)
        if s is None:
            if raise_short:
                raise best.short[m]
            say(f"micro-batches {m}: skipped ({best.short[m]})")
            continue
        if m > 1:   # M = 1 screens nothing: no estimate for the others
            per_op = (time.perf_counter() - t) / max(s.graph.num_ops, 1)
        out[m] = s
    return out


def _screen(graph: OpGraph, cluster: Cluster, m: int, best: _Best) -> _Screened | None:
    """The split in ``m`` slices, its memory floor (None, with the error in
    ``best.short``, when it fits no device), and for ``m > 1`` the GPipe,
    1F1B and data-parallel plans of that ``m``, offered."""
    split = graph if m == 1 else split_step(graph, m).graph
    short = memory_short(graph, cluster, m, split=split)
    if short is not None:
        best.short[m] = short
        best.skipped[f"M={m}"] = str(short)
        return None
    starts, pipes, step = [], [], float("inf")
    _offer_hybrids(graph, cluster, m, len(split.ops), best)
    if m == 1:
        return _Screened(split, starts, step, graph)
    for schedule in SCHEDULES:
        try:
            sp = pipeline_plan(graph, cluster, schedule=schedule, micro_batches=m, candidates=SCREEN_CANDIDATES)
        except PestoError as exc:  # e.g. no forward/backward stage split: Pesto alone
            best.skipped[f"{schedule} M={m}"] = str(exc)
            continue
        starts.append(sp.plan)
        pipes.append(sp)
        step = min(step, sp.plan.makespan)
        best.offer(f"{schedule} M={m}", sp.plan, sp.graph, m, "micro-batched")
    replicas = len(gpu_names(cluster))
    if replicas * len(split.ops) > DP_MAX_OPS:
        best.skipped[f"data-parallel M={m}"] = (f"{replicas} replicas x {len(split.ops)} ops exceed "
                                                f"{DP_MAX_OPS} ops")
    else:
        try:
            dp = data_parallel_plan(graph, cluster, micro_batches=m)
            best.offer(f"data-parallel M={m}", dp.plan, dp.graph, m, "replicated", dp.stages)
        except PestoError as exc:
            best.skipped[f"data-parallel M={m}"] = str(exc)
    return _Screened(split, starts, step, graph, pipes)


def _offer_hybrids(graph: OpGraph, cluster: Cluster, m: int, ops: int, best: _Best) -> None:
    """Offer ``hybrid R=<R> M=<m>`` (:func:`solver.hybrid.hybrid_plan`) for
    every divisor ``R`` of the GPUs, ``1 < R < GPUs``; skipped, and said, when
    ``R`` x the ``ops`` of the split exceed :data:`DP_MAX_OPS`."""
    n = len(gpu_names(cluster))
    marked = with_marks(graph)   # M = 1 screens the step as given: marked once here, not per R
    for r in (r for r in range(2, n) if n % r == 0):
        name = f"hybrid R={r} M={m}"
        if r * ops > DP_MAX_OPS:
            best.skipped[name] = f"{r} replicas x {ops} ops exceed {DP_MAX_OPS} ops"
            continue
        try:
            h = hybrid_plan(marked, cluster, replicas=r, micro_batches=m, candidates=SCREEN_CANDIDATES)
        except PestoError as exc:
            best.skipped[name] = str(exc)
            continue
        best.offer(name, h.plan, h.graph, m, "replicated", r)


def _exact_counts(screened: Mapping[int, _Screened], auto: bool) -> list[int]:
    """The counts the exact stages run on: every one screened unless
    ``auto``; with ``auto`` ``M = 1`` (the step as given first: it is never
    left without its share) and the :data:`EXACT_COUNTS` best by screened
    step, best first.

    >>> s = {m: _Screened(None, [], v) for m, v in [(1, float("inf")), (2, 5.0), (4, 3.0), (8, 4.0)]}
    >>> _exact_counts(s, True), _exact_counts(s, False)
    ([1, 4, 8], [1, 2, 4, 8])
    """
    if not auto:
        return sorted(screened)
    split = sorted((s.step, m) for m, s in screened.items() if m > 1)
    return ([1] if 1 in screened else []) + [m for _, m in split[:EXACT_COUNTS]]


def memory_short(graph: OpGraph, cluster: Cluster, m: int, *, split: OpGraph | None = None
                 ) -> MicroBatchMemoryError | None:
    """The error to give when no plan of ``graph`` (marked) in ``m`` slices can
    fit: even :func:`~solver.microbatch_bound.memory_floor` of the split step
    exceeds the largest device; None otherwise. ``split``: that split, if made.

    >>> from pesto.graph import Op, OpGraph, Edge, Tensor
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op("dw", {"GPU": 8.0}, output_bytes=400, batch=True),
    ...              Op("apply", {"GPU": 1.0}, batch=False)], [Edge("dw", "apply", "dw:0")],
    ...             [Tensor("dw:0", "dw", 400)])
    >>> memory_short(g, gpus(2, memory=1000), 1) is None
    True
    >>> print(memory_short(g, gpus(2, memory=1000), 2))   # summing 2 slices: 2 gradients in, 1 out
    M=2: in-flight slices need 1.17 KiB on one device (op 'dw:0@acc1'), the largest device has 1000 B
    """
    if split is None:
        split = graph if m == 1 else split_step(graph, m).graph
    prob = Problem.of(split, cluster)
    need, what = memory_need(prob)
    largest = max(prob.cap)
    if need <= largest:
        return None
    return MicroBatchMemoryError(f"M={m}: in-flight slices need {fmt_bytes(need)} on one device ({what}), "
                                 f"the largest device has {fmt_bytes(largest)}", m, need, largest, culprit=what)


def _exact(screened: _Screened, cluster: Cluster, options: SolveOptions, m: int, seconds: float | None,
           best: _Best, start: Plan | None = None) -> Plan:
    """Offer (as ``M=m``) and return the pipeline's plan of the step in ``m``
    slices, started from the slice model's plan (``m > 1``) and the screened
    plans of that ``m``; with ``start`` (an earlier plan of this ``m``: the
    search continued), from it and the screened plans, no slice model."""
    t = time.perf_counter()
    starts = list(screened.starts)
    if start is not None:
        starts.insert(0, start)
    elif m > 1:
        starts[:0] = _slice_start(screened.source, cluster, options, m, seconds, screened.pipes, best)
    if seconds is not None:
        seconds = max(MIN_SECONDS, seconds - (time.perf_counter() - t))
    inner = options.replace(time_limit=seconds, started=None, micro_batches=1, batch_size=None, progress=None)
    name = inner.pipeline_for(screened.graph)
    plan = run_pipeline(screened.graph, cluster, PIPELINES[name], inner, name=name, starts=starts)
    if start is not None and _rank(start) < _rank(plan):
        plan = start
    best.offer(f"M={m}", plan, screened.graph, m, "micro-batched" if m > 1 else "step")
    return plan


def _slice_start(graph: OpGraph, cluster: Cluster, options: SolveOptions, m: int, seconds: float | None,
                 pipes, best: _Best) -> list[Plan]:
    """The slice model's plan of ``m`` slices (:func:`solver.slice_model.solve_slices`,
    :data:`SLICE_SHARE` of ``seconds``, skipped below :data:`MIN_SECONDS`), offered as
    ``slice M=m``; [] when skipped."""
    say = options.progress or (lambda line: None)
    share = 10.0 if seconds is None else SLICE_SHARE * seconds
    if share < MIN_SECONDS and not options.deterministic:
        best.skipped[f"slice M={m}"] = f"{share:.2f} s for the slice model, less than {MIN_SECONDS} s"
        return []
    try:
        r = solve_slices(graph, cluster, micro_batches=m, time_limit=share, workers=options.workers,
                         seed=options.seed, hints=pipes,
                         deadline=Deadline(share, deterministic=True) if options.deterministic else None)
    except PestoError as exc:
        best.skipped[f"slice M={m}"] = str(exc)
        say(f"slice model M={m}: skipped ({exc})")
        return []
    if r.plan is None:
        best.skipped[f"slice M={m}"] = f"no grid solution ({r.status}) within {share:.1f} s"
        say(f"slice model M={m}: {best.skipped[f'slice M={m}']}")
        return []
    best.offer(f"slice M={m}", r.plan, r.graph, m, "micro-batched")
    say(f"slice model M={m}: {r.blocks} blocks, grid {r.status} {r.objective / 1000:.3f} ms "
        f"(grid bound {r.grid_bound / 1000:.3f}), step {r.plan.makespan / 1000:.3f} ms, {r.wall:.1f} s")
    return [r.plan]


def _finish(best: _Best, options: SolveOptions, marked: OpGraph, cluster: Cluster) -> StepResult:
    """The winner with its log's micro-batch fields, the steps compared and
    the bound of the graph it places (:func:`winner_bound`, when higher than
    the pipeline's or when a baseline won)."""
    r = best.result
    took = time.perf_counter() - (options.started if options.started is not None else best.t0)
    log = r.plan.log or SolveLog(pipeline="step search", winner=r.plan.placer, bound_source="none",
                                 stages=(Stage("step search", took, r.plan.makespan, "a baseline's plan won"),))
    bound, source = log.bound, log.bound_source
    sb = _bound_of(best, marked, cluster, options.batch_size)
    if sb is not None and (bound is None or sb.step > bound):
        bound, source = sb.step, f"per-sample bound ({sb.source})"
    log = replace(log, micro_batches=r.micro_batches, graph_kind=r.graph_kind, replicas=r.replicas,
                  steps=dict(best.steps), skipped={**log.skipped, **best.skipped}, bound=bound,
                  bound_source=source)
    return replace(r, plan=replace(r.plan, log=log, lower_bound=bound), steps=log.steps)


def _bound_of(best: _Best, marked: OpGraph, cluster: Cluster, batch: int | None) -> SampleBound | None:
    """:func:`winner_bound` of ``best.result``, computed once per result."""
    key = id(best.result.plan)
    if key not in best.bounds:
        best.bounds[key] = winner_bound(marked, cluster, best.result, batch)
    return best.bounds[key]


def winner_bound(marked: OpGraph, cluster: Cluster, r: StepResult, batch: int | None = None) -> SampleBound | None:
    """:func:`~solver.microbatch_bound.sample_bound` of the graph ``r.plan``
    places, rebuilt from the marked step (replicated, then split, as
    :func:`step_graph`; ``M = 1`` as the split into one slice: the same ops
    under the copy names, so the same bound); None when the rebuilt graph is
    not that one (then the pipeline's bound stands)."""
    base = replicate(marked, r.replicas).graph if r.graph_kind == "replicated" else marked
    split = split_step(base, r.micro_batches)
    same = (split.graph.num_ops == r.graph.num_ops if r.micro_batches == 1
            else split.graph.names == r.graph.names)
    return sample_bound(split, cluster, batch=batch) if same else None
