"""Per-block recomputation: each layer block's level (none, cheap ops, every op) after a plan fits.

Recomputing every layer block (:func:`pesto.step.recompute`, every op or
each block's cheap ops, :func:`pesto.step.recompute.cheap_ops`) makes a
plan fit, but a GPU with room needs less of it. :func:`next_levels` reads
a realised plan of the step with each block at a level
(:meth:`~solver.parallel.strategy.Strategy.levels`) and says each block's
level next, per GPU holding its activations (:func:`held_where`):

* a GPU with room (its peak under ``(1 - MARGIN)`` of its memory) lowers
  its blocks' levels while the room lasts: first every op -> cheap ops (most
  of the time for a fraction of the bytes), then cheap ops -> none, the
  blocks that save the most first;
* a GPU over its memory raises its blocks' levels (none -> cheap ops, then
  cheap ops -> every op, never past the level of the plan that fit) until
  the excess is covered.

A block whose level saves ``b`` activation bytes (its share of what that
level saves over the whole batch at the loss, :func:`block_savings`) costs
``held x b x share`` on its GPU when kept, ``share = 1 / (R M)`` the part
of the batch a slice is and ``held`` the most slices the GPU has in flight
at once (:func:`held_slices`, per model chunk, for a pipeline; one slice
for data parallelism, whose GPUs are alike: one pseudo-GPU, a count of
blocks). A forecast: the stage cut moves when the blocks' costs change, so
the search simulates the plan it says and asks again.

>>> held_slices("1f1b", 4, 8), held_slices("zb-v", 2, 4)
([4, 3, 2, 1], [4, 3])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pesto.graph import OpGraph
from pesto.step.marks import BACKWARD

from .schedules import SCHEDULES, actions

__all__ = ["MARGIN", "EVERY_GPU", "Held", "block_savings", "held_slices", "held_where", "next_levels"]

#: Share of a GPU's memory a kept block may not use (the forecast errs either way).
MARGIN = 0.02
#: The pseudo-GPU of data parallelism (:func:`held_where`): every GPU holds every block alike.
EVERY_GPU = "every GPU"


def block_savings(step: OpGraph, blocks: Sequence[Sequence[str]], saved: float) -> list[float]:
    """Per layer block, its share of ``saved`` (the batched activation bytes
    recomputing every block saves, the whole batch): in proportion to the
    bytes its forward ops' outputs hold for the backward pass (read by a
    backward op).

    >>> from dataclasses import replace
    >>> g = OpGraph.from_edges({"l0/a": 1, "l1/a": 1, "d": 1}, [("l0/a", "l1/a", 10), ("l0/a", "d", 10),
    ...                                                         ("l1/a", "d", 30)])
    >>> g = OpGraph([replace(op, phase="input-grad" if op.name == "d" else "forward") for op in g.ops],
    ...             g.edges, g.tensors)
    >>> block_savings(g, [("l0/a",), ("l1/a",)], 80.0)
    [20.0, 60.0]
    """
    where = {n: b for b, block in enumerate(blocks) for n in block}
    held = [0.0] * len(blocks)
    for _, src, nbytes, cons in step.tensor_table():
        b = where.get(step.names[src])
        if b is not None and any(step.ops[j].phase in BACKWARD for j in cons):
            held[b] += nbytes
    total = sum(held)
    return [saved * h / total if total else saved / len(blocks) for h in held]


def held_slices(schedule: str, stages: int, m: int) -> list[int]:
    """Per device of a ``stages``-device pipeline of ``m`` slices, the most
    slices one of its model chunks holds activations of at once (forward
    tasks run less backward tasks run, per chunk)."""
    out = []
    for s in range(stages):
        held: dict[int, int] = {}
        peak = 0
        for a in actions(schedule, s, stages, m):
            held[a.chunk] = held.get(a.chunk, 0) + (a.kind == "F") - (a.kind == "B")
            peak = max(peak, held[a.chunk])
        out.append(peak)
    return out


@dataclass(frozen=True)
class Held:
    """Where a plan holds each layer block's activations (:func:`held_where`):
    ``device`` per block (None: not placed), per device its ``peak`` and
    ``capacity`` bytes and ``held`` slices in flight at once; ``share``, the
    part of the batch one slice is (``1 / (R M)``)."""

    device: tuple
    peak: Mapping[str, int]
    capacity: Mapping[str, int]
    held: Mapping[str, int]
    share: float


def held_where(strategy, placement: Mapping[str, str], origin: Mapping, blocks: Sequence[Sequence[str]],
               peaks: Mapping[str, int], capacity: Mapping[str, int]) -> Held:
    """:class:`Held` of a plan of ``strategy`` (a
    :class:`~solver.parallel.strategy.Strategy`; ``placement``: its ops' devices,
    ``origin``: its transform's origins, ``peaks``/``capacity``: its GPUs'). Data
    parallelism: one pseudo-GPU :data:`EVERY_GPU` (the largest peak, the least
    memory, one slice); a pipeline or hybrid: a block on the GPU of its first
    op's copy of replica 0 and slice 0, held slices as its schedule says
    (:func:`held_slices`, over the GPUs in block order).

    >>> from solver.parallel.strategy import Strategy
    >>> h = held_where(Strategy(replicas=2), {}, {}, [("a",)], {"g0": 5, "g1": 7}, {"g0": 9, "g1": 8})
    >>> h.device, dict(h.peak), dict(h.capacity), h.share
    (('every GPU',), {'every GPU': 7}, {'every GPU': 8}, 0.5)
    """
    share = 1.0 / (strategy.replicas * strategy.micro_batches)
    if strategy.schedule not in SCHEDULES:
        return Held((EVERY_GPU,) * len(blocks), {EVERY_GPU: max(peaks.values(), default=0)},
                    {EVERY_GPU: min(capacity[d] for d in peaks)}, {EVERY_GPU: 1}, share)
    first: dict[str, str] = {}
    for n, d in placement.items():
        o = origin.get(n)
        if o is not None and o.role == "copy" and not o.replica and not o.slice:
            first.setdefault(o.op, d)
    device = tuple(first.get(block[0]) for block in blocks)
    order = list(dict.fromkeys(d for d in device if d is not None))
    held = dict(zip(order, held_slices(strategy.schedule, len(order), strategy.micro_batches)))
    return Held(device, peaks, capacity, held, share)


#: Lowering a block one level (:func:`next_levels`), in the order the moves are made.
_DOWN = (("full", "cheap"), ("cheap", "none"))


def next_levels(levels: Sequence[str], savings: Mapping[str, Sequence[float]], where: Held,
                top: str = "full") -> tuple[str, ...]:
    """Each block's level next (module doc), from a plan with blocks at
    ``levels`` held as ``where`` says (:func:`held_where`); ``savings``: per
    level ("cheap", "full"), per block the whole batch's bytes it saves
    (:func:`block_savings`); ``top``: the most any block is raised to.

    >>> where = Held(("g0", "g0", "g1", "g1"), {"g0": 900, "g1": 900}, {"g0": 1000, "g1": 1000},
    ...              {"g0": 2, "g1": 1}, 0.5)
    >>> full, cheap = [100.0] * 4, [80.0] * 4
    >>> next_levels(["full"] * 4, {"full": full, "cheap": cheap}, where)   # 80 bytes of room per GPU
    ('cheap', 'cheap', 'none', 'cheap')
    >>> next_levels(["cheap"] * 4, {"full": full, "cheap": cheap}, where, top="cheap")   # g0 holds 2 slices
    ('none', 'cheap', 'none', 'none')
    >>> over = Held(("g0", "g0"), {"g0": 1030}, {"g0": 1000}, {"g0": 1}, 1.0)
    >>> next_levels(["none", "none"], {"full": [100.0] * 2, "cheap": [80.0] * 2}, over)   # 50 bytes over
    ('none', 'cheap')
    """
    rank = {"none": 0, "cheap": 1, "full": 2}
    saved = {"none": [0.0] * len(levels), **savings}
    out = list(levels)
    for d in dict.fromkeys(d for d in where.device if d is not None):
        mine = sorted((b for b in range(len(levels)) if where.device[b] == d), key=lambda b: (-saved["full"][b], b))

        def cost(b, hi, lo):
            return where.held[d] * (saved[hi][b] - saved[lo][b]) * where.share

        room = where.capacity[d] * (1 - MARGIN) - where.peak.get(d, 0)
        if room >= 0:
            for hi, lo in _DOWN:
                for b in (b for b in mine if out[b] == hi):
                    if cost(b, hi, lo) > room:
                        break
                    out[b], room = lo, room - cost(b, hi, lo)
            continue
        for hi, lo in reversed(_DOWN):
            if rank[hi] > rank[top]:
                break
            for b in (b for b in reversed(mine) if out[b] == lo):
                if room >= 0:
                    break
                out[b], room = hi, room + cost(b, hi, lo)
    return tuple(out)
