"""A deep layer stack's op graph from the profile of one layer: the tiling rule.

Profiling a 1.3B-parameter model's whole step with grappler is slow and big;
its layers are copies of one another (the same ops on the same shapes), so
its graph is built from the graph of the same model with **one** layer
(``layer_0``), profiled as every zoo graph is, and copied per layer.

The rule (:func:`tile`), on the one-layer graph made :func:`canonical`:

1. **The block** is every op with a ``layer_0`` (or ``update_layer_0``)
   component in its name: the layer's forward ops, their gradients
   (``gradients/layer_0/...``), its variables and Adam slots and their updates
   (``train/update_layer_0/...``). Every other op (embedding, head, loss,
   their gradients, the shared optimizer ops and constants) is the **rest**,
   kept once.
2. **Copies**: layer ``k`` gets a copy of every block op, tensor, edge and
   colocation group with ``layer_0`` renamed ``layer_k``; its costs, bytes,
   persistent bytes (weights + slots) and batch mark are the block op's.
   Grappler's cost of an op depends only on its type and shapes, which are
   the same in every layer.
3. **The chain**: the block reads exactly two per-sample tensors from the
   rest (``Op.batch`` producers): the forward activation ``x`` (from the
   embedding) and the gradient of its output (from the head's backward,
   under ``gradients/``), and sends exactly two back: its output ``y`` (to
   the head) and the gradient of ``x`` (to the embedding's backward).
   Layer ``k > 0`` reads layer ``k-1``'s ``y`` where layer 0 read ``x``
   (the forward activation and every backward op that reads it); layer
   ``k < L-1`` reads layer ``k+1``'s gradient of ``x`` where the block read
   the head's gradient. Only layer ``L-1`` sends ``y`` to the rest and only
   layer 0 the gradient of ``x``.
4. **Shared**: every other edge between the block and the rest (the causal
   mask, the learning rate, the Adam ``beta_power`` reads, the control
   edges into the step's ``train`` op) is copied for every layer, to or from
   the same rest op.

:func:`canonical` first renames TensorFlow's gradient sums (``AddN`` ops
directly under ``gradients/``, numbered by creation order, hence different
in a deep and a shallow graph) into the layer they sum for, numbered by
their inputs' names: ``gradients/layer_3/AddN_1``. A fully profiled
``L``-layer graph made canonical and the tile of its one-layer graph are then
the same graph: the same ops, tensors, edges, groups, batch marks and bytes,
and per-op costs equal (``tests/test_zoo_tiling.py`` checks it op by op, and
the total compute within 0.1 %, for GPT and BERT at small sizes; at GPT-1.3B's
sizes, two layers profiled whole and tiled from one were identical too).

Examples
--------
>>> layer_of("gradients/layer_12/mlp/fc/MatMul_grad/MatMul"), layer_of("embed/add")
(12, None)
>>> relayer("train/update_layer_0/attention/qkv/w/ResourceApplyAdam:0", 5)
'train/update_layer_5/attention/qkv/w/ResourceApplyAdam:0'
"""
from __future__ import annotations

import re

from pesto.errors import InvalidGraphError
from pesto.graph import Edge, Op, OpGraph, Tensor, common_scope

__all__ = ["canonical", "tile", "layer_of", "relayer", "chain_tensors", "Chain"]

_LAYER = re.compile(r"(?<![^/:])((?:update_)?layer_)(\d+)(?=[/:]|$)")


def layer_of(name: str) -> int | None:
    """The layer an op (or tensor) name belongs to, None outside every layer."""
    m = _LAYER.search(name)
    return int(m.group(2)) if m else None


