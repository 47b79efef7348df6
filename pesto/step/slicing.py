"""Micro-batched training steps as op graphs: :func:`split`.

:func:`split` turns one training step, whose ops are marked with
:attr:`pesto.graph.Op.batch`, into the same step run as ``M`` micro-batches:
the batch is cut into ``M`` slices, each slice runs the forward and backward
ops, the slices' weight gradients are summed, and the optimizer applies once.
The result (:class:`~pesto.step.transform.Transformed`) holds an ordinary
:class:`~pesto.graph.OpGraph`, so every placer, the
simulator and the checker take it as it is; each slice's copy of an op may go
to any device (a pipeline stage is all copies of a layer on one device).

What the original graph must look like
--------------------------------------
The split is right (the summed update equals the un-split step's) when:

1. every op is marked: ``batch=True`` for the ops that run once per slice
   (they read or write per-sample data: inputs, activations, the loss, their
   gradients and the per-slice weight gradients before they are summed),
   ``batch=False`` for those that run once per step (variables and their
   reads, constants, the optimizer). An unmarked op (``None``) is an error
   (:class:`~pesto.errors.BatchMarkError` names them all): Pesto does not guess;
2. every tensor a batched op hands to an unbatched one is **additive over
   samples**: the un-split value is the sum of the slices' values. Dense weight
   gradients are, when the loss is a sum over samples or a mean normalised by
   the *whole* batch (each slice's loss scaled by ``1/M``: the same ops, so
   the cost model does not change). A sparse gradient (``IndexedSlices``,
   the partials of ops marked ``role="sparse-grad"``, :func:`sparse_partials`)
   is joined instead by concatenating the slices' rows and indices (below),
   which the optimizer sums per row as for one batch: as TensorFlow's split
   step (:mod:`tf_patch.microstep`). A metric (argmax) or a batch-norm moving
   average (each slice then sees its own batch statistics, as in GPipe) is
   neither; the graph is still built, but its value is then not the un-split
   step's;
3. batched ops hold no persistent bytes (weights and optimizer slots belong to
   the unbatched variables): one would be copied ``M`` times, so it is refused;
4. a batched op's cost is linear in the batch (the rule below).

How the graph is built
----------------------
* a batched op ``op`` becomes ``M`` copies ``op@mb0 .. op@mb{M-1}`` (the naming
  rule: the original name, ``@mb`` and the slice index); an unbatched op
  appears once, under its own name. A copy keeps the op's marks, its
  :attr:`~pesto.graph.Op.anchor` renamed to the same slice's copy of the anchor;
* edges batched -> batched join the copies of the same slice; unbatched ->
  batched fans out to every copy (one tensor, so it is sent once per device
  whatever the number of slices there); a control edge batched -> unbatched
  runs from every copy;
* a tensor ``t`` a batched op hands to an unbatched one (a *partial*: the slice's
  gradient) is summed over the slices by its producer's rule (below, "Weight
  gradients"); by default through a chain of ``M - 1`` accumulate ops
  ``t@acc1 .. t@acc{M-1}`` (``t@acck`` = slices ``0..k``, so slice ``k`` can be
  added as soon as it is done, into one buffer), and the unbatched consumers read
  the last one. Slice ``i + 1`` depends on slice ``i`` through nothing else, so
  slices overlap (pipeline) as far as devices allow;
* a sparse gradient's partial ``t`` (:func:`sparse_partials`: rows or
  indices) is not summed: one **concatenation** op ``t@acc{M-1}`` (slices
  ``0..M-1`` joined, the naming rule's) reads every slice's copy and outputs
  the un-split tensor's bytes, which the unbatched consumers read; whatever
  its producer's rule (TensorFlow's split step concatenates an
  ``IndexedSlices``' values and indices at once, ``accumulate/<variable>/values``
  and ``/indices``, :func:`tf_patch.microstep.accumulate`). The replicas of
  :func:`pesto.step.replicate` then gather the concatenated rows;
* an unbatched op *between* batched ops (reading a partial, or under a control
  edge from a batched op, and feeding batched ops) is where every slice waits
  for all the others: mark it batched if it belongs to one slice (a constant a
  gradient builds under a control dependency does: the solver's entries mark
  those, :func:`pesto.step.marks.slice_constants`);
* the graph knows no batch size: the caller picks an ``M`` that divides it
  (bytes are rounded up, so an ``M`` that does not divide is costed as if the
  last slice were as large as the others).

Cost rule of a copy (documented constants, tested)
--------------------------------------------------
* **compute**: ``max(t / M, min(t, FLOOR_US))`` per device kind: work linear in
  the batch, but a slice never costs less than a kernel's floor
  (``FLOOR_US`` = 2 µs, the duration of the shortest kernel a V100 runs, launch
  pipelined: below that a GPU op is latency bound), and an op already below the
  floor keeps its time;
* an op that touches **no sliced tensor** and at least one partial (a sum of
  a weight's per-time-step gradients in an RNN) keeps its full time and
  temporary bytes: its work is per element of the weight, not per sample;
* **bytes**: a sliced tensor is ``ceil(bytes / M)``; a partial keeps its size
  (it is weight-shaped), but a sparse gradient's, which is sliced (a slice's
  rows are its samples' or tokens' rows: ``1 / M`` of them); the op's
  ``output_bytes`` keep the part that is (dense) partials and divide the rest
  (rounded up); ``temporary_bytes`` are divided (rounded up);
  ``persistent_bytes`` are not copied (rule 3);
* which tensors are partials: those read by an unbatched op, and (backwards,
  shape-free) the inputs of a batched *sum* (:attr:`~pesto.graph.Op.role`
  ``"grad-sum"``, a mark the front end sets) whose output is a partial and
  whose batched inputs all have its size (the per-time-step weight gradients
  an RNN sums). Only sums: a size match alone says nothing (a Transformer's
  activations and its sparse embedding gradient all weigh 16 MiB);
* an **accumulate op** adds two tensors of ``B`` bytes: it reads ``2B`` and
  writes ``B``, memory bound, so it takes ``max(FLOOR_US, 3 B / bandwidth)`` with
  ``BANDWIDTH["GPU"]`` = 900 GB/s (V100 HBM2: the roofline grappler's V100 model
  gives the zoo graphs' adds, e.g. ``AddV2`` of 1 MiB = 3.5 µs) and a
  server's DDR4 for ``"CPU"``; it may run on the kinds its producer allows;
* a **concatenation** (a sparse gradient's ``t@acc{M-1}``) of ``B`` bytes in
  all reads them and writes them once, memory bound: ``max(FLOOR_US, 2 B /
  bandwidth)`` (:func:`concat_op`), on the kinds its producer allows.

Weight gradients (``weight_grads``, one rule per weight-gradient op)
-------------------------------------------------------------------
The weight-gradient ops (:func:`weight_grad_ops`: the batched ops an
unbatched op reads, the producers of the partials) sum the slices by one of
:data:`WEIGHT_GRADS`, given for all or per op (a mapping op -> rule):

* ``"separate"`` (the default; what TensorFlow's split step runs,
  :mod:`tf_patch.microstep`): copies by the cost rule above, and the
  ``t@acck`` accumulate ops: ``M - 1`` extra passes over every weight gradient;
* ``"accumulate"`` (in place, as Megatron-LM's GEMM with ``beta = 1``): copies
  by the cost rule above (op time / ``M`` with the floor), **plus nothing**:
  the sum is fused into the copy. The partial-sum buffer is one tensor each
  copy updates, so copy ``k`` reads copy ``k - 1``'s partial (an edge
  ``op@mb{k-1} -> op@mb{k}``: the copies run one after another, and a copy on
  another device than the previous one receives the buffer); the consumers
  read the last copy's. Memory: the running sum's bytes; the liveness model
  sees the input and output of a copy at once (one buffer more than in place,
  while the copy runs). "Plus nothing" is what a GPU runs: the add fuses into
  the weight-gradient GEMM (XLA's GEMM rewriter folds an addend into cuBLAS's
  ``beta = 1``; Megatron-LM calls the GEMM so by hand); TensorFlow without
  XLA runs an ``AddV2`` after the ``MatMul`` (its split step's
  ``accumulate/<variable>/add_k``, which :mod:`tf_patch.slicemap` places with
  copy ``k``);
* ``"whole"`` (the deferred weight gradient of zero-bubble schedules): the op
  runs once, ``op@all``, with the un-split op's time and bytes, reading every
  slice's copy of its inputs (an edge from each ``x@mb{i}``: the
  concatenated batch), and the consumers read it; no accumulation at all.
  Memory: every slice's inputs stay live until it runs. Ops that only feed
  it run whole with it (:func:`whole_ops`: the bias gradient's ``Sum`` before
  its ``Reshape``, an RNN's per-time-step weight gradients before their sum,
  whose sum then runs once instead of ``M`` times). A whole op is unbatched
  (it runs once per step); its origin has role ``"whole"``, the copies it
  stands for as members. An op a batched op reads cannot run whole: the string
  ``"whole"`` leaves it on ``"accumulate"``, a mapping naming it is refused.

A sparse gradient's producer (:func:`sparse_partials`) is concatenated under
every rule: ``"separate"`` and ``"accumulate"`` both leave it so (there is no
running sum to fuse), the string ``"whole"`` too, and a mapping naming it
``"whole"`` is refused (TensorFlow builds no whole sparse gradient).

Work per rule: ``whole`` <= ``accumulate`` <= ``separate`` (equal above the
floor for the first two); ``whole`` costs memory, ``accumulate`` serialises
the copies of one op. :func:`weight_grad_costs` gives each weight-gradient
op's work and held bytes under each rule (:class:`WeightGradCost`), and
:func:`choose_weight_grads` a per-op mapping from them (whole where it does
less work within a byte limit, else in place). ``benchmarks/results/slice_costs.md`` measures the
rule against grappler's V100 model ("Weight gradients" section).

Colocation groups (rule)
------------------------
A group holding an unbatched op (a variable) keeps every slice's copy of its
batched members: TensorFlow places an op reading a resource with the resource
(``embedding_lookup`` stays with the embedding, whatever the slice). A group of
batched ops only becomes one group per slice, ``group@mb{i}``.

``M = 1`` returns the step itself (:func:`~pesto.step.transform.identity`:
the same graph, its ops' own names, a batched op slice 0's copy), after the
same checks of its marks.

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> ops = [Op("x", {"GPU": 40.0}, output_bytes=800, batch=True),
...        Op("w", {"GPU": 1.0}, persistent_bytes=64, output_bytes=64, batch=False),
...        Op("dw", {"GPU": 80.0}, output_bytes=64, batch=True),
...        Op("apply", {"GPU": 5.0}, batch=False)]
>>> tensors = [Tensor("x:0", "x", 800), Tensor("w:0", "w", 64), Tensor("dw:0", "dw", 64)]
>>> edges = [Edge("x", "dw", "x:0"), Edge("w", "dw", "w:0"), Edge("dw", "apply", "dw:0"),
...          Edge("w", "apply", "w:0")]
>>> g = split(OpGraph(ops, edges, tensors), 2).graph
>>> g.names
('x@mb0', 'x@mb1', 'w', 'dw@mb0', 'dw@mb1', 'dw:0@acc1', 'apply')
>>> g.op("x@mb1").compute["GPU"], g.tensor("x:0@mb1").bytes, g.tensor("dw:0@mb1").bytes
(20.0, 400, 64)
>>> g.predecessors("dw:0@acc1"), sorted(g.predecessors("apply"))
(['dw@mb0', 'dw@mb1'], ['dw:0@acc1', 'w'])
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from ..errors import BatchMarkError, MicroBatchError
from ..graph import Edge, Op, OpGraph, Tensor, gc_paused
from .transform import Origin, Transformed, check_count, identity, renamed

__all__ = ["split", "check_marks", "partial_tensors", "sparse_partials", "fixed_ops", "slice_op", "accumulate_op",
           "concat_op", "copy_name",
           "whole_name", "parse_name", "weight_grad_ops", "whole_ops", "FLOOR_US", "BANDWIDTH", "RESERVED",
           "WEIGHT_GRADS", "WeightGradCost", "weight_grad_costs", "choose_weight_grads"]

#: Shortest time of a slice's kernel (µs): a V100 kernel's duration floor with
#: launches pipelined. An op already faster keeps its own time.
FLOOR_US = 2.0
#: Memory bandwidth per device kind (bytes per µs) that accumulate ops are
#: costed with: V100 HBM2 900 GB/s; a two-socket DDR4 server ~50 GB/s.
BANDWIDTH = MappingProxyType({"GPU": 900e3, "CPU": 50e3})

#: Names :func:`split` makes: an original op or tensor may not look like them.
RESERVED = re.compile(r"@(mb|acc)\d|@all$")
#: How the slices' weight gradients are summed (module doc, "Weight gradients"):
#: ``"separate"`` accumulate ops, ``"accumulate"`` in place, ``"whole"`` one op over all slices.
WEIGHT_GRADS = ("separate", "accumulate", "whole")


def check_marks(graph: OpGraph, reserved: re.Pattern = RESERVED) -> None:
    """Refuse a graph :func:`split` cannot split, naming the ops to blame.

    ``reserved``: the names the transformation makes (a name matching it is refused).

    Raises
    ------
    BatchMarkError
        Ops without a batch mark; no batched op at all; batched ops holding
        persistent bytes; names that collide with the naming rule.

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> check_marks(OpGraph([Op("a", {"GPU": 1.0}, batch=True), Op("b", {"GPU": 1.0})]))
    Traceback (most recent call last):
    ...
    pesto.errors.BatchMarkError: 1 op(s) have no batch mark (Op.batch is None); mark them (a front end does: tf_patch.marks.mark_step for a TensorFlow graph): 'b'
    """
    unknown = [op.name for op in graph.ops if op.batch is None]
    if unknown:
        raise BatchMarkError(f"{len(unknown)} op(s) have no batch mark (Op.batch is None); mark them "
                             f"(a front end does: tf_patch.marks.mark_step for a TensorFlow graph)", unknown)
    if not any(op.batch for op in graph.ops):
        raise BatchMarkError(f"graph {graph.name!r} has no batched op (every Op.batch is False): "
                             f"nothing to split")
    held = [op.name for op in graph.ops if op.batch and op.persistent_bytes]
    if held:
        raise BatchMarkError("batched ops hold persistent bytes (weights belong to unbatched "
                             "variables; a copy per slice would hold them M times)", held)
    taken = [n for n in graph.names if reserved.search(n)]
    taken += [t.name for t in graph.tensors if reserved.search(t.name)]
    if taken:
        raise BatchMarkError(f"names look like the ones the split makes ({reserved.pattern}): rename them",
                             taken)


def copy_name(name: str, i: int) -> str:
    """The name of slice ``i``'s copy of op (or tensor) ``name``: ``name@mb{i}``."""
    return f"{name}@mb{i}"


