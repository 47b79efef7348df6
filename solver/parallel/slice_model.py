"""The joint slice-aware exact model of a micro-batched step (issue 24, item 3).

:func:`solve_slices` splits the step into ``M`` slices
(:func:`pesto.step.split`), builds the block x slice grid
(:func:`solver.parallel.slice_grid.slice_grid`: forward ``F``, input-gradient
``B`` and weight-gradient ``W`` tasks), lets CP-SAT choose the stage of every
block -- shared by all slices and phases -- together with the order of
the slice tasks on each device under the devices' memory and, optionally, a
limit of slices in flight (:class:`solver.parallel.slice_cpsat.GridModel`,
hinted with the best plan of a one-chunk schedule of
:data:`~solver.parallel.schedules.SCHEDULES` of that ``M``: GPipe, 1F1B,
ZB-H1, ZB-H2), and turns the answer into a fine plan of the split graph:

* every copy of an op on its block's device; once-per-step ops with their
  first reader's block (variable reads), else the last producer's (the
  update), colocation groups kept
  (:func:`solver.parallel.pipelines.staged_plan`, the rule GPipe and 1F1B use);
* per device, copies in the order of their task's solved start, then
  topologically, the weight-gradient ops and their accumulate ops in their
  ``W`` task's place (``staged_plan(weight_tasks=True)``, as for the Zero
  Bubble schedules); the simulator judges the plan (:func:`pesto.finalize.finalize`).

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
from .schedules import SCHEDULES, unit_run
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
        ``"infeasible"``, ``"unknown"`` or ``"hint"`` (nothing found in time:
        the hint's grid schedule, :class:`~solver.parallel.slice_cpsat.GridAnswer`).
    objective : float or None
        The grid model's makespan (µs), not the fine plan's.
    grid_bound : float
        A lower bound of the grid model's makespan (µs), not of the fine step.
    hint : str
        The schedule of the plan that hinted the search (``"gpipe"``,
        ``"1f1b"``, ``"zb-h1"``, ``"zb-h2"``, ``"none"``).
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
    its copies' compute is on, per task ``(block, phase, slice)`` the earliest
    start of its copies (µs; phase as ``grid.task_phase``).

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
        b, p = grid.blocking.block[i], grid.task_phase[i]
        d = index.get(plan.placement.get(name))
        if d is not None:
            votes[b][d] += min(g.ops[i].compute.values()) + 1e-9
        if plan.start is not None and name in plan.start:
            start[b, p, o.slice] = min(start.get((b, p, o.slice), float("inf")), plan.start[name])
    dev = [max(v, key=lambda d: (v[d], -d)) if v else grid.allowed[b][0] for b, v in enumerate(votes)]
    dev = [d if d in grid.allowed[b] else grid.allowed[b][0] for b, d in enumerate(dev)]
    return dev, start


def _hints(graph: OpGraph, cluster: Cluster, m: int, loss, hints, split_backward: bool) -> list[StepPlan]:
    """The plans that may hint the grid: of ``m`` slices, a schedule of one
    chunk (the grid has no virtual stages), its backward split only when the
    grid's is (``split_backward``); None: computed."""
    def fits(name: str) -> bool:
        sch = SCHEDULES.get(name)
        return sch is not None and sch.chunks == 1 and (split_backward or not sch.split_backward)
    if hints is not None:
        return [h for h in hints if h.micro_batches == m and fits(h.schedule)]
    out = []
    for schedule in filter(fits, SCHEDULES):
        try:
            out.append(pipeline_plan(graph, cluster, schedule=schedule, micro_batches=m, loss=loss))
        except PestoError:
            continue
    return out


def _held(sp: StepPlan) -> float:
    """The most slices a device of ``sp``'s schedule holds activations of at
    once (:func:`solver.parallel.schedules.unit_run`'s peak, held to ``W``)."""
    return max(unit_run(sp.schedule, sp.stages, sp.micro_batches).peak)


def solve_slices(graph: OpGraph, cluster: Cluster, *, micro_batches: int, loss: str | None = None,
                 time_limit: float = 10.0, workers: int | None = None, seed: int = 0,
                 deadline: Deadline | None = None, hints: Sequence[StepPlan] | None = None,
                 tasks: int = GRID_TASKS, weight_tasks: bool = True, in_flight: int | None = None) -> SliceSolution:
    """The slice model's plan of ``graph`` (marked) in ``micro_batches`` slices (module doc).

    ``hints``: pipeline plans of this ``M`` to start from (the best one of a
    schedule the grid runs hints CP-SAT, one within ``in_flight`` first);
    None computes them. ``tasks``: the
    grid's size (:func:`solver.parallel.slice_grid.grid_blocks`).
    ``weight_tasks``: weight gradients as ``W`` tasks of their own (False:
    inside ``B``, the model of schedules that do not split the backward).
    ``in_flight``: at most that many slices' activations held per device
    (:class:`~solver.parallel.slice_cpsat.GridModel`; 1F1B's and ZB-H1's is
    the stages).

    Raises
    ------
    GridError
        No grid for this step (:func:`solver.parallel.slice_grid.slice_grid`).
    MicroBatchError, BatchMarkError
        As :func:`pesto.step.split`.
    """
    t0 = time.perf_counter()
    split = split_step(graph, micro_batches)
    pool = sorted(_hints(graph, cluster, split.micro_batches, loss, hints, weight_tasks),
                  key=lambda h: (in_flight is not None and _held(h) > in_flight, rank(h.plan)))
    grid = slice_grid(split, cluster, loss=loss, tasks=tasks, blocking=pool[0].blocking if pool else None,
                      weight_tasks=weight_tasks)
    model = GridModel(grid, cluster, in_flight=in_flight)
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
    block, phase = grid.blocking.block, grid.task_phase
    unit = 1.0 / scale   # starts are multiples of it: rank them as integers

    def key(i: int, _: str, s: int) -> float:   # the grid's phase of op i (a weight gradient it keeps in B)
        return round(ans.start[block[i], phase[i], s] / unit)

    return staged_plan(grid.split, cluster, block, [grid.devices[d] for d in ans.block_device], grid.phases,
                       key, placer="slice-cpsat", t0=t0, weight_tasks=any(grid.has_w),
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
