"""Simulator vs TensorFlow: predicted and measured step time on logical devices.

Run: ``python -m benchmarks.bench_tf [--models rnnlm,nmt] [--steps 20] [--no-paper]``.
Writes ``benchmarks/results/tf_sim_error.csv`` / ``.md`` and
``benchmarks/results/tf_opgraph_for.csv``.

For each zoo model (``--preset``, default the demo's ``demo``: ms-scale
kernels) on 2 logical CPU devices of this machine, each one core
(:func:`tf_patch.session_config`):

1. profile it (measured kernel times from FULL_TRACE step stats, plus the
   calibrated per-op dispatch overhead; see :mod:`tf_patch.workflow`);
2. fit the transfer cost between the two devices (:mod:`tf_patch.commfit`;
   between logical devices its documented fallback, a constant);
3. make plans: everything on /CPU:0, Expert, m-ETF and ``pesto.solve``,
   and measure once how much slower a step keeping both cores busy runs
   than the one-core profile says (:func:`tf_patch.workflow.parallel_factor`,
   on m-ETF's plan, before the rounds);
4. enforce each plan on a fresh tf.Graph (devices + control edges), train,
   and time every placement in turns (:func:`tf_patch.workflow.time_interleaved`),
   median step time; predict it with :func:`pesto.simulate` (the plan's
   per-device order) on the profile, scaled by that factor for plans on
   both devices;
5. error = (measured - predicted) / predicted; the anchored error scales
   each round's predictions by m-ETF's measured / predicted step in that
   round (the machine's speed then), as the demo's table does. Steps 4-5 are repeated
   ``--rounds`` times, re-profiling the costs before each round (the
   machine is shared, so its load drifts), and the median error is kept.

TF's default placement (everything on /CPU:0, no order) is measured twice:
on one core (one executor thread: predicted as the serial sum, like a plan)
and with TensorFlow's own executor threads (one per core, running independent
ops at once: no device model, so no prediction; the CPU alternative to
placement).

It also times ``tf_patch.opgraph_for`` (grappler V100 estimate) on the
paper-size presets rnnlm 2x2048 and nmt 4x1024.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = Path(__file__).resolve().parent / "results"


def _plans(graph, cluster, time_limit):
    import pesto
    from pesto.simulate import simulate
    from solver import get_placer

    dev0 = cluster.names[0]
    out = {"single /CPU:0": simulate(graph, cluster, {n: dev0 for n in graph.names}).to_plan(placer="single")}
    for name in ("expert", "m-etf"):
        try:
            out[name] = get_placer(name)(graph, cluster)
        except Exception as exc:  # a baseline failing must not hide the others
            print(f"  {name} failed: {exc}")
    t0 = time.perf_counter()
    out["pesto"] = pesto.solve(graph, cluster=cluster, time_limit=time_limit, workers=1)
    out["pesto"] = out["pesto"].replace(wall_time=time.perf_counter() - t0)
    return out


def bench_model(model: str, steps: int, rounds: int, time_limit: float, preset: str = "demo"):
    from pesto.simulate import simulate
    from tf_patch.zoo import build_model
    from tf_patch.commfit import fit_transfers
    from tf_patch.workflow import (PlacedRun, anchored_errors, contended, parallel_factor, profile_model,
                                   time_interleaved)

    def build():
        return build_model(model, preset)

    graph, prof = profile_model(build, n_devices=2, steps=5)
    fit = fit_transfers(2, repeats=7)
    cluster = fit.cluster()
    print(f"{model}/{preset}: {graph.num_ops} ops, kernels x {prof.scale:.2f} + {prof.overhead:.2f} us/op, {fit}")
    plans = _plans(graph, cluster, time_limit)
    factor = parallel_factor(build, graph, cluster, plans["m-etf"])
    print(f"  {factor}")
    names = list(plans) + ["TF default (1 thread)", "TF default (own threads)"]
    pred, meas, par, busy = {k: [] for k in names}, {k: [] for k in names}, {k: [] for k in names}, []
    anch = {k: [] for k in names}  # per round: errors at m-ETF's measured / predicted step then
    slow = {k: [] for k in names}  # per round: measured / one-core profile, over the one-device step's
    for r in range(rounds):
        # re-profile every round: the costs the simulator gets are measured
        # under the same machine load as the steps they predict
        g_r = graph if r == 0 else profile_model(build, n_devices=2, steps=5)[0]
        runs = [PlacedRun(build, plan) for plan in plans.values()]
        runs += [PlacedRun(build, None), PlacedRun(build, None, inter_op=0)]
        try:
            timing = time_interleaved(runs, rounds=max(1, steps // 4), steps=4)
            med = timing.step_us
            busy += [timing.other_cores[i] for i in timing.kept]
        finally:
            for run in runs:
                run.close()
        single = simulate(g_r, cluster, {n: cluster.names[0] for n in g_r.names}).makespan
        busy_g = contended(g_r, factor.factor)
        # each plan on the one-core profile; on both devices predicted on the contended one
        alone = [simulate(g_r, cluster, plan).makespan for plan in plans.values()]
        preds = [simulate(busy_g, cluster, plan).makespan if len(plan.devices_used()) > 1 else a
                 for plan, a in zip(plans.values(), alone)] + [single, float("nan")]
        alone += [single, float("nan")]
        _, errs_r = anchored_errors(preds, med, names.index("m-etf"))
        one = med[names.index("TF default (1 thread)")] / single  # one core: measured / profile now
        for name, p, m, e, a1, run in zip(names, preds, med, errs_r, alone, runs):
            pred[name].append(p)
            meas[name].append(m)
            anch[name].append(e)
            slow[name].append(m / a1 / one)
            par[name].append(run.cores_used)
    rows = []
    for name in names:
        plan = plans.get(name)
        errs = [100 * (m - p) / p for m, p in zip(meas[name], pred[name])]
        anchored = anch[name]
        p, m = statistics.median(pred[name]), statistics.median(meas[name])
        rows.append(dict(model=model, preset=preset, placement=name, ordered=plan is not None, ops=graph.num_ops,
                         devices_used=len(plan.devices_used()) if plan is not None else 1,
                         predicted_ms=p / 1000, measured_ms=m / 1000, error_pct=statistics.median(errs),
                         anchored_error_pct=statistics.median(anchored),
                         slowdown=statistics.median(slow[name]),
                         transfers=len(plan.transfers) if plan is not None else 0,
                         measured_spread_ms=(max(meas[name]) - min(meas[name])) / 1000,
                         beta0_us=fit.beta0, beta1_us_per_mb=fit.beta1 * 1e6, fit_r2=fit.r2,
                         fit_fallback=bool(fit.fallback), overhead_us=prof.overhead, kernel_scale=prof.scale,
                         parallel_factor=factor.factor,
                         place_s=plan.wall_time if plan is not None else 0.0,
                         cores_used=statistics.median(par[name]),
                         busy_cores=statistics.median(b for b in busy if b == b) if any(
                             b == b for b in busy) else float("nan")))
        print(f"  {name:<24} predicted {p / 1000:7.3f} ms  measured {m / 1000:7.3f} ms  "
              f"error {rows[-1]['error_pct']:+6.1f}% (per round {', '.join(f'{e:+.0f}' for e in errs)}; "
              f"anchored on m-ETF {', '.join(f'{e:+.0f}' for e in anchored)}) "
              f"cores {rows[-1]['cores_used']:.2f}")
    return rows


def bench_opgraph_for(presets):
    import tf_patch

    rows = []
    for model, preset in presets:
        t0 = time.perf_counter()
        g = tf_patch.opgraph_for(model, preset, costs="v100", progress=False)
        s = time.perf_counter() - t0
        rows.append(dict(model=model, preset=preset, ops=g.num_ops, edges=g.num_edges, seconds=s,
                         work_ms=g.total_work("GPU") / 1000, critical_path_ms=g.critical_path("GPU") / 1000,
                         colocation_groups=len(g.colocation_groups())))
        print(f"opgraph_for({model}, {preset}, v100): {g.num_ops} ops in {s:.1f} s; "
              f"V100 work {rows[-1]['work_ms']:.1f} ms, critical path {rows[-1]['critical_path_ms']:.1f} ms")
    return rows


def _write_csv(path, rows):
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def _factors(rows):
    """(model, parallel factor) of each model, in the order measured."""
    seen = {}
    for r in rows:
        seen.setdefault(f"{r['model']}/{r['preset']}", r["parallel_factor"])
    return list(seen.items())


def _slowdown_text(rows) -> str:
    """Each 2-device plan's slowdown beside its transfers and cores used."""
    two = [r for r in rows if r["devices_used"] > 1 and r["slowdown"] == r["slowdown"]]
    per = "; ".join(f"{r['model']}/{r['preset']} {r['placement']} x {r['slowdown']:.2f} ({r['transfers']} transfers, "
                    f"{r['cores_used']:.2f} cores)" for r in two)
    return f"On both devices: {per}." if two else ""


