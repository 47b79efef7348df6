"""Op costs from measurements users already have.

* :func:`step_stats_costs` -- TensorFlow's ``RunMetadata`` / ``StepStats``
  (``session.run(..., options=FULL_TRACE, run_metadata=md)``): median µs per
  op over the steps given;
* :func:`chrome_trace_costs` -- a Chrome trace JSON (``timeline.Timeline(
  step_stats).generate_chrome_trace_format()``, or the TF profiler's
  ``*.trace.json.gz``): mean µs per occurrence of each op.

Both return ``{op name: µs}`` for :func:`tf_patch.extract.extract`'s
``costs=`` (ops missing from the trace get its ``default_cost``).

Examples
--------
>>> chrome_trace_costs({"traceEvents": [
...     {"ph": "X", "name": "MatMul", "dur": 12.0, "args": {"name": "dense/MatMul"}},
...     {"ph": "X", "name": "MatMul", "dur": 14.0, "args": {"name": "dense/MatMul"}},
...     {"ph": "X", "name": "Relu", "dur": 3.0, "args": {"long_name": "dense/Relu:Relu"}}]})
{'dense/MatMul': 13.0, 'dense/Relu': 3.0}
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import gzip
import json
import statistics
from pathlib import Path
from typing import Iterable, Mapping

__all__ = ["step_times", "step_stats_costs", "chrome_trace_costs"]


def step_times(step_stats) -> Iterable[tuple[str, str, float, object]]:
    """``(op name, device, µs, NodeExecStats)`` of every op in one
    ``StepStats`` (or a ``RunMetadata``, whose ``step_stats`` is read)."""
    stats = getattr(step_stats, "step_stats", step_stats)
    for dev in stats.dev_stats:
        for ns in dev.node_stats:
            us = ns.op_end_rel_micros if ns.op_end_rel_micros else ns.all_end_rel_micros
            yield ns.node_name.split(":")[0], dev.device, float(us), ns


def step_stats_costs(metadatas) -> dict[str, float]:
    """Median µs per op over ``metadatas`` (RunMetadata or StepStats, one per
    step; a single one is accepted too). An op traced on several devices in a
    step (a stream and its device) counts once per step, its longest time."""
    if hasattr(metadatas, "dev_stats") or hasattr(metadatas, "step_stats"):
        metadatas = [metadatas]
    times: dict[str, list[float]] = {}
    for md in metadatas:
        step: dict[str, float] = {}
        for name, _, us, _ in step_times(md):
            step[name] = max(step.get(name, 0.0), us)
        for name, us in step.items():
            times.setdefault(name, []).append(us)
    return {n: statistics.median(v) for n, v in times.items()}


def _load_trace(trace) -> Mapping:
    if isinstance(trace, Mapping):
        return trace
    text = str(trace)
    if not text.lstrip().startswith(("{", "[")):
        path = Path(text)
        raw = path.read_bytes()
        text = gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    data = json.loads(text)
    return {"traceEvents": data} if isinstance(data, list) else data


def _op_name(event: Mapping) -> str:
    args = event.get("args") or {}
    if "name" in args:  # TF's Timeline: args.name is the op, name its type
        return str(args["name"])
    if "long_name" in args:  # the TF profiler: "scope/op:Type"
        return str(args["long_name"]).split(":")[0]
    return str(event.get("name", ""))


def chrome_trace_costs(trace) -> dict[str, float]:
    """Mean µs per occurrence of each op in a Chrome trace (a dict, JSON
    text, or a path, ``.gz`` too). Complete events (``"ph": "X"``) with a
    duration count; their op is ``args.name``, else ``args.long_name``
    without its ``:Type``, else the event name."""
    times: dict[str, list[float]] = {}
    for ev in _load_trace(trace).get("traceEvents", []):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        name = _op_name(ev)
        if name:
            times.setdefault(name, []).append(float(ev["dur"]))
    return {n: sum(v) / len(v) for n, v in times.items()}
