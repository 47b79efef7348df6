"""Data parallelism as a graph: ``N`` replicas of a step and their gradient all-reduce.

:func:`replicate` turns one training step (ops marked with
:attr:`pesto.graph.Op.batch`, the same preconditions as
:func:`pesto.step.split`) into the data-parallel step on ``N`` replicas, as an
ordinary :class:`~pesto.graph.OpGraph` in a
:class:`~pesto.step.transform.Transformed`. Placing replica ``r`` on device ``r``
is the data-parallel plan (:meth:`~pesto.step.transform.Transformed.placement`),
which the simulator times with every all-reduce transfer on the cluster's links.

* **replica r** holds ``op@r{r}`` for every op: a batched op as its slice
  ``r`` of ``N`` (the cost rule of :func:`pesto.step.slicing.slice_op`: the
  replica's share of the batch); an unbatched op whole (its own copy of the
  variables, their reads and the optimizer: every replica applies the same
  update). Colocation groups become one per replica, ``group@r{r}``;
  tensors ``t@r{r}``; a copy's :attr:`~pesto.graph.Op.anchor` names the
  same replica's copy;
* **the all-reduce**: each partial tensor ``t`` (a slice's weight gradient a
  batched op hands to an unbatched one, :func:`pesto.step.slicing.partial_tensors`)
  of ``B`` bytes is summed over the replicas by a **ring** 0 -> 1 -> ... -> N-1
  -> 0 over chunks of ``ceil(B / N)`` bytes (the producer's output seen as
  ``N`` chunk tensors ``t@r{r}/chunk{j}``, views of one buffer):

  - reduce-scatter, steps ``s = 0 .. N-2``: replica ``r`` receives from
    ``r - 1`` its running sum of chunk ``j = (r - 1 - s) mod N`` and adds its
    own: op ``t@rs{s}@r{r}`` (an add of ``ceil(B / N)`` bytes, costed as
    :func:`pesto.step.slicing.accumulate_op`); after ``N - 1`` steps replica
    ``r`` holds the sum of chunk ``(r + 1) mod N``;
  - all-gather, steps ``s = 0 .. N-2``: replica ``r`` receives from ``r - 1``
    a summed chunk: op ``t@ag{s}@r{r}`` (no compute: the transfer is the cost);
  - ``t@allreduce@r{r}`` (no compute) gathers the ``N`` summed chunks into
    the ``B``-byte gradient the replica's unbatched consumers read.

  That is ``2 (N - 1)`` transfers of ``ceil(B / N)`` bytes per replica between
  ring neighbours, the bandwidth-optimal ring of NCCL and Horovod. The ring's
  order is the replica order: put neighbours on well-connected devices.
* **buckets** (tensor fusion, as PyTorch DDP and Horovod): one ring per
  tensor pays ``2 (N - 1)`` transfer latencies per tensor, ruinous for models
  with many small gradients. :func:`gradient_buckets` orders the partials as
  the backward pass makes them ready (producer depth, then topological
  position) and packs them into consecutive buckets of at most
  ``bucket_bytes`` (default :data:`BUCKET_BYTES`, DDP's 25 MiB; a larger
  tensor is a bucket alone; ``0`` or ``None``: one bucket per tensor, the
  graph of one ring per tensor op for op). A bucket of ``B`` bytes (its
  members' sum) runs the ring above, its ops named after its **first
  member** ``t`` (a bucket of one keeps the tensor's own names). Its chunks
  ``t@r{r}/chunk{j}`` are produced by the last member's producer, and every
  reduce-scatter step of replica ``r`` also waits (control edges) for every
  other member's producer in ``r``, step 0 as well in ``r - 1``: the bucket
  starts when all its gradients are ready, and its earlier buckets overlap
  the rest of the backward pass. ``t@allreduce@r{r}`` outputs one tensor
  ``m@allreduce@r{r}`` per member ``m`` (its bytes), read by ``m``'s
  unbatched consumers. :attr:`~pesto.step.transform.Origin.members` names the tensors a ring
  op sums; its ``op`` / ``tensor`` are the first member's (a placer that puts
  a tensor's ring by its variable, as :mod:`solver.parallel.hybrid`, puts a bucket by
  its first member's variable; transfers carry the other members').

* **sparse gradients** (an embedding's ``IndexedSlices``: its rows and
  indices, the partials of ops marked ``role="sparse-grad"``,
  :func:`pesto.step.slicing.sparse_partials`) cannot be summed: as
  TensorFlow's replicated step (:mod:`tf_patch.replicastep`), every replica
  gathers every replica's rows, which the optimizer sums per row. Each
  replica produces its own rows (its share of the batch: ``ceil(B / N)``
  bytes of each tensor, sliced as an activation), and per variable
  (:func:`sparse_updates`: the rows and indices of one embedding are one
  gradient, outside the buckets) a **ring all-gather** runs: steps
  ``t@ag{s}@r{r}`` (``s = 0 .. N-2``, no compute, the replica's rows'
  bytes each: the first receives the left neighbour's own rows, the next
  what it received) and ``t@allreduce@r{r}`` (the ``B`` bytes of all rows,
  one tensor ``m@allreduce@r{r}`` per member), read by the update. That is
  ``N - 1`` transfers of ``B / N`` per replica, where an all-reduce of the
  rows would move ``2 (N - 1) B / N`` (Transformer-6 on 4 GPUs: 12 MiB per
  lane instead of 24).

**Sharded optimizer state** (``shard_optimizer=1|2``, ZeRO-1 / ZeRO-2 of
DeepSpeed; Rajbhandari et al., SC'20). Each replica updates only its
``1 / N`` shard of every bucket's parameters:

* the **optimizer state** (:func:`optimizer_state`: once-per-step ops with
  persistent bytes read only on the way to ops marked ``phase="update"``,
  never by a batched op: Adam's slots) holds ``ceil(bytes / N)`` per replica; weights stay whole;
* the **updates** (the once-per-step consumers of the gradients) take
  ``1 / N`` of their compute and temporary bytes, and read the replica's
  shard of the summed gradient: the last reduce-scatter step's output
  (``ceil(B / N)`` bytes). The gradients are reduce-scattered, not
  all-reduced: no all-gather of gradients, no ``@allreduce@`` gather;
* the **updated parameters** are all-gathered by the same ring: steps
  ``t@ag{s}@r{r}`` (``ceil(B / N)`` bytes each, the first from the left
  neighbour's last update of the bucket, the tensor ``t@r{r}/param``, after
  all its updates of the bucket) and ``t@allgather@r{r}`` (no bytes: the
  parameters are written in place), after the replica's own updates.
  Reduce-scatter + all-gather move ``2 (N - 1)`` chunks of
  ``ceil(B / N)`` bytes per replica: the same bytes as the all-reduce;
* a **sparse gradient's** variable is sharded by rows, as
  :mod:`tf_patch.replicastep` builds it: the rows are all-gathered as
  without sharding, and each replica runs its update's ops
  (:attr:`SparseUpdate.ops`: the deduplication, Adam's decay of its slots,
  the scatter-adds, the write) on its ``1 / N`` of the variable's rows
  (``1 / N`` of their compute, temporary and output bytes); then the
  updated row pieces of the **whole variable** (TensorFlow v1 Adam's sparse
  update decays ``m`` and ``v`` densely: every row changes) go round the
  ring: steps ``t@pg{s}@r{r}`` of ``ceil(V / N)`` bytes (``V`` the
  variable's bytes; the first from the left neighbour's last update op,
  tensor ``t@r{r}/param``) and ``t@allgather@r{r}`` (no bytes) after the
  replica's own update ops. Per replica ``(N - 1) (B + V) / N``: more than
  the unsharded step's ``(N - 1) B / N`` whenever the variable is larger
  than its rows (Transformer-6: 12 + 47 MiB per lane);
* **ZeRO-1** keeps the whole gradient buffer until the update (the last
  reduce-scatter step holds ``B`` bytes, the buffer it summed into);
  **ZeRO-2** frees the gradient outside the shard after the reduce-scatter
  (that step holds ``ceil(B / N)``).

**Sharded parameters** (``shard_optimizer=3``, ZeRO-3 of DeepSpeed, PyTorch's
FSDP): ZeRO-2, and each replica holds ``1 / N`` of every parameter
(:func:`parameters`: once-per-step ops with persistent bytes that the batched
ops read, not the optimizer state):

* a parameter's persistent bytes are ``ceil(bytes / N)``; its reads (its
  once-per-step successors outside the update, TensorFlow's
  ``ReadVariableOp``) read the shard (``1 / N`` of their output and of
  their :attr:`~pesto.graph.Op.view_bytes`: a read is a view of the shard as
  it was of the variable; the gathered copies below are real allocations);
* the parameters, ordered by their first forward reader, are gathered in
  buckets (:func:`gather_units`): a layer block's parameters together
  (:func:`pesto.step.recompute.layer_blocks`, matched by scope: FSDP's
  wrapping of each transformer block, which users give it), the others packed
  into buckets of ``bucket_bytes`` (:func:`pack_buckets`). Gathering by
  25 MiB buckets instead, a two-buckets-ahead prefetch ran out in every layer
  (a small bucket between two large ones: GPT-2.7B on 8 NVLink V100s lost
  373 ms, 13 % of its step, waiting for gathers); per bucket and replica a
  **forward gather**: ``p@fsend@r{r}`` (no compute; it allocates the bucket's
  ``B``-byte gathered buffer and hands its ``ceil(B / N)``-byte shard to the
  right neighbour), ring steps ``p@pf{s}@r{r}`` (``s = 0 .. N-2``, a
  ``ceil(B / N)``-byte transfer each, written into the buffer: no bytes of
  their own) and ``p@fwgather@r{r}`` (the full copy, ``B`` bytes, one tensor
  ``w@fwgather@r{r}`` per member ``w``, held until its last reader), read by
  every *forward* reader of the members (a batched op reading the parameter
  or a read of it, phase ``"forward"``); named after the bucket's first
  member ``p``;
* the **backward gather** (``@bsend@``, ``@pb{s}@``, ``@bwgather@``, buckets
  ordered by their first backward reader) is the same ring again for the
  other readers (input gradients, recomputed copies): FSDP's default, the
  copy freed after the forward and gathered again;
* **prefetch**: a bucket's send waits (control edges) only for the ring to be
  free (the previous bucket's gather of its chain) and for the first reader of
  the bucket two before to be done, so a gather overlaps the compute of the
  layer before (at most about two gathered buckets ahead, FSDP's limit of
  in-flight all-gathers); a backward chain's first two buckets also wait for
  their forward readers;
* gradients are reduce-scattered as ZeRO-2 and each replica updates its shard;
  no all-gather of the updated parameters (the next step's gathers do it).
  Per replica two all-gathers and the reduce-scatter move ``3 (N - 1)``
  chunks of ``ceil(B / N)`` bytes: 1.5 times the all-reduce's bytes;
* a sparse gradient's rows are all-gathered and its update runs on the
  replica's rows, as under ZeRO-1/2, with no all-gather of the updated
  rows: TensorFlow's ZeRO-3 step gathers the embedding's row pieces for its
  lookup (a ``GatherV2`` of the gathered copy), this model's forward gather
  of the parameter; neither gathers it for the backward pass (the lookup's
  gradient reads only the variable's shape).

The sum is what the update needs when each replica's loss is normalised by
the whole batch (as for :func:`pesto.step.split`). ``N = 1`` is the step itself
under the names ``op@r0``. ``split(replicate(g, N).graph, M)`` splits
every replica into ``M`` micro-batches (the accumulation runs per replica,
before its all-reduce; a replica's sparse rows are sliced too and
concatenated there, ``t@r{r}@acc{M-1}``, as TensorFlow's replicated step
concatenates its slices' rows: :mod:`pesto.step.slicing`; the ring gathers
the concatenation, the replica's ``ceil(B / N)`` bytes);
:func:`~pesto.step.transform.compose` maps its ops straight to the step's.

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

Two gradients of 64 bytes fuse into one bucket (named after ``dw1:0``, the
first ready) unless ``bucket_bytes`` is smaller than their sum:

>>> ops = [Op("x", {"GPU": 40.0}, output_bytes=800, batch=True),
...        Op("dw1", {"GPU": 80.0}, output_bytes=64, batch=True),
...        Op("dw2", {"GPU": 80.0}, output_bytes=64, batch=True),
...        Op("apply", {"GPU": 5.0}, batch=False)]
>>> g = OpGraph(ops, [Edge("x", "dw1", "x:0"), Edge("dw1", "dw2", ()), Edge("dw1", "apply", "dw1:0"),
...                   Edge("dw2", "apply", "dw2:0")],
...             [Tensor("x:0", "x", 800), Tensor("dw1:0", "dw1", 64), Tensor("dw2:0", "dw2", 64)])
>>> rep = replicate(g, 2)
>>> rep.origin["dw1:0@rs0@r0"].members, rep.graph.tensor("dw1:0@r0/chunk0").bytes
(('dw1:0', 'dw2:0'), 64)
>>> rep.graph.edge("dw1:0@allreduce@r0", "apply@r0").tensors
('dw1:0@allreduce@r0', 'dw2:0@allreduce@r0')
>>> len([o for o in replicate(g, 2, bucket_bytes=100).origin.values() if o.role == "gather"])
4
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping, Sequence

from ..errors import MicroBatchError
from ..graph import Edge, Op, OpGraph, Tensor, common_scope, gc_paused
from .slicing import (BANDWIDTH, FLOOR_US, accumulate_op, check_marks, fixed_ops, partial_tensors, slice_op,
                      sparse_partials)
from .recompute import layer_blocks
from .transform import Origin, Transformed, check_count, renamed

__all__ = ["replicate", "replica_name", "RESERVED", "BUCKET_BYTES", "gradient_buckets", "pack_buckets", "gather_units",
           "optimizer_state", "parameters", "SHARD_LEVELS", "SparseUpdate", "sparse_updates"]

#: Default gradient bucket size in bytes (PyTorch DDP's ``bucket_cap_mb=25``).
BUCKET_BYTES = 25 * 2**20
#: Size of the first bucket (DDP's 1 MiB): the first gradients ready start
#: their ring without waiting for 25 MiB of others. Measured (data-parallel,
#: ResNet50): 4 PCIe GPUs 32.9 ms unfused, 34.7 ms fused; 4 hosts x 2 over
#: InfiniBand 186.6 ms unfused (a latency per small tensor), 17.8 ms fused.
FIRST_BUCKET_BYTES = 2**20

#: Names :func:`replicate` makes: an original op or tensor may not look like them.
RESERVED = re.compile(r"@(r|rs|ag|pg|pf|pb)\d|@allreduce@|@allgather@|@(fw|bw)gather@|@[fb]send@")
#: The values of ``shard_optimizer``: none, ZeRO-1, ZeRO-2, ZeRO-3 (parameters sharded too).
SHARD_LEVELS = (0, 1, 2, 3)


def replica_name(name: str, r: int) -> str:
    """Replica ``r``'s copy of op (or tensor) ``name``: ``name@r{r}``."""
    return f"{name}@r{r}"


