"""Pesto: joint op placement and scheduling of a training step over several devices.

Public API::

    import pesto
    plan = pesto.solve(graph, gpus=2)          # graph: OpGraph, networkx DiGraph or JSON path
    sched = pesto.simulate(graph, cluster, plan)
    pesto.check_plan(graph, cluster, plan).raise_if_invalid()

The core (graph, cluster, plan, memory, simulate, ...) is imported here;
the step transforms (micro-batches, replicas) are :mod:`pesto.step`. The
facade, :func:`solve` and :func:`evaluate` of :mod:`pesto.api`, which loads the
solver and OR-Tools, is imported on first use (PEP 562 ``__getattr__``): so
``import pesto.graph`` loads neither.
"""
from typing import TYPE_CHECKING

from .errors import (PestoError, InvalidGraphError, CycleError, InvalidClusterError,
                     SchemaError, InvalidPlanError, InfeasibleError)
from .graph import Op, Tensor, Edge, OpGraph
from .cluster import (Device, Route, Cluster, gpus, v100x2_nvlink, v100x4_pcie,
                      heterogeneous, two_hosts, logical_cpus, preset)
from .memory import memory_profile
from .plan import Plan, Transfer, Report, check_plan
from .simulate import Schedule, simulate
from .solvelog import PassLog, SolveLog

if TYPE_CHECKING:  # for type checkers and editors; at run time __getattr__ imports them
    from .api import evaluate, solve, solve_step, step_graph

__version__ = "0.1.0"

#: what ``pesto.<name>`` takes from the facade, :mod:`pesto.api` ("api": the module itself)
_FACADE = ("solve", "solve_step", "step_graph", "evaluate", "api")


def __getattr__(name: str):
    """``pesto.solve``, ``pesto.solve_step``, ``pesto.step_graph``,
    ``pesto.evaluate`` and ``pesto.api``, imported from :mod:`pesto.api` on
    first use and kept as attributes; ``pesto.Stage``, the old name of
    :class:`PassLog`, with a :class:`DeprecationWarning` (for one release)."""
    if name == "Stage":
        import warnings
        warnings.warn("pesto.Stage is deprecated: a solve's steps are passes now, logged as pesto.PassLog",
                      DeprecationWarning, stacklevel=2)
        return PassLog
    if name not in _FACADE:
        raise AttributeError(f"module 'pesto' has no attribute {name!r}")
    from .api import evaluate, solve, solve_step, step_graph  # the import binds pesto.api too

    globals().update(solve=solve, solve_step=solve_step, step_graph=step_graph, evaluate=evaluate)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACADE))


__all__ = ["PestoError", "InvalidGraphError", "CycleError", "InvalidClusterError", "SchemaError",
           "InvalidPlanError", "InfeasibleError", "Op", "Tensor", "Edge", "OpGraph", "Device",
           "Route", "Cluster", "gpus", "v100x2_nvlink", "v100x4_pcie", "heterogeneous",
           "two_hosts", "logical_cpus", "preset", "Plan", "Transfer", "Report", "check_plan",
           "memory_profile", "Schedule", "simulate", "SolveLog", "PassLog", "solve", "solve_step", "step_graph", "evaluate"]
