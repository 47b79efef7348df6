"""Run a plan on TensorFlow's distributed runtime: one ``tf.distribute.Server`` per host.

:class:`LocalServers` starts ``n_tasks`` servers of job ``worker`` as
separate processes on free localhost ports (each with ``devices_per_task``
logical CPU devices, or that many of this machine's GPUs when there are
enough), the stand-in for a cluster of hosts. :func:`task_plan` maps a plan's
devices to task-qualified names (``/job:worker/replica:0/task:T/device:CPU:K``),
:func:`run_on_servers` applies it to a fresh model (devices and the plan's
per-device order as control edges; the graph's own control edges between
tasks, e.g. the training op's group, go over the wire as TF sends them) and
trains it in a ``tf.compat.v1.Session`` on task 0, with a trace check
(:func:`trace_check_tasks`).

Nothing hangs and nothing is left running:

* a port in use raises :class:`PortInUseError` before any server starts;
* a server that exits or does not report ready within ``start_timeout``
  raises :class:`ServerStartError` with its exit code and last stderr lines;
* a worker that dies during a step raises :class:`WorkerLostError` naming the
  task, when TF's RPC fails or at the latest after ``op_timeout`` seconds;
* :meth:`LocalServers.close` (the context manager's exit, and ``atexit``)
  stops every server's process group; a server also exits by itself when its
  parent dies (it waits on its stdin pipe).

Examples
--------
>>> with LocalServers(2, 2) as servers:                          # doctest: +SKIP
...     res = run_on_servers(build, plan, servers, steps=5)
>>> task_device_name("/job:worker/replica:0/task:1/device:GPU:1", "CPU")
'/job:worker/replica:0/task:1/device:CPU:1'
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import atexit
import json
import os
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from pesto.errors import InvalidPlanError, PestoError

from .apply import apply_plan
from .commfit import fit_line, ping_pong_graph
from .devices import session_config
from .workflow import RunResult, _time_runs
from .traces import step_times

__all__ = ["DistributedError", "PortInUseError", "ServerStartError", "WorkerLostError", "LocalServers",
           "free_ports", "task_device_name", "task_plan", "apply_on_servers", "run_on_servers",
           "trace_check_tasks", "fit_task_transfers", "single_process_losses",
           "run_step_on_servers"]


class DistributedError(PestoError, RuntimeError):
    """A local TensorFlow cluster could not start or lost a server."""


class PortInUseError(DistributedError):
    """A requested server port is taken by another process."""


class ServerStartError(DistributedError):
    """A server process exited, or did not report ready in time, while starting."""


class WorkerLostError(DistributedError):
    """A server process died while the cluster was in use."""


# The server process: only TensorFlow, no project import (fast to start). It
# prints READY once serving and exits when its stdin closes (the parent
# closed it, or died).
_SERVE = r"""
import os, sys, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
spec, task = json.loads(sys.argv[1]), int(sys.argv[2])
cfg = tf.compat.v1.ConfigProto.FromString(bytes.fromhex(sys.argv[3]))
server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="worker", task_index=task,
                              config=cfg, start=True)
