"""How far the split's cost rule is from TensorFlow's cost model at the micro-batch size.

Run: ``python -m benchmarks.bench_slice_costs [--workloads a,b] [--micro 2,4] [--out DIR]``
(needs TensorFlow; a few minutes). Writes ``slice_costs.md`` and ``slice_costs.csv``.

Issue 24 asks that a slice's costs come from the cost models at the micro-batch
size, not from dividing. :func:`pesto.step.split` divides (its stated
rule: compute / M with a 2 µs floor; ops that only sum weight-shaped partials
keep their time). For each workload this profiles the same zoo step with
grappler's V100 model (as ``benchmarks/make_graphs.py`` does) at the batch
``B`` and at ``B / M``, splits the step at ``B`` into ``M`` slices, and compares
every batched op's copy (``op@mb0``, same op name) with the op of the step
profiled at ``B / M``:

* ``slice work``: the sum over batched ops of the rule's copy over grappler's;
* ``step work``: the split step's total work over the same step with each
  copy at grappler's time (``M`` copies; unbatched and accumulate ops as the
  rule has them, so only the copies differ);
* the per-op ratio rule / grappler (ops grappler gives > 0 µs): median,
  10th and 90th percentile; the ops differing most in µs; the ratio of the
  ops the rule keeps whole (``fixed``: weight-gradient sums);
* ``bytes``: the copies' output bytes over grappler's at ``B / M``.
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from pesto.step import split
from pesto.step.slicing import fixed_ops
from tf_patch.marks import mark_step

from .make_graphs import by_key

HERE = Path(__file__).resolve().parent
OUT = HERE / "results"
WORKLOADS = ("keras_resnet50", "transformer_6")
#: Where :mod:`benchmarks.bench_wgrad_costs`' section of slice_costs.md starts (kept on a rewrite).
WGRAD_MARK = "<!-- bench_wgrad_costs -->"
#: Preset batch of the zoo workloads without a ``batch`` override (tf_patch/zoo presets).
PRESET_BATCH = {"transformer_6": 64, "nmt_4x1024": 128, "nmt_2x1024": 128, "rnnlm_4x2048": 128}


@dataclass(frozen=True)
class Comparison:
    """The rule against grappler for one workload and ``M`` (a CSV line)."""

    workload: str
    batch: int
    micro_batches: int
    batched_ops: int
    matched: int
    slice_work_ratio: float
    step_work_ratio: float
    median: float
    p10: float
    p90: float
    fixed_ops: int
    fixed_ratio: float
    bytes_ratio: float
    worst: str


def profile(key: str, batch: int):
    """The zoo step of workload ``key`` at ``batch``, grappler's V100 costs, batch-marked."""
    from tf_patch import keras_opgraph, opgraph_for

    w = by_key(key)
    over = {**dict(w.overrides), "batch": batch}
    if w.model.startswith("keras:"):
        import tensorflow as tf

        from tf_patch.zoo.keras_apps import keras_model
        tf.keras.backend.clear_session()   # the same layer names at every batch
        model, x, y = keras_model(w.model[6:], **over)
        g, _ = keras_opgraph(model, "sparse_categorical_crossentropy", "sgd", x, y, name=w.key)
    else:
        g = opgraph_for(w.model, w.preset, costs="v100", **over)
    return mark_step(g)


def compare(key: str, step, small, m: int) -> Comparison:
    """The rule's copies of ``step`` in ``m`` slices against ``small`` (the step at ``B / m``)."""
    parts = split(step, m)
    batched = [op for op in step.ops if op.batch]
    have = set(small.names)
    matched = [op for op in batched if op.name in have]
    fixed = fixed_ops(step, parts.partials)
    rule = {op.name: parts.graph.op(f"{op.name}@mb0").compute.get("GPU", 0.0) for op in matched}
    tf = {op.name: small.op(op.name).compute.get("GPU", 0.0) for op in matched}
    ratios = np.array([rule[n] / tf[n] for n in rule if tf[n] > 0])
    worst = sorted(rule, key=lambda n: -abs(rule[n] - tf[n]))[:6]
    delta = sum(tf.values()) - sum(rule.values())    # per slice, copies only
    fx = [n for n in rule if n in fixed and tf[n] > 0]
    rule_bytes = sum(parts.graph.op(f"{op.name}@mb0").output_bytes for op in matched)
    return Comparison(
        key, _batch(key), m, len(batched), len(matched), sum(rule.values()) / sum(tf.values()),
        parts.graph.total_work() / (parts.graph.total_work() + m * delta),
        float(np.median(ratios)), float(np.percentile(ratios, 10)), float(np.percentile(ratios, 90)),
        len(fx), sum(rule[n] for n in fx) / sum(tf[n] for n in fx) if fx else float("nan"),
        rule_bytes / max(1, sum(small.op(op.name).output_bytes for op in matched)),
        "; ".join(f"{n} ({step.op(n).type}) {rule[n]:.1f} vs {tf[n]:.1f} µs" for n in worst))


def write_rows(path: Path, kind, rows, digits: int) -> None:
    """``rows`` (dataclasses of type ``kind``) as a CSV, floats rounded to ``digits``."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(kind)])
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, digits) if isinstance(v, float) else v) for k, v in r.__dict__.items()})


def _batch(key: str) -> int:
    manifest = json.loads((HERE / "graphs" / "manifest.json").read_text())
    return int(manifest.get(key, {}).get("overrides", {}).get("batch") or PRESET_BATCH[key])


def markdown(rows: list[Comparison], seconds: float) -> list[str]:
    lines = ["# The split's cost rule against grappler at the micro-batch size", "",
             __doc__.split("\n\n", 2)[2].strip(), "",
             f"Profiled with grappler's V100 model; {seconds:.0f} s in all.", "",
             "| workload | B | M | batched ops | matched | slice work rule / TF | step work rule / TF "
             "| per-op median | p10 | p90 | fixed ops | fixed rule / TF | bytes rule / TF |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.workload} | {r.batch} | {r.micro_batches} | {r.batched_ops} | {r.matched} "
              f"| {r.slice_work_ratio:.3f} | {r.step_work_ratio:.3f} | {r.median:.3f} | {r.p10:.3f} | {r.p90:.3f} "
              f"| {r.fixed_ops} | {r.fixed_ratio:.2f} | {r.bytes_ratio:.3f} |" for r in rows]
    lines += ["", "## The ops differing most (rule vs grappler at B / M, one slice)", ""]
    lines += [f"- {r.workload}, M={r.micro_batches}: {r.worst}" for r in rows]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--micro", default="2,4")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for key in a.workloads.split(","):
        b = _batch(key)
        step = profile(key, b)
        for m in (int(x) for x in a.micro.split(",")):
            rows.append(compare(key, step, profile(key, b // m), m))
            print(rows[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "slice_costs.csv", Comparison, rows, 4)
    md = out / "slice_costs.md"
    tail = md.read_text().partition(WGRAD_MARK) if md.exists() else ("", "", "")
    kept = "\n" + tail[1] + tail[2] if tail[1] else ""    # bench_wgrad_costs' section stays
    md.write_text("\n".join(markdown(rows, time.perf_counter() - t0)) + "\n" + kept)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
