"""Practitioners' parallel placers on micro-batched steps: GPipe, 1F1B, data parallel.

Each placer takes a step whose ops carry batch marks (:attr:`pesto.graph.Op.batch`;
a front end sets them: :func:`tf_patch.marks.mark_step` for a TensorFlow graph
that has none), builds the transformed step as an ordinary graph and returns a
:class:`~pesto.plan.Plan` *of that graph*, simulated and checked by
:func:`pesto.finalize.finalize` like every placer. The typed
:func:`pipeline_plan` / :func:`data_parallel_plan` return it with the
transform that made the graph (:class:`StepPlan`: ``transformed``, the split
or the replication composed with it, ``graph`` its graph);
``pesto.check_plan(result.graph, cluster, result.plan)`` checks it.

* ``gpipe`` / ``1f1b`` (:func:`place_gpipe`, :func:`place_1f1b`): the step split
  into ``micro_batches`` slices (:func:`pesto.step.split`), cut into
  ``k`` contiguous stages, every slice's copy of an op on its stage's GPU, for
  every ``k`` up to the number of GPUs and every candidate block order of
  :mod:`solver.parallel.cut` (the split of least step estimate that fits memory);
  the plan with the smallest simulated step wins (one that fits memory first).
  Per device the slices run in the schedule's order: GPipe all forward
  slices, then all backward slices (in slice order, the order their gradients
  are accumulated in); 1F1B (PipeDream-flush) ``k - s - 1`` forward slices on
  stage ``s``, then one forward / one backward, then the remaining backward.
  Once-per-step ops (variable reads, accumulation, the update) run as soon as
  they are ready.
* ``data-parallel`` (:func:`place_data_parallel`): :func:`pesto.step.replicate`
  with one replica per GPU (replica ``r`` on GPU ``r``, the ring all-reduce as
  transfers on the cluster's links), each replica optionally split into
  ``micro_batches``; the best of TensorFlow's FIFO order, an order that
  runs the all-reduce as soon as it is ready, and one that also runs each
  weight gradient as soon as it is ready (before the input gradients beside
  it, so the first bucket's all-reduce starts earlier).

Stages (documented rule)
------------------------
Forward / backward ops, blocks and cuts: :mod:`solver.parallel.cut`.
**Once-per-step ops** go with the first stage reading
them (variable reads), else the last stage feeding them, else their
neighbours'; an accumulate op with the op whose gradient it sums; a
colocation group goes where most of its members' compute would (a slice's
copy bound to a variable outweighs the rest).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import gpus
>>> names = ["l0", "l1", "d1", "d0"]
>>> marks = [("forward", None), ("forward", None), ("input-grad", "l1"), ("input-grad", "l0")]
>>> ops = [Op(n, {"GPU": 10.0}, output_bytes=8, batch=True, scope=n, phase=p, anchor=a)
...        for n, (p, a) in zip(names, marks)]
>>> es = [Edge(a, b, f"{a}:0") for a, b in zip(names, names[1:])]
>>> g = OpGraph(ops, es, [Tensor(f"{n}:0", n, 8) for n in names])
>>> r = pipeline_plan(g, gpus(2, beta=(1.0, 0.0)), schedule="gpipe", micro_batches=2)
>>> r.stages, r.plan.placement["l1@mb1"], r.plan.placement["d1@mb0"]
(2, '/GPU:1', '/GPU:1')
>>> r.plan.makespan < place_data_parallel(g, gpus(1)).makespan
True
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from pesto.cluster import Cluster
from pesto.dag import priority_order
from pesto.deadline import Deadline
from pesto.errors import CycleError
from pesto.finalize import finalize
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.simulate import simulate
from pesto.step import Transformed, compose, replicate, split as split_step
from pesto.step.marks import backward_ops
from pesto.step.replication import BUCKET_BYTES

from ..common import order_by_key, rank
from .cut import (Blocking, Phases, _block_costs, block_memory, blockings, cut_costs, in_flight,
                  largest_stage as _largest_stage, phases, split_stages, step_estimate)
from .schedules import SCHEDULES, Action, Schedule, actions, get as get_schedule

__all__ = ["place_gpipe", "place_1f1b", "place_data_parallel", "pipeline_plan", "data_parallel_plan",
           "StepPlan", "split_stages", "task_order", "CANDIDATES", "staged_plan", "step_stages", "gpu_names",
           "route_matrix",
           "schedule_placer"]

CANDIDATES = 8   # stage splits simulated per call (those of the smallest estimate)


@dataclass(frozen=True)
class StepPlan:
    """A plan of a transformed step and the transform whose graph it places.

    Attributes
    ----------
    plan : Plan
        Over ``graph``'s ops (simulated, checked status).
    transformed : Transformed
        The step micro-batched (:func:`pesto.step.split`; ``M = 1``: the step
        itself) and, for data parallelism or a hybrid, replicated first
        (:func:`pesto.step.compose`): each op's origin in the step.
    micro_batches : int
    stages : int
        Pipeline stages used (replicas for data parallelism).
    schedule : str
        ``"gpipe"``, ``"1f1b"`` or ``"data-parallel"``.
    blocking : str
        The block order of the winning split (``"scope:2"``, ``"topological"``),
        the order rule for data parallelism (``"fifo"``, ``"all-reduce first"``,
        ``"weight-grad first"``).
    replicas : int
        Replicas of the step in ``graph`` (1: not replicated; data
        parallelism: ``stages``; :func:`solver.parallel.hybrid.hybrid_plan`: its groups).
    """

    plan: Plan
    transformed: Transformed
    micro_batches: int
    stages: int
    schedule: str
    blocking: str
    replicas: int = 1

    @property
    def graph(self) -> OpGraph:
        """The graph ``plan`` places: ``transformed.graph``."""
        return self.transformed.graph


def task_order(schedule: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The (kind, slice) tasks of ``stage`` in the order it runs them, for a
    schedule of one model chunk (:func:`solver.parallel.schedules.actions`;
    ``"W"`` tasks when it splits the backward).

    >>> task_order("gpipe", 0, 2, 2)
    [('F', 0), ('F', 1), ('B', 0), ('B', 1)]
    >>> task_order("1f1b", 0, 3, 4)
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    >>> task_order("zb-v", 0, 2, 2)
    Traceback (most recent call last):
    ...
    ValueError: schedule 'zb-v' runs 2 model chunks per device: its tasks are schedules.actions(...)

    Raises
    ------
    ValueError
        An unknown schedule, or one of several chunks.
    """
    if get_schedule(schedule).chunks > 1:
        raise ValueError(f"schedule {schedule!r} runs {SCHEDULES[schedule].chunks} model chunks per device: "
                         f"its tasks are schedules.actions(...)")
    return [(a.kind, a.slice) for a in actions(schedule, stage, stages, m)]


