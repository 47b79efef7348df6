"""``make demo`` / ``make train``: place and train a zoo model on N devices.

    python -m tf_patch.demo [--model rnnlm|nmt|transformer|nasnet|keras:NAME] [--gpus 2] [--steps 20]
                            [--micro-batches M|auto]

Build the model (its ``demo`` preset where it has one: ms-scale kernels) ->
profile it here (FULL_TRACE step stats, calibrated on an untraced step) ->
fit the transfer cost between devices (or its documented fallback) -> on
logical CPU devices, measure how much slower a step that keeps both cores
busy runs than the profile says (:func:`tf_patch.workflow.parallel_factor`,
on m-ETF's plan) and scale the profile by it -> ``pesto.solve`` -> enforce
the plan on the tf.Graph (devices + control dependencies) -> train.
Pesto's, Expert's, m-ETF's (the reference, on CPUs) and TF's default
placement are then timed in turns and the table gives placement time, the
step predicted from the profile, the same times the machine's speed now
(the reference's measured over predicted step in these rounds), the
measured step, the prediction's error and the cores used, then Pesto's
speed-up over TF's default placement and its loss curve.

Without GPUs it uses N logical CPU devices and says so. Each is one core
(:func:`tf_patch.session_config`: single-threaded kernels, one executor
thread per device used), so a 2-device plan really overlaps on 2 cores and
TF's default placement runs on one, as on one GPU; the timings show the
plan's overlap and the simulator's prediction of it, not GPU speed-ups.

``--micro-batches M`` builds the step split into ``M`` micro-batches
(:mod:`tf_patch.microstep`: every slice's forward and backward are ops of
their own, profiled at the micro-batch size), places it (``pesto.solve`` on
that profile: the plan enforced is the one solved on the graph TF runs, and
the table gives its predicted and measured step) and trains it; the
placements of the table then run the same split step, and the demo adds two
rows of the un-split step without a prediction: under TF's default placement
(what splitting costs or gains) and under ``tf.distribute.MirroredStrategy``
on the same devices (TensorFlow's data parallelism), and checks that the
split step's losses of steps 1 and 2 (the latter after one update) equal
theirs.

``--micro-batches auto`` (``make train MICRO=auto``) first profiles the
un-split step and runs ``pesto.solve_step(..., micro_batches="auto",
batch_size=<batch>)`` on it, prints every candidate's step (``M=1``, ``M=2``,
GPipe, 1F1B, data-parallel ...), then re-scores its best 3 split counts on
TF's split steps (:func:`tf_patch.slicemap.rescore_split`: each traced and
profiled at the micro-batch size, solved there in at most 5 s; the table
prints Pesto's compute/M figure next to the traced one) and picks the best of
those, the un-split step and the replicated candidates. A split winner trains
on the split step it traced, placed by :func:`tf_patch.slicemap.place_split`
(Pesto's plan mapped onto TF's op names as the hint of a solve of TF's
profile) for ``solve_step``'s own ``M``, else by ``pesto.solve`` from the
re-scoring's plan. A data-parallel or
hybrid winner (``R`` replicas of ``M`` micro-batches) trains on TF's replicated
step (:func:`tf_patch.replicate_model`: each op on the device the plan gives
it, the plan's gradient buckets as ring all-reduces), next to the un-split step
and ``MirroredStrategy``. Every run ends with the chosen plan's predicted and
measured step next to the un-split step's, and says ``the choice lost`` when
the chosen plan measured slower than the un-split step.

``keras:NAME`` (:data:`tf_patch.zoo.keras_apps.KERAS_MODELS`, e.g. ``keras:mobilenetv2``) builds a
``keras.applications`` model offline (``weights=None``, a synthetic batch),
traces its training step (:func:`tf_patch.keras_step`) with grappler's V100
costs, places it, trains it placed and checks the trace.
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

from pesto import evaluate, solve, solve_step, step_graph
from pesto.simulate import simulate
from solver import get_placer

from .commfit import fit_transfers
from .devices import describe, detect
from .function import keras_step
from .microstep import check_micro_batches
from .replicastep import one_replica, replicate_model
from .recompute import recompute_model, recompute_replicated
from .slicemap import place_split, recomputes, rescore_split, result_view
from .workflow import PlacedRun, anchored_errors, contended, parallel_factor, profile_model, time_interleaved
from .zoo import MODELS, build_model, presets
from .zoo.keras_apps import KERAS_MODELS, keras_app_step

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tf_patch.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="rnnlm", type=_model_name,
                    help="rnnlm, nmt, transformer, nasnet, or keras:NAME (keras:mobilenetv2, keras:resnet50)")
    ap.add_argument("--preset", default=None, help="model preset (default: 'demo' where the model has one, "
                                                      "else 'small')")
    ap.add_argument("--gpus", type=int, default=2, help="number of devices (logical if no GPU)")
    ap.add_argument("--steps", type=int, default=20, help="training steps under the Pesto plan")
    ap.add_argument("--rounds", type=int, default=8, help="timing rounds (each times every placement in turn)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batches", type=_micro, default=None, metavar="M|auto",
                    help="split the step into M micro-batches (M divides the batch); adds MirroredStrategy "
                         "and the un-split step's losses to the comparison; 'auto': pesto.solve picks M "
                         "(micro_batches='auto') on the un-split profile")
    args = ap.parse_args(argv)

    n = args.gpus
    if args.preset is None and not args.model.startswith("keras:"):
        args.preset = "demo" if "demo" in presets(args.model) else "small"
    batch = _batch(args)
    _check_micro(ap, args, batch)
    print(describe(n))
    if args.model.startswith("keras:"):
        return keras_demo(args)
    chosen = None
    if args.micro_batches == "auto":
        chosen = choose_micro_batches(args, batch)
        args.micro_batches = chosen.slices if chosen.slices > 1 else None
    args.what = chosen.what if chosen is not None else (f"{args.micro_batches} micro-batches" if args.micro_batches
                                                        else "the un-split step")
    return place_and_train(args, batch, chosen)


def _check_micro(ap, args, batch) -> None:
    """Refuse a bad ``--micro-batches`` with the named error's message (argparse exits 2)."""
    m = args.micro_batches
    if m == "auto":
        if args.model.startswith("keras:"):
            ap.error("--micro-batches auto is for the zoo models (rnnlm, nmt, transformer, nasnet); "
                     f"give {args.model} an M")
        if batch is None:
            ap.error(f"--micro-batches auto needs the batch size, and {args.model} has no preset "
                     f"{args.preset!r} to read it from; known presets: {', '.join(presets(args.model))}")
        return
    try:
        check_micro_batches(batch, 1 if m is None else m)
    except ValueError as exc:
        ap.error(str(exc))


