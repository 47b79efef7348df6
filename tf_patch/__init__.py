"""Everything that touches TensorFlow: extract, profile, fit comms, apply, the
model zoo (:mod:`tf_patch.zoo`) and the demos (``python -m tf_patch.demo``);
and :mod:`tf_patch.marks`, TensorFlow's names and types as Pesto's op marks.

``import tf_patch`` and :mod:`tf_patch.marks` need no TensorFlow (the CLI
marks a TF-named JSON graph without it). The other names (``tf_patch.opgraph_for``,
...) and modules need TensorFlow installed: they raise an ImportError naming
the ``tf`` extra otherwise (:mod:`tf_patch.needs_tf`); they load on first use
(PEP 562 ``__getattr__``), and TensorFlow itself only when a function runs it.

>>> import tf_patch                                          # doctest: +SKIP
>>> g = tf_patch.opgraph_for("rnnlm", "small", costs="v100")  # doctest: +SKIP
"""
from __future__ import annotations

import importlib

#: The modules reached as ``tf_patch.<module>`` without an import of their own.
_MODULES = frozenset({"apply", "batchmarks", "commfit", "demo", "demo_hosts", "devices", "distributed", "extract",
                      "function", "fusion", "marks", "microstep", "opgraphs", "profile", "recompute",
                      "replicastep", "slicemap", "traces", "workflow", "zoo"})

__all__ = ["opgraph_for", "opgraph", "model_opgraph", "function_opgraph", "keras_opgraph", "function_step",
           "keras_step", "FunctionStep", "LossStep", "check_micro_batches", "step_stats_costs",
           "chrome_trace_costs", "measure", "estimate", "apply_plan", "verify",
           "fit_transfers", "session_config", "tf_device", "plan_device", "profile_model", "parallel_factor",
           "contended", "run_placed", "replicate_model", "recompute_model"]


def __getattr__(name: str):
    """``tf_patch.<name>`` of :data:`__all__` from :mod:`tf_patch.opgraphs`, and the
    submodules, loaded on first use (ImportError naming the ``tf`` extra without TensorFlow)."""
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in __all__:
        from . import opgraphs

        return getattr(opgraphs, name)
    raise AttributeError(f"module 'tf_patch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _MODULES)
