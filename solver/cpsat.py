"""Exact joint placement and scheduling with OR-Tools CP-SAT.

The model (DESIGN.md, "The CP-SAT model"), over a (coarse) OpGraph and any Cluster:

* **Placement.** One literal per (item, allowed device), where an item is an op
  or a whole colocation group (its members share the literals, so a group can
  never be split); exactly one per item. With two allowed devices an item has a
  single boolean ``b`` (device 1 iff ``b``). Device kinds are respected by
  creating literals only for allowed devices.
* **Ops.** ``start``/``end`` variables per op and one optional interval per
  allowed device (size = compute time on that device's kind and speed) with the
  placement literal as presence; ``add_no_overlap`` per device, a redundant
  per-device load constraint ``makespan >= sum(size * literal)`` and a redundant
  cumulative (capacity = number of devices) with each op at its fastest size.
* **Communication, contended links.** Per (tensor, destination device ``e``) a
  literal ``y`` ("the tensor is sent to ``e``") equivalent to: the producer is not
  on ``e`` and some consumer is. For each possible source device ``a`` an
  optional interval of the route's time, present iff the producer is on ``a``
  and ``y``, shared start/end ``ts >= end(producer)``, ``start(consumer) >= te``
  when the consumer is on ``e`` and ``y``. The interval goes into the
  ``add_no_overlap`` of every link resource of the route ``a -> e`` (a tensor
  is sent once per destination however many consumers it has there). Links may
  serve transfers in any order; the simulator serves them first come first
  served, so the simulated makespan of a plan may exceed the model's (then the
  plan's status is downgraded to ``feasible`` and both figures are reported).
* **Communication, contention free** (``cluster.contention_free`` or
  ``contention=False``): no transfer intervals at all. Per data edge ``u -> c``
  with delay ``D`` (slowest tensor of the edge) one literal ``same`` (implies
  both on one device) and the linear ``start(c) >= end(u) + D * (1 - same)``;
  with route costs that differ between device pairs, one enforced precedence per
  pair instead. This is the classic DAG-scheduling model used by the Sinnen and
  STG sets.
* **Memory (static, conservative).** Per device: sum over its ops of persistent
  + output bytes, plus the bytes of every tensor received there, plus the
  largest temporary of its ops, <= capacity. This bounds from above the
  liveness-based peak of :func:`pesto.plan.memory_profile`, so a plan the model
  accepts never runs out of memory. Skipped when everything fits everywhere.
  Because it holds every activation all step it can reject every plan; then
  :func:`place_cpsat` retries once with the weaker ``"persistent"`` bound
  (persistent bytes + the largest output + temporary) and the simulated
  liveness peak decides (status ``infeasible`` if it is over capacity).
  ``memory_balance=f`` also bounds each device's static held bytes by ``(1 + f)``
  times the mean.
* **Objective.** Minimise the makespan, constrained to at least
  :func:`solver.bounds.lower_bound` (critical path, total work / devices).
* **Symmetry breaking.** For each set of interchangeable devices (same kind,
  memory, speed, costs, and a link structure that a swap maps onto itself),
  value precedence: taking items in topological order, the first item on device
  ``g_j`` comes after some item on ``g_{j-1}``. A hint is relabelled to obey it.
* **Aggregated transfers** (automatic above 400 transfer candidates, or
  ``aggregate=True``): one interval per (producer, destination) carrying all
  the producer's tensors sent there, back to back as the simulator sends them;
  a consumer waits for the whole batch. Much smaller, slightly pessimistic.
* **Status and bounds.** ``optimal`` means CP-SAT proved the model optimal and
  the simulated replay matched it; the problem it proves it for includes the
  static memory constraint above. With aggregated transfers the model is a
  restriction, so the plan is only ``feasible`` and the lower bound falls back
  to the explicit one (``stats["model_status"]`` keeps CP-SAT's word).
* **Time unit.** For integer data (all compute and transfer times integral, the
  horizon below 1e8) one unit is one µs and the optimum is exact. Otherwise
  times are scaled and rounded *up*; the model's schedule is then feasible for
  the true times, and ``stats["rounding_error_us"]`` bounds what rounding can
  cost; the returned ``lower_bound`` subtracts it, so it stays valid.

The returned Plan is the simulator's replay of the model's placement and
per-device order (:func:`solver.common.finalize`), so it is comparable with
every other placer; ``stats`` carries the model's makespan and bound.
"""
from __future__ import annotations

import math
import os
import time
from typing import Mapping

from ortools.sat.python import cp_model

from pesto.cluster import Cluster
from pesto.errors import InfeasibleError, InvalidPlanError
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.simulate import simulate

from pesto.memory import check_feasible, static_bytes

from .bounds import durations, greedy_plan, lower_bound
from .common import finalize

__all__ = ["place_cpsat", "CpsatModel", "symmetric_groups"]

_STATUS = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
           cp_model.INFEASIBLE: "infeasible", cp_model.MODEL_INVALID: "unknown",
           cp_model.UNKNOWN: "unknown"}


def _is_int(x: float) -> bool:
    return abs(x - round(x)) < 1e-9


