"""Every exception Pesto raises on purpose.

``PestoError`` is the root, so ``except pesto.PestoError`` catches all of them.
Each error names its culprit (an op, a device, a group, a cycle) in the message
and keeps it on an attribute for programs.
"""
from __future__ import annotations


class PestoError(Exception):
    """Root of Pesto's exceptions."""


class InvalidGraphError(PestoError, ValueError):
    """The op graph is malformed: bad field, unknown endpoint, negative cost..."""


class CycleError(InvalidGraphError):
    """The op graph (or a graph made from it) has a cycle.

    Attributes
    ----------
    cycle : list of str
        The ops of one cycle, in order; the last one feeds the first.
    """

    def __init__(self, cycle, what="op graph"):
        self.cycle = list(cycle)
        shown = " -> ".join(map(str, self.cycle[:20]))
        if len(self.cycle) > 20:
            shown += f" -> ... ({len(self.cycle)} ops)"
        super().__init__(f"{what} has a cycle: {shown} -> {self.cycle[0]}")


class InvalidClusterError(PestoError, ValueError):
    """The cluster is malformed: duplicate device, missing route, bad link..."""


class SchemaError(PestoError, ValueError):
    """A JSON document does not follow Pesto's schema (field or version)."""


class InvalidPlanError(PestoError):
    """A plan violates the problem: raised by ``Report.raise_if_invalid``.

    Attributes
    ----------
    violations : list of str
    """

    def __init__(self, violations):
        self.violations = list(violations)
        head = "\n  ".join(self.violations[:20])
        more = f"\n  ... and {len(self.violations) - 20} more" if len(self.violations) > 20 else ""
        super().__init__(f"plan is invalid ({len(self.violations)} violations):\n  {head}{more}")


class InfeasibleError(PestoError):
    """No plan can exist: memory too small, an op fits no device...

    Attributes
    ----------
    culprit : str or None
        The op, colocation group or device to blame, where there is one.
    plan : Plan or None
        The best plan found when it breaks memory (``pesto.solve``), for a
        look at what does not fit; None when no plan exists.
    """

    def __init__(self, message, culprit=None, plan=None):
        self.culprit = culprit
        self.plan = plan
        super().__init__(message)


class CoarsenError(PestoError):
    """A coarse graph does not represent its fine graph (``coarsen.verify``):
    the message names the defect (lost edge, unconserved compute, ...)."""


class MicroBatchError(PestoError, ValueError):
    """A micro-batch or replica count Pesto cannot use (not an int, below 1),
    or a split it cannot make (a device kind with no accumulation cost).

    Attributes
    ----------
    culprit : object
        The value or name to blame.
    """

    def __init__(self, message, culprit=None):
        self.culprit = culprit
        super().__init__(message)


class BatchMarkError(MicroBatchError, InvalidGraphError):
    """Ops whose batch mark (:attr:`pesto.graph.Op.batch`) is missing or does
    not fit the split (:func:`pesto.step.split`).

    Attributes
    ----------
    ops : list of str
        The ops to blame (all of them; the message shows the first 20).
    """

    def __init__(self, message, ops=()):
        self.ops = list(ops)
        shown = ", ".join(map(repr, self.ops[:20]))
        more = f" ... and {len(self.ops) - 20} more" if len(self.ops) > 20 else ""
        super().__init__(f"{message}{': ' + shown + more if self.ops else ''}",
                         culprit=self.ops[0] if self.ops else None)


class MicroBatchMemoryError(InfeasibleError):
    """A micro-batch count ``M`` for which no plan can fit device memory: even
    the least some device must hold at once with ``M`` slices (the in-flight
    slices' tensors, the gradient sums; ``solver.parallel.bound.memory_floor``)
    exceeds the largest device. ``pesto.solve`` raises it for a fixed ``M``;
    ``micro_batches="auto"`` skips that ``M`` with this message in ``plan.log.skipped``.

    Attributes
    ----------
    micro_batches : int
    need : int
        Bytes some device must hold at its peak.
    largest : int
        Bytes of the largest device.
    culprit : str
        The op whose run sets ``need`` (or ``"persistent bytes"``).
    """

    def __init__(self, message, micro_batches: int, need: int, largest: int, culprit=None):
        self.micro_batches, self.need, self.largest = micro_batches, need, largest
        super().__init__(message, culprit=culprit)
