"""CP-SAT on the block x slice grid (:mod:`solver.parallel.slice_grid`): stages and the pipeline order together.

Variables and constraints (µs scaled to integer units, horizon <= ~10^6):

* ``x[b, d]``: block ``b`` on device ``d``, exactly one per block, **shared by
  every slice and phase** (a stage holds all copies of its layers; any
  block -> device map is allowed, not only contiguous ones);
* per task (``F[b, s]``, ``B[b, s]``, ``W[b, s]`` where the block has weight
  gradients of its own, ``U[b]``) and allowed device an optional interval
  present iff ``x[b, d]``; one no-overlap per device over all of them: the
  order of F, B and W tasks per device is the pipeline schedule chosen
  (1F1B, ZB-H1, ZB-H2 are points of this space, and so are the schedules that
  beat them on uneven stages or costly links);
* per quotient edge ``u -> v`` and slice ``s``: ``start[v, s] >= end[u, s] +
  delay[u, v]``, with ``delay >= c(d1, d2) * (x[u, d1] + x[v, d2] - 1)`` for
  every pair ``d1 != d2`` (``c``: the cluster's route, ``beta0 + beta1 * bytes``:
  heterogeneous links cost their own route); delays are shared by the slices;
  ``W[b, s]`` after ``B[b, s]`` (and whatever its ops read: the quotient
  edges); a block's last task (``W``, else ``B``) of slice ``s`` after that
  of slice ``s - 1`` when the block has gradients summed over the slices (its
  accumulate ops sum slice ``s`` into slices ``0..s-1``: out of order, the
  chain and the gradients it holds wait for the slice missing); ``U[b]`` after every ``B[b, s]`` and ``W[b, s]``:
  a weight gradient waits for nothing else, and nothing but the update waits for it;
* memory per device (a cumulative, when all weights and held tensors
  together could exceed the smallest device), within the device's memory:
  each block's weights and optimizer state over the whole horizon (its
  persistent bytes, as :func:`solver.parallel.cut.block_memory`); per slice
  each tensor of ``SliceGrid.holds`` (the activations and input gradients a
  block's backward reads) from the end of the task that made it (its start
  within the block) to the end of the last task reading it, so a deferred
  ``W`` keeps its slice's activations and input gradient; each task's own
  outputs while it runs (a block's last task: less what its reads free
  before its accumulate op runs); the running sum of the block's gradients
  (``summed``) from its first slice's last backward task to the update's end. The simulator's liveness holds a little more or
  less (an output until its transfer ends), so the fine plan is judged by
  :mod:`pesto.memory` (its ``peak_memory``);
* an activation limit per device (``in_flight=k``): a second cumulative, per
  slice and block the interval from ``F[b, s]``'s start to the end of its
  last backward task (``W[b, s]``, else ``B[b, s]``) with the block's
  ``activation`` bytes, within ``k`` slices' activations of the blocks the
  device holds (``k`` times the sum of ``activation[b] x[b, d]``): the count
  of :func:`solver.parallel.cut.in_flight` (1F1B holds ``p`` slices on its
  first stage, ZB-H1 too, ZB-H2 ``2p - 1``);
* per link (a GPU's PCIe lane, a host's NIC, an NVLink), the bytes crossing it (every slice's edge bytes
  and the once-per-step weight and gradient bytes) at its per-byte time fit
  in the makespan: a valid relaxation of link contention;
* objective: the makespan (end of every task).

It ignores link contention and the parallelism inside a task, so its optimum
is a bound of the *grid model*, not of the fine step; the fine plan is judged
by the simulator (:mod:`solver.parallel.slice_model`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from pesto.cluster import Cluster
from pesto.deadline import Deadline

from ..cpsat_model import symmetric_groups
from ..cpsat_solve import STATUS, deterministic_parameters, search
from .slice_grid import B, F, U, W, SliceGrid

__all__ = ["GridModel", "GridAnswer", "HORIZON_UNITS"]

#: The model's horizon in integer time units at most (µs are scaled to fit).
HORIZON_UNITS = 1_000_000
KIB = 1024


@dataclass(frozen=True)
class GridAnswer:
    """What CP-SAT found on the grid.

    Attributes
    ----------
    status : str
        ``"optimal"``, ``"feasible"``, ``"infeasible"``, ``"unknown"`` (nothing
        found) or ``"hint"`` (nothing found in time: the hint's schedule,
        without an ``in_flight`` limit).
    objective : float or None
        The grid model's makespan (µs).
    grid_bound : float
        CP-SAT's lower bound of the grid model's makespan (µs): not a bound of the fine step.
    block_device : tuple of int
        Per block, an index into ``grid.devices`` (empty when nothing was found).
    start : mapping (block, phase, slice) -> µs
        Start of each F (phase 0), B (phase 1) and W (phase 2) task.
    wall : float
        Seconds CP-SAT searched.
    """

    status: str
    objective: float | None
    grid_bound: float
    block_device: tuple
    start: Mapping
    wall: float


class GridModel:
    """The CP-SAT model of a :class:`~solver.parallel.slice_grid.SliceGrid` on ``cluster`` (module doc).

    ``in_flight``: at most that many slices' activations per device (module
    doc); None: the devices' memory alone bounds them.
    """

    def __init__(self, grid: SliceGrid, cluster: Cluster, *, in_flight: int | None = None):
        if in_flight is not None and in_flight < 1:
            raise ValueError(f"in_flight={in_flight}: a device must hold at least one slice's activations")
        self.grid, self.cluster, self.in_flight = grid, cluster, in_flight
        self.hinted = None   # (block -> device, the hint's start per task in units), set by hint()
        self.cp = cp_model.CpModel()
        self.nb, self.m, self.nd = grid.blocks, grid.micro_batches, len(grid.devices)
        self.cost = self._routes()
        self.scale = self._scale()
        self.horizon = HORIZON_UNITS + HORIZON_UNITS // 100 + 1   # room for rounding
        self._placement()
        self._tasks()
        self._precedences()
        self._memory()
        ends = [self.end[k] for k in self.end]
        self.makespan = self.cp.new_int_var(0, self.horizon, "makespan")
        self.cp.add_max_equality(self.makespan, ends)
        self._link_loads()
        self.cp.minimize(self.makespan)

    def _routes(self) -> np.ndarray:
        """``[d1, d2] -> (beta0, beta1)`` of the route between candidate devices."""
        out = np.zeros((self.nd, self.nd, 2))
        for a, da in enumerate(self.grid.devices):
            for b, db in enumerate(self.grid.devices):
                if a != b:
                    r = self.cluster.route(da, db)
                    out[a, b] = (r.beta0, r.beta1)
        return out

    def _delay_us(self, a: int, b: int, nbytes: int) -> float:
        return 0.0 if a == b or nbytes <= 0 else float(self.cost[a, b, 0] + self.cost[a, b, 1] * nbytes)

    def _scale(self) -> float:
        """Units per µs: every task on its slowest allowed device plus every delay in series fits."""
        g = self.grid
        work = 0.0
        for b, allowed in enumerate(g.allowed):
            work += max(float(g.dur[b, :, :, d].sum() + g.update[b, d]) for d in allowed)
        worst = max((self._delay_us(a, c, e[4]) for e in g.edges for a in range(self.nd)
                     for c in range(self.nd)), default=0.0)
        steps = sum(max(self._delay_us(a, c, e[2]) for a in range(self.nd) for c in range(self.nd))
                    for e in g.step_edges)
        total = work + self.m * len(g.edges) * worst + steps
        return min(100.0, HORIZON_UNITS / max(total, 1e-9))

    def units(self, us: float) -> int:
        return int(round(us * self.scale))

    def _placement(self) -> None:
        g = self.grid
        self.x = {(b, d): self.cp.new_bool_var(f"x{b}_{d}") for b in range(self.nb) for d in g.allowed[b]}
        for b in range(self.nb):
            self.cp.add_exactly_one(self.x[b, d] for d in g.allowed[b])
        self.first_fixed = False
        ids = [self.cluster.index[d] for d in g.devices]
        if any(set(ids) <= set(grp) for grp in symmetric_groups(self.cluster)) and 0 in g.allowed[0]:
            self.cp.add(self.x[0, 0] == 1)   # interchangeable devices: block 0 on the first
            self.first_fixed = True

    def _tasks(self) -> None:
        """Start/end per task, an optional interval per allowed device, no-overlap per device."""
        g = self.grid
        self.start, self.end, self.interval = {}, {}, {}
        per_dev: dict[int, list] = {d: [] for d in range(self.nd)}
        tasks = [((b, p, s), g.dur[b, p, s]) for b in range(self.nb) for p in (F, B, W) for s in range(self.m)
                 if p != W or g.has_w[b]]
        tasks += [((b, U, 0), g.update[b]) for b in range(self.nb)]
        for key, dur in tasks:
            b = key[0]
            st = self.cp.new_int_var(0, self.horizon, f"s{key}")
            en = self.cp.new_int_var(0, self.horizon, f"e{key}")
            self.start[key], self.end[key] = st, en
            for d in g.allowed[b]:
                size = self.units(float(dur[d]))
                iv = self.cp.new_optional_interval_var(st, size, en, self.x[b, d], f"i{key}_{d}")
                self.interval[key, d] = iv
                if size > 0:
                    per_dev[d].append(iv)
        for ivs in per_dev.values():
            if len(ivs) > 1:
                self.cp.add_no_overlap(ivs)

    def _precedences(self) -> None:
        g = self.grid
        self.delay: dict = {}   # edge index -> (delay var, bu, bv)
        for k, (bu, pu, bv, pv, nbytes) in enumerate(g.edges):
            delay = 0
            if bu != bv:
                pairs = [(a, c, self.units(self._delay_us(a, c, nbytes))) for a in g.allowed[bu]
                         for c in g.allowed[bv] if a != c]
                top = max((u for _, _, u in pairs), default=0)
                if top > 0:
                    delay = self.cp.new_int_var(0, top, f"delay{k}")
                    self.delay[k] = (delay, bu, bv)
                    for a, c, u in pairs:
                        if u > 0:
                            self.cp.add(delay >= u * (self.x[bu, a] + self.x[bv, c] - 1))
            for s in range(self.m):
                self.cp.add(self.start[bv, pv, s] >= self.end[bu, pu, s] + delay)
        for b in range(self.nb):
            for s in range(self.m):
                if g.has_w[b]:
                    self.cp.add(self.start[b, W, s] >= self.end[b, B, s])
                if s and g.summed[b] > 0:   # slice s's gradient is summed into slices 0..s-1's: in slice order
                    self.cp.add(self.start[b, g.last(b), s] >= self.end[b, g.last(b), s - 1])
                self.cp.add(self.start[b, U, 0] >= self.end[b, g.last(b), s])

    def _links(self) -> dict:
        """``link -> (pairs, least µs per byte of a route over it)``: the
        ordered device pairs whose routes hold the link (a GPU's PCIe up or
        down lane, a host's NIC, an NVLink shared by both directions)."""
        pairs: dict = {}
        for a in range(self.nd):
            for c in range(self.nd):
                if a != c:
                    r = self.cluster.route(self.grid.devices[a], self.grid.devices[c])
                    for link in r.links:
                        pairs.setdefault(link, {})[a, c] = r.beta1
        return {link: (tuple(sorted(p)), min(p.values())) for link, p in pairs.items()}

    def _crossing(self, bu: int, bv: int, pairs, name: str) -> list:
        """Literals, one of which is true when flow ``bu -> bv`` crosses a link
        over ``pairs``: one per link when the pairs are ``S x T`` (a lane, a
        NIC), else one per pair (a link both directions share)."""
        src, dst = {a for a, _ in pairs}, {c for _, c in pairs}
        groups = ([(sorted(src), sorted(dst))] if len(pairs) == len(src) * len(dst) and not src & dst
                  else [([a], [c]) for a, c in pairs])
        out = []
        for k, (ss, ts) in enumerate(groups):
            xs = [self.x[bu, d] for d in ss if (bu, d) in self.x]
            xt = [self.x[bv, d] for d in ts if (bv, d) in self.x]
            if xs and xt:
                lit = self.cp.new_bool_var(f"c{bu}_{bv}_{name}_{k}")
                self.cp.add(lit >= sum(xs) + sum(xt) - 1)
                out.append((lit, frozenset(ss), frozenset(ts)))
        return out

    def _link_loads(self) -> None:
        """Per link, the bytes the block map sends over it (every slice's
        quotient-edge bytes and the once-per-step bytes, ``SliceGrid.step_edges``)
        take at most the makespan: transfers on one link do not overlap, which
        the delays alone do not say (contention)."""
        g = self.grid
        flows: dict = {}
        for bu, _, bv, _, nbytes in g.edges:
            if bu != bv:
                flows[bu, bv] = flows.get((bu, bv), 0) + self.m * nbytes
        for bu, bv, nbytes in g.step_edges:
            flows[bu, bv] = flows.get((bu, bv), 0) + nbytes
        self.cross: list = []   # per link: (literal, units, b_u, b_v, S, T), the flow b_u -> b_v over it
        for link, (pairs, beta1) in self._links().items():
            terms = []
            for (bu, bv), nbytes in flows.items():
                u = self.units(beta1 * nbytes)
                if u > 0:
                    terms += [(lit, u, bu, bv, ss, ts) for lit, ss, ts in self._crossing(bu, bv, pairs, link)]
            if terms:
                self.cp.add(sum(u * lit for lit, u, *_ in terms) <= self.makespan)
                self.cross.append(terms)

    def _memory(self) -> None:
        """The cumulatives per device (module doc): the devices' memory when it
        could bind at all, the ``in_flight`` limit when given."""
        g = self.grid
        act = [math.ceil(a / KIB) for a in g.activation]
        holds = [(bu, pu, bv, pv, math.ceil(n / KIB)) for bu, pu, bv, pv, n in g.holds]
        wts = [math.ceil(w / KIB) for w in g.weight]
        caps = [self.cluster.device(d).memory // KIB for d in g.devices]
        out = self._outputs()
        self.memory_active = sum(wts) + sum(g.summed) / KIB + self.m * sum(h[-1] for h in holds) > min(caps)
        self.life: dict = {}   # (first task, last task, device) -> lifetime var of what a slice holds
        self.limit: dict = {}   # device -> its in_flight limit (KiB) var
        if not self.memory_active and self.in_flight is None:
            return
        for d in range(self.nd):
            held = [b for b in range(self.nb) if (b, d) in self.x]
            lives = [(self._life((b, F, s), False, (b, g.last(b), s), d), act[b]) for b in held if act[b]
                     for s in range(self.m)]
            if self.in_flight is not None and lives:
                limit = self.cp.new_int_var(0, self.in_flight * sum(act), f"limit{d}")   # affine for CP-SAT
                self.cp.add(limit == sum(self.in_flight * act[b] * self.x[b, d] for b in held if act[b]))
                self.limit[d] = (limit, {b: self.in_flight * act[b] for b in held})
                self.cp.add_cumulative([iv for iv, _ in lives], [a for _, a in lives], limit)
            if not self.memory_active:
                continue
            weights = [(self.cp.new_optional_fixed_size_interval_var(0, self.horizon, self.x[b, d], f"w{b}_{d}"),
                        wts[b]) for b in held if wts[b]]
            kept = [(self._life((bu, pu, s), bu != bv, (bv, pv, s), d), n) for bu, pu, bv, pv, n in holds
                    if (bv, d) in self.x for s in range(self.m)]
            made = [(self.interval[(b, p, s), d], math.ceil(out[b, p] / KIB)) for b in held
                    for p in (F, B, W) if out[b, p] >= KIB for s in range(self.m) if ((b, p, s), d) in self.interval]
            sums = [(self._life((b, g.last(b), 0), False, (b, U, 0), d), math.ceil(g.summed[b] / KIB))
                    for b in held if g.summed[b] >= KIB]
            both = weights + kept + made + sums
            if both:
                self.cp.add_cumulative([iv for iv, _ in both], [a for _, a in both], caps[d])

    def _outputs(self) -> np.ndarray:
        """``grid.output``, less, for a block's last task, what its reads free
        before its accumulate op makes the new running sum (the sum's bytes
        at most): the task runs its gradient ops first."""
        g = self.grid
        out = np.array(g.output, dtype=float)
        into = np.zeros_like(out)
        for _, _, bv, pv, n in g.holds:
            into[bv, pv] += n
        for b in range(self.nb):
            last = g.last(b)
            out[b, last] -= min(into[b, last], g.summed[b], out[b, last])
        return out

    def _life(self, first: tuple, arrives: bool, last: tuple, d: int):
        """What a slice holds on device ``d`` (when block ``last[0]`` is there)
        from task ``first``'s start (its end when ``arrives``: made elsewhere)
        to task ``last``'s end: an optional interval."""
        key = (first, arrives, last, d)
        if key not in self.life:
            self.life[key] = self.cp.new_int_var(0, self.horizon, f"life{first}_{arrives}_{last}_{d}")
        begin = self.end[first] if arrives else self.start[first]
        return self.cp.new_optional_interval_var(begin, self.life[key], self.end[last], self.x[last[0], d],
                                                 f"held{first}_{arrives}_{last}_{d}")

    def hint(self, block_device: Sequence[int], start: Mapping | None = None) -> None:
        """A complete start for the search: the block -> device map and the
        grid schedule :meth:`list_schedule` makes with the tasks ranked by
        ``start`` (µs, e.g. a pipeline plan's; missing tasks last), every
        variable hinted, so CP-SAT starts from a feasible solution (unless the
        map breaks memory) and never ends worse than it."""
        for (b, d), lit in self.x.items():
            self.cp.add_hint(lit, block_device[b] == d)
        begin = self.list_schedule(block_device, start or {})
        self.hinted = (tuple(block_device), begin)
        for key, t in begin.items():
            dur = self._units_on(key, block_device[key[0]])
            self.cp.add_hint(self.start[key], t)
            self.cp.add_hint(self.end[key], t + dur)
        for k, (var, bu, bv) in self.delay.items():
            self.cp.add_hint(var, self._delay_units(bu, bv, k, block_device))
        for (first, arrives, last, d), var in self.life.items():
            on = block_device[last[0]] == d
            t0 = begin[first] + (self._units_on(first, block_device[first[0]]) if arrives else 0)
            self.cp.add_hint(var, begin[last] + self._units_on(last, d) - t0 if on else 0)
        for d, (var, per_block) in self.limit.items():
            self.cp.add_hint(var, sum(k for b, k in per_block.items() if block_device[b] == d))
        loads = [0]
        for terms in self.cross:
            on = [(lit, u) for lit, u, bu, bv, src, dst in terms if block_device[bu] in src and block_device[bv] in dst]
            for lit, *_ in terms:
                self.cp.add_hint(lit, any(lit is x for x, _ in on))
            loads.append(sum(u for _, u in on))
        end = max(t + self._units_on(k, block_device[k[0]]) for k, t in begin.items())
        self.cp.add_hint(self.makespan, max([end] + loads))

    def _units_on(self, key, d: int) -> int:
        b, p, s = key
        return self.units(float(self.grid.update[b, d] if p == U else self.grid.dur[b, p, s, d]))

    def _delay_units(self, bu: int, bv: int, k: int, block_device: Sequence[int]) -> int:
        a, c = block_device[bu], block_device[bv]
        return self.units(self._delay_us(a, c, self.grid.edges[k][4])) if a != c else 0

    def list_schedule(self, block_device: Sequence[int], rank: Mapping) -> dict:
        """Start (units) of every task with blocks on ``block_device``: tasks
        taken in the order of ``rank`` (µs by task key) among those whose
        predecessors are done, each as early as its device and inputs allow
        (the precedences and delays of the model). A feasible schedule of the
        grid but for memory."""
        g = self.grid
        preds: dict = {k: [] for k in self.start}
        for k, (bu, pu, bv, pv, _) in enumerate(g.edges):
            delay = self._delay_units(bu, bv, k, block_device)
            for s in range(self.m):
                preds[bv, pv, s].append(((bu, pu, s), delay))
        for b in range(self.nb):
            last = g.last(b)
            for s in range(self.m):
                if g.has_w[b]:
                    preds[b, W, s].append(((b, B, s), 0))
                preds[b, last, s] += [((b, last, s - 1), 0)] if s and g.summed[b] > 0 else []
            preds[b, U, 0] += [((b, g.last(b), s), 0) for s in range(self.m)]
        waiting = {k: len(v) for k, v in preds.items()}
        succs: dict = {k: [] for k in self.start}
        for k, ps in preds.items():
            for q, _ in ps:
                succs[q].append(k)
        inf = float("inf")
        ready = sorted((rank.get(k, inf), k) for k, n in waiting.items() if n == 0)
        free = [0] * self.nd
        begin: dict = {}
        while ready:
            _, key = ready.pop(0)
            d = block_device[key[0]]
            t = max([free[d]] + [begin[q] + self._units_on(q, block_device[q[0]]) + dl for q, dl in preds[key]])
            begin[key] = t
            free[d] = t + self._units_on(key, d)
            for nxt in succs[key]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    ready.append((rank.get(nxt, inf), nxt))
            ready.sort()
        return begin

    def _hinted_answer(self, bound: float, wall: float) -> GridAnswer | None:
        """The hint's grid schedule (:meth:`hint`) as the answer, status ``"hint"``,
        when CP-SAT found nothing in time (None without a hint, or with an
        ``in_flight`` limit the hint may break; the devices' memory is the fine
        plan's to judge, :mod:`pesto.memory`)."""
        if self.hinted is None or self.in_flight is not None:
            return None
        dev, begin = self.hinted
        end = max(t + self._units_on(k, dev[k[0]]) for k, t in begin.items())
        start = {k: t / self.scale for k, t in begin.items()}
        return GridAnswer("hint", end / self.scale, bound, dev, start, wall)

    def solve(self, *, time_limit: float, workers: int | None = None, seed: int = 0,
              deadline: Deadline | None = None) -> GridAnswer:
        """Search for at most ``time_limit`` seconds (or the ``deadline``'s budget)."""
        solver = cp_model.CpSolver()
        if deadline is not None:
            time_limit = deadline.budget(time_limit)
        p = solver.parameters
        p.max_time_in_seconds = max(0.01, float(time_limit))
        p.num_workers = int(workers or os.cpu_count() or 1)
        p.random_seed = int(seed)
        p.catch_sigint_signal = False
        if deadline is not None and deadline.deterministic:
            deterministic_parameters(p, time_limit)
        code = search(solver, self.cp, deadline)
        if deadline is not None:
            deadline.charge(solver.deterministic_time)
        status = STATUS.get(code, "unknown")
        bound = max(0.0, solver.best_objective_bound) / self.scale if status != "infeasible" else math.inf
        if status not in ("optimal", "feasible"):
            return self._hinted_answer(bound, solver.wall_time) or GridAnswer(status, None, bound, (), {},
                                                                              solver.wall_time)
        dev = tuple(next(d for d in self.grid.allowed[b] if solver.boolean_value(self.x[b, d]))
                    for b in range(self.nb))
        start = {k: solver.value(v) / self.scale for k, v in self.start.items()}
        return GridAnswer(status, solver.objective_value / self.scale, bound, dev, start, solver.wall_time)
