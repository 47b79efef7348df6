"""``pesto.solve(micro_batches=M | "auto")``: the best plan over strategies, under one clock.

A plan of a micro-batched or replicated step places a *different graph* than
the step given (:func:`pesto.step.split`,
:func:`pesto.step.replicate`), so :func:`solve_step` returns it with that
graph, the transform that made it and its :class:`~solver.parallel.strategy.Strategy`
(:class:`~solver.parallel.strategy.Solved`); the plan's log says which graph
it is (``micro_batches``, ``graph_kind``, ``replicas``) and every step
compared (``steps``); :func:`step_graph` rebuilds the graph from those fields.

**One clock.** The search runs under the solve's one
:class:`~pesto.deadline.Deadline` (``options.time_limit`` from
``options.started``; a :class:`~pesto.deadline.WorkClock` in deterministic
mode) and one :class:`~solver.budget.Budget` over its passes
(:data:`PASSES`): screening, the exact passes of each count (each count's
recipe runs on a grant of that deadline, the slice model on a part of it)
and the per-sample bound. SIGINT, SIGTERM and SIGHUP in any pass interrupt
that one deadline: the running candidate stops at its next check and the
best plan so far is returned with status ``"interrupted"``. A candidate
predicted not to fit what is left (from the measured seconds per simulated
op, :class:`_Pace`; in deterministic mode a fixed pace, each candidate
charged to the work clock, so nothing reads the wall clock) or too large to build (:data:`DP_MAX_OPS`, :data:`SPLIT_MAX_OPS`)
is skipped, named in ``plan.log.skipped``.

The candidates, all scored by the same simulator (``finalize``), ranked by
:func:`solver.common.rank` (a plan that fits memory first, then the shortest
step):

* ``"auto"`` only: the data-parallel plan (one replica per GPU, ring
  all-reduce), not split, and the same with ZeRO-1 (reduce-scatter, each
  replica updating ``1 / R`` of the weights, all-gather: the same bytes, a
  ``1 / R`` of the update's work, so it wins where the update weighs); under
  its memory floor, its savers forecast to fit in turn until one fits, then
  the leanest saver (every op recomputed) of each less sharded level, each
  with its layer blocks' levels lowered (:meth:`_Search.leanest_data_parallel`);
* screening, for each ``M`` tried: the GPipe and 1F1B plans of that ``M``
  (``M > 1``; :func:`solver.parallel.pipelines.pipeline_plan`), the
  data-parallel plan with each replica in ``M`` slices (``M > 1``), and for
  every divisor ``R`` of the GPUs with ``1 < R < GPUs`` the hybrid plan of
  ``R`` replicas each pipelined over ``GPUs / R`` GPUs
  (:func:`solver.parallel.hybrid.hybrid_plan`); at ``M = 1``, for each such
  ``R``, ``R`` replicas of one free placement (the recipe's plan of a
  replica's step on ``GPUs / R`` GPUs, on
  :data:`~solver.parallel.kinds.PLACED_SHARE` of the screening time left,
  :meth:`_Search.one_step`; :mod:`solver.parallel.placed`); at ``M > 1``, one
  free placement of the split step by the list placer
  (:meth:`_Search.list_placer`: the practitioner's layer stages, list-scheduled
  by placed rank; every weight gradient summed in place), whose plan, when it
  is the count's best, makes its split the one the count's exact passes place
  (:func:`_keep_start`; skipped, as ``placed``, while the best plan is within
  :data:`SOLVE_GAIN` of the work over the GPUs); then, on
  :data:`LATE_SHARE` of the screening time left, for the count whose
  GPipe/1F1B plans were best, the interleaved 1F1B, ZB-H1, ZB-H2 and ZB-V plans
  (:data:`solver.parallel.kinds.KINDS`' ``zero-bubble``, one stage split
  each), unless that count's best GPipe/1F1B step less its whole fill and
  drain is no better than the best plan so far (they gain at most that);
  what is not built is named in ``plan.log.skipped``;
* weight gradients joined (:meth:`_Search.joined`): each GPipe/1F1B and
  zero-bubble candidate of one replica again with the weight-gradient ops
  the front end marked joinable (:func:`pesto.step.marks.joinable_ops`) run
  once over every slice (``weight_grads="whole"``, named ``"zb-h1 M=8
  whole(4)"``) where that does less work: all of them, or, when that plan
  does not fit memory and the separate one does, those whose held bytes fit
  its free memory per GPU; a joined plan that fits and beats the count's
  separate ones makes its split the one the count's exact passes place
  (``plan.log.joined`` names the winner's joined ops);
* weight gradients summed in place (:meth:`_Search.summed_in_place`): each
  such candidate again with ``weight_grads="accumulate"`` for every weight
  gradient whose accumulate ops it drops (``"zb-h2 M=8 accumulate(4)"``), and,
  when that plan fits and some are joinable, the mix of
  :func:`pesto.step.slicing.choose_weight_grads` (whole where the held bytes
  fit its free memory per GPU, else in place: ``"1f1b M=8 whole(2)
  accumulate(2)"``), kept as the joined twins are (``plan.log.in_place``);
  a data-parallel plan of ``M > 1`` slices (gradient accumulation) with the
  rule ``"accumulate"`` for all too;
* memory savers (:func:`solver.parallel.kinds.savers`): for a screened
  candidate whose plan does not fit memory, the same strategy with ZeRO-1,
  ZeRO-2, ZeRO-2 and recomputation (data parallelism) or selective
  recomputation (each layer block's cheap ops) then recomputation
  (pipelines, hybrids), until one fits; a recomputing plan that fits (any
  kind) is followed by the same with each layer block's level lowered (every
  op -> cheap ops -> none) as far as its GPUs have room
  (:meth:`_Search.partial`, :mod:`solver.parallel.partial`); for a count whose memory floor does
  not fit (:func:`memory_short`: it counts a colocation unit's optimizer
  state whole, or the search's floor of weights and one slice's activations,
  which savers lower), every kind's savers, the count refused (fixed ``M``)
  only when none fits; the winner's savers in ``plan.log.savers``;
* a **memory-bound** step (one slice of the whole step fits no GPU,
  :meth:`_Search.floor`) screens the counts from the most slices down, on
  :data:`TIGHT_SCREEN_SHARE` of the time, and per count every kind (the
  zero-bubble ones too) with each candidate's savers as candidates of their
  own, in :meth:`_Search.tight_order`: those forecast to fit
  (:meth:`_Search.predicted_memory`) first, plain before savers (ZeRO and
  selective recomputation before full recomputation), leanest first; a saver is not built once its plain strategy or an earlier saver
  fits; its exact passes are skipped (named) when a plan fits and the
  recipe's first plan of the split is predicted past the grant; the time
  they leave (or, while no plan fits, the time before them) screens the
  candidates not built yet (:meth:`_Search.screen_rest`);
* exact passes, for the counts :func:`_exact_counts` picks: the slice
  model's plan (:func:`solver.parallel.slice_model.solve_slices`, :data:`SLICE_SHARE`
  of that count's grant) and the recipe (:func:`solver.recipes.run_recipe`)
  on the step split into ``M`` slices, started from those; ``M == 1`` (with
  ``"auto"``): the recipe on the step as given.

A fixed ``M`` is honoured: only plans of ``M`` slices compete (a count whose
first plan cannot be made is refused with the reason, never replaced by a
plan of another ``M``). ``replicas x M`` must divide ``batch_size`` when one
is given. The result's bound is valid for the graph it places: the
recipe's, or :func:`~solver.parallel.bound.sample_bound` of that graph when
higher or when a parallelism kind's plan won (:func:`winner_bound`); when a GPipe/1F1B
pipeline won, :func:`~solver.parallel.bound.pipeline_bound` when higher
(source ``"pipeline"``: valid for every contiguous-stage pipeline on the
cluster's GPUs, the gap of the winner within its kind).

Batch marks: the step's ops carry them (:attr:`pesto.graph.Op.batch`,
``phase``, ``anchor``, ``role``), set by a front end (the facade,
:func:`pesto.api.marked`, marks a TensorFlow graph without them); a graph
with unmarked ops raises :class:`~pesto.errors.BatchMarkError` naming them.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from pesto.cluster import Cluster
from pesto.deadline import Deadline, Stopped
from pesto.finalize import finalize
from pesto.errors import BatchMarkError, MicroBatchError, MicroBatchMemoryError, PestoError
from pesto.graph import OpGraph, gc_frozen, gc_paused
from pesto.memory import fmt_bytes, step_activations
from pesto.plan import Plan
from pesto.problem import Problem
from pesto.solvelog import PassLog, SolveLog
from pesto.step import Transformed, identity, recompute, replicate, split as split_step
from pesto.step.marks import joinable_ops, shardable, slice_constants
from pesto.step.recompute import layer_blocks
from pesto.step.slicing import choose_weight_grads, copy_name, weight_grad_costs, weight_grad_ops
from pesto.step.replication import BUCKET_BYTES, gradient_buckets, optimizer_state, parameters

from ..budget import Budget, Cost, Skip
from ..common import rank
from ..options import SolveOptions
from ..recipes import RECIPES, run_recipe
from ..practitioners import place_expert
from ..search import reschedule
from .pipelines import gpu_names
from .slice_model import solve_slices
from .bound import SampleBound, covers, memory_need, pipeline_bound, sample_bound
from .kinds import KINDS, Kind, savers
from .realise import realise, with_savers
from .cut import in_flight
from .partial import block_savings, held_where, next_levels
from .schedules import SCHEDULES
from .strategy import Solved, Strategy, recompute_mask

__all__ = ["solve_step", "step_graph", "savers_of", "micro_batch_counts", "with_marks", "memory_short",
           "winner_bound", "replicated_ops", "check_batch", "AUTO_MAX", "PASSES"]

#: ``micro_batches="auto"`` tries counts up to this many slices.
AUTO_MAX = 16
#: Seconds the recipe gets at least for one ``M``; with less left it is skipped (wall clock only).
MIN_SECONDS = 0.5
#: Share of the time left ``"auto"`` and a fixed ``M`` spend screening.
SCREEN_SHARE = 0.35
#: Share of the time left a memory-bound step (one slice of the whole step fits no GPU) spends
#: screening: its plans come from screening every kind with its savers (GPT-1.3B's and 2.7B's
#: winners on 8 V100s); the exact passes on a 100k-op split that does not fit rarely beat them.
TIGHT_SCREEN_SHARE = 0.7
#: Plans recomputing layer blocks at mixed levels (:mod:`solver.parallel.partial`) simulated after
#: a plan recomputing every block fits (any kind but the slice model).
PARTIAL_TRIES = 3
#: The gradient bucket size a fitting data-parallel plan is also screened with (:meth:`_Search.follow`):
#: half DDP's :data:`pesto.step.replication.BUCKET_BYTES`.
BUCKET_TWIN = BUCKET_BYTES // 2
#: ... when the plan is within this share of the best plan so far.
BUCKET_TWIN_RANGE = 0.05
#: A block's level (:data:`solver.parallel.strategy.LEVELS`) as a ``Strategy.recompute`` tuple holds it.
_LEVEL_RC = {"none": False, "cheap": "cheap", "full": True}
#: Stage splits each pipeline schedule simulates per count when screening.
SCREEN_CANDIDATES = 4
#: Share of the exact phase's time every count gets first (equal parts); the
#: rest continues the count whose plan was best (racing, as successive halving).
PROBE_SHARE = 0.5
#: Share of the screening time left that the schedules screened last (interleaved, zero
#: bubble: :attr:`solver.parallel.kinds.Kind.fill_only`) may take.
LATE_SHARE = 0.5
#: Counts besides ``M = 1`` that ``"auto"`` runs the exact passes on (the best screened).
EXACT_COUNTS = 2
#: Largest replicated graph (ops of the replicas' slices plus their ring
#: all-reduce ops, :func:`replicated_ops`) a data-parallel or hybrid plan is built for.
DP_MAX_OPS = 150_000
#: Largest split step (ops x ``M``) built at all: a larger ``M`` is refused (fixed) or skipped ("auto").
SPLIT_MAX_OPS = 2_000_000
#: A kind with a one-step solve (``placed``) is screened only while the best plan so far is
#: slower than this many times the step's work over the GPUs (:meth:`_Search.no_solve_gain`).
SOLVE_GAIN = 1.25
#: Share of one count's grant the slice model gets.
SLICE_SHARE = 0.4
#: Largest split step the slice model is run on: its split, grid and final plan are not
#: on its CP-SAT clock (400k ops: about 9 s before its search starts, on a 2-core machine).
SLICE_MAX_OPS = 100_000
#: Simulations of its graph the first data-parallel plan costs (predicting its time), the
#: per-sample bound's, and the recipe's mandatory passes' on a split step (its first heuristic and the
#: final check: what the slice model leaves it) (a kind's own: :attr:`solver.parallel.kinds.Kind.sims`).
SIMS = {"data-parallel": 4.0, "bound": 3.0, "pipeline": 2.0}
#: Deterministic mode's pace (:class:`_Pace`): work seconds charged per op of each simulation of a
#: candidate built, its graph transform included (the wall pace measured on Transformer-6's and
#: GPT-1.3B's candidates on an idle 2-core machine: 1.1e-5 to 6.5e-5 s).
DETERMINISTIC_SECONDS_PER_OP = 3e-5
#: The search's passes under its :class:`~solver.budget.Budget`: screening and the exact
#: stages are optional (the search has a plan without them), the bound is mandatory.
PASSES = ("screening", "exact", "bound")
COSTS: Mapping[str, Cost] = {"screening": Cost(share=SCREEN_SHARE), "exact": Cost(), "bound": Cost(optional=False)}


def micro_batch_counts(micro_batches, batch_size: int | None = None, replicas: int = 1) -> list[int]:
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


def check_batch(batch_size: int | None, replicas: int, m: int) -> str:
    """Why ``replicas`` replicas of ``m`` slices cannot share a batch of
    ``batch_size`` samples ("" when they can, or no batch size is known).

    >>> check_batch(1, 2, 1)
    'batch_size=1 is not a multiple of 2 replicas x 1 micro-batch(es): 0.5 samples per slice'
    >>> check_batch(32, 2, 4), check_batch(None, 500, 3)
    ('', '')
    """
    if batch_size is None or batch_size % (replicas * m) == 0:
        return ""
    return (f"batch_size={batch_size} is not a multiple of {replicas} replicas x {m} micro-batch(es): "
            f"{batch_size / (replicas * m):g} samples per slice")


def with_marks(graph: OpGraph) -> OpGraph:
    """``graph``, whose every op has a batch mark (a front end sets them:
    :func:`pesto.api.marked` for a TensorFlow graph without them), with its
    per-slice constants marked batched (:func:`pesto.step.marks.slice_constants`).

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
    return slice_constants(graph)


