"""Step transforms: a training step turned into another step, as an ordinary graph.

* :func:`split` (:mod:`pesto.step.slicing`): the step in ``M`` micro-batches;
* :func:`replicate` (:mod:`pesto.step.replication`): ``N`` data-parallel
  replicas and their ring all-reduce;
* :func:`recompute` (:mod:`pesto.step.recompute`): activation
  recomputation per layer block;
* each returns a :class:`Transformed` (the graph, the step it came from and
  each op's :class:`Origin`); :func:`compose` chains two; :func:`identity`
  is the step as itself (``split`` into one slice);
* :mod:`pesto.step.marks`: the per-op marks a front end sets (batch, phase,
  anchor, role), read without any framework's names.

Examples
--------
>>> from pesto.graph import Op, OpGraph
>>> s = split(OpGraph([Op("a", {"GPU": 8.0}, batch=True)]), 2)
>>> s.graph.names, s.micro_batches
(('a@mb0', 'a@mb1'), 2)
"""
from .transform import Origin, Transformed, check_count, compose, identity
from .slicing import split
from .replication import replicate
from .recompute import recompute
from .marks import anchors, backward_ops, forward_ops

__all__ = ["Origin", "Transformed", "compose", "identity", "check_count", "split", "replicate", "recompute",
           "forward_ops", "backward_ops", "anchors"]