def whole_name(name: str) -> str:
    """The name of op ``name`` run once over every slice (rule ``"whole"``): ``name@all``."""
    return f"{name}@all"


def parse_name(name: str) -> Origin:
    """Inverse of the naming rule, without the graph.

    >>> parse_name("layer/MatMul@mb3")
    Origin(op='layer/MatMul', replica=None, slice=3, role='copy', tensor=None, members=())
    >>> parse_name("grad:0@acc2").role, parse_name("w").role, parse_name("dw@all").role
    ('accumulate', 'step', 'whole')
    """
    if name.endswith("@all"):
        return Origin(name[:-4], role="whole")
    m = re.fullmatch(r"(.*)@(mb|acc)(\d+)", name)
    if m is None:
        return Origin(name, role="step")
    if m.group(2) == "mb":
        return Origin(m.group(1), slice=int(m.group(3)))
    tensor = m.group(1)
    return Origin(tensor.rsplit(":", 1)[0], slice=int(m.group(3)), role="accumulate", tensor=tensor)


def partial_tensors(graph: OpGraph) -> frozenset:
    """Tensors of batched ops that are summed over slices (weight-shaped).

    A tensor a batched op hands to an unbatched op is a partial; so are,
    going backwards, the inputs of a batched sum (role ``"grad-sum"``) whose
    output is a partial, when all its batched inputs have the output's size.

    >>> from pesto.graph import Op, OpGraph, Tensor, Edge
    >>> ops = [Op(n, {"GPU": 1.0}, batch=b, role=r) for n, b, r in
    ...        [("x", True, ""), ("g1", True, ""), ("g2", True, ""), ("addn", True, "grad-sum"),
    ...         ("apply", False, "")]]
    >>> ts = [Tensor("x:0", "x", 80), Tensor("g1:0", "g1", 16), Tensor("g2:0", "g2", 16),
    ...       Tensor("addn:0", "addn", 16)]
    >>> es = [Edge("x", "g1", "x:0"), Edge("x", "g2", "x:0"), Edge("g1", "addn", "g1:0"),
    ...       Edge("g2", "addn", "g2:0"), Edge("addn", "apply", "addn:0")]
    >>> sorted(partial_tensors(OpGraph(ops, es, ts)))
    ['addn:0', 'g1:0', 'g2:0']
    """
    batched = [bool(op.batch) for op in graph.ops]
    outs: list[list] = [[] for _ in batched]
    ins: list[list] = [[] for _ in batched]
    partial = set()
    for name, src, nbytes, cons in graph.tensor_table():
        if not batched[src]:
            continue
        outs[src].append((name, nbytes))
        if any(not batched[j] for j in cons):
            partial.add(name)
        for j in cons:
            ins[j].append((name, nbytes))
    ops = graph.ops
    for v in reversed(graph.topo_idx()):
        if not batched[v] or ops[v].role != "grad-sum" or not ins[v]:
            continue
        sizes = {b for name, b in outs[v] if name in partial}
        if len(sizes) == 1 and all(b in sizes for _, b in ins[v]):
            partial.update(name for name, _ in ins[v])
    return frozenset(partial)