def step_graph(graph: OpGraph, micro_batches: int = 1, graph_kind: str = "step", replicas: int = 1,
               savers: str = "", joined=(), in_place=(), bucket_bytes: int | None = BUCKET_BYTES) -> OpGraph:
    """The graph a plan with these log fields places (``plan.log.micro_batches``,
    ``graph_kind``, ``replicas``, ``savers``, ``joined``, ``in_place``, ``bucket_bytes``), rebuilt from
    the step ``graph`` (a pipeline's: the split step, ``joined`` ops run whole, ``in_place`` ones summed
    in place; data parallelism's and a hybrid's: the replicated step, its gradients in buckets of
    ``bucket_bytes``, split, every weight gradient summed in place when ``in_place`` names any: its rule
    is one for all).

    Raises
    ------
    ValueError
        An unknown ``graph_kind`` or saver.
    """
    if graph_kind == "step" and not savers:
        return graph
    zero = savers_of(savers)
    marked = with_savers(with_marks(graph), zero).graph
    if graph_kind == "step":
        return marked
    if graph_kind == "micro-batched":
        rule = {**dict.fromkeys(joined, "whole"), **dict.fromkeys(in_place, "accumulate")}
        return split_step(marked, micro_batches, weight_grads=rule).graph
    if graph_kind == "replicated":
        rep = replicate(marked, replicas, shard_optimizer=zero.shard_optimizer, bucket_bytes=bucket_bytes).graph
        return split_step(rep, micro_batches, weight_grads="accumulate" if in_place else "separate").graph
    raise ValueError(f"unknown graph_kind {graph_kind!r}; known: step, micro-batched, replicated")


def savers_of(words: str) -> Strategy:
    """The savers named by :attr:`Strategy.savers` (``"ZeRO-2 recompute"``) as a
    strategy's fields (on two replicas: any count shards).

    >>> savers_of("ZeRO-1 recompute").shard_optimizer, savers_of("").recompute
    (1, False)
    >>> savers_of("recompute(1/2:1)").recompute, savers_of("ZeRO-2 recompute(1/3:0)+cheap(2/3:1-2)").recompute
    ((False, True), (True, 'cheap', 'cheap'))
    >>> savers_of("ZeRO-3 recompute-cheap").shard_optimizer, savers_of("ZeRO-3 recompute-cheap").selective
    (3, True)
    """
    known = {"ZeRO-1": {"shard_optimizer": 1}, "ZeRO-2": {"shard_optimizer": 2}, "ZeRO-3": {"shard_optimizer": 3},
             "recompute": {"recompute": True}}
    fields: dict = {}
    for w in words.split():
        if w.startswith("recompute(") or w.startswith("recompute-cheap"):
            fields.update(recompute=recompute_mask(w), selective=w == "recompute-cheap")
            continue
        if w not in known:
            raise ValueError(f"unknown memory saver {w!r} in {words!r}; known: {', '.join(known)}")
        fields.update(known[w])
    return Strategy(replicas=2 if fields.get("shard_optimizer") else 1, **fields)


def replicated_ops(graph: OpGraph, replicas: int, m: int = 1, buckets: int | None = None) -> int:
    """About the ops of ``replicas`` replicas of ``graph`` (marked), each in
    ``m`` slices: the copies plus the ring all-reduce of each gradient bucket
    (``2 (R - 1) + 1`` ops per replica and bucket: quadratic in ``R``).

    >>> g = OpGraph.from_edges({"a": 1.0, "b": 1.0}, [("a", "b", 8)])
    >>> replicated_ops(g, 500, buckets=1)   # 1000 copies, 499 500 ring ops
    500500
    """
    if buckets is None:
        buckets = len(gradient_buckets(graph)) if replicas > 1 else 0
    return replicas * graph.num_ops * m + buckets * replicas * (2 * replicas - 1)


@dataclass
class _Pool:
    """The candidates so far: the best (:func:`solver.common.rank`), every
    candidate's step, the skipped ones with why (``late``: those skipped for
    time, :meth:`_Search.fits`), the memory errors per ``M``."""

    best: Solved | None = None
    steps: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    late: set = field(default_factory=set)
    short: dict = field(default_factory=dict)   # M -> MicroBatchMemoryError

    def offer(self, name: str, plan: Plan, transformed: Transformed, strategy: Strategy) -> None:
        """Offer ``plan`` of ``transformed.graph`` as ``name`` (the transform kept)."""
        self.offer_solved(name, Solved(plan, transformed.graph, strategy, transformed))

    def offer_solved(self, name: str, r: Solved) -> None:
        """Offer a realised candidate as ``name``."""
        self.steps[name] = r.plan.makespan
        if self.best is None or rank(r.plan) < rank(self.best.plan):
            self.best = r


