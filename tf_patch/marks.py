"""The marks of a TensorFlow training step, from TensorFlow's names and types.

The core reads what each op of a step is from marks on the op
(:attr:`pesto.graph.Op.batch`, ``phase``, ``anchor``, ``role``:
:mod:`pesto.step.marks`), never from a framework's names. This module is
where TensorFlow's names become those marks; it imports no TensorFlow, so the
CLI marks a TF-named JSON graph without TensorFlow installed.

* :func:`mark_step` = :func:`mark_batch` then :func:`mark_phases`: every
  mark an op lacks, by the rules below (ops that carry a mark keep it);
* :func:`mark_batch` fills :attr:`~pesto.graph.Op.batch` of a graph that came
  without marks (the cached zoo JSON graphs) by a stated rule on op names,
  types and edges -- no shapes (:mod:`tf_patch.batchmarks` marks from shapes
  at extraction);
* :func:`mark_phases` fills ``phase``, ``anchor`` and ``role`` from
  TensorFlow's gradient scopes and op types;
* :func:`mark_views` fills :attr:`~pesto.graph.Op.view_bytes`: a variable's
  read shares the variable's buffer (the view rule below). The extractor,
  :func:`mark_step` and the facade's loading (``pesto.api.load_graph``,
  ``pesto.api.marked``) apply it, so every TensorFlow graph a solve reads
  carries it, the cached JSON graphs too.

The batch rule
--------------
1. **data inputs**: source ops (no predecessor) of type ``Placeholder``,
   ``PlaceholderWithDefault`` or ``IteratorGetNext`` holding no persistent bytes
   and producing some (a Keras step's captured variables arrive as placeholders
   *with* persistent bytes: they are not inputs). ``inputs=`` overrides it;
2. **step ops** (once per step): every op under an *optimizer scope*, every
   variable write (``Assign*``, ``*Apply*``, ``*Scatter*``: a batch-norm moving
   average too) and every op holding persistent bytes (a variable). An
   optimizer scope is the first scope component of an op that applies a
   gradient to a variable (types ``*Apply*``, ``AssignSubVariableOp``,
   ``AssignAddVariableOp``, ``ResourceScatterAdd/Sub``: ``train``, Keras'
   ``sgd_1``) unless some op under it is *forward*: reached from a data input
   without passing a gradient scope (:data:`GRADIENT_ROOT`) --
   a model scope whose batch norm updates its moving averages is no optimizer;
3. **batched**: the data inputs and every op reached from them, through data
   or control edges, without passing through a step op (activations, the loss,
   their gradients, the weight gradients: they read per-sample data; a
   constant a gradient builds under a control dependency on a batched op is
   part of that slice's gradient -- left unbatched it would make every slice
   wait for all others there);
4. **unbatched**: everything else (variables, their reads, constants, shape
   arithmetic on constants, the optimizer).

What it gets wrong, knowingly: an op that *makes* a batch-shaped tensor from
constants (an RNN's zero initial state ``Fill``) is not reached from the inputs,
so it stays unbatched and is shared by all slices (cheap; a shape rule would
slice it); a batch-norm moving-average update reads the slices' summed
statistics (the step's value changes, not its cost). A sparse
(``IndexedSlices``) embedding gradient is right: role ``"sparse-grad"``, its
slices concatenated (:mod:`pesto.step.slicing`) and replicas gathering it.

The view rule
-------------
An op's outputs are a view of its variable's buffer (``view_bytes`` =
``output_bytes``) when it is a ``ReadVariableOp`` whose one data input comes
from an op holding persistent bytes (the variable: a ``VarHandleOp``, a Keras
step's captured-variable ``Placeholder``), or an ``Identity`` of a ref
variable (:data:`REF_VARIABLES`), in the variable's colocation group (so on
its device: TensorFlow colocates a resource's readers with it), and no op of
a type in :data:`SPARSE_ACCESS` reads that variable. TensorFlow's
``ReadVariableOp::Compute`` (``tensorflow/core/kernels/resource_variable_ops.cc``)
sets its output to the variable's tensor, ``ctx->set_output(0,
*variable->tensor())``, unless the variable is in copy-on-read mode, where it
copies (``CopyVariable``); ``EnsureSparseVariableAccess``
(``tensorflow/core/kernels/training_op_helpers.h``) turns that mode on, and
the kernels of ``ResourceGather``, ``ResourceGatherNd``, ``ResourceScatter*``
and ``ResourceScatterNd*`` call it, ``ResourceSparseApply*`` through
``GetInputTensorFromVariable(..., sparse=true)``. An op that already carries
view bytes keeps them.

The phase rule
--------------
* **backward** (:func:`gradient_ops`): the ops under a gradient scope
  (:data:`GRADIENT_ROOT`: ``gradients/``, ``gradient_tape/``) and every op
  after one of them; of those, an unbatched op is ``"update"``, one with a
  tensor read by an unbatched op (a weight gradient) ``"weight-grad"``, the
  others ``"input-grad"``; every other op is ``"forward"``. A graph without
  a gradient scope gets no phase (unknown);
* **anchor**: a batched backward op's scope mirrors the forward op it
  differentiates (``gradients/<op>_grad/...``, ``gradient_tape/<op>/...``):
  the longest scope prefix naming a batched forward op, else a layer scope
  of depth >= 2 holding forward ops, whose middle one is taken
  (the pipeline placers' rule for the ops left: :func:`solver.parallel.cut.phases`);
* **role** ``"grad-sum"``: every op of a type in :data:`SUM_TYPES` (an
  elementwise sum: the per-time-step weight gradients of an RNN are summed by
  an ``AddN``; a forward add is marked too -- the type does not tell them
  apart -- and :func:`pesto.step.split` only sums partials through one whose
  output is a weight gradient of its inputs' size);
* **role** ``"joinable"`` (:func:`joinable`): a weight gradient
  ``tf_patch.LossStep(whole=...)`` builds once over every slice: a batched
  ``MatMul`` marked ``"weight-grad"`` under ``gradient_tape/`` (a
  ``tf.function`` step: ``LossStep``, ``keras_step``; graph-mode
  ``gradients/`` steps, the zoo, are built otherwise) whose anchor is a forward
  ``MatMul`` reading a once-per-step tensor (the weight: a ``Dense`` kernel's
  gradient). A ``MatMul`` against a weight outside a Keras ``Dense`` layer is
  marked too; :meth:`tf_patch.FunctionStep.apply` refuses a plan joining one;
* **role** ``"sparse-grad"`` (:func:`sparse_grads`): a batched op, among
  ops with no role yet, with a tensor an update op of a type in
  :data:`SPARSE_UPDATE` reads, directly or through once-per-step ops' data (a v1 optimizer's ``Unique`` and
  ``UnsortedSegmentSum`` deduplicating an ``IndexedSlices``' indices and
  rows, a ``ResourceScatterAdd`` of SGD, a ``ResourceSparseApply*``): the
  producers of a sparse gradient's rows and indices (an embedding lookup's
  gradient, ``gradients/<lookup>_grad/Reshape``, ``Reshape_1``), which the
  replicas gather instead of summing (:func:`pesto.step.replicate`, as
  :mod:`tf_patch.replicastep` builds them). :func:`mark_sparse` applies the
  rule alone (:func:`pesto.api.marked` does for a graph that came marked);
* **role** ``"unshardable"`` (:func:`unshardable`): an elementwise update op
  that reads a weight gradient (a Keras 3 optimizer's, not one
  ``ResourceApply*``; not a sparse gradient's, which is sharded by rows):
  ``tf_patch`` builds no sharded optimizer (ZeRO) for the step,
  so the search does not screen one (:func:`pesto.step.marks.shardable`).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> ops = [Op("x", {"GPU": 1.0}, output_bytes=64, type="Placeholder"),
...        Op("w", {"GPU": 1.0}, persistent_bytes=16, type="VarHandleOp"),
...        Op("read", {"GPU": 1.0}, output_bytes=16, type="ReadVariableOp"),
...        Op("mm", {"GPU": 9.0}, output_bytes=32, type="MatMul", scope="dense"),
...        Op("gradients/mm_grad", {"GPU": 9.0}, output_bytes=16, type="MatMul", scope="gradients/mm_grad"),
...        Op("train/apply", {"GPU": 2.0}, type="ResourceApplyGradientDescent", scope="train")]
>>> ts = [Tensor(f"{o.name}:0", o.name, o.output_bytes) for o in ops]
>>> es = [Edge("w", "read", "w:0"), Edge("x", "mm", "x:0"), Edge("read", "mm", "read:0"),
...       Edge("x", "gradients/mm_grad", "x:0"), Edge("mm", "gradients/mm_grad", "mm:0"),
...       Edge("gradients/mm_grad", "train/apply", "gradients/mm_grad:0"), Edge("w", "train/apply", "w:0")]
>>> g = mark_step(OpGraph(ops, es, ts))
>>> [(o.name, o.batch, o.phase) for o in g.ops]   # doctest: +NORMALIZE_WHITESPACE
[('x', True, 'forward'), ('w', False, 'forward'), ('read', False, 'forward'), ('mm', True, 'forward'),
 ('gradients/mm_grad', True, 'weight-grad'), ('train/apply', False, 'update')]
>>> g.op("gradients/mm_grad").anchor
'mm'
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Iterable

from pesto.errors import BatchMarkError
from pesto.graph import OpGraph

__all__ = ["mark_step", "mark_batch", "mark_phases", "mark_views", "views", "SPARSE_ACCESS", "REF_VARIABLES", "joinable", "unshardable",
           "sparse_grads", "mark_sparse", "SPARSE_UPDATE", "input_ops", "optimizer_scopes", "update_ops",
           "gradient_ops", "scope_root", "is_marked", "GRADIENT_ROOT", "INPUT_TYPES", "SUM_TYPES"]

#: Op types a batch enters a TensorFlow step by.
INPUT_TYPES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext"})
#: Op types that apply a gradient to a variable: their first scope component is an optimizer scope.
APPLY_TYPE = re.compile(r"^(Resource)?(Sparse)?Apply\w+$|^Assign(Add|Sub)VariableOp$|^(Resource)?Scatter(Add|Sub)$")
#: Op types that write a variable: always once per step.
WRITE_TYPE = re.compile(r"^Assign\w*$|^(Resource)?(Sparse)?Apply\w+$|^(Resource)?Scatter\w+$")
#: First scope components under which TensorFlow builds gradients
#: (``tf.gradients``: ``gradients``, ``gradients_1``...; ``tf.GradientTape``: ``gradient_tape``).
GRADIENT_ROOT = re.compile(r"^(gradients(_\d+)?|gradient_tape)$")
#: Op types whose kernel puts a resource variable in copy-on-read mode (``EnsureSparseVariableAccess``):
#: the variable's reads copy it (the view rule of the module doc).
SPARSE_ACCESS = re.compile(r"^Resource(Gather(Nd)?|Scatter\w*|SparseApply\w+)$")
#: Op types of an update op that reads a sparse gradient's rows or indices (role ``"sparse-grad"``).
SPARSE_UPDATE = re.compile(r"^(Unique|UnsortedSegmentSum|(Resource)?Scatter(Add|Sub)|(Resource)?SparseApply\w+)$")
#: Op types of a ref variable: an ``Identity`` of one forwards the variable's buffer.
REF_VARIABLES = frozenset({"VariableV2", "Variable"})
#: Op types of a variable's read: ``ReadVariableOp`` (a resource variable), ``Identity`` (a ref variable).
READ_TYPES = frozenset({"ReadVariableOp", "Identity"})
#: Op types that sum their inputs elementwise (role ``"grad-sum"``: partials flow back through them).
SUM_TYPES = frozenset({"AddN", "AddV2", "Add", "AccumulateNV2"})


def scope_root(op) -> str:
    """First component of an op's scope (of its name when the scope is empty).

    >>> from pesto.graph import Op
    >>> scope_root(Op("gradients/a/b", {"GPU": 1.0})), scope_root(Op("x", {"GPU": 1.0}, scope="enc/l0"))
    ('gradients', 'enc')
    """
    return (op.scope or op.name).split("/", 1)[0]


def input_ops(graph: OpGraph) -> list[str]:
    """The ops the batch enters by (rule 1 of the module doc).

    >>> from pesto.graph import Op, OpGraph
    >>> input_ops(OpGraph([Op("x", {"GPU": 0.0}, output_bytes=8, type="Placeholder"),
    ...                      Op("v", {"GPU": 0.0}, persistent_bytes=8, type="Placeholder")]))
    ['x']
    """
    return [op.name for op in graph.ops if op.type in INPUT_TYPES and not graph.predecessors(op.name)
            and op.persistent_bytes == 0 and op.output_bytes > 0]


def optimizer_scopes(graph: OpGraph, inputs: Iterable[str] | None = None) -> frozenset:
    """First scope components of the ops that apply a gradient to a variable,
    less those holding a forward op (rule 2 of the module doc).

    >>> from pesto.graph import Op, OpGraph
    >>> sorted(optimizer_scopes(OpGraph([Op("train/x", {"GPU": 1.0}, type="ResourceApplyAdam",
    ...                                     scope="train/update_w")])))
    ['train']
    """
    roots = {scope_root(op) for op in graph.ops if APPLY_TYPE.match(op.type)}
    if not roots:
        return frozenset()
    ops = graph.ops
    grad = {i for i, op in enumerate(ops) if GRADIENT_ROOT.match(scope_root(op))}
    start = input_ops(graph) if inputs is None else [n for n in inputs if n in graph]
    forward = _reach(graph, [graph.index[n] for n in start], grad)
    return frozenset(roots - {scope_root(ops[i]) for i in forward})


def _reach(graph: OpGraph, seeds, blocked) -> set:
    """Indices reached from ``seeds`` (any edge), never entering ``blocked``."""
    succ = graph.succ_idx()
    seen = set(seeds)
    todo = list(seen)
    while todo:
        for j in succ[todo.pop()]:
            if j not in seen and j not in blocked:
                seen.add(j)
                todo.append(j)
    return seen


def update_ops(graph: OpGraph, inputs: Iterable[str] | None = None) -> frozenset:
    """Ops that run once per step whatever they read (rule 2 of the module doc).

    >>> g = OpGraph.from_edges({"x": 1, "bn/mean": 1, "bn/AssignMovingAvg": 1},
    ...                        [("x", "bn/mean"), ("bn/mean", "bn/AssignMovingAvg")])
    >>> g = OpGraph([replace(o, type=t) for o, t in zip(g.ops, ["Placeholder", "Mean",
    ...              "AssignSubVariableOp"])], g.edges, g.tensors)
    >>> sorted(update_ops(g, ["x"]))   # bn holds a forward op: no optimizer scope
    ['bn/AssignMovingAvg']
    """
    roots = optimizer_scopes(graph, inputs)
    return frozenset(op.name for op in graph.ops if scope_root(op) in roots or WRITE_TYPE.match(op.type)
                     or op.persistent_bytes > 0)


def mark_batch(graph: OpGraph, *, inputs: Iterable[str] | None = None) -> OpGraph:
    """``graph`` with every op without a batch mark marked by the batch rule (module doc).

    Parameters
    ----------
    inputs : op names, optional
        The data inputs; default :func:`input_ops`.

    Raises
    ------
    BatchMarkError
        No data input (the message says to pass ``inputs=``), or an input
        that is not an op of the graph.
    """
    if all(op.batch is not None for op in graph.ops):
        return graph
    names = list(input_ops(graph) if inputs is None else inputs)
    missing = [n for n in names if n not in graph]
    if missing:
        raise BatchMarkError(f"graph {graph.name!r} has no op named as a data input", missing)
    if not names:
        raise BatchMarkError(f"graph {graph.name!r}: no data input found (a source Placeholder without "
                             f"persistent bytes); pass inputs=[op names]")
    idx = graph.index
    stop = {idx[n] for n in update_ops(graph, names)}
    seen = _reach(graph, [idx[n] for n in names], stop)
    ops = [op if op.batch is not None else replace(op, batch=i in seen) for i, op in enumerate(graph.ops)]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


def gradient_ops(graph: OpGraph) -> frozenset:
    """The ops of the backward pass and of the update that follows it: the
    ops under a gradient scope (:data:`GRADIENT_ROOT`) and every op after one
    of them; empty when no op is under one.

    >>> g = OpGraph.from_edges({"x": 1, "gradients/x_grad": 1, "u": 1}, [("x", "gradients/x_grad"),
    ...                        ("gradients/x_grad", "u")])
    >>> sorted(gradient_ops(g))
    ['gradients/x_grad', 'u']
    """
    out = {i for i, op in enumerate(graph.ops) if GRADIENT_ROOT.match(scope_root(op))}
    out |= _reach(graph, out, ())
    return frozenset(graph.names[i] for i in out)


def mark_phases(graph: OpGraph) -> OpGraph:
    """``graph`` with ``phase``, ``anchor`` and ``role`` filled where an op has
    none, by the phase rule of the module doc (batch marks are read, not set).

    >>> g = mark_phases(OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b")]))
    >>> [(o.phase, o.anchor, o.role) for o in g.ops]   # no gradient scope: phases unknown
    [(None, None, ''), (None, None, '')]
    """
    back = gradient_ops(graph)
    ops = graph.ops
    phase: list = [None] * len(ops)
    anchor: list = [None] * len(ops)
    if back:
        batched = [op.batch is not False for op in ops]
        step_reader = set()
        for _, src, _, cons in graph.tensor_table():
            if any(ops[j].batch is False for j in cons):
                step_reader.add(src)
        idx = graph.index
        forward = [i for i in graph.topo_idx() if ops[i].batch and ops[i].name not in back]
        fwd, by_scope = set(forward), _forward_scopes(graph, forward)
        for i, op in enumerate(ops):
            if op.name not in back:
                phase[i] = "forward"
                continue
            phase[i] = "update" if not batched[i] else "weight-grad" if i in step_reader else "input-grad"
            if op.batch:
                a = _mirror(op.scope or op.name, idx, fwd, by_scope)
                anchor[i] = None if a is None else ops[a].name
    out = [replace(op, phase=op.phase or p, anchor=op.anchor or a,
                   role=op.role or ("grad-sum" if op.type in SUM_TYPES else ""))
           for op, p, a in zip(ops, phase, anchor)]
    marked = OpGraph(out, graph.edges, graph.tensors, name=graph.name)
    join, unshard, sparse = joinable(marked), unshardable(marked), sparse_grads(marked)
    if not join and not unshard and not sparse:
        return marked
    out = [replace(op, role="joinable") if op.name in join else replace(op, role="unshardable")
           if op.name in unshard else replace(op, role="sparse-grad") if op.name in sparse else op for op in out]
    return OpGraph(out, graph.edges, graph.tensors, name=graph.name)


def sparse_grads(graph: OpGraph) -> frozenset:
    """The ops the sparse-gradient rule of the module doc marks (role
    ``"sparse-grad"``), among ops with no role yet: batched ops with a
    tensor from which an unbatched op of a type in :data:`SPARSE_UPDATE` is
    reached through data edges between unbatched ops (SGD scales the rows by
    the learning rate before its ``ResourceScatterAdd``).

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("rows", {"GPU": 1.0}, batch=True), Op("ids", {"GPU": 1.0}, batch=True),
    ...        Op("unique", {"GPU": 1.0}, batch=False, type="Unique"),
    ...        Op("sum", {"GPU": 1.0}, batch=False, type="UnsortedSegmentSum")]
    >>> es = [Edge("ids", "unique", "ids:0"), Edge("rows", "sum", "rows:0"), Edge("unique", "sum", "unique:1")]
    >>> sorted(sparse_grads(OpGraph(ops, es, [Tensor("rows:0", "rows", 8), Tensor("ids:0", "ids", 4),
    ...                                       Tensor("unique:1", "unique", 4)])))
    ['ids', 'rows']
    """
    ops = graph.ops
    data: list[list[int]] = [[] for _ in ops]   # unbatched op -> the unbatched ops reading its tensors
    for _, src, _, cons in graph.tensor_table():
        if ops[src].batch is False:
            data[src].extend(j for j in cons if ops[j].batch is False)
    out = set()
    for _, src, _, cons in graph.tensor_table():
        if not ops[src].batch or ops[src].role:
            continue
        seen = {j for j in cons if ops[j].batch is False}
        todo = list(seen)
        while todo and not any(SPARSE_UPDATE.match(ops[j].type) for j in todo):
            todo = [k for j in todo for k in data[j] if k not in seen]
            seen.update(todo)
        if todo:
            out.add(graph.names[src])
    return frozenset(out)


def mark_sparse(graph: OpGraph) -> OpGraph:
    """``graph`` with role ``"sparse-grad"`` set by :func:`sparse_grads`; ``graph`` itself when it marks no op.

    >>> mark_sparse(OpGraph.from_edges({"a": 1}, [])).op("a").role
    ''
    """
    found = sparse_grads(graph)
    if not found:
        return graph
    ops = [replace(op, role="sparse-grad") if op.name in found else op for op in graph.ops]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


#: Op types a weight gradient passes through on its way to its update (not the update itself).
PASS_TYPES = frozenset({"Identity", "IdentityN", "NoOp"})
#: Op types of an update computed from a weight gradient op by op (a Keras 3 optimizer's:
#: ``variable.assign_sub(gradient * lr)``, Adam's ``(gradient - m)``, ``square(gradient)``), which
#: ``tf_patch.replicastep`` does not shard (it shards one ``ResourceApply*`` op per variable; a sparse
#: gradient's update, from its ``Unique``/``UnsortedSegmentSum`` on, by rows).
ELEMENTWISE_UPDATE = frozenset({"Mul", "Sub", "Square", "RealDiv", "Neg", "AssignSubVariableOp",
                                "AssignAddVariableOp"})


def unshardable(graph: OpGraph) -> frozenset:
    """The ops the unshardable rule marks (role ``"unshardable"``, module doc),
    among ops with no role yet: an ``"update"`` op of a type in
    :data:`ELEMENTWISE_UPDATE` that reads a weight gradient (through
    :data:`PASS_TYPES`; a Keras 3 optimizer's ``Mul`` of the gradient and the
    learning rate): a sharded optimizer is not built for such a step
    (:func:`pesto.step.marks.shardable`). Not a sparse gradient's
    (:func:`sparse_grads`): ``tf_patch.replicastep`` shards its update by
    rows whatever its ops (v1 SGD's ``Neg`` and ``Mul`` before its scatter-add).

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("dw", {"GPU": 1.0}, output_bytes=4, batch=True, phase="weight-grad"),
    ...        Op("mul", {"GPU": 1.0}, output_bytes=4, batch=False, phase="update", type="Mul")]
    >>> sorted(unshardable(OpGraph(ops, [Edge("dw", "mul", "dw:0")], [Tensor("dw:0", "dw", 4)])))
    ['mul']
    """
    sparse = sparse_grads(graph) | {op.name for op in graph.ops if op.role == "sparse-grad"}
    grads = {op.name for op in graph.ops if op.phase == "weight-grad"} - sparse
    todo = list(grads)
    while todo:   # through the pass-through ops after a weight gradient
        for v in graph.successors(todo.pop()):
            if graph.op(v).type in PASS_TYPES and v not in grads:
                grads.add(v)
                todo.append(v)
    return frozenset(v for u in grads for v in graph.successors(u)
                     if (op := graph.op(v)).phase == "update" and not op.role and op.type in ELEMENTWISE_UPDATE)


def joinable(graph: OpGraph) -> frozenset:
    """The ops the joinable rule of the module doc marks (role ``"joinable"``),
    among ops with no role yet, in a graph with phase and anchor marks.

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("w", {"GPU": 0.0}, output_bytes=8, batch=False, phase="forward"),
    ...        Op("m/d/MatMul", {"GPU": 1.0}, output_bytes=8, batch=True, phase="forward", type="MatMul"),
    ...        Op("gradient_tape/m/d/MatMul/MatMul_1", {"GPU": 1.0}, output_bytes=8, batch=True,
    ...           phase="weight-grad", anchor="m/d/MatMul", type="MatMul", scope="gradient_tape/m/d/MatMul")]
    >>> g = OpGraph(ops, [Edge("w", "m/d/MatMul", "w:0")], [Tensor("w:0", "w", 8)])
    >>> sorted(joinable(g))
    ['gradient_tape/m/d/MatMul/MatMul_1']
    """
    out = set()
    for op in graph.ops:
        if (op.role or not op.batch or op.type != "MatMul" or op.phase != "weight-grad"
                or scope_root(op) != "gradient_tape" or op.anchor not in graph):
            continue
        fwd = graph.op(op.anchor)
        if fwd.type == "MatMul" and any(graph.op(u).batch is False and graph.edge(u, fwd.name).tensors
                                        for u in graph.predecessors(fwd.name)):
            out.add(op.name)
    return frozenset(out)


def mark_step(graph: OpGraph, *, inputs: Iterable[str] | None = None) -> OpGraph:
    """``graph`` with every mark an op lacks filled: :func:`mark_batch`, then
    :func:`mark_phases`, then :func:`mark_views`.

    Raises
    ------
    BatchMarkError
        As :func:`mark_batch` (only when some op has no batch mark).
    """
    return mark_views(mark_phases(mark_batch(graph, inputs=inputs)))


def views(graph: OpGraph) -> dict[str, int]:
    """The ops the view rule of the module doc marks, with their view bytes
    (their output bytes), among ops without view bytes yet.

    >>> from pesto.graph import Op, Edge, Tensor
    >>> ops = [Op("w", {"GPU": 0.0}, persistent_bytes=64, type="VarHandleOp", colocation_group="w"),
    ...        Op("read", {"GPU": 0.0}, output_bytes=64, type="ReadVariableOp", colocation_group="w"),
    ...        Op("e", {"GPU": 0.0}, persistent_bytes=64, type="VarHandleOp", colocation_group="e"),
    ...        Op("e_read", {"GPU": 0.0}, output_bytes=64, type="ReadVariableOp", colocation_group="e"),
    ...        Op("gather", {"GPU": 1.0}, output_bytes=8, type="ResourceGather", colocation_group="e")]
    >>> es = [Edge("w", "read", "w:0"), Edge("e", "e_read", "e:0"), Edge("e", "gather", "e:0")]
    >>> views(OpGraph(ops, es, [Tensor("w:0", "w", 0), Tensor("e:0", "e", 0)]))   # e is read sparsely: copies
    {'read': 64}
    """
    out = {}
    ops, index, pred, succ = graph.ops, graph.index, graph.pred_idx(), graph.succ_idx()
    for i, op in enumerate(ops):
        if op.type not in READ_TYPES or op.view_bytes or not op.output_bytes or op.colocation_group is None:
            continue
        src = [u for u in pred[i] if graph.edge(graph.names[u], op.name).tensors]
        if len(src) != 1:
            continue
        var = ops[src[0]]
        is_var = var.persistent_bytes > 0 if op.type == "ReadVariableOp" else var.type in REF_VARIABLES
        if (is_var and var.colocation_group == op.colocation_group
                and not any(SPARSE_ACCESS.match(ops[j].type) for j in succ[src[0]])):
            out[op.name] = op.output_bytes
    return out


def mark_views(graph: OpGraph) -> OpGraph:
    """``graph`` with :attr:`~pesto.graph.Op.view_bytes` set by the view rule
    of the module doc (:func:`views`); ``graph`` itself when the rule marks no op.

    >>> mark_views(OpGraph.from_edges({"a": 1}, [])).op("a").view_bytes
    0
    """
    if not any(op.type in READ_TYPES for op in graph.ops):
        return graph
    found = views(graph)
    if not found:
        return graph
    ops = [replace(op, view_bytes=found[op.name]) if op.name in found else op for op in graph.ops]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


def is_marked(graph: OpGraph) -> bool:
    """Whether every op has a batch mark and some op a phase: the marks a front end sets.

    >>> is_marked(OpGraph.from_edges({"a": 1}, []))
    False
    """
    return all(op.batch is not None for op in graph.ops) and any(op.phase is not None for op in graph.ops)


def _forward_scopes(graph: OpGraph, forward) -> dict:
    """Scope prefix (depth >= 2) -> the middle forward op under it (topological order)."""
    under: dict[str, list[int]] = {}
    for i in forward:
        parts = graph.ops[i].scope.split("/")
        for d in range(2, len(parts) + 1):
            under.setdefault("/".join(parts[:d]), []).append(i)
    return {k: v[len(v) // 2] for k, v in under.items()}


def _mirror(scope: str, idx, fwd, by_scope):
    """The forward op a gradient scope names (its longest prefix that is one), else a layer's."""
    parts = scope.split("/")
    if not parts or not GRADIENT_ROOT.match(parts[0]):
        return None
    parts = [p[:-5] if p.endswith("_grad") else p for p in parts[1:]]
    for k in range(len(parts), 0, -1):
        j = idx.get("/".join(parts[:k]))
        if j is not None and j in fwd:
            return j
    for k in range(len(parts), 1, -1):
        j = by_scope.get("/".join(parts[:k]))
        if j is not None:
            return j
    return None