def sparse_partials(graph: OpGraph) -> frozenset:
    """The partial tensors (:func:`partial_tensors`) that are a sparse
    gradient's rows or indices: those of a batched op marked
    ``role="sparse-grad"`` (TensorFlow's ``IndexedSlices``). A replica holds
    its own rows (its share of the batch's), and replicas gather them instead
    of summing (:func:`pesto.step.replicate`); so does a slice (its share of
    the replica's), and :func:`split` concatenates the slices' (module doc).

    >>> from pesto.graph import Op, OpGraph, Tensor, Edge
    >>> ops = [Op("rows", {"GPU": 1.0}, batch=True, role="sparse-grad"), Op("dw", {"GPU": 1.0}, batch=True),
    ...        Op("apply", {"GPU": 1.0}, batch=False)]
    >>> g = OpGraph(ops, [Edge("rows", "apply", "rows:0"), Edge("dw", "apply", "dw:0")],
    ...             [Tensor("rows:0", "rows", 8), Tensor("dw:0", "dw", 8)])
    >>> sorted(sparse_partials(g))
    ['rows:0']
    """
    sparse = {i for i, op in enumerate(graph.ops) if op.batch and op.role == "sparse-grad"}
    if not sparse:
        return frozenset()
    return frozenset(t for t in partial_tensors(graph) if graph.index[graph.tensor(t).src] in sparse)


