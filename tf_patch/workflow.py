"""The whole loop on one model: profile -> fit comms -> solve -> apply -> train.

Used by ``python -m tf_patch.demo``, the TF tests and ``benchmarks.bench_tf``.

* :func:`profile_model`: measured op costs, calibrated against an untraced
  serial step (one device, one thread): the time TF's executor spends
  between kernels (absent from step stats) is added to every op as a
  *dispatch overhead*, or, when tracing made kernels look slower than the
  untraced step, kernel times are scaled down to match it.
* :func:`parallel_factor`: on logical CPU devices a plan that hands
  tensors between the cores often runs slower than the profile (taken on
  one device, one core) says. The factor is measured on a reference
  2-device plan (the heuristic m-ETF's, not the plan to predict) timed in
  turns with the one-device step; :func:`contended` scales the profile by
  it for plans that use several devices. On GPUs (no shared compute) it is 1.
* :func:`run_placed`: build a fresh copy of the model, enforce a plan (or
  none: TF's default placement), train ``steps`` steps, return losses and
  median step wall time, and optionally a trace check.

Examples
--------
>>> g, prof = profile_model(lambda: build_model("rnnlm"), n_devices=2)   # doctest: +SKIP
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import os
import re
import statistics
import time
from dataclasses import dataclass, field

from pesto.graph import Op, OpGraph
from pesto.simulate import simulate

from .devices import detect, plan_device, session_config
from .extract import extract, step_ops
from .profile import measure
from .traces import step_times
from .apply import apply_plan

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = ["profile_model", "parallel_factor", "ParallelFactor", "contended", "anchored_errors", "run_placed",
           "PlacedRun",
           "time_interleaved", "RunResult", "trace_check", "calibrate_overhead", "busy_cores", "other_cores",
           "Timing"]


@dataclass
class RunResult:
    """Losses of each step, median step wall time (µs), what apply did."""

    losses: list
    step_us: float
    step_times: list = field(default_factory=list)
    applied: object = None
    trace: dict | None = None
    cores_used: float = float("nan")  # process CPU time / wall time over the timed steps


def _time_runs(sess, op, feed_fn, steps, offset=0):
    ts = []
    for s in range(steps):
        feed = feed_fn(offset + s)
        t0 = time.perf_counter()
        sess.run(op, feed)
        ts.append((time.perf_counter() - t0) * 1e6)
    return ts


def calibrate_overhead(build, costs: dict, *, steps: int = 10) -> tuple[float, float]:
    """Match the profile to an untraced serial step (one device, one thread).

    Returns ``(overhead, scale)``: if the serial step takes longer than the
    sum of traced kernel times, the difference spread over the ops is the
    executor's dispatch overhead per op (scale 1); if it is shorter (tracing
    slowed the kernels), the kernel times are scaled down by ``scale`` and
    the overhead is 0.
    """
    import tensorflow as tf

    model = build()
    ops = step_ops(model.graph, model.fetches)
    with tf.compat.v1.Session(graph=model.graph, config=session_config(1, inter_op=1)) as sess:
        sess.run(model.init_op)
        _time_runs(sess, model.train_op, model.feed_fn, 3)
        wall = statistics.median(_time_runs(sess, model.train_op, model.feed_fn, steps, 3))
    work = sum(costs.get(op.name, 0.0) for op in ops)
    if wall >= work or work <= 0:
        return (wall - work) / max(len(ops), 1), 1.0
    return 0.0, wall / work


def profile_model(build, *, n_devices: int = 2, steps: int = 5, warmup: int = 2,
                  overhead: bool = True, progress: bool = False):
    """``(OpGraph, Profile)`` with measured CPU costs (+ dispatch overhead).

    ``build`` is a zero-argument callable returning a fresh ZooModel (every
    run gets its own graph, so profiling never touches the graph to place).
    The costs are those of the model running alone on one core; see
    :func:`parallel_factor` for a step that keeps several busy.
    """

    kind, _ = detect(n_devices)
    model = build()
    # kernels timed one at a time (one device, one thread): clean per-op
    # costs, not slowed by each other on a shared CPU
    prof = measure(model, n_devices=1, steps=steps, warmup=warmup, progress=progress,
                   config=session_config(1, inter_op=1, kind=kind))
    g = extract(model.graph, model.fetches, costs=prof.costs, kind=kind, memory=prof.memory,
                name=model.name, kinds_fn=lambda op_type, k: frozenset({k}))
    prof.overhead, prof.scale = calibrate_overhead(build, prof.costs) if overhead else (0.0, 1.0)
    if prof.overhead > 0 or prof.scale != 1.0:
        g = _rescaled(g, prof.scale, prof.overhead)
    return g, prof


def _rescaled(graph: OpGraph, scale: float, overhead: float = 0.0) -> OpGraph:
    """``graph`` with every op's time ``t`` replaced by ``t * scale + overhead``."""
    ops = [Op(o.name, {k: v * scale + overhead for k, v in o.compute.items()}, kinds=o.kinds,
              persistent_bytes=o.persistent_bytes, output_bytes=o.output_bytes,
              temporary_bytes=o.temporary_bytes, colocation_group=o.colocation_group,
              scope=o.scope, type=o.type, batch=o.batch, view_bytes=o.view_bytes) for o in graph.ops]
    return OpGraph(ops, graph.edges, graph.tensors, name=graph.name)


