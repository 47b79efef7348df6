"""The one stage cutter: contiguous pipeline stages over a block order.

A step's blocks (:class:`Blocking`, forward
blocks in order, each backward op with the block it differentiates) are cut
into ``k`` contiguous stages minimising the largest stage's work plus the
activations crossing its two cuts (:func:`split_stages`, the one partition
DP of :func:`solver.baselines.pipeline_cuts`); :func:`largest_stage` is that
objective. GPipe, 1F1B, the hybrids and the slice model's hints all cut here.

Stages (documented rule)
------------------------
**Forward and backward.** Among batched ops, the backward pass is
:func:`pesto.step.marks.backward_ops` (the ops marked with a backward
:attr:`~pesto.graph.Op.phase`, or the ops after ``loss=``). Every backward op
is *anchored* to a forward op: its :attr:`~pesto.graph.Op.anchor` mark (the
forward op it differentiates, set by the front end: for TensorFlow, the op its
gradient scope mirrors, :mod:`tf_patch.marks`) when that is a batched forward
op; else the latest anchor of the backward ops it
feeds (a sum of gradient contributions, TensorFlow's top-level
``AddN_k`` of the gradient scope, belongs with the gradients of the tensor it sums for:
anchored by what it reads, an RNN's sum for layer 0 at time 0 went with layer 1
and made the blocks of one layer feed each other both ways); else the latest
forward op it reads; else the earliest anchor of the backward ops it reads;
else the last forward op.
**Blocks.** Forward ops are put in a pipeline order, then cut into ``CHUNKS``
blocks of equal work (a block's work is its forward ops' and their anchored
backward ops'), the unit a stage holds whole. The candidate orders: the
topological order, and layer by layer for every scope depth ``d`` (ops
grouped by their scope cut at depth ``d`` -- ``rnn/layer_0``, ``layer_3``,
``resnet50_1/conv2_block1_...`` -- groups in the order of their ops' mean
topological position, ops in topological order within a group). **Cuts.** A dynamic programme cuts the blocks into ``k`` contiguous stages
minimising the largest stage cost: its work per slice plus the transfer time
(the cluster's mean GPU route) of the slice's activations and gradients
crossing its two cuts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from pesto.dag import priority_order
from pesto.errors import CycleError
from pesto.graph import OpGraph
from pesto.step.marks import backward_ops

from ..baselines import pipeline_cuts

__all__ = ["split_stages", "largest_stage", "Phases", "Blocking", "phases", "blockings", "CHUNKS"]

CHUNKS = 64      # blocks per candidate order (equal work); the cut DP is quadratic in them


@dataclass(frozen=True)
class Phases:
    """Forward and backward batched ops of a step (:func:`phases`).

    Attributes
    ----------
    forward : tuple of int
        Batched forward ops (indices of the step), in topological order.
    backward : frozenset of int
        Batched backward ops.
    anchor : mapping int -> int
        Backward op -> the forward op it is staged with (the module doc's rule).
    """

    forward: tuple
    backward: frozenset
    anchor: Mapping[int, int]


@dataclass(frozen=True)
class Blocking:
    """Batched ops grouped into blocks a stage holds whole, in pipeline order.

    Attributes
    ----------
    name : str
    block : tuple of int
        Per op of the step, its block (-1 for unbatched ops).
    count : int
    """

    name: str
    block: tuple
    count: int


def phases(graph: OpGraph, *, loss: str | None = None) -> Phases:
    """Forward / backward batched ops and every backward op's anchor (module doc).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a": 1, "b": 1, "db": 1, "da": 1}, [("a", "b"), ("b", "db"), ("db", "da")])
    >>> marks = {"a": ("forward", None), "b": ("forward", None), "db": ("input-grad", "b"), "da": ("input-grad", "a")}
    >>> g = OpGraph([replace(op, batch=True, phase=marks[op.name][0], anchor=marks[op.name][1]) for op in g.ops],
    ...             g.edges, g.tensors)
    >>> p = phases(g)
    >>> p.forward, sorted(p.backward), dict(p.anchor)   # each gradient staged with the op it differentiates
    ((0, 1), [2, 3], {2: 1, 3: 0})
    """
    back = backward_ops(graph, loss=loss)
    idx, ops = graph.index, graph.ops
    topo = graph.topo_idx()
    forward = tuple(i for i in topo if ops[i].batch and graph.names[i] not in back)
    backward = frozenset(i for i in topo if ops[i].batch and graph.names[i] in back)
    pos = {i: k for k, i in enumerate(topo)}
    fwd = set(forward)
    anchor: dict[int, int] = {}
    pred, succ = graph.pred_idx(), graph.succ_idx()
    for i in topo:   # the front end's anchor mark, when it is a batched forward op
        a = idx.get(ops[i].anchor) if i in backward and ops[i].anchor is not None else None
        if a is not None and a in fwd:
            anchor[i] = a
    for i in reversed(topo):   # a gradient sum: with the gradients it feeds (its tensor's producer's)
        feeds = [anchor[j] for j in succ[i] if j in anchor]
        if i in backward and i not in anchor and feeds:
            anchor[i] = max(feeds, key=pos.get)
    for i in topo:
        if i in backward and i not in anchor:
            reads = [p for p in pred[i] if p in fwd]
            later = [anchor[p] for p in pred[i] if p in anchor]
            anchor[i] = (max(reads, key=pos.get) if reads else min(later, key=pos.get) if later
                         else forward[-1] if forward else i)
    return Phases(forward, backward, anchor)


def blockings(graph: OpGraph, ph: Phases, *, chunks: int = CHUNKS) -> list[Blocking]:
    """The candidate block orders of the module doc: forward ops in topological
    order, or layer by layer (scope cut at each depth), cut into ``chunks``
    pieces of equal work (forward ops and their anchored backward ops).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a/x": 1, "b/x": 1, "a/y": 1, "b/y": 1},
    ...                        [("a/x", "b/x"), ("b/x", "a/y"), ("a/y", "b/y")])
    >>> g = OpGraph([replace(op, batch=True, scope=op.name[0]) for op in g.ops], g.edges, g.tensors)
    >>> [(b.name, b.block) for b in blockings(g, phases(g, loss="b/y"), chunks=2)]
    [('topological', (0, 0, 1, 1)), ('scope:1', (0, 1, 0, 1))]
    """
    fwd = list(ph.forward)
    if not fwd:
        return []
    ops = graph.ops
    pos = {i: k for k, i in enumerate(graph.topo_idx())}
    work = np.zeros(graph.num_ops)
    for i in fwd:
        work[i] += min(ops[i].compute.values())
    for b, a in ph.anchor.items():
        work[a] += min(ops[b].compute.values())
    candidates = [("topological", fwd)]
    for depth in range(1, 9):
        keys = {i: "/".join(_scope_parts(graph, i)[:depth]) for i in fwd}
        first: dict[str, list[int]] = {}
        for i in fwd:
            first.setdefault(keys[i], []).append(pos[i])
        if len(first) < 2:
            continue
        rank = _grouprank(graph, keys, {k: float(np.mean(v)) for k, v in first.items()})
        order = sorted(fwd, key=lambda i: (rank[keys[i]], pos[i]))
        candidates.append((f"scope:{depth}", order))
    out, seen = [], set()
    for name, order, *_ in candidates:
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        cum = np.cumsum(work[order])
        n = min(chunks, len(order))
        chunk = np.minimum((cum - 1e-9) * n // max(cum[-1], 1e-9), n - 1).astype(int)
        out.append(_blocking(graph, ph, name, {i: int(c) for i, c in zip(order, chunk)}))
    return out


def _grouprank(graph: OpGraph, keys: Mapping[int, str], mean: Mapping[str, float]) -> dict[str, int]:
    """Scope groups in a topological order of the edges between them (forward
    ops' edges), the group of least mean position first among those ready;
    by mean position alone when those edges form a cycle. An order by mean
    position alone can put a group before one it reads (an RNN's decoder
    layer before the last encoder layer), and blocks cut from it then feed
    each other both ways.

    >>> g = OpGraph.from_edges({"e/a": 1, "e/b": 1, "d/a": 1}, [("e/a", "e/b"), ("e/b", "d/a")])
    >>> _grouprank(g, {0: "e", 1: "e", 2: "d"}, {"e": 5.0, "d": 1.0})   # d reads e: after it
    {'e': 0, 'd': 1}
    """
    succ: dict[str, set] = {k: set() for k in mean}
    for i, k in keys.items():
        for j in graph.succ_idx()[i]:
            if j in keys and keys[j] != k:
                succ[k].add(keys[j])
    names = sorted(mean)
    at = {k: i for i, k in enumerate(names)}
    after = [sorted(at[v] for v in succ[k]) for k in names]
    before: list[list[int]] = [[] for _ in names]
    for i, vs in enumerate(after):
        for j in vs:
            before[j].append(i)
    try:
        order = [names[i] for i in priority_order(after, before, [mean[k] for k in names])]
    except CycleError:   # a cycle between groups: mean position
        order = sorted(mean, key=lambda k: (mean[k], k))
    return {k: r for r, k in enumerate(order)}


def _scope_parts(graph: OpGraph, i: int) -> list[str]:
    op = graph.ops[i]
    return op.scope.split("/") if op.scope else op.name.split("/")[:-1] or [op.name]


def _blocking(graph: OpGraph, ph: Phases, name: str, fwd_block: Mapping[int, int]) -> Blocking:
    used = sorted(set(fwd_block.values()))
    dense = {b: k for k, b in enumerate(used)}
    block = [-1] * graph.num_ops
    for i, b in fwd_block.items():
        block[i] = dense[b]
    for i, a in ph.anchor.items():
        block[i] = block[a] if block[a] >= 0 else len(used) - 1   # no forward op at all: the last block
    return Blocking(name, tuple(block), len(used))


def split_stages(work: Sequence[float], comm: Sequence[float], k: int) -> tuple[int, ...]:
    """First block of each of ``k`` contiguous stages (stage 0 starts at 0)
    minimising the largest ``sum(work[i:j]) + comm[i] + comm[j]`` (``comm[c]``:
    cost of cutting before block ``c``; none at 0 and at the end).

    >>> split_stages([4, 1, 1, 4], [0, 0, 0, 0], 2), split_stages([1, 1, 1, 1], [0, 0, 9, 0], 2)
    ((0, 2), (0, 1))
    """
    n = len(work)
    return tuple(pipeline_cuts(list(work), list(comm)[1:n], max(1, min(k, n))))  # the one partition DP


def largest_stage(work, comm, starts) -> float:
    """:func:`split_stages`' objective for the stages beginning at ``starts``."""
    n = len(work)
    ends = list(starts[1:]) + [n]
    return max(float(np.sum(work[i:j])) + (comm[i] if i else 0.0) + (comm[j] if j < n else 0.0)
               for i, j in zip(starts, ends))


def _block_costs(graph: OpGraph, bl: Blocking, m: int, beta) -> tuple[np.ndarray, np.ndarray]:
    """Per block its work per slice; per cut position the transfer time of a slice across it."""
    work = np.zeros(bl.count)
    for i, op in enumerate(graph.ops):
        if bl.block[i] >= 0:
            work[bl.block[i]] += min(op.compute.values()) / m
    nbytes = np.zeros(bl.count + 1)
    for name, src, b, cons in graph.tensor_table():
        bu = bl.block[src]
        for bv in {bl.block[j] for j in cons} - {bu, -1}:
            if bu >= 0:
                nbytes[min(bu, bv) + 1: max(bu, bv) + 1] += b / m
    comm = np.where(nbytes > 0, beta[0] + beta[1] * nbytes, 0.0)
    return work, comm
