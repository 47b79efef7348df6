"""Batch marks from static shapes: which ops of a TensorFlow step scale with the batch.

:func:`batch_marks` fills :attr:`pesto.graph.Op.batch` for every op that
:func:`tf_patch.extract.extract` keeps (so :func:`pesto.step.split` can split an
un-split TensorFlow step): ``True`` for an op that runs once per slice of the
batch (it reads or writes per-sample data, or computes the slice's loss and
gradients), ``False`` for one that runs once per step (variables, their
reads, constants, shape arithmetic on constants, the optimizer).

The rule
--------
1. **Data inputs**: the step's ``Placeholder``, ``PlaceholderWithDefault`` and
   ``IteratorGetNext`` ops with a non-resource output of rank >= 1 (a
   ``tf.function``'s captured tensors and variables are not inputs).
2. **Batch sizes** (unless given): the most common leading dimension of the
   data inputs (all of the most common ones on a tie), and the leading
   dimensions of the outputs of a ``Split``/``SplitV`` reading a data input
   (the micro-batch size of a step :mod:`tf_patch.microstep` split).
3. **Once per step** (``False``, whatever their shapes):

   * variables (``VarHandleOp``, ``VariableV2``, resource placeholders), their
     reads (``ReadVariableOp``, ``Identity`` of a reference), writes
     (``Assign*``, ``*Apply*``, ``*Scatter*``: optimizer updates) and ``Const``;
   * **the update**: every op outside a gradient scope that depends on an
     op inside one, that none of them depends on, and that a write depends
     on (the forward pass of a ``tf.function``'s RNN reads accumulators its
     gradient creates, and the loss reduction after it feeds no write). Gradient scopes are TensorFlow's own
     first name components for ``tf.gradients`` (``gradients``,
     ``gradients_<n>``) and ``tf.GradientTape`` (``gradient_tape``), so this
     is the optimizer (a Keras optimizer's arithmetic before its writes
     too) and a split step's gradient accumulation;
   * **weight-derived** ops: those that depend on a variable and on no data
     input (a cast or transpose of a weight), whose leading dimension may
     equal the batch size by coincidence.
4. **Per-sample tensors**, among the outputs of the other ops, in
   topological order: those whose static leading dimension is a batch size
   (an unknown one too when extraction's ``batch=`` says what it is), and,
   made by an op that reads a per-sample tensor, those with any dimension a
   multiple of a batch size (an RNN's outputs reshaped to ``[B*T, H]`` or
   made time-major, ``[T, B, H]``, and what is computed from them) or of
   type variant (a ``TensorList`` of time steps).
5. **Once per slice** (``True``), among the ops not in 3:

   * every op that reads or writes a per-sample tensor (the forward and
     backward passes, the loss reduction);
   * every gradient-scope op connected to one through gradient-scope ops
     (data edges, either way): the weight gradients, which contract the
     batch away, and their sums over time steps (a slice's partial
     gradients), and the gradient's seed and shape arithmetic.
6. Everything else: ``False`` (shape arithmetic on constants, a scalar
   computed from scalars). A step with no data input gets no marks
   (``None``: Pesto does not guess; :func:`pesto.step.split` refuses it and
   names the ops).

Knowingly approximate: an op that depends on no data input but makes a
per-sample shape from constants (an RNN's zero initial state) is batched, as
each slice needs its own, and so is one whose leading dimension equals a
batch size by coincidence; a batch-norm moving-average update (a write) is
once per step though its statistics are per slice. Edges are data edges
throughout: control edges order ops (a ``tf.function``'s automatic ones even
across slices) but carry no samples.

Examples
--------
>>> marks = batch_marks(step_ops(graph, [train_op, loss]))   # doctest: +SKIP
>>> marks["MatMul"], marks["train/update_w/ResourceApplyAdam"]   # doctest: +SKIP
(True, False)
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import re
from collections import Counter

from .marks import GRADIENT_ROOT, INPUT_TYPES

__all__ = ["batch_marks", "data_inputs", "batch_sizes"]

_VARIABLES = frozenset({"VarHandleOp", "VariableV2", "Variable", "VarHandleOpV2"})
_READS = frozenset({"ReadVariableOp", "VarIsInitializedOp"})
_WRITE = re.compile(r"^Assign\w*$|^(Resource)?(Sparse)?Apply\w+$|^(Resource)?Scatter\w+$")


def _is_resource(t) -> bool:
    import tensorflow as tf

    return t.dtype.base_dtype == tf.resource or getattr(t.dtype, "_is_ref_dtype", False)


def data_inputs(ops) -> list:
    """The ops of ``ops`` the batch enters by (rule 1 of the module doc)."""
    captured = {id(t.op) for t in getattr(ops[0].graph, "internal_captures", ())} if ops else set()
    return [op for op in ops if op.type in INPUT_TYPES and id(op) not in captured and op.outputs
            and any(not _is_resource(t) and t.shape.rank for t in op.outputs)]


def _leading(t):
    """A tensor's static leading dimension: an int, None (unknown) or ``False`` (a scalar or unknown rank)."""
    if t.shape.rank is None or t.shape.rank == 0:
        return False
    return t.shape.as_list()[0]


