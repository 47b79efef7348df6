"""The block x slice grid of a micro-batched step: the tasks the joint slice model schedules.

:func:`slice_grid` cuts the un-split step into ``B`` blocks
(:func:`solver.parallel.cut.blockings`, :func:`grid_blocks` of them) and
reads, from the split step (:func:`pesto.step.split`), per block
``b`` and slice ``s``:

* a forward task ``F[b, s]`` (the copies ``op@mb<s>`` of the block's forward
  ops), an input-gradient task ``B[b, s]`` (its anchored backward ops, and the
  accumulate ops ``t@acc<s>`` of the tensors its ops produce) and, with
  ``weight_tasks`` (the default) and ops of the block marked ``weight-grad``, a
  weight-gradient task ``W[b, s]`` (:func:`weight_ops`: those ops, when no
  other batched op reads them, and their accumulate ops), whose durations
  per device are the sums of the split graph's own op costs;
* an update task ``U[b]``: the once-per-step ops that run after some batched op
  (the optimizer's work), staged by :func:`~solver.parallel.pipelines.step_stages`;
  the other once-per-step ops (variables, their reads, constants) are free at
  time 0; their persistent bytes are the block's weights;
* precedences: the quotient of the split graph's batched -> batched edges on
  the (block, phase) nodes (phase ``F``, ``B`` or ``W``: a ``W`` node feeds no
  batched op, only its block's update), the same for every slice, with the bytes of one
  slice's tensors crossing (a tensor counted once per pair of nodes);
* activation bytes (rule): the bytes of a slice's forward tensors that some
  backward op of the block reads (wherever they were made), alive from the start of ``F[b, s]`` to the end
  of ``W[b, s]`` (of ``B[b, s]`` when the block has no ``W`` task), the
  slice model's in-flight count; and, for the device's memory, each tensor a
  block's backward reads (``holds``: activations and input gradients) from
  the end of the task that made it (its arrival) to the end of the last task
  reading it (what deferring a weight gradient costs);
* once-per-step traffic (``step_edges``): the bytes between a once-per-step op
  and a batched op of another block, once per step whatever the slices (a
  weight read by a block's copies on one device; a gradient summed into the
  update's block), the load the model puts on the links it would cross.

The block order is the one the caller names (the best pipeline's, so its
stages are points of the grid), unless merging cycles collapses it to fewer
than half the blocks asked for (an order by scope whose blocks feed each
other both ways): then the topological one.

A quotient with a cycle (odd anchoring) is made acyclic by merging the blocks
on the cycle; a cycle through the forward and input-gradient phases of one block cannot be, and the
grid is refused (:class:`GridError`) rather than built wrong.

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import gpus
>>> from pesto.step import split
>>> names, anchor = ["l0", "l1", "d1", "d0"], {"d1": "l1", "d0": "l0"}   # two layers, their gradients
>>> ops = [Op(n, {"GPU": 10.0}, output_bytes=8, batch=True, scope=n, anchor=anchor.get(n),
...           phase="input-grad" if n in anchor else "forward") for n in names]
>>> es = [Edge(a, b, f"{a}:0") for a, b in zip(names, names[1:])]
>>> grid = slice_grid(split(OpGraph(ops, es, [Tensor(f"{n}:0", n, 8) for n in names]), 2), gpus(2))
>>> grid.blocks, grid.dur[:, :, 0, 0].tolist()   # (block, F/B/W) of slice 0 on GPU 0: 10 µs / 2
(2, [[5.0, 5.0, 0.0], [5.0, 5.0, 0.0]])
>>> grid.edges   # F0 -> F1, F1 -> B1, B1 -> B0: 4 bytes a slice each
((0, 0, 1, 0, 4), (1, 0, 1, 1, 4), (1, 1, 0, 1, 4))
>>> grid.activation.tolist()   # l1's output, read by its gradient
[0.0, 4.0]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pesto.cluster import Cluster
from pesto.dag import CycleError, toposort
from pesto.errors import PestoError
from pesto.graph import OpGraph
from pesto.step import Transformed
from pesto.step.slicing import copy_name
from pesto.problem import Problem

from .cut import Blocking, Phases, blockings, phases
from .pipelines import step_stages

__all__ = ["SliceGrid", "GridError", "slice_grid", "grid_blocks", "weight_ops", "GRID_TASKS",
           "F", "B", "W", "U", "PHASES"]

#: Tasks the grid aims at (forward and backward, all slices): blocks = this / (2 M).
GRID_TASKS = 200
#: Task phases (the second index of a task key): forward, input gradient, weight gradient, update.
F, B, W, U = 0, 1, 2, 3
PHASES = "FBW"


class GridError(PestoError):
    """No block x slice grid for this step (no forward op, no allowed device,
    a cycle through one block's two phases); the message says which."""


@dataclass(frozen=True)
class SliceGrid:
    """The tasks, durations, precedences and bytes of the slice model.

    Attributes
    ----------
    split : Transformed
    phases : Phases
    blocking : Blocking
        Per op of ``split.source`` its block (-1 for unbatched ops), after merges.
    devices : tuple of str
        Candidate devices (the cluster's GPUs).
    allowed : tuple of tuple of int
        Per block, the indices into ``devices`` every op of it may run on.
    dur : ndarray (blocks, 3, M, devices)
        µs of task (block, phase ``F`` = 0 / ``B`` = 1 / ``W`` = 2, slice) on each
        device (0 for every ``W`` of a block without one).
    update : ndarray (blocks, devices)
        µs of ``U[b]``.
    edges : tuple of (int, int, int, int, int)
        ``(b_u, phase_u, b_v, phase_v, bytes)``: a quotient edge, per slice.
    activation : ndarray (blocks,)
        Bytes one slice keeps alive for the block from ``F`` start to the end
        of its last backward task (``W`` when the block has one, else ``B``).
    weight : ndarray (blocks,)
        Bytes the block's once-per-step ops hold all step: their persistent
        bytes (weights, optimizer state) and the tensors of theirs the
        slices read (a weight's read).
    step_block : tuple of int
        Per op of the source, the block of a once-per-step op.
    step_edges : tuple of (int, int, int)
        ``(b_u, b_v, bytes)``: once-per-step bytes from block ``b_u`` to ``b_v``.
    task_phase : tuple of int
        Per op of the source, the phase of the task holding its copies (-1 for
        once-per-step ops).
    has_w : tuple of bool
        Per block, whether it has ``W`` tasks (some op of it in :func:`weight_ops`).
    holds : tuple of (int, int, int, int, int)
        ``(b_u, p_u, b_v, p_v, bytes)``: one slice's tensors made by task
        ``(b_u, p_u)`` that the backward tasks of block ``b_v`` read, the last
        of them ``(b_v, p_v)``, held on ``b_v``'s device from the end of
        ``(b_u, p_u)`` (from its start within one block) to the end of
        ``(b_v, p_v)``: the activations (``p_u`` = ``F``) and the input
        gradients a block's ``B`` and ``W`` tasks wait with.
    output : ndarray (blocks, 3)
        Bytes of one slice's tensors made by task ``(block, phase)``: held
        while it runs (what a task adds to its device's memory at least).
    summed : ndarray (blocks,)
        Bytes of the block's gradients summed over the slices for the update
        (a running sum, whole size): held from its first slice's last
        backward task to the update's end.
    """

    split: Transformed
    phases: Phases
    blocking: Blocking
    devices: tuple
    allowed: tuple
    dur: np.ndarray
    update: np.ndarray
    edges: tuple
    activation: np.ndarray
    weight: np.ndarray
    step_block: tuple
    step_edges: tuple = ()
    task_phase: tuple = ()
    has_w: tuple = ()
    holds: tuple = ()
    output: np.ndarray | None = None
    summed: np.ndarray | None = None

    @property
    def blocks(self) -> int:
        return self.blocking.count

    def last(self, b: int) -> int:
        """The phase of block ``b``'s last slice task (``W`` or ``B``): where a slice's activations end."""
        return W if self.has_w and self.has_w[b] else B

    @property
    def micro_batches(self) -> int:
        return self.split.micro_batches


def grid_blocks(micro_batches: int, forward_ops: int, tasks: int = GRID_TASKS) -> int:
    """Blocks of the grid: ``clamp(round(tasks / (2 M)), 4, 32)``, at most the forward ops.

    >>> grid_blocks(2, 1000), grid_blocks(4, 1000), grid_blocks(16, 1000), grid_blocks(2, 3)
    (32, 25, 6, 3)
    """
    return max(1, min(forward_ops, max(4, min(32, round(tasks / (2 * micro_batches))))))


def weight_ops(graph: OpGraph, ph: Phases) -> frozenset:
    """The batched ops the grid runs as ``W`` tasks: backward ops marked
    ``weight-grad`` whose batched readers are all such ops too (a weight
    gradient another gradient reads stays in ``B``), so a ``W`` task feeds
    nothing but its block's update.

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"f": 1, "dx": 1, "dw": 1}, [("f", "dx"), ("f", "dw")])
    >>> marks = {"f": ("forward", None), "dx": ("input-grad", "f"), "dw": ("weight-grad", "f")}
    >>> g = OpGraph([replace(op, batch=True, phase=marks[op.name][0], anchor=marks[op.name][1])
    ...              for op in g.ops], g.edges, g.tensors)
    >>> sorted(weight_ops(g, phases(g)))
    [2]
    """
    succ, ops = graph.succ_idx(), graph.ops
    out: set[int] = set()
    for i in reversed(graph.topo_idx()):
        if i in ph.backward and ops[i].phase == "weight-grad" and all(
                j in out for j in succ[i] if ops[j].batch):
            out.add(i)
    return frozenset(out)


def slice_grid(split: Transformed, cluster: Cluster, *, loss: str | None = None,
               tasks: int = GRID_TASKS, blocking: str | None = None, weight_tasks: bool = True) -> SliceGrid:
    """The grid of ``split`` on ``cluster``'s GPUs (module doc).

    ``blocking``: the block order by name (:func:`solver.parallel.cut.blockings`,
    e.g. the one of the best pipeline, so that its stages are points of the
    grid: an RNN's topological order interleaves its layers); default or
    unknown: the topological one. ``weight_tasks``: weight gradients as ``W``
    tasks of their own (:func:`weight_ops`); False keeps them in ``B``.

    Raises
    ------
    GridError
        No forward op, a block no GPU may run, or a quotient cycle through one block.
    """
    g, m = split.source, split.micro_batches
    ph = phases(g, loss=loss)
    if not ph.forward:
        raise GridError(f"graph {g.name!r} has no batched forward op: no pipeline grid")
    wops = weight_ops(g, ph) if weight_tasks else frozenset()
    phase = tuple(-1 if not op.batch else W if i in wops else B if i in ph.backward else F
                  for i, op in enumerate(g.ops))
    want = grid_blocks(m, len(ph.forward), tasks)
    orders = blockings(g, ph, chunks=want, layers=0)
    links = _batched_links(split)
    bl = _acyclic(next((b for b in orders if b.name == blocking), orders[0]), phase, links, g.name)
    if bl.count < min(want, orders[0].count) / 2 and bl.name != orders[0].name:
        bl = _acyclic(orders[0], phase, links, g.name)   # the named order collapsed: the topological one
    devices = tuple(d.name for d in cluster.gpus) or tuple(cluster.names)
    prob = Problem.of(split.graph, cluster)
    dur = np.asarray(prob.dur, dtype=float)[:, [prob.dev_index[d] for d in devices]]
    step_block = step_stages(g, bl.block)
    after = _after_batched(g)
    read = _read_by_slices(g)
    tdur = np.zeros((bl.count, 3, m, len(devices)))
    update = np.zeros((bl.count, len(devices)))
    weight = np.zeros(bl.count)
    for k, name in enumerate(split.graph.names):
        o = split.origin[name]
        i = g.index[o.op]
        if o.role == "step":
            weight[step_block[i]] += g.ops[i].persistent_bytes + read[i]
            if after[i]:   # the optimizer's work; reads and constants are free at time 0
                update[step_block[i]] += dur[k]
        else:
            tdur[bl.block[i], phase[i], o.slice] += dur[k]
    allowed = tuple(tuple(d for d in range(len(devices)) if np.isfinite(tdur[b, :, :, d]).all()
                          and np.isfinite(update[b, d])) for b in range(bl.count))
    empty = [b for b, a in enumerate(allowed) if not a]
    if empty:
        raise GridError(f"block {empty[0]} of {g.name!r} has ops no GPU of the cluster may run")
    has_w = tuple(any(bl.block[i] == b for i in wops) for b in range(bl.count))
    return SliceGrid(split, ph, bl, devices, allowed, tdur, update, _quotient(bl, phase, links),
                     _activation(split, ph, bl), weight, tuple(step_block), _step_edges(g, bl, step_block),
                     phase, has_w, _holds(g, phase, bl, links), _output(split, phase, bl), _summed(split, bl))


def _step_edges(g: OpGraph, bl: Blocking, step_block) -> tuple:
    """``(b_u, b_v, bytes)`` between once-per-step ops and batched ops of other
    blocks (each tensor once per pair of blocks), summed per pair."""
    pairs: dict[tuple[int, int], dict[str, int]] = {}
    for name, src, nbytes, cons in g.tensor_table():
        bu = bl.block[src] if g.ops[src].batch else step_block[src]
        for j in cons:
            if g.ops[src].batch == g.ops[j].batch:
                continue   # batched -> batched: the quotient edges; step -> step: no block crossing modelled
            bv = bl.block[j] if g.ops[j].batch else step_block[j]
            if bu != bv and bu >= 0 and bv >= 0:
                pairs.setdefault((bu, bv), {})[name] = nbytes
    return tuple((bu, bv, int(sum(ts.values()))) for (bu, bv), ts in sorted(pairs.items()))


def _after_batched(g: OpGraph) -> list[bool]:
    """Per op: some batched op is among its ancestors."""
    out = [False] * g.num_ops
    pred = g.pred_idx()
    for i in g.topo_idx():
        out[i] = any(g.ops[p].batch or out[p] for p in pred[i])
    return out


def _batched_links(split: Transformed) -> list[tuple[int, int, str, int]]:
    """``(u, v, tensor, bytes of one slice's copy)`` per batched -> batched edge of the source."""
    g, sg = split.source, split.graph
    out = []
    for e in g.edges:
        u, v = g.index[e.src], g.index[e.dst]
        if not (g.ops[u].batch and g.ops[v].batch):
            continue
        for t in e.tensors or ("",):
            out.append((u, v, t, sg.tensor(copy_name(t, 0)).bytes if t else 0))
    return out


def _quotient(bl: Blocking, phase, links) -> tuple:
    """The quotient edges ``(b_u, p_u, b_v, p_v, bytes)`` on the ``(block, phase)``
    nodes (``phase``: per op, :data:`F`, :data:`B` or :data:`W`; a tensor
    counted once per node pair)."""
    pairs: dict[tuple[int, int], dict[str, int]] = {}
    for u, v, t, b in links:
        nu, nv = (bl.block[u], phase[u]), (bl.block[v], phase[v])
        if nu != nv:
            pairs.setdefault((nu, nv), {})[t] = b
    return tuple((nu[0], nu[1], nv[0], nv[1], int(sum(ts.values())))
                 for (nu, nv), ts in sorted(pairs.items()))


def _acyclic(bl: Blocking, phase, links, name: str) -> Blocking:
    """``bl`` with the blocks on each quotient cycle merged (module doc).

    Raises
    ------
    GridError
        A cycle through the forward and input-gradient phases of one block.
    """
    while True:
        succ = [[] for _ in range(3 * bl.count)]
        for bu, pu, bv, pv, _ in _quotient(bl, phase, links):
            succ[3 * bu + pu].append(3 * bv + pv)
        try:
            toposort(succ)
            return bl
        except CycleError as exc:
            cycle = exc.cycle
        merged = sorted({n // 3 for n in cycle})
        if len(merged) == 1:
            raise GridError(f"the forward and backward ops of block {merged[0]} of {name!r} "
                            f"({bl.name} blocking) depend on each other both ways: no slice grid")
        keep = {b: k for k, b in enumerate(b for b in range(bl.count) if b not in merged[1:])}
        block = tuple(-1 if b < 0 else keep[merged[0] if b in merged else b] for b in bl.block)
        bl = Blocking(bl.name, block, len(keep))


def _activation(split: Transformed, ph: Phases, bl: Blocking) -> np.ndarray:
    """Per block, the bytes of one slice's forward tensors its backward ops read
    (held where they are read: a layer's input, made by the block before, is
    kept by the block whose weight gradient reads it)."""
    g, sg = split.source, split.graph
    out = np.zeros(bl.count)
    for name, src, _, cons in g.tensor_table():
        if g.ops[src].batch and src not in ph.backward:
            for b in {bl.block[j] for j in cons if j in ph.backward}:
                out[b] += sg.tensor(copy_name(name, 0)).bytes
    return out


def _holds(g: OpGraph, phase, bl: Blocking, links) -> tuple:
    """``SliceGrid.holds``: per batched edge into a backward op, its tensor
    (one slice's bytes, once per pair of task and block) from its producer's
    task to the last backward task of the reader's block that reads it."""
    last: dict[tuple, int] = {}   # (producer task, tensor, reader block) -> latest reading phase
    size: dict[str, int] = {}
    for u, v, t, nbytes in links:
        if phase[v] in (B, W) and t:
            key = (bl.block[u], phase[u], t, bl.block[v])
            last[key] = max(last.get(key, B), phase[v])
            size[t] = nbytes
    out: dict[tuple, int] = {}
    for (bu, pu, t, bv), pv in last.items():
        out[bu, pu, bv, pv] = out.get((bu, pu, bv, pv), 0) + size[t]
    return tuple((*k, n) for k, n in sorted(out.items()) if n > 0)


def _output(split: Transformed, phase, bl: Blocking) -> np.ndarray:
    """Per ``(block, phase)``, the bytes of one slice's tensors its ops make
    (but those a backward task of the block reads: ``holds`` has them); a
    tensor summed over the slices for the step twice (the slice's and the
    new running sum its accumulate op makes)."""
    g, sg = split.source, split.graph
    out = np.zeros((bl.count, 3))
    for name, src, _, cons in g.tensor_table():
        if phase[src] >= 0 and not any(bl.block[j] == bl.block[src] and phase[j] in (B, W) for j in cons):
            twice = any(not g.ops[j].batch for j in cons)
            out[bl.block[src], phase[src]] += (1 + twice) * sg.tensor(copy_name(name, 0)).bytes
    return out


def _summed(split: Transformed, bl: Blocking) -> np.ndarray:
    """Per block, the bytes of its tensors a once-per-step op reads (summed over the slices)."""
    g, sg = split.source, split.graph
    out = np.zeros(bl.count)
    for name, src, _, cons in g.tensor_table():
        if g.ops[src].batch and any(not g.ops[j].batch for j in cons):
            out[bl.block[src]] += sg.tensor(copy_name(name, 0)).bytes
    return out


def _read_by_slices(g: OpGraph) -> list[int]:
    """Per once-per-step op, the bytes of its tensors some batched op reads (0 for batched ops)."""
    out = [0] * g.num_ops
    for _, src, nbytes, cons in g.tensor_table():
        if not g.ops[src].batch and any(g.ops[j].batch for j in cons):
            out[src] += nbytes
    return out