def place_and_train(args, batch, chosen=None) -> int:
    """Profile the step of ``args.micro_batches`` slices, place it (from
    ``chosen``'s plan when ``auto`` chose one: :func:`tf_patch.slicemap.place_split`), train and report."""
    n, micro = args.gpus, args.micro_batches or 1
    if chosen is not None and chosen.replicas > 1:
        return _replicated_and_train(args, chosen)

    def build():
        return build_model(args.model, args.preset, seed=args.seed, micro_batches=micro)

    if chosen is not None and micro == 1:  # auto chose the un-split step: its profile is this step's
        alone, cluster, reference, graph = chosen.profiled
    elif chosen is not None and chosen.split is not None:   # the split step auto traced and solved
        (alone, graph, _), cluster = chosen.split, chosen.profiled[1]
        reference = _placer(REFERENCE_PLACER, alone, cluster) if chosen.profiled[2] is not None else None
    else:
        alone, _, cluster, reference, graph = _profile(build, args, f", {micro} micro-batches of {batch // micro}"
                                                       if args.micro_batches else "")
    t0 = time.perf_counter()
    if chosen is not None and chosen.result is not None and recomputes(result_view(chosen.result).origin):
        build, graph = _recomputing(build, chosen, graph)
        reference = None if reference is None else _placer(REFERENCE_PLACER, graph, cluster)   # with the copies
    if chosen is not None and chosen.result is not None:
        placed = place_split(chosen.result, chosen.step, graph, cluster, time_limit=args.time_limit,
                             workers=1, seed=args.seed)
        plan = placed.plan
        print(f"[3/5] auto's plan (M={chosen.micro_batches}, {placed.pesto_step / 1000:.3f} ms on Pesto's split) "
              f"mapped onto TF's split step: {placed.slices.summary()}")
        print(f"      mapped placement on TF's profile: {placed.hint.makespan / 1000:.3f} ms in TF's default order "
              f"(FIFO per device); re-solved from it as hint: {plan.summary()}")
    else:   # TF's split step profiled: the plan enforced is the one solved on it
        plan = _solve(graph, cluster, args, hint=chosen.split[2] if chosen is not None and chosen.split else None)
        print(f"[3/5] {plan.summary()}")
    place_s = time.perf_counter() - t0
    expert = _placer("expert", graph, cluster)
    unsplit = chosen.profiled[0] if chosen is not None else None
    return _run_and_report(build, alone, cluster, plan, place_s, expert, args, reference, graph, unsplit)


