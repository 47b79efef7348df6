"""The one stage cutter: contiguous pipeline stages over a block order.

A step's batched ops are split into forward and backward (:func:`phases`),
grouped into blocks in a pipeline order (:func:`blockings`: forward blocks in
order, each backward op with the block it differentiates), and the blocks
cut into ``k`` contiguous stages by one dynamic programme
(:func:`split_stages`: the least largest stage, or the least step estimate
:func:`step_estimate` for ``M`` slices; optionally under a memory capacity
per stage, :func:`block_memory`). GPipe, 1F1B, the hybrids, the slice
model's hints and :func:`solver.practitioners.pipeline_cuts` all cut here.

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
topological position, ops in topological order within a group). Each layer
order is also cut at layer granularity (``"layers:d"``): one block per scope
group, so a stage boundary never falls inside a layer; with more than
``LAYERS`` groups, consecutive groups are merged into ``LAYERS`` blocks of
about equal work (the cut programme is quadratic in the blocks).
**Cuts.** A dynamic programme cuts the blocks into ``k`` contiguous stages.
A stage's cost is its work per slice plus the transfer time of the slice's
activations and gradients crossing its two cuts, each cut priced on the
route between the devices of the two stages it separates (one route per
boundary: on a cluster of hosts a boundary inside a host is cheaper than
one between hosts); the programme minimises the step estimate of ``M``
slices, the sum of the stage costs (fill and drain) plus ``M - 1`` times
the largest, exactly over the block boundaries. The realisers simulate
the cuts of least estimate and, as more candidates, the least-largest-stage
cuts on the mean route (:func:`solver.parallel.pipelines.pipeline_plan`):
the estimate runs a slice's stages one after another, and a recurrent
step's layers overlap as a wavefront. A stage is infeasible when its weights and
optimizer state plus the activations of the slices the schedule holds at
once there (1F1B: ``k - s`` on stage ``s``; GPipe: ``M``) exceed the least
GPU memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from pesto.dag import priority_order
from pesto.errors import CycleError
from pesto.graph import OpGraph
from pesto.step.marks import backward_ops

from .schedules import actions

__all__ = ["split_stages", "largest_stage", "step_estimate", "cut_costs", "Phases", "Blocking", "phases", "blockings",
           "block_memory", "block_orders", "in_flight", "least_largest", "CHUNKS", "LAYERS"]

CHUNKS = 64      # blocks per candidate order (equal work); the cut DP is quadratic in them
LAYERS = 256     # most blocks of a layer blocking (whole scope groups; more groups are merged)


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


def blockings(graph: OpGraph, ph: Phases, *, chunks: int = CHUNKS, layers: int = LAYERS) -> list[Blocking]:
    """The candidate block orders of the module doc: forward ops in topological
    order, or layer by layer (scope cut at each depth), cut into ``chunks``
    pieces of equal work (forward ops and their anchored backward ops); then,
    unless ``layers`` is 0, per scope depth the blocks cut only between
    layers (``"layers:d"``): one block per scope group, or, with more groups
    than ``layers``, consecutive groups merged into ``layers`` blocks of
    about equal work.

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a/x": 1, "b/x": 1, "a/y": 1, "b/y": 1},
    ...                        [("a/x", "b/x"), ("b/x", "a/y"), ("a/y", "b/y")])
    >>> g = OpGraph([replace(op, batch=True, scope=op.name[0]) for op in g.ops], g.edges, g.tensors)
    >>> [(b.name, b.block) for b in blockings(g, phases(g, loss="b/y"), chunks=2)]
    [('topological', (0, 0, 1, 1)), ('scope:1', (0, 1, 0, 1))]
    >>> # one chunk: the layer blocking keeps a block per group
    >>> [(b.name, b.block) for b in blockings(g, phases(g, loss="b/y"), chunks=1)]
    [('topological', (0, 0, 0, 0)), ('scope:1', (0, 0, 0, 0)), ('layers:1', (0, 1, 0, 1))]
    """
    fwd = list(ph.forward)
    if not fwd:
        return []
    ops = graph.ops
    work = np.zeros(graph.num_ops)
    for i in fwd:
        work[i] += min(ops[i].compute.values())
    for b, a in ph.anchor.items():
        work[a] += min(ops[b].compute.values())
    found = block_orders(graph, ph)
    out, seen = [], set()
    for name, order, _ in found:
        if tuple(order) in seen:
            continue
        seen.add(tuple(order))
        cum = np.cumsum(work[order])
        n = min(chunks, len(order))
        chunk = np.minimum((cum - 1e-9) * n // max(cum[-1], 1e-9), n - 1).astype(int)
        out.append(_blocking(graph, ph, name, {i: int(c) for i, c in zip(order, chunk)}))
    for name, order, group in found if layers > 0 else ():
        if group is None:
            continue
        blocks = _layer_blocks(work[order], np.asarray(group), layers)
        bl = _blocking(graph, ph, name.replace("scope", "layers"), {i: int(c) for i, c in zip(order, blocks)})
        if bl.block not in {b.block for b in out}:
            out.append(bl)
    return out


def block_orders(graph: OpGraph, ph: Phases) -> list[tuple[str, list[int], list[int] | None]]:
    """The candidate pipeline orders of the forward ops (module doc), each
    ``(name, order, group)``: ``"topological"`` (``group`` None), and per
    scope depth ``d`` with two groups or more ``"scope:d"``, ``group`` the
    rank of each op's scope group (nondecreasing along ``order``; a depth
    that groups as the one before it is left out).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"a/x": 1, "b/x": 1, "a/y": 1}, [("a/x", "b/x"), ("b/x", "a/y")])
    >>> g = OpGraph([replace(op, batch=True, scope=op.name[0]) for op in g.ops], g.edges, g.tensors)
    >>> block_orders(g, phases(g, loss="a/y"))
    [('topological', [0, 1, 2], None), ('scope:1', [0, 2, 1], [0, 0, 1])]
    """
    fwd = list(ph.forward)
    pos = {i: k for k, i in enumerate(graph.topo_idx())}
    out: list[tuple[str, list[int], list[int] | None]] = [("topological", fwd, None)]
    for depth in range(1, 9):
        keys = {i: "/".join(_scope_parts(graph, i)[:depth]) for i in fwd}
        first: dict[str, list[int]] = {}
        for i in fwd:
            first.setdefault(keys[i], []).append(pos[i])
        if len(first) < 2:
            continue
        rank = _grouprank(graph, keys, {k: float(np.mean(v)) for k, v in first.items()})
        order = sorted(fwd, key=lambda i: (rank[keys[i]], pos[i]))
        group = [rank[keys[i]] for i in order]
        if (order, group) != out[-1][1:]:   # a deeper cut that groups as the last one: the same order
            out.append((f"scope:{depth}", order, group))
    return out


def _layer_blocks(work: np.ndarray, group: np.ndarray, most: int) -> np.ndarray:
    """Per op (in order, ``group`` nondecreasing) its block: its group, or with
    more than ``most`` groups, ``most`` blocks of about equal work cut only
    between groups (a group goes to the block its cumulative work ends in).

    >>> _layer_blocks(np.array([1., 1, 1, 1]), np.array([0, 0, 1, 2]), 2).tolist()   # groups of work 2, 1, 1
    [0, 0, 1, 1]
    """
    if len(np.unique(group)) <= most:
        return group
    cum = np.cumsum(work)
    end = {g: cum[k] for k, g in enumerate(group)}   # the last op's cumulative work per group
    return np.array([min(int((end[g] - 1e-9) * most // max(cum[-1], 1e-9)), most - 1) for g in group])


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


def split_stages(work, comm: Sequence[float], k: int, *, slices: int | None = None,
                 memory=None, capacity: float = np.inf) -> tuple[int, ...]:
    """First block of each of ``k`` contiguous non-empty stages (stage 0 starts at 0).

    A stage of blocks ``i..j-1`` costs ``sum(work[i:j]) + comm[i] + comm[j]``
    (``comm[c]``: cost of cutting before block ``c``; ``comm[0]`` and
    ``comm[n]`` are not read). ``work`` is one vector, or one per stage
    (``work[s][b]``: devices of different speeds); ``comm`` is one vector,
    or one per boundary (``comm[s][c]``: the cost of cutting before block
    ``c`` between stages ``s`` and ``s + 1``, priced on the route between
    their devices: stage ``s`` of blocks ``i..j-1`` costs
    ``comm[s-1][i] + comm[s][j]`` there). Without ``slices`` the
    split minimises the largest stage cost (:func:`largest_stage`); with
    ``slices = M`` it minimises :func:`step_estimate` exactly: the least
    largest cost ``B*`` first, then over the candidate largest costs ``B``
    (the stage costs from ``B*`` up) the least sum of stage costs with none
    above ``B``, ranges of candidates that cannot beat the best found
    dropped (:func:`_least_step`).

    ``memory``: bytes per block, one vector or one per stage
    (``memory[s][b]``, e.g. the weights plus the activations of the slices
    stage ``s`` holds at once); a stage whose blocks' bytes exceed
    ``capacity`` is infeasible. When no split fits, the split without
    ``memory`` is returned (the caller's simulation reports that it does
    not fit). A dynamic programme over (stages, last block), ``O(k n^2)``
    per bound.

    >>> split_stages([4, 1, 1, 4], [0, 0, 0, 0], 2), split_stages([1, 1, 1, 1], [0, 0, 9, 0], 2)
    ((0, 2), (0, 1))
    >>> split_stages([1, 1, 1, 1], [0, 0, 0, 0], 2, memory=[4, 3, 1, 1], capacity=5)   # 4 + 3 does not fit
    (0, 1)
    >>> w, c = [2, 1, 1, 2], [0, 0, 0.5, 0]   # the cut in the middle costs 0.5 on both sides
    >>> # M = 2: 6 + 1 * 4 < 7 + 1 * 3.5; M = 8: 7 + 7 * 3.5 < 6 + 7 * 4
    >>> split_stages(w, c, 2, slices=2), split_stages(w, c, 2, slices=8)
    ((0, 1), (0, 2))
    >>> # per boundary: cutting before block 1 is dear between stages 0 and 1 only
    >>> split_stages([1, 1, 1, 1], [[0, 9, 0, 0, 0], [0, 0, 0, 0, 0]], 3)
    (0, 2, 3)
    >>> split_stages([1, 1, 1, 1], [[0, 0, 0, 0, 0], [0, 9, 0, 0, 0]], 3)
    (0, 1, 2)
    """
    n = np.shape(work)[-1]
    k = max(1, min(k, n))
    if k <= 1 or n <= 1:
        return (0,)
    seg = _stage_costs(work, comm, k, memory, capacity)
    values, starts = least_largest(seg, k, n)
    least = values[-1]
    if not np.isfinite(least):
        return split_stages(work, comm, k, slices=slices) if memory is not None else starts
    if not slices:
        return starts
    (floor, free), = _least_sum(seg, k, n, np.array([np.inf]))
    if slices <= 1:
        return free
    return _least_step(seg, k, n, slices, floor, least, starts)


def _least_step(seg, k: int, n: int, slices: int, floor: float, least: float, starts) -> tuple[int, ...]:
    """The split of least step estimate: over the candidate largest costs
    ``B`` (sorted), the least sum ``S(B)`` with none above ``B``; ``S`` does
    not increase with ``B``, so on candidates ``a < B < b`` the estimate is
    at least ``S(b) + (slices - 1) a``: ranges that cannot beat the best
    found are dropped, the others sampled at :data:`_BATCH` points per pass."""
    tried = np.unique(np.concatenate([c[np.isfinite(c) & (c >= least)] for c in map(seg, range(k))]))
    best = (_step_value(seg, starts, n, slices), starts)
    known: dict[int, float] = {}   # candidate index -> S(B)
    todo = [(0, len(tried) - 1)]
    while todo:
        lo, hi = todo.pop()
        if floor + (slices - 1) * tried[lo] >= best[0]:
            continue
        at = np.unique(np.linspace(lo, hi, min(_BATCH, hi - lo + 1)).round().astype(int))
        for i, (total, got) in zip(at, _least_sum(seg, k, n, tried[at])):
            known[int(i)] = total
            value = _step_value(seg, got, n, slices) if np.isfinite(total) else np.inf
            if value < best[0]:
                best = (value, got)
        for a, b in zip(at, at[1:]):
            if b - a > 1 and known[int(b)] + (slices - 1) * tried[a + 1] < best[0]:
                todo.append((int(a) + 1, int(b) - 1))
    return best[1]


_BATCH = 32   # candidate bounds per pass of the least-sum programme


def _stage_costs(work, comm, k: int, memory, capacity: float):
    """``seg(s)``: the ``(n + 1, n + 1)`` costs of blocks ``i..j-1`` as stage
    ``s`` (``inf``: empty, or over ``capacity``)."""
    n = np.shape(work)[-1]
    w = _rows(work, k, n)
    pre = np.concatenate([np.zeros((k, 1)), np.cumsum(w, axis=1)], axis=1)
    into, out = _cuts(comm, k, n)
    empty = np.tril(np.ones((n + 1, n + 1), bool))
    held = None
    if memory is not None:
        held = np.concatenate([np.zeros((k, 1)), np.cumsum(_rows(memory, k, n), axis=1)], axis=1)

    def seg(s: int) -> np.ndarray:
        c = pre[s][None, :] - pre[s][:, None] + into[s][:, None] + out[s][None, :]
        over = empty if held is None else empty | (held[s][None, :] - held[s][:, None] > capacity)
        return np.where(over, np.inf, c)
    return seg


def _cuts(comm, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per stage ``s`` of ``k``, the ``n + 1`` costs of its first cut (before
    block ``i``, ``comm``'s row of boundary ``s - 1``) and of its last (before
    block ``j``, boundary ``s``'s row); none before block 0 nor after block
    ``n - 1``. ``comm``: one vector, or one per boundary (:func:`split_stages`)."""
    a = np.atleast_2d(np.asarray(comm, float))
    c = np.zeros((len(a), n + 1))
    c[:, 1:n] = a[:, 1:n]
    rows = np.broadcast_to(c, (max(k - 1, 1), n + 1)) if len(c) == 1 else c[:max(k - 1, 1)]
    zero = np.zeros((1, n + 1))
    return np.concatenate([zero, rows[:k - 1]]), np.concatenate([rows[:k - 1], zero])