def symmetric_groups(cluster: Cluster) -> list[list[int]]:
    """Groups of device indices that any permutation maps onto the same problem.

    Starts from :meth:`Cluster.identical_groups` and keeps a group only if swapping
    two consecutive members (transpositions generate every permutation) keeps
    every route cost and maps the set of links used by each route onto the set
    of another link (same sharing structure). Otherwise the group is dropped.
    """
    names = cluster.names
    idx = cluster.index
    out = []
    link_users: dict[str, set] = {}
    for r in cluster.routes:
        for l in r.links:
            link_users.setdefault(l, set()).add((r.src, r.dst))
    hyper = sorted(tuple(sorted(u)) for u in link_users.values())
    for group in cluster.identical_groups():
        if len(group) < 2:
            continue
        ok = True
        for a, b in zip(group, group[1:]):
            perm = {n: n for n in names}
            perm[a], perm[b] = b, a
            for r in cluster.routes:
                r2 = cluster.route(perm[r.src], perm[r.dst])
                if (r.beta0, r.beta1) != (r2.beta0, r2.beta1) or len(r.links) != len(r2.links):
                    ok = False
                    break
            if not ok:
                break
            mapped = sorted(tuple(sorted((perm[s], perm[d]) for s, d in u)) for u in link_users.values())
            if mapped != hyper:
                ok = False
                break
        if ok:
            out.append([idx[n] for n in group])
    return out


