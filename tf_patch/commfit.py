"""Fit the transfer model ``time = beta0 + beta1 * bytes`` between two devices.

For each size a float32 vector made on device A travels a ping-pong chain
of ``tf.identity`` ops alternating between A and B (TF inserts a Send/Recv
pair per hop); the same chain on A alone is the reference. The transfer time
is the difference of the medians over ``repeats`` interleaved runs, divided
by the number of hops. A least-squares line through (bytes, µs) gives beta0,
beta1 and R^2.

The line is used only when it explains the points (``R^2 >= MIN_R2``), and
still does with any one of them left out: sizes grow by powers of 4, so the
largest dominates R^2, and one noisy time there would otherwise make a line
through flat noise (seen between logical CPU devices: R^2 0.96 from one
16 MiB point, 0.30 without it). Otherwise :func:`fit_transfers` falls back,
and :class:`CommFit` says so:

* between logical CPU devices a transfer copies nothing (TF hands the
  consumer a reference to the same host buffer), so its time grows little
  if at all with size and a line through noise means nothing: the fallback
  is a constant, the median measured time per transfer (``beta1 = 0``);
* between GPUs the fallback is :data:`pesto.cluster.NVLINK_GG`, the
  documented NVLink preset.

Examples
--------
>>> fit = fit_transfers(2, sizes=[1 << 12, 1 << 20], repeats=3)   # doctest: +SKIP
>>> cluster = fit.cluster()                                       # doctest: +SKIP
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import statistics
import time
from dataclasses import dataclass

import numpy as np

from pesto.cluster import NVLINK_GG, GiB, gpus, logical_cpus
from pesto.memory import fmt_bytes

from .devices import detect, session_config, tf_device

__all__ = ["CommFit", "fit_line", "without_one", "measure_transfers", "fit_transfers", "choose_model", "MIN_R2"]

DEFAULT_SIZES = tuple(1 << k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB
MIN_R2 = 0.9  # below this the fitted line is not used (see the module docstring)


@dataclass
class CommFit:
    """The transfer model used: ``beta0`` (µs), ``beta1`` (µs/byte).

    ``line`` is the least-squares fit ``(beta0, beta1)`` through the
    measured ``times``, ``r2`` its R^2 and ``r2_without_one`` the lowest
    R^2 of the line fitted with one point left out (NaN under 4 points);
    ``fallback`` is empty when the line is used, else says what replaced it
    and why (module docstring).
    """

    beta0: float
    beta1: float
    r2: float
    sizes: list
    times: list
    n_devices: int = 2
    kind: str = "CPU"
    line: tuple = (float("nan"), float("nan"))
    fallback: str = ""
    r2_without_one: float = float("nan")

    def cluster(self, memory: int | None = None):
        """``pesto.cluster.logical_cpus(n)`` with this fit on every route
        (``gpus(n)`` with it when the devices are GPUs)."""
        beta = (max(self.beta0, 0.0), max(self.beta1, 0.0))
        if self.kind == "GPU":
            return gpus(self.n_devices, beta=beta, memory=memory or 16 * GiB)
        return logical_cpus(self.n_devices, beta=beta, memory=memory or 4 * GiB)

    def __str__(self):
        fit = (f"{self.line[0]:.2f} us + {self.line[1] * 1e6:.4f} us/MB (R^2 = {self.r2:.3f}, "
               f"{len(self.sizes)} sizes)")
        if not self.fallback:
            loo = self.r2_without_one
            return "transfer fit: " + fit[:-1] + (f", {loo:.3f} or more without any one)" if loo == loo else ")")
        return (f"transfer fit {fit} not used: {self.fallback}; using {self.beta0:.2f} us + "
                f"{self.beta1 * 1e6:.4f} us/MB")


def fit_line(sizes, times) -> tuple[float, float, float]:
    """Least squares ``times ~ beta0 + beta1 * sizes``; returns (beta0, beta1, R^2)."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if len(x) < 2:
        raise ValueError("need at least two sizes to fit a line")
    A = np.vstack([np.ones_like(x), x]).T
    (b0, b1), *_ = np.linalg.lstsq(A, y, rcond=None)
    ss_res = float(np.sum((y - (b0 + b1 * x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return float(b0), float(b1), r2


def without_one(sizes, times) -> tuple[float, int]:
    """The lowest R^2 of the line fitted with one point left out, and that
    point's size; ``(nan, 0)`` with fewer than 4 points (a line through 2
    explains them by construction).

    Examples
    --------
    >>> r2, size = without_one([1, 4, 16, 64], [3.0, 2.0, 3.0, 40.0])  # one point makes the line
    >>> round(r2, 2), size
    (0.11, 64)
    >>> round(without_one([1, 4, 16, 64], [3.0, 6.0, 18.0, 66.0])[0], 3)  # a real line
    1.0
    """
    sizes, times = list(sizes), list(times)  # arrays would add elementwise below
    if len(sizes) < 4:
        return float("nan"), 0
    fits = [(fit_line(sizes[:i] + sizes[i + 1:], times[:i] + times[i + 1:])[2], sizes[i])
            for i in range(len(sizes))]
    return min(fits)


def ping_pong_graph(a: str, b: str, sizes, hops: int, *, work: int = 0):
    """``(tf.Graph, [(remote, local) per size])``: per size, a chain of
    ``hops`` ``tf.identity`` ops alternating between devices ``a`` and ``b``
    (``remote``) and the same chain on ``a`` alone (``local``), each ending
    in a sum. ``work``: see :func:`measure_transfers`."""
    import tensorflow as tf

    graph, pairs = tf.Graph(), []
    with graph.as_default():
        for nbytes in sizes:
            n = max(1, nbytes // 4)
            fetch = []
            for far in (b, a):  # ping-pong, then the local reference
                with tf.device(a):
                    x = tf.compat.v1.random_uniform([n], seed=1)
                for h in range(hops):
                    with tf.device(far if h % 2 == 0 else a):
                        if work and h < hops - 1:
                            w = tf.ones([work, work]) * (1.0 + 0.0 * x[0])  # runs once x is here
                            with tf.control_dependencies([tf.matmul(w, w)]):
                                x = tf.identity(x)
                        else:
                            x = tf.identity(x) if h < hops - 1 else tf.reduce_sum(x)
                fetch.append(x)
            pairs.append(fetch)
    return graph, pairs


def measure_transfers(n_devices: int = 2, sizes=DEFAULT_SIZES, repeats: int = 9,
                      src: int = 0, dst: int = 1, hops: int = 16, progress: bool = False,
                      work: int = 0) -> list[float]:
    """Median µs to move ``sizes`` bytes from device ``src`` to ``dst``.

    A ping-pong chain of ``hops`` ``tf.identity`` ops alternating between the
    two devices is timed against the same chain on one device; the
    difference over ``hops`` is the cost of one transfer (a chain makes the
    difference large enough to stand above timer and scheduling noise).

    ``work > 0``: each hop first runs a ``work x work`` matmul on its device
    (after the tensor arrived), as a training step's kernels do, so the
    receiving device's executor thread has gone idle when the tensor comes:
    the transfer then includes waking it, as in a real step.
    """
    import tensorflow as tf

    kind, _ = detect(max(n_devices, src + 1, dst + 1))
    a, b = tf_device(f"/{kind}:{src}"), tf_device(f"/{kind}:{dst}")
    graph, pairs = ping_pong_graph(a, b, sizes, hops, work=work)
    out = []
    sess = tf.compat.v1.Session(graph=graph, config=session_config(max(n_devices, src + 1, dst + 1), kind=kind))
    try:
        it = list(zip(sizes, pairs))
        if progress:
            from tqdm.auto import tqdm
            it = tqdm(it, desc="commfit", leave=False)
        for nbytes, (remote, local) in it:
            for _ in range(3):  # warm-up (first runs allocate and build executors)
                sess.run([remote, local])
            rem, loc = [], []
            for _ in range(repeats):  # interleaved, so load changes hit both alike
                t0 = time.perf_counter()
                sess.run(remote)
                t1 = time.perf_counter()
                sess.run(local)
                t2 = time.perf_counter()
                rem.append(t1 - t0)
                loc.append(t2 - t1)
            diff = (statistics.median(rem) - statistics.median(loc)) * 1e6
            out.append(max(0.0, diff / hops))
    finally:
        sess.close()
    return out


def fit_transfers(n_devices: int = 2, sizes=DEFAULT_SIZES, repeats: int = 9,
                  progress: bool = False, min_r2: float = MIN_R2, work: int = 0) -> CommFit:
    """Measure device 0 -> 1 over ``sizes`` and fit the line; below
    ``min_r2`` fall back as the module docstring says. ``work``: see
    :func:`measure_transfers`.

    Examples
    --------
    >>> fit = fit_transfers(2, sizes=[1 << 10, 1 << 20], repeats=2)   # doctest: +SKIP
    >>> fit.fallback                                                 # doctest: +SKIP
    'R^2 < 0.9: between logical CPU devices ...'
    """
    sizes = list(sizes)
    kind = detect(n_devices)[0]
    times = measure_transfers(n_devices, sizes, repeats, progress=progress, work=work)
    b0, b1, r2 = fit_line(sizes, times)
    return choose_model(b0, b1, r2, sizes, times, n_devices, kind, min_r2)


def choose_model(b0, b1, r2, sizes, times, n_devices: int = 2, kind: str = "CPU",
                 min_r2: float = MIN_R2) -> CommFit:
    """The :class:`CommFit` of a fitted line: the line itself when
    ``r2 >= min_r2`` and still with any one point left out
    (:func:`without_one`), else the fallback of ``kind``.

    Examples
    --------
    >>> choose_model(3.0, 1e-6, 0.99, [1, 2], [3.0, 3.0]).fallback
    ''
    >>> fit = choose_model(5.0, -1e-7, 0.1, [1024, 4096, 1 << 20], [2.0, 3.0, 10.0])
    >>> (fit.beta0, fit.beta1)
    (3.0, 0.0)
    >>> choose_model(5.0, -1e-7, 0.1, [1, 2], [2.0, 3.0], kind="GPU").beta0
    40.77
    """
    sizes, times, line = list(sizes), list(times), (float(b0), float(b1))
    loo, point = without_one(sizes, times)
    if r2 >= min_r2 and not loo < min_r2:
        return CommFit(b0, b1, r2, sizes, times, n_devices, kind, line, r2_without_one=loo)
    why = (f"R^2 < {min_r2}" if r2 < min_r2 else
           f"R^2 = {r2:.3f} rests on one point ({loo:.3f} without the {fmt_bytes(point)} one)")
    if kind == "GPU":
        return CommFit(*NVLINK_GG, r2, sizes, times, n_devices, kind, line,
                       f"{why}: using pesto.cluster's NVLink preset", loo)
    why += (": between logical CPU devices a transfer copies nothing (the consumer gets a reference), so its "
            "time grows little if at all with size; using the median measured time per transfer")
    return CommFit(float(np.median(times)), 0.0, r2, sizes, times, n_devices, kind, line, why, loo)