def _rows(x, k: int, n: int) -> np.ndarray:
    """``x`` (one vector, or one per stage) as ``k`` rows of ``n``."""
    a = np.asarray(x, float).reshape(-1, n)
    return np.broadcast_to(a, (k, n)) if len(a) == 1 else a[:k]


def least_largest(seg, k: int, n: int) -> tuple[list[float], tuple[int, ...]]:
    """The least largest stage cost of ``n`` blocks cut into ``s`` contiguous
    stages for each ``s`` from 1 to ``k``, and the split into ``k`` stages
    (ties: earliest cuts); ``seg(s)``: the ``(n + 1, n + 1)`` costs of blocks
    ``i..j-1`` as stage ``s`` (``inf``: not allowed).

    >>> least_largest(lambda s: np.array([[np.inf, 1, 3], [np.inf, np.inf, 2], [np.inf] * 3]), 2, 2)
    ([3.0, 2.0], (0, 1))
    """
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    args, values = [], []
    for s in range(k):
        tot = np.maximum(f[:, None], seg(s))
        a = np.argmin(tot, axis=0)
        f = tot[a, np.arange(n + 1)]
        args.append(a)
        values.append(float(f[n]))
    return values, _back(args, n)


def _least_sum(seg, k: int, n: int, bounds: np.ndarray) -> list[tuple[float, tuple[int, ...]]]:
    """Per bound ``B``: the least sum of stage costs over ``k`` stages none above ``B``, and its split."""
    f = np.full((n + 1, len(bounds)), np.inf)
    f[0] = 0.0
    args = []
    for s in range(k):
        c = seg(s)[:, :, None]
        tot = np.where(c <= bounds[None, None, :], f[:, None, :] + c, np.inf)
        a = np.argmin(tot, axis=0)
        f = np.take_along_axis(tot, a[None], axis=0)[0]
        args.append(a)
    return [(float(f[n, b]), _back([a[:, b] for a in args], n)) for b in range(len(bounds))]


