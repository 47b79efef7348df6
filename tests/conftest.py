"""Shared pytest setup: make ``tests/`` importable (``from strategies import dags``)
and keep matplotlib off-screen."""
import os
import signal
import sys
import threading

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)

# OR-Tools' native libraries with RTLD_DEEPBIND (pesto.deepbind), as solver
# loads them, before any test imports OR-Tools itself beside TensorFlow
import pesto.deepbind  # noqa: E402,F401


@pytest.fixture
def ctrl_c():
    """Ctrl-C as in a terminal: Python's KeyboardInterrupt handler for SIGINT
    during the test, whatever pytest was started with (a job started with
    ``&`` from a script, or under ``nohup``, inherits SIGINT ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
