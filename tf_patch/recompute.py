"""Activation recomputation built in TensorFlow from a Pesto plan (issue 30, item 4).

A plan with ``recompute`` among its savers (``plan.log.savers``) places a step
transformed by :func:`pesto.step.recompute`: per layer block, copies
``op@rc`` of the forward ops whose outputs the block's backward reads (split:
``op@rc@mb<i>``; replicated: ``op@rc@r<r>...``), the backward ops reading the
copies, and a control edge from the block's trigger (a backward op of the next
block) into every copy without an in-block producer. :func:`recompute_graph`
makes the same change to the TF step that runs the plan (its GraphDef), from
the plan's own graph, so TensorFlow recomputes exactly what Pesto costed (each
block at its level: every op, its cheap ops or none, ``"recompute(1/4:0)+cheap(2/4:1-2)"``):

* each Pesto copy ``c`` of op ``o`` (:func:`tf_patch.slicemap.recomputed_op`: ``c`` without ``@rc``)
  whose ``o`` maps to one TF op ``t`` (the map of the plan's other ops onto
  the TF step: :func:`tf_patch.slicemap.slice_map`) gets a TF copy
  ``recompute/<t>`` (:data:`tf_patch.slicemap.RECOMPUTE`): ``t``'s NodeDef
  (type, attributes, control inputs) reading the copies of its producers
  where the Pesto copy reads copies (the block's own ops) and the originals
  elsewhere (the block's inputs, the weights);
* a Pesto edge from a copy into an op that is not one (a backward op of the
  block) makes that op's TF counterparts read the TF copy instead of ``t``;
* a Pesto edge without tensors from an op into a copy (the trigger) is a
  control input of the TF copy.

The TF copies then map one to one onto the Pesto copies
(:func:`tf_patch.slicemap.slice_map`: role ``"recompute"``), and the plan's
devices and order are enforced on them as on every other op. A Pesto copy
whose op maps to no single TF op is listed (:attr:`Recomputed.left_out`), not
built: its block's backward then reads the original (the same values, the
memory not saved). The losses equal the un-recomputed step's (the same ops run
again on the same inputs), except for random ops (dropout draws again).

"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from pesto.graph import OpGraph

from .extract import extract
from .replicastep import _graph_of, _split_input, mapped_plan
from .slicemap import RECOMPUTE, recomputed_op, result_view, slice_map
from .zoo.common import ZooModel

__all__ = ["Recomputed", "recompute_graph", "carried_graph", "with_copies", "recompute_model",
           "recompute_replicated"]


@dataclass(frozen=True)
class Recomputed:
    """The TF step with the plan's recomputed copies (:func:`recompute_graph`).

    Attributes
    ----------
    graph : tf.Graph
        Every op of the step, the copies ``recompute/<t>`` and the rewired reads.
    copies : mapping TF op -> its TF copy
    rewired : tuple of (TF op, TF copy)
        Each backward op that reads a copy instead of the original.
    left_out : tuple of str
        Pesto copies not built (their op maps to no single TF op).
    """

    graph: object
    copies: Mapping[str, str]
    rewired: tuple
    left_out: tuple


def _spec(pesto_graph: OpGraph, op_map: Mapping[str, tuple]):
    """From the plan's graph and the map of its other ops: ``(TF op of each Pesto copy,
    (TF producer, TF consumer) pairs that both are copies, pairs whose consumer
    reads the copy, TF copy -> its trigger ops, Pesto copies left out)``."""
    of, left = {}, []
    for name in pesto_graph.names:
        o = recomputed_op(name)
        if o is None:
            continue
        ts = op_map.get(o, ())
        if len(ts) == 1:
            of[name] = ts[0]
        else:
            left.append(name)
    inner, rewire, control = set(), set(), {}
    for e in pesto_graph.edges:
        src, dst = of.get(e.src), of.get(e.dst)
        if src is not None and dst is not None:
            inner.add((src, dst))
        elif dst is not None and not e.tensors and recomputed_op(e.src) is None:
            control.setdefault(dst, set()).update(op_map.get(e.src, ()))
        elif src is not None and dst is None and recomputed_op(e.dst) is None:
            rewire.update((src, t) for t in op_map.get(e.dst, ()))
    return of, inner, rewire, control, tuple(left)


def recompute_graph(graph, pesto_graph: OpGraph, op_map: Mapping[str, tuple]) -> Recomputed:
    """The TF step ``graph`` with the recomputation of the plan's graph ``pesto_graph`` (module doc).

    Parameters
    ----------
    graph : tf.Graph
        The TF step that runs the plan (split or not), before the copies.
    pesto_graph : OpGraph
        The graph the plan places (its copies named by :func:`pesto.step.recompute`).
    op_map : mapping Pesto op -> tuple of TF ops
        Pesto's other ops mapped onto ``graph`` (:attr:`tf_patch.slicemap.SliceMap.ops`).

    Returns
    -------
    Recomputed
    """
    of, inner, rewire, control, left = _spec(pesto_graph, op_map)
    gd = graph.as_graph_def()
    nodes = {n.name: n for n in gd.node}
    copies = {t: RECOMPUTE + t for t in dict.fromkeys(of.values())}
    made = []
    for t, c in copies.items():
        node = type(nodes[t])()
        node.CopyFrom(nodes[t])
        node.name = c
        _redirect(node, {src for src, dst in inner if dst == t}, copies)
        node.input.extend(f"^{x}" for x in sorted(control.get(t, ())) if x in nodes)
        made.append(node)
    rewired = tuple(sorted((dst, copies[src]) for src, dst in rewire if dst in nodes))
    for dst in {d for d, _ in rewired}:
        _redirect(nodes[dst], {src for src, d in rewire if d == dst}, copies)
    new = _graph_of(list(gd.node) + made, gd.library, gd.versions)
    return Recomputed(new, MappingProxyType(copies), rewired, left)


def _redirect(node, producers: set, copies: Mapping[str, str]) -> None:
    """``node``'s data inputs from ``producers`` read their copies instead."""
    inputs = []
    for text in node.input:
        src, idx = _split_input(text)
        inputs.append(f"{copies[src]}:{idx}" if idx is not None and src in producers else text)
    del node.input[:]
    node.input.extend(inputs)