def _back(args, n: int) -> tuple[int, ...]:
    starts, j = [], n
    for a in reversed(args):
        j = int(a[j])
        starts.append(j)
    return tuple(starts[::-1])


def _step_value(seg, starts, n: int, slices: int) -> float:
    costs = [seg(s)[i, j] for s, (i, j) in enumerate(zip(starts, list(starts[1:]) + [n]))]
    return float(np.sum(costs) + (slices - 1) * np.max(costs))


def largest_stage(work, comm, starts) -> float:
    """:func:`split_stages`' objective without ``slices`` for the stages beginning at ``starts``."""
    return max(_costs(work, comm, starts))


def step_estimate(work, comm, starts, slices: int) -> float:
    """A pipeline's step estimate for the stages beginning at ``starts`` and
    ``slices`` slices: the sum of the stage costs (one slice through every
    stage) plus ``slices - 1`` times the largest.

    >>> step_estimate([1, 2, 1], [0, 0, 0], (0, 1, 2), 4)   # 4 + 3 * 2
    10.0
    """
    costs = _costs(work, comm, starts)
    return float(sum(costs) + (slices - 1) * max(costs))


def _costs(work, comm, starts) -> list[float]:
    n = len(work)
    ends = list(starts[1:]) + [n]
    into, out = _cuts(comm, len(starts), n)
    return [float(np.sum(work[i:j]) + into[s][i] + out[s][j]) for s, (i, j) in enumerate(zip(starts, ends))]