def fixed_ops(graph: OpGraph, partials: frozenset) -> frozenset:
    """Batched ops whose cost does not scale with the batch: they touch at
    least one partial and no sliced tensor (inputs from unbatched ops aside).

    >>> from pesto.graph import OpGraph
    >>> g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    >>> g = OpGraph([replace(op, batch=op.name == "a") for op in g.ops], g.edges, g.tensors)
    >>> sorted(fixed_ops(g, partial_tensors(g)))   # a's only tensor goes to unbatched b
    ['a']
    """
    batched = [bool(op.batch) for op in graph.ops]
    touched: list[set] = [set() for _ in batched]
    for name, src, _, cons in graph.tensor_table():
        if not batched[src]:
            continue
        touched[src].add(name)
        for j in cons:
            touched[j].add(name)
    return frozenset(graph.names[i] for i, ts in enumerate(touched)
                     if batched[i] and ts and ts <= partials)


def slice_op(op: Op, n: int, name: str, *, fixed: bool, partial_bytes: int, floor_us: float = FLOOR_US,
             colocation_group: str | None = None) -> Op:
    """One of ``n`` slices of batched ``op`` under the cost rule (module doc).

    ``partial_bytes``: bytes of ``op``'s outputs that are partials (kept whole);
    its view bytes (:attr:`~pesto.graph.Op.view_bytes`) are sliced as the rest.

    >>> op = Op("mm", {"GPU": 100.0, "CPU": 3.0}, output_bytes=1000, temporary_bytes=10, batch=True)
    >>> s = slice_op(op, 4, "mm@mb0", fixed=False, partial_bytes=0)
    >>> dict(s.compute), s.output_bytes, s.temporary_bytes   # CPU: 3 / 4 is below the floor
    ({'GPU': 25.0, 'CPU': 2.0}, 250, 3)
    >>> slice_op(op, 100, "mm@mb0", fixed=False, partial_bytes=200).compute["GPU"], \\
    ...     slice_op(op, 100, "mm@mb0", fixed=False, partial_bytes=200).output_bytes
    (2.0, 208)
    """
    if fixed:
        compute, temp = dict(op.compute), op.temporary_bytes
    else:
        compute = {k: max(t / n, min(t, floor_us)) for k, t in op.compute.items()}
        temp = _ceil_div(op.temporary_bytes, n)
    keep = min(partial_bytes, op.output_bytes)
    out = keep + _ceil_div(op.output_bytes - keep, n)
    return replace(op, name=name, compute=compute, output_bytes=out, view_bytes=min(out, _ceil_div(op.view_bytes, n)),
                   temporary_bytes=temp, colocation_group=colocation_group)


def accumulate_op(name: str, nbytes: int, kinds, *, scope: str = "", floor_us: float = FLOOR_US,
                  bandwidth: Mapping[str, float] = BANDWIDTH, what: str = "") -> Op:
    """An op adding two tensors of ``nbytes``: ``max(floor_us, 3 * nbytes / bandwidth[kind])``.

    >>> op = accumulate_op("g@acc1", 9_000_000, {"GPU"})
    >>> op.compute["GPU"], op.output_bytes, op.batch
    (30.0, 9000000, False)
    """
    compute = _memory_bound(3.0 * nbytes, kinds, floor_us, bandwidth, f"the sum of {what or name!r}")
    return Op(name, compute, output_bytes=nbytes, scope=scope, type="Accumulate", batch=False)


