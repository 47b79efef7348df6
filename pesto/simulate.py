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

The event loop itself is :func:`pesto.engine.replay`; this module names its
index arrays and adds peak memory.

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

import json
from dataclasses import dataclass, field

import numpy as np

from .cluster import Cluster
from .engine import replay
from .errors import InfeasibleError, InvalidPlanError
from .graph import OpGraph, gc_paused
from .kernels import FlatArrays
from .memory import timed_peak
from .plan import Plan, Transfer, solved_parts
from .problem import INF, Problem

__all__ = ["Schedule", "simulate", "run_peak"]


#: A link lane's height in the Gantt chart, a device lane being 1.
_LINK_LANE = 0.25


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

    def gantt(self, path=None, *, title=None, ax=None, max_labels=40, color_by: str = "auto",
              max_groups: int = 10):
        """Matplotlib Gantt chart of devices and links; saved to ``path`` if given.

        ``color_by``: ``"op"`` (one colour per op, names written on the bars),
        ``"scope"`` (the first part of each op's scope or name, e.g. the layer),
        ``"type"`` (the op type) or ``"auto"`` (op up to ``max_labels`` ops,
        else scope). Scopes and types are coloured for the ``max_groups``
        taking most time, the rest in grey as "other", with a legend outside
        the axes (right of them, so it hides no bar). Time is in ms. Link
        lanes are a quarter as tall as device lanes, so devices get most of
        the height. With ``path`` and no ``ax`` the figure is drawn off-screen
        (no pyplot, so the caller's backend is untouched). Returns the Axes.
        """
        import matplotlib

        if color_by not in ("auto", "op", "scope", "type"):
            raise ValueError(f"color_by must be 'auto', 'op', 'scope' or 'type', got {color_by!r}")
        if color_by == "auto":
            color_by = "op" if len(self.placement) <= max_labels else "scope"
        links = sorted({l for t in self.transfers for l in self.cluster.route(t.src, t.dst).links})
        devs = [d.name for d in self.cluster.devices]
        y = {r: float(i) for i, r in enumerate(devs)}
        y.update({r: len(devs) - 0.5 + _LINK_LANE * (k + 0.5) for k, r in enumerate(links)})
        if ax is None:
            size = (12, 0.5 * len(devs) + 0.5 * _LINK_LANE * len(links) + 2.0)
            if path is not None:
                from matplotlib.figure import Figure
                fig = Figure(figsize=size)
                ax = fig.add_subplot()
            else:
                import matplotlib.pyplot as plt
                fig, ax = plt.subplots(figsize=size)
        else:
            fig = ax.figure
        colour_of, legend = self._gantt_colours(color_by, max_groups, matplotlib.colormaps)
        self._gantt_bars(ax, y, colour_of, color_by == "op" and len(self.placement) <= max_labels)
        rows = devs + links
        ax.set_yticks([y[r] for r in rows], rows)
        ax.set_ylim(len(devs) - 0.5 + _LINK_LANE * len(links), -0.5)
        ax.set_xlim(0, max(self.makespan / 1000, 1e-9) * 1.01)
        ax.set_xlabel("time (ms)")
        ax.set_title(title or f"{self.graph.name}: step {self.makespan / 1000:.3f} ms ({self.mode})")
        if legend:
            from matplotlib.patches import Patch
            ax.legend(handles=[Patch(color=c, label=k) for k, c in legend], fontsize=7, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, title=color_by, title_fontsize=7)
        if path is not None:
            fig.tight_layout()
            fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the legend outside the axes
        return ax

    def _gantt_bars(self, ax, y: dict, colour_of: dict, labels: bool) -> None:
        """The ops' bars on the device lanes and the transfers' on the link lanes, in ms."""
        bars: dict[str, tuple[list, list]] = {}
        for op, d in self.placement.items():
            s, f = self.start[op] / 1000, self.finish[op] / 1000
            spans, colors = bars.setdefault(d, ([], []))
            spans.append((s, f - s))
            colors.append(colour_of[op])
            if labels:
                ax.text(s + (f - s) / 2, y[d], op, ha="center", va="center", fontsize=7)
        for d, (spans, colors) in bars.items():
            ax.broken_barh(spans, (y[d] - 0.4, 0.8), facecolors=colors, edgecolor="none")
        per_link: dict[str, list] = {}
        for t in self.transfers:
            for link in self.cluster.route(t.src, t.dst).links:
                per_link.setdefault(link, []).append((t.start / 1000, (t.finish - t.start) / 1000))
        for link, spans in per_link.items():
            ax.broken_barh(spans, (y[link] - 0.4 * _LINK_LANE, 0.8 * _LINK_LANE), facecolors="0.5",
                           edgecolor="none")

    def _gantt_colours(self, color_by: str, max_groups: int, colormaps):
        """Op -> colour, and the legend ``[(group, colour)]`` (empty per op)."""
        if color_by == "op":
            cmap = colormaps["tab20"]
            return {op: cmap(k % 20) for k, op in enumerate(self.placement)}, []
        ops = {op.name: op for op in self.graph.ops}

        def group(name: str) -> str:
            op = ops[name]
            if color_by == "type":
                return op.type or "?"
            return (op.scope or name).split("/")[0]
        busy: dict[str, float] = {}
        for name in self.placement:
            g = group(name)
            busy[g] = busy.get(g, 0.0) + self.finish[name] - self.start[name]
        top = sorted(busy, key=lambda g: -busy[g])[:max_groups]
        cmap = colormaps["tab10"]
        colour = {g: cmap(k % 10) for k, g in enumerate(top)}
        other = (0.75, 0.75, 0.75, 1.0)
        legend = [(g, colour[g]) for g in top] + ([("other", other)] if len(busy) > len(top) else [])
        return {name: colour.get(group(name), other) for name in self.placement}, legend


