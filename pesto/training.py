"""What the ops of a training step are, for graphs that do not say it.

* :func:`infer_batch_marks` fills :attr:`pesto.graph.Op.batch` of a TensorFlow
  training graph that came without marks (the cached zoo JSON graphs), by a
  stated rule on op names, types and edges -- no shapes;
* :func:`backward_ops` tells the backward pass (and the update after it) from
  the forward pass, by TensorFlow's gradient scopes or from a named loss op.

The batch rule (for TensorFlow graphs; a graph that carries marks needs none)
---------------------------------------------------------------------------
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
statistics (the step's value changes, not its cost); a sparse (``IndexedSlices``)
embedding gradient is treated as a dense partial (see :mod:`pesto.microbatch`).
Ops that already carry a mark keep it.

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
>>> g = infer_batch_marks(OpGraph(ops, es, ts))
>>> [(o.name, o.batch) for o in g.ops]   # doctest: +NORMALIZE_WHITESPACE
[('x', True), ('w', False), ('read', False), ('mm', True), ('gradients/mm_grad', True),
 ('train/apply', False)]
>>> sorted(backward_ops(g))
['gradients/mm_grad', 'train/apply']
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Iterable

from .errors import BatchMarkError, InvalidGraphError
from .graph import OpGraph

__all__ = ["infer_batch_marks", "data_inputs", "optimizer_scopes", "step_ops", "backward_ops",
           "scope_root", "GRADIENT_ROOT"]

INPUT_TYPES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext"})
#: Op types that apply a gradient to a variable: their first scope component is an optimizer scope.
APPLY_TYPE = re.compile(r"^(Resource)?(Sparse)?Apply\w+$|^Assign(Add|Sub)VariableOp$|^(Resource)?Scatter(Add|Sub)$")
#: Op types that write a variable: always once per step.
WRITE_TYPE = re.compile(r"^Assign\w*$|^(Resource)?(Sparse)?Apply\w+$|^(Resource)?Scatter\w+$")
#: First scope components under which TensorFlow builds gradients
#: (``tf.gradients``: ``gradients``, ``gradients_1``...; ``tf.GradientTape``: ``gradient_tape``).
GRADIENT_ROOT = re.compile(r"^(gradients(_\d+)?|gradient_tape)$")


def scope_root(op) -> str:
    """First component of an op's scope (of its name when the scope is empty).

    >>> from pesto.graph import Op
    >>> scope_root(Op("gradients/a/b", {"GPU": 1.0})), scope_root(Op("x", {"GPU": 1.0}, scope="enc/l0"))
    ('gradients', 'enc')
    """
    return (op.scope or op.name).split("/", 1)[0]


def data_inputs(graph: OpGraph) -> list[str]:
    """The ops the batch enters by (rule 1 of the module doc).

    >>> from pesto.graph import Op, OpGraph
    >>> data_inputs(OpGraph([Op("x", {"GPU": 0.0}, output_bytes=8, type="Placeholder"),
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
    start = data_inputs(graph) if inputs is None else [n for n in inputs if n in graph]
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


def step_ops(graph: OpGraph, inputs: Iterable[str] | None = None) -> frozenset:
    """Ops that run once per step whatever they read (rule 2 of the module doc).

    >>> g = OpGraph.from_edges({"x": 1, "bn/mean": 1, "bn/AssignMovingAvg": 1},
    ...                        [("x", "bn/mean"), ("bn/mean", "bn/AssignMovingAvg")])
    >>> g = OpGraph([replace(o, type=t) for o, t in zip(g.ops, ["Placeholder", "Mean",
    ...              "AssignSubVariableOp"])], g.edges, g.tensors)
    >>> sorted(step_ops(g, ["x"]))   # bn holds a forward op: no optimizer scope
    ['bn/AssignMovingAvg']
    """
    roots = optimizer_scopes(graph, inputs)
    return frozenset(op.name for op in graph.ops if scope_root(op) in roots or WRITE_TYPE.match(op.type)
                     or op.persistent_bytes > 0)


def infer_batch_marks(graph: OpGraph, *, inputs: Iterable[str] | None = None) -> OpGraph:
    """``graph`` with every unmarked op marked by the rule of the module doc.

    Parameters
    ----------
    inputs : op names, optional
        The data inputs; default :func:`data_inputs`.

    Raises
    ------
    BatchMarkError
        No data input (the message says to pass ``inputs=``), or an input
        that is not an op of the graph.
    """
    names = list(data_inputs(graph) if inputs is None else inputs)
    missing = [n for n in names if n not in graph]
    if missing:
        raise BatchMarkError(f"graph {graph.name!r} has no op named as a data input", missing)
    if not names:
        raise BatchMarkError(f"graph {graph.name!r}: no data input found (a source Placeholder without "
                             f"persistent bytes); pass inputs=[op names]")
    idx = graph.index
    stop = {idx[n] for n in step_ops(graph, names)}
    seen = _reach(graph, [idx[n] for n in names], stop)
    ops = [op if op.batch is not None else replace(op, batch=i in seen) for i, op in enumerate(graph.ops)]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


def backward_ops(graph: OpGraph, *, loss: str | None = None) -> frozenset:
    """The ops of the backward pass and of the update that follows it.

    Without ``loss``: the ops under a gradient scope (:data:`GRADIENT_ROOT`:
    TensorFlow's ``gradients/`` and ``gradient_tape/``) and every op after one
    of them. With ``loss`` (an op name): every op after the loss op. Ops not
    returned are the forward pass (and what precedes it).

    Raises
    ------
    InvalidGraphError
        ``loss`` is not an op of the graph; no op is under a gradient scope
        and no ``loss`` was given.

    Examples
    --------
    >>> g = OpGraph.from_edges({"x": 1, "loss": 1, "dloss": 1, "dx": 1},
    ...                        [("x", "loss"), ("loss", "dloss"), ("dloss", "dx")])
    >>> sorted(backward_ops(g, loss="loss"))
    ['dloss', 'dx']
    """
    if loss is not None:
        if loss not in graph:
            raise InvalidGraphError(f"loss op {loss!r} is not in graph {graph.name!r}")
        seeds = [graph.index[loss]]
        out: set[int] = set()
    else:
        seeds = [i for i, op in enumerate(graph.ops) if GRADIENT_ROOT.match(scope_root(op))]
        if not seeds:
            raise InvalidGraphError(f"graph {graph.name!r}: no op under a gradient scope (gradients/, "
                                    f"gradient_tape/); name the loss op: backward_ops(graph, loss=...)")
        out = set(seeds)
    succ = graph.succ_idx()
    todo = list(seeds)
    while todo:
        for j in succ[todo.pop()]:
            if j not in out:
                out.add(j)
                todo.append(j)
    return frozenset(graph.names[i] for i in out)