def pack_buckets(sizes: Sequence[int], bucket_bytes: int | None, first_bytes: int | None = None) -> list[list[int]]:
    """Pack items of ``sizes`` (in order) into consecutive buckets of at most ``bucket_bytes``
    (the first of at most ``first_bytes``, when given and smaller).

    A bucket is closed when the next item would overflow it; an item larger
    than ``bucket_bytes`` is a bucket alone. ``bucket_bytes`` ``0`` or
    ``None``: one bucket per item.

    Raises
    ------
    MicroBatchError
        A negative ``bucket_bytes``.

    Examples
    --------
    >>> pack_buckets([10, 20, 5, 40, 1], 30)
    [[0, 1], [2], [3], [4]]
    >>> pack_buckets([10, 20], None), pack_buckets([10, 20, 5, 4], 30, first_bytes=10)
    ([[0], [1]], [[0], [1, 2, 3]])
    """
    if bucket_bytes is not None and (isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int)
                                     or bucket_bytes < 0):
        raise MicroBatchError(f"bucket_bytes must be an integer >= 0 or None, got {bucket_bytes!r}",
                              culprit=bucket_bytes)
    out: list[list[int]] = []
    total = 0
    for i, b in enumerate(sizes):
        cap = _cap(bucket_bytes, first_bytes, len(out))
        if out and cap and total + b <= cap:
            out[-1].append(i)
            total += b
        else:
            out.append([i])
            total = b
    return out


