"""Practitioners' parallel baselines on micro-batched steps: GPipe, 1F1B, data parallel.

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
  every ``k`` up to the number of GPUs and every candidate block order below;
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
  ``micro_batches``; the better of TensorFlow's FIFO order and an order that
  runs the all-reduce as soon as it is ready.

Stages (documented rule)
------------------------
**Forward and backward.** Among batched ops, the backward pass is
:func:`pesto.step.marks.backward_ops` (the ops marked with a backward
:attr:`~pesto.graph.Op.phase`, or the ops after ``loss=``). Every backward op
is *anchored* to a forward op: its :attr:`~pesto.graph.Op.anchor` mark (the
forward op it differentiates, set by the front end: for TensorFlow, the op its
gradient scope mirrors, :mod:`tf_patch.marks`) when that is a batched forward
op; else the latest anchor of the backward ops it
feeds (a sum of gradient contributions, TensorFlow's top-level
``AddN_k`` of the gradient scope, belongs with the gradients of the tensor it sums for:
anchored by what it reads, an RNN's sum for layer 0 at time 0 went with layer 1
and made the blocks of one layer feed each other both ways); else the latest
forward op it reads; else the earliest anchor of the backward ops it reads;
else the last forward op.
**Blocks.** Forward ops are put in a pipeline order, then cut into ``CHUNKS``
blocks of equal work (a block's work is its forward ops' and their anchored
backward ops'), the unit a stage holds whole. The candidate orders: the
topological order, and layer by layer for every scope depth ``d`` (ops
grouped by their scope cut at depth ``d`` -- ``rnn/layer_0``, ``layer_3``,
``resnet50_1/conv2_block1_...`` -- groups in the order of their ops' mean
topological position, ops in topological order within a group). **Cuts.** A dynamic programme cuts the blocks into ``k`` contiguous stages
minimising the largest stage cost: its work per slice plus the transfer time
(the cluster's mean GPU route) of the slice's activations and gradients
crossing its two cuts. **Once-per-step ops** go with the first stage reading
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
from pesto.errors import CycleError
from pesto.finalize import finalize
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.step import Transformed, compose, replicate, split as split_step
from pesto.step.marks import backward_ops

from ..common import order_by_key, rank
from .cut import largest_stage as _largest_stage, split_stages
from .schedules import SCHEDULES, actions

__all__ = ["place_gpipe", "place_1f1b", "place_data_parallel", "pipeline_plan", "data_parallel_plan",
           "StepPlan", "Blocking", "Phases", "phases", "blockings", "split_stages", "task_order",
           "CHUNKS", "CANDIDATES", "staged_plan", "step_stages", "gpu_names"]

CHUNKS = 64      # blocks per candidate order (equal work); the cut DP is quadratic in them
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
        the order rule for data parallelism (``"fifo"``, ``"all-reduce first"``).
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


@dataclass(frozen=True)
class Phases:
    """Forward and backward batched ops of a step (:func:`phases`).

    Attributes
    ----------
    forward : tuple of int
        Batched forward ops (indices of the step), in topological order.
    backward : frozenset of int
        Batched backward ops.
    anchor : mapping int -> int
        Backward op -> the forward op it is staged with (the module doc's rule).
    """

    forward: tuple
    backward: frozenset
    anchor: Mapping[int, int]


@dataclass(frozen=True)
class Blocking:
    """Batched ops grouped into blocks a stage holds whole, in pipeline order.

    Attributes
    ----------
    name : str
    block : tuple of int
        Per op of the step, its block (-1 for unbatched ops).
    count : int
    """

    name: str
    block: tuple
    count: int


def phases(graph: OpGraph, *, loss: str | None = None) -> Phases:
    """Forward / backward batched ops and every backward op's anchor (module doc).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "db": 1, "da": 1}, [("a", "b"), ("b", "db"), ("db", "da")])
    >>> marks = {"a": ("forward", None), "b": ("forward", None), "db": ("input-grad", "b"), "da": ("input-grad", "a")}
    >>> g = OpGraph([replace(op, batch=True, phase=marks[op.name][0], anchor=marks[op.name][1]) for op in g.ops],
    ...             g.edges, g.tensors)
    >>> p = phases(g)
    >>> p.forward, sorted(p.backward), dict(p.anchor)   # each gradient staged with the op it differentiates
    ((0, 1), [2, 3], {2: 1, 3: 0})
    """
    back = backward_ops(graph, loss=loss)
    idx, ops = graph.index, graph.ops
    topo = graph.topo_idx()
    forward = tuple(i for i in topo if ops[i].batch and graph.names[i] not in back)
    backward = frozenset(i for i in topo if ops[i].batch and graph.names[i] in back)
    pos = {i: k for k, i in enumerate(topo)}
    fwd = set(forward)
    anchor: dict[int, int] = {}
    pred, succ = graph.pred_idx(), graph.succ_idx()
    for i in topo:   # the front end's anchor mark, when it is a batched forward op
        a = idx.get(ops[i].anchor) if i in backward and ops[i].anchor is not None else None
        if a is not None and a in fwd:
            anchor[i] = a
    for i in reversed(topo):   # a gradient sum: with the gradients it feeds (its tensor's producer's)
        feeds = [anchor[j] for j in succ[i] if j in anchor]
        if i in backward and i not in anchor and feeds:
            anchor[i] = max(feeds, key=pos.get)
    for i in topo:
        if i in backward and i not in anchor:
            reads = [p for p in pred[i] if p in fwd]
            later = [anchor[p] for p in pred[i] if p in anchor]
            anchor[i] = (max(reads, key=pos.get) if reads else min(later, key=pos.get) if later
                         else forward[-1] if forward else i)
    return Phases(forward, backward, anchor)


def blockings(graph: OpGraph, ph: Phases, *, chunks: int = CHUNKS) -> list[Blocking]:
    """The candidate block orders of the module doc: forward ops in topological
    order, or layer by layer (scope cut at each depth), cut into ``chunks``
    pieces of equal work (forward ops and their anchored backward ops).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a/x": 1, "b/x": 1, "a/y": 1, "b/y": 1},
    ...                        [("a/x", "b/x"), ("b/x", "a/y"), ("a/y", "b/y")])
    >>> g = OpGraph([replace(op, batch=True, scope=op.name[0]) for op in g.ops], g.edges, g.tensors)
    >>> [(b.name, b.block) for b in blockings(g, phases(g, loss="b/y"), chunks=2)]
    [('topological', (0, 0, 1, 1)), ('scope:1', (0, 1, 0, 1))]
    """
    fwd = list(ph.forward)
    if not fwd:
        return []
    ops = graph.ops
    pos = {i: k for k, i in enumerate(graph.topo_idx())}
    work = np.zeros(graph.num_ops)
    for i in fwd:
        work[i] += min(ops[i].compute.values())
    for b, a in ph.anchor.items():
        work[a] += min(ops[b].compute.values())
    candidates = [("topological", fwd)]
    for depth in range(1, 9):
        keys = {i: "/".join(_scope_parts(graph, i)[:depth]) for i in fwd}
        first: dict[str, list[int]] = {}
        for i in fwd:
            first.setdefault(keys[i], []).append(pos[i])
        if len(first) < 2:
            continue
        rank = _grouprank(graph, keys, {k: float(np.mean(v)) for k, v in first.items()})
        order = sorted(fwd, key=lambda i: (rank[keys[i]], pos[i]))
        candidates.append((f"scope:{depth}", order))
    out, seen = [], set()
    for name, order, *_ in candidates:
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        cum = np.cumsum(work[order])
        n = min(chunks, len(order))
        chunk = np.minimum((cum - 1e-9) * n // max(cum[-1], 1e-9), n - 1).astype(int)
        out.append(_blocking(graph, ph, name, {i: int(c) for i, c in zip(order, chunk)}))
    return out


def _grouprank(graph: OpGraph, keys: Mapping[int, str], mean: Mapping[str, float]) -> dict[str, int]:
    """Scope groups in a topological order of the edges between them (forward
    ops' edges), the group of least mean position first among those ready;
    by mean position alone when those edges form a cycle. An order by mean
    position alone can put a group before one it reads (an RNN's decoder
    layer before the last encoder layer), and blocks cut from it then feed
    each other both ways.

    >>> g = OpGraph.from_edges({"e/a": 1, "e/b": 1, "d/a": 1}, [("e/a", "e/b"), ("e/b", "d/a")])
    >>> _grouprank(g, {0: "e", 1: "e", 2: "d"}, {"e": 5.0, "d": 1.0})   # d reads e: after it
    {'e': 0, 'd': 1}
    """
    succ: dict[str, set] = {k: set() for k in mean}
    for i, k in keys.items():
        for j in graph.succ_idx()[i]:
            if j in keys and keys[j] != k:
                succ[k].add(keys[j])
    names = sorted(mean)
    at = {k: i for i, k in enumerate(names)}
    after = [sorted(at[v] for v in succ[k]) for k in names]
    before: list[list[int]] = [[] for _ in names]
    for i, vs in enumerate(after):
        for j in vs:
            before[j].append(i)
    try:
        order = [names[i] for i in priority_order(after, before, [mean[k] for k in names])]
    except CycleError:   # a cycle between groups: mean position
        order = sorted(mean, key=lambda k: (mean[k], k))
    return {k: r for r, k in enumerate(order)}


def _scope_parts(graph: OpGraph, i: int) -> list[str]:
    op = graph.ops[i]
    return op.scope.split("/") if op.scope else op.name.split("/")[:-1] or [op.name]


def _blocking(graph: OpGraph, ph: Phases, name: str, fwd_block: Mapping[int, int]) -> Blocking:
    used = sorted(set(fwd_block.values()))
    dense = {b: k for k, b in enumerate(used)}
    block = [-1] * graph.num_ops
    for i, b in fwd_block.items():
        block[i] = dense[b]
    for i, a in ph.anchor.items():
        block[i] = block[a] if block[a] >= 0 else len(used) - 1   # no forward op at all: the last block
    return Blocking(name, tuple(block), len(used))


def task_order(schedule: str, stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """The (phase, slice) tasks of ``stage`` in the order it runs them
    (:func:`solver.parallel.schedules.actions`).

    >>> task_order("gpipe", 0, 2, 2)
    [('F', 0), ('F', 1), ('B', 0), ('B', 1)]
    >>> task_order("1f1b", 0, 3, 4)
    [('F', 0), ('F', 1), ('F', 2), ('B', 0), ('F', 3), ('B', 1), ('B', 2), ('B', 3)]
    """
    return [(a.kind, a.slice) for a in actions(schedule, stage, stages, m)]


def pipeline_plan(graph: OpGraph, cluster: Cluster, *, schedule: str = "1f1b", micro_batches: int = 4,
                  loss: str | None = None, stages: int | None = None, candidates: int = CANDIDATES) -> StepPlan:
    """The best contiguous-stage pipeline of ``graph`` in ``micro_batches`` slices (module doc).

    ``stages``: that many stages only (at most the GPUs and the blocks);
    default every number from 1 to the number of GPUs. ``candidates``: the
    stage splits simulated, those of smallest estimate ``(M + k - 1)`` times
    the largest stage cost per slice (:func:`split_stages`' objective).

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    ValueError
        An unknown ``schedule``.
    """
    t0 = time.perf_counter()
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {list(SCHEDULES)}")
    split = split_step(graph, micro_batches)
    ph = phases(graph, loss=loss)
    gpus = gpu_names(cluster)
    beta = _mean_route(cluster, gpus)
    m = split.micro_batches
    splits: dict[tuple, tuple] = {}   # per-op stages -> (estimate, stages, block order)
    for bl in blockings(graph, ph) or [Blocking("one", tuple(0 if op.batch else -1 for op in graph.ops), 1)]:
        work, comm = _block_costs(graph, bl, m, beta)
        for k in ([stages] if stages else range(1, len(gpus) + 1)):
            starts = split_stages(work, comm, min(k, len(gpus)))
            stage_of = np.searchsorted(np.asarray(starts), np.arange(bl.count), side="right") - 1
            stage = tuple(int(stage_of[b]) if b >= 0 else -1 for b in bl.block)
            est = (m + len(starts) - 1) * _largest_stage(work, comm, starts)
            if stage not in splits or est < splits[stage][0]:
                splits[stage] = (est, len(starts), bl.name)
    best = None
    for stage, (_, k, name) in sorted(splits.items(), key=lambda kv: kv[1][:2])[:max(1, candidates)]:
        plan = _pipeline(split, cluster, gpus, stage, k, ph, schedule, t0)
        if best is None or rank(plan) < rank(best.plan):
            best = StepPlan(plan, split, m, k, schedule, name)
    return best


def gpu_names(cluster: Cluster) -> list[str]:
    """The devices the parallel placers use: the cluster's GPUs, else every device."""
    gpus = [d.name for d in cluster.gpus]
    return gpus or [d.name for d in cluster.devices]


def _mean_route(cluster: Cluster, devs: Sequence[str]) -> tuple[float, float]:
    routes = [cluster.route(a, b) for a in devs for b in devs if a != b]
    if not routes:
        return (0.0, 0.0)
    return (float(np.mean([r.beta0 for r in routes])), float(np.mean([r.beta1 for r in routes])))


def _block_costs(graph: OpGraph, bl: Blocking, m: int, beta) -> tuple[np.ndarray, np.ndarray]:
    """Per block its work per slice; per cut position the transfer time of a slice across it."""
    work = np.zeros(bl.count)
    for i, op in enumerate(graph.ops):
        if bl.block[i] >= 0:
            work[bl.block[i]] += min(op.compute.values()) / m
    nbytes = np.zeros(bl.count + 1)
    for name, src, b, cons in graph.tensor_table():
        bu = bl.block[src]
        for bv in {bl.block[j] for j in cons} - {bu, -1}:
            if bu >= 0:
                nbytes[min(bu, bv) + 1: max(bu, bv) + 1] += b / m
    comm = np.where(nbytes > 0, beta[0] + beta[1] * nbytes, 0.0)
    return work, comm


def _pipeline(split: Transformed, cluster: Cluster, gpus, stage, stages: int, ph: Phases,
              schedule: str, t0: float) -> Plan:
    """Place and order one stage split of ``split`` and simulate it."""
    task = {s: {t: k for k, t in enumerate(task_order(schedule, s, stages, split.micro_batches))}
            for s in range(stages)}
    return staged_plan(split, cluster, stage, gpus, ph, lambda i, phase, s: task[stage[i]][(phase, s)],
                       placer=schedule, t0=t0, stats={"stages": stages, "micro_batches": split.micro_batches})


def staged_plan(split: Transformed, cluster: Cluster, stage: Sequence[int], device: Sequence[str],
                ph: Phases, task_key: Callable[[int, str, int], float], *, placer: str, t0: float,
                position: Sequence[int] | None = None, **fields) -> Plan:
    """The simulated plan of ``split`` given each batched op's device and each
    slice task's rank: the one rule of the pipeline placers.

    ``stage``: per op of ``split.source``, the stage all its copies run on,
    ``device[stage]`` (-1 for unbatched ops, staged by :func:`step_stages`'
    rule; accumulate ops go with the op whose gradient they sum); then
    :func:`_fix_groups`.
    ``task_key(i, phase, s)``: the rank of slice ``s``'s task holding op ``i``
    (``phase`` ``"F"`` or ``"B"``) on its device; copies run by it, then in
    topological order (``position``: per op of ``split.source`` its rank in that
    order instead, e.g. the same for every replica's copy of an op); once-per-step
    and accumulate ops as soon as they are ready.
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
        if o.role != "copy":
            key.append(-1.0)
            continue
        i = g.index[o.op]
        key.append(float(task_key(i, "B" if i in ph.backward else "F", o.slice)) * n0 + pos[i])
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


def data_parallel_plan(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 1) -> StepPlan:
    """One replica per GPU (:func:`pesto.step.replicate`), each split into
    ``micro_batches`` slices; the better of two device orders (module doc).

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    """
    t0 = time.perf_counter()
    gpus = gpu_names(cluster)
    rep = replicate(graph, len(gpus))
    both = rep if micro_batches == 1 else compose(split_step(rep.graph, micro_batches), rep)
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
    plans = [(finalize(g, cluster, placement, order=None, placer="data-parallel", t0=t0, stats=stats), "fifo"),
             (finalize(g, cluster, placement, order=order_by_key(g, key), placer="data-parallel", t0=t0,
                       stats=stats), "all-reduce first")]
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


def place_data_parallel(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 1) -> Plan:
    """Data parallelism, one replica per GPU and a ring all-reduce (the plan places the replicated graph).

    :func:`data_parallel_plan`: :func:`pesto.step.replicate`, replica ``r``
    on GPU ``r``, each replica split into ``micro_batches`` slices.
    """
    return data_parallel_plan(graph, cluster, micro_batches=micro_batches).plan
