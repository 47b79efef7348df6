"""Keras models through the whole flow: trace, place, train placed, check.

For each model (:data:`tf_patch.zoo.keras_apps.KERAS_MODELS`, two more
``keras.applications`` CNNs, and a hand-built Transformer encoder with
``MultiHeadAttention``; random weights, a synthetic batch, nothing
downloaded): ``tf_patch.keras_step`` (ops, seconds to trace and cost,
tensors without a size, persistent bytes against the variables'),
``pesto.solve`` on 2 GPUs (V100 costs; predicted step against one GPU), then 3
steps unplaced and, from the same initial weights, 3 steps under the plan on 2
logical devices (or real GPUs): the losses must be equal, no op may run
off-plan, no order edge may be violated; the plan's order edges that
``tf_patch.apply`` left out are counted. The placement comparison with every
baseline on the CNNs at 224 px is in ``placement.md`` (workloads ``keras_*``).

Run ``python -m benchmarks.bench_keras [--time-limit 20] [--models a,b]``;
writes ``benchmarks/results/keras.{csv,md}``.
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
          "losses_equal", "loss_rel_diffs", "weights_rel_diff", "off_plan", "order_violations", "order_edges",
          "left_out", "left_out_pct", "left_out_why", "fusions", "seconds", "note"]

#: more ``keras.applications`` CNNs than the demo's: name -> (constructor, image size, batch)
MORE_CNNS = {"efficientnetb0": ("EfficientNetB0", 64, 8), "densenet169": ("DenseNet169", 64, 8)}
#: the attention model: a Transformer encoder (token + position embeddings, 2 blocks of
#: MultiHeadAttention + LayerNormalization + GELU feed-forward, pooled, a softmax classifier)
TRANSFORMER = {"vocab": 1000, "seq": 64, "dim": 128, "heads": 4, "blocks": 2, "batch": 16, "classes": 10}
MODELS = ["mobilenetv2", "resnet50", *MORE_CNNS, "transformer"]


def transformer_model(vocab: int = 1000, seq: int = 64, dim: int = 128, heads: int = 4, blocks: int = 2,
                      batch: int = 16, classes: int = 10, seed: int = 0):
    """``(model, x, y)``: a small Keras Transformer encoder classifier, built
    by hand (no keras_hub, no download), and a batch of random tokens.

    Each block: ``MultiHeadAttention`` (self-attention, dropout 0.1),
    residual + ``LayerNormalization``, a ``Dense(2 * dim, "gelu") ->
    Dense(dim)`` feed-forward, residual + ``LayerNormalization``.
    """
    import tensorflow as tf

    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(seed)
    tokens = tf.keras.Input((seq,), dtype="int32")
    h = _position_layer()(layers.Embedding(vocab, dim)(tokens))
    for _ in range(blocks):
        a = layers.MultiHeadAttention(heads, dim // heads, dropout=0.1)(h, h)
        h = layers.LayerNormalization()(h + a)
        f = layers.Dense(dim)(layers.Dense(2 * dim, activation="gelu")(h))
        h = layers.LayerNormalization()(h + layers.Dropout(0.1)(f))
    out = layers.Dense(classes, activation="softmax")(layers.GlobalAveragePooling1D()(h))
    x = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32, seed=seed)
    y = tf.random.uniform((batch,), 0, classes, dtype=tf.int32, seed=seed)
    return tf.keras.Model(tokens, out, name="transformer"), x, y


def _position_layer():
    """A layer adding a learned position embedding (one weight of shape (seq, dim))."""
    import tensorflow as tf

    class Position(tf.keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=tuple(shape[1:]), initializer="random_normal", name="table")

        def call(self, x):
            return x + self.table

    return Position()


def build(name: str, seed: int = 0):
    """``(model, x, y)`` of a benchmark model: random weights, synthetic batch."""
    import tensorflow as tf
    from tf_patch.zoo.keras_apps import KERAS_MODELS, keras_model

    if name in KERAS_MODELS:
        return keras_model(name, seed=seed)
    if name == "transformer":
        return transformer_model(**TRANSFORMER, seed=seed)
    if name not in MORE_CNNS:
        raise ValueError(f"unknown model {name!r}; known: {MODELS}")
    ctor, size, batch = MORE_CNNS[name]
    tf.keras.utils.set_random_seed(seed)
    model = getattr(tf.keras.applications, ctor)(weights=None, input_shape=(size, size, 3), classes=10)
    x = tf.random.normal((batch, size, size, 3), seed=seed)
    y = tf.random.uniform((batch,), 0, 10, dtype=tf.int32, seed=seed)
    return model, x, y


def run_model(name: str, time_limit: float) -> dict:
    import numpy as np
    import tensorflow as tf
    import tf_patch

    def step_of(model, x, y):
        return tf_patch.keras_step(model, "sparse_categorical_crossentropy", tf.keras.optimizers.SGD(0.01), x, y)

    t0 = t = time.perf_counter()
    model, x, y = build(name)
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
            "pesto_ms": round(plan.makespan / 1e3, 3),
            "losses_equal": "bit-equal" if plain == losses else "within 1e-5" if max(rel) <= 1e-5 else "no",
            "loss_rel_diffs": " / ".join(f"{r:.1e}" for r in rel), "weights_rel_diff": f"{w_rel:.1e}",
            "off_plan": len(seen["misplaced"]),
            "order_violations": f"{len(seen['order_violations'])} of {seen['checked_edges']}",
            "order_edges": applied.order_edges, "left_out": len(applied.left_out),
            "left_out_pct": round(100 * len(applied.left_out) / max(1, applied.order_edges), 1),
            "left_out_why": ", ".join(f"{n} {why}" for why, n in sorted(_count(applied.left_out).items())),
            "fusions": len(applied.fusions), "seconds": round(time.perf_counter() - t0), "note": step.note}


def _count(left_out) -> dict:
    counts = {}
    for *_, why in left_out:
        counts[why] = counts.get(why, 0) + 1
    return counts


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per model before it counts as hung")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {MODELS}")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {MODELS}")
    rows = []
    for name in names:
        rows.append(_in_process(name, args))
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "keras.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    (args.out / "keras.md").write_text(markdown(rows, args.time_limit, names != MODELS))
    return 0


COLUMNS = {"model": "model", "ops": "ops", "trace_s": "trace (s)", "unsized": "unsized",
           "persistent_mib": "persistent (MiB)", "variables_mib": "variables (MiB)", "single_ms": "one GPU (ms)",
           "pesto_ms": "Pesto (ms)", "losses_equal": "losses equal", "loss_rel_diffs": "loss rel. diffs",
           "weights_rel_diff": "weights rel. diff", "off_plan": "off-plan", "order_violations": "order violations",
           "order_edges": "order edges", "left_out": "left out", "left_out_pct": "left out (%)",
           "left_out_why": "why left out", "fusions": "oneDNN fusions kept", "seconds": "run (s)"}


def markdown(rows: list[dict], time_limit: float, reduced: bool) -> str:
    """keras.md: what was run, what each column means, one row per model."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"Generated by `python -m benchmarks.bench_keras` on {now}"
        + (" (a reduced set of models: `--models`)" if reduced else "") + ". Models built offline, random "
        "weights, a synthetic batch: MobileNetV2 and ResNet50 (`tf_patch.zoo.keras_apps`, 64 px), EfficientNetB0 and "
        "DenseNet169 (`keras.applications`, 64 px, batch 8), and a Transformer encoder built by hand "
        "(`transformer_model`: 2 blocks of `MultiHeadAttention` + `LayerNormalization` + GELU feed-forward, "
        f"{TRANSFORMER['seq']} tokens, width {TRANSFORMER['dim']}, batch {TRANSFORMER['batch']}). Each is traced "
        f"by `tf_patch.keras_step`, placed by `pesto.solve(gpus=2, time_limit={time_limit:g})` on V100 costs, "
        "then trained 3 SGD steps unplaced and 3 under the plan from the same initial weights, on 2 logical CPU "
        "devices (no GPU here). *unsized*: tensors with no size from their static shape nor from the shape-vector "
        "bound (`tf_patch.extract.shape_tensor_bytes`); *persistent* vs *variables*: the graph's persistent bytes "
        "against the model's variables (the optimizer's step counter adds a few bytes); *off-plan* / *order "
        "violations*: a traced placed step against the plan, over every control edge added; *loss rel. diffs*: "
        "placed vs unplaced loss at steps 1 / 2 / 3; *weights rel. diff*: the largest difference of any variable "
        "after one step, relative to the largest change any variable made in that step; *losses equal*: "
        "bit-equal, or all three within 1e-5. *order edges*: the plan's consecutive pairs on a device not "
        "already ordered by the graph; *left out*: those `tf_patch.apply` did not enforce, because oneDNN fuses "
        "Conv2D + BiasAdd and Conv2DBackpropFilter + BiasAddGrad after the graph is handed over "
        "(`tf_patch.fusion`): *fusion-cycle* would close a cycle through a fused kernel, *stops-fusion* is an "
        "edge into a Conv2D or BiasAdd oneDNN fuses (a control input stops the fusion), *inside-fusion* joins "
        "the two ops of one fused kernel. Every baseline on the CNNs (224 px): `placement.md`.")
    keys = list(COLUMNS)
    lines = ["# Keras models: trace, place, train placed", "", text, "",
             "| " + " | ".join(COLUMNS.values()) + " |",
             "|" + "|".join("---" if k in ("model", "losses_equal", "loss_rel_diffs", "left_out_why",
                                            "order_violations") else "---:" for k in keys) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "-")) for k in keys) + " |")
    notes = [f"- {r['model']}: {r.get('note', '')}" for r in rows]
    return "\n".join(lines + ["", "Notes (`step.note`):", ""] + notes) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