def batch_sizes(ops) -> frozenset:
    """The batch sizes of a step (rule 2 of the module doc); empty without data inputs."""
    inputs = data_inputs(ops)
    dims = Counter(d for op in inputs for t in op.outputs if not _is_resource(t)
                   for d in [_leading(t)] if d)
    if not dims:
        return frozenset()
    top = max(dims.values())
    sizes = {d for d, n in dims.items() if n == top}
    names = {op.name for op in inputs}
    for op in ops:
        if op.type in ("Split", "SplitV") and any(t.op.name in names for t in op.inputs):
            sizes.update(d for t in op.outputs for d in [_leading(t)] if d)
    return frozenset(sizes)


def _reach(start, nexts, allowed) -> set:
    """Ops reachable from ``start`` (excluded unless reached again) through ``allowed`` ones."""
    seen, stack = set(), [n for s in start for n in nexts[s] if n in allowed]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(m for m in nexts[n] if m in allowed and m not in seen)
    return seen


def _edges(ops):
    """``(successors, predecessors)`` by op name over the data edges within
    ``ops`` (control edges order ops, a tf.function's automatic ones even
    across slices, but carry no data)."""
    names = {op.name for op in ops}
    succ = {n: set() for n in names}
    pred = {n: set() for n in names}
    for op in ops:
        for src in [t.op for t in op.inputs]:
            if src.name in names:
                succ[src.name].add(op.name)
                pred[op.name].add(src.name)
    return succ, pred


def _fixed(ops, succ, pred, inputs) -> set:
    """Ops that run once per step whatever their shapes (rule 3 of the module doc)."""
    own = {op.name for op in ops if op.type in _VARIABLES or op.type in _READS or op.type == "Const"
           or _WRITE.match(op.type)
           or (op.type == "Placeholder" and op.outputs and all(_is_resource(t) for t in op.outputs))
           or (op.type == "Identity" and op.inputs and _is_resource(op.inputs[0]))}
    every = set(succ)
    grad = {op.name for op in ops if GRADIENT_ROOT.match(op.name.split("/", 1)[0])}
    writes = {op.name for op in ops if _WRITE.match(op.type)}
    update = (_reach(grad, succ, every) - grad - _reach(grad, pred, every)) & _reach(writes, pred, every)
    variables = {op.name for op in ops if op.type in _VARIABLES or op.name in own and op.type == "Placeholder"}
    from_data = _reach(inputs, succ, every) | set(inputs)
    weights = _reach(variables, succ, every) - from_data
    return own | update | weights


def _carries(t, sizes) -> bool:
    """Whether a tensor made from per-sample data still holds samples: a
    dimension that is a multiple of a batch size, or a variant (a TensorList
    of an RNN's time steps)."""
    import tensorflow as tf

    if t.dtype.base_dtype == tf.variant:
        return True
    dims = t.shape.as_list() if t.shape.rank is not None else []
    return any(d and d % s == 0 for d in dims for s in sizes)


def batch_marks(ops, sizes=None, *, batch: int | None = None) -> dict[str, bool]:
    """Op name -> batch mark for the ops of one step (the rule of the module doc).

    Parameters
    ----------
    ops : list of tf.Operation
        The step's ops (:func:`tf_patch.extract.step_ops`).
    sizes : iterable of int, optional
        The batch sizes (default: :func:`batch_sizes`).
    batch : int, optional
        Extraction's ``batch=``: the size of unknown leading dimensions, so
        they count as a batch size, and ``batch`` is one too.

    Returns
    -------
    dict
        A mark for every op, or ``{}`` when the step has no batch size (no
        data input, no ``sizes``): the ops stay unmarked.
    """
    sizes = frozenset(batch_sizes(ops) if sizes is None else sizes) | ({batch} if batch else set())
    if not sizes:
        return {}
    ops = sorted(ops, key=lambda o: o._id)  # creation order: topological
    succ, pred = _edges(ops)
    fixed = _fixed(ops, succ, pred, [op.name for op in data_inputs(ops)])
    sample, batched = set(), set()
    for op in ops:
        if op.name in fixed:
            continue
        reads = any(t.name in sample for t in op.inputs)
        for t in op.outputs:
            d = _leading(t)
            if d in sizes or (d is None and batch) or (reads and _carries(t, sizes)):
                sample.add(t.name)
        if reads or any(t.name in sample for t in op.outputs):
            batched.add(op.name)
    grad = {n for n in succ if n not in fixed and GRADIENT_ROOT.match(n.split("/", 1)[0])}
    linked = {n: succ[n] | pred[n] for n in succ}
    start = (batched | {m for n in batched for m in linked[n]}) & grad
    batched |= start | _reach(start, linked, grad)
    return {n: n in batched for n in succ}