def _summary(rows, a, load0, load1) -> list[str]:
    predicted = [r for r in rows if r["predicted_ms"] == r["predicted_ms"]]
    abs_err = [abs(r["error_pct"]) for r in predicted]
    busy = [r["busy_cores"] for r in rows if r["busy_cores"] == r["busy_cores"]]
    lines = [
        "# Simulator vs measured TensorFlow step time (2 logical CPU devices)",
        "",
        f"Date {_dt.date.today()}, {platform.machine()} with {os.cpu_count()} cores shared with other "
        f"jobs (load average {load0:.1f} at start, {load1:.1f} at end; other processes used "
        f"{statistics.median(busy) if busy else float('nan'):.2f} cores during the timing rounds kept, median), "
        f"TensorFlow CPU, `python -m benchmarks.bench_tf --preset {a.preset}`. Device model "
        "(`tf_patch.session_config`): one logical device = one core (kernels single-threaded, one executor "
        "thread per device used). Costs: measured kernel times (FULL_TRACE, median of 5 steps, one device, one "
        "thread) calibrated on an untraced serial step (dispatch overhead per op, or a scale when tracing "
        f"inflated kernels), re-profiled before each of {a.rounds} rounds; transfers: ping-pong fit (or its "
        "fallback, `tf_patch.commfit`). Each plan is enforced (devices + control edges). In a round every "
        f"placement is built and trained, then timed in turns, 4 steps at a time, {a.steps} steps each "
        "(median over the turns in which other processes used <= 0.25 cores, `tf_patch.workflow.time_interleaved`); the tables show medians over rounds (error = median of per-round errors).",
        "",
        "| model | placement | ops | devices | transfers | predicted ms | measured ms | error % "
        "| error % anchored on m-ETF | slowdown vs one-core profile | spread ms | cores used |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']}/{r['preset']} | {r['placement']} | {r['ops']} | {r['devices_used']} | "
                     f"{r['transfers']} | {r['predicted_ms']:.3f} | {r['measured_ms']:.3f} | {r['error_pct']:+.1f} | "
                     f"{r['anchored_error_pct']:+.1f} | {r['slowdown']:.2f} | "
                     f"{r['measured_spread_ms']:.3f} | {r['cores_used']:.2f} |")
    if abs_err:
        within = sum(e <= 10 for e in abs_err)
        anch = [abs(r["anchored_error_pct"]) for r in predicted if r["placement"] != "m-etf"]
        lines += ["", f"Predicted placements: median |error| {statistics.median(abs_err):.1f}%, max "
                      f"{max(abs_err):.1f}%, {within}/{len(abs_err)} within the 10% target; anchored on m-ETF "
                      f"(each round's prediction times m-ETF's measured / predicted step in that round, the "
                      f"machine's speed then, as the demo's table does; m-ETF itself left out): median "
                      f"|error| {statistics.median(anch):.1f}%, {sum(e <= 10 for e in anch)}/{len(anch)} within "
                      f"10%. \"TF default (1 "
                      "thread)\" is TF's own placement (every op on /CPU:0) on one core, predicted as the serial "
                      "sum; \"TF default (own threads)\" gives TensorFlow one executor thread per core, running independent ops at once: no "
                      "device model, no prediction, shown as the CPU alternative to placement.",
                  "", "`cores used` = this process's CPU time / wall time over the timed steps: a 2-device "
                      "plan that overlaps needs up to 2 cores; when other jobs hold one, it measures slower "
                      "than predicted.",
                  "", "Plans on both devices are predicted on the profile scaled by the parallel factor, "
                      "measured once per model before the rounds on m-ETF's plan timed in turns with the "
                      "one-device step (`tf_patch.workflow.parallel_factor`): "
                      + ", ".join(f"{m} x {f:.2f}" for m, f in _factors(rows))
                      + "; in the rounds themselves m-ETF's plan ran "
                      + ", ".join(f"x {r['slowdown']:.2f}" for r in rows if r["placement"] == "m-etf")
                      + " (slowdown column). The factor is only as good as the machine is steady between the "
                      "minute it was taken and the rounds, which is why the anchored error, taken in the same "
                      "rounds, is the one the demo checks. *Slowdown vs one-core profile*: a plan's measured step over its step simulated on "
                      "the one-core profile, divided by the same ratio of the one-device step in that round "
                      "(so the machine's drift cancels); 1 means the plan runs as fast as its kernels did alone. "
                      + _slowdown_text(rows),
                  "", "What the slowdown is and is not (demo_runs.md, 2026-11-24/25: 20 demo runs and 4 runs of this "
                      "benchmark): it is not two busy cores sharing memory bandwidth (Expert's plan, with about "
                      "as many cores busy, ran x 0.87-0.98 on NMT against m-ETF's x 1.03-1.27 and Pesto's x "
                      "1.06-1.21; on RNNLM x 1.00-1.36 against x 1.05-1.58 and x 1.06-1.54, least of the three "
                      "in 12 of 14 runs), nor mainly the data crossing cores (a hop that reads a tensor made on "
                      "the other core costs 0-4 us more up to 256 KiB, 15-22 us at 4 MiB: at most ~8 % of a "
                      "step, most of it the constant per transfer the simulator already charges). It grows with how finely a plan spreads a layer's "
                      "ops over the cores (hundreds of transfers a step against Expert's few dozen); the "
                      "candidates left are "
                      "each core's cache working set (a layer's weights used on both cores) and the executor "
                      "threads, which both logical devices share (a cheap op runs on whichever thread made it "
                      "ready). One factor per model, measured on m-ETF's plan, is therefore right for plans that "
                      "cross as often as m-ETF's (Pesto's) and too high for Expert's on NMT. \"TF default (own "
                      "threads)\" (TF's dynamic scheduling of one device on every core) is the CPU alternative "
                      "to placement: on a CPU there is no transfer cost to save."]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="rnnlm,nmt")
    ap.add_argument("--preset", default="demo", help="zoo preset of every model (default: the demo's)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per placement per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (median kept)")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--no-paper", action="store_true", help="skip opgraph_for on paper presets")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    import pesto  # noqa: F401  (OR-Tools before TensorFlow)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    rows = []
    for model in a.models.split(","):
        rows += bench_model(model, a.steps, a.rounds, a.time_limit, a.preset)
    load1 = os.getloadavg()[0]
    _write_csv(out / "tf_sim_error.csv", rows)
    og = [] if a.no_paper else bench_opgraph_for([("rnnlm", "2x2048"), ("nmt", "4x1024")])
    _write_csv(out / "tf_opgraph_for.csv", og)
    lines = _summary(rows, a, load0, load1)
    if og:
        lines += ["", "## `tf_patch.opgraph_for(..., costs=\"v100\")` on paper-size presets", "",
                  "| model | preset | ops | edges | seconds | V100 work ms | critical path ms | coloc groups |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in og:
            lines.append(f"| {r['model']} | {r['preset']} | {r['ops']} | {r['edges']} | {r['seconds']:.1f} | "
                         f"{r['work_ms']:.1f} | {r['critical_path_ms']:.1f} | {r['colocation_groups']} |")
    (out / "tf_sim_error.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'tf_sim_error.csv'} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