def _recomputing(build, chosen, graph):
    """``(build, graph)`` of the step with ``chosen``'s recomputed copies
    (:func:`tf_patch.recompute_model`: built on each model ``build`` makes, the
    OpGraph ``graph`` with the copies costed as their originals)."""
    def rebuilt():
        return recompute_model(build(), chosen.result, chosen.step, graph)[0]

    _, with_copies = recompute_model(build(), chosen.result, chosen.step, graph)
    print(f"[3/5] the plan recomputes activations: {with_copies.num_ops - graph.num_ops} copies built on TF's "
          f"step (recompute/...)")
    return rebuilt, with_copies


def _replicated_and_train(args, chosen) -> int:
    """A data-parallel or hybrid winner of ``auto``: TF's replicated step
    (:func:`tf_patch.replicate_model`: the step split into ``R x M`` slices,
    each replica its variables, the plan's rings) placed by the plan, trained
    and timed next to the un-split step and ``MirroredStrategy``."""
    result, (alone, cluster, _, _) = chosen.result, chosen.profiled

    def split():
        return build_model(args.model, args.preset, seed=args.seed, micro_batches=chosen.slices)

    def replicated():   # with the plan's recomputed copies when it has some (tf_patch.recompute_replicated)
        built = replicate_model(split(), result)
        return recompute_replicated(built[0], result, built[2]) if recomputes(result_view(result).origin) else built

    t0 = time.perf_counter()
    model, plan, rmap = replicated()
    print(f"[3/5] auto's plan ({chosen.what}, {result.plan.makespan / 1000:.3f} ms on Pesto's replicated graph) "
          f"carried onto TF's replicated step ({time.perf_counter() - t0:.1f} s): {rmap.summary()}")
    return _run_and_report(lambda: replicated()[0], None, cluster, plan,
                           time.perf_counter() - t0, None, args, None, alone, alone)