class CpsatModel:
    """The CP-SAT model of one (graph, cluster); build once, solve with hints.

    Parameters
    ----------
    graph, cluster
    contention : bool
        Model link congestion (ignored when the cluster is contention free).
    memory_balance : float, optional
        Bound each device's static held bytes by ``(1 + memory_balance) * mean``.
    symmetry : bool
        Break symmetries between interchangeable devices.
    memory : {True, "static", "persistent", False}
        Memory constraints (added only when they can bind). ``"static"``
        (True): persistent + output bytes of the device's ops + received
        tensors + the largest temporary, an upper bound on the liveness peak,
        so accepted plans never run out of memory, but it can reject every
        plan of a graph whose activations do not all fit at once.
        ``"persistent"``: persistent bytes + the largest output + temporary of
        one op, a weaker bound (the simulated liveness peak decides then).
    aggregate : bool, optional
        One transfer interval per (producer, destination) instead of per
        (tensor, destination); default: only when the per-tensor model would
        have more than 400 transfer candidates.
    cuts : bool
        Add the redundant energy cuts with communication (:meth:`_energy`).

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 1), ("a", "c", 1)])
    >>> m = CpsatModel(g, gpus(2, beta=(1.0, 0.0)))
    >>> m.solve(time_limit=10, workers=1).makespan
    6.0
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, *, contention: bool = True,
                 memory_balance: float | None = None, symmetry: bool = True, memory: bool = True,
                 aggregate: bool | None = None, cuts: bool = True):
        check_feasible(graph, cluster)
        self.cuts = cuts
        self.graph, self.cluster = graph, cluster
        self.aggregate = aggregate
        if memory not in (True, False, "static", "persistent"):
            raise ValueError(f"memory must be True/'static', 'persistent' or False, got {memory!r}")
        self.memory_mode = "static" if memory is True else memory
        self.contended = contention and not cluster.contention_free and bool(cluster.links)
        t0 = time.perf_counter()
        self._build(memory_balance, symmetry, memory)
        self.build_time = time.perf_counter() - t0

    # -- building ------------------------------------------------------------
    def _build(self, memory_balance, symmetry, use_memory):
        g, cl = self.graph, self.cluster
        n, nd = g.num_ops, len(cl.devices)
        devs = cl.devices
        ops = g.ops
        index = g.index
        self.dur = dur = durations(g, cl)
        self.lb = lb = lower_bound(g, cl, dur)

        # items: colocation groups share placement literals
        item_of = list(range(n))
        group_first: dict[str, int] = {}
        for i, op in enumerate(ops):
            if op.colocation_group is not None:
                item_of[i] = group_first.setdefault(op.colocation_group, i)
        allowed_item: dict[int, set] = {}
        for i in range(n):
            it = item_of[i]
            allowed_item[it] = allowed_item.get(it, set(dur[i])) & set(dur[i])
        self.item_of = item_of

        # transfers: (tensor name, producer idx, bytes, consumer idxs), bytes > 0
        cons = g.consumers()
        tensors = []
        for t in g.tensors:
            if t.bytes <= 0:
                continue
            u = index[t.src]
            cs = sorted({index[c] for c in cons[t.name]} - {u})
            cs = [c for c in cs if item_of[c] != item_of[u]]  # colocated: never remote
            if cs:
                tensors.append((t.name, u, t.bytes, cs))
        self.tensors = tensors

        def ttime(a, b, nbytes):
            return cl.route(devs[a].name, devs[b].name).time(nbytes)

        # time unit
        comm_max = []
        all_vals = [x for d in dur for x in d.values()]
        for (_, u, b, cs) in tensors:
            dests = set().union(*(allowed_item[item_of[c]] for c in cs))
            times = [ttime(a, e, b) for a in allowed_item[item_of[u]] for e in dests if a != e]
            all_vals.extend(times)
            comm_max.append(max(times, default=0.0) * min(len(dests), len(cs)))
        safe = sum(max(d.values()) for d in dur) + sum(comm_max)
        integral = all(_is_int(x) for x in all_vals)
        if integral and safe <= 1e8:
            scale = 1.0
        else:
            scale = min(1e6 / max(lb, 1e-9), 1e8 / max(safe, 1e-9))
        self.scale = scale
        self.exact = integral and scale == 1.0

        def units(x: float) -> int:
            if self.exact:
                return int(round(x))
            return int(math.ceil(x * scale - 1e-9))

        self.units = units
        H = max(1, units(safe) + len(all_vals) + 1)
        self.horizon = H
        # every item on a chain is rounded up by < 1 unit
        self.rounding_units = 0 if self.exact else n + len(tensors) * max(1, nd - 1)
        m = self.model = cp_model.CpModel()
        self.transfer_vars, self.same_vars, self.item_hint_vars = {}, [], {}
        self.recv, self.recv_info, self.units_info, self.aggregated = {}, {}, [], False
        self.memory_active = False
        self.sym_groups = symmetric_groups(cl)
        mem_free = memory_balance is None and (not use_memory or sum(static_bytes(op) for op in ops) + max(
            (op.output_bytes + op.temporary_bytes for op in ops), default=0) <= min(d.memory for d in devs))
        # No communication, identical devices, no memory, no colocation: a
        # cumulative of capacity nd is exact (interval graphs colour greedily).
        self.pure = (nd > 1 and not tensors and mem_free and len(allowed_item) == n
                     and all(len(al) == nd for al in allowed_item.values())
                     and any(len(grp) == nd for grp in self.sym_groups))
        if self.pure:
            self._build_pure(units, H)
            return
        if not symmetry:
            self.sym_groups = []

        # placement literals
        x: list[dict[int, object]] = [None] * n
        item_lits: dict[int, dict[int, object]] = {}
        for it, al in allowed_item.items():
            al = sorted(al)
            if len(al) == 1:
                lit = m.new_constant(1)
                lits = {al[0]: lit}
                hint_vars = []
            elif len(al) == 2:
                b = m.new_bool_var(f"b{it}")
                lits = {al[0]: b.Not(), al[1]: b}
                hint_vars = [(b, al[1])]
            else:
                lits = {k: m.new_bool_var(f"x{it}_{k}") for k in al}
                m.add_exactly_one(lits.values())
                hint_vars = [(v, k) for k, v in lits.items()]
            self.item_hint_vars[it] = hint_vars
            item_lits[it] = lits
        for i in range(n):
            x[i] = {k: item_lits[item_of[i]][k] for k in dur[i] if k in item_lits[item_of[i]]}
        self.x, self.item_lits = x, item_lits

        start = [m.new_int_var(0, H, f"s{i}") for i in range(n)]
        end = [m.new_int_var(0, H, f"e{i}") for i in range(n)]
        self.ms_min = min(H, int(math.ceil(lb * scale - 1e-6)))
        makespan = m.new_int_var(self.ms_min, H, "makespan")
        self.start, self.end, self.makespan = start, end, makespan
        size = [{k: units(t) for k, t in dur[i].items() if k in x[i]} for i in range(n)]
        self.size = size
        per_dev: list[list] = [[] for _ in range(nd)]
        load: list[list] = [[] for _ in range(nd)]
        fastest_iv = []
        for i in range(n):
            sizes = set(size[i].values())
            if len(x[i]) == 1:
                (k, lit), = x[i].items()
                iv = m.new_interval_var(start[i], size[i][k], end[i], f"iv{i}")
                per_dev[k].append(iv)
                load[k].append(size[i][k])
                fastest_iv.append(iv)
                continue
            if len(sizes) == 1:
                m.add(end[i] == start[i] + next(iter(sizes)))
            for k, lit in x[i].items():
                iv = m.new_optional_interval_var(start[i], size[i][k], end[i], lit, f"iv{i}_{k}")
                per_dev[k].append(iv)
                load[k].append(size[i][k] * lit)
            mn = min(sizes)
            fastest_iv.append(m.new_interval_var(start[i], mn, start[i] + mn, f"fiv{i}"))
        for k in range(nd):
            if len(per_dev[k]) > 1:
                m.add_no_overlap(per_dev[k])
            if load[k]:
                m.add(makespan >= sum(load[k]))
        if nd > 1 and n > nd:
            m.add_cumulative(fastest_iv, [1] * n, nd)
        for i in range(n):
            m.add(makespan >= end[i])

        # precedence and communication
        succ = g.succ_idx()
        for u in range(n):
            for c in succ[u]:
                m.add(start[c] >= end[u])
        if self.contended:
            self._comm_contended(ttime)
        else:
            self._comm_free(ttime)

        if nd > 1 and self.cuts:
            self._energy(ttime)

        # memory
        if use_memory:
            self._memory(memory_balance)

        # symmetry breaking
        if self.sym_groups:
            self._symmetry()

        m.minimize(makespan)

    def _energy(self, ttime):
        """Redundant energy cuts with communication (valid for every plan).

        After ``u`` ends, its descendants need ``W`` units of work; on the
        ``nd - 1`` devices other than ``u``'s none of them can start before
        ``end_u + delta_u`` (a child elsewhere waits for its transfer, a child
        on ``u``'s device runs first), so
        ``nd * makespan >= nd * end_u + W + (nd - 1) * delta_u``; symmetrically
        for the ancestors of ``v`` before ``start_v``. Cumulative reasoning
        alone does not see the transfer gap.
        """
        g, m, x = self.graph, self.model, self.x
        n, nd = g.num_ops, len(self.cluster.devices)
        succ, pred = g.succ_idx(), g.pred_idx()
        minsize = [min(sz.values()) for sz in self.size]
        tb = {name: b for (name, _, b, _) in self.tensors}

        def comm(u, c):
            """Least transfer delay of edge u -> c between distinct devices."""
            if self.item_of[u] == self.item_of[c]:
                return math.inf  # always on one device
            bs = [tb[t] for t in g.edge(g.names[u], g.names[c]).tensors if t in tb]
            if not bs:
                return 0
            return min((max(self.units(ttime(a, k, b)) for b in bs) for a in x[u] for k in x[c] if a != k),
                       default=math.inf)

        topo = g.topo_idx()
        desc = [0] * n
        for i in reversed(topo):
            for j in succ[i]:
                desc[i] |= desc[j] | (1 << j)
        anc = [0] * n
        for i in topo:
            for j in pred[i]:
                anc[i] |= anc[j] | (1 << j)

        def work(mask):
            w, k = 0, 0
            while mask:
                if mask & 1:
                    w += minsize[k]
                mask >>= 1
                k += 1
            return w
        # per device: the descendants (ancestors) of u placed on device k run
        # one after another after end_u (+ delta_u when u is elsewhere) / before
        # start_u (- delta'_u); bounded number of terms
        budget = 150_000
        order = sorted(range(n), key=lambda u: -(bin(desc[u]).count("1") + bin(anc[u]).count("1")))
        bits = lambda mask: [k for k in range(n) if (mask >> k) & 1]  # noqa: E731
        for u in order:
            du = min((min(comm(u, c), minsize[c]) for c in succ[u]), default=0)
            dv = min((min(comm(p, u), minsize[p]) for p in pred[u]), default=0)
            for mask, after, gap in ((desc[u], True, du), (anc[u], False, dv)):
                members = bits(mask)
                if not members or budget <= 0:
                    continue
                for k, lit in x[u].items():
                    terms = [self.size[d][k] * x[d][k] for d in members if k in x[d]]
                    if not terms:
                        continue
                    budget -= 2 * len(terms)
                    load = sum(terms)
                    if after:
                        m.add(self.makespan >= self.end[u] + load).only_enforce_if(lit)
                        if len(x[u]) > 1 and gap:
                            m.add(self.makespan >= self.end[u] + gap + load).only_enforce_if(lit.Not())
                    else:
                        m.add(self.start[u] >= load).only_enforce_if(lit)
                        if len(x[u]) > 1 and gap:
                            m.add(self.start[u] >= gap + load).only_enforce_if(lit.Not())
                # devices u cannot use: its descendants/ancestors there always pay the gap
                for k in range(nd):
                    if k in x[u] or not gap:
                        continue
                    terms = [self.size[d][k] * x[d][k] for d in members if k in x[d]]
                    if terms:
                        budget -= len(terms)
                        if after:
                            m.add(self.makespan >= self.end[u] + gap + sum(terms))
                        else:
                            m.add(self.start[u] >= gap + sum(terms))
        for u in range(n):
            if succ[u]:
                w = work(desc[u])
                du = min(min(comm(u, c), minsize[c]) for c in succ[u])
                if w and (du or w > minsize[u]):
                    m.add(nd * self.makespan >= nd * self.end[u] + w + (nd - 1) * du)
            if pred[u]:
                w = work(anc[u])
                dv = min(min(comm(p, u), minsize[p]) for p in pred[u])
                if w:
                    m.add(nd * self.start[u] >= w + (nd - 1) * dv)

    def _build_pure(self, units, H):
        g, m = self.graph, self.model
        n, nd = g.num_ops, len(self.cluster.devices)
        self.x = [dict.fromkeys(range(nd)) for _ in range(n)]
        self.item_lits = {}
        self.size = [{k: units(t) for k, t in self.dur[i].items()} for i in range(n)]
        self.ms_min = min(H, int(math.ceil(self.lb * self.scale - 1e-6)))
        makespan = m.new_int_var(self.ms_min, H, "makespan")
        start = [m.new_int_var(0, H, f"s{i}") for i in range(n)]
        end = [m.new_int_var(0, H, f"e{i}") for i in range(n)]
        ivs = [m.new_interval_var(start[i], self.size[i][0], end[i], f"iv{i}") for i in range(n)]
        m.add_cumulative(ivs, [1] * n, nd)
        for u, ss in enumerate(g.succ_idx()):
            for c in ss:
                m.add(start[c] >= end[u])
        for i in range(n):
            m.add(makespan >= end[i])
        m.minimize(makespan)
        self.start, self.end, self.makespan = start, end, makespan

    def _colour(self, st, en, topo_pos):
        """Devices for a cumulative schedule: greedy interval colouring by start."""
        nd = len(self.cluster.devices)
        free = [0] * nd
        dev = {}
        for i in sorted(range(len(st)), key=lambda i: (st[i], en[i], topo_pos[i])):
            ok = [k for k in range(nd) if free[k] <= st[i]]
            k = min(ok, key=lambda k: (-free[k], k)) if ok else min(range(nd), key=lambda k: free[k])
            dev[i] = k
            free[k] = max(free[k], en[i])
        return dev

    def _recv(self, name, u, e, cs):
        """The (cached) receive literal of tensor ``name`` on device ``e``."""
        y = self.recv.get((name, e))
        if y is None:
            y = self.recv[(name, e)] = self._recv_literal(name, u, e, cs)
            self.recv_info[(name, e)] = (u, cs)
        return y

    def _recv_literal(self, name, u, e, cs):
        """Literal y: tensor sent to device e iff producer not on e and a consumer is."""
        m, x = self.model, self.x
        y = m.new_bool_var(f"y{name}@{e}")
        xu = x[u].get(e)
        cons_lits = [x[c][e] for c in cs if e in x[c]]
        for lc in cons_lits:
            m.add_bool_or([lc.Not(), y] + ([xu] if xu is not None else []))
        if xu is not None:
            m.add_implication(y, xu.Not())
        m.add_bool_or([y.Not()] + cons_lits)
        return y

    def _comm_contended(self, ttime):
        """Transfer intervals on link resources.

        A *unit* is what one interval carries: one tensor, or (aggregated) all
        tensors of one producer bound for one device, sent back to back as the
        simulator does (they are requested at the same instant); its size is
        the sum over the tensors actually sent, and a consumer then waits for
        the whole unit (slightly pessimistic, much smaller model)."""
        m, x, units = self.model, self.x, self.units
        cl = self.cluster
        start, end, H = self.start, self.end, self.horizon
        by_producer: dict[int, list] = {}
        for tinfo in self.tensors:
            by_producer.setdefault(tinfo[1], []).append(tinfo)
        n_single = sum(len(set().union(*(set(x[c]) for c in cs)) - ({next(iter(x[u]))} if len(x[u]) == 1 else set()))
                       for (_, u, _, cs) in self.tensors)
        agg = self.aggregate if self.aggregate is not None else n_single > 400
        self.aggregated = agg
        groups = list(by_producer.items()) if agg else [(t[1], [t]) for t in self.tensors]
        link_ivs: dict[str, list] = {}
        self.units_info = []
        for u, tens in groups:
            srcs = sorted(x[u])
            dests = sorted(set().union(*(set(x[c]) for (_, _, _, cs) in tens for c in cs)))
            for e in dests:
                if srcs == [e]:
                    continue
                mine = [(name, b, cs) for (name, _, b, cs) in tens if any(e in x[c] for c in cs)]
                ys = [(self._recv(name, u, e, cs), name, b, cs) for (name, b, cs) in mine]
                key = (u, e) if agg else (mine[0][0], e)
                if len(ys) == 1:
                    Y = ys[0][0]
                else:
                    Y = m.new_bool_var(f"Y{u}@{e}")
                    for y, *_ in ys:
                        m.add_implication(y, Y)
                    m.add_bool_or([Y.Not()] + [y for y, *_ in ys])
                ts = m.new_int_var(0, H, f"ts{key}")
                te = m.new_int_var(0, H, f"te{key}")
                m.add(ts >= end[u])
                sizes = {}
                zs = []
                size_exprs = {}
                for a in srcs:
                    if a == e:
                        continue
                    coeffs = tuple(units(ttime(a, e, b)) for (_, _, b, _) in ys)
                    if len(ys) == 1:
                        size = coeffs[0]
                    elif coeffs in size_exprs:
                        size = size_exprs[coeffs][0]
                    else:
                        size = m.new_int_var(0, sum(coeffs), f"sz{key}@{a}")
                        m.add(size == sum(cf * y for cf, (y, *_) in zip(coeffs, ys)))
                        size_exprs[coeffs] = (size, coeffs)
                    sizes[a] = size
                    if len(srcs) == 1 or (len(srcs) == 2 and e in srcs):
                        z = Y
                    else:
                        z = m.new_bool_var(f"z{key}@{a}")
                        m.add_implication(z, Y)
                        m.add_implication(z, x[u][a])
                        m.add_bool_or([z, Y.Not(), x[u][a].Not()])
                    zs.append((z, a))
                    iv = m.new_optional_interval_var(ts, size, te, z, f"t{key}@{a}>{e}")
                    for l in cl.route(cl.devices[a].name, cl.devices[e].name).links:
                        link_ivs.setdefault(l, []).append(iv)
                distinct = {id(v) if not isinstance(v, int) else v for v in sizes.values()}
                fixed_size = None
                if len(distinct) == 1:
                    fixed_size = next(iter(sizes.values()))
                    m.add(te == ts + fixed_size)
                done = set()
                for y, name, b, cs in ys:
                    for c in cs:
                        if e in x[c] and c not in done:
                            done.add(c)
                            m.add(start[c] >= te).only_enforce_if([x[c][e], y])
                self.transfer_vars[key] = (Y, ts, te)
                self.units_info.append(dict(key=key, u=u, e=e, Y=Y, own_Y=len(ys) > 1, ts=ts, te=te, zs=zs,
                                            fixed_size=fixed_size,
                                            size_vars=[v for v in size_exprs.values()],
                                            tensors=[(name, b, cs) for _, name, b, cs in ys]))
        for ivs in link_ivs.values():
            if len(ivs) > 1:
                m.add_no_overlap(ivs)

    def _comm_free(self, ttime):
        m, x, units = self.model, self.x, self.units
        g = self.graph
        start, end = self.start, self.end
        tinfo = {name: (u, b) for (name, u, b, cs) in self.tensors}
        item_of = self.item_of
        for e in g.edges:
            u, c = g.index[e.src], g.index[e.dst]
            if item_of[u] == item_of[c]:
                continue
            bs = [tinfo[t][1] for t in e.tensors if t in tinfo]
            if not bs:
                continue
            pairs = {(a, k): units(max(ttime(a, k, b) for b in bs))
                     for a in x[u] for k in x[c] if a != k}
            if not pairs:
                continue
            delays = set(pairs.values())
            if len(delays) == 1:
                D = delays.pop()
                if D == 0:
                    continue
                same = m.new_bool_var(f"same{u}_{c}")
                for a, la in x[u].items():
                    lc = x[c].get(a)
                    m.add_bool_or([same.Not(), la.Not()] + ([lc] if lc is not None else []))
                m.add(start[c] - end[u] + D * same >= D)
                self.same_vars.append((same, u, c))
            else:
                for (a, k), D in pairs.items():
                    if D > 0:
                        m.add(start[c] >= end[u] + D).only_enforce_if([x[u][a], x[c][k]])

    def _memory(self, balance):
        g, cl, m, x = self.graph, self.cluster, self.model, self.x
        ops = g.ops
        devs = cl.devices
        static = self.memory_mode == "static"
        held = static_bytes if static else (lambda op: op.persistent_bytes)
        peak = (lambda op: op.temporary_bytes) if static else (lambda op: op.output_bytes + op.temporary_bytes)
        recv_total = sum(b * min(len(cs), len(devs) - 1) for (_, _, b, cs) in self.tensors) if static else 0
        total = sum(held(op) for op in ops) + recv_total + max((peak(op) for op in ops), default=0)
        if total <= min(d.memory for d in devs) and balance is None:
            return
        self.memory_active = True
        unit = max(1, max(d.memory for d in devs) >> 30)  # keep coefficients below ~2^30

        def up(b):
            return -(-b // unit)
        terms = [[] for _ in devs]
        for i, op in enumerate(ops):
            sb = up(held(op))
            if sb:
                for k, lit in x[i].items():
                    terms[k].append(sb * lit)
        static_terms = [list(t) for t in terms]
        for (name, u, b, cs) in (self.tensors if static else ()):
            for e in sorted(set().union(*(set(x[c]) for c in cs))):
                if sorted(x[u]) == [e]:
                    continue
                terms[e].append(up(b) * self._recv(name, u, e, cs))
        for k, d in enumerate(devs):
            temps = [(up(peak(op)), x[i][k]) for i, op in enumerate(ops) if peak(op) and k in x[i]]
            cap = d.memory // unit
            if temps:
                tmax = m.new_int_var(0, max(t for t, _ in temps), f"tmax{k}")
                for t, lit in temps:
                    m.add(tmax >= t).only_enforce_if(lit)
                terms[k].append(tmax)
            if terms[k]:
                m.add(sum(terms[k]) <= cap)
        if balance is not None:
            tot = sum(up(held(op)) for op in ops)
            bound = int(math.floor((1.0 + balance) * tot / len(devs)))
            for k in range(len(devs)):
                if static_terms[k]:
                    m.add(sum(static_terms[k]) <= bound)
        self.memory_unit = unit

    def _symmetry(self):
        m = self.model
        topo_pos = {i: r for r, i in enumerate(self.graph.topo_idx())}
        first: dict[int, int] = {}
        for i in range(self.graph.num_ops):
            it = self.item_of[i]
            first[it] = min(first.get(it, topo_pos[i]), topo_pos[i])
        items = sorted(self.item_lits, key=lambda it: first[it])
        self.sym_aux = []  # (literal, items so far, device): hint = some of them is there
        for grp in self.sym_groups:
            mine = [it for it in items if all(k in self.item_lits[it] for k in grp)]
            if not mine:
                continue
            prev = None  # prev[j]: some earlier item is on grp[j]
            for r, it in enumerate(mine):
                lits = self.item_lits[it]
                cur = []
                for j, k in enumerate(grp):
                    if j > 0:
                        if prev is None:
                            m.add_bool_or([lits[k].Not()])
                        else:
                            m.add_implication(lits[k], prev[j - 1])
                    if r == len(mine) - 1:
                        continue
                    if prev is None:
                        cur.append(lits[k])
                    else:
                        u = m.new_bool_var(f"u{it}_{k}")
                        m.add_bool_or([u.Not(), prev[j], lits[k]])
                        m.add_implication(prev[j], u)
                        m.add_implication(lits[k], u)
                        cur.append(u)
                        self.sym_aux.append((u, mine[:r + 1], k))
                prev = cur

    # -- hints ---------------------------------------------------------------
    def canonical(self, placement: Mapping[str, str]) -> dict[str, str]:
        """Relabel devices inside each symmetric group in first-use order."""
        if not self.sym_groups:
            return dict(placement)
        names, devs = self.graph.names, self.cluster.devices
        topo_pos = {i: r for r, i in enumerate(self.graph.topo_idx())}
        seq = sorted(range(len(names)), key=lambda i: topo_pos[i])
        mapping: dict[str, str] = {}
        for grp in self.sym_groups:
            gnames = [devs[k].name for k in grp]
            used = []
            for i in seq:
                d = placement[names[i]]
                if d in gnames and d not in used:
                    used.append(d)
            rest = [d for d in gnames if d not in used]
            for old, new in zip(used + rest, gnames):
                mapping[old] = new
        return {op: mapping.get(d, d) for op, d in placement.items()}

    def set_hint(self, plan: Plan) -> bool:
        """Replace the model's hints by ``plan`` (placement, order, and times
        recomputed in model units). Returns False if the plan does not fit."""
        g, cl, m = self.graph, self.cluster, self.model
        m.clear_hints()
        names, devs = g.names, cl.devices
        try:
            if not plan.has_times:
                plan = simulate(g, cl, plan).to_plan(placer=plan.placer)
            placement = self.canonical(plan.placement)
            dev = [cl.index[placement[nm]] for nm in names]
            if any(dev[i] not in self.x[i] for i in range(len(names))):
                return False
            # the plan's per-device order, mapped through the relabelling
            seq = sorted(range(len(names)), key=lambda i: (plan.start[names[i]], plan.finish[names[i]]))
            st, en = self._int_schedule(dev, seq)
        except (KeyError, InvalidPlanError, RuntimeError, TypeError):
            return False  # not a plan of this graph and cluster: solve without it
        for it, hv in self.item_hint_vars.items():
            for var, k in hv:
                m.add_hint(var, dev[it] == k)
        for i in range(len(names)):
            m.add_hint(self.start[i], st[i])
            m.add_hint(self.end[i], en[i])
        for var, its, k in getattr(self, "sym_aux", ()):
            m.add_hint(var, any(dev[it] == k for it in its))
        ms = max(en, default=0)
        for (name, e), y in self.recv.items():
            u, cs = self.recv_info[(name, e)]
            m.add_hint(y, dev[u] != e and any(dev[c] == e for c in cs))
        for info in self.units_info:
            u, e = info["u"], info["e"]
            sent = [(name, b) for name, b, cs in info["tensors"] if dev[u] != e and any(dev[c] == e for c in cs)]
            got = self._xfer_hint.get(info["key"])
            if info["own_Y"]:
                m.add_hint(info["Y"], got is not None)
            for z, a in info["zs"]:
                if z is not info["Y"]:
                    m.add_hint(z, got is not None and dev[u] == a)
            size_hint = 0
            for var, coeffs in info["size_vars"]:
                val = sum(cf for cf, (name, b, cs) in zip(coeffs, info["tensors"])
                          if dev[u] != e and any(dev[c] == e for c in cs))
                m.add_hint(var, val)
                size_hint = val
            if got is not None:
                m.add_hint(info["ts"], got[0])
                m.add_hint(info["te"], got[1])
                ms = max(ms, got[1])
            else:
                fs = info["fixed_size"]
                m.add_hint(info["ts"], en[u])
                m.add_hint(info["te"], en[u] + (fs if isinstance(fs, int) else size_hint if fs is not None else 0))
        for same, u, c in self.same_vars:
            m.add_hint(same, dev[u] == dev[c])
        m.add_hint(self.makespan, max(ms, self.ms_min))
        self.hint_units = ms
        return True

    def _int_schedule(self, dev, seq):
        """Left-shifted schedule in model units of a placement and an op
        sequence (per device in that order; transfers on links in request
        order). Feasible for the model whatever the sequence's times were."""
        g, cl = self.graph, self.cluster
        n = g.num_ops
        devs = cl.devices
        pred = g.pred_idx()
        units_of: dict[int, list] = {}
        for info in self.units_info:
            units_of.setdefault(info["u"], []).append(info)
        edge_delay = {}
        if not self.contended:
            for e in g.edges:
                u, c = g.index[e.src], g.index[e.dst]
                if dev[u] != dev[c] and self.item_of[u] != self.item_of[c]:
                    ts = [g.tensor(t).bytes for t in e.tensors if g.tensor(t).bytes > 0]
                    if ts:
                        r = cl.route(devs[dev[u]].name, devs[dev[c]].name)
                        edge_delay[(u, c)] = max(self.units(r.time(b)) for b in ts)
        st, en = [0] * n, [0] * n
        arrive: dict[tuple, int] = {}
        dev_free = [0] * len(devs)
        link_free: dict[str, int] = {}
        self._xfer_hint = {}
        done = [False] * n
        pending = list(seq)
        # process in the given sequence, but never before predecessors (robust to ties)
        while pending:
            rest = []
            for i in pending:
                if not all(done[p] for p in pred[i]):
                    rest.append(i)
                    continue
                t = dev_free[dev[i]]
                for p in pred[i]:
                    t = max(t, en[p] + edge_delay.get((p, i), 0), arrive.get((p, i), 0))
                st[i], en[i] = t, t + self.size[i][dev[i]]
                dev_free[dev[i]] = en[i]
                done[i] = True
                if self.contended:
                    for info in units_of.get(i, ()):
                        e = info["e"]
                        sent = [b for name, b, cs in info["tensors"] if e != dev[i] and any(dev[c] == e for c in cs)]
                        if not sent:
                            continue
                        r = cl.route(devs[dev[i]].name, devs[e].name)
                        s = max([en[i]] + [link_free.get(l, 0) for l in r.links])
                        f = s + sum(self.units(r.time(b)) for b in sent)
                        for l in r.links:
                            link_free[l] = f
                        self._xfer_hint[info["key"]] = (s, f)
                        for name, b, cs in info["tensors"]:
                            for c in cs:
                                if dev[c] == e:
                                    arrive[(i, c)] = max(arrive.get((i, c), 0), f)
            if len(rest) == len(pending):
                raise RuntimeError("hint order contradicts the graph")
            pending = rest
        return st, en

    # -- solving -------------------------------------------------------------
    def solve(self, *, time_limit: float = 60, workers: int | None = None, seed: int = 0,
              hint: Plan | None = None, log: bool = False) -> Plan:
        """Solve (again) and return the Plan; see :func:`place_cpsat`."""
        t0 = time.perf_counter() - self.build_time
        g, cl = self.graph, self.cluster
        rejected = None
        if hint is not None and not self.set_hint(hint):
            rejected, hint = hint.placer or "plan", None  # not a valid plan here
        if hint is None:
            hint = greedy_plan(g, cl)
            self.set_hint(hint)
        hinted = True
        solver = cp_model.CpSolver()
        p = solver.parameters
        p.max_time_in_seconds = float(time_limit)
        p.num_workers = int(workers or os.cpu_count() or 1)
        p.random_seed = int(seed)
        p.log_search_progress = bool(log)
        # Stronger cumulative reasoning: closes P|prec|Cmax bounds (STG) that the
        # default propagation leaves open; cheap on these model sizes.
        p.use_timetable_edge_finding_in_cumulative = True
        p.use_overload_checker_in_cumulative = True
        p.use_hard_precedences_in_cumulative = True
        if len(self.model.proto.variables) > 3000:
            # on big (coarse DNN) models probing costs seconds before the first
            # solution and rarely pays back within a minute
            p.cp_model_probing_level = 0
        code = solver.solve(self.model)
        if code == cp_model.MODEL_INVALID:  # a bug, not a time-out: say it loudly
            raise RuntimeError(f"CP-SAT model invalid: {self.model.validate()} (hint used: {hinted})")
        status = _STATUS.get(code, "unknown")
        scale = self.scale
        stats = {"hint_rejected": rejected} if rejected else {}
        stats |= {"cpsat_status": solver.status_name(code), "scale": scale, "exact_units": self.exact,
                 "horizon_units": self.horizon, "rounding_error_us": self.rounding_units / scale,
                 "explicit_lower_bound": self.lb, "hint_used": hint.placer or "plan", "workers": p.num_workers,
                 "contended_model": self.contended, "pure_cumulative": self.pure,
                 "aggregated_transfers": self.aggregated, "memory_constraints": self.memory_active,
                 "symmetric_groups": [[cl.devices[k].name for k in grp] for grp in self.sym_groups],
                 "num_variables": len(self.model.proto.variables),
                 "num_constraints": len(self.model.proto.constraints),
                 "solve_time": solver.wall_time, "build_time": self.build_time}
        if status in ("optimal", "feasible"):
            bound = solver.best_objective_bound
            lb = max(self.lb, (bound - self.rounding_units) / scale)
            if self.aggregated:
                # a restriction of the problem (consumers wait for the whole
                # batch): its bound and optimality do not carry over
                lb = self.lb
                if status == "optimal":
                    status = "feasible"
                stats["restricted_model"] = "aggregated transfers"
            model_ms = solver.objective_value / scale
            names, devs = g.names, cl.devices
            topo_pos = {i: r for r, i in enumerate(g.topo_idx())}
            if self.pure:
                dev = self._colour([solver.value(v) for v in self.start], [solver.value(v) for v in self.end],
                                   topo_pos)
            else:
                dev = {}
                for i in range(g.num_ops):
                    for k, lit in self.x[i].items():
                        if solver.boolean_value(lit):
                            dev[i] = k
            placement = {names[i]: devs[dev[i]].name for i in range(g.num_ops)}
            seq = sorted(range(g.num_ops), key=lambda i: (solver.value(self.start[i]), solver.value(self.end[i]),
                                                          topo_pos[i]))
            order = [names[i] for i in seq]
            stats.update(model_makespan=model_ms, best_bound_units=bound,
                         model_status=_STATUS.get(code, "unknown"))
            plan = finalize(g, cl, placement, order=order, placer="cpsat", t0=t0, status=status,
                            lower_bound=lb, stats=stats)
            tol = 1e-6 * max(1.0, model_ms)
            if plan.status != "infeasible" and plan.makespan > model_ms + tol:
                # FCFS links in the simulator lost against the model's free link order
                plan = plan.replace(status="feasible", stats={**plan.stats, "simulated_above_model": True})
            return plan
        # no solution: fall back to the hint's plan, saying so
        why = "model proved infeasible" if status == "infeasible" else "no solution within the time limit"
        if status == "infeasible" and hint is None:
            raise InfeasibleError("no placement satisfies the static memory model", culprit="memory")
        sched = simulate(g, cl, hint) if not hint.has_times else None
        base = sched.to_plan(placer=hint.placer) if sched is not None else hint
        stats.update(fallback=why, fallback_placer=hint.placer)
        return base.replace(placer="cpsat", lower_bound=self.lb,
                            status="infeasible" if status == "infeasible" else (
                                base.status if base.status in ("heuristic", "infeasible") else "unknown"),
                            wall_time=time.perf_counter() - t0, stats={**dict(base.stats), **stats})