def _block_costs(graph: OpGraph, bl: Blocking, m: int, beta) -> tuple[np.ndarray, np.ndarray]:
    """Per block its work per slice; per cut position the transfer time of a
    slice across it (:func:`cut_costs` of the bytes crossing it)."""
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
    return work, cut_costs(nbytes, beta)


def cut_costs(nbytes, beta) -> np.ndarray:
    """The transfer time of ``nbytes`` (per cut position) on route ``beta =
    (beta0, beta1)``: one vector; or, ``beta`` one route per boundary
    (``beta[s]``: between stage ``s``'s device and stage ``s + 1``'s), one
    row per boundary, :func:`split_stages`' ``comm``. No bytes, no cost.

    >>> cut_costs([0, 10, 0], (1.0, 0.5)).tolist(), cut_costs([0, 10, 0], [(1.0, 0.5), (0.0, 0.0)]).tolist()
    ([0.0, 6.0, 0.0], [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0]])
    """
    nb = np.asarray(nbytes, float)[None, :]
    b = np.asarray(beta, float).reshape(-1, 2)
    comm = np.where(nb > 0, b[:, :1] + b[:, 1:] * nb, 0.0)
    return comm[0] if np.ndim(beta) == 1 else comm


def block_memory(graph: OpGraph, ph: Phases, bl: Blocking, m: int,
                 step_block: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per block: the bytes it holds all step (persistent bytes of the ops
    staged with it -- weights, optimizer state --, a once-per-step op with
    block ``step_block[i]``: :func:`solver.parallel.pipelines.step_stages`
    of the blocks), and the bytes one slice's activations hold from its
    forward to its backward pass (its forward ops' outputs read by backward
    ops, over ``m``). A stage holding ``a`` slices at once needs about
    ``sum(static) + a * sum(activation)`` over its blocks.

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"w": 0, "f": 1, "df": 1}, [("w", "f", 8), ("f", "df", 8)])
    >>> g = OpGraph([replace(op, batch=op.name != "w", persistent_bytes=100 if op.name == "w" else 0,
    ...                      phase="input-grad" if op.name == "df" else None, anchor="f" if op.name == "df" else None)
    ...              for op in g.ops], g.edges, g.tensors)
    >>> ph = phases(g)
    >>> bl = blockings(g, ph)[0]
    >>> block_memory(g, ph, bl, 2, [0, 0, 0])   # f's output, 8 bytes, in 2 slices
    (array([100.]), array([4.]))
    """
    static, act = np.zeros(bl.count), np.zeros(bl.count)
    for i, op in enumerate(graph.ops):
        b = bl.block[i] if bl.block[i] >= 0 else step_block[i]
        if 0 <= b < bl.count:
            static[b] += op.persistent_bytes
    for _, src, nbytes, cons in graph.tensor_table():
        if bl.block[src] >= 0 and src not in ph.backward and any(j in ph.backward for j in cons):
            act[bl.block[src]] += nbytes / m
    return static, act


def in_flight(schedule: str, stage: int, stages: int, m: int) -> int:
    """The most slices ``stage`` holds activations of at once under
    ``schedule``: the peak of forward tasks run less backward tasks run.

    >>> [in_flight("1f1b", s, 4, 8) for s in range(4)], in_flight("gpipe", 3, 4, 8)
    ([4, 3, 2, 1], 8)
    """
    held = peak = 0
    for a in actions(schedule, stage, stages, m):
        held += (a.kind == "F") - (a.kind == "B")
        peak = max(peak, held)
    return peak