def pipeline_plan(graph: OpGraph, cluster: Cluster, *, schedule: str = "1f1b", micro_batches: int = 4,
                  loss: str | None = None, stages: int | None = None, candidates: int = CANDIDATES,
                  weight_grads="separate", op_stages: Sequence[int] | None = None,
                  routes=None) -> StepPlan:
    """The best contiguous-stage pipeline of ``graph`` in ``micro_batches`` slices (module doc).

    ``weight_grads``: the split's rule for the slices' weight gradients
    (:func:`pesto.step.split`).
    ``stages``: that many stages only (at most the GPUs and the blocks);
    default every number from 1 to the number of GPUs. Per block order and
    ``k`` the split is :func:`split_stages`' least step estimate for ``M``
    slices under the GPUs' least memory (per stage its blocks' weights and
    optimizer state plus the activations of the slices the schedule holds
    at once there, :func:`solver.parallel.cut.block_memory`,
    :func:`solver.parallel.cut.in_flight`). A schedule of ``v`` model chunks
    per device (:attr:`~solver.parallel.schedules.Schedule.chunks`) cuts the
    blocks into ``k v`` contiguous virtual stages (least largest stage, no
    memory rule), virtual stage ``s`` on the device
    :meth:`~solver.parallel.schedules.Schedule.device` says, estimated
    ``(M v + k - 1)`` times the largest virtual stage's cost per slice.
    Each stage boundary is priced on the route between the devices of its
    two stages (``routes[a][b]``: the ``(beta0, beta1)`` between the GPUs
    at positions ``a`` and ``b``; default :func:`route_matrix` of the
    cluster's GPUs; a hybrid gives the slowest over its replicas' groups).
    ``candidates``: the stage splits simulated, those of least estimate
    (:func:`solver.parallel.cut.step_estimate`), then, half as many, the
    balanced cuts on the mean route (:func:`_splits`).
    ``op_stages``: the stage split given instead of searched (a schedule of
    one chunk), per op of ``graph`` its stage (batched ops, ``0 .. k-1``;
    ``-1`` for unbatched ops, staged by :func:`step_stages`' rule), e.g. a
    hand rule's (:func:`solver.parallel.user_baselines.uniform_stages`); the
    plan's ``blocking`` is ``"given"``.

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    ValueError
        An unknown ``schedule``, or no stage count it accepts (interleaved
        1F1B: ``M`` a multiple of the stages) or that the blocks can fill;
        ``op_stages`` not one entry per op, or more stages than GPUs.
    """
    t0 = time.perf_counter()
    sch = get_schedule(schedule)
    split = split_step(graph, micro_batches, weight_grads=weight_grads)
    ph = phases(graph, loss=loss)
    gpus = gpu_names(cluster)
    if op_stages is not None:
        if sch.chunks > 1:
            raise ValueError(f"op_stages gives one stage per GPU; schedule {schedule!r} runs {sch.chunks} chunks")
        k = _given_stages(graph, op_stages, len(gpus))
        plan = _pipeline(split, cluster, gpus, tuple(op_stages), k, ph, sch, t0)
        return StepPlan(plan, split, split.micro_batches, k, schedule, "given")
    route = route_matrix(cluster, gpus) if routes is None else np.asarray(routes, float)
    best = None
    for stage, k, name in _splits(graph, ph, sch, split.micro_batches, route, stages, len(gpus),
                                  min(cluster.device(d).memory for d in gpus), candidates):
        plan = _pipeline(split, cluster, gpus, stage, k, ph, sch, t0)
        if best is None or rank(plan) < rank(best.plan):
            best = StepPlan(plan, split, split.micro_batches, k, schedule, name)
    return best


