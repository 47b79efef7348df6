"""Per-block recomputation: which layer blocks a pipeline recomputes.

Recomputing every layer block (:func:`pesto.step.recompute`) makes a
pipeline fit, but a stage that holds few slices at once needs little of it:
under 1F1B or ZB-H1 stage ``s`` of ``k`` holds the activations of about
``k - s`` slices, the last stage of one. :func:`next_mask` reads a
realised plan of the step with some blocks recomputed (its
:attr:`~solver.parallel.strategy.Strategy.recompute` mask) and says which
blocks to recompute next, per GPU:

* a GPU with room (its peak under ``(1 - MARGIN)`` of its memory) keeps
  blocks' activations instead (stops recomputing them) while the room
  lasts, the blocks that save the most first;
* a GPU over its memory recomputes more of its blocks until the excess is
  covered.

A block of ``b`` activation bytes (its share of what recomputing every
block saves at the loss, :func:`block_savings`) costs ``held x b / M`` on
its GPU when kept, ``held`` the most slices the schedule has in flight
there at once (:func:`held_slices`, per model chunk; a forecast: the stage
cut moves when the blocks' costs change, so the search simulates the plan
it says and asks again).

>>> held_slices("1f1b", 4, 8), held_slices("zb-v", 2, 4)
([4, 3, 2, 1], [4, 3])
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pesto.graph import OpGraph
from pesto.step.marks import BACKWARD
from pesto.step.slicing import copy_name

from .schedules import actions

__all__ = ["MARGIN", "block_savings", "held_slices", "next_mask"]

#: Share of a GPU's memory a kept block may not use (the forecast errs either way).
MARGIN = 0.02


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


def next_mask(mask: Sequence[bool], blocks: Sequence[Sequence[str]], savings: Sequence[float],
              placement: Mapping[str, str], peaks: Mapping[str, int], capacity: Mapping[str, int],
              schedule: str, m: int) -> tuple[bool, ...]:
    """The blocks to recompute next (module doc), from a plan that
    recomputed ``mask`` (``placement``: its ops' devices, a block's by its
    first op's first slice; ``peaks``: its GPUs' peak bytes; ``capacity``:
    their memory) of ``schedule`` over ``m`` slices.

    >>> blocks = [("l0/a",), ("l1/a",), ("l2/a",), ("l3/a",)]
    >>> where = {"l0/a@mb0": "g0", "l1/a@mb0": "g0", "l2/a@mb0": "g1", "l3/a@mb0": "g1"}
    >>> next_mask([True] * 4, blocks, [100.0] * 4, where, {"g0": 900, "g1": 900}, {"g0": 1000, "g1": 1000},
    ...           "1f1b", 2)   # g1 holds one slice: room for one block's 50 bytes, not two
    (True, True, False, True)
    """
    device = [placement.get(copy_name(block[0], 0)) for block in blocks]
    order = list(dict.fromkeys(d for d in device if d is not None))
    held = dict(zip(order, held_slices(schedule, len(order), m)))
    out = list(mask)
    for d in order:
        mine = sorted((b for b in range(len(blocks)) if device[b] == d), key=lambda b: (-savings[b], b))
        cost = {b: held[d] * savings[b] / m for b in mine}
        room = capacity[d] * (1 - MARGIN) - peaks.get(d, 0)
        if room >= 0:
            for b in (b for b in mine if out[b]):
                if cost[b] > room:
                    break
                out[b], room = False, room - cost[b]
        else:
            for b in (b for b in reversed(mine) if not out[b]):
                if room >= 0:
                    break
                out[b], room = True, room + cost[b]
    return tuple(out)