class _Pace:
    """What predicts a candidate's time: seconds per simulated op, and the
    fixed seconds per simulation of building the simulator's problem
    (quadratic in the devices: its routes). On the wall clock both come from
    a warm-up on the step, the op cost then from each candidate built. With a
    deterministic ``deadline`` the pace is :data:`DETERMINISTIC_SECONDS_PER_OP`,
    no fixed cost, and each candidate built is charged its predicted seconds on
    the work clock (as CP-SAT charges its deterministic time): the search stops
    building at the same candidate on every run, near the limit in wall time.

    >>> from pesto.deadline import Deadline
    >>> pace = _Pace(Deadline(1.0, deterministic=True))
    >>> pace.timed(lambda: 7, sims=2.0, ops=lambda out: 1000), round(pace.clock.elapsed(), 3)
    (7, 0.06)
    """

    def __init__(self, deadline: Deadline | None = None):
        self.clock = deadline if deadline is not None and deadline.deterministic else None
        self.per_op: float | None = DETERMINISTIC_SECONDS_PER_OP if self.clock is not None else None
        self.fixed = 0.0

    def warm_up(self, graph: OpGraph, cluster: Cluster) -> None:
        """Build the step's problem (timed: the fixed cost), then simulate the
        step on one device twice (the engine's compiled loops built, then
        timed: the op cost). Deterministic: nothing measured."""
        if not graph.num_ops or self.clock is not None:
            return
        dev = gpu_names(cluster)[0]
        try:
            t = time.perf_counter()
            Problem.of(graph, cluster)
            self.fixed = time.perf_counter() - t
            for order in (None, graph.topological_order()):
                t = time.perf_counter()
                finalize(graph, cluster, {n: dev for n in graph.names}, order=order, placer="warm-up", t0=t)
        except PestoError:   # an op without a kernel there: the first candidate measures instead
            return
        self.per_op = (time.perf_counter() - t) / graph.num_ops

    def predict(self, ops: float, sims: float) -> float | None:
        """Seconds of ``sims`` simulations of ``ops`` ops (None until measured)."""
        return None if self.per_op is None else sims * (self.per_op * ops + self.fixed)

    def timed(self, fn: Callable, sims: float, ops: Callable[[object], int], learn: bool = True):
        """``fn()``; on the wall clock its seconds per simulated op (``ops(result)``
        ops, ``sims`` simulations) kept (not with ``learn=False``: ``fn`` also ran a solve on
        its own grant), deterministic its predicted seconds charged.
        ``fn`` runs with the cyclic garbage collector paused, and what it made (a candidate
        the pool may keep: 100k ops, their plans) is then frozen out of the collector's walks
        (:func:`pesto.graph.gc_frozen`, :func:`solve_step`): walking it took a second per
        data-parallel candidate of GPT-1.3B."""
        t = time.perf_counter()
        with gc_paused():
            out = fn()
            gc.freeze()
        if self.clock is not None:
            self.clock.charge(self.predict(ops(out), sims))
            return out
        if not learn:   # its time is not the simulations' (a one-step solve on its own grant)
            return out
        per_sim = (time.perf_counter() - t) / max(sims, 1.0)
        self.per_op = max(per_sim - self.fixed, 0.0) / max(ops(out), 1) or self.per_op
        return out


@dataclass
class _Screened:
    """One count after screening: the transform whose graph its exact passes
    place (the step itself for ``M = 1``, else the split), the plans they
    start from, the best screened step (``inf`` when no kind applied), the
    GPipe/1F1B results, and those of every one-chunk schedule (ZB-H1, ZB-H2
    too: the slice model's hints), for a memory-bound step the strategies one
    of whose variants fits (their savers not built); ``weight_grads``: the
    split's rule (a joined candidate's when one was best: its split and plans)."""

    split: Transformed
    starts: list
    step: float
    pipes: list = field(default_factory=list)
    weight_grads: object = "separate"
    own: float = float("inf")   # the best fitting screened step on ``split.graph``
    hints: list = field(default_factory=list)
    fit: set = field(default_factory=set)   # memory-bound: plain strategies one of whose variants fits

    @property
    def graph(self) -> OpGraph:
        return self.split.graph


def _keep_start(s: _Screened, r: Solved) -> None:
    """A screened pipeline or free plan ``r`` of ``s``'s count: a start of its exact
    passes when it places ``s.graph``; when it places another graph (its
    weight gradients joined or summed in place: :meth:`_Search.joined`,
    :meth:`_Search.summed_in_place`, the ``free`` kind), fits memory, has no
    savers and beats every fitting plan of ``s.graph``, that graph becomes the
    count's (the exact passes place it) and ``r`` its start."""
    fits = r.plan.status != "infeasible"
    s.step = min(s.step, r.plan.makespan)
    if r.graph.names == s.graph.names:
        s.starts.append(r.plan)
        s.own = min(s.own, r.plan.makespan) if fits else s.own
    elif fits and not r.strategy.savers and r.plan.makespan < s.own:
        s.split, s.weight_grads, s.own, s.starts = r.transformed, r.strategy.weight_grads, r.plan.makespan, [r.plan]