def concat_op(name: str, nbytes: int, kinds, *, scope: str = "", floor_us: float = FLOOR_US,
              bandwidth: Mapping[str, float] = BANDWIDTH, what: str = "") -> Op:
    """An op concatenating tensors of ``nbytes`` in all (a sparse gradient's
    slices): it reads and writes them once, ``max(floor_us, 2 * nbytes / bandwidth[kind])``.

    >>> op = concat_op("rows:0@acc3", 9_000_000, {"GPU"})
    >>> op.compute["GPU"], op.output_bytes, op.type
    (20.0, 9000000, 'Concat')
    """
    compute = _memory_bound(2.0 * nbytes, kinds, floor_us, bandwidth, f"the concatenation of {what or name!r}")
    return Op(name, compute, output_bytes=nbytes, scope=scope, type="Concat", batch=False)


def _memory_bound(moved: float, kinds, floor_us: float, bandwidth: Mapping[str, float], what: str) -> dict:
    """``{kind: max(floor_us, moved / bandwidth[kind])}``: an op moving ``moved`` bytes through memory.

    Raises
    ------
    MicroBatchError
        A kind without bandwidth (``what``: the op's work, for the message).
    """
    missing = sorted(k for k in kinds if k not in bandwidth)
    if missing:
        raise MicroBatchError(f"no memory bandwidth for device kind {missing[0]!r} to cost {what}; "
                              f"pass bandwidth={{{missing[0]!r}: bytes_per_us}}", culprit=missing[0])
    return {k: max(floor_us, moved / bandwidth[k]) for k in kinds}


def split(graph: OpGraph, micro_batches: int, *, floor_us: float = FLOOR_US,
          bandwidth: Mapping[str, float] = BANDWIDTH, weight_grads="separate") -> Transformed:
    """The step ``graph`` run as ``micro_batches`` slices, with the map back to its ops (module doc).

    ``weight_grads``: how the slices' weight gradients are summed, one of
    :data:`WEIGHT_GRADS` for every weight-gradient op (the producers of the
    tensors batched ops hand to unbatched ones: :func:`weight_grad_ops`), or a
    mapping weight-gradient op -> rule (ops it leaves out: ``"separate"``);
    module doc, "Weight gradients". ``"whole"`` given as a string applies
    where it can (:func:`whole_ops`) and ``"accumulate"`` elsewhere. A sparse
    gradient's producer (:func:`sparse_partials`) is concatenated whatever its rule.

    Raises
    ------
    MicroBatchError
        ``micro_batches`` not an integer >= 1; a device kind without bandwidth;
        an unknown rule, a mapping naming an op that is not a weight-gradient
        op, or ``"whole"`` mapped to an op that cannot run whole (a batched
        op reads it, or it produces a sparse gradient).
    BatchMarkError
        Unmarked ops, no batched op, batched ops with persistent bytes.

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> s = split(OpGraph([Op("a", {"GPU": 8.0}, batch=True), Op("b", {"GPU": 1.0}, batch=False)]), 4)
    >>> s.graph.names, s.graph.total_work()
    (('a@mb0', 'a@mb1', 'a@mb2', 'a@mb3', 'b'), 9.0)
    >>> s.origin["a@mb1"]
    Origin(op='a', replica=None, slice=1, role='copy', tensor=None, members=())
    """
    m = check_count(micro_batches)
    check_marks(graph)
    b = _Split(graph, m, floor_us, bandwidth)
    b.choose(weight_grads)   # checked whatever M
    if m == 1:
        return identity(graph)
    with gc_paused():   # M copies of every batched op, their tensors, edges and origins
        b.add_ops()
        b.add_edges()
        out = OpGraph(b.ops, b.edge_list(), b.tensors, name=f"{graph.name}@mb{m}")
    return Transformed(out, graph, MappingProxyType(b.origin), micro_batches=m, partials=b.partials)


def weight_grad_ops(graph: OpGraph) -> tuple[str, ...]:
    """The weight-gradient ops of a marked step: batched ops that hand a
    tensor to an unbatched op (the optimizer reads the slices' sum), or that
    only an unbatched op follows (a control edge: a replicated step's bucket
    member, whose gradient is a view of the bucket's buffer), in graph order.

    >>> g = OpGraph.from_edges({"x": 1, "dw": 1, "apply": 1}, [("x", "dw", 8), ("dw", "apply", 8)])
    >>> g = OpGraph([replace(op, batch=op.name != "apply") for op in g.ops], g.edges, g.tensors)
    >>> weight_grad_ops(g)
    ('dw',)
    """
    batched = [bool(op.batch) for op in graph.ops]
    srcs = {src for _, src, _, cons in graph.tensor_table() if batched[src] and any(not batched[j] for j in cons)}
    srcs |= {i for i, nxt in enumerate(graph.succ_idx()) if batched[i] and nxt and not any(batched[j] for j in nxt)}
    return tuple(graph.names[i] for i in sorted(srcs))


