"""Logical devices and the session configuration every tf_patch run uses.

With real GPUs present the devices are ``/GPU:0..N-1``; without, TensorFlow
is asked for ``N`` virtual CPU devices (``ConfigProto.device_count``) and the
devices are ``/CPU:0..N-1`` of one physical CPU.

Examples
--------
>>> tf_device("/CPU:1")
'/job:localhost/replica:0/task:0/device:CPU:1'
>>> plan_device("/job:localhost/replica:0/task:0/device:GPU:0")
'/GPU:0'
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import re

__all__ = ["map_devices", "PREFIX", "tf_device", "plan_device", "detect", "session_config", "describe"]

PREFIX = "/job:localhost/replica:0/task:0/device:"
_SHORT = re.compile(r"^/?(?:device:)?(CPU|GPU):(\d+)$", re.I)
_LONG = re.compile(r"device:(CPU|GPU):(\d+)$", re.I)


def tf_device(name: str) -> str:
    """Plan device name (``/CPU:1``, ``/GPU:0``) -> full TF device string."""
    m = _SHORT.match(name)
    if m:
        return f"{PREFIX}{m.group(1).upper()}:{m.group(2)}"
    if _LONG.search(name):
        return name
    raise ValueError(f"cannot map device {name!r} to a TensorFlow device (expected '/GPU:k' or '/CPU:k')")


def plan_device(name: str) -> str:
    """Full TF device string -> short plan name ``/CPU:k`` / ``/GPU:k``."""
    m = _LONG.search(name) or _SHORT.match(name)
    if not m:
        raise ValueError(f"not a TensorFlow device name: {name!r}")
    return f"/{m.group(1).upper()}:{m.group(2)}"


def detect(n: int) -> tuple[str, list[str]]:
    """``("GPU", [...])`` if ``n`` physical GPUs exist, else ``("CPU", [...])``
    with ``n`` logical CPU devices; names in plan form."""
    import tensorflow as tf

    kind = "GPU" if len(tf.config.list_physical_devices("GPU")) >= n else "CPU"
    return kind, [f"/{kind}:{i}" for i in range(n)]


def session_config(n: int = 2, *, kind: str = "CPU", inter_op: int | None = None, intra_op: int = 1,
                   keep_order: bool = True, soft_placement: bool = False):
    """A ``ConfigProto`` with ``n`` devices and grappler kept from
    reordering, fusing or folding ops (so the plan's op names and order hold).

    The device model, on logical CPU devices: **one logical device = one
    core.** ``intra_op=1`` makes every kernel single-threaded (oneDNN and
    Eigen then run it in the executor thread that launched it), and
    ``inter_op`` (default ``n``) gives the session one executor thread per
    device. With a plan enforced (:func:`tf_patch.apply_plan` chains each
    device's ops in the plan's order) each device has at most one kernel
    running, so ``n`` threads run the ``n`` devices' chains at once, on
    ``n`` cores: two ``/CPU:k`` devices overlap on a 2-core machine. Without
    ``intra_op=1`` oneDNN's matmuls already use every core and two devices
    have nothing left to overlap with.

    Each session gets its own executor threads (``use_per_session_threads``):
    by default TensorFlow gives every session of a process the inter-op pool
    its *first* session sized, so after a one-thread profiling session every
    later 2-device run had one thread and its devices never overlapped
    ("cores used" 1.0). The kernel (intra-op) pool is still sized once per
    process, by the first session: keep ``intra_op=1`` throughout.

    Run TF's default placement (everything on device 0) with
    ``inter_op=1``: one device, one core, as one GPU would be. ``inter_op=0``
    leaves the number of executor threads to TensorFlow (one per core).

    On GPUs (``kind="GPU"``) the same settings only govern the few host ops:
    kernels run on each GPU's streams.

    Examples
    --------
    >>> cfg = session_config(2)                                      # doctest: +SKIP
    >>> cfg.inter_op_parallelism_threads, cfg.intra_op_parallelism_threads   # doctest: +SKIP
    (2, 1)
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2 as rw

    cfg = tf.compat.v1.ConfigProto(device_count={"CPU": n} if kind == "CPU" else {"GPU": n},
                                   inter_op_parallelism_threads=n if inter_op is None else inter_op,
                                   intra_op_parallelism_threads=intra_op,
                                   allow_soft_placement=soft_placement,
                                   # else every session shares the inter-op pool the process's
                                   # first session sized (a 1-thread profiling session would
                                   # leave later 2-device runs one thread)
                                   use_per_session_threads=True)
    if keep_order:
        r = cfg.graph_options.rewrite_options
        off = rw.RewriterConfig.OFF
        for field in ("layout_optimizer", "constant_folding", "shape_optimization", "remapping",
                      "arithmetic_optimization", "dependency_optimization", "loop_optimization",
                      "function_optimization", "debug_stripper", "scoped_allocator_optimization",
                      "pin_to_host_optimization", "implementation_selector", "auto_mixed_precision",
                      "common_subgraph_elimination"):
            if hasattr(r, field):
                setattr(r, field, off)
        r.disable_meta_optimizer = True
        r.min_graph_nodes = -1
        cfg.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
        cfg.graph_options.optimizer_options.do_constant_folding = False
        cfg.graph_options.optimizer_options.do_common_subexpression_elimination = False
        cfg.graph_options.optimizer_options.do_function_inlining = False
    return cfg


def map_devices(plan, n_devices: int = 0):
    """``(plan on this machine, one line saying so, devices needed)``: plan
    devices ``/GPU:k`` stay when there are that many GPUs, else become logical
    CPU devices ``/CPU:k`` (after ``/CPU:0`` when the plan uses that too)."""
    used = sorted(set(plan.placement.values()))
    gpus = [d for d in used if "GPU" in d.upper()]
    kind, _ = detect(max(n_devices, len(gpus)))
    if kind == "GPU" or not gpus:
        return plan, f"running on {', '.join(used)}", max(n_devices, len(used))
    shift = 1 if any(d.upper().endswith("CPU:0") for d in used) else 0
    to = {d: f"/CPU:{int(d.rsplit(':', 1)[1]) + shift}" if d in gpus else d for d in used}
    note = ("no GPU here: plan devices " + ", ".join(f"{d} -> {to[d]}" for d in gpus)
            + " (logical CPU devices of one physical CPU)")
    need = max(int(v.rsplit(":", 1)[1]) for v in to.values()) + 1
    placement = {op: to[d] for op, d in plan.placement.items()}
    order = {to.get(d, d): list(ops) for d, ops in plan.order.items()}
    return plan.replace(placement=placement, order=order), note, max(n_devices, need)


def describe(n: int) -> str:
    """One line saying which devices a run uses and whether they are logical."""
    kind, names = detect(n)
    if kind == "GPU":
        return f"using {n} physical GPU(s): {', '.join(names)}"
    return f"no GPU found: using {n} logical CPU devices of one physical CPU: {', '.join(names)}"
