"""``pesto.solve(micro_batches=M | "auto")``: the best plan over transformed steps.

A plan of a micro-batched or replicated step places a *different graph* than
the step given (:func:`pesto.microbatch.split_step`,
:func:`pesto.replicate.replicate`), so :func:`solve_step` returns it with that
graph (:class:`StepResult`), and the plan's log says which graph it is
(``micro_batches``, ``graph_kind``, ``replicas``) and every step compared
(``steps``); :func:`step_graph` rebuilds the graph from those fields.

The candidates, all scored by the same simulator (``finalize``):

* for each ``M`` tried, ``M > 1``: the slice model's plan
  (:func:`solver.slice_model.solve_slices`, CP-SAT on a block x slice grid,
  :data:`SLICE_SHARE` of that ``M``'s time, hinted with the better pipeline),
  the GPipe and 1F1B plans of that ``M``
  (:func:`solver.pipeline_baselines.pipeline_plan`), and the pipeline
  (:func:`solver.pipeline.run_pipeline`) on the step split into ``M`` slices
  started from those three;
* ``M == 1`` (with ``"auto"``): the pipeline on the step as given;
* the data-parallel plan (one replica per GPU, ring all-reduce), not split
  and (for each ``M > 1`` tried) with each replica in ``M`` slices.

The result is the best of them (a plan that fits memory before one that does
not, then the shortest step): never slower than any candidate. Its log's
bound is valid for the graph it places: the pipeline's, or
:func:`~solver.microbatch_bound.sample_bound` of that graph when higher or
when a baseline won (:func:`winner_bound`). An ``M`` whose split step fits no
device even at its memory floor (:func:`memory_short`) raises
:class:`~pesto.errors.MicroBatchMemoryError` when asked for alone; ``"auto"``
skips it, with the reason in ``plan.log.skipped``. ``"auto"``
tries :func:`micro_batch_counts` and gives every ``M`` a fair share of the
time left.

Batch marks: a graph with unmarked ops (``Op.batch is None``) is marked by
:func:`pesto.training.infer_batch_marks` (TensorFlow's data inputs); when
that finds no rule, :class:`~pesto.errors.BatchMarkError` says so.
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
from pesto.microbatch import split_step
from pesto.plan import Plan
from pesto.problem import Problem
from pesto.replicate import replicate
from pesto.solvelog import SolveLog, Stage
from pesto.training import infer_batch_marks

from .microbatch_bound import SampleBound, memory_need, sample_bound
from .options import SolveOptions
from .pipeline import PIPELINES, run_pipeline
from .pipeline_baselines import SCHEDULES, data_parallel_plan, pipeline_plan
from .slice_model import solve_slices

__all__ = ["StepResult", "solve_step", "step_graph", "micro_batch_counts", "with_marks", "memory_short",
           "winner_bound", "AUTO_MAX"]

#: ``micro_batches="auto"`` tries counts up to this many slices.
AUTO_MAX = 16
#: Seconds the pipeline gets at least for one ``M``, however little is left.
MIN_SECONDS = 0.5
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
    """``graph`` if every op has a batch mark, else marked by
    :func:`pesto.training.infer_batch_marks`.

    Raises
    ------
    BatchMarkError
        Unmarked ops and no rule to infer their marks (no data input found).
    """
    if all(op.batch is not None for op in graph.ops):
        return graph
    try:
        return infer_batch_marks(graph)
    except BatchMarkError as exc:
        raise BatchMarkError(f"graph {graph.name!r} has ops without batch marks (Op.batch) and no rule infers "
                             f"them ({exc}); mark the ops (JSON 'batch': true/false)") from None


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

    Raises
    ------
    BatchMarkError
        As :func:`with_marks`.
    """
    t0 = options.started if options.started is not None else time.perf_counter()
    say = options.progress or (lambda line: None)
    marked = with_marks(graph)
    counts = micro_batch_counts(options.micro_batches, options.batch_size)
    short = {m: e for m in counts if (e := memory_short(marked, cluster, m)) is not None}
    if short and options.micro_batches != "auto":
        raise short[counts[0]]
    best = _Best()
    for m, e in short.items():
        best.skipped[f"M={m}"] = str(e)
        say(f"micro-batches {m}: skipped ({e})")
    try:
        dp = data_parallel_plan(marked, cluster)
        best.offer("data-parallel", dp.plan, dp.graph, 1, "replicated", dp.stages)
        say(f"data-parallel: step {dp.plan.makespan / 1000:.3f} ms")
    except PestoError as exc:
        say(f"data-parallel: skipped ({exc})")
    end = None if options.time_limit is None else t0 + options.time_limit
    counts = [m for m in counts if m not in short]
    for k, m in enumerate(counts):
        left = None if end is None else max(MIN_SECONDS, (end - time.perf_counter()) / (len(counts) - k))
        before = set(best.steps)
        _try_count(graph if m == 1 else marked, cluster, options, m, left, best)
        mine = {n: v for n, v in best.steps.items() if n not in before}
        say(f"micro-batches {m}: step " + ", ".join(f"{n} {v / 1000:.3f} ms" for n, v in mine.items()))
    if best.result is None:  # no data-parallel plan and every M skipped
        raise next(iter(short.values()))
    return _finish(best, options, marked, cluster)


