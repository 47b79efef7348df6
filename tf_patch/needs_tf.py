"""Importing this module raises an ImportError naming the ``tf`` extra when
TensorFlow is not installed; every ``tf_patch`` module that runs TensorFlow
imports it first (the CLI turns the error into its "not installed" exit, 3).
TensorFlow itself is imported only by the functions that run it (it is slow
to import). :mod:`tf_patch.marks` does not import it: it needs no TensorFlow.
"""
from __future__ import annotations

import importlib.util

__all__ = ["require_tensorflow"]


def require_tensorflow() -> None:
    """Raise ImportError, naming the ``tf`` extra, when TensorFlow is not installed."""
    try:
        found = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):  # an import hook that refuses it; a broken install
        found = False
    if not found:
        raise ImportError("tf_patch needs TensorFlow, which is not installed: pip install 'pesto-placer[tf]' "
                          "(from a source checkout: pip install -e '.[tf]')", name="tensorflow")


require_tensorflow()
