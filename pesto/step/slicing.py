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
   the cost model does not change). A metric (argmax), a batch-norm moving
   average (each slice then sees its own batch statistics, as in GPipe) or a
   sparse gradient (``IndexedSlices``: summing means concatenating) is not;
   the graph is still built, but its value is then not the un-split step's
   and, for a sparse gradient, its bytes are those of the full tensor;
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
  gradient) is summed through a chain of ``M - 1`` accumulate ops
  ``t@acc1 .. t@acc{M-1}`` (``t@acck`` = slices ``0..k``, so slice ``k`` can be
  added as soon as it is done, into one buffer), and the unbatched consumers read
  the last one. Slice ``i + 1`` depends on slice ``i`` through nothing else, so
  slices overlap (pipeline) as far as devices allow;
* an unbatched op *between* batched ops (reading a partial, or under a control
  edge from a batched op, and feeding batched ops) is where every slice waits
  for all the others: mark it batched if it belongs to one slice (a constant a
  gradient builds under a control dependency does);
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
  (it is weight-shaped); the op's ``output_bytes`` keep the part that is
  partials and divide the rest (rounded up); ``temporary_bytes`` are divided
  (rounded up); ``persistent_bytes`` are not copied (rule 3);
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
  server's DDR4 for ``"CPU"``; it may run on the kinds its producer allows.

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
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from ..errors import BatchMarkError, MicroBatchError
from ..graph import Edge, Op, OpGraph, Tensor
from .transform import Origin, Transformed, check_count, identity

__all__ = ["split", "check_marks", "partial_tensors", "fixed_ops", "slice_op", "accumulate_op", "copy_name",
           "parse_name", "FLOOR_US", "BANDWIDTH", "RESERVED"]

#: Shortest time of a slice's kernel (µs): a V100 kernel's duration floor with
#: launches pipelined. An op already faster keeps its own time.
FLOOR_US = 2.0
#: Memory bandwidth per device kind (bytes per µs) that accumulate ops are
#: costed with: V100 HBM2 900 GB/s; a two-socket DDR4 server ~50 GB/s.
BANDWIDTH = MappingProxyType({"GPU": 900e3, "CPU": 50e3})

#: Names :func:`split` makes: an original op or tensor may not look like them.
RESERVED = re.compile(r"@(mb|acc)\d")


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


def parse_name(name: str) -> Origin:
    """Inverse of the naming rule, without the graph.

    >>> parse_name("layer/MatMul@mb3")
    Origin(op='layer/MatMul', replica=None, slice=3, role='copy', tensor=None, members=())
    >>> parse_name("grad:0@acc2").role, parse_name("w").role
    ('accumulate', 'step')
    """
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

    ``partial_bytes``: bytes of ``op``'s outputs that are partials (kept whole).

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
    return replace(op, name=name, compute=compute, output_bytes=keep + _ceil_div(op.output_bytes - keep, n),
                   temporary_bytes=temp, colocation_group=colocation_group)


def accumulate_op(name: str, nbytes: int, kinds, *, scope: str = "", floor_us: float = FLOOR_US,
                  bandwidth: Mapping[str, float] = BANDWIDTH, what: str = "") -> Op:
    """An op adding two tensors of ``nbytes``: ``max(floor_us, 3 * nbytes / bandwidth[kind])``.

    >>> op = accumulate_op("g@acc1", 9_000_000, {"GPU"})
    >>> op.compute["GPU"], op.output_bytes, op.batch
    (30.0, 9000000, False)
    """
    missing = sorted(k for k in kinds if k not in bandwidth)
    if missing:
        raise MicroBatchError(f"no memory bandwidth for device kind {missing[0]!r} to cost the sum of "
                              f"{what or name!r}; pass bandwidth={{{missing[0]!r}: bytes_per_us}}",
                              culprit=missing[0])
    compute = {k: max(floor_us, 3.0 * nbytes / bandwidth[k]) for k in kinds}
    return Op(name, compute, output_bytes=nbytes, scope=scope, type="Accumulate", batch=False)


