"""Replicas of one free placement: ``R`` data-parallel replicas, each placed by the one-step placer.

A hybrid (:mod:`solver.parallel.hybrid`) runs each of its ``R`` replicas as a
contiguous-stage pipeline over its group of ``K = GPUs / R`` devices. A
sequence model's step (an encoder-decoder LSTM, an RNN language model) runs
poorly as contiguous stages but very well placed freely over two GPUs, its
layers' time steps overlapping as a wavefront (GNMT's placement), which is
what the one-step placer (the recipe of ``pesto.solve`` with
``micro_batches=1``) finds. :func:`placed_plan` builds:

1. **Groups**: :func:`~solver.parallel.hybrid.replica_groups` (replica ``r``
   on group ``r``, the ring of :func:`pesto.step.replicate` group to group).
2. **The replica's step** (:func:`replica_step`): the step as one replica of
   ``R`` runs it, the op names of the step, each op the copy replica 0 holds
   in ``replicate(step, R)`` (a batched op's ``1 / R`` of the batch under the
   split's cost rule, :func:`pesto.step.slicing.slice_op`; its tensors'
   bytes likewise), without the all-reduce.
3. **Its placement**: the one-step placer (``place(graph, cluster)``, given by
   the caller: :mod:`solver.parallel.search` runs the recipe on a share of its
   clock, with its seed and workers) on group 0 and the devices that are not
   GPUs (``cluster.subset``).
4. **The plan**: ``replicate(step, R)`` (the graph
   :func:`solver.parallel.search.step_graph` rebuilds for ``("replicated", R,
   1)``, the graph a hybrid of one slice places), replica ``r``'s copy of an
   op on the device at the same position in group ``r`` as the op's device in
   group 0 (a device that is not a GPU: itself); each all-reduce op on its
   replica's device holding the tensor's first unbatched reader (the
   variable's update: :func:`~solver.parallel.hybrid.replica_stages`, the
   hybrid's rule). Per device the copies run in the placed plan's start order
   (every replica the same), the ring ops as soon as they are ready: a list
   schedule by those priorities (an update waiting for its all-reduce does not
   hold the backward behind it), whose per-device order is the plan's,
   simulated by :func:`pesto.finalize.finalize` (memory checked).

Simulated (NMT-4x1024 on 4 PCIe GPUs, R = 2, ``K = 2``): a half-batch replica
placed on two GPUs runs its forward and backward as a wavefront, and each GPU
all-reduces the gradients of the variables it holds with its twin in the other
group, overlapping the backward.

Examples
--------
>>> import time
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import gpus
>>> from pesto.finalize import finalize
>>> ops = [Op("x", {"GPU": 40.0}, output_bytes=8, batch=True, phase="forward"),
...        Op("dx", {"GPU": 40.0}, output_bytes=8, batch=True, phase="input-grad", anchor="x"),
...        Op("u", {"GPU": 1.0}, batch=False, phase="update")]
>>> g = OpGraph(ops, [Edge("x", "dx", "x:0"), Edge("dx", "u", "dx:0")],
...             [Tensor("x:0", "x", 8), Tensor("dx:0", "dx", 8)])
>>> one = lambda step, sub: finalize(step, sub, {n: sub.names[0] for n in step.names}, placer="one",
...                                  t0=time.perf_counter())
>>> r = placed_plan(g, gpus(4), replicas=2, place=one)
>>> r.replicas, r.plan.placement["x@r1"], r.plan.placement["dx:0@rs0@r1"]   # the ring: at the update
(2, '/GPU:2', '/GPU:2')
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from pesto.cluster import Cluster
from pesto.finalize import finalize
from pesto.graph import OpGraph, Tensor
from pesto.plan import Plan
from pesto.simulate import simulate
from pesto.step import Transformed, replicate
from pesto.step.replication import BUCKET_BYTES, replica_name
from pesto.step.transform import renamed

from ..common import order_by_key
from .hybrid import replica_stages, replica_groups
from .pipelines import StepPlan

__all__ = ["placed_plan", "replica_step"]

#: The one-step placer: ``place(graph, cluster) -> Plan`` of ``graph`` on ``cluster``.
Place = Callable[[OpGraph, Cluster], Plan]


def replica_step(rep: Transformed) -> OpGraph:
    """The step as replica 0 of ``rep`` (:func:`pesto.step.replicate`) runs
    it, under the step's op and tensor names: each op replica 0's copy
    (a batched op's share of the batch, :func:`pesto.step.slicing.slice_op`),
    the step's edges, no all-reduce.

    >>> from pesto.graph import Op, Edge
    >>> g = OpGraph([Op("a", {"GPU": 8.0}, output_bytes=64, batch=True), Op("b", {"GPU": 1.0}, batch=False)],
    ...             [Edge("a", "b", "a:0")], [Tensor("a:0", "a", 64)])
    >>> s = replica_step(replicate(OpGraph([Op("c", {"GPU": 9.0}, output_bytes=40, batch=True)]), 2))
    >>> s.names, s.op("c").compute["GPU"], s.op("c").output_bytes
    (('c',), 4.5, 20)
    """
    g, copy = rep.source, rep.graph
    ops = [renamed(copy.op(replica_name(op.name, 0)), op.name, op.colocation_group, op.anchor) for op in g.ops]
    tensors = [Tensor(t.name, t.src, copy.tensor(replica_name(t.name, 0)).bytes) for t in g.tensors]
    return OpGraph(ops, list(g.edges), tensors, name=f"{g.name}@replica{rep.replicas}")


def placed_plan(graph: OpGraph, cluster: Cluster, *, replicas: int, place: Place,
                bucket_bytes: int | None = BUCKET_BYTES) -> StepPlan:
    """``replicas`` replicas of ``graph``, each the one-step placer's plan of
    a replica's step on its group of GPUs (module doc); the plan places
    ``step_graph(graph, 1, "replicated", replicas)``.

    ``place``: the one-step placer (:data:`Place`), called once on group 0;
    ``bucket_bytes``: the gradient buckets (:func:`pesto.step.replicate`).

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`~solver.parallel.hybrid.replica_groups` and :func:`pesto.step.replicate`.
    """
    t0 = time.perf_counter()
    groups = replica_groups(cluster, replicas)
    rest = [d.name for d in cluster.devices if d.kind != "GPU"] if cluster.gpus else []
    rep = replicate(graph, len(groups), bucket_bytes=bucket_bytes)
    one = place(replica_step(rep), cluster.subset(groups[0] + rest))
    k = len(groups[0]) + len(rest)
    where = {d: s for s, d in enumerate(groups[0] + rest)}
    stage = [where[one.placement[op.name]] for op in graph.ops]
    flat = [d for g in groups for d in g + rest]
    placement = {n: flat[s] for n, s in zip(rep.graph.names, replica_stages(rep, stage, k))}
    plan = _ordered(rep, cluster, placement, one, t0)
    return StepPlan(plan, rep, 1, len(groups[0]), "free", one.placer, len(groups))


def _ordered(rep: Transformed, cluster: Cluster, placement: dict, one: Plan, t0: float) -> Plan:
    """The plan of ``placement`` (of ``rep.graph``): the copies by the start
    order of ``one`` (the replica's plan), the ring ops as soon as ready, as a
    list schedule; its per-device start order simulated again as the plan."""
    g = rep.source
    topo = {i: p for p, i in enumerate(g.topo_idx())}
    first = sorted(range(g.num_ops), key=lambda i: (one.start[g.names[i]], topo[i]))
    rank = np.empty(g.num_ops)
    rank[first] = np.arange(g.num_ops)
    prio = [-rank[g.index[o.op]] if o.role in ("copy", "step") else 1.0
            for o in (rep.origin[n] for n in rep.graph.names)]
    sched = simulate(rep.graph, cluster, dict(placement), mode="fifo", priority=prio, memory=False)
    order = order_by_key(rep.graph, [sched.start[n] for n in rep.graph.names])
    return finalize(rep.graph, cluster, placement, order=order, placer="placed", t0=t0,
                    stats={"replicas": rep.replicas, "stages": len(set(one.placement.values()))})