def whole_ops(graph: OpGraph, ops) -> tuple[frozenset, tuple]:
    """The ops that run whole (once, over every slice) when weight-gradient
    ops ``ops`` do, and those of ``ops`` that cannot.

    A weight-gradient op can run whole when no batched op reads it. Going
    backwards from those that do, a batched predecessor runs whole too when
    all its batched successors do and its outputs are no larger than theirs
    (a reduction or a weight-shaped tensor: the bias gradient's ``Sum``
    before its ``Reshape``, an RNN's per-time-step weight gradients before
    their sum), so that every whole op reads only slices of per-sample
    tensors or other whole ops' outputs.

    Returns
    -------
    (frozenset of op names, tuple of the refused ``ops``)

    >>> from pesto.graph import Op, OpGraph, Edge, Tensor
    >>> ops = [Op("dy", {"GPU": 9.0}, output_bytes=800, batch=True), Op("sum", {"GPU": 4.0}, output_bytes=8, batch=True),
    ...        Op("db", {"GPU": 0.0}, output_bytes=8, batch=True), Op("apply", {"GPU": 1.0}, batch=False)]
    >>> ts = [Tensor("dy:0", "dy", 800), Tensor("sum:0", "sum", 8), Tensor("db:0", "db", 8)]
    >>> g = OpGraph(ops, [Edge("dy", "sum", "dy:0"), Edge("sum", "db", "sum:0"), Edge("db", "apply", "db:0")], ts)
    >>> sorted(whole_ops(g, ["db"])[0])
    ['db', 'sum']
    """
    succ, nodes = graph.succ_idx(), graph.ops
    limit: dict[int, int] = {}
    refused = []
    for name in ops:
        i = graph.index[name]
        if any(nodes[j].batch for j in succ[i]):
            refused.append(name)
        else:
            limit[i] = nodes[i].output_bytes
    for q in reversed(graph.topo_idx()):
        if q in limit or not nodes[q].batch:
            continue
        mine = [j for j in succ[q] if nodes[j].batch]
        if mine and all(j in limit for j in mine) and nodes[q].output_bytes <= min(limit[j] for j in mine):
            limit[q] = min(limit[j] for j in mine)
    return frozenset(graph.names[i] for i in limit), tuple(refused)


@dataclass(frozen=True)
class WeightGradCost:
    """What each rule costs one weight-gradient op (:func:`weight_grad_costs`).

    Attributes
    ----------
    op : str
        The weight-gradient op.
    ops : tuple of str
        The ops its rule applies to: ``op`` and the ops that run whole with it
        (:func:`whole_ops`); just ``op`` when it cannot run whole.
    separate_us, accumulate_us, whole_us : float
        Work of ``ops`` under each rule (µs on ``kind``): ``M`` copies plus the
        ``M - 1`` accumulate ops; ``M`` copies; the un-split ops once (None
        when ``op`` cannot run whole). A sparse gradient's producer
        (:func:`sparse_partials`) is concatenated under every rule: ``M``
        copies and the concatenations for both, None for ``whole_us``.
    sum_bytes : int
        The running sum ``"separate"`` and ``"accumulate"`` hold from the
        first slice to the last (the op's outputs an unbatched op reads; a
        sparse gradient's: every slice's rows until their concatenation).
    whole_bytes : int or None
        What ``"whole"`` holds beyond one slice: ``(M - 1) / M`` of the
        inputs ``ops`` read from other batched ops, kept until it runs.
    """

    op: str
    ops: tuple
    separate_us: float
    accumulate_us: float
    whole_us: float | None
    sum_bytes: int
    whole_bytes: int | None


def weight_grad_costs(graph: OpGraph, micro_batches: int, *, kind: str = "GPU", floor_us: float = FLOOR_US,
                      bandwidth: Mapping[str, float] = BANDWIDTH) -> tuple[WeightGradCost, ...]:
    """Each weight-gradient op's time and memory under each rule, at ``M`` slices (module doc).

    >>> from pesto.graph import Op, OpGraph, Edge, Tensor
    >>> ops = [Op("x", {"GPU": 1.0}, output_bytes=800, batch=True), Op("dw", {"GPU": 40.0}, output_bytes=8, batch=True),
    ...        Op("apply", {"GPU": 1.0}, batch=False)]
    >>> g = OpGraph(ops, [Edge("x", "dw", "x:0"), Edge("dw", "apply", "dw:0")], [Tensor("x:0", "x", 800),
    ...             Tensor("dw:0", "dw", 8)])
    >>> c = weight_grad_costs(g, 4)[0]
    >>> c.separate_us, c.accumulate_us, c.whole_us, c.sum_bytes, c.whole_bytes
    (46.0, 40.0, 40.0, 8, 600)
    """
    m = check_count(micro_batches)
    sparse = sparse_partials(graph)
    fixed = fixed_ops(graph, partial_tensors(graph) - sparse)
    to_step = {name: b for name, src, b, cons in graph.tensor_table()
               if graph.ops[src].batch and any(not graph.ops[j].batch for j in cons)}
    made: dict[str, list] = {}
    for t in graph.tensors:
        made.setdefault(t.src, []).append(t.name)
    producers = weight_grad_ops(graph)
    concatenated = _sparse_producers(graph, sparse)
    every, refused = whole_ops(graph, [p for p in producers if p not in concatenated])
    refused += tuple(p for p in producers if p in concatenated)
    out = []
    for p in producers:
        cone = _cone(graph, p, every)
        ops = (p,) if p in refused else tuple(n for n in graph.names if n in cone)

        def copies(n):
            t = graph.op(n).time_on(kind)
            return m * (t if n in fixed else max(t / m, min(t, floor_us)))
        sums = [to_step[t] for t in made.get(p, ()) if t in to_step]
        acc = sum(copies(n) for n in ops)
        if p in concatenated:   # every rule: the copies and one concatenation per tensor (module doc)
            acc += sum(max(floor_us, 2.0 * b / bandwidth[kind]) for b in sums) if m > 1 else 0.0
        adds = 0.0 if p in concatenated else (m - 1) * sum(max(floor_us, 3.0 * b / bandwidth[kind]) for b in sums)
        held = sum(graph.tensor(t).bytes for n in ops for u in graph.predecessors(n)
                   if u not in cone and graph.op(u).batch for t in graph.edge(u, n).tensors)
        no = p in refused
        out.append(WeightGradCost(p, ops, acc + adds, acc, None if no else sum(graph.op(n).time_on(kind) for n in ops),
                                  sum(sums), None if no else held - _ceil_div(held, m)))
    return tuple(out)