print("READY", flush=True)
sys.stdin.read()
os._exit(0)
"""
_PORT_WORDS = ("address already in use", "could not start grpc server", "failed to add port")
_TASK = re.compile(r"/job:(\w+)(?:/replica:(\d+))?/task:(\d+)/device:(CPU|GPU):(\d+)$", re.I)
_SHORT = re.compile(r"^/?(?:device:)?(CPU|GPU):(\d+)$", re.I)


def free_ports(n: int) -> list[int]:
    """``n`` distinct localhost ports free right now (the OS picks them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("localhost", port))
        except OSError:
            return True
    return False


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, errors="replace") as f:
            text = [ln.rstrip() for ln in f if ln.strip() and "oneDNN" not in ln and "absl::" not in ln]
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class LocalServers:
    """``n_tasks`` ``tf.distribute.Server`` processes (job ``worker``) on localhost.

    Parameters
    ----------
    n_tasks : servers (stand-ins for hosts)
    devices_per_task : devices each server has: logical CPU devices, or
        physical GPUs when this machine has ``n_tasks * devices_per_task``
        of them (each server then sees its own, ``CUDA_VISIBLE_DEVICES``)
    ports : the servers' ports (default: free ones)
    start_timeout : seconds for all servers to report ready
    op_timeout : seconds a session waits on a remote operation before failing
    python : argv prefix that runs the server code (default: this interpreter)

    Raises
    ------
    PortInUseError, ServerStartError
        From :meth:`start`; every process started is stopped first.
    """

    def __init__(self, n_tasks: int = 2, devices_per_task: int = 2, *, ports=None, start_timeout: float = 60.0,
                 op_timeout: float = 60.0, python=None):
        if n_tasks < 1 or devices_per_task < 1:
            raise ValueError(f"need at least one task and one device, got {n_tasks} x {devices_per_task}")
        if ports is not None and len(ports) != n_tasks:
            raise ValueError(f"{n_tasks} tasks but {len(ports)} ports")
        self.n_tasks, self.devices_per_task = n_tasks, devices_per_task
        self.ports = list(ports) if ports is not None else None
        self.start_timeout, self.op_timeout = float(start_timeout), float(op_timeout)
        self.python = list(python) if python is not None else [sys.executable]
        self.procs: list = []
        self._logs: list[str] = []
        self.kind = "CPU"

    # -- lifecycle ---------------------------------------------------------------
    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def start(self) -> "LocalServers":
        """Launch the servers and wait until each reports ready."""
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> "LocalServers":
        """Start the server processes (returns at once; :meth:`wait_ready` waits)."""
        import tensorflow as tf

        if self.ports is None:
            self.ports = free_ports(self.n_tasks)
        taken = [p for p in self.ports if _port_taken(p)]
        if taken:
            raise PortInUseError(f"port(s) {taken} already in use on localhost: another process holds them; "
                                 "pass other ports, or ports=None for free ones")
        n_gpu = len(tf.config.list_physical_devices("GPU"))
        self.kind = "GPU" if n_gpu >= self.n_tasks * self.devices_per_task else "CPU"
        spec = json.dumps(self.spec)
        server_cfg = session_config(self.devices_per_task, kind=self.kind)
        server_cfg.use_per_session_threads = False  # see session_config below
        cfg = server_cfg.SerializeToString().hex()
        atexit.register(self.close)
        try:
            for t in range(self.n_tasks):
                env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
                k = self.devices_per_task
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(t * k, t * k + k))) if self.kind == "GPU" else ""
                fd, log = tempfile.mkstemp(prefix=f"pesto-worker{t}-", suffix=".log")
                self._logs.append(log)
                with os.fdopen(fd, "w") as err:
                    self.procs.append(subprocess.Popen(
                        [*self.python, "-c", _SERVE, spec, str(t), cfg], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True))
        except OSError as exc:
            self.close()
            raise ServerStartError(f"cannot start a server process ({' '.join(self.python)}): {exc}") from None
        return self

    def wait_ready(self) -> None:
        """Block until every server printed READY; raise (after stopping all) if one
        exits or ``start_timeout`` passes."""
        deadline = time.monotonic() + self.start_timeout
        sel = selectors.DefaultSelector()
        for t, p in enumerate(self.procs):
            sel.register(p.stdout, selectors.EVENT_READ, t)
        waiting = set(range(len(self.procs)))
        try:
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerStartError(
                        f"server task(s) {sorted(waiting)} did not report ready within {self.start_timeout:g} s "
                        f"(ports {[self.ports[t] for t in sorted(waiting)]}); last stderr:\n"
                        + _tail(self._logs[min(waiting)]))
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    t = key.data
                    line = self.procs[t].stdout.readline()
                    if line.strip() == b"READY":
                        waiting.discard(t)
                        sel.unregister(self.procs[t].stdout)
                    elif not line:  # EOF: the process exited
                        raise self._start_failure(t)
        except BaseException:
            self.close()
            raise
        finally:
            sel.close()

    def _start_failure(self, t: int) -> DistributedError:
        p = self.procs[t]
        try:
            rc = p.wait(5)
        except subprocess.TimeoutExpired:
            rc = None
        tail = _tail(self._logs[t])
        if any(w in tail.lower() for w in _PORT_WORDS):
            return PortInUseError(f"server task {t} could not bind localhost:{self.ports[t]} (port in use):\n{tail}")
        return ServerStartError(f"server task {t} (localhost:{self.ports[t]}) exited with code {rc} before it "
                                f"was ready; last stderr:\n{tail or '(empty)'}")

    def close(self) -> None:
        """Stop every server (stdin closed, then SIGTERM, then SIGKILL to its
        process group; at most ~10 s in all) and remove the logs. Idempotent."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for sig, wait in ((None, 2.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            live = [p for p in self.procs if p.poll() is None]
            for p in live if sig is not None else ():
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            end = time.monotonic() + wait
            for p in live:
                try:
                    p.wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for p in self.procs:
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        for log in self._logs:
            try:
                os.unlink(log)
            except OSError:
                pass
        self._logs = []
        atexit.unregister(self.close)

    # -- what sessions need ----------------------------------------------------------
    @property
    def spec(self) -> dict:
        return {"worker": [f"localhost:{p}" for p in self.ports]}

    @property
    def target(self) -> str:
        """The session target: task 0's server."""
        return f"grpc://localhost:{self.ports[0]}"

    def device(self, task: int, k: int) -> str:
        return f"/job:worker/replica:0/task:{task}/device:{self.kind}:{k}"

    @property
    def devices(self) -> list[str]:
        return [self.device(t, k) for t in range(self.n_tasks) for k in range(self.devices_per_task)]

    def session_config(self):
        """Grappler kept from reordering (as every tf_patch run), variables
        private to the session, remote operations bounded by ``op_timeout``."""
        cfg = session_config(self.devices_per_task, kind=self.kind)
        # a distributed session refuses thread-pool options: the servers own the executors
        cfg.use_per_session_threads = False
        cfg.operation_timeout_in_ms = int(self.op_timeout * 1000)
        cfg.isolate_session_state = True
        return cfg

    def close_session(self, sess) -> None:
        """Close a session on these servers without waiting on a dead one: with a
        server gone TF's close waits ``op_timeout`` for it, so it runs in a
        daemon thread (it ends when :meth:`close` stops the master)."""
        def close():
            try:
                sess.close()
            except Exception:  # noqa: BLE001  (its remote state died with its server)
                pass

        if self.dead():
            threading.Thread(target=close, name="pesto-session-close", daemon=True).start()
        else:
            close()

    def dead(self) -> list[tuple[int, int]]:
        """``(task, exit code)`` of every server that is no longer running."""
        return [(t, p.returncode) for t, p in enumerate(self.procs) if p.poll() is not None]

    def check_alive(self) -> None:
        """Raise :class:`WorkerLostError` if any server has exited."""
        gone = self.dead()
        if gone:
            raise WorkerLostError(self._lost_text(gone))

    def _lost_text(self, gone, cause: str = "") -> str:
        what = ", ".join(f"task {t} (localhost:{self.ports[t]}, pid {self.procs[t].pid}) exited with code {rc}"
                         for t, rc in gone)
        return f"worker lost: {what}" + (f"; TensorFlow said: {cause}" if cause else "")

    def lost(self, exc: BaseException, grace: float = 2.0) -> BaseException:
        """The error to raise for a failed remote run: :class:`WorkerLostError`
        if a server died (waiting up to ``grace`` s for the death to show),
        else ``exc`` itself."""
        end = time.monotonic() + grace
        while not self.dead() and time.monotonic() < end:
            time.sleep(0.05)
        gone = self.dead()
        if not gone:
            return exc
        first = str(getattr(exc, "message", exc)).strip().splitlines()
        return WorkerLostError(self._lost_text(gone, first[0][:200] if first else type(exc).__name__))