def _profile(build, args, split: str = ""):
    """Steps 1 and 2: the profiled step (``alone``), the transfer fit's cluster,
    m-ETF's reference plan and the contended graph (on logical CPU devices)."""
    n = args.gpus
    t0 = time.perf_counter()
    alone, prof = profile_model(build, n_devices=n, steps=5)
    print(f"[1/5] {args.model}/{args.preset}{split}: {alone.num_ops} ops, {alone.num_edges} edges; "
          f"profiled in {time.perf_counter() - t0:.1f} s (measured kernels x {prof.scale:.2f} + "
          f"{prof.overhead:.1f} us dispatch/op), serial work {alone.total_work(cluster_kind(alone)) / 1000:.2f} ms")
    t0 = time.perf_counter()
    fit = fit_transfers(n, repeats=5)
    cluster = fit.cluster()
    print(f"[2/5] {fit} ({time.perf_counter() - t0:.1f} s)")
    graph, reference = alone, None
    if cluster.devices[0].kind == "CPU" and n > 1:  # the cores share memory: a busy step runs slower
        reference = _placer(REFERENCE_PLACER, alone, cluster)
    if reference is not None:
        t0 = time.perf_counter()
        par = parallel_factor(build, alone, cluster, reference)
        graph = contended(alone, par.factor)
        print(f"      {par} ({time.perf_counter() - t0:.1f} s)")
    return alone, prof, cluster, reference, graph


@dataclass(frozen=True)
class Chosen:
    """What ``--micro-batches auto`` chose (:func:`choose_micro_batches`): any plan, a replicated one too.

    ``result``: ``pesto.solve_step``'s result to map onto TF's split step, or
    None when the winner cannot be enforced (a data-parallel plan: then the
    best enforceable ``micro_batches`` is placed by ``pesto.solve`` itself);
    ``step``: the un-split profiled graph it placed; ``profiled``: ``(alone,
    cluster, reference, graph)`` of that profile (:func:`_profile`), reused
    when the un-split step is chosen; ``split``: ``(alone, graph, plan)`` of
    TF's split step of the chosen ``M`` as the re-scoring traced and solved it
    (:func:`tf_patch.slicemap.rescore_split`), or None; ``predicted``: the
    choice's step (µs) on the graph it was re-scored on.
    """

    micro_batches: int
    result: object
    step: object
    profiled: tuple
    split: tuple | None = None
    predicted: float = float("nan")

    @property
    def replicas(self) -> int:
        return self.result.replicas if self.result is not None and self.result.graph_kind == "replicated" else 1

    @property
    def slices(self) -> int:
        """The slices of the TF step that runs the choice (``R x M`` for a replicated plan)."""
        return self.replicas * self.micro_batches

    @property
    def what(self) -> str:
        if self.replicas > 1:
            return f"data parallelism, {self.replicas} replicas x {self.micro_batches} micro-batch(es)"
        return f"{self.micro_batches} micro-batches" if self.micro_batches > 1 else "the un-split step"


def choose_micro_batches(args, batch: int) -> Chosen:
    """``--micro-batches auto``: profile the un-split step, ``pesto.solve_step``
    over the divisors of the batch (``micro_batches="auto"``), print each
    candidate's step and the choice."""
    print(f"[auto] choosing micro-batches for a batch of {batch}: profiling the un-split step")

    def build():
        return build_model(args.model, args.preset, seed=args.seed)

    alone, _, cluster, reference, graph = _profile(build, args)
    profiled = (alone, cluster, reference, graph)
    t0 = time.perf_counter()
    result = solve_step(graph, cluster=cluster, time_limit=args.time_limit, workers=1, seed=args.seed,
                        micro_batches="auto", batch_size=batch)
    result = result_view(result)   # what tf_patch reads of solve_step's result
    if result.graph_kind == "replicated" and result.replicas == 1:   # one replica: the step itself
        kind = "micro-batched" if result.micro_batches > 1 else "step"
        result = dataclasses.replace(result, plan=one_replica(result.plan, result.graph.names)[0],
                                     strategy=dataclasses.replace(result.strategy, replicas=1, stages=1),
                                     graph=step_graph(graph, result.micro_batches, kind))
    print(f"[auto] pesto.solve(micro_batches='auto', batch_size={batch}) in {time.perf_counter() - t0:.1f} s; "
          "step per candidate (ms, on the un-split profile):")
    for name, us in sorted(result.steps.items(), key=lambda kv: kv[1]):
        print(f"         {name:<22}{us / 1000:>9.3f}")
    for name, why in result.skipped.items():
        if "M=" in name and name not in result.steps:   # the counts the time limit or memory left out
            print(f"         {name:<22}  skipped: {why}")
    chosen = _rescored(args, result, profiled)
    print(f"[auto] chose {chosen.what} ({chosen.predicted / 1000:.3f} ms predicted)")
    return chosen