class _Search:
    """The state of one search: the step, its marked form, the clock and the
    budget, the candidate pool, the pace (see :func:`solve_step`)."""

    def __init__(self, graph: OpGraph, cluster: Cluster, options: SolveOptions, deadline: Deadline):
        self.graph, self.cluster, self.options, self.deadline = graph, cluster, options, deadline
        self.marked = with_marks(graph)
        self.auto = options.micro_batches == "auto"
        self.say = options.progress or (lambda line: None)
        self.budget = Budget(deadline, PASSES, costs=COSTS)
        self.pool, self.pace = _Pool(), _Pace(deadline)
        self.pace.warm_up(self.marked, cluster)
        self.gpus = len(gpu_names(cluster))
        self.buckets = len(gradient_buckets(self.marked)) if self.gpus > 1 else 0
        self.acts = step_activations(self.marked)
        self.persistent = sum(op.persistent_bytes for op in self.marked.ops)
        #: what ZeRO shards of it: the optimizer state (levels 1-3), the parameters (level 3)
        self.state = sum(self.marked.op(n).persistent_bytes for n in optimizer_state(self.marked))
        self.params = sum(self.marked.op(n).persistent_bytes for n in parameters(self.marked))
        self.capacity = max((d.memory for d in cluster.devices if d.name in gpu_names(cluster)), default=0)
        #: the step's work over the GPUs (at speed 1), a least step of every plan
        self.work = self.marked.total_work(cluster.device(gpu_names(cluster)[0]).kind) / max(self.gpus, 1)
        self.tight = False   # memory-bound (set by run): more slices and leaner candidates first
        self.joinable = frozenset(joinable_ops(self.marked))   # weight gradients the front end can join
        self._wg_costs: dict[int, tuple] = {}   # weight_grad_costs per count (:meth:`wg_costs`)
        self.one_device: float | None = None   # a recipe's one-device step (SolveLog.one_device), for any winner
        self.shardable = shardable(self.marked)   # the front end builds a sharded optimizer (ZeRO) for it
        self._acts_rc: dict = {}   # selective -> the recomputed step's activations, built when first asked
        self.pending: list = []   # (kind, strategy, plan) whose partial recomputation was skipped for time
        self.window: Deadline = deadline  # what the running pass may spend
        # deterministic: one CP-SAT worker unless told (its deterministic time then tracks the wall's,
        # so the wall-clock safety net of :func:`solver.cpsat_solve.deterministic_parameters` never cuts it)
        self.slice_workers = options.workers or (1 if options.deterministic else None)

    # -- helpers ---------------------------------------------------------------------------
    def stop_if_interrupted(self) -> None:
        if self.deadline.interrupted:
            raise Stopped(self.deadline.reason)

    def fits(self, name: str, ops: int, sims: float, *, quiet: bool = False) -> bool:
        """Whether a candidate of about ``ops`` ops (``sims`` simulations) may be
        built now: not when interrupted (raises :class:`Stopped`), and not when
        predicted past the running pass's window (:class:`_Pace`; skipped and
        named). Without a plan yet, the exact passes still make one."""
        self.stop_if_interrupted()
        need = self.pace.predict(ops, sims)
        if need is None or need <= self.window.left():
            return True
        if quiet:
            return False
        self.pool.skipped[name] = f"not built: about {need:.1f} s for {ops} ops, {self.window.left():.1f} s left"
        self.pool.late.add(name)
        self.say(f"{name}: skipped (time limit)")
        return False

    def spread(self, replicas: int, m: int, held: int = 1, recomputed: bool = False,
               selective: bool = False, shard: int = 0) -> tuple[int, int]:
        """``(bytes, k)``: a replica's weights and optimizer state plus ``held``
        slices' activations at the loss (:func:`pesto.memory.step_activations`:
        the batched bytes of a slice, ``1 / (replicas m)`` of the batch, the
        shared ones once), spread evenly over
        its ``k = GPUs / replicas`` GPUs; ``recomputed``: the activations of the
        recomputed step (:func:`pesto.step.recompute`, :meth:`recomputed_acts`; ``selective``:
        each block's cheap ops only); ``shard``: ZeRO's level, the optimizer state (and at
        level 3 the parameters and the shared bytes, their reads) ``1 / replicas`` per replica.
        The one rule behind :meth:`floor` (``held = 1``: every plan holds it) and
        :meth:`predicted_memory` (the slices a schedule holds at once)."""
        k = max(1, self.gpus // replicas)
        acts = self.recomputed_acts(selective) if recomputed else self.acts
        if acts is None:
            return 0, k
        # a slice: 1/(R M) of the batch; ZeRO-3: the once-per-step bytes (the weights' reads) read a shard
        shared = acts.shared if shard < 3 else -(-acts.shared // max(1, replicas))
        per_slice = held * -(-acts.batched // max(1, replicas * m)) + shared
        sharded = (self.state if shard else 0) + (self.params if shard == 3 else 0)
        persistent = self.persistent - sharded + -(-sharded // max(1, replicas))
        return -(-(persistent + per_slice) // k), k

    def recomputed_acts(self, selective: bool = False):
        """:func:`pesto.memory.step_activations` of the step with every layer
        block recomputed (:func:`pesto.step.recompute`; ``selective``: their
        cheap ops only, :func:`~solver.parallel.realise.with_savers`; built once,
        a fraction of a second on GPT-2.7B); the step's own when it has no blocks."""
        if selective not in self._acts_rc:
            try:
                done = with_savers(self.marked, Strategy(recompute=True, selective=selective))
                self._acts_rc[selective] = step_activations(done.graph)
            except PestoError:   # no layer blocks: nothing recomputed
                self._acts_rc[selective] = self.acts
        return self._acts_rc[selective]

    def floor(self, replicas: int, m: int) -> tuple[int, int]:
        """``(bytes, k)``: the least a GPU holds in every plan of ``replicas``
        replicas of ``m`` slices, each replica on ``k = GPUs / replicas`` GPUs:
        a replica's weights and optimizer state and one slice's activations at
        its loss (held by every plan) spread evenly over its GPUs
        (:meth:`spread`; 0 when the step has no phase marks)."""
        return self.spread(replicas, m)

    def short_of_memory(self, name: str, replicas: int, m: int, strategy: Strategy | None = None) -> bool:
        """Whether :meth:`floor` rules the candidate out (more than the largest
        GPU): skipped and named. A strategy with a memory saver is not judged by it."""
        need, k = self.floor(replicas, m)
        if not self.capacity or need <= self.capacity or (strategy is not None and (
                strategy.recompute or strategy.shard_optimizer)):
            return False
        self.pool.skipped[name] = (
            f"needs at least {fmt_bytes(need)} per GPU, the largest holds {fmt_bytes(self.capacity)}: "
            f"weights and optimizer state ({fmt_bytes(self.persistent)}) and one slice's activations at the loss "
            f"({fmt_bytes(self.acts.per_slice(replicas * m))}) over {k} GPU{'s' if k > 1 else ''}")
        self.say(f"{name}: skipped (memory)")
        return True

    def too_large(self, name: str, replicas: int, m: int) -> bool:
        """A replicated candidate above :data:`DP_MAX_OPS` or one the batch
        cannot share (:func:`check_batch`): skipped and named."""
        ops = replicated_ops(self.marked, replicas, m, self.buckets)
        why = check_batch(self.options.batch_size, replicas, m) or (
            f"{replicas} replicas x {m} slices: about {ops} ops with the all-reduce rings, "
            f"more than {DP_MAX_OPS}" if ops > DP_MAX_OPS else "")
        if why:
            self.pool.skipped[name] = why
        return bool(why)

    # -- the passes ------------------------------------------------------------------------
    def run(self) -> None:
        """Screening, then the exact passes (raises :class:`Stopped` on an interrupt)."""
        counts = self.counts()
        self.note_hint()
        if self.auto:
            self.first_plan()
        # memory-bound (not even one slice fits a GPU with the whole step): more slices first, they fit
        # sooner, and screening gets TIGHT_SCREEN_SHARE of the time (the exact passes rarely fit there)
        self.tight = self.floor(1, 1)[0] > self.capacity > 0
        grant = self.budget.grant("screening", TIGHT_SCREEN_SHARE * self.budget.left() if self.tight else None)
        if isinstance(grant, Skip):
            self.stop_if_interrupted()
            grant = self.deadline   # expired: the first plan of a fixed M is still made
        self.window = grant
        self.say(f"screening: M in {sorted(counts)}, {len(KINDS)} kinds ({grant.left():.1f} s)")
        screened = {}
        for m in sorted(counts, reverse=self.tight):
            s = self.screen(m)
            if s is not None:
                screened[m] = s
            if self.tight and self.pending:   # refine a plan that fits before fewer slices: on the whole limit
                self.refine(self.deadline)
        if not self.tight:   # a memory-bound step screened them with the rest
            self.screen_late(screened)
        self.keep_bound()
        rest = self.tight and not self.deadline.deterministic
        if rest and not self.have_fit():   # the exact passes place the split as it is: it did not fit
            self.screen_rest(screened)
        self.exact_all(screened)
        if rest:
            self.screen_rest(screened)

    def keep_bound(self) -> None:
        """Keep back the time :meth:`finish` predicts the best plan's bound takes
        (``budget.wants["bound"]``), from the pace now: set after screening and
        again before the best count's exact pass continues (NMT-4x1024: kept at
        7 s after screening, predicted at 9.3 s when the search ended with 8.2 s
        left, so the bound was skipped and those 8.2 s went unused)."""
        if self.pool.best is not None:
            self.budget.wants["bound"] = self.pace.predict(self.pool.best.graph.num_ops, SIMS["bound"]) or 0.0

    def note_hint(self) -> None:
        """A hint plan (``options.hint``) of the step as given starts the
        ``M = 1`` recipe only: with no ``M = 1`` in the search it is unused,
        and ``plan.log.skipped["hint"]`` says so (sweep 4, ``M_api_hint_with_mb``)."""
        hint = self.options.hint
        if isinstance(hint, Plan) and 1 not in micro_batch_counts(self.options.micro_batches, self.options.batch_size):
            self.pool.skipped["hint"] = (f"a plan of the step as given; micro_batches={self.options.micro_batches} "
                                         f"places the split step, so it starts nothing")

    def counts(self) -> list[int]:
        """The counts to try (:func:`micro_batch_counts`); one whose split would
        exceed :data:`SPLIT_MAX_OPS` is refused (fixed) or skipped ("auto")."""
        out = []
        for m in micro_batch_counts(self.options.micro_batches, self.options.batch_size):
            ops = self.marked.num_ops * m
            if ops > SPLIT_MAX_OPS:
                why = f"M={m}: the split step would have about {ops} ops, more than {SPLIT_MAX_OPS}"
                if not self.auto:
                    raise MicroBatchError(f"{why}; choose fewer micro-batches", culprit=m)
                self.pool.skipped[f"M={m}"] = why
                continue
            out.append(m)
        return out

    def first_plan(self) -> None:
        """``"auto"``: the data-parallel plan of the step, not split, and its
        ZeRO-1 variant (each replica updates ``1 / R`` of the weights: faster
        where the update weighs, as memory savers are screened otherwise only
        when memory is short); over memory, its savers in turn; under the memory
        floor, its leanest saver forecast to fit (:meth:`leanest_data_parallel`)."""
        name = "data-parallel"
        if self.gpus < 2 or self.too_large(name, self.gpus, 1):
            self.say(f"{name}: skipped ({self.pool.skipped.get(name, 'one GPU')})")
            return
        if self.short_of_memory(name, self.gpus, 1):
            self.say(f"{name}: skipped ({self.pool.skipped[name]})")
            self.leanest_data_parallel()
            return
        if not self.fits(name, replicated_ops(self.marked, self.gpus, 1, self.buckets), SIMS[name]):
            return
        try:
            dp = self.pace.timed(lambda: realise(self.marked, self.cluster, Strategy(replicas=self.gpus)),
                                 SIMS[name], lambda r: r.graph.num_ops)
        except (PestoError, ValueError) as exc:
            self.pool.skipped[name] = str(exc)
            self.say(f"{name}: skipped ({exc})")
            return
        self.pool.offer_solved(name, dp)
        self.say(f"data-parallel: step {dp.plan.makespan / 1000:.3f} ms")
        self.follow(KINDS["data-parallel"], dp.strategy, dp)

    def leanest_data_parallel(self) -> None:
        """``"auto"``, the step's data parallelism under its memory floor (which counts the
        weights and optimizer state whole): its savers (:func:`~solver.parallel.kinds.savers`,
        cheapest first) that the forecast (:meth:`predicted_memory`, ZeRO's shards counted)
        says fit, in turn until one fits (GPT-2.7B on 8 V100-16GB: ZeRO-3 with selective
        recomputation, 11.9 GiB per GPU), its blocks' levels then lowered (:meth:`partial`);
        then, per less sharded level, its leanest saver (every op recomputed) forecast to fit,
        its levels lowered: fewer shards can beat more with more recomputed (GPT-1.3B: ZeRO-2
        recomputing every op peaks at 13.2 GiB, some blocks' cheap ops only fit, 1595.8 ms)."""
        kind, ladder = KINDS["data-parallel"], self.savers(Strategy(replicas=self.gpus))
        fit = next((s for s in ladder if self._fits_then_lowered(kind, s)), None)
        lean: dict = {}
        for s in ladder:
            lean[s.shard_optimizer] = s   # cheapest first: the last of a level is its leanest
        for level in sorted(lean):
            s = lean[level]
            if fit is not None and level >= fit.shard_optimizer:
                return
            if s.recompute and s != fit and self._fits_then_lowered(kind, s):
                return

    def _fits_then_lowered(self, kind: Kind, s: Strategy) -> bool:
        """Whether ``s``, forecast to fit, was built and fits; then its levels lowered (:meth:`partial`).
        While no plan that fits exists, ``s`` is built whatever the clock: the search returns a
        plan that fits memory when one can be made (no exact pass makes one for a step under its
        memory floor), later candidates are skipped for time."""
        if self.predicted_memory(s) > self.capacity:
            return False
        r = self.realised(kind, s, must=not self.have_fit())
        if r is None or r.plan.status == "infeasible":
            return False
        self.partial(kind, s, r)
        return True

    def screen(self, m: int) -> _Screened | None:
        """Screen ``m`` (module doc): its split, memory floor and kinds."""
        self.stop_if_interrupted()
        if self.short_of_memory(f"M={m}", 1, m):
            self.pool.short.setdefault(m, MicroBatchMemoryError(f"M={m}: {self.pool.skipped[f'M={m}']}", m,
                                                                self.floor(1, m)[0], self.capacity,
                                                                culprit="persistent bytes and activations"))
            self.say(f"micro-batches {m}: the memory savers only")
            if not self.screen_savers(m) and not self.auto:
                raise self.pool.short[m]
            return None
        if m > 1 and not self.fits(f"M={m}", self.marked.num_ops * m, 1.0):
            return None
        split = identity(self.marked) if m == 1 else split_step(self.marked, m)
        short = memory_short(self.marked, self.cluster, m, split=split.graph)
        if short is not None:
            self.pool.short[m] = short
            self.pool.skipped[f"M={m}"] = str(short)
            self.say(f"micro-batches {m}: {short}; the memory savers only")
            if not self.screen_savers(m) and not self.auto:
                raise short
            return None
        s = _Screened(split, [], float("inf"))
        if self.tight:   # memory-bound: every kind and saver at once, in tight_order
            self.screen_tight(m, s)
            return s
        for kind, strategy in ((k, st) for k in KINDS.values() if not k.fill_only
                               for st in k.candidates(self.marked, self.cluster, m)):
            self.screen_one(kind, strategy, s)
        return s

    def predicted_memory(self, strategy: Strategy) -> int:
        """A rough per-GPU peak of ``strategy`` (an ordering key and a
        forecast, not a bound): :meth:`spread` of the slices the first stage
        holds at once (:func:`solver.parallel.cut.in_flight` of its schedule
        over its chunks per device; one slice without a pipeline schedule), of the recomputed step's
        activations for a strategy with ``recompute``, ZeRO's shards for ``shard_optimizer``. It errs high (stage 0
        holds the most slices; the cutter gives it fewer layers): GPT-2.7B's
        1F1B M=16 on 8 V100s is forecast at 21.8 GiB and peaks at 17.4 GiB."""
        k = max(1, self.gpus // strategy.replicas)
        held = 1
        if strategy.schedule in SCHEDULES:   # a chunk holds 1 / chunks of a stage's activations
            try:
                held = -(-in_flight(strategy.schedule, 0, min(strategy.stages, k), strategy.micro_batches)
                         // SCHEDULES[strategy.schedule].chunks)
            except ValueError:   # a count the schedule refuses: as many as a pipeline's stages
                held = min(strategy.stages, k)
        return self.spread(strategy.replicas, strategy.micro_batches, held, bool(strategy.recompute),
                           strategy.selective, strategy.shard_optimizer)[0]

    def screen_tight(self, m: int, s: _Screened) -> None:
        """A memory-bound step's candidates of ``m`` in :meth:`tight_order`, but
        those already built (a second call: :meth:`screen_rest`) and the savers
        of a strategy one of whose variants fits (``s.fit``)."""
        for kind, strategy in self.tight_order(m):
            plain = replace(strategy, recompute=False, shard_optimizer=0, selective=False)
            name = kind.label(strategy) + (f" {strategy.savers}" if strategy.savers else "")
            if plain not in s.fit and name not in self.pool.steps:
                r = self.screen_one(kind, strategy, s, chase=False)
                if r is not None and r.plan.status != "infeasible":
                    s.fit.add(plain)
                    p = self.partial(kind, strategy, r)
                    s.step = min(s.step, p.plan.makespan if p is not None else s.step)

    def screen_rest(self, screened: Mapping[int, _Screened]) -> None:
        """A memory-bound step: the time the exact passes left (they skip a split
        whose first plan outlasts its grant, :meth:`outlasts`), or before them
        while no plan fits memory, refines the plans whose partial recomputation
        was skipped for time (:meth:`partial`), then screens the counts'
        candidates not built yet, most slices first, less the bound's time when it fits in what is left
        (GPT-2.7B on a busy machine: 21 s were left unused, the bound predicted
        at 36 s)."""
        dl = self.deadline
        keep = self.budget.wants.get("bound", 0.0)
        self.window = dl.sub(max(0.0, dl.left() - (keep if keep <= dl.left() else 0.0)))
        self.refine(self.window)   # a plan that fits, refined first
        for m in sorted(screened, reverse=True):
            if self.window.left() <= 0:
                return
            self.screen_tight(m, screened[m])

    def tight_order(self, m: int) -> list[tuple[Kind, Strategy]]:
        """A memory-bound step's candidates of ``m`` slices in screening order
        (every kind at once, the zero-bubble schedules included): those
        :meth:`predicted_memory` forecasts to fit first, the plain ones before
        their savers (ZeRO and selective recomputation, the cheaper in time,
        before full recomputation), the leanest first (1F1B, ZB-H1 and ZB-V before GPipe),
        of equal forecasts the cheapest to build first (:attr:`Kind.sims`:
        ZB-H1's one stage split before 1F1B's four); then those forecast not
        to fit. A candidate's savers (:func:`~solver.parallel.kinds.savers`)
        are candidates of their own here, so a plan that recomputation makes
        fit is screened as soon as the forecast says only it fits (GPT-2.7B on
        8 V100s: ZB-H1 M=16 recompute first, not after the plain 1F1B's
        17.4 GiB plan, whose four stage splits took 38 s of a busy machine),
        and the first count screened (the most slices) may be the only one
        with time. The kinds with a one-step solve or the list placer are left
        out: they have no savers (:meth:`no_solve_gain`)."""
        pairs = [(kind, x) for kind in KINDS.values() if not (kind.solves or kind.lists)   # no savers (no_solve_gain)
                 for st in kind.candidates(self.marked, self.cluster, m) for x in (st, *self.savers(st))]
        cost = [0 if not st.savers else 2 if st.recompute and not st.selective else 1 for _, st in pairs]
        keyed = [((self.predicted_memory(st) > self.capacity, cost[n], self.predicted_memory(st),
                   kind.sims), n) for n, (kind, st) in enumerate(pairs)]
        return [pairs[n] for _, n in sorted(keyed)]

    def screen_kind(self, kind: Kind, s: _Screened, m: int) -> None:
        """Every candidate of ``kind`` for ``m`` slices; its pipelines kept in ``s``."""
        strategies = kind.candidates(self.marked, self.cluster, m)
        if kind.fill_only and strategies and self.no_gain(kind, s, m):
            return
        for strategy in strategies:
            self.screen_one(kind, strategy, s)

    def screen_one(self, kind: Kind, strategy: Strategy, s: _Screened, chase: bool = True) -> Solved | None:
        """One candidate (``chase``: and its savers when it does not fit,
        :meth:`candidate`; else alone, :meth:`realised`); a pipeline's or a free
        placement's (one replica) step kept in ``s``, and without savers its plan (a start of the exact stages,
        which place the split without recomputation; a slice model hint when
        its schedule is one the slice grid runs: one chunk, the zero-bubble
        ones too since its grid splits F, B and W) and its twins, joined
        (:meth:`joined`) and summed in place (:meth:`summed_in_place`): a
        GPipe/1F1B twin's step is one :meth:`no_gain` reads too."""
        r = self.candidate(kind, strategy) if chase else self.realised(kind, strategy)
        if r is None or r.strategy.replicas != 1 or r.strategy.schedule not in (*SCHEDULES, "free"):
            return r
        if r.strategy.savers:   # it places the recomputed split, not the one the exact passes place
            s.step = min(s.step, r.plan.makespan)
            return r
        sch = SCHEDULES.get(r.strategy.schedule)
        one = sch is not None and sch.chunks == 1   # a free placement: neither a hint nor a pipeline
        if one:
            s.hints.append(r.detail)
            if not sch.split_backward:
                s.pipes.append(r.detail)
        for x in (r, self.joined(kind, strategy, r), *self.summed_in_place(kind, strategy, r)):
            if x is not None:
                _keep_start(s, x)
                if x is not r and one and not sch.split_backward:   # what no_gain reads
                    s.pipes.append(x.detail)
        return r

    def joined(self, kind: Kind, strategy: Strategy, r: Solved) -> Solved | None:
        """``strategy`` (a pipeline or free placement of one replica, realised as ``r`` with
        ``"separate"`` weight gradients) with its joinable weight gradients
        (:func:`pesto.step.marks.joinable_ops`) run whole, where that does
        less work: all of them, or when that plan does not fit memory and
        ``r`` does, those whose held bytes (:class:`pesto.step.slicing.WeightGradCost`
        ``whole_bytes``) fit what ``r`` leaves free on their GPU, most time
        saved first. Offered as its own candidate (``"zb-h1 M=8 whole(4)"``);
        None when nothing can be joined."""
        m = strategy.micro_batches
        if not self.joinable or m < 2 or strategy.weight_grads != "separate" or r.strategy.replicas != 1:
            return None
        costs = [c for c in self.wg_costs(m) if c.op in self.joinable
                 and c.whole_us is not None and c.whole_us < c.separate_us]
        if not costs:
            return None
        w = self.realised(kind, replace(strategy, weight_grads={c.op: "whole" for c in costs}))
        if w is None or w.plan.status != "infeasible" or r.plan.status == "infeasible":
            return w
        free = {d: self.cluster.device(d).memory - used for d, used in r.plan.peak_memory.items()}
        chosen = {}
        for c in sorted(costs, key=lambda c: (c.whole_us - c.separate_us, c.op)):
            d = r.plan.placement.get(copy_name(c.op, 0))
            if d is not None and c.whole_bytes <= free.get(d, 0):
                free[d] -= c.whole_bytes
                chosen[c.op] = "whole"
        if not chosen or len(chosen) == len(costs):
            return w
        part = self.realised(kind, replace(strategy, weight_grads=chosen))
        return part if part is not None and part.plan.status != "infeasible" else w

    def wg_costs(self, m: int) -> tuple:
        """:func:`pesto.step.slicing.weight_grad_costs` of the step at ``m`` slices on the
        parallel placers' devices' kind (kept per count)."""
        if m not in self._wg_costs:
            kind = self.cluster.device(gpu_names(self.cluster)[0]).kind
            self._wg_costs[m] = weight_grad_costs(self.marked, m, kind=kind)
        return self._wg_costs[m]

    def summed_in_place(self, kind: Kind, strategy: Strategy, r: Solved) -> list[Solved]:
        """``strategy`` (a pipeline or free placement of one replica, realised as ``r`` with
        ``"separate"`` weight gradients) with its weight gradients summed in
        place (``weight_grads="accumulate"``, :func:`pesto.step.split`: the
        ``M - 1`` accumulate ops per gradient gone, the copies of one op
        chained), every one where that does less work
        (``"zb-h2 M=8 accumulate(4)"``); and, where the front end can join
        some (:func:`pesto.step.marks.joinable_ops`) and the in-place plan
        fits memory, the mix of :func:`pesto.step.slicing.choose_weight_grads`:
        whole where it does less work and its held bytes
        (``WeightGradCost.whole_bytes``) fit what the in-place plan leaves free
        on its GPU (most time saved first), else in place
        (``"1f1b M=8 whole(2) accumulate(2)"``). Each its own candidate; []
        when nothing is summed in place."""
        m = strategy.micro_batches
        if m < 2 or strategy.weight_grads != "separate" or r.strategy.replicas != 1:
            return []
        costs = [c for c in self.wg_costs(m) if c.accumulate_us < c.separate_us]
        a = self.realised(kind, replace(strategy, weight_grads={c.op: "accumulate" for c in costs})) \
            if costs else None
        if a is None or a.plan.status == "infeasible" or not self.joinable:
            return [a] if a is not None else []
        free = {d: self.cluster.device(d).memory - used for d, used in a.plan.peak_memory.items()}
        chosen = {c.op: "accumulate" for c in costs}
        for c in sorted((c for c in costs if c.op in self.joinable), key=lambda c: ((c.whole_us or c.accumulate_us) - c.accumulate_us, c.op)):
            d = a.plan.placement.get(copy_name(c.op, 0))
            if d is not None and choose_weight_grads([c], whole_bytes=free.get(d, 0))[c.op] == "whole":
                free[d] -= c.whole_bytes
                chosen[c.op] = "whole"
        if "whole" not in chosen.values():
            return [a]
        return [a, *filter(None, [self.realised(kind, replace(strategy, weight_grads=chosen))])]

    def screen_late(self, screened: Mapping[int, _Screened]) -> None:
        """The ``fill_only`` kinds (interleaved 1F1B, the zero-bubble
        schedules), after every count's other kinds, on :data:`LATE_SHARE` of
        the screening time left (the exact passes keep the rest): for the count
        whose pipelines did best; the other counts named in
        ``plan.log.skipped`` (``"zero-bubble M=4"``)."""
        ranked = sorted((m for m, s in screened.items() if s.pipes), key=lambda m: (screened[m].step, m))
        outer, self.window = self.window, self.window.sub(LATE_SHARE * self.window.left())
        try:
            for k, m in enumerate(ranked):
                for kind in (x for x in KINDS.values() if x.fill_only):
                    if k == 0:
                        self.screen_kind(kind, screened[m], m)
                    elif kind.candidates(self.marked, self.cluster, m):
                        self.pool.skipped[f"{kind.name} M={m}"] = (f"not built: screened for M={ranked[0]} only, "
                                                                   f"the count whose GPipe/1F1B plans were best")
        finally:
            self.window = outer

    def no_gain(self, kind: Kind, s: _Screened, m: int) -> bool:
        """Whether a ``fill_only`` kind cannot beat the best plan so far: the
        count's best GPipe/1F1B step (its twins' included) over ``k`` stages, less its whole fill and
        drain (``M / (M + k - 1)`` of it), is no better. Its candidates are then
        skipped, named ``"zero-bubble M=8"`` in ``plan.log.skipped``."""
        best = self.pool.best
        if best is None or not s.pipes:
            return False
        floor = min(p.plan.makespan * m / (m + p.stages - 1) for p in s.pipes)
        if floor < best.plan.makespan:
            return False
        self.pool.skipped[f"{kind.name} M={m}"] = (
            f"not built: the best GPipe/1F1B step of M={m} less its fill and drain, "
            f"{floor / 1000:.3f} ms, is no better than the best plan's {best.plan.makespan / 1000:.3f} ms")
        self.say(f"{kind.name} M={m}: skipped (no gain over the best plan possible)")
        return True
    def screen_savers(self, m: int) -> bool:
        """``m`` slices fit no device as the step is (:func:`memory_short`): each
        kind's candidates of ``m`` with their savers only (the bound counts a
        colocation unit's persistent bytes whole, which a sharded optimizer
        splits); whether one fits memory."""
        fits = False
        for kind in KINDS.values():
            for strategy in kind.candidates(self.marked, self.cluster, m):
                for s in self.savers(strategy):
                    r = self.realised(kind, s)
                    if r is not None and r.plan.status != "infeasible":
                        fits = True
                        self.partial(kind, s, r)
                        break
        return fits

    def candidate(self, kind: Kind, strategy: Strategy) -> Solved | None:
        """Realise a screening candidate (:meth:`realised`); when its plan does not
        fit memory, its savers (:func:`solver.parallel.kinds.savers`) in turn until
        one fits, each a candidate of its own. The candidate's own result (None
        when skipped or failed)."""
        r = self.realised(kind, strategy)
        if r is not None:
            self.follow(kind, strategy, r)
        return r

    def follow(self, kind: Kind, strategy: Strategy, r: Solved) -> None:
        """After ``strategy``'s plan ``r``: over memory, its savers in turn
        (:meth:`save`); a plain data-parallel plan that fits, its ZeRO-1 variant
        too (each replica updates ``1 / R`` of the weights: faster where the
        update weighs; Transformer-6 on 4 PCIe GPUs at M=2: 45.2 against 46.1 ms);
        a plain data-parallel plan of ``M > 1`` slices (gradient accumulation),
        its weight gradients summed in place too (``"data-parallel R=4 M=2
        accumulate"``: no accumulate ops, :func:`pesto.step.split`), and when
        that one fits and is the faster, ZeRO-1 and the bucket twin below build
        on it instead (Transformer-6 on 4 PCIe GPUs at M=2: ZeRO-1 in 12.5 MiB
        buckets 43.9 ms in place against 44.2 separate); the better
        of a fitting data-parallel plan and its ZeRO-1 variant, when within
        :data:`BUCKET_TWIN_RANGE` of the best plan, in gradient buckets of half
        DDP's size too (:data:`BUCKET_TWIN`: its last bucket, all-reduced after
        the backward pass, is smaller; Transformer-6 on 4 PCIe GPUs at M=2:
        44.2 against 45.2 ms)."""
        s = strategy
        dp = s.replicas > 1 and s.stages == 1 and s.schedule == "none" and not s.savers
        summed = replace(s, weight_grads="accumulate")
        rs = self.realised(kind, summed) if dp and s.micro_batches > 1 and s.weight_grads == "separate" else None
        if r.plan.status == "infeasible":
            self.save(kind, s)
            return
        if not dp:
            return
        if rs is not None and rs.plan.status != "infeasible" and rank(rs.plan) < rank(r.plan):
            s, r = summed, rs   # the faster split is the one ZeRO-1 and the bucket twin build on
        better = (s, r)
        if self.shardable:
            z = replace(s, shard_optimizer=1)
            rz = self.realised(kind, z)
            better = min(better, (z, rz), key=lambda x: rank(x[1].plan) if x[1] is not None else (9,))
        s, r = better
        best = self.pool.best
        if s.bucket_bytes == BUCKET_BYTES and (best is None or r.plan.makespan <= (1 + BUCKET_TWIN_RANGE)
                                                * best.plan.makespan):
            self.realised(kind, replace(s, bucket_bytes=BUCKET_TWIN))

    def in_place_of(self, strategy: Strategy) -> tuple:
        """The step's weight-gradient ops ``strategy`` sums in place (:attr:`SolveLog.in_place`):
        its mapping's, or every one for the rule ``"accumulate"`` given for all."""
        if strategy.weight_grads == "accumulate":
            return weight_grad_ops(self.marked)
        return strategy.in_place

    def savers(self, strategy: Strategy) -> list[Strategy]:
        """:func:`~solver.parallel.kinds.savers` of ``strategy``, those with a
        sharded optimizer only when the front end builds one (:func:`pesto.step.marks.shardable`)."""
        return [x for x in savers(strategy) if self.shardable or not x.shard_optimizer]

    def save(self, kind: Kind, strategy: Strategy) -> None:
        """Screen the savers of ``strategy`` (its plan did not fit memory) until one fits
        (recomputation that fits: then only the blocks it needs, :meth:`partial`)."""
        for s in self.savers(strategy):
            r = self.realised(kind, s)
            if r is not None and r.plan.status != "infeasible":
                self.partial(kind, s, r)
                return

    def partial(self, kind: Kind, strategy: Strategy, r: Solved) -> Solved | None:
        """After ``strategy`` (every layer block recomputed at one level: every op, or
        its cheap ops; any kind but the slice model) fits as ``r``: the same with each
        block's level lowered where its GPU has room (every op -> cheap ops -> none;
        :func:`solver.parallel.partial.next_levels`: a pipeline stage holding few slices
        keeps its activations, data parallelism a count of blocks), simulated and
        asked again, at most :data:`PARTIAL_TRIES` plans, each a candidate of its own
        (``"zb-h1 M=16 recompute-cheap(20/32:0-11,16-18,21,22,25,26,29)"``,
        ``"data-parallel M=1 ZeRO-2 recompute(4/24:0-3)+cheap(20/24:4-23)"``). The
        fastest that fits, None when none does or none was built (kept in
        ``pending`` when skipped for time: :meth:`screen_rest` tries again)."""
        if (r.plan.status == "infeasible" or strategy.recompute is not True or r.transformed is None
                or strategy.schedule in ("slice", "free") or not r.plan.peak_memory or self.acts is None):
            return None
        blocks = layer_blocks(self.marked)
        top = "cheap" if strategy.selective else "full"
        savings = {lv: block_savings(self.marked, blocks, max(0, self.acts.batched
                                                              - self.recomputed_acts(lv == "cheap").batched))
                   for lv in ("cheap", "full")}
        if len(blocks) < 2 or not sum(savings[top]):
            return None
        given = {}
        if strategy.replicas == 1 and strategy.schedule in SCHEDULES and SCHEDULES[strategy.schedule].chunks == 1:
            # r's cut kept: less recomputation, less work per stage
            gpus = gpu_names(self.cluster)
            given["stage_of"] = {r.transformed.origin[n].op: gpus.index(d) for n, d in r.plan.placement.items()
                                 if r.transformed.origin[n].role == "copy" and d in gpus}
        levels, x, best, seen = (top,) * len(blocks), r, None, set()
        for _ in range(PARTIAL_TRIES):
            seen.add(levels)
            memory = {d: self.cluster.device(d).memory for d in x.plan.peak_memory}
            where = held_where(strategy, x.plan.placement, x.transformed.origin, blocks, x.plan.peak_memory, memory)
            levels = next_levels(levels, savings, where, top)
            lower = replace(strategy, recompute=tuple(_LEVEL_RC[lv] for lv in levels), selective=False)
            if levels in seen or not lower.recompute or self.name_of(kind, lower) in self.pool.steps:
                break   # nothing to spare, the plain strategy, or one screened as such
            x = self.realised(kind, lower, **given)
            if x is None:   # skipped for time: screen_rest tries again on the time the exact passes leave
                if self.name_of(kind, lower) in self.pool.late:
                    self.pending.append((kind, strategy, r))
                break
            if x.plan.status != "infeasible" and (best is None or rank(x.plan) < rank(best.plan)):
                best = x
        return best

    def have_fit(self) -> bool:
        """Whether the pool holds a plan that fits memory."""
        return self.pool.best is not None and self.pool.best.plan.status != "infeasible"

    def realised(self, kind: Kind, strategy: Strategy, *, must: bool = False, **given) -> Solved | None:
        """Realise a candidate unless it is too large (:func:`replicated_ops`
        above :data:`DP_MAX_OPS`, or a batch it cannot share) or predicted not to fit
        (:meth:`fits`; ``must``: built whatever the clock, unless interrupted); timed
        (:class:`_Pace`) and offered as its kind's label
        (and its savers, :attr:`Strategy.savers`). None when skipped or failed
        (named in ``plan.log.skipped``). ``given``: more arguments of ``kind.realise``
        (:meth:`partial`'s stage cut)."""
        name, m, replicas = self.name_of(kind, strategy), strategy.micro_batches, strategy.replicas
        ops = replicated_ops(self.marked, replicas, m, self.buckets)
        if replicas > 1 and self.too_large(name, replicas, m) or self.short_of_memory(name, replicas, m, strategy):
            return None
        sims, tries = kind.sims, kind.tries or SCREEN_CANDIDATES
        if must:
            self.stop_if_interrupted()
        elif not self.fits(name, ops, sims, quiet=kind.cheap is not None):   # else one stage split only
            if kind.cheap is None or not self.fits(name, ops, kind.cheap):
                return None
            sims, tries = kind.cheap, 1
        if (kind.solves or kind.lists) and self.no_solve_gain(name):
            return None
        if kind.lists:
            given["place"] = self.list_placer
        if kind.solves:   # its one-step solve on a share of the pass's time left
            seconds = kind.solves * self.window.left()
            if not self.deadline.deterministic and seconds < MIN_SECONDS:
                self.pool.skipped[name] = f"not built: {max(seconds, 0.0):.2f} s for its one-step solve"
                self.pool.late.add(name)
                return None
            given["place"] = self.one_step(kind.solves)
        try:
            clock = {} if self.deadline.deterministic else {"deadline": self.deadline}   # past it: the first fit
            r = self.pace.timed(lambda: kind.realise(self.marked, self.cluster, strategy, candidates=tries,
                                                     **clock, **given), sims, lambda r: r.graph.num_ops,
                                learn=not kind.solves)
        except (PestoError, ValueError) as exc:  # e.g. no forward/backward stage split: Pesto alone
            self.pool.skipped[name] = str(exc)
            return None
        self.pool.offer_solved(name, r)
        self.pool.skipped.pop(name, None)   # skipped for time once, built on a later pass
        self.pool.late.discard(name)
        self.say(f"{name}: step {r.plan.makespan / 1000:.3f} ms")
        return r

    def no_solve_gain(self, name: str) -> bool:
        """Whether a kind with a one-step solve or the list placer (:attr:`~solver.parallel.kinds.Kind.solves`,
        ``lists``) is not worth its time: the best plan so far fits memory and is within :data:`SOLVE_GAIN`
        of the step's work over the GPUs, a least step of every plan that it, as every plan
        of the step, cannot beat; or the step is memory-bound (:meth:`run`'s ``tight``: one
        slice of the whole step fits no GPU; the kind has no savers); skipped and named
        (Transformer-6 on 4 PCIe GPUs: data parallelism 1.19x its work over the GPUs, its
        screening time kept for the split counts)."""
        best = self.pool.best
        if self.tight:   # its solve's share is the savers' screening time (GPT on 8 V100s)
            self.pool.skipped[name] = "not built: a memory-bound step screens the kinds with memory savers"
        elif best is None or best.plan.status == "infeasible" or best.plan.makespan > SOLVE_GAIN * self.work:
            return False
        else:
            self.pool.skipped[name] = (f"not built: the best plan so far, {best.plan.makespan / 1000:.3f} ms, is "
                                       f"within {SOLVE_GAIN:g}x the work over the GPUs ({self.work / 1000:.3f} ms)")
        self.say(f"{name}: skipped ({self.pool.skipped[name]})")
        return True

    @staticmethod
    def list_placer(graph: OpGraph, cluster: Cluster) -> Plan:
        """The placer a kind with :attr:`~solver.parallel.kinds.Kind.lists` is given
        (quick, no solve, no clock): the practitioner's layer stages
        (:func:`solver.practitioners.place_expert`: a split step's copies of a
        layer on its stage's GPU), re-ordered by :func:`solver.search.reschedule`
        (TF's FIFO queue, placed rank: the slices' tasks interleave as a
        wavefront, the order as a list schedule)."""
        plan = place_expert(graph, cluster)
        return reschedule(graph, cluster, plan, candidates=("fifo", "rank", "given-list"))

    def one_step(self, share: float) -> Callable[[OpGraph, Cluster], Plan]:
        """The one-step placer a kind with :attr:`~solver.parallel.kinds.Kind.solves`
        is given: the recipe (:func:`solver.recipes.run_recipe`, ``micro_batches=1``, the
        search's seed, workers and mode) on ``share`` of the running pass's time left when
        it is called, on the search's clock (deterministic: its work clock)."""
        def place(graph: OpGraph, cluster: Cluster) -> Plan:
            grant = self.window.sub(share * max(self.window.left(), 0.0))
            return self.recipe(graph, cluster, grant, hint="best-heuristic")
        return place

    def recipe(self, graph: OpGraph, cluster: Cluster, grant: Deadline, starts=(), **options) -> Plan:
        """The one-step recipe (:func:`solver.recipes.run_recipe`, ``micro_batches=1``,
        the search's seed, workers and mode; ``options`` override its solve options) on
        ``graph`` until ``grant``, from ``starts``. Interrupted before its first plan while
        the search has one: :class:`~pesto.deadline.Stopped` (the search's best stands);
        any other interrupt propagates."""
        inner = self.options.replace(time_limit=max(grant.left(), 0.01), started=None, micro_batches=1,
                                     batch_size=None, progress=None, **options)
        name = inner.recipe_for(graph)
        try:
            return run_recipe(graph, cluster, RECIPES[name], inner, name=name, starts=starts, deadline=grant)
        except KeyboardInterrupt as exc:   # the inner run's "interrupted before any plan": ours stands
            if self.pool.best is None or "before any plan" not in str(exc):
                raise
            raise Stopped(self.deadline.reason) from None

    def refine(self, window: Deadline) -> None:
        """The partial recomputations skipped for time (:meth:`partial`), each
        once, on ``window``; one skipped again stays pending."""
        outer, self.window = self.window, window
        pending, self.pending = self.pending, []
        try:
            for args in pending:
                if self.window.left() > 0:
                    self.partial(*args)
        finally:
            self.window = outer

    @staticmethod
    def name_of(kind: Kind, strategy: Strategy) -> str:
        """A candidate's name in ``plan.log.steps``: its kind's label, rule and savers."""
        return kind.label(strategy) + "".join(f" {w}" for w in (strategy.bucket_words, strategy.rule_words,
                                                                 strategy.savers) if w)

    def exact_all(self, screened: Mapping[int, _Screened]) -> None:
        """The exact passes on :func:`_exact_counts`: each an equal part of
        :data:`PROBE_SHARE` of the time left (less the bound's), then the rest
        to the count whose plan was best, continued from it."""
        chosen = _exact_counts(screened, self.auto)
        dl = self.deadline
        share = PROBE_SHARE if len(chosen) > 1 else 1.0
        until = dl.elapsed() + share * max(0.0, dl.left() - self.budget.wants.get("bound", 0.0))
        exact: dict = {}
        for k, m in enumerate(chosen):
            grant = self.grant(f"M={m}", (until - dl.elapsed()) / (len(chosen) - k))
            if grant is not None and not self.outlasts(f"M={m}", screened[m], grant):
                exact[m] = self.exact(screened[m], m, grant)
        if exact and len(chosen) > 1 and dl.seconds != float("inf"):
            m = min(exact, key=lambda c: rank(exact[c]))
            self.keep_bound()
            grant = self.grant(f"M={m} continued", dl.left())
            if grant is not None and not self.outlasts(f"M={m} continued", screened[m], grant):
                plan = self.exact(screened[m], m, grant, start=exact[m])
                self.say(f"micro-batches {m}: the best exact count continued, step {plan.makespan / 1000:.3f} ms")

    def outlasts(self, name: str, s: _Screened, grant: Deadline) -> bool:
        """A memory-bound step's exact passes on a split whose recipe's first
        plan (``SIMS["pipeline"]`` simulations of it) is predicted past ``grant``,
        while a plan that fits exists: skipped and named (:class:`_Pace`;
        GPT-2.7B's M=16 split, 157k ops: 38 s on a 1.2 s grant)."""
        need = self.pace.predict(s.graph.num_ops, SIMS["pipeline"])
        if not self.tight or need is None or need <= grant.left() \
                or not self.have_fit():
            return False
        self.pool.skipped[name] = (f"exact passes skipped: the recipe's first plan of {s.graph.num_ops} ops "
                                   f"needs about {need:.1f} s, {grant.left():.1f} s granted")
        self.say(f"micro-batches {name[2:]}: {self.pool.skipped[name]}")
        return True

    def grant(self, name: str, want: float) -> Deadline | None:
        """The budget's grant of ``want`` seconds for an exact stage, or None
        (skipped and named: interrupted, expired, or under :data:`MIN_SECONDS`
        on the wall clock while a plan exists). Without a plan yet, an expired
        grant: the recipe's first heuristic still runs to its end."""
        self.stop_if_interrupted()
        grant = self.budget.grant("exact", max(0.0, want))
        if isinstance(grant, Skip) and self.pool.best is None:
            return self.deadline.sub(0.0)   # no plan yet: the recipe's first heuristic makes one, whatever the clock
        if isinstance(grant, Skip):
            why = grant.reason
        elif not self.deadline.deterministic and grant.seconds < MIN_SECONDS and self.pool.best is not None:
            why = f"{grant.seconds:.2f} s left of the time limit"
        else:
            return grant
        self.pool.skipped[name] = f"exact passes skipped: {why}"
        self.say(f"micro-batches {name[2:]}: exact passes skipped ({why})")
        return None

    def exact(self, s: _Screened, m: int, grant: Deadline, start: Plan | None = None) -> Plan:
        """Offer (as ``M=m``) and return the recipe's plan of ``s.graph`` on
        ``grant``, started from the slice model's plan (``m > 1``, weight
        gradients separate: the slice grid's) and the screened plans; with
        ``start`` (an earlier plan of this ``m``: the search continued), from it
        and the screened plans, no slice model. Never worse than its best
        start: a start the recipe's plan does not beat is returned re-ordered
        (:func:`solver.search.reschedule`; the paper recipe, which a split of
        at most ``target_vertices`` ops runs, starts from none: uniform-m8-1x's
        in-place split of 124 ops came back at 107.0 ms from a 92.2 ms start)."""
        before = set(self.pool.steps)
        self.say(f"exact M={m}: start ({grant.left():.1f} s granted)")
        starts = ([start] if start is not None else []) + list(s.starts)
        if start is None and m > 1:   # the slice model's plan: a start where it places s.graph (sums separate)
            sliced = self.slice_start(s, m, grant)
            starts[:0] = sliced if s.weight_grads == "separate" else []
        self.stop_if_interrupted()
        plan = self.recipe(s.graph, self.cluster, grant, starts)
        if self.one_device is None and plan.log is not None:
            self.one_device = plan.log.one_device
        ahead = min(starts, key=rank, default=None)
        if ahead is not None and rank(ahead) < rank(plan):   # a split of at most target_vertices ops runs the
            plan = reschedule(s.graph, self.cluster, ahead, deadline=self.deadline)   # paper recipe: no starts
        self.pool.offer(f"M={m}", plan, s.split, Strategy(micro_batches=m, schedule="free" if m > 1 else "none",
                                                          weight_grads=s.weight_grads))
        mine = {n: v for n, v in self.pool.steps.items() if n not in before}
        if mine:
            self.say(f"micro-batches {m}: step " + ", ".join(f"{n} {v / 1000:.3f} ms" for n, v in mine.items()))
        return plan

    def slice_start(self, s: _Screened, m: int, grant: Deadline) -> list[Plan]:
        """The slice model's plan of ``m`` slices (:func:`solver.parallel.slice_model.solve_slices`)
        on :data:`SLICE_SHARE` of ``grant``, at most what leaves the pipeline the predicted time of
        its first plan (``SIMS["pipeline"]`` simulations of the split; wall clock only), skipped below
        :data:`MIN_SECONDS` on the wall clock; offered as ``slice M=m``, a candidate of its own (its
        grid sums every weight gradient's slices separately, whatever the count's best split does);
        [] when skipped."""
        name = f"slice M={m}"
        if s.graph.num_ops > SLICE_MAX_OPS:
            self.pool.skipped[name] = (f"the split step has {s.graph.num_ops} ops, more than {SLICE_MAX_OPS}: "
                                       f"the slice model's split and grid alone outlast its share")
            return []
        # the recipe's own first plan (wall clock only: a deterministic share may not hang on the pace)
        keep = 0.0 if self.deadline.deterministic else self.pace.predict(s.graph.num_ops, SIMS["pipeline"]) or 0.0
        share = min(SLICE_SHARE * grant.left(), grant.left() - keep)
        if share < MIN_SECONDS and not self.deadline.deterministic:
            self.pool.skipped[name] = (f"{max(share, 0.0):.2f} s for the slice model, less than {MIN_SECONDS} s"
                                       + (f" (about {keep:.1f} s kept for the recipe's first plan)" if keep else ""))
            return []
        self.stop_if_interrupted()
        self.say(f"slice model M={m}: start ({share:.1f} s)")
        try:
            r = solve_slices(self.marked, self.cluster, micro_batches=m, time_limit=share, workers=self.slice_workers,
                             seed=self.options.seed, hints=s.hints, deadline=grant.sub(share))
        except PestoError as exc:
            self.pool.skipped[name] = str(exc)
            self.say(f"slice model M={m}: skipped ({exc})")
            return []
        if r.plan is None:
            self.pool.skipped[name] = f"no grid solution ({r.status}) within {share:.1f} s"
            self.say(f"slice model M={m}: {self.pool.skipped[name]}")
            return []
        self.pool.offer(name, r.plan, r.transformed, Strategy(micro_batches=m, schedule="slice"))
        self.say(f"slice model M={m}: {r.blocks} blocks, grid {r.status} {r.objective / 1000:.3f} ms "
                 f"(grid bound {r.grid_bound / 1000:.3f}), step {r.plan.makespan / 1000:.3f} ms")
        return [r.plan]

    def finish(self) -> Solved:
        """The winner with its log's fields: the strategy, the steps compared,
        what was skipped, why the search stopped, and the bound of the graph it
        places (:func:`winner_bound`, when higher than the recipe's or when a
        kind's plan won; skipped, and named, when interrupted or predicted past
        the time left)."""
        r, dl = self.pool.best, self.deadline
        log = r.plan.log or SolveLog(recipe="step search", winner=r.plan.placer, bound_source="none",
                                     passes=(PassLog("step search", dl.elapsed(), r.plan.makespan,
                                                     "a parallelism kind's plan won"),))
        bound, source = log.bound, log.bound_source
        need = self.pace.predict(r.graph.num_ops, SIMS["bound"])
        if dl.interrupted or (need is not None and need > dl.left()):
            self.pool.skipped["per-sample bound"] = dl.reason or f"about {need:.1f} s, {dl.left():.1f} s left"
        else:
            sb = winner_bound(self.cluster, r, self.options.batch_size)
            if sb is not None and (bound is None or sb.step > bound):
                bound, source = sb.step, f"per-sample bound ({sb.source})"
        status = r.plan.status
        if dl.interrupted and status not in ("infeasible", "optimal"):
            status = "interrupted"
        log = replace(log, micro_batches=r.micro_batches, graph_kind=r.graph_kind, replicas=r.replicas,
                      savers=r.strategy.savers, joined=r.strategy.joined, in_place=self.in_place_of(r.strategy),
                      bucket_bytes=r.strategy.bucket_bytes,
                      steps=dict(self.pool.steps), skipped={**log.skipped, **self.pool.skipped}, bound=bound,
                      bound_source=source, stopped=dl.reason or log.stopped, deterministic=dl.deterministic,
                      one_device=log.one_device if log.one_device is not None else self.one_device)
        return replace(r, plan=replace(r.plan, log=log, lower_bound=bound, status=status))


def solve_step(graph: OpGraph, cluster: Cluster, options: SolveOptions) -> Solved:
    """The best plan over the counts of ``options.micro_batches`` and data
    parallelism (module doc), within ``options.time_limit``: one
    :class:`~pesto.deadline.Deadline` from ``options.started``, its signals
    caught for the whole search (the first SIGINT, SIGTERM or SIGHUP returns
    the best plan so far, status ``"interrupted"``).

    Raises
    ------
    BatchMarkError
        As :func:`with_marks`.
    MicroBatchError
        A fixed ``M`` whose split would exceed :data:`SPLIT_MAX_OPS`, or for
        which no plan could be made (the reasons named).
    MicroBatchMemoryError
        A fixed ``M`` whose split step fits no device (:func:`memory_short`) and none of
        whose candidates' savers fits.
    KeyboardInterrupt
        Interrupted before any plan existed.
    """
    deadline = Deadline(options.time_limit, deterministic=options.deterministic, start=options.started)
    search = _Search(graph, cluster, options, deadline)
    with deadline.catching_signals(), gc_frozen():   # candidates frozen as built (:meth:`_Pace.timed`)
        try:
            search.run()
        except Stopped:
            pass
        if search.pool.best is not None:
            return search.finish()
    if search.pool.short:
        raise next(iter(search.pool.short.values()))
    if deadline.interrupted:
        raise KeyboardInterrupt(f"{deadline.reason} before any plan existed")
    why = "; ".join(f"{k}: {v}" for k, v in search.pool.skipped.items()) or "no candidate applies"
    raise MicroBatchError(f"micro_batches={options.micro_batches}: no plan could be made ({why})",
                          culprit=options.micro_batches)


def _exact_counts(screened: Mapping[int, _Screened], auto: bool) -> list[int]:
    """The counts the exact passes run on: every one screened unless
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
    fit: even :func:`~solver.parallel.bound.memory_floor` of the split step
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


def winner_bound(cluster: Cluster, r: Solved, batch: int | None = None) -> SampleBound | None:
    """:func:`~solver.parallel.bound.sample_bound` of the graph ``r.plan``
    places, from the transform ``r`` kept (``r.transformed``: the step split,
    replicated, or both; the copies term per replica); None when it kept none
    (then the recipe's bound stands). For a winner that is a contiguous-stage
    pipeline (one replica, each stage's copies on a device of its own:
    :func:`~solver.parallel.bound.covers`), the larger of that and
    :func:`~solver.parallel.bound.pipeline_bound` (fill, drain and the
    transfers between its stages, valid for every such pipeline: source
    ``"pipeline"``). A chunked schedule's plan (interleaved, ZB-V: two stages
    on one device) is not such a pipeline, and gets the per-sample bound only."""
    if r.transformed is None:
        return None
    sb = sample_bound(r.transformed, cluster, batch=batch)
    if r.replicas == 1 and r.strategy.schedule in SCHEDULES and covers(r.transformed, r.plan.placement):
        pb = pipeline_bound(r.transformed, cluster)
        if pb is not None and pb.step > sb.step:
            sb = replace(sb, step=pb.step, per_sample=None if not batch else pb.step / batch, pipeline=pb.step,
                         source="pipeline")
    return sb