def relayer(name, k: int):
    """``name`` with its layer number set to ``k`` (None stays None)."""
    return None if name is None else _LAYER.sub(lambda m: f"{m.group(1)}{k}", name)


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def canonical(graph: OpGraph) -> OpGraph:
    """``graph`` with each gradient sum (an ``AddN`` directly under
    ``gradients/``) renamed by what it sums rather than by creation order.

    A sum belongs to the lowest layer among its inputs' producers (through
    other sums): the gradient of a layer's tensor sums what its consumers in
    that layer and the next one send, and the gradient of a layer's input is
    that layer's. It becomes ``gradients/layer_<k>/AddN_<i>``, ``i`` its rank
    among layer ``k``'s sums by the names of its producers in layer ``k``
    that are not sums (layer number left out), ties in graph order. A sum of
    no layer becomes ``<S>/AddN_<i>``, ``S`` the scope its producers share.
    Everything else is unchanged.
    """
    producer = {t.name: t.src for t in graph.tensors}
    inputs: dict[str, list] = {}
    for e in graph.edges:
        inputs.setdefault(e.dst, []).extend(producer[t] for t in e.tensors)
    sums = [op.name for op in graph.ops if op.type == "AddN" and _scope(op.name) == "gradients"]
    is_sum = set(sums)
    memo: dict = {}

    def layer(n):
        if n not in is_sum:
            return layer_of(n)
        if n not in memo:
            memo[n] = None
            found = [k for k in (layer(p) for p in inputs.get(n, ())) if k is not None]
            memo[n] = min(found) if found else None
        return memo[n]

    keyed: dict[str, list] = {}
    for pos, n in enumerate(sums):
        k, srcs = layer(n), sorted(set(inputs.get(n, ())))
        if k is None:
            scope, key = common_scope(srcs) or "gradients", tuple(srcs)
        else:
            scope = f"gradients/layer_{k}"
            key = tuple(relayer(p, 0) for p in srcs if p not in is_sum and layer_of(p) == k)
        keyed.setdefault(scope, []).append((key, pos, n))
    new = {old: f"{scope}/AddN_{i}" for scope, items in keyed.items()
           for i, (_, _, old) in enumerate(sorted(items))}
    return _renamed(graph, lambda n: new.get(n, n))


def _tensor_renamer(op_name):
    def rename(t: str) -> str:
        op, _, idx = t.rpartition(":")
        return f"{op_name(op)}:{idx}"
    return rename


def _renamed(graph: OpGraph, op_name, name: str | None = None) -> OpGraph:
    """``graph`` with every op renamed by ``op_name`` (tensors, edges and the
    colocation groups named after an op, ``coloc:<op>``, follow)."""
    tn = _tensor_renamer(op_name)

    def group(g):
        return f"coloc:{op_name(g[6:])}" if g and g.startswith("coloc:") else g
    ops = [_op_copy(op, op_name(op.name), group(op.colocation_group), op.anchor and op_name(op.anchor))
           for op in graph.ops]
    tensors = [Tensor(tn(t.name), op_name(t.src), t.bytes) for t in graph.tensors]
    edges = [Edge(op_name(e.src), op_name(e.dst), tuple(tn(t) for t in e.tensors)) for e in graph.edges]
    return OpGraph(ops, edges, tensors, name=name or graph.name)


def _op_copy(op: Op, name: str, group, anchor) -> Op:
    """``op`` named ``name`` in colocation group ``group``, differentiating
    ``anchor`` (its marks, costs and bytes kept)."""
    return Op(name, dict(op.compute), kinds=op.kinds, persistent_bytes=op.persistent_bytes,
              output_bytes=op.output_bytes, temporary_bytes=op.temporary_bytes, colocation_group=group,
              scope=_scope(name), type=op.type, batch=op.batch, phase=op.phase, anchor=anchor, role=op.role,
              view_bytes=op.view_bytes)


class Chain:
    """The four chain tensors of a one-layer graph (rule 3 of the module doc):
    ``x`` and ``grad_y`` read by the block, ``y`` and ``grad_x`` sent back."""

    def __init__(self, x: str, y: str, grad_y: str, grad_x: str):
        self.x, self.y, self.grad_y, self.grad_x = x, y, grad_y, grad_x

    def __repr__(self):
        return f"Chain(x={self.x!r}, y={self.y!r}, grad_y={self.grad_y!r}, grad_x={self.grad_x!r})"


def _one(found: set, what: str, graph: OpGraph) -> str:
    if len(found) != 1:
        raise InvalidGraphError(f"{graph.name}: the block must have exactly one {what}, found "
                                f"{sorted(found) or 'none'}; it is not one link of a layer chain")
    return next(iter(found))


def chain_tensors(graph: OpGraph, block: set) -> Chain:
    """The chain tensors of ``graph`` whose block ops are ``block``.

    Raises
    ------
    InvalidGraphError
        Not exactly one of each (the graph is not a stack of this block).
    """
    ops = {op.name: op for op in graph.ops}
    src = {t.name: t.src for t in graph.tensors}
    into, out = set(), set()
    for e in graph.edges:
        if (e.src in block) != (e.dst in block):
            for t in e.tensors:
                if ops[src[t]].batch:
                    (into if e.dst in block else out).add(t)

    def grad(ts, flag):
        return {t for t in ts if src[t].startswith("gradients/") == flag}
    return Chain(x=_one(grad(into, False), "per-sample forward input", graph),
                 y=_one(grad(out, False), "per-sample forward output", graph),
                 grad_y=_one(grad(into, True), "per-sample gradient input", graph),
                 grad_x=_one(grad(out, True), "per-sample gradient output", graph))


