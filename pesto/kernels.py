"""Compiled kernels on a Problem's flat arrays (numba, ``cache=True``).

The Problem keeps Python lists (readable, cheap to build); what a search
evaluates thousands of times runs here on int64/float64 CSR arrays built once
per Problem and cached on it. :mod:`pesto.engine` holds the event loop itself;
this module holds the array builder, the placed longest path that the
list-schedule priority needs, and :func:`kernel`, which picks the compiled
kernel or its plain-Python twin. ``NUMBA_DISABLE_JIT=1`` runs everything as
plain Python (for a debugger; much slower).

Compiling costs seconds once per install (``make install`` warms the cache,
see :func:`pesto.engine.warm_up`). A small problem must not pay that inside a
short time limit, so while a kernel is neither compiled in this process nor
cached on disk, problems under ``COMPILE_MIN_OPS`` ops run its Python twin:
the same source, so the same results.

Examples
--------
>>> ptr, idx = csr([[1, 2], [], [0]])
>>> ptr.tolist(), idx.tolist()
([0, 2, 2, 3], [1, 2, 0])
"""
from __future__ import annotations

import os
import types
from contextlib import contextmanager

import numpy as np
from numba import njit
from numba.core.dispatcher import Dispatcher

__all__ = ["csr", "FlatArrays", "placed_ranks", "kernel", "interpreted", "compiled", "COMPILE_MIN_OPS"]

#: Below this many ops an uncompiled kernel runs as Python rather than
#: compiling (a replay of 400 ops in Python takes a few ms; compiling, seconds).
COMPILE_MIN_OPS = 400

_TWINS: dict = {}


def interpreted(fn):
    """The plain-Python twin of njit kernel ``fn``: its source run by the
    interpreter, with the kernels it calls replaced by their twins too (so
    calling it never compiles anything)."""
    twin = _TWINS.get(fn)
    if twin is None:
        py = fn.py_func
        env = dict(py.__globals__)
        twin = _TWINS[fn] = types.FunctionType(py.__code__, env, py.__name__, py.__defaults__,
                                               py.__closure__)
        for name, value in env.items():
            if isinstance(value, Dispatcher):
                env[name] = interpreted(value)
    return twin


@contextmanager
def compiled():
    """Within it, :func:`kernel` always picks the compiled kernel (what
    :func:`pesto.engine.warm_up` uses to fill the cache)."""
    global COMPILE_MIN_OPS
    saved, COMPILE_MIN_OPS = COMPILE_MIN_OPS, 0
    try:
        yield
    finally:
        COMPILE_MIN_OPS = saved


def _cached_on_disk(fn) -> bool:
    try:  # numba's cache index; private layout, so any surprise means "not cached"
        return os.path.exists(fn._cache._cache_file._index_path)
    except AttributeError:
        return False


def kernel(fn, n: int):
    """``fn`` itself, or its :func:`interpreted` twin for a problem of ``n`` ops
    when ``n < COMPILE_MIN_OPS`` and ``fn`` is neither compiled in this process
    nor cached on disk."""
    if not isinstance(fn, Dispatcher):  # NUMBA_DISABLE_JIT: already plain Python
        return fn
    if n >= COMPILE_MIN_OPS or fn.signatures or _cached_on_disk(fn):
        return fn
    return interpreted(fn)


def csr(rows) -> tuple[np.ndarray, np.ndarray]:
    """``(ptr, idx)`` int64 arrays of a list of int sequences: row ``r`` is
    ``idx[ptr[r]:ptr[r + 1]]``."""
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    idx = np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx


class FlatArrays:
    """A Problem's adjacency, durations and comm fits as arrays (built once,
    cached on the Problem): ``succ_ptr/succ_idx`` and ``npred``; out-edges
    ``out_ptr/out_idx/out_bytes`` (successor, edge bytes); ``rtopo`` (reverse
    topological order); ``dur`` (n x nd), ``b0``, ``b1`` (nd x nd)."""

    def __init__(self, prob):
        self.succ_ptr, self.succ_idx = csr(prob.succ)
        self.npred = np.array([len(p) for p in prob.pred], dtype=np.int64)
        self.out_ptr, self.out_idx = csr([[j for j, _ in o] for o in prob.outs])
        self.out_bytes = np.fromiter((b for o in prob.outs for _, b in o), dtype=np.float64,
                                     count=int(self.out_ptr[-1]))
        self.rtopo = np.array(prob.topo[::-1], dtype=np.int64)
        self.dur = np.array(prob.dur, dtype=np.float64).reshape(prob.n, prob.nd)
        self.b0 = np.array(prob.beta0, dtype=np.float64).reshape(prob.nd, prob.nd)
        self.b1 = np.array(prob.beta1, dtype=np.float64).reshape(prob.nd, prob.nd)

    @staticmethod
    def of(prob) -> "FlatArrays":
        hit = prob.__dict__.get("_flat_arrays")
        if hit is None:
            hit = prob.__dict__["_flat_arrays"] = FlatArrays(prob)
        return hit


def placed_ranks(prob, dev) -> np.ndarray:
    """Longest path from each op's start to a sink under placement ``dev``
    (what :meth:`pesto.problem.Problem.placed_bottom_levels` returns, as a
    float64 array)."""
    ar = FlatArrays.of(prob)
    return kernel(_placed_ranks, prob.n)(ar.rtopo, ar.out_ptr, ar.out_idx, ar.out_bytes, ar.dur,
                         np.asarray(dev, dtype=np.int64), ar.b0, ar.b1)


@njit(cache=True)
def _placed_ranks(rtopo, out_ptr, out_idx, out_bytes, dur, dev, b0, b1):
    rank = np.zeros(rtopo.shape[0], dtype=np.float64)
    for i in rtopo:
        best = 0.0
        a = dev[i]
        for m in range(out_ptr[i], out_ptr[i + 1]):
            j = out_idx[m]
            v = rank[j]
            b = dev[j]
            nb = out_bytes[m]
            if a != b and nb > 0:
                v += b0[a, b] + b1[a, b] * nb
            if v > best:
                best = v
        rank[i] = dur[i, a] + best
    return rank
