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

import gc
import heapq
import json
from collections import deque
from dataclasses import dataclass, field

from .cluster import Cluster
from .errors import InvalidPlanError
from .graph import OpGraph
from .memory import timed_peak
from .plan import Plan, Transfer

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
        fields = dict(start=self.start, finish=self.finish, transfers=tuple(self.transfers),
                      makespan=self.makespan, peak_memory=self.peak_memory or None,
                      status="heuristic", placer=placer)
        fields.update(kw)
        return Plan(self.placement, self.order, **fields)

    def chrome_trace(self, path=None):
        """Chrome trace-event JSON (times in µs): one row per device and per
        link; written to ``path`` if given. Returns the document."""
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
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc

    def gantt(self, path=None, *, title=None, ax=None, max_labels=40):
        """Matplotlib Gantt chart of devices and links; saved to ``path`` if given.

        With ``path`` and no ``ax`` the figure is drawn off-screen (no pyplot,
        so the caller's backend is untouched). Returns the Axes.
        """
        import matplotlib

        links = sorted({l for t in self.transfers for l in self.cluster.route(t.src, t.dst).links})
        rows = [d.name for d in self.cluster.devices] + links
        if ax is None:
            size = (12, 0.5 * len(rows) + 1.5)
            if path is not None:
                from matplotlib.figure import Figure
                fig = Figure(figsize=size)
                ax = fig.add_subplot()
            else:
                import matplotlib.pyplot as plt
                fig, ax = plt.subplots(figsize=size)
        else:
            fig = ax.figure
        y = {r: i for i, r in enumerate(rows)}
        cmap = matplotlib.colormaps["tab20"]
        bars: dict[str, tuple[list, list]] = {}
        for k, (op, d) in enumerate(self.placement.items()):
            s, f = self.start[op], self.finish[op]
            spans, colors = bars.setdefault(d, ([], []))
            spans.append((s, f - s))
            colors.append(cmap(k % 20))
            if len(self.placement) <= max_labels:
                ax.text(s + (f - s) / 2, y[d], op, ha="center", va="center", fontsize=7)
        for d, (spans, colors) in bars.items():
            ax.broken_barh(spans, (y[d] - 0.4, 0.8), facecolors=colors, edgecolor="none")
        per_link: dict[str, list] = {}
        for t in self.transfers:
            for link in self.cluster.route(t.src, t.dst).links:
                per_link.setdefault(link, []).append((t.start, t.finish - t.start))
        for link, spans in per_link.items():
            ax.broken_barh(spans, (y[link] - 0.3, 0.6), facecolors="0.5", edgecolor="none")
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0, max(self.makespan, 1e-9) * 1.01)
        ax.set_xlabel("time (µs)")
        ax.set_title(title or f"{self.graph.name}: step {self.makespan / 1000:.3f} ms ({self.mode})")
        if path is not None:
            fig.tight_layout()
            fig.savefig(path, dpi=110)
        return ax


def simulate(graph: OpGraph, cluster: Cluster, plan, *, mode: str | None = None,
             memory: bool = True, priority=None) -> Schedule:
    # The run allocates hundreds of thousands of small objects and no cycles:
    # pausing the cyclic GC halves the time on 40k-op graphs.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(graph, cluster, plan, mode=mode, memory=memory, priority=priority)
    finally:
        if enabled:
            gc.enable()