def split(graph: OpGraph, micro_batches: int, *, floor_us: float = FLOOR_US,
          bandwidth: Mapping[str, float] = BANDWIDTH) -> Transformed:
    """The step ``graph`` run as ``micro_batches`` slices, with the map back to its ops (module doc).

    Raises
    ------
    MicroBatchError
        ``micro_batches`` not an integer >= 1; a device kind without bandwidth.
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
    if m == 1:
        return identity(graph)
    b = _Split(graph, m, floor_us, bandwidth)
    b.add_ops()
    b.add_edges()
    out = OpGraph(b.ops, b.edge_list(), b.tensors, name=f"{graph.name}@mb{m}")
    return Transformed(out, graph, MappingProxyType(b.origin), micro_batches=m, partials=b.partials)


class _Split:
    """The pieces of a split graph while it is built."""

    def __init__(self, graph: OpGraph, m: int, floor_us: float, bandwidth):
        self.g, self.m, self.floor, self.bw = graph, m, floor_us, bandwidth
        self.partials = partial_tensors(graph)
        batched = [bool(op.batch) for op in graph.ops]
        self.to_step = {name for name, src, _, cons in graph.tensor_table()
                        if batched[src] and any(not batched[j] for j in cons)}
        self.fixed = fixed_ops(graph, self.partials)
        self.ops: list[Op] = []
        self.tensors: list[Tensor] = []
        self.edges: dict[tuple[str, str], list[str]] = {}
        self.origin: dict[str, Origin] = {}
        self.final: dict[str, tuple[str, str]] = {}  # partial -> (op, tensor) the step reads
        shared = {op.colocation_group for op in graph.ops if not op.batch}
        self.shared_groups = shared - {None}

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
            kept = sum(t.bytes for t in mine if t.name in self.partials)
            for i in range(m):
                name = copy_name(op.name, i)
                copy = slice_op(op, m, name, fixed=op.name in self.fixed, partial_bytes=kept,
                                floor_us=self.floor, colocation_group=self.group(op, i))
                self.ops.append(copy if op.anchor is None else replace(copy, anchor=self.anchor(op.anchor, i)))
                self.origin[name] = Origin(op.name, slice=i)
                self.tensors.extend(Tensor(copy_name(t.name, i), name, self.size(t)) for t in mine)
            for t in mine:
                if t.name in self.to_step:
                    self.accumulate(op, t)

    def anchor(self, name: str, i: int) -> str:
        """Slice ``i``'s name of anchor ``name``: its copy if batched (a mark naming no op stays)."""
        return copy_name(name, i) if name in self.g and self.g.op(name).batch else name

    def size(self, t: Tensor) -> int:
        return t.bytes if t.name in self.partials else _ceil_div(t.bytes, self.m)

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

    def link(self, src: str, dst: str, tensors) -> None:
        self.edges.setdefault((src, dst), []).extend(tensors)

    def add_edges(self) -> None:
        g, m = self.g, self.m
        for e in g.edges:
            bu, bv = g.op(e.src).batch, g.op(e.dst).batch
            if not bu and not bv:
                self.link(e.src, e.dst, e.tensors)
            elif not bu:
                for i in range(m):
                    self.link(e.src, copy_name(e.dst, i), e.tensors)
            elif bv:
                for i in range(m):
                    self.link(copy_name(e.src, i), copy_name(e.dst, i), [copy_name(t, i) for t in e.tensors])
            elif not e.tensors:
                for i in range(m):
                    self.link(copy_name(e.src, i), e.dst, [])
            else:
                for t in e.tensors:
                    src, tensor = self.final[t]
                    self.link(src, e.dst, [tensor])

    def edge_list(self) -> list[Edge]:
        return [Edge(u, v, tuple(dict.fromkeys(ts))) for (u, v), ts in self.edges.items()]


def _ceil_div(a: int, n: int) -> int:
    return -(-a // n)