def _cap(bucket_bytes: int | None, first_bytes: int | None, buckets: int) -> int | None:
    """The size limit of the bucket being filled, ``buckets`` buckets open."""
    return min(bucket_bytes, first_bytes) if bucket_bytes and first_bytes and buckets == 1 else bucket_bytes


def _mark_after(succ, starts, mark: list, k: int) -> None:
    """Mark with ``k`` every op reachable from ``starts`` (themselves included)."""
    todo = [j for j in starts if mark[j] != k]
    for j in todo:
        mark[j] = k
    while todo:
        i = todo.pop()
        for j in succ[i]:
            if mark[j] != k:
                mark[j] = k
                todo.append(j)


def gradient_buckets(graph: OpGraph, bucket_bytes: int | None = BUCKET_BYTES) -> list[tuple[str, ...]]:
    """The all-reduced tensors of ``graph`` packed into buckets (:func:`pack_buckets`).

    The tensors a batched op hands to an unbatched one (but a sparse
    gradient's, :func:`pesto.step.slicing.sparse_partials`: gathered, not
    all-reduced, :func:`sparse_updates`), in the order their
    gradients become ready in the backward pass: by their producer's depth
    (the most ops on a path from a source to it, itself included: the last
    layer's gradients come first, as their producers wait for fewer ops),
    ties by the producer's position in :meth:`~pesto.graph.OpGraph.topo_idx`,
    then (one producer) in ``graph.tensors`` order. A tensor whose producer
    waits for the open bucket's all-reduce (through an unbatched op between
    batched ops) starts a new bucket: fused, the ring would wait for itself.

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph, Tensor, Edge
    >>> ops = [Op("g1", {"GPU": 1.0}, batch=True), Op("g2", {"GPU": 1.0}, batch=True),
    ...        Op("apply", {"GPU": 1.0}, batch=False)]
    >>> g = OpGraph(ops, [Edge("g1", "g2", "g1:0"), Edge("g1", "apply", "g1:1"), Edge("g2", "apply", "g2:0")],
    ...             [Tensor("g1:0", "g1", 8), Tensor("g1:1", "g1", 16), Tensor("g2:0", "g2", 16)])
    >>> gradient_buckets(g, 32), gradient_buckets(g, None)
    ([('g1:1', 'g2:0')], [('g1:1',), ('g2:0',)])
    """
    batched = [bool(op.batch) for op in graph.ops]
    pos = {i: k for k, i in enumerate(graph.topo_idx())}
    depth = [0] * graph.num_ops
    preds = graph.pred_idx()
    for i in graph.topo_idx():
        depth[i] = 1 + max((depth[j] for j in preds[i]), default=0)
    sparse = sparse_partials(graph)
    ready = sorted(((depth[src], pos[src], k, name, nbytes, src, cons)
                    for k, (name, src, nbytes, cons) in enumerate(graph.tensor_table())
                    if batched[src] and any(not batched[j] for j in cons) and name not in sparse))
    if bucket_bytes is not None:
        pack_buckets([], bucket_bytes)   # the same check of bucket_bytes
    succ = graph.succ_idx()
    mark = [-1] * graph.num_ops   # the last bucket whose all-reduce an op waits for
    out: list[list[str]] = []
    total = 0
    for _, _, _, name, nbytes, src, cons in ready:
        cap = _cap(bucket_bytes, FIRST_BUCKET_BYTES, len(out))
        if out and cap and total + nbytes <= cap and mark[src] != len(out) - 1:
            out[-1].append(name)
            total += nbytes
        else:   # full, or produced after the open bucket's all-reduce (an op between batched ops)
            out.append([name])
            total = nbytes
        _mark_after(succ, [j for j in cons if not batched[j]], mark, len(out) - 1)
    return [tuple(b) for b in out]