def _cone(graph: OpGraph, op: str, whole: frozenset) -> set:
    """``op`` and its ancestors through ops of ``whole`` (what runs whole with it)."""
    cone, todo = {op}, [op]
    while todo:
        for u in graph.predecessors(todo.pop()):
            if u in whole and u not in cone:
                cone.add(u)
                todo.append(u)
    return cone


def choose_weight_grads(costs, whole_bytes: float = float("inf")) -> dict[str, str]:
    """A rule per weight-gradient op: ``"whole"`` where it does less work than
    in place and holds at most ``whole_bytes``, else ``"accumulate"`` (never
    ``"separate"``: it only adds work). A mapping for :func:`split`.

    >>> c = [WeightGradCost("a", ("a",), 50.0, 40.0, 30.0, 8, 600), WeightGradCost("b", ("b",), 50.0, 40.0, 40.0, 8, 9)]
    >>> choose_weight_grads(c), choose_weight_grads(c, whole_bytes=100)
    ({'a': 'whole', 'b': 'accumulate'}, {'a': 'accumulate', 'b': 'accumulate'})
    """
    return {c.op: "whole" if c.whole_us is not None and c.whole_us < c.accumulate_us and c.whole_bytes <= whole_bytes
            else "accumulate" for c in costs}


class _Split:
    """The pieces of a split graph while it is built."""

    def __init__(self, graph: OpGraph, m: int, floor_us: float, bandwidth):
        self.g, self.m, self.floor, self.bw = graph, m, floor_us, bandwidth
        self.partials = partial_tensors(graph)
        #: a sparse gradient's partials: sliced as activations, concatenated (module doc)
        self.sparse = sparse_partials(graph)
        self.dense = self.partials - self.sparse
        batched = [bool(op.batch) for op in graph.ops]
        self.to_step = {name for name, src, _, cons in graph.tensor_table()
                        if batched[src] and any(not batched[j] for j in cons)}
        self.fixed = fixed_ops(graph, self.dense)
        self.rule: dict[str, str] = {}      # weight-gradient op -> rule
        self.whole: frozenset = frozenset()  # ops run once over every slice
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.edges: dict[tuple[str, str], list[str]] = {}
        self.origin: dict[str, Origin] = {}
        self.final: dict[str, tuple[str, str]] = {}  # partial -> (op, tensor) the step reads
        shared = {op.colocation_group for op in graph.ops if not op.batch}
        self.shared_groups = shared - {None}

    def choose(self, weight_grads) -> None:
        """Each weight-gradient op's rule (:func:`split`'s ``weight_grads``), and the whole ops."""
        producers = weight_grad_ops(self.g)
        if isinstance(weight_grads, str):
            rule = {p: weight_grads for p in producers}
        elif isinstance(weight_grads, Mapping):
            extra = sorted(set(weight_grads) - set(producers))
            if extra:
                raise MicroBatchError(f"weight_grads names ops that are not weight-gradient ops of "
                                      f"{self.g.name!r} (batched ops read by unbatched ones): {extra[:5]}",
                                      culprit=extra[0])
            rule = {p: weight_grads.get(p, "separate") for p in producers}
        else:
            raise MicroBatchError(f"weight_grads must be one of {list(WEIGHT_GRADS)} or a mapping op -> rule, "
                                  f"got {weight_grads!r}", culprit=weight_grads)
        given = set(rule.values()) | ({weight_grads} if isinstance(weight_grads, str) else set())
        bad = sorted((r for r in given if r not in WEIGHT_GRADS), key=repr)
        if bad:
            raise MicroBatchError(f"unknown weight_grads rule {bad[0]!r}; known: {list(WEIGHT_GRADS)}",
                                  culprit=bad[0])
        concatenated = _sparse_producers(self.g, self.sparse)
        named = sorted(p for p in concatenated if isinstance(weight_grads, Mapping) and weight_grads.get(p) == "whole")
        if named:
            raise MicroBatchError(f"weight-gradient op {named[0]!r} produces a sparse gradient (role "
                                  f"'sparse-grad'): its slices are concatenated, it cannot run whole", culprit=named[0])
        if self.m > 1:
            self.whole, refused = whole_ops(self.g, [p for p, r in rule.items() if r == "whole" and p not in concatenated])
            if refused and not isinstance(weight_grads, str):
                raise MicroBatchError(f"weight-gradient op {refused[0]!r} cannot run whole: a batched op "
                                      f"reads it", culprit=refused[0])
            rule.update({p: "accumulate" for p in refused})
        self.rule = rule

    def group(self, op: Op, i: int) -> str | None:
        g = op.colocation_group
        return g if g is None or g in self.shared_groups else f"{g}@mb{i}"

    def add_ops(self) -> None:
        g, m = self.g, self.m
        produced: dict[str, list] = {}
        for t in g.tensors:
            produced.setdefault(t.src, []).append(t)
        for op in g.ops:
            mine = produced.get(op.name, [])
            if not op.batch:
                self.ops.append(op)
                self.tensors.extend(mine)
                self.origin[op.name] = Origin(op.name, role="step")
                continue
            if op.name in self.whole:
                self.add_whole(op, mine)
                continue
            kept = sum(t.bytes for t in mine if t.name in self.dense)
            copy = slice_op(op, m, op.name, fixed=op.name in self.fixed, partial_bytes=kept, floor_us=self.floor,
                            colocation_group=op.colocation_group)   # every slice's, renamed
            sizes = [(t.name, self.size(t)) for t in mine]
            for i in range(m):
                name = copy_name(op.name, i)
                self.ops.append(renamed(copy, name, self.group(op, i),
                                        None if op.anchor is None else self.anchor(op.anchor, i)))
                self.origin[name] = Origin(op.name, slice=i)
                self.tensors.extend(Tensor(copy_name(t, i), name, size) for t, size in sizes)
            for t in mine:
                if t.name in self.to_step:
                    self.sum_slices(op, t)

    def add_whole(self, op: Op, mine) -> None:
        """``op@all``: the un-split op once (its time, bytes, group), reading every slice's inputs."""
        name = whole_name(op.name)
        anchor = None if op.anchor is None else (whole_name(op.anchor) if op.anchor in self.whole else op.anchor)
        self.ops.append(replace(op, name=name, batch=False, anchor=anchor))
        self.origin[name] = Origin(op.name, role="whole",
                                   members=tuple(copy_name(op.name, i) for i in range(self.m)))
        self.tensors.extend(replace(t, src=name) for t in mine)
        self.final.update({t.name: (name, t.name) for t in mine})

    def anchor(self, name: str, i: int) -> str:
        """Slice ``i``'s name of anchor ``name``: its copy if batched (a mark naming no op stays)."""
        if name in self.whole:
            return whole_name(name)
        return copy_name(name, i) if name in self.g and self.g.op(name).batch else name

    def size(self, t: Tensor) -> int:
        return t.bytes if t.name in self.dense else _ceil_div(t.bytes, self.m)

    def sum_slices(self, op: Op, t: Tensor) -> None:
        """Slice ``k``'s ``t`` summed into slices ``0..k-1``'s: by ``op``'s rule (a sparse
        gradient's: concatenated, whatever the rule)."""
        if t.name in self.sparse:
            self.concat(op, t)
        elif self.rule.get(op.name, "separate") == "accumulate":
            for k in range(1, self.m):
                self.link(copy_name(op.name, k - 1), copy_name(op.name, k), [copy_name(t.name, k - 1)])
            self.final[t.name] = (copy_name(op.name, self.m - 1), copy_name(t.name, self.m - 1))
        else:
            self.accumulate(op, t)

    def accumulate(self, op: Op, t: Tensor) -> None:
        """The chain ``t@acc1 .. t@acc{M-1}`` summing slice ``k`` into slices ``0..k-1``."""
        prev = (copy_name(op.name, 0), copy_name(t.name, 0))
        for k in range(1, self.m):
            name = f"{t.name}@acc{k}"
            self.ops.append(accumulate_op(name, t.bytes, op.kinds, scope=op.scope, floor_us=self.floor,
                                          bandwidth=self.bw, what=t.name))
            self.tensors.append(Tensor(name, name, t.bytes))
            self.origin[name] = Origin(op.name, slice=k, role="accumulate", tensor=t.name)
            self.link(prev[0], name, [prev[1]])
            self.link(copy_name(op.name, k), name, [copy_name(t.name, k)])
            prev = (name, name)
        self.final[t.name] = prev

    def concat(self, op: Op, t: Tensor) -> None:
        """``t@acc{M-1}``: every slice's ``t`` (a sparse gradient's rows or indices) concatenated."""
        name = f"{t.name}@acc{self.m - 1}"
        self.ops.append(concat_op(name, t.bytes, op.kinds, scope=op.scope, floor_us=self.floor,
                                  bandwidth=self.bw, what=t.name))
        self.tensors.append(Tensor(name, name, t.bytes))
        self.origin[name] = Origin(op.name, slice=self.m - 1, role="accumulate", tensor=t.name)
        for k in range(self.m):
            self.link(copy_name(op.name, k), name, [copy_name(t.name, k)])
        self.final[t.name] = (name, name)

    def link(self, src: str, dst: str, tensors) -> None:
        self.edges.setdefault((src, dst), []).extend(tensors)

    def names(self, op: str, i: int) -> str:
        """The op of slice ``i`` that runs ``op``: its copy, its whole op, or itself (unbatched)."""
        if op in self.whole:
            return whole_name(op)
        return copy_name(op, i) if self.g.op(op).batch else op

    def add_edges(self) -> None:
        g, m, whole = self.g, self.m, self.whole
        for e in g.edges:
            bu, bv = g.op(e.src).batch and e.src not in whole, g.op(e.dst).batch and e.dst not in whole
            if bv or (bu and (e.dst in whole or not e.tensors)):
                # per slice: a copy reads its slice; a whole op (or a control edge) every slice
                for i in range(m):
                    self.link(self.names(e.src, i), self.names(e.dst, i),
                              [copy_name(t, i) if bu else t for t in e.tensors])
            elif not bu:
                self.link(self.names(e.src, 0), self.names(e.dst, 0), e.tensors)
            else:
                for t in e.tensors:
                    src, tensor = self.final[t]
                    self.link(src, e.dst, [tensor])

    def edge_list(self) -> list[Edge]:
        return [Edge(u, v, tuple(ts) if len(ts) < 2 else tuple(dict.fromkeys(ts))) for (u, v), ts in self.edges.items()]


def _sparse_producers(graph: OpGraph, sparse: frozenset) -> frozenset:
    """The ops producing the sparse partials ``sparse`` (:func:`sparse_partials`)."""
    return frozenset(graph.tensor(t).src for t in sparse)


def _ceil_div(a: int, n: int) -> int:
    return -(-a // n)