def _rescored(args, result, profiled) -> Chosen:
    """``auto``'s choice among its best split counts re-scored on TF's split
    steps (profiled at the micro-batch size, the un-split step's contention
    factor; :func:`tf_patch.slicemap.rescore_split`), the un-split step and
    the replicated candidates; the table prints compute/M next to the traced figure."""
    alone, cluster, _, graph = profiled
    kind = cluster_kind(alone)
    factor = graph.total_work(kind) / alone.total_work(kind)
    traced = {}

    def trace(m):
        split, _ = profile_model(lambda: build_model(args.model, args.preset, seed=args.seed, micro_batches=m),
                                 n_devices=args.gpus, steps=5)
        traced[m] = split
        return contended(split, factor)

    t0 = time.perf_counter()
    rescoring = rescore_split(result, graph, trace, cluster, top=3, time_limit=min(5.0, args.time_limit),
                              seed=args.seed)
    print(f"[auto] the best split counts traced as TF runs them (profiled at the micro-batch size) and solved "
          f"there ({time.perf_counter() - t0:.1f} s):")
    print(rescoring.table())
    row, best = rescoring.row, rescoring.best
    if row is not None:
        mine = result if result.graph_kind == "micro-batched" and result.micro_batches == row.micro_batches else None
        return Chosen(row.micro_batches, mine, graph, profiled, (traced[row.micro_batches], row.graph, row.plan),
                      row.traced)
    if best == "M=1":
        return Chosen(1, result if result.graph_kind == "step" else None, graph, profiled, None, rescoring.unsplit)
    return Chosen(result.micro_batches, result, graph, profiled, None, result.plan.makespan)


@dataclass
class _Row:
    """One placement of the results table: its plan's run and prediction (µs;
    NaN where there is no device model)."""

    name: str
    place_s: float
    predicted: float
    run: object  # tf_patch.workflow.PlacedRun