def place_cpsat(graph: OpGraph, cluster: Cluster, *, time_limit: float = 60, workers: int | None = None,
                seed: int = 0, hint: Plan | None = None, memory_balance: float | None = None,
                log: bool = False, contention: bool = True, symmetry: bool = True,
                aggregate: bool | None = None, memory=True, **_ignored) -> Plan:
    """Optimal (or best found) placement and schedule by CP-SAT.

    Parameters
    ----------
    graph, cluster
    time_limit : float
        Seconds for the search (model building not included).
    workers : int, optional
        CP-SAT search workers; default the number of CPUs.
    seed : int
    hint : Plan, optional
        A plan to start from (placement + order); default a greedy list schedule.
        If the search finds nothing in time, this plan is returned with
        ``stats["fallback"]``.
    memory_balance : float, optional
        Bound each device's static held bytes by ``(1 + memory_balance)`` x mean.
    log : bool
        Print CP-SAT's search log.
    contention : bool
        Model link congestion (False: contention-free model, faster; the plan is
        still simulated with contention).
    symmetry, aggregate, memory : see :class:`CpsatModel`. When the static
        memory model is infeasible, the search is repeated once with
        ``memory="persistent"`` (``stats["memory_model"]`` says which held).
        When transfers were aggregated automatically and that model was solved
        to optimality with time left, the exact per-tensor model continues from
        its plan for the rest of the time to prove a valid bound
        (``stats["phases"]``).

    Returns
    -------
    Plan
        ``status`` optimal / feasible / infeasible / unknown (or the fallback's);
        ``lower_bound`` = max(CP-SAT's bound, explicit bound), valid for the
        true (unrounded) times; ``stats`` has model figures.

    Raises
    ------
    InfeasibleError
        From the pre-checks (culprit named), or the model is infeasible and no hint exists.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 10), ("a", "c", 10)])
    >>> p = place_cpsat(g, gpus(2, beta=(1.0, 0.0)), time_limit=10, workers=1)
    >>> p.status, p.makespan
    ('optimal', 6.0)
    """
    t0 = time.perf_counter()

    def run(mem, agg, hint_plan, limit):
        model = CpsatModel(graph, cluster, contention=contention, memory_balance=memory_balance,
                           symmetry=symmetry, aggregate=agg, memory=mem)
        return model, model.solve(time_limit=limit, workers=workers, seed=seed, hint=hint_plan, log=log)

    def left():
        return time_limit - (time.perf_counter() - t0)

    model, plan = run(memory, aggregate, hint, time_limit)
    mem_note = model.memory_mode
    if plan.stats.get("fallback") == "model proved infeasible" and model.memory_mode == "static":
        # The static bound holds every activation all step; retry with the
        # persistent bound and let the simulated liveness peak judge the plan.
        model, plan = run("persistent", aggregate, hint, max(1.0, left()))
        mem_note = "persistent (static model infeasible)"
    if (aggregate is None and model.aggregated and plan.stats.get("model_status") == "optimal"
            and left() >= 1.0):
        # The aggregated model is a restriction; with time left, the exact
        # per-tensor model starts from its plan to prove a valid bound.
        _, exact = run(model.memory_mode, False, plan, left())
        lb = max(plan.lower_bound, exact.lower_bound if "fallback" not in exact.stats else plan.lower_bound)
        best = exact if "fallback" not in exact.stats and exact.makespan <= plan.makespan + 1e-9 else plan
        status = best.status if best is exact else "feasible"
        plan = best.replace(lower_bound=lb, status=status, stats={
            **best.stats, "phases": {"aggregated": plan.makespan, "exact": exact.makespan,
                                     "exact_status": exact.stats.get("model_status")}})
    return plan.replace(stats={**plan.stats, "memory_model": mem_note}, wall_time=time.perf_counter() - t0)
