"""The one stage cutter: contiguous pipeline stages over a block order.

A step's blocks (:class:`solver.parallel.pipelines.Blocking`, forward
blocks in order, each backward op with the block it differentiates) are cut
into ``k`` contiguous stages minimising the largest stage's work plus the
activations crossing its two cuts (:func:`split_stages`, the one partition
DP of :func:`solver.practitioners.pipeline_cuts`); :func:`largest_stage` is that
objective. GPipe, 1F1B, the hybrids and the slice model's hints all cut here.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..practitioners import pipeline_cuts

__all__ = ["split_stages", "largest_stage"]


def split_stages(work: Sequence[float], comm: Sequence[float], k: int) -> tuple[int, ...]:
    """First block of each of ``k`` contiguous stages (stage 0 starts at 0)
    minimising the largest ``sum(work[i:j]) + comm[i] + comm[j]`` (``comm[c]``:
    cost of cutting before block ``c``; none at 0 and at the end).

    >>> split_stages([4, 1, 1, 4], [0, 0, 0, 0], 2), split_stages([1, 1, 1, 1], [0, 0, 9, 0], 2)
    ((0, 2), (0, 1))
    """
    n = len(work)
    return tuple(pipeline_cuts(list(work), list(comm)[1:n], max(1, min(k, n))))  # the one partition DP


def largest_stage(work, comm, starts) -> float:
    """:func:`split_stages`' objective for the stages beginning at ``starts``."""
    n = len(work)
    ends = list(starts[1:]) + [n]
    return max(float(np.sum(work[i:j])) + (comm[i] if i else 0.0) + (comm[j] if j < n else 0.0)
               for i, j in zip(starts, ends))
