"""The kernel fusions TensorFlow makes after a plan's control edges are in place.

:func:`tf_patch.apply_plan` chains each device's ops with control edges. A
fusion that merges two ops into one kernel *after* that can turn an edge
into a cycle (the fused kernel waits on its own output: the step stops with
``Retval[0] does not have value`` or hangs across devices), and an edge can
also keep a fusion from happening. Which fusions can run then:

* **grappler's remapper** (``Conv2D + BiasAdd [+ Relu/Relu6/Elu/LeakyRelu/
  Add]`` into ``_FusedConv2D``, ``MatMul + BiasAdd [+ activation]`` into
  ``_FusedMatMul``, ``FusedBatchNorm + activation``, ``BatchMatMul + Mul``,
  Gelu, LayerNorm...) does not run in tf_patch's sessions
  (:func:`tf_patch.devices.session_config` turns grappler off), and where it
  runs it does not fuse an op that has a control input or output
  (``HasControlFaninOrFanout`` in ``remapper.cc``): an order edge can only
  keep it from fusing, never close a cycle;
* **oneDNN's graph pass** (``mkl_layout_pass.cc``, on CPU devices; on by
  default in x86 Linux builds) runs on every session's graph after the
  edges are in place. Its two-op merges are the patterns of :data:`PATTERNS`
  (both ops float32, on the same device, with equal control inputs):

  - ``Conv2D + BiasAdd`` -> ``_MklNativeConv2DWithBias`` named after the
    BiasAdd, when the Conv2D's output feeds only the BiasAdd;
  - ``Conv2DBackpropFilter + BiasAddGrad`` (siblings on the same
    gradient) -> ``_MklNativeConv2DBackpropFilterWithBias`` named after the
    Conv2DBackpropFilter.

  The merged op keeps both ops' inputs and control edges. Its other merges
  (``Pad + Conv2D``, NCHW transpose eliminations) are not made by the
  TensorFlow these tests run (``tests/test_tf_fusion.py`` checks the
  predicted merges against the partition graphs TF reports), and the
  transpose eliminations refuse ops with control edges anyway.

Whether the pass runs at all depends on the process: TensorFlow turns
oneDNN on by default only on x86 Linux CPUs with neural-network features
(AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX), and ``TF_ENABLE_ONEDNN_OPTS``
overrides that once, when TensorFlow loads. Rather than guess from those,
:func:`onednn_fuses` runs a one-op Conv2D + BiasAdd once per process and
looks at the kernel TensorFlow made of it; where nothing fuses
:func:`fusions` predicts nothing (no order edge is then left out, and a
trace check takes every op under its own name).

TensorFlow's merge rule has one more edge: a Conv2D and a BiasAdd with the
same *non-empty* control inputs fail a ``CHECK`` in the pass and abort the
process. :func:`tf_patch.apply.control_edges_for` never gives them that.

Examples
--------
>>> sorted(PATTERNS)
['Conv2D+BiasAdd', 'Conv2DBackpropFilter+BiasAddGrad']
>>> onednn_fuses() in (True, False)                     # doctest: +SKIP
True
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from dataclasses import dataclass

from .devices import session_config

__all__ = ["PATTERNS", "Fusion", "fusions", "onednn_fuses"]

#: pattern -> (first op type, second op type, which of the two names the fused kernel)
PATTERNS = {"Conv2D+BiasAdd": ("Conv2D", "BiasAdd", 1),
            "Conv2DBackpropFilter+BiasAddGrad": ("Conv2DBackpropFilter", "BiasAddGrad", 0)}


@dataclass(frozen=True)
class Fusion:
    """Two ops oneDNN merges into one kernel (see the module docstring).

    ``ops`` in the pattern's order (``Conv2D``, ``BiasAdd``); ``survivor``
    is the name the fused kernel keeps (the one traces show).
    """

    pattern: str
    ops: tuple
    survivor: str

    @property
    def fused_away(self) -> str:
        """The member whose name disappears from the running graph."""
        return self.ops[0] if self.survivor == self.ops[1] else self.ops[1]


def fusions(graph, placement, *, control: bool = True) -> list[Fusion]:
    """The merges of :data:`PATTERNS` oneDNN makes in ``graph`` run as placed.

    Parameters
    ----------
    graph : tf.Graph
    placement : op name -> plan device (``/CPU:k``: oneDNN merges only on CPU
        devices); the ops placed are the step's, so consumers outside it do
        not count (TensorFlow prunes them before the pass)
    control : bool
        Only pairs whose control inputs (as the graph is, before any order
        edge) allow the merge: equal, and none on a Conv2D + BiasAdd. With
        False, every pair that matches a pattern otherwise.

    Returns
    -------
    list of Fusion
        Pairs both on one CPU device, float32, same data format; none where
        oneDNN does not fuse in this process (:func:`onednn_fuses`).
    """
    out = []
    if not any("CPU" in d.upper() for d in placement.values()) or not onednn_fuses():
        return out
    for op in graph.get_operations():
        if op.name not in placement or "CPU" not in placement[op.name].upper() or _dtype(op) != "float32":
            continue
        if op.type == "BiasAdd":
            pair = _conv_of(op, placement)
        elif op.type == "BiasAddGrad":
            pair = _filter_grad_of(op, placement)
        else:
            continue
        if pair is None:
            continue
        a, b = pair
        if placement.get(a.name) != placement[op.name] or _dtype(a) != "float32" \
                or _attr(a, "data_format") != _attr(b, "data_format"):
            continue
        if control and ({c.name for c in a.control_inputs} != {c.name for c in b.control_inputs}
                        or (a.type == "Conv2D" and a.control_inputs)):
            continue  # not merged (equal non-empty ones on Conv2D + BiasAdd abort TF: not ours to predict)
        pattern = f"{a.type}+{b.type}"
        out.append(Fusion(pattern, (a.name, b.name), (a.name, b.name)[PATTERNS[pattern][2]]))
    return out


_PROBE: list = []  # onednn_fuses()'s answer, once per process (TensorFlow reads its switch once too)


def onednn_fuses() -> bool:
    """Whether oneDNN's graph pass merges a Conv2D + BiasAdd in this process.

    Observed, not guessed: a float32 Conv2D + BiasAdd on one CPU device is
    run once in a session configured as tf_patch's are
    (:func:`tf_patch.devices.session_config`), and the partition graph
    TensorFlow reports is read: the pair merged when the Conv2D is gone and
    the BiasAdd's name runs a convolution kernel. The answer is kept for the
    process, as TensorFlow decides once, when it loads.
    """
    if not _PROBE:
        _PROBE.append(_probe())
    return _PROBE[0]


def _probe() -> bool:
    import numpy as np
    import tensorflow as tf

    t1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default(), g.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        x = t1.placeholder(tf.float32, (1, 4, 4, 2), name="x")
        w = tf.constant(np.ones((1, 1, 2, 2), np.float32))
        conv = tf.nn.conv2d(x, w, 1, "VALID", name="conv")
        out = tf.nn.bias_add(conv, tf.constant(np.ones(2, np.float32)), name="biasadd")
    md = t1.RunMetadata()
    with t1.Session(graph=g, config=session_config(1)) as sess:
        sess.run(out, {x: np.ones((1, 4, 4, 2), np.float32)},
                 options=t1.RunOptions(output_partition_graphs=True), run_metadata=md)
    kinds = {n.name: n.op for pg in md.partition_graphs for n in pg.node}
    return "conv" not in kinds and "Conv2D" in kinds.get("biasadd", "")


def _conv_of(bias_add, placement):
    """``(Conv2D, BiasAdd)`` when the BiasAdd adds to a Conv2D's output that
    nothing else in the step reads."""
    src = bias_add.inputs[0]
    if src.op.type != "Conv2D" or src.value_index != 0:
        return None
    readers = {c.name for c in src.consumers() if c.name in placement}
    return (src.op, bias_add) if readers == {bias_add.name} else None


def _filter_grad_of(bias_grad, placement):
    """``(Conv2DBackpropFilter, BiasAddGrad)`` reading the same gradient
    (its third input), when exactly one such filter gradient does."""
    grad = bias_grad.inputs[0].op
    filters = {c for t in grad.outputs for c in t.consumers()
               if c.type == "Conv2DBackpropFilter" and c.name in placement and c.inputs[2].op is grad}
    biases = {c for t in grad.outputs for c in t.consumers()
              if c.type == "BiasAddGrad" and c.name in placement}
    return (filters.pop(), bias_grad) if len(filters) == 1 and len(biases) == 1 else None


def _attr(op, name):
    try:
        return op.get_attr(name)
    except ValueError:
        return None


def _dtype(op) -> str | None:
    t = _attr(op, "T")
    return getattr(t, "name", None)
