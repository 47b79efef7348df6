"""Pesto: joint op placement and scheduling of a training step over several devices.

Public API::

    import pesto
    plan = pesto.solve(graph, gpus=2)          # graph: OpGraph, networkx DiGraph or JSON path
    sched = pesto.simulate(graph, cluster, plan)
    pesto.check_plan(graph, cluster, plan).raise_if_invalid()
"""
import os as _os
import sys as _sys


def _load_ortools() -> None:
    """Load OR-Tools' native libraries so they bind to their own protobuf and
    abseil (``RTLD_DEEPBIND``). Loaded after TensorFlow without it, CP-SAT and
    GLOP's parameter parser segfault (or-tools#3230: the two bundle different
    protobuf/abseil builds); with it, either import order works."""
    flags = _sys.getdlopenflags()
    if hasattr(_os, "RTLD_DEEPBIND"):  # glibc; elsewhere load as usual
        _sys.setdlopenflags(flags | _os.RTLD_DEEPBIND)
    try:
        import ortools.linear_solver.pywraplp  # noqa: F401
        import ortools.sat.python.cp_model  # noqa: F401
    finally:
        _sys.setdlopenflags(flags)


_load_ortools()

from .errors import (PestoError, InvalidGraphError, CycleError, InvalidClusterError,
                     SchemaError, InvalidPlanError, InfeasibleError)
from .graph import Op, Tensor, Edge, OpGraph
from .cluster import (Device, Route, Cluster, gpus, v100x2_nvlink, v100x4_pcie,
                      heterogeneous, two_hosts, logical_cpus, preset)
from .memory import memory_profile
from .plan import Plan, Transfer, Report, check_plan
from .simulate import Schedule, simulate
from .solvelog import SolveLog, Stage

__version__ = "0.1.0"

# The facade last: pesto.api imports solver.pipeline, which imports the core
# modules above (whichever of ``import pesto`` / ``import solver`` comes first).
from .api import evaluate, solve  # noqa: E402


__all__ = ["PestoError", "InvalidGraphError", "CycleError", "InvalidClusterError", "SchemaError",
           "InvalidPlanError", "InfeasibleError", "Op", "Tensor", "Edge", "OpGraph", "Device",
           "Route", "Cluster", "gpus", "v100x2_nvlink", "v100x4_pcie", "heterogeneous",
           "two_hosts", "logical_cpus", "preset", "Plan", "Transfer", "Report", "check_plan",
           "memory_profile", "Schedule", "simulate", "SolveLog", "Stage", "solve", "evaluate"]