def _splits(graph: OpGraph, ph: Phases, sch: Schedule, m: int, route: np.ndarray, stages: int | None,
            n: int, capacity: float, candidates: int) -> list[tuple[tuple, int, str]]:
    """The stage splits :func:`pipeline_plan` simulates, each ``(per-op
    virtual stage, stages, block order)``. Per block order and stage count
    ``k``: the cut of least step estimate (one chunk; else of least largest
    virtual stage), each stage boundary priced on the route between its two
    devices (``route[a][b]``); and, for one chunk, the least-largest-stage
    cut with every boundary priced on the mean route of ``route`` (the
    balanced cut of equal-work blocks the cutter made before its exact
    programme). The ``candidates`` of least estimate first, then the
    balanced cuts of least estimate ``(M + k - 1)`` times their largest
    stage, ``candidates // 2`` of them (at least one), those not among the
    first. The step estimate runs a slice's stages one after another and
    charges a transfer to the stages on both sides; where a slice's stages
    overlap (a recurrent step's layers run as a wavefront, at ``M = 1``
    too) or a transfer hides behind compute, the balanced cut can be
    faster, and the simulation decides."""
    v = sch.chunks
    est: tuple[dict, dict] = ({}, {})   # exact, balanced: (per-op virtual stages, devices) -> (estimate, order)
    mean = route[~np.eye(len(route), dtype=bool)].mean(axis=0) if len(route) > 1 else np.zeros(2)
    refused = []
    for bl in blockings(graph, ph) or [Blocking("one", tuple(0 if op.batch else -1 for op in graph.ops), 1)]:
        work, nbytes = _block_costs(graph, bl, m, (0.0, 1.0))   # per cut position: the bytes crossing it
        static, act = block_memory(graph, ph, bl, m, step_stages(graph, bl.block)) if v == 1 else (0, 0)
        for k in ([min(stages, n)] if stages else range(1, n + 1)):
            k = min(k, bl.count) if v == 1 else k
            comm = cut_costs(nbytes, [_route_of(route, sch.device(s, k), sch.device(s + 1, k))
                                      for s in range(max(k * v - 1, 1))])
            memory = [static + in_flight(sch.name, s, k, m) * act for s in range(k)] if v == 1 else None
            cuts = [(split_stages(work, comm, k, slices=m, memory=memory, capacity=capacity), comm)] if v == 1 else \
                [(split_stages(work, comm, k * v), comm)]
            if v == 1:
                even = cut_costs(nbytes, tuple(mean))
                cuts.append((split_stages(work, even, k, memory=memory, capacity=capacity), even))
            why = sch.refuses(k, m) or ("" if v == 1 or len(cuts[0][0]) == k * v else
                                        f"{k * v} virtual stages need {k * v} blocks, the step has {bl.count}")
            if why:
                refused.append(why)
                continue
            for family, (starts, c) in enumerate(cuts):
                stage_of = np.searchsorted(np.asarray(starts), np.arange(bl.count), side="right") - 1
                key = (tuple(int(stage_of[b]) if b >= 0 else -1 for b in bl.block), len(starts) // v)
                value = (step_estimate(work, c, starts, m) if v == 1 and family == 0
                         else (m * v + key[1] - 1) * _largest_stage(work, c, starts))
                if key not in est[family] or value < est[family][key][0]:
                    est[family][key] = (value, bl.name)
    if not est[0]:
        raise ValueError(f"{sch.name} M={m}: no stage split: " + "; ".join(dict.fromkeys(refused)))
    ranked = [sorted(e, key=lambda key: (e[key][0], key[1])) for e in est]
    chosen = ranked[0][:max(1, candidates)]
    chosen += [key for key in ranked[1][:max(1, candidates // 2)] if key not in chosen]
    names = {**est[1], **est[0]}
    return [(stage, k, names[stage, k][1]) for stage, k in chosen]


def _given_stages(graph: OpGraph, op_stages: Sequence[int], gpus: int) -> int:
    """The stage count of a given split (:func:`pipeline_plan`'s ``op_stages``), checked."""
    if len(op_stages) != graph.num_ops:
        raise ValueError(f"op_stages has {len(op_stages)} entries for the {graph.num_ops} ops of {graph.name!r}")
    k = max(op_stages, default=-1) + 1
    if not 1 <= k <= gpus:
        raise ValueError(f"op_stages uses {k} stages; {graph.name!r} has {gpus} GPUs to run 1 to {gpus} stages on")
    return k


def gpu_names(cluster: Cluster) -> list[str]:
    """The devices the parallel placers use: the cluster's GPUs, else every device."""
    gpus = [d.name for d in cluster.gpus]
    return gpus or [d.name for d in cluster.devices]


def route_matrix(cluster: Cluster, devs: Sequence[str]) -> np.ndarray:
    """``(n, n, 2)``: per pair of ``devs`` the ``(beta0, beta1)`` a stage
    boundary between them is priced on, the mean of the two directions (a
    slice's activations go one way, its gradients the other); 0 on the
    diagonal.

    >>> from pesto.cluster import hosts
    >>> c = hosts(2, 1, "ib_hdr")
    >>> m = route_matrix(c, gpu_names(c))
    >>> m.shape, m[0, 0].tolist(), bool(m[0, 1, 1] > 0)
    ((2, 2, 2), [0.0, 0.0], True)
    """
    n = len(devs)
    out = np.zeros((n, n, 2))
    for a in range(n):
        for b in range(n):
            if a != b:
                r = cluster.route(devs[a], devs[b])
                out[a, b] += (r.beta0 / 2, r.beta1 / 2)
                out[b, a] += (r.beta0 / 2, r.beta1 / 2)
    return out


def _route_of(route: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """The route between device positions ``a`` and ``b`` (none past the matrix: one device)."""
    return tuple(route[a, b]) if max(a, b) < len(route) else (0.0, 0.0)


def _pipeline(split: Transformed, cluster: Cluster, gpus, stage, stages: int, ph: Phases,
              sch: Schedule, t0: float) -> Plan:
    """Place and order one split of ``split`` into virtual stages ``stage``
    (per op; ``stages`` devices) by schedule ``sch`` and simulate it."""
    m = split.micro_batches
    task = [{a: j for j, a in enumerate(sch.actions(d, stages, m))} for d in range(stages)]
    where = [(sch.device(s, stages), sch.chunk(s, stages)) for s in range(stages * sch.chunks)]

    def key(i: int, phase: str, s: int) -> int:
        d, c = where[stage[i]]
        return task[d][Action(phase, s, c)]

    return staged_plan(split, cluster, stage, [gpus[d] for d, _ in where], ph, key, placer=sch.name, t0=t0,
                       weight_tasks=sch.split_backward, stats={"stages": stages, "micro_batches": m})


def staged_plan(split: Transformed, cluster: Cluster, stage: Sequence[int], device: Sequence[str],
                ph: Phases, task_key: Callable[[int, str, int], float], *, placer: str, t0: float,
                position: Sequence[int] | None = None, weight_tasks: bool = False, **fields) -> Plan:
    """The simulated plan of ``split`` given each batched op's device and each
    slice task's rank: the one rule of the pipeline placers.

    ``stage``: per op of ``split.source``, the stage all its copies run on,
    ``device[stage]`` (-1 for unbatched ops, staged by :func:`step_stages`'
    rule; accumulate ops go with the op whose gradient they sum); then
    :func:`_fix_groups`.
    ``task_key(i, phase, s)``: the rank of slice ``s``'s task holding op ``i``
    (``phase`` ``"F"`` or ``"B"``; with ``weight_tasks``, ``"W"`` for the ops
    marked ``"weight-grad"`` and for the accumulate ops summing their slices,
    slice ``s``'s accumulate op with its ``W`` task) on its device; copies run
    by it, an op run whole over every slice (``weight_grads="whole"``) with
    the last slice's task, then in topological order (``position``: per op of
    ``split.source`` its rank in that order instead, e.g. the same for every
    replica's copy of an op); once-per-step and the other accumulate ops as
    soon as they are ready.
    ``fields`` go to :func:`pesto.finalize.finalize`.
    """
    g = split.source
    step_stage = step_stages(g, stage)
    dev = {}
    for name, o in split.origin.items():
        i = g.index[o.op]
        dev[name] = device[stage[i] if o.role != "step" else step_stage[i]]
    placement = _fix_groups(split.graph, cluster, dev)
    n0 = g.num_ops
    pos = {i: k for k, i in enumerate(g.topo_idx())} if position is None else position
    key = []
    for name in split.graph.names:
        o = split.origin[name]
        i = g.index[o.op]
        weight = weight_tasks and i in ph.backward and g.ops[i].phase == "weight-grad"
        if o.role not in ("copy", "whole") and not (weight and o.role == "accumulate"):
            key.append(-1.0)
            continue
        phase = "W" if weight else "B" if i in ph.backward else "F"
        last = split.micro_batches - 1   # a whole op: with the last slice's task (it reads every slice)
        key.append(float(task_key(i, phase, last if o.role == "whole" else o.slice)) * n0 + pos[i])
    order = order_by_key(split.graph, key)
    return finalize(split.graph, cluster, placement, order=order, placer=placer, t0=t0, **fields)


def step_stages(graph: OpGraph, stage) -> list[int]:
    """Stage of each once-per-step op given none (``stage[i] < 0``): first
    batched reader, else last batched producer, else a neighbour's (breadth
    first), else 0. A stage given to an op (``>= 0``) is kept.

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"w": 0, "f": 1, "g": 1, "u": 0}, [("w", "f"), ("f", "g"), ("g", "u")])
    >>> g = OpGraph([replace(op, batch=op.name in "fg") for op in g.ops], g.edges, g.tensors)
    >>> step_stages(g, [-1, 0, 1, -1]), step_stages(g, [-1, 0, 1, 0])
    ([0, 0, 1, 1], [0, 0, 1, 0])
    """
    succ, pred = graph.succ_idx(), graph.pred_idx()
    out = list(stage)
    todo = []
    for i, op in enumerate(graph.ops):
        if op.batch or stage[i] >= 0:
            if not op.batch:
                todo.append(i)
            continue
        reads = [stage[j] for j in succ[i] if stage[j] >= 0]
        made = [stage[j] for j in pred[i] if stage[j] >= 0]
        out[i] = min(reads) if reads else max(made) if made else -1
        if out[i] >= 0:
            todo.append(i)
    while todo:
        nxt = []
        for i in todo:
            for j in list(pred[i]) + list(succ[i]):
                if out[j] < 0:
                    out[j] = out[i]
                    nxt.append(j)
        todo = nxt
    return [max(s, 0) for s in out]


def _fix_groups(graph: OpGraph, cluster: Cluster, dev: Mapping[str, str]) -> dict[str, str]:
    """Kinds and colocation respected: each op on an allowed device; each group
    where most of its members' compute would go (batched members count 10^6
    more: a copy bound to a variable decides)."""
    allowed_dev = {}
    out = dict(dev)
    for op in graph.ops:
        if cluster.device(out[op.name]).kind not in op.kinds:
            if op.kinds not in allowed_dev:
                allowed_dev[op.kinds] = next(d.name for d in cluster.devices if d.kind in op.kinds)
            out[op.name] = allowed_dev[op.kinds]
    for group, members in graph.colocation_groups().items():
        kinds = frozenset.intersection(*(graph.op(m).kinds for m in members))
        votes: Counter = Counter()
        for m in members:
            op = graph.op(m)
            if cluster.device(out[m]).kind in kinds:
                votes[out[m]] += min(op.compute.values()) + (1e6 if op.batch else 1e-9)
        d = max(votes, key=lambda e: (votes[e], e)) if votes else \
            next(x.name for x in cluster.devices if x.kind in kinds)
        for m in members:
            out[m] = d
    return out


def data_parallel_plan(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 1,
                       weight_grads="separate", shard_optimizer: int = 0,
                       bucket_bytes: int | None = BUCKET_BYTES, deadline: Deadline | None = None) -> StepPlan:
    """One replica per GPU (:func:`pesto.step.replicate`, ``shard_optimizer``:
    ZeRO-1/2/3 as it says, gradients in buckets of ``bucket_bytes``), each split into ``micro_batches`` slices; the
    best of three device orders (module doc). ``weight_grads``: the split's
    rule for the slices' weight gradients (:func:`pesto.step.split`).
    ``deadline``: once it has passed, the orders not yet simulated are skipped
    if a plan that fits memory is in hand (the best so far is the plan).

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    """
    t0 = time.perf_counter()
    gpus = gpu_names(cluster)
    rep = replicate(graph, len(gpus), shard_optimizer=shard_optimizer, bucket_bytes=bucket_bytes)
    both = rep if micro_batches == 1 else compose(split_step(rep.graph, micro_batches, weight_grads=weight_grads), rep)
    g = both.graph
    replica_of = {n: o.replica for n, o in both.origin.items()}
    if micro_batches == 1:
        first = [-1.0 if rep.origin[n].role not in ("copy", "step") else 0.0 for n in g.names]
    else:
        first = [float(both.origin[n].slice) if both.origin[n].role == "copy" else -1.0 for n in g.names]
    placement = _fix_groups(g, cluster, {n: gpus[r] for n, r in replica_of.items()})
    stats = {"replicas": len(gpus), "micro_batches": micro_batches}
    pos = {i: k for k, i in enumerate(g.topo_idx())}
    key = [f * g.num_ops + pos[i] if f >= 0 else -1.0 for i, f in enumerate(first)]
    # the weight gradients as soon as they are ready: the all-reduce of the first bucket starts
    # before the input gradients of its layer, not after them
    # (a list schedule: a static order of these keys would hold a device for an op not yet ready)
    prio = [2.0 if k < 0 else 1.0 if g.ops[i].phase == "weight-grad" else 0.0 for i, k in enumerate(key)]
    orders = ((lambda: None, "fifo"), (lambda: order_by_key(g, key), "all-reduce first"),
              (lambda: simulate(g, cluster, dict(placement), mode="fifo", priority=prio, memory=False).order,
               "weight-grad first"))
    plans: list = []
    for order, name in orders:
        if deadline is not None and deadline.expired() and any(p.status != "infeasible" for p, _ in plans):
            break   # past the deadline with a plan that fits
        plans.append((finalize(g, cluster, placement, order=order(), placer="data-parallel", t0=t0, stats=stats),
                      name))
    plan, how = min(plans, key=lambda p: rank(p[0]))
    return StepPlan(plan, both, micro_batches, len(gpus), "data-parallel", how, len(gpus))


def place_gpipe(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 4, loss: str | None = None) -> Plan:
    """GPipe on the step split into ``micro_batches`` slices (the plan places the split graph).

    :func:`pipeline_plan` with ``schedule="gpipe"``: contiguous stages, all
    forward slices then all backward slices on each.
    """
    return pipeline_plan(graph, cluster, schedule="gpipe", micro_batches=micro_batches, loss=loss).plan


def place_1f1b(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 4, loss: str | None = None) -> Plan:
    """1F1B (PipeDream-flush) on the step split into ``micro_batches`` slices (the plan places the split graph).

    :func:`pipeline_plan` with ``schedule="1f1b"``: contiguous stages, one
    forward / one backward slice in the steady state.
    """
    return pipeline_plan(graph, cluster, schedule="1f1b", micro_batches=micro_batches, loss=loss).plan


def schedule_placer(schedule: str) -> Callable[..., Plan]:
    """The placer of a schedule of :data:`~solver.parallel.schedules.SCHEDULES`:
    ``place(graph, cluster, *, micro_batches=4, loss=None)`` -> the plan of
    :func:`pipeline_plan` with that schedule (it places the split graph).

    >>> schedule_placer("zb-v").__doc__.split(" (")[0], schedule_placer("zb-v").__name__
    ('The zb-v schedule', 'place_zb_v')
    """
    sch = get_schedule(schedule)

    def place(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 4, loss: str | None = None) -> Plan:
        return pipeline_plan(graph, cluster, schedule=schedule, micro_batches=micro_batches, loss=loss).plan
    place.__name__ = place.__qualname__ = f"place_{schedule.replace('-', '_')}"
    place.__doc__ = (f"The {schedule} schedule ({sch.doc}) on the step split into micro_batches slices "
                     f"(the plan places the split graph).")
    return place


def place_data_parallel(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 1) -> Plan:
    """Data parallelism, one replica per GPU and a ring all-reduce (the plan places the replicated graph).

    :func:`data_parallel_plan`: :func:`pesto.step.replicate`, replica ``r``
    on GPU ``r``, each replica split into ``micro_batches`` slices.
    """
    return data_parallel_plan(graph, cluster, micro_batches=micro_batches).plan