def carried_graph(tf_graph, fetches, before: OpGraph, copies: Mapping[str, str]) -> OpGraph:
    """The OpGraph of ``tf_graph`` (``before``'s step with ``copies``, TF op -> copy),
    each op costed and sized as in ``before``, each copy as its original.

    Raises
    ------
    CycleError
        The copies close a cycle (a trigger that waits for its own block's copies).
    """
    kind = "GPU" if "GPU" in before.kinds() else "CPU"
    src = {**{n: n for n in before.names}, **{c: t for t, c in copies.items() if t in before}}
    ops = {n: before.op(o) for n, o in src.items()}
    costs = {n: op.compute.get(kind, 0.0) for n, op in ops.items()}
    cpu = {n: op.compute.get("CPU", costs[n]) for n, op in ops.items()}
    memory = {n: {"output_bytes": op.output_bytes, "temporary_bytes": op.temporary_bytes,
                  "persistent_bytes": op.persistent_bytes} for n, op in ops.items()}
    return extract(tf_graph, fetches, costs=costs, cpu_costs=cpu, kind=kind, memory=memory, name=before.name,
                   on_unknown="ignore")


def with_copies(op_map, pesto_names, tf_names):
    """``op_map`` (a :class:`~tf_patch.slicemap.SliceMap` or
    :class:`~tf_patch.replicastep.ReplicaMap` made before the copies) with each
    Pesto copy among ``pesto_names`` mapped to the TF copy ``recompute/<t>`` of
    its original's one TF op ``t``, where ``tf_names`` (the TF step's ops) has it.

    >>> from tf_patch.slicemap import SliceMap
    >>> m = with_copies(SliceMap(1, {"a@r0": ("mb0/a",)}, (), ("a@rc@r0",)), ["a@r0", "a@rc@r0"],
    ...                 ["mb0/a", "recompute/mb0/a"])
    >>> dict(m.ops), m.unmapped_pesto
    ({'a@r0': ('mb0/a',), 'a@rc@r0': ('recompute/mb0/a',)}, ())
    """
    have, ops = set(tf_names), dict(op_map.ops)
    for name in pesto_names:
        ts = ops.get(recomputed_op(name), ()) if recomputed_op(name) is not None else ()
        if len(ts) == 1 and RECOMPUTE + ts[0] in have:
            ops[name] = (RECOMPUTE + ts[0],)
    return replace(op_map, ops=MappingProxyType(ops),
                   unmapped_pesto=tuple(n for n in op_map.unmapped_pesto if n not in ops))


