"""Op costs: measured on this machine, or estimated for a named GPU.

* :func:`measure` runs the step ``warmup`` times, then ``steps`` times with
  ``FULL_TRACE`` RunMetadata, and takes each op's median time
  (``op_end_rel_micros``) from the step stats, with its output bytes
  (allocation descriptions) and temporary memory where TF reports it
  (persistent bytes come from variable shapes in :mod:`tf_patch.extract`).
* :func:`estimate` asks grappler's analytical cost model (a virtual cluster
  with the DeviceProperties of a V100, A100 or H100) for the time of every op:
  no GPU needed, nothing is executed. Its numbers are roofline times (FLOPs
  vs memory traffic) and carry no kernel-launch overhead; ``overhead`` adds
  a fixed µs to every op that does work.

Examples
--------
>>> prof = measure(model, n_devices=1, steps=3)          # doctest: +SKIP
>>> est = estimate(model.graph, model.fetches, "v100")   # doctest: +SKIP
>>> est.costs["rnn/layer_0/t0/MatMul"] > 0              # doctest: +SKIP
True
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import statistics
from dataclasses import dataclass, field

from .devices import plan_device, session_config
from .extract import _as_graph, _as_op, _flatten
from .traces import step_times

__all__ = ["Profile", "measure", "estimate", "device_properties", "GPUS"]

# name -> (SMs, MHz, GB/s, GiB memory, compute capability, L2 bytes)
GPUS = {
    "v100": (80, 1530, 900, 16, "7.0", 6 << 20),
    "a100": (108, 1410, 1555, 40, "8.0", 40 << 20),
    "h100": (132, 1830, 3350, 80, "9.0", 50 << 20),
}


@dataclass
class Profile:
    """Per-op costs (µs) and memory (bytes) from one profiling run.

    ``costs[op]`` is the time on ``kind``; ``memory[op]`` may hold
    ``output_bytes``, ``temporary_bytes``, ``persistent_bytes``;
    ``devices[op]`` is where TF ran the op (measured runs);
    ``step_times`` the wall time of each traced step (µs).
    """

    costs: dict
    kind: str
    memory: dict = field(default_factory=dict)
    devices: dict = field(default_factory=dict)
    step_times: list = field(default_factory=list)
    source: str = ""
    cpu_costs: dict | None = None
    overhead: float = 0.0   # µs added per op by calibration (tf_patch.workflow)
    scale: float = 1.0      # factor applied to kernel times by calibration


def _progress(it, total, desc, show):
    if not show:
        return it
    try:
        from tqdm.auto import tqdm
        return tqdm(it, total=total, desc=desc, leave=False)
    except ImportError:
        return it


def measure(model=None, *, graph=None, fetches=None, feed_fn=None, init_op=None, session=None,
            n_devices: int = 1, steps: int = 5, warmup: int = 2, config=None,
            progress: bool = True) -> Profile:
    """Median op times over ``steps`` traced steps (after ``warmup``).

    Pass a :class:`tf_patch.zoo.ZooModel` or ``graph``/``fetches``/``feed_fn``.
    With ``session`` given, that session is used as is (already initialised).
    """
    import tensorflow as tf

    if model is not None:
        graph, fetches, feed_fn, init_op = model.graph, model.fetches, model.feed_fn, model.init_op
    feed_fn = feed_fn or (lambda step: {})
    own = session is None
    if own:
        session = tf.compat.v1.Session(graph=graph, config=config or session_config(n_devices))
        if init_op is not None:
            session.run(init_op)
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    times: dict[str, list] = {}
    mem: dict[str, dict] = {}
    where: dict[str, str] = {}
    walls = []
    try:
        for s in range(warmup):
            session.run(fetches, feed_fn(s))
        for s in _progress(range(steps), steps, "profiling", progress):
            md = tf.compat.v1.RunMetadata()
            session.run(fetches, feed_fn(warmup + s), options=opts, run_metadata=md)
            lo, hi = float("inf"), 0.0
            for name, dev, dur, ns in step_times(md):
                times.setdefault(name, []).append(dur)
                lo = min(lo, ns.all_start_micros)
                hi = max(hi, ns.all_start_micros + ns.all_end_rel_micros)
                if "/device:" in dev and "stream" not in dev:
                    try:
                        where[name] = plan_device(dev)
                    except ValueError:
                        pass
                if s == 0:
                    out = sum(o.tensor_description.allocation_description.requested_bytes for o in ns.output)
                    m = {"output_bytes": int(out)}
                    ms = ns.memory_stats
                    if ms.temp_memory_size:
                        m["temporary_bytes"] = int(ms.temp_memory_size)
                    mem[name] = m
            if hi > 0:
                walls.append(hi - lo)
    finally:
        if own:
            session.close()
    costs = {n: statistics.median(v) for n, v in times.items()}
    return Profile(costs, "CPU", mem, where, walls, source=f"measured ({steps} traced steps)")


def device_properties(gpu: str = "v100"):
    """grappler ``DeviceProperties`` of a named GPU ("v100", "a100", "h100")."""
    from tensorflow.core.protobuf import device_properties_pb2 as dp

    try:
        sms, mhz, gbs, gib, cc, l2 = GPUS[gpu.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {gpu!r}; known: {sorted(GPUS)}") from None
    return dp.DeviceProperties(
        type="GPU", vendor="NVIDIA", model=gpu.upper(), frequency=mhz, num_cores=sms,
        environment={"architecture": cc, "cuda": "11000", "cudnn": "8000"},
        num_registers=65536, l1_cache_size=128 << 10, l2_cache_size=l2,
        shared_memory_size_per_multiprocessor=96 << 10, memory_size=gib << 30,
        bandwidth=gbs * 1_000_000)  # KB/s


def _cpu_properties():
    from tensorflow.core.protobuf import device_properties_pb2 as dp
    return dp.DeviceProperties(type="CPU", vendor="GenuineIntel", frequency=2500, num_cores=16,
                               bandwidth=50_000_000, memory_size=64 << 30, l1_cache_size=32 << 10,
                               l2_cache_size=1 << 20, l3_cache_size=32 << 20)


def _reads_as_placeholders(gd, graph):
    """``gd`` with each read of a captured variable (a ``ReadVariableOp`` of a
    resource ``Placeholder``, as in a tf.function's graph) turned into a
    ``Placeholder`` of the read's static shape. Grappler's shape inference
    cannot see through such a handle, so without this every matmul on a
    weight is costed as if its dims were 1 (a Keras MLP: 0.3 µs instead of
    151 µs). The node keeps its name, so its (zero) cost maps back."""
    handles = {n.name for n in gd.node if n.op == "Placeholder" and n.attr["dtype"].type == 20}  # DT_RESOURCE
    for n in gd.node:
        if n.op != "ReadVariableOp" or not n.input or n.input[0].split(":")[0] not in handles:
            continue
        shape = graph.get_operation_by_name(n.name).outputs[0].shape
        if not shape.is_fully_defined():
            continue
        dtype = n.attr["dtype"].type
        n.op = "Placeholder"
        del n.input[:]
        n.attr.clear()
        n.attr["dtype"].type = dtype
        n.attr["shape"].shape.CopyFrom(shape.as_proto())
    return gd


def estimate(graph, fetches, gpu: str = "v100", *, cpu_ops=(), overhead: float = 0.0,
             progress: bool = True) -> Profile:
    """Analytical per-op times (µs) of one step on a named GPU via grappler.

    Ops named in ``cpu_ops`` (those with no GPU kernel) are costed on a host
    CPU device instead and returned in ``cpu_costs``.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import device_properties_pb2 as dp, meta_graph_pb2
    from tensorflow.python.grappler import cluster as gcluster, item as gitem

    graph = _as_graph(graph)
    gpu_name, cpu_name = "/job:localhost/replica:0/task:0/device:GPU:0", "/job:localhost/replica:0/task:0/device:CPU:0"
    cpu_ops = set(cpu_ops)
    steps = _progress(range(3), 3, f"grappler {gpu}", progress)
    it = iter(steps)
    next(it, None)
    gd = _reads_as_placeholders(graph.as_graph_def(), graph)
    for n in gd.node:
        n.device = cpu_name if n.name in cpu_ops else gpu_name
    mg = meta_graph_pb2.MetaGraphDef()
    mg.graph_def.CopyFrom(gd)
    fetch_names = [_as_op(graph, f).name for f in _flatten(fetches)]
    mg.collection_def["train_op"].node_list.value.extend(fetch_names)
    item = gitem.Item(mg, ignore_colocation=True)
    next(it, None)
    props = device_properties(gpu)
    # grappler refuses graphs bigger than the device; Pesto checks memory
    # itself (per placement), so let the estimate see a huge device
    props.memory_size = 1 << 50
    devices = [dp.NamedDevice(name=gpu_name, properties=props),
               dp.NamedDevice(name=cpu_name, properties=_cpu_properties())]
    cl = gcluster.Cluster(disable_detailed_stats=False, disable_timeline=False, devices=devices)
    try:
        _, run_time, step_stats = cl.MeasureCosts(item)
    finally:
        cl.Shutdown()
    next(it, None)
    costs, cpu_costs, mem = {}, {}, {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            us = ns.op_end_rel_nanos / 1000.0
            if us > 0:
                us += overhead
            (cpu_costs if ns.node_name in cpu_ops else costs)[ns.node_name] = us
            m = {"output_bytes": int(sum(o.tensor_description.allocation_description.requested_bytes
                                         for o in ns.output))}
            if ns.memory_stats.temp_memory_size:
                m["temporary_bytes"] = int(ns.memory_stats.temp_memory_size)
            mem[ns.node_name] = m
    return Profile(costs, "GPU", mem, {}, [run_time * 1e6], source=f"grappler analytical ({gpu})",
                   cpu_costs=cpu_costs)