@dataclass(frozen=True)
class SparseUpdate:
    """A sparse gradient and its update (:func:`sparse_updates`).

    Attributes
    ----------
    tensors : tuple of str
        The gradient's partial tensors (rows, indices), gathered together.
    variables : tuple of str
        The parameters (:func:`parameters`) an op of its update reads: the
        embedding it writes (none found: its update is not sharded).
    slots : tuple of str
        Their optimizer state of their size (Adam's ``m`` and ``v``).
    ops : tuple of str
        The update's once-per-step ops, in topological order: what ZeRO shards by rows.
    """

    tensors: tuple
    variables: tuple
    slots: tuple
    ops: tuple


def sparse_updates(graph: OpGraph) -> list[SparseUpdate]:
    """The sparse gradients of ``graph`` (:func:`pesto.step.slicing.sparse_partials`), one per
    variable, and their updates, in the order of their first tensor.

    A sparse tensor's update reaches, through once-per-step ops, from its
    once-per-step readers (a ``Unique``, an ``UnsortedSegmentSum``); its
    **variables** are the parameters (:func:`parameters`) an op of it reads
    (the tensors of one variable are one gradient: rows and indices); its
    **slots** the optimizer state (:func:`optimizer_state`) of a variable's
    size that such an op reads; its **ops** are the once-per-step ops reached
    from the readers or from the slots that lead (through those ops) to an op
    reading a variable or a slot: the update's dense decay of Adam's slots,
    its scatter-adds and its write of the variable, not the ops after the
    write. TensorFlow's sharded update runs these ops on each replica's rows
    (:mod:`tf_patch.replicastep`).

    >>> ops = [Op("x", {"GPU": 1.0}, output_bytes=64, batch=True),
    ...        Op("rows", {"GPU": 1.0}, output_bytes=32, batch=True, role="sparse-grad"),
    ...        Op("emb", {"GPU": 0.0}, persistent_bytes=400, batch=False),
    ...        Op("m", {"GPU": 0.0}, persistent_bytes=400, batch=False),
    ...        Op("decay", {"GPU": 9.0}, batch=False, phase="forward"),
    ...        Op("add", {"GPU": 1.0}, batch=False, phase="update"),
    ...        Op("write", {"GPU": 9.0}, batch=False, phase="update"),
    ...        Op("done", {"GPU": 0.0}, batch=False, phase="update")]
    >>> es = [Edge("emb", "x", ()), Edge("x", "rows", "x:0"), Edge("rows", "add", "rows:0"), Edge("m", "decay", ()),
    ...       Edge("decay", "add", ()), Edge("m", "add", ()), Edge("add", "write", ()), Edge("emb", "write", ()),
    ...       Edge("write", "done", ())]
    >>> u, = sparse_updates(OpGraph(ops, es, [Tensor("x:0", "x", 64), Tensor("rows:0", "rows", 32)]))
    >>> u.tensors, u.variables, u.slots, u.ops
    (('rows:0',), ('emb',), ('m',), ('decay', 'add', 'write'))
    """
    sparse = sparse_partials(graph)
    if not sparse:
        return []
    ops, names, pred, succ = graph.ops, graph.names, graph.pred_idx(), graph.succ_idx()
    once = [op.batch is False for op in ops]
    weights, state = parameters(graph), optimizer_state(graph)
    cons = graph.consumers()
    groups: dict[tuple, list[str]] = {}
    reach: dict[tuple, set] = {}
    for t in sorted(sparse):
        down = _downstream(succ, [graph.index[c] for c in cons[t] if once[graph.index[c]]], once)
        key = tuple(sorted({names[j] for i in down for j in pred[i] if names[j] in weights})) or (t,)
        groups.setdefault(key, []).append(t)
        reach.setdefault(key, set()).update(down)
    pos = {i: k for k, i in enumerate(graph.topo_idx())}
    out = []
    for key, tensors in groups.items():
        down = reach[key]
        variables = tuple(v for v in key if v in weights)
        sizes = {graph.op(v).persistent_bytes for v in variables}
        slots = tuple(sorted({names[j] for i in down for j in pred[i]
                              if names[j] in state and ops[j].persistent_bytes in sizes}))
        held = {graph.index[h] for h in (*variables, *slots)}
        down |= _downstream(succ, [j for h in held for j in succ[h]], once)
        touch = [i for i in down if any(j in held for j in pred[i])]
        mine = _downstream(pred, touch, [i in down for i in range(len(ops))])
        out.append(SparseUpdate(tuple(tensors), variables, slots,
                                tuple(names[i] for i in sorted(mine, key=pos.__getitem__))))
    return out


def _downstream(succ, starts, within) -> set:
    """The ops reachable from ``starts`` (themselves included) through ops ``within`` marks."""
    seen = {i for i in starts if within[i]}
    todo = list(seen)
    while todo:
        for j in succ[todo.pop()]:
            if within[j] and j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def replicate(graph: OpGraph, replicas: int, *, bucket_bytes: int | None = BUCKET_BYTES,
              floor_us: float = FLOOR_US, bandwidth: Mapping[str, float] = BANDWIDTH,
              shard_optimizer: int = 0) -> Transformed:
    """The data-parallel step of ``graph`` on ``replicas`` replicas (module doc).

    ``bucket_bytes``: gradients are fused into buckets of at most that many
    bytes, one ring each (:func:`gradient_buckets`); ``0`` or ``None``: one
    ring per gradient tensor. ``shard_optimizer``: ``0`` (every replica
    updates everything), ``1`` or ``2`` (ZeRO-1 / ZeRO-2: each replica
    updates its shard; module doc, "Sharded optimizer state"), ``3``
    (ZeRO-3: the parameters sharded too; module doc, "Sharded parameters").

    Raises
    ------
    MicroBatchError
        ``replicas`` not an integer >= 1; a bad ``bucket_bytes`` or
        ``shard_optimizer``; a device kind without bandwidth.
    BatchMarkError
        As :func:`pesto.step.split`.
    """
    n = check_count(replicas, "replicas")
    if shard_optimizer not in SHARD_LEVELS or isinstance(shard_optimizer, bool):
        raise MicroBatchError(f"shard_optimizer must be one of {SHARD_LEVELS} (0: none, 1: ZeRO-1 optimizer "
                              f"state, 2: ZeRO-2 optimizer state and gradient sharded, 3: ZeRO-3 parameters "
                              f"too), got {shard_optimizer!r}",
                              culprit=shard_optimizer)
    check_marks(graph, RESERVED)
    buckets = gradient_buckets(graph, bucket_bytes)
    sparse = sparse_updates(graph)
    with gc_paused():   # 60k ops and their tensors, edges and origins for GPT-1.3B on 8 replicas
        b = _Ring(graph, n, floor_us, bandwidth, buckets, shard_optimizer if n > 1 else 0, sparse)
        for r in range(n):
            b.add_replica(r)
        for members in sorted(buckets + [u.tensors for u in sparse]):
            b.all_reduce([graph.tensor(t) for t in members])
        if b.shard == 3:
            _Gathers(b, bucket_bytes).add()
        b.add_edges()
        zero = f"@zero{b.shard}" if b.shard else ""
        out = OpGraph(b.ops, [Edge(u, v, tuple(ts) if len(ts) < 2 else tuple(dict.fromkeys(ts)))
                              for (u, v), ts in b.edges.items()],
                      b.tensors, name=f"{graph.name}@r{n}{zero}")
    return Transformed(out, graph, MappingProxyType(b.origin), replicas=n, partials=b.partials)