def memory_short(graph: OpGraph, cluster: Cluster, m: int) -> MicroBatchMemoryError | None:
    """The error to give when no plan of ``graph`` (marked) in ``m`` slices can
    fit: even :func:`~solver.microbatch_bound.memory_floor` of the split step
    exceeds the largest device; None otherwise.

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
    split = graph if m == 1 else split_step(graph, m).graph
    prob = Problem.of(split, cluster)
    need, what = memory_need(prob)
    largest = max(prob.cap)
    if need <= largest:
        return None
    return MicroBatchMemoryError(f"M={m}: in-flight slices need {fmt_bytes(need)} on one device ({what}), "
                                 f"the largest device has {fmt_bytes(largest)}", m, need, largest, culprit=what)


def _try_count(graph: OpGraph, cluster: Cluster, options: SolveOptions, m: int, seconds: float | None,
               best: _Best) -> None:
    """Offer the pipeline's plan of the step in ``m`` slices (started from
    the slice model's, GPipe's and 1F1B's plans of that ``m``, offered too)."""
    t = time.perf_counter()
    starts, split = [], graph
    if m > 1:
        split = split_step(graph, m).graph
        pipes = []
        for schedule in SCHEDULES:
            try:
                sp = pipeline_plan(graph, cluster, schedule=schedule, micro_batches=m)
            except PestoError as exc:  # e.g. no forward/backward stage split: Pesto alone
                best.skipped[f"{schedule} M={m}"] = str(exc)
                continue
            pipes.append(sp)
            starts.append(sp.plan)
            best.offer(f"{schedule} M={m}", sp.plan, sp.graph, m, "micro-batched")
        starts[:0] = _slice_start(graph, cluster, options, m, seconds, pipes, best)
        try:
            dp = data_parallel_plan(graph, cluster, micro_batches=m)
            best.offer(f"data-parallel M={m}", dp.plan, dp.graph, m, "replicated", dp.stages)
        except PestoError as exc:
            best.skipped[f"data-parallel M={m}"] = str(exc)
    if seconds is not None:
        seconds = max(MIN_SECONDS, seconds - (time.perf_counter() - t))
    inner = options.replace(time_limit=seconds, started=None, micro_batches=1, batch_size=None, progress=None)
    name = inner.pipeline_for(split)
    plan = run_pipeline(split, cluster, PIPELINES[name], inner, name=name, starts=starts)
    best.offer(f"M={m}", plan, split, m, "micro-batched" if m > 1 else "step")


def _slice_start(graph: OpGraph, cluster: Cluster, options: SolveOptions, m: int, seconds: float | None,
                 pipes, best: _Best) -> list[Plan]:
    """The slice model's plan of ``m`` slices (:func:`solver.slice_model.solve_slices`,
    :data:`SLICE_SHARE` of ``seconds``), offered as ``slice M=m``; [] when skipped."""
    say = options.progress or (lambda line: None)
    share = 10.0 if seconds is None else max(1.0, SLICE_SHARE * seconds)
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
    sb = winner_bound(marked, cluster, r, options.batch_size)
    if sb is not None and (bound is None or sb.step > bound):
        bound, source = sb.step, f"per-sample bound ({sb.source})"
    log = replace(log, micro_batches=r.micro_batches, graph_kind=r.graph_kind, replicas=r.replicas,
                  steps=dict(best.steps), skipped={**log.skipped, **best.skipped}, bound=bound,
                  bound_source=source)
    return replace(r, plan=replace(r.plan, log=log, lower_bound=bound), steps=log.steps)


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
