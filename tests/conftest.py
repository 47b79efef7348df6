"""Shared pytest setup: make ``tests/`` importable (``from strategies import dags``)
and keep matplotlib off-screen."""
import os
import sys

os.environ.setdefault("MPLBACKEND", "Agg")
_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

# OR-Tools before TensorFlow in every worker: the other order segfaults CP-SAT.
import ortools.sat.python.cp_model  # noqa: E402,F401
