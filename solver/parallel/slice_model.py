"""The joint slice-aware exact model of a micro-batched step (issue 24, item 3).

:func:`solve_slices` splits the step into ``M`` slices
(:func:`pesto.step.split`), builds the block x slice grid
(:func:`solver.parallel.slice_grid.slice_grid`), lets CP-SAT choose the stage of every
block -- shared by all slices and both phases -- together with the order of
the slice tasks on each device (:class:`solver.parallel.slice_cpsat.GridModel`, hinted
with the better of the GPipe and 1F1B plans of that ``M``), and turns the
answer into a fine plan of the split graph:

* every copy of an op on its block's device; once-per-step ops with their
  first reader's block (variable reads), else the last producer's (the
  update), colocation groups kept
  (:func:`solver.parallel.pipelines.staged_plan`, the rule GPipe and 1F1B use);
* per device, copies in the order of their task's solved start, then
  topologically; the simulator judges the plan (:func:`pesto.finalize.finalize`).

The grid model ignores link contention and the parallelism inside a task:
its objective and bound (:attr:`SliceSolution.grid_bound`) are those of the
grid model, not of the fine step. ``pesto.solve(micro_batches=M)`` offers the
plan and passes it first to the fine search (:mod:`solver.parallel.search`).

Examples
--------
>>> from pesto.graph import Op, OpGraph, Tensor, Edge
>>> from pesto.cluster import gpus
>>> names, anchor = ["l0", "l1", "d1", "d0"], {"d1": "l1", "d0": "l0"}   # two layers, their gradients
>>> ops = [Op(n, {"GPU": 10.0}, output_bytes=8, batch=True, scope=n, anchor=anchor.get(n),
...           phase="input-grad" if n in anchor else "forward") for n in names]
>>> es = [Edge(a, b, f"{a}:0") for a, b in zip(names, names[1:])]
>>> g = OpGraph(ops, es, [Tensor(f"{n}:0", n, 8) for n in names])
>>> r = solve_slices(g, gpus(2, beta=(0.0, 0.0)), micro_batches=2, time_limit=2, workers=1)
>>> r.status, r.objective, r.plan.makespan   # 2 stages, 2 slices: 4 tasks of 5 µs + 2 of fill
('optimal', 30.0, 30.0)
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from pesto.cluster import Cluster
from pesto.deadline import Deadline
from pesto.errors import PestoError
from pesto.graph import OpGraph
from pesto.step import Transformed, split as split_step
from pesto.plan import Plan

from ..common import rank
from .pipelines import StepPlan, pipeline_plan, staged_plan
from .schedules import SCHEDULES
from .slice_cpsat import GridAnswer, GridModel
from .slice_grid import GRID_TASKS, GridError, SliceGrid, slice_grid

__all__ = ["SliceSolution", "solve_slices", "place_slice_cpsat", "grid_hint"]


@dataclass(frozen=True)
class SliceSolution:
    """The slice model's answer (:func:`solve_slices`).

    Attributes
    ----------
    plan : Plan or None
        Over ``graph``'s ops, simulated and checked; None when CP-SAT found nothing.
    transformed : Transformed
        The split step (:func:`pesto.step.split`); ``graph`` is its graph.
    micro_batches, blocks : int
    blocking : str
        The block order (:func:`solver.parallel.cut.blockings`).
    block_device : tuple of str
        Per block its device (empty without a solution).
    status : str
        CP-SAT's status of the grid model: ``"optimal"``, ``"feasible"``,
        ``"infeasible"`` or ``"unknown"``.
    objective : float or None
        The grid model's makespan (µs), not the fine plan's.
    grid_bound : float
        A lower bound of the grid model's makespan (µs), not of the fine step.
    hint : str
        The plan that hinted the search (``"gpipe"``, ``"1f1b"``, ``"none"``).
    wall : float
        Seconds in all (grid, hint, CP-SAT, fine plan).
    """

    plan: Plan | None
    transformed: Transformed
    micro_batches: int
    blocks: int
    blocking: str
    block_device: tuple
    status: str
    objective: float | None
    grid_bound: float
    hint: str
    wall: float

    @property
    def graph(self) -> OpGraph:
        """The split step the plan places (``transformed.graph``)."""
        return self.transformed.graph


def grid_hint(grid: SliceGrid, sp: StepPlan) -> tuple[list[int], dict]:
    """A plan of the split step seen on the grid: per block the device most of
    its copies' compute is on, per task the earliest start of its copies (µs).

    ``sp``'s graph must be ``grid.split.graph`` (same names).
    """
    g, split, plan = grid.split.source, grid.split, sp.plan
    votes = [Counter() for _ in range(grid.blocks)]
    start: dict = {}
    index = {d: k for k, d in enumerate(grid.devices)}
    for name, o in split.origin.items():
        if o.role != "copy":
            continue
        i = g.index[o.op]
        b, p = grid.blocking.block[i], 1 if i in grid.phases.backward else 0
        d = index.get(plan.placement.get(name))
        if d is not None:
            votes[b][d] += min(g.ops[i].compute.values()) + 1e-9
        if plan.start is not None and name in plan.start:
            start[b, p, o.slice] = min(start.get((b, p, o.slice), float("inf")), plan.start[name])
    dev = [max(v, key=lambda d: (v[d], -d)) if v else grid.allowed[b][0] for b, v in enumerate(votes)]
    dev = [d if d in grid.allowed[b] else grid.allowed[b][0] for b, d in enumerate(dev)]
    return dev, start


def _hints(graph: OpGraph, cluster: Cluster, m: int, loss, hints) -> list[StepPlan]:
    if hints is not None:
        return [h for h in hints if h.micro_batches == m and h.schedule in SCHEDULES]
    out = []
    for schedule in (n for n, x in SCHEDULES.items() if x.plain):
        try:
            out.append(pipeline_plan(graph, cluster, schedule=schedule, micro_batches=m, loss=loss))
        except PestoError:
            continue
    return out


def solve_slices(graph: OpGraph, cluster: Cluster, *, micro_batches: int, loss: str | None = None,
                 time_limit: float = 10.0, workers: int | None = None, seed: int = 0,
                 deadline: Deadline | None = None, hints: Sequence[StepPlan] | None = None,
                 tasks: int = GRID_TASKS) -> SliceSolution:
    """The slice model's plan of ``graph`` (marked) in ``micro_batches`` slices (module doc).

    ``hints``: GPipe / 1F1B plans of this ``M`` to start from (the best one
    hints CP-SAT); None computes them. ``tasks``: the grid's size
    (:func:`solver.parallel.slice_grid.grid_blocks`).

    Raises
    ------
    GridError
        No grid for this step (:func:`solver.parallel.slice_grid.slice_grid`).
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    """
    t0 = time.perf_counter()
    split = split_step(graph, micro_batches)
    pool = sorted(_hints(graph, cluster, split.micro_batches, loss, hints),
                  key=lambda h: rank(h.plan))
    grid = slice_grid(split, cluster, loss=loss, tasks=tasks, blocking=pool[0].blocking if pool else None)
    model = GridModel(grid, cluster)
    if pool:
        model.hint(*grid_hint(grid, pool[0]))
    # deterministic: the work clock's budget alone (the wall time spent building the grid is no input)
    left = time_limit if deadline is not None and deadline.deterministic else time_limit - (time.perf_counter() - t0)
    ans = model.solve(time_limit=max(0.1, left), workers=workers, seed=seed, deadline=deadline)
    plan = None if ans.objective is None else _fine_plan(grid, cluster, ans, t0, model.scale)
    return SliceSolution(plan, split, split.micro_batches, grid.blocks, grid.blocking.name,
                         tuple(grid.devices[d] for d in ans.block_device), ans.status, ans.objective,
                         ans.grid_bound, pool[0].schedule if pool else "none", time.perf_counter() - t0)


def _fine_plan(grid: SliceGrid, cluster: Cluster, ans: GridAnswer, t0: float, scale: float) -> Plan:
    """The split step placed by blocks, copies ordered by their task's start (module doc)."""
    block = grid.blocking.block
    unit = 1.0 / scale   # starts are multiples of it: rank them as integers

    def key(i: int, phase: str, s: int) -> float:
        return round(ans.start[block[i], 1 if phase == "B" else 0, s] / unit)

    return staged_plan(grid.split, cluster, block, [grid.devices[d] for d in ans.block_device], grid.phases,
                       key, placer="slice-cpsat", t0=t0,
                       stats={"micro_batches": grid.micro_batches, "blocks": grid.blocks,
                              "grid_status": ans.status, "grid_makespan": ans.objective,
                              "grid_bound": ans.grid_bound})


def place_slice_cpsat(graph: OpGraph, cluster: Cluster, *, micro_batches: int = 4, loss: str | None = None,
                      time_limit: float = 10.0, seed: int = 0, workers: int | None = None,
                      deadline: Deadline | None = None) -> Plan:
    """The slice model's plan of the step split into ``micro_batches`` slices
    (:func:`solve_slices`; the plan places the split graph).

    Raises
    ------
    GridError
        No grid, or no grid solution within ``time_limit``.
    """
    r = solve_slices(graph, cluster, micro_batches=micro_batches, loss=loss, time_limit=time_limit,
                     workers=workers, seed=seed, deadline=deadline)
    if r.plan is None:
        raise GridError(f"slice model of {graph.name!r}, M={micro_batches}: no grid solution "
                        f"({r.status}) within {time_limit:g} s")
    return r.plan
