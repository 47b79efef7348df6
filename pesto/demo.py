"""``make demo`` / ``make train``: place and train a zoo model on N devices.

    python -m pesto.demo [--model rnnlm|nmt|transformer|nasnet|keras:NAME] [--gpus 2] [--steps 20]

Build the model -> profile it here (FULL_TRACE step stats) -> fit the
transfer cost between devices -> ``pesto.solve`` -> enforce the plan on the
tf.Graph (devices + control dependencies) -> train. Prints placement time,
predicted and measured step time for Pesto, Expert and TF's default
placement, and Pesto's loss curve. Without GPUs it uses N logical CPU
devices and says so (the timings then show the pipeline, not GPU speedups:
logical devices share this machine's cores).

``keras:NAME`` (:data:`pesto.zoo.keras_apps.KERAS_MODELS`, e.g. ``keras:mobilenetv2``) builds a
``keras.applications`` model offline (``weights=None``, a synthetic batch),
traces its training step (:func:`tf_patch.keras_step`) with grappler's V100
costs, places it, trains it placed and checks the trace.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from solver import get_placer

from .api import evaluate, solve
from .simulate import simulate

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pesto.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="rnnlm", type=_model_name,
                    help="rnnlm, nmt, transformer, nasnet, or keras:NAME (keras:mobilenetv2, keras:resnet50)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--gpus", type=int, default=2, help="number of devices (logical if no GPU)")
    ap.add_argument("--steps", type=int, default=20, help="training steps under the Pesto plan")
    ap.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    # TensorFlow is optional for the library: the zoo and tf_patch load it, so
    # they are imported here (pesto, hence OR-Tools, is already loaded: see tf_patch)
    from pesto.zoo import build_model
    from tf_patch.commfit import fit_transfers
    from tf_patch.devices import describe, detect
    from tf_patch.pipeline import profile_model, run_placed

    n = args.gpus
    print(describe(n))
    if args.model.startswith("keras:"):
        return keras_demo(args)

    def build():
        return build_model(args.model, args.preset, seed=args.seed)

    t0 = time.perf_counter()
    graph, prof = profile_model(build, n_devices=n, steps=5)
    print(f"[1/5] {args.model}/{args.preset}: {graph.num_ops} ops, {graph.num_edges} edges; "
          f"profiled in {time.perf_counter() - t0:.1f} s (measured kernels x {prof.scale:.2f} + "
          f"{prof.overhead:.1f} us dispatch/op), serial work {graph.total_work(cluster_kind(graph)) / 1000:.2f} ms")
    t0 = time.perf_counter()
    fit = fit_transfers(n, repeats=5)
    cluster = fit.cluster()
    print(f"[2/5] {fit} in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    plan = _solve(graph, cluster, args)
    place_s = time.perf_counter() - t0
    print(f"[3/5] {plan.summary()}")
    expert = _placer("expert", graph, cluster)
    dev0 = cluster.names[0]
    default_pred = simulate(graph, cluster, {o: dev0 for o in graph.names}).makespan

    print(f"[4/5] running Pesto, Expert and TF default placement ({n} devices)...")
    rows = []
    res_p = run_placed(build, plan, n_devices=n, steps=args.steps, timed=10, trace=True)
    rows.append(("Pesto", place_s, plan.makespan, res_p.step_us))
    if expert is not None:
        res_e = run_placed(build, expert, n_devices=n, steps=3, timed=10, order=False)
        rows.append(("Expert", expert.wall_time, expert.makespan, res_e.step_us))
    res_d = run_placed(build, None, n_devices=n, steps=3, timed=10)
    rows.append(("TF default (all on " + dev0 + ")", 0.0, default_pred, res_d.step_us))

    tr = res_p.trace
    print(f"      Pesto plan enforced: {len(res_p.applied.control_edges)} control edges added "
          f"({res_p.applied.skipped} already implied); trace: {len(tr['misplaced'])} ops off-plan, "
          f"{len(tr['order_violations'])}/{tr['checked_edges']} order violations")
    print("[5/5] results (step times in ms)")
    print(f"  {'placement':<28}{'place s':>9}{'predicted':>11}{'measured':>10}")
    for name, s, pred, meas in rows:
        print(f"  {name:<28}{s:>9.2f}{pred / 1000:>11.3f}{meas / 1000:>10.3f}")
    if detect(n)[0] == "CPU":
        print("  (logical CPU devices share this machine's cores, and TensorFlow runs microsecond\n"
              "   kernels inline on one thread: measured times show the pipeline works end to end,\n"
              "   not the overlap two GPUs would give; see benchmarks/results/tf_sim_error.md)")
    curve = res_p.losses
    pts = sorted({0, len(curve) // 4, len(curve) // 2, 3 * len(curve) // 4, len(curve) - 1})
    print("  Pesto loss curve: " + ", ".join(f"step {i}: {curve[i]:.3f}" for i in pts))
    if curve[-1] >= curve[0]:
        print("  (loss did not fall: try more --steps)")
    return 0


ZOO_MODELS = ("rnnlm", "nmt", "transformer", "nasnet")


def _model_name(text: str) -> str:
    from pesto.zoo.keras_apps import KERAS_MODELS

    if text in ZOO_MODELS or (text.startswith("keras:") and text[6:] in KERAS_MODELS):
        return text
    raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose one of {', '.join(ZOO_MODELS)} or "
                                     + ", ".join(f"keras:{k}" for k in KERAS_MODELS))


def keras_demo(args) -> int:
    """Trace, place, train placed and check a Keras model's training step."""
    import tensorflow as tf
    import tf_patch
    from pesto.zoo.keras_apps import keras_model

    t0 = time.perf_counter()
    model, x, y = keras_model(args.model[6:], seed=args.seed)
    step = tf_patch.keras_step(model, "sparse_categorical_crossentropy", tf.keras.optimizers.SGD(0.01), x, y,
                               n_devices=args.gpus)
    g = step.graph
    print(f"[1/4] {args.model}: {g.num_ops} ops, weights {sum(o.persistent_bytes for o in g.ops) / 2**20:.1f} MiB, "
          f"grappler V100 serial work {g.total_work('GPU') / 1000:.2f} ms; traced in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    plan = solve(g, gpus=args.gpus, time_limit=args.time_limit, workers=1, seed=args.seed)
    single = evaluate(g, {o: "/GPU:0" for o in g.names}, gpus=args.gpus).makespan
    print(f"[2/4] {plan.summary()}; placed in {time.perf_counter() - t0:.1f} s "
          f"(one V100: {single / 1000:.3f} ms predicted)")
    before = step.run(2)
    applied = step.apply(plan)
    print(f"[3/4] {step.note}; {len(applied.control_edges)} control edges added")
    losses = before + step.run(args.steps)
    seen = step.check()
    step.close()
    print(f"[4/4] trace: {len(seen['misplaced'])} ops off-plan, {len(seen['order_violations'])}/"
          f"{seen['checked_edges']} order violations; losses " + ", ".join(f"{v:.3f}" for v in losses[:3])
          + f" ... {losses[-1]:.3f}")
    return 0


def cluster_kind(graph) -> str:
    """The device kind the graph's ops were costed for."""
    return sorted(graph.kinds())[0]


def _solve(graph, cluster, args):
    """pesto.solve with the demo's options."""
    return solve(graph, cluster=cluster, time_limit=args.time_limit, workers=1, seed=args.seed)


def _placer(name, graph, cluster):
    """A baseline's plan, or None (said) if it fails: the demo still trains Pesto's."""
    try:
        return get_placer(name)(graph, cluster)
    except Exception as exc:  # noqa: BLE001  (a baseline must not stop the demo)
        print(f"      placer {name!r} failed: {type(exc).__name__}: {exc}")
        return None


if __name__ == "__main__":
    sys.exit(main())
