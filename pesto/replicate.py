"""Data parallelism as a graph: ``N`` replicas of a step and their gradient all-reduce.

:func:`replicate` turns one training step (ops marked with
:attr:`pesto.graph.Op.batch`, the same preconditions as
:mod:`pesto.microbatch`) into the data-parallel step on ``N`` replicas, as an
ordinary :class:`~pesto.graph.OpGraph`. Placing replica ``r`` on device ``r``
is the data-parallel plan (:meth:`Replicated.placement`), which the simulator
times with every all-reduce transfer on the cluster's links.

* **replica r** holds ``op@r{r}`` for every op: a batched op as its slice
  ``r`` of ``N`` (the cost rule of :func:`pesto.microbatch.slice_op`: the
  replica's share of the batch); an unbatched op whole (its own copy of the
  variables, their reads and the optimizer: every replica applies the same
  update). Colocation groups become one per replica, ``group@r{r}``;
  tensors ``t@r{r}``;
* **the all-reduce**: each partial tensor ``t`` (a slice's weight gradient a
  batched op hands to an unbatched one, :func:`pesto.microbatch.partial_tensors`)
  of ``B`` bytes is summed over the replicas by a **ring** 0 -> 1 -> ... -> N-1
  -> 0 over chunks of ``ceil(B / N)`` bytes (the producer's output seen as
  ``N`` chunk tensors ``t@r{r}/chunk{j}``, views of one buffer):

  - reduce-scatter, steps ``s = 0 .. N-2``: replica ``r`` receives from
    ``r - 1`` its running sum of chunk ``j = (r - 1 - s) mod N`` and adds its
    own: op ``t@rs{s}@r{r}`` (an add of ``ceil(B / N)`` bytes, costed as
    :func:`pesto.microbatch.accumulate_op`); after ``N - 1`` steps replica
    ``r`` holds the sum of chunk ``(r + 1) mod N``;
  - all-gather, steps ``s = 0 .. N-2``: replica ``r`` receives from ``r - 1``
    a summed chunk: op ``t@ag{s}@r{r}`` (no compute: the transfer is the cost);
  - ``t@allreduce@r{r}`` (no compute) gathers the ``N`` summed chunks into
    the ``B``-byte gradient the replica's unbatched consumers read.

  That is ``2 (N - 1)`` transfers of ``ceil(B / N)`` bytes per replica between
  ring neighbours, the bandwidth-optimal ring of NCCL and Horovod. Each
  tensor's all-reduce depends only on its own gradient, so it overlaps the
  rest of the backward pass wherever the graph allows. The ring's order is
  the replica order: put neighbours on well-connected devices.

The sum is what the update needs when each replica's loss is normalised by
the whole batch (as for :mod:`pesto.microbatch`). ``N = 1`` is the step itself
under the names ``op@r0``. ``microbatch(replicate(g, N).graph, M)`` splits
every replica into ``M`` micro-batches (the accumulation runs per replica,
before its all-reduce).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> ops = [Op("x", {"GPU": 40.0}, output_bytes=800, batch=True),
...        Op("dw", {"GPU": 80.0}, output_bytes=64, batch=True),
...        Op("apply", {"GPU": 5.0}, batch=False)]
>>> g = OpGraph(ops, [Edge("x", "dw", "x:0"), Edge("dw", "apply", "dw:0")],
...             [Tensor("x:0", "x", 800), Tensor("dw:0", "dw", 64)])
>>> rep = replicate(g, 2)
>>> rep.graph.num_ops, rep.graph.op("x@r1").compute["GPU"]
(12, 20.0)
>>> rep.graph.predecessors("dw:0@rs0@r1"), rep.graph.tensor("dw:0@r0/chunk1").bytes
(['dw@r0', 'dw@r1'], 32)
>>> sorted(rep.graph.predecessors("dw:0@allreduce@r1"))
['dw:0@ag0@r1', 'dw:0@rs0@r1']
>>> sorted(set(rep.placement(["/GPU:0", "/GPU:1"]).values()))
['/GPU:0', '/GPU:1']
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, Sequence

from .errors import MicroBatchError
from .graph import Edge, Op, OpGraph, Tensor
from .microbatch import (BANDWIDTH, FLOOR_US, accumulate_op, check_count, check_marks, fixed_ops,
                         partial_tensors, slice_op)

__all__ = ["replicate", "Replicated", "ReplicaOrigin", "replica_name", "RESERVED"]

#: Names :func:`replicate` makes: an original op or tensor may not look like them.
RESERVED = re.compile(r"@(r|rs|ag)\d|@allreduce@")


@dataclass(frozen=True)
class ReplicaOrigin:
    """Where an op of a replicated graph comes from.

    Attributes
    ----------
    op : str
        The original op (for an all-reduce op: the producer of the gradient).
    replica : int
    role : str
        ``"copy"`` (a batched op's share), ``"step"`` (an unbatched op's copy),
        ``"reduce-scatter"``, ``"all-gather"`` or ``"gather"``.
    tensor : str or None
        The original tensor an all-reduce op sums.
    """

    op: str
    replica: int
    role: str
    tensor: str | None = None


@dataclass(frozen=True)
class Replicated:
    """A step replicated for data parallelism (:func:`replicate`).

    Attributes
    ----------
    graph : OpGraph
    source : OpGraph
    replicas : int
    origin : mapping op of ``graph`` -> ReplicaOrigin
    """

    graph: OpGraph
    source: OpGraph
    replicas: int
    origin: Mapping[str, ReplicaOrigin]

    def placement(self, devices: Sequence[str]) -> dict[str, str]:
        """Replica ``r`` on ``devices[r]``: the data-parallel placement.

        Raises
        ------
        MicroBatchError
            Fewer devices than replicas.
        """
        if len(devices) < self.replicas:
            raise MicroBatchError(f"{self.replicas} replicas need as many devices, got {list(devices)}",
                                  culprit=len(devices))
        return {name: devices[o.replica] for name, o in self.origin.items()}


def replica_name(name: str, r: int) -> str:
    """Replica ``r``'s copy of op (or tensor) ``name``: ``name@r{r}``."""
    return f"{name}@r{r}"