class _Ring:
    """The pieces of a replicated graph while it is built."""

    def __init__(self, graph: OpGraph, n: int, floor_us: float, bandwidth, buckets, shard: int = 0, sparse=()):
        self.g, self.n, self.floor, self.bw, self.shard = graph, n, floor_us, bandwidth, shard
        self.partials = partial_tensors(graph)
        #: a sparse gradient's tensor -> its update (gathered rows: sliced as activations are)
        self.sparse = {t: u for u in sparse for t in u.tensors}
        self.dense = self.partials - self.sparse.keys()
        self.fixed = fixed_ops(graph, self.dense)
        self.to_step = {t for members in buckets for t in members} | self.sparse.keys()
        #: last member of a bucket -> (its first member, the bucket's bytes): the chunks' producer
        self.chunks_of = {m[-1]: (m[0], sum(graph.tensor(t).bytes for t in m)) for m in buckets}
        self.produced: dict[str, list[Tensor]] = {}
        for t in graph.tensors:
            self.produced.setdefault(t.src, []).append(t)
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.edges: dict[tuple[str, str], list[str]] = {}
        self.origin: dict[str, Origin] = {}
        self.final: dict[tuple[str, int], tuple[str, str]] = {}
        #: sharded: the optimizer state, the updates (the shard's), bucket -> its updates, and
        #: the last update of a bucket -> the (first member, chunk bytes) of the parameters it hands on
        self.state = optimizer_state(graph) if shard else frozenset()
        self.updates: dict[str, list[str]] = {}
        self.params: dict[str, list[tuple[str, int]]] = {}
        if shard:
            pos = {i: k for k, i in enumerate(graph.topo_idx())}
            cons = graph.consumers()
            for m in buckets:
                ups = sorted({u for t in m for u in cons[t] if not graph.op(u).batch}, key=lambda u: pos[graph.index[u]])
                self.updates[m[0]] = ups
                if ups and shard < 3:
                    self.params.setdefault(ups[-1], []).append((m[0], -(-self.chunks_of[m[-1]][1] // n)))
        self.sharded = frozenset(u for ups in self.updates.values() for u in ups)
        #: sharded: the ops of the sparse updates, run on the replica's rows, and per sparse
        #: gradient (its first tensor) the bytes of its variables (ZeRO-1/2 all-gather their rows)
        self.rows: frozenset = frozenset()
        self.param_bytes: dict[str, int] = {}
        for u in (sparse if shard else ()):
            if not u.variables:   # no variable found: its update is not sharded
                continue
            self.rows |= set(u.ops)
            self.updates[u.tensors[0]] = list(u.ops)
            self.param_bytes[u.tensors[0]] = nbytes = sum(graph.op(v).persistent_bytes for v in u.variables)
            if shard < 3:
                self.params.setdefault(u.ops[-1], []).append((u.tensors[0], -(-nbytes // n)))
        #: ZeRO-3: the parameters, the once-per-step ops that read them (their reads: sharded), and
        #: (reader's source, batched reader) -> the parameter, the edges a gathered copy replaces
        self.weights = parameters(graph) if shard == 3 else frozenset()
        self.reads, self.reroute = _reads(graph, self.weights)
        self._shapes: list | None = None   # :meth:`shapes`, made once
        #: per bucket (its first member): its members' names (:meth:`add_op`) and its
        #: reduce-scatter step (:meth:`ring_step`)
        self.bucket_names: dict[str, tuple] = {}
        self.steps: dict[tuple[str, bool], Op] = {}

    def add_replica(self, r: int) -> None:
        """Replica ``r``'s copies of the step's ops and their tensors: :meth:`shapes`
        (made once, every replica alike) under replica ``r``'s names."""
        n, g, to_step = self.n, self.g, self.to_step
        for op, copy, role, params, outs in self.shapes():
            name = replica_name(op.name, r)
            group = None if op.colocation_group is None else replica_name(op.colocation_group, r)
            self.origin[name] = Origin(op.name, replica=r, role=role)
            self.tensors.extend(Tensor(_param(t, r), name, c) for t, c in params)
            self.ops.append(renamed(copy, name, group, replica_name(op.anchor, r) if op.anchor in g else op.anchor))
            for t, size, chunks in outs:
                tensor = replica_name(t, r)
                self.tensors.append(Tensor(tensor, name, size))
                if t in to_step:
                    self.final[(t, r)] = (name, tensor)
                if chunks is not None:
                    first, c = chunks
                    self.tensors.extend(Tensor(_chunk(first, r, j), name, c) for j in range(n))

    def shapes(self) -> list[tuple]:
        """Per op of the step, what each replica holds of it, under the step's names
        (:meth:`add_replica` renames): ``(op, copy, role, params, outs)``, ``copy`` a
        batched op's slice (:func:`~pesto.step.slicing.slice_op`: ``1 / n`` of the batch)
        or a once-per-step op (sharded: :meth:`shard_of`); ``params``: the ``(bucket, bytes)``
        of the updated parameter shards it hands on (sharded); ``outs``: per output tensor its
        name, its bytes in a replica and its bucket's chunks ``(first member, bytes)`` when it
        is a bucket's last member (else None)."""
        if self._shapes is not None:
            return self._shapes
        n, out = self.n, []
        for op in self.g.ops:
            mine = self.produced.get(op.name, [])
            if op.batch:
                kept = sum(t.bytes for t in mine if t.name in self.dense)
                copy = slice_op(op, n, op.name, fixed=op.name in self.fixed, partial_bytes=kept,
                                floor_us=self.floor, colocation_group=op.colocation_group)
                role, params = "copy", ()
            else:
                shard = self.shard_of(op)
                copy = replace(op, **shard) if shard else op
                role, params = "step", tuple(self.params.get(op.name, ()))
            outs = []
            for t in mine:
                size = t.bytes if not op.batch or t.name in self.dense else -(-t.bytes // n)
                size = -(-size // n) if op.name in self.reads or op.name in self.rows else size
                chunks = None
                if t.name in self.chunks_of and n > 1:
                    first, total = self.chunks_of[t.name]
                    chunks = (first, -(-total // n))
                outs.append((t.name, size, chunks))
            out.append((op, copy, role, params, outs))
        self._shapes = out
        return out

    def shard_of(self, op: Op) -> dict:
        """The fields of a once-per-step op that sharding changes: an optimizer
        state's persistent bytes, an update's compute and temporary bytes and
        (ZeRO-3) a parameter read's output and view bytes, ``1 / n``."""
        n = self.n
        if op.name in self.state or op.name in self.weights:
            return {"persistent_bytes": -(-op.persistent_bytes // n)}
        if op.name in self.reads:   # a read of the shard: a view of it as the read was of the variable
            return {"output_bytes": -(-op.output_bytes // n), "view_bytes": -(-op.view_bytes // n)}
        if op.name in self.rows:   # a sparse update's op on the replica's rows of the variable and slots
            return {"compute": {k: t / n for k, t in op.compute.items()},
                    "temporary_bytes": -(-op.temporary_bytes // n), "output_bytes": -(-op.output_bytes // n),
                    "view_bytes": -(-op.view_bytes // n)}
        if op.name in self.sharded:
            return {"compute": {k: t / n for k, t in op.compute.items()},
                    "temporary_bytes": -(-op.temporary_bytes // n)}
        return {}

    def add_op(self, op: Op, r: int, role: str, members, inputs, outputs=None) -> None:
        """Add ``op`` fed by ``inputs`` = [(op, tensor or None for a control edge)];
        its output tensors ``outputs`` = [(name, bytes)] (default: one, under its name)."""
        self.ops.append(op)
        self.tensors.extend(Tensor(t, op.name, nb) for t, nb in (outputs or [(op.name, op.output_bytes)]))
        first = members[0].name
        names = self.bucket_names.get(first)
        if names is None:   # a bucket is named after its first member
            names = self.bucket_names[first] = tuple(t.name for t in members)
        self.origin[op.name] = Origin(members[0].src, replica=r, role=role, tensor=first, members=names)
        for src, tensor in inputs:
            ts = self.edges.setdefault((src, op.name), [])
            if tensor is not None:
                ts.append(tensor)

    def all_reduce(self, members: list[Tensor]) -> None:
        """The ring reduce-scatter + all-gather of one bucket of partials (module doc);
        sharded: the reduce-scatter, then the updated parameters' all-gather."""
        if self.n == 1:
            return
        if members[0].name in self.sparse:   # a sparse gradient: its rows gathered; sharded, then its variable's
            for r in range(self.n):
                self.gather_rows(members, r)
                if self.shard in (1, 2):
                    self.gather_params(members, r)
            return
        for r in range(self.n):
            self.reduce_scatter(members, r)
            if self.shard in (1, 2):
                self.gather_params(members, r)
            elif not self.shard:
                self.gather_sums(members, r)

    def reduce_scatter(self, members: list[Tensor], r: int) -> None:
        """Replica ``r``'s ``n - 1`` reduce-scatter steps of a bucket; sharded, its last
        step's output is the shard its updates read (ZeRO-1: in the whole bucket's buffer)."""
        n, t, last = self.n, members[0], members[-1]
        waits = list(dict.fromkeys(m.src for m in members if m.src != last.src))
        left = (r - 1) % n
        mine = [(replica_name(p, r), None) for p in waits]
        for s in range(n - 1):
            j = (r - 1 - s) % n
            came = ([(replica_name(last.src, left), _chunk(t.name, left, j))]
                    + [(replica_name(p, left), None) for p in waits] if s == 0 else
                    [(f"{t.name}@rs{s - 1}@r{left}",) * 2])
            self.add_op(renamed(self.ring_step(members, s == n - 2 and self.shard == 1), f"{t.name}@rs{s}@r{r}",
                                None, None), r, "reduce-scatter", members,
                        came + [(replica_name(last.src, r), _chunk(t.name, r, j))] + mine)
        if self.shard:
            shard = f"{t.name}@rs{n - 2}@r{r}"
            for m in members:
                self.final[(m.name, r)] = (shard, shard)

    def ring_step(self, members: list[Tensor], whole: bool) -> Op:
        """A reduce-scatter step of a bucket, named after its first member (each step of each
        replica renames it): an add of a chunk (:func:`~pesto.step.slicing.accumulate_op`);
        ``whole``: holding the whole bucket (ZeRO-1's last step)."""
        t = members[0]
        op = self.steps.get((t.name, whole))
        if op is None:
            total = sum(m.bytes for m in members)
            src = self.g.op(t.src)
            op = accumulate_op(t.name, -(-total // self.n), src.kinds, floor_us=self.floor, bandwidth=self.bw,
                               what=t.name, scope=src.scope)
            op = self.steps[(t.name, whole)] = replace(op, type="RingReduce",
                                                       **({"output_bytes": total} if whole else {}))
        return op

    def gather_sums(self, members: list[Tensor], r: int) -> None:
        """Replica ``r``'s all-gather of the summed chunks and the gather its consumers read."""
        n, t = self.n, members[0]
        total = sum(m.bytes for m in members)
        c = -(-total // n)
        kinds = self.g.op(t.src).kinds
        left = (r - 1) % n
        for s in range(n - 1):
            came = f"{t.name}@rs{n - 2}@r{left}" if s == 0 else f"{t.name}@ag{s - 1}@r{left}"
            self.add_op(_free(f"{t.name}@ag{s}@r{r}", c, kinds, "RingGather"), r, "all-gather", members,
                        [(came, came)])
        parts = [f"{t.name}@rs{n - 2}@r{r}"] + [f"{t.name}@ag{s}@r{r}" for s in range(n - 1)]
        name = f"{t.name}@allreduce@r{r}"
        outs = [(f"{m.name}@allreduce@r{r}", m.bytes) for m in members]
        self.add_op(_free(name, total, kinds, "AllReduceGather"), r, "gather", members,
                    [(p, p) for p in parts], outs)
        for m, (out, _) in zip(members, outs):
            self.final[(m.name, r)] = (name, out)

    def gather_rows(self, members: list[Tensor], r: int) -> None:
        """A sparse gradient: replica ``r``'s ring all-gather of every replica's rows
        (``t@ag{s}@r{r}``, its left neighbour's own rows first, then what it received)
        and ``t@allreduce@r{r}``, all the rows its consumers read (one tensor per member)."""
        n, t = self.n, members[0]
        c = sum(-(-m.bytes // n) for m in members)
        kinds = self.g.op(t.src).kinds
        left = (r - 1) % n
        own = [(replica_name(m.src, r), replica_name(m.name, r)) for m in members]
        for s in range(n - 1):
            came = ([(replica_name(m.src, left), replica_name(m.name, left)) for m in members] if s == 0 else
                    [(f"{t.name}@ag{s - 1}@r{left}",) * 2])
            self.add_op(_free(f"{t.name}@ag{s}@r{r}", c, kinds, "RingGather"), r, "all-gather", members, came)
        name = f"{t.name}@allreduce@r{r}"
        outs = [(f"{m.name}@allreduce@r{r}", m.bytes) for m in members]
        self.add_op(_free(name, sum(m.bytes for m in members), kinds, "RowGather"), r, "gather", members,
                    own + [(f"{t.name}@ag{s}@r{r}",) * 2 for s in range(n - 1)], outs)
        for m, (out, _) in zip(members, outs):
            self.final[(m.name, r)] = (name, out)

    def gather_params(self, members: list[Tensor], r: int) -> None:
        """Sharded: replica ``r``'s all-gather of the bucket's updated parameters,
        from its left neighbour's updates (the last one's ``param`` tensor), and
        ``t@allgather@r{r}``, no bytes: the parameters are written in place. A sparse
        gradient's: its variables' row pieces (steps ``t@pg{s}@r{r}``)."""
        n, t = self.n, members[0]
        ups = self.updates.get(t.name, [])
        if not ups:
            return
        sparse = t.name in self.param_bytes
        c = -(-(self.param_bytes[t.name] if sparse else sum(m.bytes for m in members)) // n)
        step = "pg" if sparse else "ag"
        kinds = self.g.op(t.src).kinds
        left = (r - 1) % n
        for s in range(n - 1):
            came = ([(replica_name(ups[-1], left), _param(t.name, left))]
                    + [(replica_name(u, left), None) for u in ups[:-1]] if s == 0 else
                    [(f"{t.name}@{step}{s - 1}@r{left}",) * 2])
            self.add_op(_free(f"{t.name}@{step}{s}@r{r}", c, kinds, "RingGather"), r, "all-gather", members, came)
        parts = [f"{t.name}@{step}{s}@r{r}" for s in range(n - 1)]
        self.add_op(_free(f"{t.name}@allgather@r{r}", 0, kinds, "ParamGather"), r, "gather", members,
                    [(p, p) for p in parts] + [(replica_name(u, r), None) for u in ups])

    def add_edges(self) -> None:
        """Every replica's copy of each edge of the step (edge by edge, replica by replica):
        a partial's to its all-reduce's (or reduce-scatter's) output; none where ZeRO-3's
        gathered copy is read instead (:class:`_Gathers`)."""
        g, edges, final = self.g, self.edges, self.final
        for e in g.edges:
            if (e.src, e.dst) in self.reroute:
                continue   # ZeRO-3: the reader reads the gathered copy (_Gathers)
            summed = e.tensors and g.op(e.src).batch and not g.op(e.dst).batch
            for r in range(self.n):
                dst = replica_name(e.dst, r)
                if summed:
                    for t in e.tensors:
                        src, tensor = final[(t, r)]
                        edges.setdefault((src, dst), []).append(tensor)
                else:
                    edges.setdefault((replica_name(e.src, r), dst), []).extend(
                        [replica_name(t, r) for t in e.tensors])


class _Gathers:
    """ZeRO-3: the all-gathers of the sharded parameters, one forward and one
    backward chain of buckets per replica (module doc, "Sharded parameters")."""

    def __init__(self, ring: _Ring, bucket_bytes: int | None):
        g = self.g = ring.g
        self.ring = ring
        pos = self.pos = {g.names[i]: k for k, i in enumerate(g.topo_idx())}
        self.readers: dict[str, dict[str, list[str]]] = {"f": {}, "b": {}}
        for (_, x), w in sorted(ring.reroute.items()):
            d = "f" if g.op(x).phase == "forward" else "b"
            self.readers[d].setdefault(w, []).append(x)
        for d in "fb":
            for w, xs in self.readers[d].items():
                xs.sort(key=pos.__getitem__)
        first = {d: {w: pos[xs[0]] for w, xs in self.readers[d].items()} for d in "fb"}
        big = len(pos)
        order = sorted(ring.weights, key=lambda w: (first["f"].get(w, big + first["b"].get(w, big)), w))
        buckets = gather_units(g, order, bucket_bytes)
        self.chains = {d: sorted((b for b in buckets if any(w in first[d] for w in b)),
                                 key=lambda b: min(first[d].get(w, big) for w in b)) for d in "fb"}

    def add(self) -> None:
        """Every replica's sends, ring steps and gathers, and the readers' edges."""
        for d in "fb":
            for k, members in enumerate(self.chains[d]):
                for r in range(self.ring.n):
                    self.gather(d, k, members, r)

    def gather(self, d: str, k: int, members: list[str], r: int) -> None:
        """Replica ``r``'s gather of bucket ``k`` of chain ``d`` (``"f"`` forward, ``"b"`` backward):
        its shard sent when the ring is free and the bucket two before is being read, ``n - 1``
        ring steps, the gathered copy its readers read (held until the last)."""
        ring, g, n, p = self.ring, self.g, self.ring.n, members[0]
        chain = self.chains[d]
        total = sum(g.op(w).persistent_bytes for w in members)
        c = -(-total // n)
        kinds = g.op(p).kinds
        left = (r - 1) % n
        send, gathered = f"{p}@{d}send@r{r}", f"{p}@{d}wgather@r{r}"
        waits = [replica_name(w, r) for w in members]
        if k:
            waits.append(f"{chain[k - 1][0]}@{d}wgather@r{r}")
        if k >= 2:
            waits.append(replica_name(self.readers[d][self.first(d, chain[k - 2])][0], r))
        if d == "b" and k < 2:   # reshard after forward: gathered again once its forward readers are done
            waits.extend(replica_name(x, r) for w in members for x in self.readers["f"].get(w, ()))
        # the send allocates the gathered buffer (held until the gather, which hands it on: a
        # zero-length op, no overlap), the ring steps write their chunk into it (no bytes of their own)
        self.add_op(_free(send, total, kinds, "ShardSend"), r, "all-gather", members, [(u, None) for u in waits],
                    [(send, c)])
        for s in range(n - 1):
            step = f"{p}@p{d}{s}@r{r}"
            came = ([(f"{p}@{d}send@r{left}",) * 2, (send, None)] if s == 0 else
                    [(f"{p}@p{d}{s - 1}@r{left}",) * 2])
            self.add_op(_free(step, 0, kinds, "RingGather"), r, "all-gather", members, came, [(step, c)])
        parts = [send] + [f"{p}@p{d}{s}@r{r}" for s in range(n - 1)]
        outs = [(f"{w}@{d}wgather@r{r}", g.op(w).persistent_bytes) for w in members]
        self.add_op(_free(gathered, total, kinds, "ParamGather"), r, "gather", members, [(x, x) for x in parts], outs)
        for w, (out, _) in zip(members, outs):
            for x in self.readers[d].get(w, ()):
                ring.edges.setdefault((gathered, replica_name(x, r)), []).append(out)

    def first(self, d: str, members) -> str:
        """The member of ``members`` whose first reader in chain ``d`` comes first."""
        return min((w for w in members if w in self.readers[d]), key=lambda w: (self.pos[self.readers[d][w][0]], w))

    def add_op(self, op: Op, r: int, role: str, members, inputs, outputs=None) -> None:
        ring = self.ring
        ring.ops.append(op)
        ring.tensors.extend(Tensor(t, op.name, nb) for t, nb in (outputs or [(op.name, op.output_bytes)]))
        ring.origin[op.name] = Origin(members[0], replica=r, role=role, members=tuple(members))
        for src, tensor in inputs:
            ts = ring.edges.setdefault((src, op.name), [])
            if tensor is not None:
                ts.append(tensor)


def gather_units(graph: OpGraph, weights: Sequence[str], bucket_bytes: int | None) -> list[list[str]]:
    """ZeRO-3's gather buckets of ``weights`` (parameter ops, in gather order):
    each run of consecutive weights under one layer block's scope
    (:func:`pesto.step.recompute.layer_blocks`: the weight's name starts with
    the scope the block's ops share) is one bucket, whatever its size; the
    others are packed into buckets of ``bucket_bytes`` (:func:`pack_buckets`).

    >>> from pesto.graph import Op, OpGraph
    >>> ops = [Op(n, {"GPU": 1.0}, batch=True, phase="forward") for n in
    ...        ["emb/x", "layer_0/a", "layer_0/b", "layer_1/a", "head/y"]]
    >>> ws = [Op(n, {"GPU": 1.0}, batch=False, persistent_bytes=10) for n in
    ...       ["emb/w", "layer_0/w1", "layer_0/w2", "layer_1/w", "head/w", "head/b"]]
    >>> gather_units(OpGraph(ops + ws), [w.name for w in ws], 25)
    [['emb/w'], ['layer_0/w1', 'layer_0/w2'], ['layer_1/w'], ['head/w', 'head/b']]
    """
    scopes = [common_scope(block) for block in layer_blocks(graph)]
    keys = [next((sc for sc in scopes if sc and w.startswith(sc + "/")), None) for w in weights]
    out: list[list[str]] = []
    i = 0
    while i < len(weights):
        j = i + 1
        while j < len(weights) and keys[j] == keys[i]:
            j += 1
        run = list(weights[i:j])
        if keys[i] is not None:
            out.append(run)
        else:
            out.extend([run[k] for k in b] for b in pack_buckets([graph.op(w).persistent_bytes for w in run],
                                                                 bucket_bytes))
        i = j
    return out


def _chunk(tensor: str, r: int, j: int) -> str:
    return f"{replica_name(tensor, r)}/chunk{j}"


def _param(tensor: str, r: int) -> str:
    """Replica ``r``'s updated parameter shard of the bucket named after ``tensor`` (sharded)."""
    return f"{replica_name(tensor, r)}/param"


def _reach(graph: OpGraph) -> tuple[list[bool], list[bool]]:
    """Per op: whether a batched op, and whether an op marked ``phase="update"``,
    is reachable from it (itself included)."""
    ops, succ = graph.ops, graph.succ_idx()
    batched = [bool(op.batch) for op in ops]
    update = [op.phase == "update" for op in ops]
    for i in reversed(graph.topo_idx()):
        for j in succ[i]:
            batched[i] = batched[i] or batched[j]
            update[i] = update[i] or update[j]
    return batched, update


def parameters(graph: OpGraph) -> frozenset:
    """The parameters ZeRO-3 shards: once-per-step ops holding persistent bytes
    from which a batched op can be reached (a weight: the forward pass reads
    it), not the optimizer state (:func:`optimizer_state`).

    >>> ops = [Op("w", {"GPU": 0.0}, persistent_bytes=8, batch=False),
    ...        Op("m", {"GPU": 0.0}, persistent_bytes=8, batch=False),
    ...        Op("f", {"GPU": 1.0}, batch=True, phase="forward"),
    ...        Op("u", {"GPU": 1.0}, batch=False, phase="update")]
    >>> sorted(parameters(OpGraph(ops, [Edge("w", "f", ()), Edge("w", "u", ()), Edge("m", "u", ())])))
    ['w']
    """
    batched, _ = _reach(graph)
    state = optimizer_state(graph)
    return frozenset(op.name for i, op in enumerate(graph.ops)
                     if op.persistent_bytes and not op.batch and batched[i] and op.name not in state)


def _reads(graph: OpGraph, weights) -> tuple[frozenset, dict[tuple[str, str], str]]:
    """ZeRO-3: a parameter's reads (its once-per-step successors outside the
    update: ``ReadVariableOp``, reading the replica's shard) and the edges
    from the parameter or a read to a batched op (its readers), each mapped
    to the parameter: those readers read a gathered copy instead."""
    reads: set[str] = set()
    reroute: dict[tuple[str, str], str] = {}
    for w in sorted(weights):
        for u in [w] + [x for x in graph.successors(w) if not graph.op(x).batch and graph.op(x).phase != "update"]:
            if u != w:
                reads.add(u)
            for x in graph.successors(u):
                if graph.op(x).batch:
                    reroute[(u, x)] = w
    return frozenset(reads), reroute


def optimizer_state(graph: OpGraph) -> frozenset:
    """The optimizer's state: once-per-step ops holding persistent bytes from
    which no batched op can be reached and an op marked ``phase="update"``
    can (Adam's slots: read only on the way to the update; a weight is read
    by the forward pass too).

    >>> ops = [Op("w", {"GPU": 0.0}, persistent_bytes=8, batch=False),
    ...        Op("m", {"GPU": 0.0}, persistent_bytes=8, batch=False),
    ...        Op("read_m", {"GPU": 0.0}, batch=False, phase="forward"),
    ...        Op("f", {"GPU": 1.0}, batch=True, phase="forward"),
    ...        Op("u", {"GPU": 1.0}, batch=False, phase="update")]
    >>> es = [Edge("w", "f", ()), Edge("w", "u", ()), Edge("m", "read_m", ()), Edge("read_m", "u", ())]
    >>> sorted(optimizer_state(OpGraph(ops, es)))
    ['m']
    """
    ops = graph.ops
    batched, update = _reach(graph)
    return frozenset(op.name for i, op in enumerate(ops)
                     if op.persistent_bytes and not op.batch and not batched[i] and update[i])


def _free(name: str, nbytes: int, kinds, type_: str) -> Op:
    """An op that costs nothing but holds ``nbytes`` (a received or gathered buffer)."""
    return Op(name, {k: 0.0 for k in kinds}, output_bytes=nbytes, type=type_, batch=False)
