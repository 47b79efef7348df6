"""Keras applications through the whole flow: trace, place, train placed, check.

For each model of :data:`tf_patch.zoo.keras_apps.KERAS_MODELS` (random weights,
a synthetic batch): ``tf_patch.keras_step`` (ops, seconds to trace and cost,
tensors without a static size, persistent bytes against the variables'),
``pesto.solve`` on 2 GPUs (V100 costs; predicted step against one GPU), then 3
steps unplaced and, on a fresh copy, 3 steps under the plan on 2 logical
devices (or real GPUs): the losses must be equal and no op may run off-plan.
The placement comparison with every baseline on the same models at 224 px is
in ``placement.md`` (workloads ``keras_*``).

Run ``python -m benchmarks.bench_keras [--time-limit 20]``; writes
``benchmarks/results/keras.{csv,md}``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pesto  # noqa: E402  (OR-Tools before TensorFlow)

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["model", "ops", "trace_s", "unsized", "persistent_mib", "variables_mib", "single_ms", "pesto_ms",
          "losses_equal", "loss_rel_diffs", "weights_rel_diff", "off_plan", "order_violations", "guarded", "note"]


def run_model(name: str, time_limit: float) -> dict:
    import numpy as np
    import tensorflow as tf
    import tf_patch
    from tf_patch.zoo.keras_apps import keras_model

    def step_of(model, x, y):
        return tf_patch.keras_step(model, "sparse_categorical_crossentropy", tf.keras.optimizers.SGD(0.01), x, y)

    t = time.perf_counter()
    model, x, y = keras_model(name, seed=0)
    step = step_of(model, x, y)
    trace_s = time.perf_counter() - t
    g = step.graph
    var_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.variables)
    plan = pesto.solve(g, gpus=2, time_limit=time_limit, workers=1)
    single = pesto.evaluate(g, {op: "/GPU:0" for op in g.names}).makespan
    w_start = step.values()
    plain = step.run(1)
    w_plain = step.values()
    plain += step.run(2)
    step.reset()  # the same initial weights, now placed
    applied = step.apply(plan)
    losses = step.run(1)
    w_placed = step.values()
    losses += step.run(2)
    seen = step.check()
    step.close()
    rel = [abs(a - b) / max(1e-12, abs(a)) for a, b in zip(plain, losses)]
    # the largest weight difference after one step, relative to the largest change a weight made in it:
    # ~1 if an update were lost or doubled, float rounding otherwise (biases before a batch norm get a
    # zero gradient up to rounding, so a per-variable ratio would be rounding over rounding)
    sized = [k for k in w_plain if np.size(w_plain[k])]
    moved = max(float(np.max(np.abs(w_plain[k] - w_start[k]))) for k in sized)
    w_rel = max(float(np.max(np.abs(w_plain[k] - w_placed[k]))) for k in sized) / max(1e-30, moved)
    return {"model": name, "ops": g.num_ops, "trace_s": round(trace_s, 1), "unsized": len(step.unsized),
            "persistent_mib": round(sum(o.persistent_bytes for o in g.ops) / 2**20, 3),
            "variables_mib": round(var_bytes / 2**20, 3), "single_ms": round(single / 1e3, 3),
            "pesto_ms": round(plan.makespan / 1e3, 3), "losses_equal": max(rel) <= 1e-5,
            "loss_rel_diffs": " / ".join(f"{r:.1e}" for r in rel), "weights_rel_diff": f"{w_rel:.1e}",
            "off_plan": len(seen["misplaced"]), "order_violations": len(seen["order_violations"]),
            "guarded": applied.fusion_guarded, "note": step.note}


def _in_process(name: str, args) -> dict:
    """``run_model`` in a fresh process, so that a hung TensorFlow run is
    reported (after ``--timeout`` seconds) instead of stopping the benchmark."""
    code = ("import json, sys; from benchmarks.bench_keras import run_model; "
            f"print('ROW ' + json.dumps(run_model({name!r}, {args.time_limit!r})), flush=True)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "note": f"did not finish within {args.timeout:g} s (the placed run hung)"}
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if not rows:
        return {"model": name, "note": "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(rows[-1])


def main(argv=None) -> int:
    from tf_patch.zoo.keras_apps import KERAS_MODELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per model before it counts as hung")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = []
    for name in KERAS_MODELS:
        rows.append(_in_process(name, args))
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "keras.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Keras applications: trace, place, train placed", "",
             f"Generated by `python -m benchmarks.bench_keras` on {now}. Models built offline "
             "(`tf_patch.zoo.keras_apps`: random weights, a synthetic batch at the default size), traced by "
             f"`tf_patch.keras_step`, placed by `pesto.solve(gpus=2, time_limit={args.time_limit:g})` on "
             "V100 costs, then 3 SGD steps unplaced and 3 under the plan from the same initial weights. "
             "*unsized*: tensors without a static size; *persistent* vs *variables*: the graph's persistent "
             "bytes against the model's variables (the optimizer's step counter adds a few bytes); "
             "*off-plan* / *order*: a traced placed step against the plan. *loss rel. diffs*: placed vs "
             "unplaced loss at steps 1 / 2 / 3; *weights rel. diff*: the largest difference of any variable "
             "after one step, relative to the largest change any variable made in that step (1 would mean a "
             "lost or doubled update); *losses equal*: all three within 1e-5. "
             "*guarded*: order edges left out because a runtime fusion (oneDNN Conv2D + BiasAdd) would close "
             "them into a cycle (`tf_patch.apply`). Where an order edge keeps oneDNN from fusing two ops the "
             "placed step rounds differently (~1e-7); a random-weight model trained at this rate amplifies "
             "that from step to step, so step 1 and the weights are the semantic check. Every baseline on "
             "these models (224 px): `placement.md`.", "",
             "| model | ops | trace (s) | unsized | persistent (MiB) | variables (MiB) | one GPU (ms) | Pesto (ms) "
             "| losses equal | loss rel. diffs | weights rel. diff | off-plan | order violations | guarded "
             "| devices |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "-")) for k in FIELDS) + " |")
    (args.out / "keras.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
