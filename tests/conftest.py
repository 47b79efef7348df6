"""Shared pytest setup: make ``tests/`` importable (``from strategies import dags``)
and keep matplotlib off-screen."""
import os
import sys

os.environ.setdefault("MPLBACKEND", "Agg")
_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

# pesto loads OR-Tools with RTLD_DEEPBIND (see pesto._load_ortools); a bare
# OR-Tools import here first would load it without that.
import pesto  # noqa: E402,F401