def _simulate(graph: OpGraph, cluster: Cluster, plan, *, mode: str | None = None,
              memory: bool = True, priority=None) -> Schedule:
    """Simulate one step of ``graph`` on ``cluster``.

    Parameters
    ----------
    plan : Plan or mapping op -> device
        With a Plan and ``mode`` None, each device follows the plan's order;
        a bare placement runs TF's default (FIFO ready queue).
    mode : {"order", "fifo"}, optional
        ``"fifo"`` with a Plan ignores its order.
    memory : bool
        Compute peak memory per device (a little slower).
    priority : mapping op -> float, or a sequence in ``graph.names`` order, optional
        Only in ``"fifo"`` mode: a free device runs its ready op of largest
        priority (ties: the one ready first) instead of the first ready, and
        chooses only after every op that becomes ready at that instant is
        queued (a list scheduler).

    Returns
    -------
    Schedule
        ``makespan`` is when the last op (or transfer) ends. Tensors of zero
        bytes and control edges cost no transfer: a remote consumer may start
        when the producer ends.

    Raises
    ------
    InvalidPlanError
        An op is not placed, placed on an unknown device or a kind it does not
        allow, or the order deadlocks (contradicts the DAG).

    Examples
    --------
    A transfer of 100 bytes on a route with beta0 = 1 µs, beta1 = 0.01 µs/byte
    takes 2 µs: ``a`` ends at 2, ``c`` on the other GPU starts at 4.

    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 2, "b": 3, "c": 4}, [("a", "b", 100), ("a", "c", 100)])
    >>> s = simulate(g, gpus(2, beta=(1.0, 0.01)), {"a": "/GPU:0", "b": "/GPU:0", "c": "/GPU:1"})
    >>> s.start["c"], s.makespan
    (4.0, 8.0)
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
    by_order = mode == "order"
    prio = None
    if priority is not None:
        if by_order:
            raise ValueError("priority= applies to mode='fifo' only")
        if hasattr(priority, "get"):
            prio = [-float(priority.get(nm, 0.0)) for nm in graph.names]
        else:
            prio = [-float(x) for x in priority]
            if len(prio) != graph.num_ops:
                raise ValueError(f"priority has {len(prio)} values for {graph.num_ops} ops")

    names = graph.names
    n = len(names)
    devices = cluster.devices
    nd = len(devices)
    dev_names = [d.name for d in devices]
    dindex = cluster.index
    dev = [0] * n
    dur = [0.0] * n
    for i, op in enumerate(graph.ops):
        dn = placement.get(op.name)
        if dn is None:
            raise InvalidPlanError([f"op {op.name!r} is not placed"])
        k = dindex.get(dn)
        if k is None:
            raise InvalidPlanError([f"op {op.name!r} is placed on unknown device {dn!r} "
                                    f"(cluster has {dev_names})"])
        d = devices[k]
        if d.kind not in op.kinds:
            raise InvalidPlanError([f"op {op.name!r} is placed on {d.name} of kind {d.kind}, "
                                    f"allowed {sorted(op.kinds)}"])
        dev[i] = k
        dur[i] = op.compute[d.kind] / d.speed

    # What each producer sends where, once per (tensor, remote device):
    # sends[i] = [(tensor, bytes, dst device, [consumer idx there])]
    sends: list = [None] * n
    for tname, i, nbytes, cons in graph.tensor_table():
        if nbytes <= 0 or not cons:
            continue
        di = dev[i]
        by_dev: dict[int, list[int]] = {}
        for j in cons:
            dj = dev[j]
            if dj != di:
                lst = by_dev.get(dj)
                if lst is None:
                    by_dev[dj] = [j]
                else:
                    lst.append(j)
        if by_dev:
            out = sends[i]
            if out is None:
                out = sends[i] = []
            for dj, js in by_dev.items():
                out.append((tname, nbytes, dj, js))

    # routes as (beta0, beta1, link indices), built on first use
    link_ids = {l: k for k, l in enumerate(cluster.links)}
    link_free = [0.0] * len(link_ids)
    contention_free = cluster.contention_free
    routes: dict = {}

    if by_order:
        index = graph.index
        queues = []
        for dn in dev_names:
            q = []
            for o in order.get(dn, ()):
                j = index.get(o)
                if j is None:
                    raise InvalidPlanError([f"the order on {dn} names unknown op {o!r}"])
                if dev[j] != dindex[dn]:
                    raise InvalidPlanError([f"op {o!r} is ordered on {dn} but placed on {dev_names[dev[j]]}"])
                q.append(j)
            queues.append(q)
        for dn in order:
            if dn not in dindex:
                raise InvalidPlanError([f"the order names unknown device {dn!r}"])
        if sum(map(len, queues)) != n or len({j for q in queues for j in q}) != n:
            raise InvalidPlanError(["the plan's order does not list every op exactly once"])
        qpos = [0] * nd
        qlen = [len(q) for q in queues]
    elif prio is None:
        queues = [deque() for _ in range(nd)]  # ready ops in the order they became ready
    else:
        queues = [[] for _ in range(nd)]  # heaps of (-priority, ready sequence, op)
    seq_no = 0
    is_ready = [False] * n
    dev_free = [True] * nd
    start = [0.0] * n
    finish = [0.0] * n
    ran: list[list[int]] = [[] for _ in range(nd)]
    xfers: list = []  # (producer, tensor, bytes, dst device, start, finish, consumers)
    succ = graph.succ_idx()
    waiting = [len(p) for p in graph.pred_idx()]
    arrive = [0.0] * n  # latest remote input arrival per op
    # events: (time, kind, op); kind 0 = finish, 1 = ready: at equal times
    # finishes come first, so a freed device sees every op ready by then
    push, pop = heapq.heappush, heapq.heappop
    events: list = [(0.0, 1, i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(events)
    done = 0

    while events:
        now, kind, i = pop(events)
        if kind == 2:  # priority mode: device i picks its best ready op
            q = queues[i]
            if dev_free[i] and q:
                j = pop(q)[2]
                dev_free[i] = False
                start[j] = now
                f = now + dur[j]
                finish[j] = f
                ran[i].append(j)
                push(events, (f, 0, j))
            continue
        if kind:
            d = dev[i]
            if prio is not None:
                push(queues[d], (prio[i], seq_no, i))
                seq_no += 1
                if dev_free[d]:
                    push(events, (now, 2, d))  # after every op ready at this instant
                continue
            if by_order:
                is_ready[i] = True
                if not dev_free[d] or queues[d][qpos[d]] != i:
                    continue
                qpos[d] += 1
            else:
                if not dev_free[d]:
                    queues[d].append(i)
                    continue
            dev_free[d] = False
            start[i] = now
            f = now + dur[i]
            finish[i] = f
            ran[d].append(i)
            push(events, (f, 0, i))
            continue
        done += 1
        d = dev[i]
        lst = sends[i]
        if lst is not None:
            for tname, nbytes, dd, js in lst:
                r = routes.get((d, dd))
                if r is None:
                    rt = cluster.route(dev_names[d], dev_names[dd])
                    r = routes[(d, dd)] = (rt.beta0, rt.beta1, [link_ids[l] for l in rt.links])
                length = r[0] + r[1] * nbytes
                s = now
                if not contention_free:
                    for l in r[2]:
                        if link_free[l] > s:
                            s = link_free[l]
                    for l in r[2]:
                        link_free[l] = s + length
                f = s + length
                xfers.append((i, tname, nbytes, dd, s, f, js))
                for j in js:
                    if f > arrive[j]:
                        arrive[j] = f
        for j in succ[i]:
            w = waiting[j] - 1
            waiting[j] = w
            if w == 0:
                a = arrive[j]
                push(events, (a if a > now else now, 1, j))
        # the device is free: start the next op it may run
        if by_order:
            p = qpos[d]
            if p < qlen[d] and is_ready[queues[d][p]]:
                j = queues[d][p]
                qpos[d] = p + 1
            else:
                dev_free[d] = True
                continue
        elif prio is not None:
            dev_free[d] = True
            if queues[d]:
                push(events, (now, 2, d))
            continue
        else:
            q = queues[d]
            if not q:
                dev_free[d] = True
                continue
            j = q.popleft()
        start[j] = now
        f = now + dur[j]
        finish[j] = f
        ran[d].append(j)
        push(events, (f, 0, j))

    if done < n:
        stuck = [f"{dev_names[d]}: {names[queues[d][qpos[d]]]}" for d in range(nd)
                 if by_order and qpos[d] < qlen[d]]
        raise InvalidPlanError([f"the order deadlocks (it contradicts the graph); waiting heads: {stuck[:4]}"])
    st = dict(zip(names, start))
    fi = dict(zip(names, finish))
    pl = {nm: dev_names[dev[i]] for i, nm in enumerate(names)}
    order_out = {dev_names[d]: [names[i] for i in ran[d]] for d in range(nd) if ran[d]}
    makespan = max(finish, default=0.0)
    transfers = [Transfer(tname, dev_names[dev[i]], dev_names[dd], s, f)
                 for i, tname, nbytes, dd, s, f, js in xfers]
    if transfers:
        makespan = max(makespan, max(x[5] for x in xfers))
    sched = Schedule(graph, cluster, pl, st, fi, transfers, makespan, order_out, mode)
    if memory:
        sched.peak_memory = timed_peak(graph, cluster, dev, start, finish,
                                        [(i, nbytes, dd, s, f, js) for i, tname, nbytes, dd, s, f, js in xfers])
    return sched


simulate.__doc__ = _simulate.__doc__
_simulate.__doc__ = "Body of :func:`simulate` (called with the cyclic GC paused)."
