"""Pipeline schedules as data: each stage's tasks, in the order it runs them.

A :class:`Schedule` turns ``(stage, stages, micro_batches)`` into typed
:class:`Action` s (``F``: a slice's forward part, ``B``: its backward part,
``W``: a weight-gradient part for the split-backward schedules to come;
``chunk``: the stage's model chunk for interleaved schedules). The registry
:data:`SCHEDULES` is the one list of schedules the pipeline placers, the
hybrid and the slice model read; a new schedule is one more entry.

>>> [f"{a.kind}{a.slice}" for a in SCHEDULES["1f1b"].actions(0, 3, 4)]
['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

__all__ = ["Action", "Schedule", "SCHEDULES", "actions"]


@dataclass(frozen=True)
class Action:
    """One task of a stage: ``kind`` ``"F"``, ``"B"`` or ``"W"`` of slice ``slice`` (model chunk ``chunk``)."""

    kind: str
    slice: int
    chunk: int = 0


@dataclass(frozen=True)
class Schedule:
    """A named schedule: ``order(stage, stages, m)`` -> the stage's actions in order."""

    name: str
    order: Callable[[int, int, int], list[Action]]
    doc: str = ""

    def actions(self, stage: int, stages: int, m: int) -> list[Action]:
        return self.order(stage, stages, m)


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


#: The schedules by name (insertion order: the order the search screens them).
SCHEDULES: Mapping[str, Schedule] = MappingProxyType({
    "gpipe": Schedule("gpipe", _gpipe, "all forwards, then all backwards"),
    "1f1b": Schedule("1f1b", _one_f_one_b, "one forward, one backward"),
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
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {list(SCHEDULES)}")
    return SCHEDULES[schedule].actions(stage, stages, m)
