"""Pipeline schedules as data: each device's tasks, in the order it runs them.

A :class:`Schedule` turns ``(stage, stages, micro_batches)`` (``stage``: a
device of the pipeline, ``stages``: the devices) into typed :class:`Action`
s: ``F`` a slice's forward part, ``B`` its backward part (its input
gradients; with the weight gradients too when the schedule does not split
the backward), ``W`` its weight gradients (split-backward schedules only),
each of one model ``chunk``. A schedule with ``chunks`` v > 1 cuts the step
into ``stages * v`` contiguous *virtual stages*; :meth:`Schedule.device` and
:meth:`Schedule.chunk` say where virtual stage ``s`` runs: ``"loop"``
(interleaved: device ``s mod p``, chunk ``s // p``) or ``"v"`` (ZB-V:
chunk 0 on devices ``0..p-1``, chunk 1 back on ``p-1..0``). The registry
:data:`SCHEDULES` is the one list of schedules the pipeline placers, the
hybrid and the slice model read; a new schedule is one more entry.

* ``gpipe``: every forward, then every backward (GPipe).
* ``1f1b``: ``p - s - 1`` forwards to warm up, then one forward / one
  backward, then the backwards left (PipeDream-flush).
* ``interleaved``: Megatron-LM's interleaved 1F1B with 2 chunks per device
  (:func:`interleaved`: any ``v``); ``M`` must be a multiple of the stages.
* ``zb-h1``: Zero Bubble's ZB-H1 (Qi et al., ICLR'24): 1F1B's warm-up and
  activation memory, and device ``s`` defers ``s`` weight-gradient tasks to
  the drain (the bubble goes from ``(p-1)(F+B+W)`` to ``(p-1)(F+B-W)``).
* ``zb-h2``: ZB-H2: ``2(p - s) - 1`` forwards to warm up (about twice the
  memory), then the paper's rules at ``T_F = T_B = T_W`` (a backward as soon
  as it can run, else a forward under the ``2p - 1`` in-flight limit, else a
  deferred weight gradient): almost no bubble.
* ``zb-v``: ZB-V: 2 chunks per device in a V, 1F1B's memory, the order of
  PyTorch's ``ScheduleZBVZeroBubble``.

:func:`unit_run` runs a schedule's lists with fixed task times (the check
that they cannot deadlock, and the figures of ``benchmarks/results/schedules.md``).

>>> [f"{a.kind}{a.slice}" for a in SCHEDULES["1f1b"].actions(0, 3, 4)]
['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
>>> [f"{a.kind}{a.slice}" for a in SCHEDULES["zb-h1"].actions(1, 2, 3)]
['F0', 'B0', 'F1', 'B1', 'W0', 'F2', 'B2', 'W1', 'W2']
>>> unit_run("1f1b", 4, 8).step, unit_run("zb-h1", 4, 8).step
(33.0, 27.0)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

__all__ = ["Action", "Schedule", "SCHEDULES", "actions", "interleaved", "UnitRun", "unit_run"]


@dataclass(frozen=True)
class Action:
    """One task of a device: ``kind`` ``"F"``, ``"B"`` or ``"W"`` of slice ``slice`` (model chunk ``chunk``)."""

    kind: str
    slice: int
    chunk: int = 0


@dataclass(frozen=True)
class Schedule:
    """A named schedule (module doc).

    Attributes
    ----------
    name : str
    order : callable
        ``order(stage, stages, m)`` -> the device's actions in order.
    doc : str
    chunks : int
        Model chunks per device (virtual stages per device).
    split_backward : bool
        Whether weight gradients are ``W`` tasks of their own (else in ``B``).
    shape : str
        ``"loop"`` or ``"v"``: the virtual stage -> device map.
    whole_rounds : bool
        ``M`` must be a multiple of the stages (Megatron's interleaved schedule).
    """

    name: str
    order: Callable[[int, int, int], list[Action]]
    doc: str = ""
    chunks: int = 1
    split_backward: bool = False
    shape: str = "loop"
    whole_rounds: bool = False

    def actions(self, stage: int, stages: int, m: int) -> list[Action]:
        return self.order(stage, stages, m)

    @property
    def plain(self) -> bool:
        """One chunk, backward whole: GPipe and 1F1B."""
        return self.chunks == 1 and not self.split_backward

    def device(self, virtual: int, stages: int) -> int:
        """The device of virtual stage ``virtual`` of ``stages * chunks``.

        >>> [SCHEDULES["zb-v"].device(s, 3) for s in range(6)]
        [0, 1, 2, 2, 1, 0]
        >>> [SCHEDULES["interleaved"].device(s, 3) for s in range(6)]
        [0, 1, 2, 0, 1, 2]
        """
        c, d = divmod(virtual, stages)
        return stages - 1 - d if self.shape == "v" and c % 2 else d

    def chunk(self, virtual: int, stages: int) -> int:
        """The model chunk of virtual stage ``virtual``."""
        return virtual // stages

    def virtual(self, stage: int, chunk: int, stages: int) -> int:
        """The virtual stage of ``chunk`` on device ``stage`` (inverse of :meth:`device`, :meth:`chunk`)."""
        return chunk * stages + (stages - 1 - stage if self.shape == "v" and chunk % 2 else stage)

    def refuses(self, stages: int, m: int) -> str:
        """Why ``m`` slices over ``stages`` devices do not fit the schedule ("" when they do)."""
        if self.whole_rounds and m % stages:
            return f"{self.name} needs the micro-batches ({m}) to be a multiple of the stages ({stages})"
        return ""


def _gpipe(stage: int, stages: int, m: int) -> list[Action]:
    """Every slice's forward, then every slice's backward (GPipe)."""
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def _one_f_one_b(stage: int, stages: int, m: int) -> list[Action]:
    """``stages - stage - 1`` forwards to warm up, then one forward and one
    backward in turn, then the backwards left (1F1B, PipeDream-Flush)."""
    w = min(stages - stage - 1, m)
    seq = [Action("F", i) for i in range(w)]
    for j in range(m - w):
        seq += [Action("F", w + j), Action("B", j)]
    return seq + [Action("B", i) for i in range(m - w, m)]


def interleaved(v: int) -> Callable[[int, int, int], list[Action]]:
    """Megatron-LM's interleaved 1F1B with ``v`` chunks per device.

    Forward task ``k`` of device ``r`` is chunk ``(k // p) % v`` of slice
    ``(k // (p v)) p + k % p`` (backward: chunks in reverse); warm-up
    ``2 (p - r - 1) + (v - 1) p`` forwards, then one forward / one backward,
    then the backwards left. ``M`` a multiple of ``p``.

    >>> [f"{a.kind}{a.slice}.{a.chunk}" for a in interleaved(2)(1, 2, 2)]
    ['F0.0', 'F1.0', 'F0.1', 'B0.1', 'F1.1', 'B1.1', 'B0.0', 'B1.0']
    """
    def order(stage: int, stages: int, m: int) -> list[Action]:
        p, total = stages, m * v

        def task(kind: str, k: int) -> Action:
            c = (k // p) % v
            return Action(kind, (k // (p * v)) * p + k % p, c if kind == "F" else v - 1 - c)

        w = min(2 * (p - stage - 1) + (v - 1) * p, total)
        seq = [task("F", k) for k in range(w)]
        for j in range(total - w):
            seq += [task("F", w + j), task("B", j)]
        return seq + [task("B", k) for k in range(total - w, total)]
    return order


def _zb_h1(stage: int, stages: int, m: int) -> list[Action]:
    """ZB-H1: 1F1B's ``p - s - 1`` warm-up forwards; then ``s`` forward /
    input-gradient pairs whose weight gradients wait; then forward, input
    gradient, the oldest weight gradient; the drain: input gradient, oldest
    weight gradient; then the weight gradients left (the order of DeepSpeed's
    ``ZeroBubbleH1Pipeline`` in sail-sg/zero-bubble-pipeline-parallelism)."""
    f = min(stages - stage - 1, m)
    seq = [Action("F", i) for i in range(f)]
    b, wq = 0, deque()

    def back():
        nonlocal b
        seq.append(Action("B", b))
        wq.append(b)
        b += 1
    for _ in range(stage):
        if f < m:
            seq.append(Action("F", f))
            f += 1
            back()
    while f < m:
        seq.append(Action("F", f))
        f += 1
        back()
        seq.append(Action("W", wq.popleft()))
    while b < m:
        back()
        seq.append(Action("W", wq.popleft()))
    return seq + [Action("W", i) for i in wq]


def _zb_h2(stage: int, stages: int, m: int) -> list[Action]:
    """ZB-H2: the rules of the module doc run with unit task times on every
    device at once (so each device's list is the order they produce)."""
    return _greedy_orders(stages, m, 2 * stages - 1)[stage]


def _greedy_orders(p: int, m: int, limit: int) -> list[list[Action]]:
    """Every device's order under Zero Bubble's rules at ``T_F = T_B = T_W = 1``:
    an idle device runs the input gradient it can (oldest first), else the
    next forward when fewer than ``limit`` slices hold activations on it (and
    ``2 (p - s) - 1`` forwards at most before its first input gradient),
    else its oldest deferred weight gradient."""
    f, b, w = [0] * p, [0] * p, [0] * p
    f_end = [[None] * m for _ in range(p)]
    b_end = [[None] * m for _ in range(p)]
    seqs: list[list[Action]] = [[] for _ in range(p)]
    t = 0
    while any(x < m for x in w):
        for s in range(p):
            if b[s] < m and f[s] > b[s] and _done(f_end[s][b[s]], t) and (
                    s == p - 1 or _done(b_end[s + 1][b[s]], t)):
                seqs[s].append(Action("B", b[s]))
                b_end[s][b[s]] = t + 1
                b[s] += 1
            elif f[s] < m and f[s] - w[s] < limit and (b[s] > 0 or f[s] < 2 * (p - s) - 1) and (
                    s == 0 or _done(f_end[s - 1][f[s]], t)):
                seqs[s].append(Action("F", f[s]))
                f_end[s][f[s]] = t + 1
                f[s] += 1
            elif w[s] < b[s]:
                seqs[s].append(Action("W", w[s]))
                w[s] += 1
        t += 1
        if t > 3 * m * p + 2 * p:   # every task done by then if any device ever moves
            raise RuntimeError(f"zb-h2 orders for {p} stages, M={m}: no progress by t={t}")
    return seqs


def _done(end, t: int) -> bool:
    return end is not None and end <= t


def _zb_v(stage: int, stages: int, m: int) -> list[Action]:
    """ZB-V (PyTorch's ``ScheduleZBVZeroBubble``): chunk 0 of device ``r`` is
    virtual stage ``r``, chunk 1 virtual stage ``2p - 1 - r``. Warm-up:
    ``2 (p - r) - 1`` chunk-0 forwards, ``r`` pairs (chunk-1 forward,
    chunk-0 forward), ``p - r`` triples of chunk 1 (F, B, W); steady: chunk
    0's F, B, W then chunk 1's; drain: ``r`` pairs of input gradients (chunk
    0, chunk 1), ``p - r`` chunk-0 (B, W), then the weight gradients left,
    chunk 1's first. Computed for ``max(M, 2p - 1)`` slices, the tasks of
    slices past ``M`` dropped."""
    p, n = stages, max(m, 2 * stages - 1)
    cnt = {(k, c): 0 for k in "FBW" for c in (0, 1)}
    seq: list[Action] = []

    def add(kind: str, c: int) -> None:
        seq.append(Action(kind, cnt[kind, c], c))
        cnt[kind, c] += 1
    for _ in range(2 * (p - stage) - 1):
        add("F", 0)
    for _ in range(stage):
        add("F", 1)
        add("F", 0)
    for _ in range(p - stage):
        _each(add, ("F", 1), ("B", 1), ("W", 1))
    while cnt["F", 1] < cnt["F", 0] or cnt["F", 0] < n:
        if cnt["F", 0] < n:
            add("F", 0)
        _each(add, ("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
    for _ in range(stage):
        _each(add, ("B", 0), ("B", 1))
    for _ in range(p - stage):
        _each(add, ("B", 0), ("W", 0))
    for c in (1, 0):
        while cnt["W", c] < cnt["B", c]:
            add("W", c)
    return [a for a in seq if a.slice < m]


def _each(add: Callable[[str, int], None], *tasks: tuple) -> None:
    for kind, chunk in tasks:
        add(kind, chunk)


#: The schedules by name (insertion order: the order the search screens them).
SCHEDULES: Mapping[str, Schedule] = MappingProxyType({
    "gpipe": Schedule("gpipe", _gpipe, "all forwards, then all backwards"),
    "1f1b": Schedule("1f1b", _one_f_one_b, "one forward, one backward"),
    "interleaved": Schedule("interleaved", interleaved(2), "1F1B over 2 chunks per device (Megatron-LM)",
                            chunks=2, whole_rounds=True),
    "zb-h1": Schedule("zb-h1", _zb_h1, "1F1B's memory, deferred weight-gradient tasks fill the drain (Zero Bubble)",
                      split_backward=True),
    "zb-h2": Schedule("zb-h2", _zb_h2, "twice 1F1B's memory, almost no bubble (Zero Bubble)",
                      split_backward=True),
    "zb-v": Schedule("zb-v", _zb_v, "2 chunks per device in a V, 1F1B's memory (Zero Bubble)",
                     chunks=2, split_backward=True, shape="v"),
})


def actions(schedule: str, stage: int, stages: int, m: int) -> list[Action]:
    """``SCHEDULES[schedule].actions(...)``.

    >>> [(a.kind, a.slice) for a in actions("gpipe", 0, 2, 2)]
    [('F', 0), ('F', 1), ('B', 0), ('B', 1)]

    Raises
    ------
    ValueError
        An unknown schedule.
    """
    return get(schedule).actions(stage, stages, m)


def get(schedule: str) -> Schedule:
    """``SCHEDULES[schedule]``, or a ValueError naming the known ones."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {list(SCHEDULES)}")
    return SCHEDULES[schedule]


@dataclass(frozen=True)
class UnitRun:
    """A schedule run with fixed task times (:func:`unit_run`).

    Attributes
    ----------
    step : float
        When the last task ends (every device starts at 0).
    busy : tuple of float
        Per device, its tasks' time.
    bubble : float
        ``1 - sum(busy) / (devices * step)``: the idle share of the step.
    stage_bubble : float
        The most idle time of one device between its first task's start and
        its last task's end, over ``step`` (Zero Bubble's measure: the fill
        before a device's first task and the drain after its last are not
        counted, as when steps follow each other without a barrier).
    peak : tuple of float
        Per device, the most slices whose activations it holds at once
        (a chunk's slice counts ``1 / chunks``; held from its forward's start
        to the end of its weight gradient, of its backward without split).
    """

    step: float
    busy: tuple
    bubble: float
    stage_bubble: float
    peak: tuple


def unit_run(schedule: str, stages: int, m: int, times: tuple = (1.0, 1.0, 1.0), comm: float = 0.0) -> UnitRun:
    """Run every device's list in order, each task as soon as its device is
    free and what it needs is done: ``F`` the slice's forward on the virtual
    stage before (plus ``comm`` across devices), ``B`` its forward here and
    its backward on the virtual stage after, ``W`` its backward here.
    ``times``: ``T_F, T_B, T_W`` of a whole stage (a chunk's task takes
    ``1 / chunks`` of it; ``B`` takes ``T_B + T_W`` when the schedule does
    not split the backward).

    >>> r = unit_run("gpipe", 2, 2)
    >>> r.step, r.busy, round(r.bubble, 3), r.peak
    (9.0, (6.0, 6.0), 0.333, (2.0, 2.0))

    Raises
    ------
    ValueError
        The lists deadlock (naming each stuck device's next task), or a
        device's list misses or repeats a task.
    """
    sch = get(schedule)
    p, v = stages, sch.chunks
    seqs = [sch.actions(s, p, m) for s in range(p)]
    _check_tasks(sch, seqs, m)
    tf, tb, tw = times
    dur = {"F": tf / v, "B": (tb if sch.split_backward else tb + tw) / v, "W": tw / v}
    end: dict[tuple, float] = {}
    free, nxt, first = [0.0] * p, [0] * p, [None] * p
    acts: list[list[tuple]] = [[] for _ in range(p)]
    last = p * v - 1
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while nxt[s] < len(seqs[s]):
                a = seqs[s][nxt[s]]
                vs = sch.virtual(s, a.chunk, p)
                need = _needs(sch, a, vs, last, p, comm)
                if any(key not in end for key, _ in need):
                    break
                start = max([free[s]] + [end[key] + lag for key, lag in need])
                free[s] = end[a.kind, a.slice, vs] = start + dur[a.kind]
                first[s] = start if first[s] is None else first[s]
                release = "W" if sch.split_backward else "B"
                acts[s] += [(start, 1.0 / v)] if a.kind == "F" else [(free[s], -1.0 / v)] if a.kind == release else []
                nxt[s] += 1
                progress = True
    stuck = [f"device {s}: {seqs[s][nxt[s]]}" for s in range(p) if nxt[s] < len(seqs[s])]
    if stuck:
        raise ValueError(f"schedule {schedule!r} deadlocks with {p} stages and M={m}: " + "; ".join(stuck))
    step = max(free)
    busy = tuple(sum(dur[a.kind] for a in seq) for seq in seqs)
    if not step:
        return UnitRun(0.0, busy, 0.0, 0.0, tuple(0.0 for _ in range(p)))
    idle = max(free[s] - first[s] - busy[s] for s in range(p))
    return UnitRun(step, busy, 1.0 - sum(busy) / (p * step), idle / step, tuple(_peak(a) for a in acts))


def _needs(sch: Schedule, a: Action, vs: int, last: int, p: int, comm: float) -> list[tuple]:
    """The (task key, lag) pairs action ``a`` on virtual stage ``vs`` waits for."""
    def lag(other: int) -> float:
        return comm if sch.device(other, p) != sch.device(vs, p) else 0.0
    if a.kind == "F":
        return [(("F", a.slice, vs - 1), lag(vs - 1))] if vs else []
    if a.kind == "W":
        return [(("B", a.slice, vs), 0.0)]
    return [(("F", a.slice, vs), 0.0)] + ([(("B", a.slice, vs + 1), lag(vs + 1))] if vs < last else [])


def _peak(events: list[tuple]) -> float:
    held = best = 0.0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):   # frees before takes at one instant
        held += d
        best = max(best, held)
    return round(best, 9)


def _check_tasks(sch: Schedule, seqs: list[list[Action]], m: int) -> None:
    kinds = "FBW" if sch.split_backward else "FB"
    want = sorted((k, i, c) for k in kinds for i in range(m) for c in range(sch.chunks))
    for s, seq in enumerate(seqs):
        if sorted((a.kind, a.slice, a.chunk) for a in seq) != want:
            raise ValueError(f"schedule {sch.name!r}: device {s}'s list does not hold every "
                             f"{'/'.join(kinds)} task of {m} slices x {sch.chunks} chunks exactly once")