def contended(graph: OpGraph, factor: float) -> OpGraph:
    """``graph`` with every op's time times ``factor`` (a
    :attr:`ParallelFactor.factor`): its costs in a step that keeps several
    devices busy; ``graph`` itself when the factor is 1.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> g = OpGraph.from_edges({"a": 10.0, "b": 20.0}, [("a", "b", 4)])
    >>> contended(g, 1.1).total_work("GPU")
    33.0
    >>> contended(g, 1.0) is g
    True
    """
    return graph if factor == 1.0 else _rescaled(graph, factor)


@dataclass(frozen=True)
class ParallelFactor:
    """How much slower a multi-device step runs than its profile says.

    ``factor = ratio / (simulated / simulated_one)``, at least 1, where
    ``ratio`` is the median over timing rounds of the reference ``plan``'s
    step (of ``placer``) over the one-device step, measured in turns;
    ``measured`` and ``measured_one`` are their medians (µs), ``simulated``
    and ``simulated_one`` their steps simulated on the one-device profile.
    """

    factor: float
    placer: str
    ratio: float
    measured: float
    measured_one: float
    simulated: float
    simulated_one: float

    def __str__(self):
        return (f"a step keeping {self.placer}'s devices busy runs x {self.factor:.2f} the profile's times "
                f"({self.placer}'s step / one device's: {self.ratio:.3f} measured in turns, "
                f"{self.simulated / self.simulated_one:.3f} simulated)")


def parallel_factor(build, graph: OpGraph, cluster, plan, *, rounds: int = 8, steps: int = 4) -> ParallelFactor:
    """Time ``plan`` (a reference multi-device plan, not the one to predict)
    and the one-device step in turns (:func:`time_interleaved`) and compare
    their ratio with the simulator's on ``graph`` (one-device costs). The
    measured ratio is the median of the rounds' ratios (each round's two
    medians are taken a fraction of a second apart, so the machine's drift
    cancels in each); ``measured`` and ``measured_one`` are medians over the
    rounds kept.

    On logical CPU devices a plan that hands tensors between the cores
    hundreds of times a step (m-ETF's, Pesto's) runs slower than its
    one-core profile (typically by 10-25 %); Expert's layer split, as busy
    on both cores but crossing a few dozen times, is slowed less. It is
    neither the cores sharing memory bandwidth nor mainly the data crossing
    them (at most ~8 % of a step); each
    core's cache working set and the executor threads the devices share are
    the candidates left (benchmarks/results/demo_runs.md). :func:`contended`
    scales the profile by the factor: right for plans that cross as often
    as the reference, too high for plans that rarely do. Taking the ratio to the one-device step of the same
    rounds keeps the machine's drift out of it. A factor below 1 (noise)
    counts as 1.
    """
    dev0 = cluster.names[0]
    with PlacedRun(build, plan, n_devices=len(cluster)) as placed, \
            PlacedRun(build, None, n_devices=len(cluster)) as one:
        timing = time_interleaved([placed, one], rounds=rounds, steps=steps)
        ratios = [statistics.median(placed.times[i * steps:(i + 1) * steps])
                  / statistics.median(one.times[i * steps:(i + 1) * steps]) for i in timing.kept]
    measured, measured_one = timing.step_us
    simulated = simulate(graph, cluster, plan).makespan
    simulated_one = simulate(graph, cluster, {o: dev0 for o in graph.names}).makespan
    factor = max(1.0, statistics.median(ratios) / (simulated / simulated_one))
    return ParallelFactor(factor, plan.placer, statistics.median(ratios), measured, measured_one, simulated,
                          simulated_one)


