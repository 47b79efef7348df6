"""OR-Tools' native libraries, loaded so that they work beside TensorFlow.

OR-Tools and TensorFlow bundle different protobuf and abseil builds: OR-Tools
loaded after TensorFlow the usual way segfaults in CP-SAT's solve and in
GLOP's parameter parser (or-tools#3230). Importing this module loads OR-Tools'
extension modules with ``RTLD_DEEPBIND`` (glibc), so that they bind to their
own copies; TensorFlow may then be loaded before or after.

``solver/__init__.py`` imports it before any solver module imports OR-Tools
(every solver module runs that ``__init__`` first); no other core module
imports OR-Tools, so ``import pesto.graph`` loads none of it. A program that
imports OR-Tools itself after TensorFlow, before any Pesto solve, loads it the
usual way and segfaults: that import is outside Pesto's reach.

>>> import sys
>>> "ortools.sat.python.cp_model" in sys.modules
True
"""
from __future__ import annotations

import os
import sys

__all__ = ["load_ortools"]


def load_ortools() -> None:
    """Import OR-Tools' CP-SAT and linear-solver extension modules with
    ``RTLD_DEEPBIND`` added to the ``dlopen`` flags (where the platform has
    it; elsewhere as usual). Once they are in ``sys.modules`` a second call
    does nothing."""
    flags = sys.getdlopenflags()
    if hasattr(os, "RTLD_DEEPBIND"):  # glibc; elsewhere load as usual
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
    try:
        import ortools.linear_solver.pywraplp  # noqa: F401
        import ortools.sat.python.cp_model  # noqa: F401
    finally:
        sys.setdlopenflags(flags)


load_ortools()