def simulate(graph: OpGraph, cluster: Cluster, plan=None, *, mode: str | None = None,
             memory: bool = True, priority=None) -> Schedule:
    graph, plan = solved_parts(graph, plan, "simulate")
    # The run allocates hundreds of thousands of small objects and no cycles:
    # pausing the cyclic GC halves the time on 40k-op graphs.
    with gc_paused():
        return _simulate(graph, cluster, plan, mode=mode, memory=memory, priority=priority)


def _simulate(graph: OpGraph, cluster: Cluster, plan, *, mode: str | None = None,
              memory: bool = True, priority=None) -> Schedule:
    """Simulate one step of ``graph`` on ``cluster``.

    Parameters
    ----------
    plan : Plan or mapping op -> device
        With a Plan and ``mode`` None, each device follows the plan's order;
        a bare placement runs TF's default (FIFO ready queue). None: ``graph``
        is a solve's result (:func:`pesto.solve_step`), replayed on the graph
        it places.
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
    if priority is not None and mode == "order":
        raise ValueError("priority= applies to mode='fifo' only")
    try:
        prob = Problem.of(graph, cluster)
    except InfeasibleError as exc:  # some op can run nowhere: say where the plan put it
        _check_by_name(graph, cluster, placement)
        raise InvalidPlanError([str(exc)]) from None
    dev = _device_index(prob, placement)
    if mode == "order":
        run = replay(prob, dev, policy="order", order=_order_index(prob, order, dev))
    elif priority is not None:
        if hasattr(priority, "get"):
            priority = [float(priority.get(nm, 0.0)) for nm in graph.names]
        run = replay(prob, dev, policy="priority", priority=priority)
    else:
        run = replay(prob, dev, policy="fifo")
    return _schedule(prob, dev, run, mode, memory)


def _device_index(prob: Problem, placement) -> list[int]:
    """Device index per op, or InvalidPlanError naming the first bad op (a
    placement that passes the checks at once, as every placer's does, is not
    walked op by op: a tenth of a simulation of 100k ops)."""
    try:
        dindex = prob.dev_index
        dev = [dindex[d] for d in map(placement.__getitem__, prob.names)]
    except (KeyError, TypeError):
        return _device_index_checked(prob, placement)
    if prob.n and np.isinf(FlatArrays.of(prob).dur[np.arange(prob.n), dev]).any():
        return _device_index_checked(prob, placement)
    return dev


def _device_index_checked(prob: Problem, placement) -> list[int]:
    """:func:`_device_index` op by op: the first bad op named."""
    dindex, dur = prob.dev_index, prob.dur
    dev = [0] * prob.n
    get = placement.get
    for i, nm in enumerate(prob.names):
        dn = get(nm)
        if dn is None:
            raise InvalidPlanError([f"op {nm!r} is not placed"])
        k = dindex.get(dn)
        if k is None:
            raise InvalidPlanError([f"op {nm!r} is placed on unknown device {dn!r} "
                                    f"(cluster has {prob.dev_names})"])
        if dur[i][k] == INF:
            op, d = prob.graph.ops[i], prob.cluster.devices[k]
            raise InvalidPlanError([f"op {nm!r} is placed on {d.name} of kind {d.kind}, "
                                    f"allowed {sorted(op.kinds)}"])
        dev[i] = k
    return dev


def _check_by_name(graph: OpGraph, cluster: Cluster, placement) -> None:
    """:func:`_device_index`'s checks without a Problem (which cannot be built
    when an op or colocation group fits no device of the cluster)."""
    dev_names = cluster.names
    for op in graph.ops:
        dn = placement.get(op.name)
        if dn is None:
            raise InvalidPlanError([f"op {op.name!r} is not placed"])
        k = cluster.index.get(dn)
        if k is None:
            raise InvalidPlanError([f"op {op.name!r} is placed on unknown device {dn!r} "
                                    f"(cluster has {dev_names})"])
        d = cluster.devices[k]
        if d.kind not in op.kinds:
            raise InvalidPlanError([f"op {op.name!r} is placed on {d.name} of kind {d.kind}, "
                                    f"allowed {sorted(op.kinds)}"])


def _order_index(prob: Problem, order, dev) -> list[list[int]]:
    """A Plan's per-device order as op indices, checked against the placement."""
    index, dindex, dev_names = prob.index, prob.dev_index, prob.dev_names
    queues = []
    for k, dn in enumerate(dev_names):
        q = []
        for o in order.get(dn, ()):
            j = index.get(o)
            if j is None:
                raise InvalidPlanError([f"the order on {dn} names unknown op {o!r}"])
            if dev[j] != k:
                raise InvalidPlanError([f"op {o!r} is ordered on {dn} but placed on {dev_names[dev[j]]}"])
            q.append(j)
        queues.append(q)
    for dn in order:
        if dn not in dindex:
            raise InvalidPlanError([f"the order names unknown device {dn!r}"])
    return queues