def anchored_errors(predicted, measured, ref: int | None) -> tuple[float, list[float]]:
    """Errors (%, of the prediction) once every prediction is put at the
    machine's speed now: ``speed = measured[ref] / predicted[ref]``, the
    reference placement's measured over predicted step in the same timing
    rounds (1 when ``ref`` is None: the plain errors). Returns ``(speed,
    errors)``; the reference's own error is 0 and a NaN prediction (a
    placement with no device model) gives NaN.

    A shared VM's speed drifts 10-20 % within a minute, so a profile taken
    before the timing rounds cannot predict absolute times to 10 %; scaled by
    a plan timed in the same rounds (not the plan predicted), the error says
    how well the simulator ranks and sizes plans against each other.

    Examples
    --------
    >>> speed, errs = anchored_errors([10.0, 20.0, float("nan")], [12.0, 22.0, 9.0], ref=0)
    >>> round(speed, 3), [round(e, 2) for e in errs[:2]]
    (1.2, [0.0, -8.33])
    """
    speed = 1.0 if ref is None else measured[ref] / predicted[ref]
    return speed, [100 * (m - speed * p) / (speed * p) for p, m in zip(predicted, measured)]


class PlacedRun:
    """A fresh copy of the model with ``plan`` enforced, in an open session.

    ``plan=None`` is TF's default placement (every op on device 0).
    ``inter_op`` is the session's executor threads: by default one per
    device the run uses (so TF's default placement gets one thread: one
    logical device = one core, see :func:`tf_patch.session_config`);
    ``inter_op=0`` is TensorFlow's own choice (one thread per core, running
    independent ops at once). ``intra_op`` only counts in a process's first
    session (TensorFlow sizes the kernel pool once). Use as a context
    manager, or :meth:`close` it.
    """

    def __init__(self, build, plan=None, *, n_devices: int = 2, order: bool = True,
                 inter_op: int | None = None, intra_op: int = 1):
        import tensorflow as tf

        self.model = build()
        self.applied = (apply_plan(self.model.graph, plan, order=order, n_devices=n_devices)
                        if plan is not None else None)
        n = max(n_devices, self.applied.n_devices) if self.applied is not None else n_devices
        used = len(set(self.applied.plan.placement.values())) if self.applied is not None else 1
        self.inter_op = used if inter_op is None else inter_op
        cfg = session_config(n, kind=detect(n)[0], inter_op=self.inter_op, intra_op=intra_op)
        self.sess = tf.compat.v1.Session(graph=self.model.graph, config=cfg)
        self.step = 0
        self.times: list = []
        self.cpu_s = self.wall_s = 0.0
        try:  # TF's placer must accept the placement (no soft placement)
            self.sess.run(self.model.init_op, getattr(self.model, "init_feed", None))
        except Exception:
            self.sess.close()
            raise

    def train(self, steps: int) -> list[float]:
        """Train ``steps`` steps; their losses."""
        m = self.model
        out = [float(self.sess.run(m.fetches, m.feed_fn(self.step + s))[1]) for s in range(steps)]
        self.step += steps
        return out

    def time(self, steps: int) -> list[float]:
        """Train ``steps`` steps, each timed (µs, appended to :attr:`times`)."""
        cpu0, wall0 = time.process_time(), time.perf_counter()
        ts = _time_runs(self.sess, self.model.train_op, self.model.feed_fn, steps, self.step)
        self.cpu_s += time.process_time() - cpu0
        self.wall_s += time.perf_counter() - wall0
        self.step += steps
        self.times += ts
        return ts

    @property
    def cores_used(self) -> float:
        """This process's CPU time / wall time over the timed steps."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else float("nan")

    def trace(self) -> dict:
        """One FULL_TRACE training step checked by :func:`trace_check`."""
        import tensorflow as tf

        md = tf.compat.v1.RunMetadata()
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        self.sess.run(self.model.train_op, self.model.feed_fn(self.step), options=opts, run_metadata=md)
        self.step += 1
        return trace_check(md, self.applied.plan if self.applied is not None else None, self.applied)

    def result(self, losses=(), trace=None) -> "RunResult":
        return RunResult(list(losses), statistics.median(self.times) if self.times else float("nan"),
                         list(self.times), self.applied, trace, self.cores_used)

    def close(self) -> None:
        self.sess.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_placed(build, plan=None, *, n_devices: int = 2, steps: int = 5, timed: int = 10,
               trace: bool = False, order: bool = True, inter_op: int | None = None,
               intra_op: int = 1) -> RunResult:
    """Train a fresh model under ``plan`` (None: TF's default placement).

    Returns losses of the first ``steps`` steps, then the median wall time
    of ``timed`` further steps; with ``trace`` one FULL_TRACE step is checked
    by :func:`trace_check`. Threads: see :class:`PlacedRun`.
    """
    with PlacedRun(build, plan, n_devices=n_devices, order=order, inter_op=inter_op, intra_op=intra_op) as run:
        losses = run.train(steps)
        if timed:
            run.time(timed)
        return run.result(losses, run.trace() if trace else None)


@dataclass
class Timing:
    """What :func:`time_interleaved` measured.

    ``step_us[j]``: median step µs of run ``j`` over the rounds kept;
    ``other_cores[i]``: cores other processes used during round ``i`` (nan
    where /proc/stat cannot be read); ``kept``: the rounds the medians use,
    those in which other processes used at most ``quiet`` cores (every round
    when fewer than half were that quiet).
    """

    step_us: list
    other_cores: list
    kept: list
    quiet: float

    def note(self) -> str:
        """One line saying which rounds the medians use and why."""
        n, k = len(self.other_cores), len(self.kept)
        seen = [o for o in self.other_cores if o == o]
        if not seen:
            return f"median of {n} rounds (other processes' load unknown here)"
        if k < n:
            return (f"median of the {k} of {n} rounds in which other processes used <= {self.quiet:.2f} cores "
                    f"(in the others up to {max(seen):.1f})")
        if max(seen) <= self.quiet:
            return f"median of {n} rounds; other processes used <= {self.quiet:.2f} cores in each"
        return (f"median of {n} rounds; other processes used {min(seen):.1f}-{max(seen):.1f} cores: "
                "the machine was busy, 2-device timings are slowed")


def time_interleaved(runs: list, *, rounds: int = 5, steps: int = 4, warmup: int = 2,
                     quiet: float = 0.25) -> Timing:
    """Time each :class:`PlacedRun` in turns; medians over the quiet rounds.

    Each run first trains ``warmup`` untimed steps; then every round times
    ``steps`` steps of each run in turn, so a change in the machine's load
    (other processes on shared cores) hits every run alike, and measures the
    cores other processes used meanwhile (:func:`other_cores`): the medians
    leave out rounds in which they used more than ``quiet`` cores, unless
    that would leave fewer than half of the rounds (:class:`Timing`).
    """
    for r in runs:
        r.train(warmup)
    per_round, other = [], []
    for _ in range(rounds):
        snap = _cpu_snapshot()
        per_round.append([r.time(steps) for r in runs])
        other.append(other_cores(snap))
    kept = [i for i, o in enumerate(other) if o <= quiet]
    if 2 * len(kept) < rounds:
        kept = list(range(rounds))
    med = [statistics.median(t for i in kept for t in per_round[i][j]) for j in range(len(runs))]
    return Timing(med, other, kept, quiet)


def _cpu_snapshot():
    """(wall s, this process's CPU s, machine busy jiffies, total jiffies or None)."""
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        busy, total = sum(v) - v[3] - (v[4] if len(v) > 4 else 0.0), sum(v)
    except (OSError, ValueError, IndexError):
        busy = total = None
    return time.perf_counter(), time.process_time(), busy, total


def other_cores(since) -> float:
    """Cores used by other processes since the ``_cpu_snapshot()`` ``since``:
    the machine's busy cores (Linux /proc/stat) less this process's CPU
    time over the wall time; nan where /proc/stat cannot be read."""
    wall0, cpu0, busy0, total0 = since
    wall1, cpu1, busy1, total1 = _cpu_snapshot()
    if busy0 is None or busy1 is None or total1 <= total0 or wall1 <= wall0:
        return float("nan")
    machine = (os.cpu_count() or 1) * (busy1 - busy0) / (total1 - total0)
    return max(0.0, machine - (cpu1 - cpu0) / (wall1 - wall0))


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes over ``seconds`` (Linux
    /proc/stat; None elsewhere).

    Examples
    --------
    >>> b = busy_cores(0.05)
    >>> b is None or 0 <= b <= (os.cpu_count() or 1) + 1e-6
    True
    """
    snap = _cpu_snapshot()
    time.sleep(seconds)
    b = other_cores(snap)
    return None if b != b else b


_LOWERED = re.compile(r"^(.*)/(LoopExecuted|branch_executed|LoopControlInputs)/_\d+$")


def _lowered_ends(traced) -> tuple[dict, dict]:
    """Where a functional While (or If) lowered into control flow takes and
    sends its control edges: TensorFlow keeps its name on an ``IdentityN`` of
    its outputs, which nothing waits on; edges out of it leave from
    ``<name>/LoopExecuted/_k`` (``branch_executed`` for an If), after its
    last op, and edges into it reach ``<name>/LoopControlInputs/_k``, before
    its first. Returns ``(op -> node whose end counts, op -> node whose
    start counts)`` among the ``traced`` node names."""
    after, before = {}, {}
    for name in traced:
        m = _LOWERED.match(name)
        if m:
            (before if m.group(2) == "LoopControlInputs" else after)[m.group(1)] = name
    return after, before


def trace_check(run_metadata, plan=None, applied=None) -> dict:
    """Compare a traced step with the plan.

    Returns ``{"devices": {op: device seen}, "misplaced": [(op, planned,
    seen)], "order_violations": [(a, b, end_a, start_b)], "checked_edges": n,
    "left_out": k, "busy_us": {device: kernel µs}, "wall_us": traced step µs}``.
    An added control edge (a, b) is respected when b starts no earlier than a's
    kernel ends (``op_end_rel_micros``, 1 µs tolerance for the trace's
    rounding; not ``all_end``: TF's executor releases b when a's outputs are
    propagated, before it stamps a's ``all_end``, so a busy machine showed b
    starting tens of µs before that); an op oneDNN fused into
    another is checked under the fused kernel's name (``applied.fused``;
    one that ran as a kernel of its own, under its own name), a
    While lowered into control flow at the nodes its control edges go
    through (:func:`_lowered_ends`). ``"left_out"``: the plan's order edges
    not enforced (``applied.left_out``).
    """

    seen, start, end, done, busy = {}, {}, {}, {}, {}
    for name, dev, _, ns in step_times(run_metadata):
        try:
            seen[name] = plan_device(dev)
        except ValueError:
            continue
        start[name] = ns.all_start_micros
        end[name] = ns.all_start_micros + max(ns.op_end_rel_micros, ns.all_end_rel_micros)
        done[name] = ns.all_start_micros + (ns.op_end_rel_micros or ns.all_end_rel_micros)
        busy[seen[name]] = busy.get(seen[name], 0) + ns.op_end_rel_micros
    misplaced = []
    if plan is not None:
        for op, d in plan.placement.items():
            if op in seen and seen[op] != d:
                misplaced.append((op, d, seen[op]))
    viol, n = [], 0
    fused = getattr(applied, "fused", {})
    after, before = _lowered_ends(start)
    for a, b in (applied.control_edges if applied is not None else []):
        # an op predicted fused that ran as its own kernel is checked as itself
        a, b = (x if x in start else fused.get(x, x) for x in (a, b))
        if a in end and b in start:
            n += 1
            a_end, b_start = done[after.get(a, a)], start[before.get(b, b)]
            if b_start + 1 < a_end:
                viol.append((a, b, a_end, b_start))
    wall = (max(end.values()) - min(start.values())) if start else 0
    return {"devices": seen, "misplaced": misplaced, "order_violations": viol, "checked_edges": n,
            "left_out": len(getattr(applied, "left_out", ())), "busy_us": busy, "wall_us": wall}
