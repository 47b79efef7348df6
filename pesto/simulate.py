"""Discrete-event simulator of one training step with TensorFlow's semantics.

* an op starts when all its inputs have arrived on its device and the device
  is free; a device runs one op at a time;
* a tensor is sent once per (tensor, remote device) however many consumers
  it has there; the transfer is requested when its producer ends;
* each link resource carries one transfer at a time, first come first served
  (a transfer holds every link of its route); in a contention-free cluster
  transfers never queue;
* a device runs its ops either in the plan's fixed order (``mode="order"``)
  or, TF's default, in the order they became ready (``mode="fifo"``).

:func:`simulate` returns a :class:`Schedule`: makespan, op and transfer times,
busy fractions, peak memory; it converts to a :class:`~pesto.plan.Plan`, a
Chrome trace (Perfetto, chrome://tracing) and a matplotlib Gantt chart.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 0), ("a", "c", 0)])
>>> c = gpus(2, beta=(1.0, 0.0))
>>> s = simulate(g, c, {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"})
>>> s.makespan
6.0
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import Mapping

from .cluster import Cluster
from .errors import InvalidPlanError
from .graph import OpGraph
from .plan import Plan, Transfer, memory_profile

__all__ = ["Schedule", "simulate"]


@dataclass
class Schedule:
    """The outcome of one simulated step (times in µs)."""

    graph: OpGraph
    cluster: Cluster
    placement: dict
    start: dict
    finish: dict
    transfers: list
    makespan: float
    order: dict
    mode: str
    peak_memory: dict = field(default_factory=dict)

    def busy(self) -> dict[str, float]:
        """Fraction of the makespan each device and link is busy."""
        if self.makespan <= 0:
            return {}
        out = {d.name: 0.0 for d in self.cluster.devices}
        for op, d in self.placement.items():
            out[d] += self.finish[op] - self.start[op]
        for t in self.transfers:
            for link in self.cluster.route(t.src, t.dst).links:
                out[link] = out.get(link, 0.0) + t.finish - t.start
        return {k: v / self.makespan for k, v in out.items()}

    def to_plan(self, placer: str = "simulated", **kw) -> Plan:
        """The schedule as a Plan with times (order = the order ops ran in)."""
        kw.setdefault("status", "heuristic")
        return Plan(self.placement, self.order, start=self.start, finish=self.finish,
                    transfers=tuple(self.transfers), makespan=self.makespan,
                    peak_memory=self.peak_memory, placer=placer, **kw)

    def chrome_trace(self, path=None):
        """Chrome trace-event JSON: one row per device and per link."""
        rows = {d.name: i for i, d in enumerate(self.cluster.devices)}
        events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "devices"}},
                  {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "links"}}]
        for d, i in rows.items():
            events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": i, "args": {"name": d}})
        for op, d in self.placement.items():
            o = self.graph.op(op)
            events.append({"ph": "X", "name": op, "cat": o.type or "op", "pid": 0, "tid": rows[d],
                           "ts": self.start[op], "dur": self.finish[op] - self.start[op],
                           "args": {"scope": o.scope}})
        links = {}
        for t in self.transfers:
            for link in self.cluster.route(t.src, t.dst).links:
                tid = links.setdefault(link, len(links))
                events.append({"ph": "X", "name": t.tensor, "cat": "transfer", "pid": 1, "tid": tid,
                               "ts": t.start, "dur": t.finish - t.start,
                               "args": {"src": t.src, "dst": t.dst}})
        for link, tid in links.items():
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": link}})
        doc = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is None:
            return doc
        with open(path, "w") as f:
            json.dump(doc, f)

    def gantt(self, path=None, *, title=None, ax=None, max_labels=40):
        """Matplotlib Gantt chart of devices and links; saved to ``path`` if given."""
        import matplotlib
        if path is not None and ax is None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        links = sorted({l for t in self.transfers for l in self.cluster.route(t.src, t.dst).links})
        rows = [d.name for d in self.cluster.devices] + links
        if ax is None:
            fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.5))
        else:
            fig = ax.figure
        y = {r: i for i, r in enumerate(rows)}
        cmap = plt.get_cmap("tab20")
        for k, (op, d) in enumerate(self.placement.items()):
            s, f = self.start[op], self.finish[op]
            ax.barh(y[d], f - s, left=s / 1, height=0.8, color=cmap(k % 20), edgecolor="none")
            if len(self.placement) <= max_labels:
                ax.text(s + (f - s) / 2, y[d], op, ha="center", va="center", fontsize=7)
        for t in self.transfers:
            for link in self.cluster.route(t.src, t.dst).links:
                ax.barh(y[link], t.finish - t.start, left=t.start, height=0.6, color="0.5")
        ax.set_yticks(range(len(rows)), rows)
        ax.invert_yaxis()
        ax.set_xlabel("time (µs)")
        ax.set_title(title or f"{self.graph.name}: step {self.makespan / 1000:.3f} ms ({self.mode})")
        if path is not None:
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
        return ax


def simulate(graph: OpGraph, cluster: Cluster, plan, *, mode: str | None = None,
             memory: bool = True) -> Schedule:
    """Simulate one step of ``graph`` on ``cluster``.

    Parameters
    ----------
    plan : Plan or mapping op -> device
        With a Plan and ``mode`` None, each device follows the plan's order;
        a bare placement runs TF's default (FIFO ready queue).
    mode : {"order", "fifo"}, optional
    memory : bool
        Compute peak memory per device (a little slower).

    Raises
    ------
    InvalidPlanError
        An op is not placed, placed on an unknown device or a kind it does not
        allow, or the order deadlocks (contradicts the DAG).
    """
    if isinstance(plan, Plan):
        placement, order = plan.placement, plan.order
    else:
        placement, order = plan, None
    if mode is None:
        mode = "order" if order is not None else "fifo"
    if mode not in ("order", "fifo"):
        raise ValueError(f"mode must be 'order' or 'fifo', got {mode!r}")
    if mode == "order" and order is None:
        raise ValueError("mode='order' needs a Plan with an order")

    names = graph.names
    n = len(names)
    ops = graph.ops
    dev_names = [d.name for d in cluster.devices]
    dindex = cluster.index
    try:
        dev = [dindex[placement[nm]] for nm in names]
    except KeyError as exc:
        key = exc.args[0]
        if key in graph:
            raise InvalidPlanError([f"op {key!r} is not placed"]) from None
        raise InvalidPlanError([f"unknown device {key!r}"]) from None
    dur = [0.0] * n
    for i, op in enumerate(ops):
        d = cluster.devices[dev[i]]
        if d.kind not in op.kinds:
            raise InvalidPlanError([f"op {op.name!r} is placed on {d.name} of kind {d.kind}, "
                                    f"allowed {sorted(op.kinds)}"])
        dur[i] = op.compute[d.kind] / d.speed

    # Per producer: what to send where. sends[i] = [(tensor, bytes, dst_dev, [consumer idx])]
    index = graph.index
    cons = graph.consumers()
    sends: list = [None] * n
    remote_inputs = [0] * n  # number of (tensor) arrivals each op waits on
    for t in graph.tensors:
        i = index[t.src]
        by_dev: dict[int, list[int]] = {}
        for c in cons[t.name]:
            j = index[c]
            if dev[j] != dev[i] and t.bytes > 0:
                by_dev.setdefault(dev[j], []).append(j)
        if by_dev:
            lst = sends[i]
            if lst is None:
                lst = sends[i] = []
            for d, js in by_dev.items():
                lst.append((t.name, t.bytes, d, js))
    succ = graph.succ_idx()
    waiting = [len(p) for p in graph.pred_idx()]
    ready_at = [0.0] * n

    nd = len(dev_names)
    routes = {}
    link_free: dict[str, float] = {}
    contention_free = cluster.contention_free
    if not contention_free:
        for l in cluster.links:
            link_free[l] = 0.0

    if mode == "order":
        queues = [[index[o] for o in order.get(dn, ())] for dn in dev_names]
        if sum(map(len, queues)) != n:
            raise InvalidPlanError(["the plan's order does not list every op exactly once"])
        for q, dn in zip(queues, dev_names):
            for j in q:
                if dev[j] != dindex[dn]:
                    raise InvalidPlanError([f"op {names[j]!r} is ordered on {dn} but placed on {dev_names[dev[j]]}"])
        qpos = [0] * nd
    else:
        queues = [[] for _ in range(nd)]  # ready FIFO per device (heap of (ready time, seq, op))
        seq = 0
    is_ready = [False] * n
    dev_free = [True] * nd
    start = [0.0] * n
    finish = [0.0] * n
    ran: list[list[int]] = [[] for _ in range(nd)]
    transfers = []
    # events: (time, kind, op); kind 0 = finish, 1 = ready (finishes first at ties)
    events: list = []
    push, pop = heapq.heappush, heapq.heappop
    for i in range(n):
        if waiting[i] == 0:
            push(events, (0.0, 1, i))
    done = 0
    now = 0.0

    def try_start(d, now):
        nonlocal seq
        if not dev_free[d]:
            return
        if mode == "order":
            q = queues[d]
            p = qpos[d]
            if p < len(q) and is_ready[q[p]]:
                i = q[p]
                qpos[d] = p + 1
            else:
                return
        else:
            q = queues[d]
            if not q:
                return
            i = pop(q)[2]
        dev_free[d] = False
        start[i] = now
        f = now + dur[i]
        finish[i] = f
        ran[d].append(i)
        push(events, (f, 0, i))

    while events:
        now, kind, i = pop(events)
        if kind == 1:
            is_ready[i] = True
            d = dev[i]
            if mode == "fifo":
                push(queues[d], (now, seq, i))
                seq += 1
            try_start(d, now)
            continue
        done += 1
        d = dev[i]
        dev_free[d] = True
        # local successors: inputs available now; remote ones wait for the transfer
        arrivals = {}
        lst = sends[i]
        if lst is not None:
            src_name = dev_names[d]
            for tname, nbytes, dd, js in lst:
                key = (d, dd)
                r = routes.get(key)
                if r is None:
                    r = routes[key] = cluster.route(src_name, dev_names[dd])
                length = r.beta0 + r.beta1 * nbytes
                s = now
                if not contention_free:
                    for l in r.links:
                        if link_free[l] > s:
                            s = link_free[l]
                    for l in r.links:
                        link_free[l] = s + length
                f = s + length
                transfers.append(Transfer(tname, src_name, dev_names[dd], s, f))
                for j in js:
                    if f > arrivals.get(j, 0.0):
                        arrivals[j] = f
        for j in succ[i]:
            t = arrivals.get(j, now)
            if t > ready_at[j]:
                ready_at[j] = t
            waiting[j] -= 1
            if waiting[j] == 0:
                push(events, (max(ready_at[j], now), 1, j))
        try_start(d, now)

    if done < n:
        stuck = [dev_names[d] + ": " + names[queues[d][qpos[d]]] for d in range(nd)
                 if mode == "order" and qpos[d] < len(queues[d])]
        raise InvalidPlanError([f"the order deadlocks (it contradicts the graph); waiting heads: {stuck[:4]}"])
    st = dict(zip(names, start))
    fi = dict(zip(names, finish))
    pl = {nm: dev_names[dev[i]] for i, nm in enumerate(names)}
    order_out = {dev_names[d]: [names[i] for i in ran[d]] for d in range(nd) if ran[d]}
    makespan = max(finish, default=0.0)
    if transfers:
        makespan = max(makespan, max(t.finish for t in transfers))
    sched = Schedule(graph, cluster, pl, st, fi, transfers, makespan, order_out, mode)
    if memory:
        sched.peak_memory = memory_profile(graph, cluster, pl, st, fi, transfers)
    return sched