def _schedule(prob: Problem, dev, run, mode: str, memory: bool) -> Schedule:
    """The engine's index arrays as a named :class:`Schedule`."""
    names, dev_names, tensors = prob.names, prob.dev_names, prob.tensors
    st = dict(zip(names, run.start))
    fi = dict(zip(names, run.finish))
    pl = dict(zip(names, map(dev_names.__getitem__, dev)))
    order_out = {dev_names[d]: list(map(names.__getitem__, r)) for d, r in enumerate(run.ran) if r}
    transfers = [Transfer(tensors[t][0], dev_names[dev[i]], dev_names[dd], s, f)
                 for i, t, nbytes, dd, s, f, js in run.xfers]
    sched = Schedule(prob.graph, prob.cluster, pl, st, fi, transfers, run.makespan, order_out, mode)
    if memory:
        sched.peak_memory = run_peak(prob, dev, run)
    return sched


def run_peak(prob: Problem, dev, run) -> dict[str, int]:
    """Peak memory per device name of an engine :class:`~pesto.engine.ReplayResult`
    under placement ``dev`` (what :func:`simulate` reports with ``memory=True``)."""
    return timed_peak(prob.graph, prob.cluster, dev, run.start, run.finish,
                      [(i, nbytes, dd, s, f, js) for i, t, nbytes, dd, s, f, js in run.xfers])


simulate.__doc__ = _simulate.__doc__
_simulate.__doc__ = "Body of :func:`simulate` (called with the cyclic GC paused)."