def replicate(graph: OpGraph, replicas: int, *, floor_us: float = FLOOR_US,
              bandwidth: Mapping[str, float] = BANDWIDTH) -> Replicated:
    """The data-parallel step of ``graph`` on ``replicas`` replicas (module doc).

    Raises
    ------
    MicroBatchError
        ``replicas`` not an integer >= 1; a device kind without bandwidth.
    BatchMarkError
        As :func:`pesto.microbatch.microbatch`.
    """
    n = check_count(replicas, "replicas")
    check_marks(graph, RESERVED)
    b = _Ring(graph, n, floor_us, bandwidth)
    for r in range(n):
        b.add_replica(r)
    for t in sorted(b.to_step):
        b.all_reduce(graph.tensor(t))
    b.add_edges()
    out = OpGraph(b.ops, [Edge(u, v, tuple(dict.fromkeys(ts))) for (u, v), ts in b.edges.items()],
                  b.tensors, name=f"{graph.name}@r{n}")
    return Replicated(out, graph, n, MappingProxyType(b.origin))


class _Ring:
    """The pieces of a replicated graph while it is built."""

    def __init__(self, graph: OpGraph, n: int, floor_us: float, bandwidth):
        self.g, self.n, self.floor, self.bw = graph, n, floor_us, bandwidth
        self.partials = partial_tensors(graph)
        self.fixed = fixed_ops(graph, self.partials)
        batched = [bool(op.batch) for op in graph.ops]
        self.to_step = {name for name, src, _, cons in graph.tensor_table()
                        if batched[src] and any(not batched[j] for j in cons)}
        self.produced: dict[str, list[Tensor]] = {}
        for t in graph.tensors:
            self.produced.setdefault(t.src, []).append(t)
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.edges: dict[tuple[str, str], list[str]] = {}
        self.origin: dict[str, ReplicaOrigin] = {}
        self.final: dict[tuple[str, int], tuple[str, str]] = {}

    def add_replica(self, r: int) -> None:
        n = self.n
        for op in self.g.ops:
            name = replica_name(op.name, r)
            group = None if op.colocation_group is None else replica_name(op.colocation_group, r)
            mine = self.produced.get(op.name, [])
            if op.batch:
                kept = sum(t.bytes for t in mine if t.name in self.partials)
                self.ops.append(slice_op(op, n, name, fixed=op.name in self.fixed, partial_bytes=kept,
                                         floor_us=self.floor, colocation_group=group))
                self.origin[name] = ReplicaOrigin(op.name, r, "copy")
            else:
                self.ops.append(replace(op, name=name, colocation_group=group))
                self.origin[name] = ReplicaOrigin(op.name, r, "step")
            for t in mine:
                size = t.bytes if not op.batch or t.name in self.partials else -(-t.bytes // n)
                self.tensors.append(Tensor(replica_name(t.name, r), name, size))
                if t.name in self.to_step:
                    self.final[(t.name, r)] = (name, replica_name(t.name, r))
                    if n > 1:
                        self.tensors.extend(Tensor(_chunk(t.name, r, j), name, -(-t.bytes // n))
                                            for j in range(n))

    def add_op(self, op: Op, r: int, role: str, t: Tensor, inputs) -> None:
        """Add ``op`` (its output tensor has its name) fed by ``inputs`` = [(op, tensor)]."""
        self.ops.append(op)
        self.tensors.append(Tensor(op.name, op.name, op.output_bytes))
        self.origin[op.name] = ReplicaOrigin(t.src, r, role, t.name)
        for src, tensor in inputs:
            self.edges.setdefault((src, op.name), []).append(tensor)

    def all_reduce(self, t: Tensor) -> None:
        """The ring reduce-scatter + all-gather of partial ``t`` (module doc)."""
        n = self.n
        if n == 1:
            return
        c = -(-t.bytes // n)
        kinds = self.g.op(t.src).kinds
        for r in range(n):
            left = (r - 1) % n
            for s in range(n - 1):
                j = (r - 1 - s) % n
                came = ((replica_name(t.src, left), _chunk(t.name, left, j)) if s == 0 else
                        (f"{t.name}@rs{s - 1}@r{left}",) * 2)
                op = accumulate_op(f"{t.name}@rs{s}@r{r}", c, kinds, floor_us=self.floor, bandwidth=self.bw,
                                   what=t.name, scope=self.g.op(t.src).scope)
                self.add_op(replace(op, type="RingReduce"), r, "reduce-scatter", t,
                            [came, (replica_name(t.src, r), _chunk(t.name, r, j))])
            for s in range(n - 1):
                came = f"{t.name}@rs{n - 2}@r{left}" if s == 0 else f"{t.name}@ag{s - 1}@r{left}"
                self.add_op(_free(f"{t.name}@ag{s}@r{r}", c, kinds, "RingGather"), r, "all-gather", t,
                            [(came, came)])
            parts = [f"{t.name}@rs{n - 2}@r{r}"] + [f"{t.name}@ag{s}@r{r}" for s in range(n - 1)]
            name = f"{t.name}@allreduce@r{r}"
            self.add_op(_free(name, t.bytes, kinds, "AllReduceGather"), r, "gather", t, [(p, p) for p in parts])
            self.final[(t.name, r)] = (name, name)

    def add_edges(self) -> None:
        g = self.g
        for e in g.edges:
            bu, bv = g.op(e.src).batch, g.op(e.dst).batch
            for r in range(self.n):
                dst = replica_name(e.dst, r)
                if bu and not bv and e.tensors:
                    for t in e.tensors:
                        src, tensor = self.final[(t, r)]
                        self.edges.setdefault((src, dst), []).append(tensor)
                else:
                    self.edges.setdefault((replica_name(e.src, r), dst), []).extend(
                        replica_name(t, r) for t in e.tensors)


def _chunk(tensor: str, r: int, j: int) -> str:
    return f"{replica_name(tensor, r)}/chunk{j}"


def _free(name: str, nbytes: int, kinds, type_: str) -> Op:
    """An op that costs nothing but holds ``nbytes`` (a received or gathered buffer)."""
    return Op(name, {k: 0.0 for k in kinds}, output_bytes=nbytes, type=type_, batch=False)