def recompute_model(model, result, step: OpGraph, tf_step: OpGraph):
    """``(ZooModel with the copies, its OpGraph)``: a zoo model built as
    ``result`` runs (un-split, or split in ``result.micro_batches`` slices),
    with ``result``'s recomputation (:func:`recompute_graph`; the copies' ops
    mapped by :func:`tf_patch.slicemap.slice_map` from ``step``, the un-split
    step Pesto transformed, onto ``tf_step``, the OpGraph of ``model``). The
    OpGraph is ``tf_step`` with the copies, costed as their originals
    (:func:`carried_graph`): :func:`tf_patch.slicemap.place_split` places it,
    and ``PlacedRun`` takes the model with that plan. It trains as ``model``
    (same feed, same initial values).
    """
    result = result_view(result)
    if result.micro_batches > 1:
        op_map = slice_map(step, result.origin, tf_step, result.micro_batches).ops
    else:
        op_map = {n: (n,) for n in result.graph.names if n in tf_step}
    rc = recompute_graph(model.graph, result.graph, op_map)
    return _rebuilt(model, rc.graph), carried_graph(rc.graph, [model.train_op.name, model.loss.name], tf_step,
                                                    rc.copies)


def recompute_replicated(model, result, rmap):
    """``(ZooModel with the copies, its plan, the map)``: the replicated zoo
    model ``model`` and map ``rmap`` of :func:`tf_patch.replicate_model` with
    the replicated ``result``'s recomputation (:func:`recompute_graph`, the
    copies mapped by :func:`with_copies`, the plan by
    :func:`tf_patch.replicastep.mapped_plan`); ``PlacedRun`` takes the model with the plan."""
    result = result_view(result)
    rc = recompute_graph(model.graph, result.graph, rmap.ops)
    zoo = _rebuilt(model, rc.graph)
    tfg = extract(rc.graph, [zoo.loss.name, zoo.train_op.name], on_unknown="ignore")
    rmap = with_copies(rmap, result.graph.names, tfg.names)
    return zoo, mapped_plan(result.plan, rmap, tfg), rmap


def _rebuilt(model, g):
    """``model`` (a ZooModel) on ``g``, its graph rewritten: the same ops, feed and initial values, by name."""
    def feed_fn(i: int) -> dict:
        return {g.get_tensor_by_name(getattr(t, "name", t)): v for t, v in model.feed_fn(i).items()}

    init = None if model.init_op is None else g.get_operation_by_name(model.init_op.name)
    feed = None if not model.init_feed else {g.get_tensor_by_name(getattr(t, "name", t)): v
                                             for t, v in model.init_feed.items()}
    return ZooModel(g, g.get_operation_by_name(model.train_op.name), g.get_tensor_by_name(model.loss.name), feed_fn,
                    model.name, {**model.config, "recompute": True}, init, feed)