def _segments(graph: OpGraph, block: set) -> list:
    """``graph``'s ops in order, consecutive block ops as one list."""
    out: list = []
    for op in graph.ops:
        if op.name in block:
            if not out or not isinstance(out[-1], list):
                out.append([])
            out[-1].append(op)
        else:
            out.append(op)
    return out


def _ops(graph: OpGraph, block: set, layers: int) -> list:
    """The rest's ops and the block's per layer, in the one-layer graph's
    order; a backward run of block ops is copied from the top layer down."""
    ops = []
    for seg in _segments(graph, block):
        if not isinstance(seg, list):
            ops.append(seg)
            continue
        order = range(layers - 1, -1, -1) if seg[0].name.startswith("gradients/") else range(layers)
        for k in order:
            ops.extend(_op_copy(op, relayer(op.name, k), relayer(op.colocation_group, k), relayer(op.anchor, k))
                       for op in seg)
    return ops


def tile(graph: OpGraph, layers: int, *, name: str | None = None) -> OpGraph:
    """The ``layers``-layer graph of the one-layer ``graph`` (module doc's rule).

    Parameters
    ----------
    graph : OpGraph
        A one-layer graph (ops of ``layer_0`` only), made :func:`canonical`.
    layers : int >= 1
    name : the result's name (default: ``graph``'s)

    Raises
    ------
    InvalidGraphError
        ``graph`` has ops of another layer than 0, none of layer 0, or not
        exactly one chain tensor of each kind (:func:`chain_tensors`).
    """
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    found = {layer_of(op.name) for op in graph.ops} - {None}
    if found != {0}:
        raise InvalidGraphError(f"{graph.name}: tile needs the ops of one layer, layer_0; found layers "
                                f"{sorted(found) or 'none'}")
    block = {op.name for op in graph.ops if layer_of(op.name) == 0}
    ch = chain_tensors(graph, block)
    src = {t.name: t.src for t in graph.tensors}
    tensors = [t for t in graph.tensors if t.src not in block]
    tensors += [Tensor(relayer(t.name, k), relayer(t.src, k), t.bytes)
                for k in range(layers) for t in graph.tensors if t.src in block]
    edges: dict = {}

    def add(u, v, ts):
        edges.setdefault((u, v), []).extend(ts)

    for e in graph.edges:
        inner_u, inner_v = e.src in block, e.dst in block
        if not inner_u and not inner_v:
            add(e.src, e.dst, e.tensors)
            continue
        for k in range(layers):
            if inner_u and inner_v:
                add(relayer(e.src, k), relayer(e.dst, k), [relayer(t, k) for t in e.tensors])
            elif inner_v:
                _edge_in(add, e, k, layers, ch, src)
            else:
                ts = [relayer(t, k) for t in e.tensors if not ((t == ch.y and k != layers - 1) or (t == ch.grad_x and k != 0))]
                if ts or not e.tensors:
                    add(relayer(e.src, k), e.dst, ts)
    ops = _ops(graph, block, layers)
    pos = {op.name: i for i, op in enumerate(ops)}   # edges in op order: the file does not depend on TF's
    return OpGraph(ops, [Edge(u, v, tuple(sorted(set(ts)))) for (u, v), ts in sorted(edges.items(),
                   key=lambda kv: (pos[kv[0][0]], pos[kv[0][1]]))], tensors, name=name or graph.name)


def _edge_in(add, e: Edge, k: int, layers: int, ch: Chain, src: dict) -> None:
    """Edge ``e`` (rest -> block) of layer ``k``: a chain tensor from the
    neighbouring layer where there is one (rule 3), anything else from the
    same rest op (rule 4)."""
    dst = relayer(e.dst, k)
    rest = []
    for t in e.tensors:
        if t == ch.x and k > 0:
            add(relayer(src[ch.y], k - 1), dst, [relayer(ch.y, k - 1)])
        elif t == ch.grad_y and k < layers - 1:
            add(relayer(src[ch.grad_x], k + 1), dst, [relayer(ch.grad_x, k + 1)])
        else:
            rest.append(t)
    if rest or not e.tensors:
        add(e.src, dst, rest)