def _run_and_report(build, alone, cluster, plan, place_s, expert, args, reference=None, graph=None,
                    unsplit=None) -> int:
    """Steps 4 and 5: train under each placement, time them in turns, print
    the table and whether the chosen plan beat the un-split step. ``alone``:
    the profile of the step ``build`` builds (None: not profiled, a replicated
    step); ``unsplit``: the un-split step's profile, which predicts its row."""
    n, dev0 = args.gpus, cluster.names[0]
    on_cpu = detect(n)[0] == "CPU"
    graph = alone if graph is None else graph
    # one device, one busy core: the model's costs alone
    default_pred = _on_one(alone, cluster)
    also = (", Expert's" if expert is not None else "") + (f", {reference.placer}'s" if reference is not None else "")
    print(f"[4/5] training under Pesto's plan{also} and TF's default placement ({n} devices)"
          + ("; each logical device is one core: kernels single-threaded, one executor thread per device "
             "used (tf_patch.session_config)" if on_cpu else ""))
    rows = [_Row("Pesto", place_s, plan.makespan, PlacedRun(build, plan, n_devices=n))]
    if expert is not None:
        rows.append(_Row("Expert", expert.wall_time, expert.makespan, PlacedRun(build, expert, n_devices=n)))
    ref = None
    if reference is not None:
        ref = len(rows)
        rows.append(_Row(f"{reference.placer} (reference)", reference.wall_time,
                         simulate(graph, cluster, reference).makespan, PlacedRun(build, reference, n_devices=n)))
    one = len(rows)  # the TF default placement row
    rows.append(_Row(f"TF default (all on {dev0})", 0.0, default_pred, PlacedRun(build, None, n_devices=n)))
    if on_cpu:  # TF's own threading on one device: no device model, so no prediction
        rows.append(_Row(f"TF on {dev0}, all cores *", 0.0, float("nan"),
                         PlacedRun(build, None, n_devices=n, inter_op=0)))
    whole = _unsplit_rows(args, n, _on_one(unsplit, cluster)) if args.micro_batches else []
    rows += whole
    try:
        losses = rows[0].run.train(args.steps)
        # steps 1-2 of each run, before the timed steps; only a split step has an un-split one to match
        check = _split_check(args, losses, whole) if args.micro_batches else []
        timing = time_interleaved([r.run for r in rows], rounds=args.rounds, steps=4)
        tr = rows[0].run.trace()
        applied = rows[0].run.applied
    finally:
        for r in rows:
            r.run.close()
    print(f"      Pesto plan enforced: {len(applied.control_edges)} control edges added "
          f"({applied.skipped} already implied); trace: {len(tr['misplaced'])} ops off-plan, "
          f"{len(tr['order_violations'])}/{tr['checked_edges']} order violations")
    if check:
        print("\n".join(check))
    speed = _print_table(rows, timing, ref)
    _verdict(rows, timing.step_us, one, len(rows) - len(whole) if whole else one, args, speed)
    if on_cpu:
        _cpu_note(n, timing, dev0)
    pts = sorted({0, len(losses) // 4, len(losses) // 2, 3 * len(losses) // 4, len(losses) - 1})
    print("  Pesto loss curve: " + ", ".join(f"step {i}: {losses[i]:.3f}" for i in pts))
    if losses[-1] >= losses[0]:
        print("  (loss did not fall: try more --steps)")
    return 0


def _on_one(graph, cluster) -> float:
    """The simulator's step of ``graph`` with every op on the cluster's first
    device (TF's default placement; NaN without a profile)."""
    if graph is None:
        return float("nan")
    return simulate(graph, cluster, {o: cluster.names[0] for o in graph.names}).makespan


def _verdict(rows: list, measured: list, one: int, unsplit: int, args, speed: float = 1.0) -> None:
    """Pesto against TF's default placement and every un-split row; then the
    chosen plan's predicted step (at the machine's ``speed``, as the table's)
    and measured step next to the un-split step's (row ``unsplit``), and
    whether the choice held."""
    def ms(us):
        return "-" if us != us else f"{us / 1000:.3f} ms"

    for k in dict.fromkeys([one, *range(unsplit, len(rows))]):
        pred = rows[k].predicted / rows[0].predicted if rows[0].predicted else float("nan")
        name = "TF default placement" if k == one else rows[k].name.rstrip(" *")
        print(f"  Pesto vs {name}: {measured[k] / measured[0]:.2f}x measured, "
              + ("no prediction" if pred != pred else f"{pred:.2f}x predicted"))
    chosen, whole = rows[0], rows[unsplit]
    print(f"  the chosen plan ({args.what}): predicted {ms(speed * chosen.predicted)}, measured {ms(measured[0])}; "
          f"the un-split step ({whole.name.rstrip(' *')}): predicted {ms(speed * whole.predicted)}, "
          f"measured {ms(measured[unsplit])}")
    if unsplit != 0 and measured[0] > measured[unsplit]:
        print(f"  the choice lost: measured {ms(measured[0])} vs {ms(measured[unsplit])} un-split "
              f"({measured[unsplit] / measured[0]:.2f}x)")
    elif unsplit != 0:
        print(f"  the choice held: measured {ms(measured[0])} vs {ms(measured[unsplit])} un-split "
              f"({measured[unsplit] / measured[0]:.2f}x)")


#: Largest relative difference between the split step's losses and the un-split step's
#: that the demo calls equal (float32 sums in another order differ by ~1e-7).
LOSS_RTOL = 1e-5


def _unsplit_rows(args, n: int, predicted: float = float("nan")) -> list:
    """Rows for the un-split step: under TF's default placement (what
    splitting costs or gains here; ``predicted``: its step from the un-split
    profile, when there is one) and under ``tf.distribute.MirroredStrategy``
    on the ``n`` devices (:func:`tf_patch.zoo.common.mirrored_step`; left out,
    and said, when TensorFlow cannot run it here)."""
    def whole(**kw):
        return lambda: build_model(args.model, args.preset, seed=args.seed, **kw)

    rows = [_Row("TF default, un-split step" + (" *" if predicted != predicted else ""), 0.0, predicted,
                 PlacedRun(whole(), None, n_devices=n))]
    if n > 1:
        try:
            rows.append(_Row(f"MirroredStrategy x{n} *", 0.0, float("nan"),
                             PlacedRun(whole(mirrored=n), None, n_devices=n, inter_op=n)))
        except Exception as exc:  # noqa: BLE001  (a baseline must not stop the demo)
            print(f"      MirroredStrategy on {n} devices not run here: {type(exc).__name__}: {exc}")
    return rows


def _split_check(args, losses: list, whole: list) -> list[str]:
    """Lines comparing the split step's losses of steps 1 and 2 (the second
    after one update) with the un-split step's, of each row of ``whole``
    (whose first two steps this runs), and saying what those rows are."""
    out = ["  losses at steps 1 and 2 (step 2 after one update; each row a fresh copy from the same initial "
           "weights):",
           f"    {f'Pesto, {args.what}, placed':<44}{losses[0]:>12.7f}{losses[1]:>12.7f}"]
    for row in whole:
        ls = row.run.train(2)
        diff = max(abs(a - b) for a, b in zip(losses[:2], ls))
        same = all(abs(a - b) <= LOSS_RTOL * abs(b) for a, b in zip(losses[:2], ls))
        out.append(f"    {row.name.rstrip(' *'):<44}{ls[0]:>12.7f}{ls[1]:>12.7f}   largest difference {diff:.1e}: "
                   + (f"equal within {LOSS_RTOL:g} relative" if same else "NOT EQUAL"))
    out.append(f"  TF default, un-split step: the step not split, every op on one device (what {args.what} "
               "cost or gain here)")
    if len(whole) > 1:
        out.append(f"  {whole[1].name.rstrip(' *')}: TensorFlow's data parallelism, the un-split step with one replica "
                   f"per device, each on 1/{args.gpus} of the batch, gradients all-reduced")
    return out


def _print_table(rows: list[_Row], timing, ref: int | None) -> float:
    """The results table; returns the machine's speed it used (1 without a
    reference). With a reference row (index ``ref``), every
    prediction is also given at the machine's speed now, the reference's
    measured / profile step in these same rounds, and the error is taken
    against that (:func:`tf_patch.workflow.anchored_errors`)."""
    measured = timing.step_us
    profile = [r.predicted for r in rows]
    speed, errors = anchored_errors(profile, measured, ref)
    print(f"[5/5] results (step times in ms; placements timed in turns, 4 steps each per round; {timing.note()})")
    print(f"  {'placement':<28}{'place s':>9}{'profile':>9}{'predicted':>11}{'measured':>10}{'error':>10}{'cores':>7}")
    for i, (r, meas, err) in enumerate(zip(rows, measured, errors)):
        cell = "anchor" if i == ref else "-" if err != err else f"{err:+.0f}%"
        print(f"  {r.name:<28}{r.place_s:>9.2f}{r.predicted / 1000:>9.3f}{speed * r.predicted / 1000:>11.3f}"
              f"{meas / 1000:>10.3f}{cell:>10}{r.run.cores_used:>7.2f}")
    if ref is not None:
        print(f"  profile: the simulator's step on the profile of [1/5] (x the factor of [2/5] on several devices);\n"
              f"  predicted: that x {speed:.3f}, {rows[ref].name}'s measured / profile step in these rounds (the\n"
              "  machine's speed now: on a shared VM it drifts 10-20 % within a minute); error: of the prediction")
    return speed


def _cpu_note(n, timing, dev0) -> None:
    """What logical devices show and what they do not."""
    print(f"  Logical CPU devices: each is one core of this machine ({os.cpu_count()} cores), as each GPU\n"
          f"  would be one GPU; TF's default placement puts every op on {dev0}, one core. The rows show\n"
          "  the plan's overlap on real cores and how well it was predicted, not GPU speed-ups: the cores\n"
          "  share one memory (no copies). A plan that hands tensors between the cores hundreds of times\n"
          "  a step (m-ETF's, Pesto's) runs slower than its one-core profile, typically by 10-25 %: the\n"
          "  multi-device predictions scale the profile by the factor measured in [2/5] on m-ETF's plan,\n"
          "  not Pesto's. Expert's layer split crosses a few dozen times and is slowed less, so it\n"
          "  measures faster than predicted (benchmarks/results/demo_runs.md).\n"
          "  * TF's default placement with TF's own threads (one per core, running independent ops of one\n"
          "  device at once) has no device model and no prediction: on a CPU it is the alternative to\n"
          "  placement (benchmarks/results/tf_sim_error.md).")
    busy = [timing.other_cores[i] for i in timing.kept if timing.other_cores[i] == timing.other_cores[i]]
    if busy and statistics.median(busy) > timing.quiet:
        print(f"  Note: other processes used {statistics.median(busy):.1f} of {os.cpu_count()} cores while timing; "
              f"{n}-device plans need {n} free cores, so they measure slower than predicted on a busy machine.")


ZOO_MODELS = ("rnnlm", "nmt", "transformer", "nasnet")
# the plan the parallel factor is measured on: a list scheduler's, which keeps
# both devices busy as Pesto's plans do, and is not the plan it predicts
REFERENCE_PLACER = "m-etf"


def _model_name(text: str) -> str:
    if text in ZOO_MODELS or (text.startswith("keras:") and text[6:] in KERAS_MODELS):
        return text
    raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose one of {', '.join(ZOO_MODELS)} or "
                                     + ", ".join(f"keras:{k}" for k in KERAS_MODELS))


def _micro(text: str):
    """``--micro-batches``: ``auto`` or an integer (checked against the batch later)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {text!r}") from None


def _batch(args) -> int | None:
    """The batch size of the model the demo is to build (None: an unknown preset, refused later)."""
    if args.model.startswith("keras:"):
        return KERAS_MODELS[args.model[6:]][2]
    return MODELS[args.model][1].get(args.preset, {}).get("batch")


def keras_demo(args) -> int:
    """Trace, place, train placed and check a Keras model's training step."""
    t0 = time.perf_counter()
    micro = (1 if args.micro_batches is None else args.micro_batches)
    step = keras_app_step(args.model[6:], seed=args.seed, n_devices=args.gpus, micro_batches=micro)
    g = step.graph
    split = (f", {micro} micro-batches (batch norm per micro-batch: losses not the un-split step's)"
             if micro > 1 else "")
    print(f"[1/4] {args.model}{split}: {g.num_ops} ops, weights {sum(o.persistent_bytes for o in g.ops) / 2**20:.1f} MiB, "
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


def _solve(graph, cluster, args, hint=None):
    """pesto.solve with the demo's options (``hint``: a plan of ``graph`` to start from)."""
    return solve(graph, cluster=cluster, time_limit=args.time_limit, workers=1, seed=args.seed,
                 hint="best-heuristic" if hint is None else hint)


def _placer(name, graph, cluster):
    """A baseline's plan, or None (said) if it fails: the demo still trains Pesto's."""
    try:
        return get_placer(name)(graph, cluster)
    except Exception as exc:  # noqa: BLE001  (a baseline must not stop the demo)
        print(f"      placer {name!r} failed: {type(exc).__name__}: {exc}")
        return None


if __name__ == "__main__":
    sys.exit(main())
