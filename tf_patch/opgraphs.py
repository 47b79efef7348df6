"""The OpGraph of a TensorFlow training step (:func:`opgraph`, :func:`model_opgraph`,
:func:`opgraph_for`), and the names ``tf_patch`` exports: ``tf_patch.<name>``
loads this module on first use (it needs TensorFlow installed).

>>> import tf_patch                                          # doctest: +SKIP
>>> g = tf_patch.opgraph_for("rnnlm", "small", costs="v100")  # doctest: +SKIP
"""
from __future__ import annotations

import time

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from .apply import apply_plan, check_colocation, verify
from .commfit import CommFit, fit_transfers
from .devices import describe, detect, plan_device, session_config, tf_device
from .extract import _as_graph, allowed_kinds, extract as _extract, step_ops
from .function import FunctionStep, function_opgraph, function_step, keras_opgraph, keras_step
from .microstep import LossStep, check_micro_batches
from .traces import chrome_trace_costs, step_stats_costs
from .workflow import contended, parallel_factor, profile_model, run_placed
from .profile import Profile, estimate, measure
from .recompute import recompute_model
from .replicastep import replicate_model
from .zoo import build_model


__all__ = ["opgraph_for", "opgraph", "model_opgraph", "function_opgraph", "keras_opgraph", "function_step",
           "keras_step", "FunctionStep", "LossStep", "check_micro_batches", "step_stats_costs",
           "chrome_trace_costs", "measure", "estimate", "apply_plan", "verify",
           "fit_transfers", "session_config", "tf_device", "plan_device", "profile_model", "parallel_factor",
           "contended", "run_placed", "replicate_model", "recompute_model"]


def opgraph(graph, fetches, gpu: str = "v100", *, name: str = "graph", overhead: float = 0.0,
            progress: bool = False, **options):
    """``(OpGraph, Profile)`` of any tf.Graph's training step, with grappler's analytical costs.

    Parameters
    ----------
    graph : tf.Graph or GraphDef
    fetches : the step's fetches (e.g. ``[train_op, loss]``; names such as
        ``"Identity:0"`` too)
    gpu : "v100", "a100" or "h100": the device grappler models (no GPU needed)
    options : for :func:`tf_patch.extract.extract` (``batch``,
        ``tensor_sizes``, ``on_unknown``...)

    Examples
    --------
    >>> g, profile = tf_patch.opgraph(tf_graph, [train_op])   # doctest: +SKIP
    >>> plan = pesto.solve(g, gpus=2)                  # doctest: +SKIP
    >>> tf_patch.apply_plan(tf_graph, plan)            # doctest: +SKIP
    """
    graph = _as_graph(graph)  # a GraphDef is imported once, so fetch names resolve in it
    cpu_ops = [op.name for op in step_ops(graph, fetches) if "GPU" not in allowed_kinds(op.type, "GPU")]
    prof = estimate(graph, fetches, gpu, cpu_ops=cpu_ops, overhead=overhead, progress=progress)
    return _extract(graph, fetches, costs=prof.costs, cpu_costs=prof.cpu_costs, kind="GPU",
                   memory={k: {"output_bytes": v["output_bytes"]} for k, v in prof.memory.items()
                           if v.get("output_bytes")},
                   name=name, **options), prof


def model_opgraph(model, costs: str = "v100", *, n_devices: int = 1, steps: int = 5,
                  warmup: int = 2, progress: bool = True, overhead: float = 0.0):
    """``(OpGraph, Profile)`` of a built :class:`tf_patch.zoo.ZooModel`.

    ``costs``: a GPU name ("v100", "a100", "h100") for grappler's analytical
    estimate (kind "GPU"; ops without a GPU kernel get kind "CPU"), or
    "measured" to trace ``steps`` steps on this machine (kind "CPU"; kernels
    are timed on one device and one thread, so ``n_devices`` is not used).
    """
    if costs == "measured":
        # one device, one thread: each kernel timed alone (see tf_patch.workflow)
        prof = measure(model, n_devices=1, steps=steps, warmup=warmup, progress=progress,
                       config=session_config(1, inter_op=1))
        g = _extract(model.graph, model.fetches, costs=prof.costs, kind="CPU", memory=prof.memory,
                    name=f"{model.name}")
        return g, prof
    return opgraph(model.graph, model.fetches, costs, name=model.name, overhead=overhead,
                   progress=progress)


def opgraph_for(model_name: str, preset: str = "small", costs: str = "v100", **options):
    """Build a zoo model and return its OpGraph with costs.

    Parameters
    ----------
    model_name : "rnnlm", "nmt", "transformer" or "nasnet"
    preset : a preset of that model ("small", "2x2048", ...)
    costs : "v100" / "a100" / "h100" (grappler analytical, no GPU needed) or
        "measured" (FULL_TRACE on this machine's CPU)
    options : model overrides (layers=..., batch=...) plus ``steps``,
        ``warmup``, ``progress``, ``overhead`` for profiling

    Examples
    --------
    >>> g = opgraph_for("rnnlm", "small")   # doctest: +SKIP
    >>> g.num_ops > 500                     # doctest: +SKIP
    True
    """
    prof_keys = {"steps_profiled": "steps", "warmup": "warmup", "progress": "progress",
                 "overhead": "overhead", "n_devices": "n_devices"}
    prof_opts = {prof_keys[k]: options.pop(k) for k in list(options) if k in prof_keys}
    t0 = time.perf_counter()
    model = build_model(model_name, preset, **options)
    g, _ = model_opgraph(model, costs, **prof_opts)
    g.build_seconds = time.perf_counter() - t0  # informative; OpGraph is otherwise immutable
    return g
