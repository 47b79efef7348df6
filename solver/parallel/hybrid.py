"""Hybrid plans: ``R`` data-parallel replicas, each a ``K``-stage pipeline in ``M`` slices.

Between data parallelism (one whole replica per GPU) and a pipeline (every
GPU a stage of one replica) lie the plans practitioners use on hosts of a
few GPUs: ``R`` replicas, each pipelined over a group of ``K = GPUs / R``
devices (one replica per host, its stages on the host's NVLink pair, the
gradient all-reduce between hosts). :func:`hybrid_plan` builds one:

1. **Groups** (:func:`replica_groups`): the GPUs in the order of
   :meth:`pesto.cluster.Cluster.identical_groups` (interchangeable devices
   together: the GPUs of one host, listed host by host), cut into ``R``
   consecutive runs of ``K``. A replica's stages thus sit inside one host
   whenever ``K`` divides a host's GPUs, and its pipeline transfers take the
   fastest routes; replica ``r`` is group ``r``, so the ring of
   :func:`pesto.step.replicate` (replica order) runs group to group.
2. **Stages**: the best ``K``-stage pipeline of the *un-replicated* step on
   group 0 alone (:func:`~solver.parallel.pipelines.pipeline_plan` with
   ``stages=K`` on ``cluster.subset(group 0 + non-GPU devices)``: its block
   orders, cut DP and simulated candidates; each stage boundary priced on
   the slowest route between the two stages' GPUs over the replicas'
   groups, :func:`~solver.parallel.pipelines.route_matrix`); each op's stage is the
   position in the group of the device it got there (colocation already
   settled by that plan).
3. **The step**: ``split(replicate(graph, R).graph, M)`` (``M = 1``: the
   replicated graph itself, :func:`pesto.step.split` of one slice), the graph
   :func:`solver.parallel.search.step_graph` rebuilds for ``("replicated", R, M)``;
   the result keeps the two transforms composed (:func:`pesto.step.compose`). Replica ``r``'s copy of an op runs
   on ``group[r][stage]``; every all-reduce op of a gradient tensor on the
   device of its replica's group that holds the stage of the tensor's
   unbatched reader (the variable's update), so the ring of one variable runs
   between the ``R`` devices holding it. Per device the slices run in the
   schedule's task order (:func:`~solver.parallel.pipelines.task_order` of
   the op's stage), the ring and the update as soon as they are ready, and
   the plan is simulated by :func:`~solver.parallel.pipelines.staged_plan`,
   the one rule of the pipeline placers.

A replica need not be a pipeline: :mod:`solver.parallel.placed` places one
replica's step freely on group 0 (the one-step placer) and copies that plan to
every group, with the same groups and rings (:func:`replica_stages`); the plan
places the graph of a hybrid of one slice.

Reading (simulated, cached zoo graphs, ``M`` in 1, 2, 4): on ``hosts(4, 2,
"ib_hdr")`` the hybrid is the best of these plans for Transformer-6 (``R = 4``,
``M = 4``: 37.8 ms, data parallel 54.3, best GPipe/1F1B 80.8; 4.0x one
GPU) and ResNet50 (``R = 4``, ``M = 2``: 41.2 ms, best pipeline 56.5); on 4
PCIe GPUs data parallelism (Transformer, ResNet50, NMT) or a 4-stage pipeline
(RNNLM) stays ahead.

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import hosts
>>> names, anchor = ["l0", "l1", "d1", "d0"], {"d1": "l1", "d0": "l0"}   # two layers, their gradients
>>> ops = [Op(n, {"GPU": 10.0}, output_bytes=8, batch=True, scope=n, anchor=anchor.get(n),
...           phase="input-grad" if n in anchor else "forward") for n in names]
>>> es = [Edge(a, b, f"{a}:0") for a, b in zip(names, names[1:])]
>>> g = OpGraph(ops, es, [Tensor(f"{n}:0", n, 8) for n in names])
>>> c = hosts(2, 2, "10gbe")
>>> r = hybrid_plan(g, c, replicas=2, micro_batches=2)
>>> r.replicas, r.stages, r.plan.placement["l1@r1@mb0"] == c.names[3]
(2, 2, True)
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from pesto.cluster import Cluster
from pesto.errors import MicroBatchError
from pesto.graph import OpGraph
from pesto.step import Transformed, check_count, compose, replicate, split as split_step
from pesto.step.replication import BUCKET_BYTES
from pesto.plan import Plan

from .cut import Phases, phases
from .pipelines import CANDIDATES, StepPlan, gpu_names, pipeline_plan, route_matrix, staged_plan, task_order
from .schedules import SCHEDULES, get as get_schedule

__all__ = ["hybrid_plan", "place_hybrid", "replica_groups", "replica_stages"]


def replica_groups(cluster: Cluster, replicas: int) -> list[list[str]]:
    """The GPUs cut into ``replicas`` groups of ``K`` (module doc, rule 1).

    >>> from pesto.cluster import hosts
    >>> [[d[-19:] for d in g] for g in replica_groups(hosts(2, 2), 2)]
    [['task:0/device:GPU:0', 'task:0/device:GPU:1'], ['task:1/device:GPU:0', 'task:1/device:GPU:1']]

    Raises
    ------
    MicroBatchError
        ``replicas`` not a count >= 1, or not dividing the GPUs.
    """
    n = check_count(replicas, "replicas")
    gpus = gpu_names(cluster)
    if len(gpus) % n:
        raise MicroBatchError(f"{n} replicas do not divide the {len(gpus)} GPUs of cluster {cluster.name!r}",
                              culprit=replicas)
    mine = set(gpus)
    together = [d for group in cluster.identical_groups() for d in group if d in mine]
    k = len(gpus) // n
    return [together[r * k:(r + 1) * k] for r in range(n)]


def hybrid_plan(graph: OpGraph, cluster: Cluster, *, replicas: int, micro_batches: int = 1,
                schedule: str = "1f1b", loss: str | None = None, candidates: int = CANDIDATES,
                weight_grads="separate", op_stages: Sequence[int] | None = None,
                bucket_bytes: int | None = BUCKET_BYTES) -> StepPlan:
    """``replicas`` replicas of ``graph``, each a pipeline over its group of
    GPUs in ``micro_batches`` slices (module doc); the plan places
    ``step_graph(graph, micro_batches, "replicated", replicas)``.

    ``schedule``: one of one model chunk (``"gpipe"``, ``"1f1b"``, ``"zb-h1"``,
    ``"zb-h2"``: weight gradients as their own tasks); ``candidates``: the stage splits
    :func:`~solver.parallel.pipelines.pipeline_plan` simulates on one group;
    ``weight_grads``: the split's rule for the slices' weight gradients
    (:func:`pesto.step.split`); ``op_stages``: the stage split given instead
    (``pipeline_plan``'s, its stage count the group size ``GPUs / replicas``).

    Raises
    ------
    MicroBatchError, BatchMarkError
        As :func:`replica_groups`, :func:`pesto.step.replicate` and
        :func:`pesto.step.split`.
    ValueError
        An unknown ``schedule``, or one of several chunks per device.
    """
    t0 = time.perf_counter()
    if get_schedule(schedule).chunks > 1:
        raise ValueError(f"hybrid: schedule {schedule!r} runs {SCHEDULES[schedule].chunks} model chunks per device; "
                         f"the hybrid runs schedules of one chunk")
    m = check_count(micro_batches)
    groups = replica_groups(cluster, replicas)
    k = len(groups[0])
    rest = [d.name for d in cluster.devices if d.kind != "GPU"] if cluster.gpus else []
    routes = np.max([route_matrix(cluster, g) for g in groups], axis=0)   # the slowest replica's, per boundary
    pipe = pipeline_plan(graph, cluster.subset(groups[0] + rest), schedule=schedule, micro_batches=m,
                         loss=loss, stages=k, candidates=candidates, weight_grads=weight_grads,
                         op_stages=op_stages, routes=routes)
    stage = _op_stages(pipe, groups[0])
    rep = replicate(graph, len(groups), bucket_bytes=bucket_bytes)
    split = split_step(rep.graph, m, weight_grads=weight_grads)
    rstage = replica_stages(rep, stage, k)
    back = phases(graph, loss=loss).backward
    ph = Phases((), frozenset(i for i, n in enumerate(rep.graph.names)
                              if rep.origin[n].role == "copy" and graph.index[rep.origin[n].op] in back), {})
    rank = [{t: j for j, t in enumerate(task_order(schedule, s, k, m))} for s in range(k)]
    pos = {i: p for p, i in enumerate(graph.topo_idx())}   # the replicas in step: ring ops ready early
    plan = staged_plan(split, cluster, rstage, [d for g in groups for d in g], ph,
                       lambda i, phase, s: rank[rstage[i] % k][(phase, s)], placer="hybrid", t0=t0,
                       weight_tasks=SCHEDULES[schedule].split_backward,
                       position=[pos[graph.index[rep.origin[n].op]] for n in rep.graph.names],
                       stats={"replicas": len(groups), "stages": k, "micro_batches": m})
    return StepPlan(plan, rep if m == 1 else compose(split, rep), m, k, schedule, pipe.blocking, len(groups))


def _op_stages(pipe: StepPlan, group: Sequence[str]) -> list[int]:
    """Each op of the step in ``pipe`` (a pipeline plan on ``group``) its
    stage: the position of its first copy's device; 0 off the group (a CPU op)."""
    where = {d: s for s, d in enumerate(group)}
    t, placement = pipe.transformed, pipe.plan.placement
    return [where.get(placement[t.copies(op.name)[0]], 0) for op in t.source.ops]


def replica_stages(rep: Transformed, stage: Sequence[int], k: int) -> list[int]:
    """Per op of ``rep.graph``, ``replica * k + stage``: a copy's stage is its
    op's, an all-reduce op's that of its tensor's first unbatched reader."""
    g = rep.source
    reader = {}
    for name, _, _, cons in g.tensor_table():
        steps = [stage[j] for j in cons if not g.ops[j].batch]
        if steps:
            reader[name] = min(steps)
    out = []
    for name in rep.graph.names:
        o = rep.origin[name]
        own = stage[g.index[o.op]]
        out.append(o.replica * k + (reader.get(o.tensor, own) if o.tensor else own))
    return out


def place_hybrid(graph: OpGraph, cluster: Cluster, *, replicas: int = 2, micro_batches: int = 1,
                 schedule: str = "1f1b", loss: str | None = None) -> Plan:
    """Replicas x pipeline stages (the plan places the replicated, split graph).

    :func:`hybrid_plan`: ``replicas`` groups of GPUs, each running one
    replica as a pipeline in ``micro_batches`` slices.
    """
    return hybrid_plan(graph, cluster, replicas=replicas, micro_batches=micro_batches, schedule=schedule,
                       loss=loss).plan