def task_device_name(name: str, kind: str, shift: int = 0) -> str:
    """A task-qualified device name with its device kind set to ``kind``
    (``GPU:k`` becomes ``CPU:k+shift`` on a server without GPUs)."""
    m = _TASK.search(name)
    if not m:
        raise InvalidPlanError([f"device {name!r} names no task (expected /job:J/replica:R/task:T/device:KIND:K)"])
    k = int(m.group(5)) + (shift if m.group(4).upper() == "GPU" and kind == "CPU" else 0)
    return f"/job:{m.group(1)}/replica:{m.group(2) or 0}/task:{m.group(3)}/device:{kind}:{k}"


def task_plan(plan, servers: LocalServers):
    """``plan`` with its devices renamed onto ``servers``.

    Task-qualified names keep their task and index and take the servers'
    device kind (a task's ``GPU:k`` becomes ``CPU:k+1`` on CPU servers when
    the plan also uses that task's ``CPU:0``); short names (``/GPU:g``) go to
    task ``g // devices_per_task``, device ``g % devices_per_task`` in order.
    Raises InvalidPlanError when a device is not on the servers.
    """
    k, have = servers.devices_per_task, set(servers.devices)
    used = sorted(set(plan.placement.values()))
    short = [d for d in used if _SHORT.match(d)]
    cpu0 = {m.group(3) for d in used if (m := _TASK.search(d)) and m.group(4).upper() == "CPU" and m.group(5) == "0"}
    to = {d: task_device_name(d, servers.kind, 1 if _TASK.search(d) and _TASK.search(d).group(3) in cpu0 else 0)
          for d in used if d not in short}
    for g, d in enumerate(sorted(short, key=lambda s: (s.upper().startswith("/CPU"), int(s.rsplit(":", 1)[1])))):
        to[d] = servers.device(g // k, g % k)
    bad = sorted(f"plan device {d!r} -> {v!r} is not on the servers ({servers.n_tasks} tasks x {k} devices)"
                 for d, v in to.items() if v not in have)
    if bad:
        raise InvalidPlanError(bad)
    placement = {op: to[d] for op, d in plan.placement.items()}
    order = {to.get(d, d): list(ops) for d, ops in plan.order.items()}
    return plan.replace(placement=placement, order=order)


def apply_on_servers(graph, plan, servers: LocalServers, *, order: bool = True):
    """:func:`tf_patch.apply_plan` with the plan on ``servers``' task devices.

    Returns the :class:`tf_patch.apply.Applied`, with ``cross_task``: the
    graph's control edges between tasks once placed (TF sends them as it
    sends tensors), counted in ``Applied.note``.
    """
    applied = apply_plan(graph, task_plan(plan, servers), order=order)
    applied.cross_task = cross_task_control_edges(graph)
    applied.note = f"on {servers.n_tasks} tasks x {servers.devices_per_task} {servers.kind} devices; " \
                   f"{len(applied.cross_task)} control edges cross tasks"
    return applied


def cross_task_control_edges(graph) -> list[tuple[str, str]]:
    """Control edges of ``graph`` whose two ops are set on different tasks."""
    out = []
    for op in graph.get_operations():
        m = _TASK.search(op.device or "")
        for c in op.control_inputs:
            mc = _TASK.search(c.device or "")
            if m and mc and m.group(3) != mc.group(3):
                out.append((c.name, op.name))
    return out


def run_on_servers(build, plan, servers: LocalServers, *, steps: int = 5, timed: int = 5, trace: bool = False,
                   order: bool = True) -> RunResult:
    """Train a fresh model (``build()``) under ``plan`` on ``servers``.

    As :func:`tf_patch.workflow.run_placed`: losses of ``steps`` steps,
    median wall time of ``timed`` more, and with ``trace`` one FULL_TRACE
    step checked by :func:`trace_check_tasks`. Raises WorkerLostError if a
    server dies before or during the run.
    """
    import tensorflow as tf

    model = build()
    applied = apply_on_servers(model.graph, plan, servers, order=order)
    servers.check_alive()
    sess = tf.compat.v1.Session(servers.target, graph=model.graph, config=servers.session_config())

    def run(fetch, step, **kw):
        servers.check_alive()  # a server gone between steps: say so at once
        return sess.run(fetch, model.feed_fn(step), **kw)

    try:
        run(model.init_op, 0)
        losses = [float(run(model.fetches, s)[1]) for s in range(steps)]
        times = _time_runs(sess, model.train_op, lambda s: (servers.check_alive(), model.feed_fn(s))[1],
                           timed, steps) if timed else []
        checked = None
        if trace:
            md = tf.compat.v1.RunMetadata()
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            run(model.train_op, steps + timed, options=opts, run_metadata=md)
            checked = trace_check_tasks(md, applied)
    except tf.errors.OpError as exc:
        raise servers.lost(exc) from exc
    finally:
        servers.close_session(sess)
    return RunResult(losses, statistics.median(times) if times else float("nan"), times, applied, checked)


def run_step_on_servers(step, plan, servers: LocalServers, *, steps: int = 5, trace: bool = True):
    """Train a Keras / ``tf.function`` step (:class:`tf_patch.FunctionStep`)
    placed by ``plan`` on ``servers`` from the step's current variable values.

    Returns ``(losses, trace)`` (:func:`trace_check_tasks`, or None); sets
    ``step.applied``. The step's own session is closed first; it is not
    updated by this run (read the values from a new local run, as before).
    """
    import tensorflow as tf

    values = step.values()
    step.close()
    step.applied = apply_on_servers(step.tf_graph, plan, servers)
    step.plan, step.note = step.applied.plan, step.applied.note
    fetches = ([step.loss] if step.loss else []) + step.updates
    servers.check_alive()
    sess = tf.compat.v1.Session(servers.target, graph=step.tf_graph, config=servers.session_config())
    try:
        sess.run([op for _, op in step._init.values()], {ph: values[n] for n, (ph, _) in step._init.items()})
        losses = [float(sess.run(fetches, step.feed)[0]) if step.loss else float("nan") for _ in range(steps)]
        checked = None
        if trace:
            md = tf.compat.v1.RunMetadata()
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            sess.run(fetches, step.feed, options=opts, run_metadata=md)
            checked = trace_check_tasks(md, step.applied)
    except tf.errors.OpError as exc:
        raise servers.lost(exc) from exc
    finally:
        servers.close_session(sess)
    return losses, checked


def single_process_losses(build, steps: int, kind: str = "CPU") -> list[float]:
    """Losses of ``steps`` steps of a fresh model in this process, the reference
    for a distributed run: on one CPU device when the servers run on CPUs
    (even where this process sees a GPU), on TF's default device otherwise."""
    import tensorflow as tf

    model = build()
    if kind == "CPU":
        for op in model.graph.get_operations():
            op._set_device("/device:CPU:0")
    with tf.compat.v1.Session(graph=model.graph, config=session_config(1, kind=kind)) as sess:
        sess.run(model.init_op)
        return [float(sess.run(model.fetches, model.feed_fn(s))[1]) for s in range(steps)]


def _canon(name: str) -> str:
    m = _TASK.search(name.split(" ")[0])
    return f"/job:{m.group(1)}/replica:{m.group(2) or 0}/task:{m.group(3)}/device:{m.group(4).upper()}:{m.group(5)}" \
        if m else name


def trace_check_tasks(run_metadata, applied) -> dict:
    """Compare a traced distributed step with the applied plan.

    Returns ``{"devices": {op: device seen}, "misplaced": [(op, planned, seen)],
    "order_violations": [(a, b, end_a, start_b)], "checked_edges": n,
    "ops_per_device": {device: ops seen}}``; devices are task-qualified (the
    step stats of every task come back to the client). An added control edge
    (a, b) is respected when b starts no earlier than a ends (1 µs
    tolerance); edges are only compared within a device (one clock).
    """
    seen, start, end = {}, {}, {}
    for name, dev, _, ns in step_times(run_metadata):
        seen[name] = _canon(dev)
        start[name] = ns.all_start_micros
        end[name] = ns.all_start_micros + max(ns.op_end_rel_micros, ns.all_end_rel_micros)
    planned = {op: _canon(d) for op, d in applied.plan.placement.items()}
    misplaced = [(op, d, seen[op]) for op, d in planned.items() if op in seen and seen[op] != d]
    viol, n = [], 0
    fused = getattr(applied, "fused", {})  # an op oneDNN fused into another runs under the kernel's name
    for a, b in applied.control_edges:
        a, b = fused.get(a, a), fused.get(b, b)
        if a in end and b in start:
            n += 1
            if start[b] + 1 < end[a]:
                viol.append((a, b, end[a], start[b]))
    per: dict[str, int] = {}
    for op in planned:
        if op in seen:
            per[seen[op]] = per.get(seen[op], 0) + 1
    return {"devices": seen, "misplaced": misplaced, "order_violations": viol, "checked_edges": n,
            "ops_per_device": per, "traced": sum(op in seen for op in planned)}


def fit_task_transfers(servers: LocalServers, *, src=(0, 0), dst=(1, 0), sizes=(1 << 12, 1 << 16, 1 << 20, 1 << 22),
                       repeats: int = 5, hops: int = 8) -> tuple[float, float, float]:
    """``(beta0 µs, beta1 µs/byte, R^2)`` of transfers between two server devices
    (default task 0 -> task 1): a ping-pong chain of ``hops`` identities timed
    against the same chain on ``src`` alone, as :mod:`tf_patch.commfit` does on
    one machine."""
    import tensorflow as tf

    a, b = servers.device(*src), servers.device(*dst)
    graph, pairs = ping_pong_graph(a, b, sizes, hops)
    times = []
    servers.check_alive()
    sess = tf.compat.v1.Session(servers.target, graph=graph, config=servers.session_config())
    try:
        for remote, local in pairs:
            sess.run([remote, local])
            rem = [_timed(sess, remote) for _ in range(repeats)]
            loc = [_timed(sess, local) for _ in range(repeats)]
            times.append(max(0.0, (statistics.median(rem) - statistics.median(loc)) / hops))
    except tf.errors.OpError as exc:
        raise servers.lost(exc) from exc
    finally:
        servers.close_session(sess)
    return fit_line(list(sizes), times)


def _timed(sess, fetch) -> float:
    t0 = time.perf_counter()
    sess.run(fetch)
    return (time.perf_counter() - t0) * 1e6
