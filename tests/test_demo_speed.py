"""The demo's device model and measurement plumbing (issue 16).

No timing assertions: speed is measured by ``make demo`` and
``benchmarks/bench_tf.py`` (figures in benchmarks/results/tf_sim_error.md);
here the settings, the interleaved timing's bookkeeping, the transfer-fit
fallback and the demo's output are checked.
"""
import os
import statistics

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from pesto import Plan  # noqa: E402
from pesto.cluster import NVLINK_GG  # noqa: E402
from tf_patch.zoo import build_model, presets  # noqa: E402
from tf_patch.commfit import MIN_R2, choose_model  # noqa: E402
from tf_patch.devices import session_config  # noqa: E402
from tf_patch.workflow import (PlacedRun, Timing, busy_cores, contended, parallel_factor,  # noqa: E402
                               profile_model, time_interleaved)

pytestmark = pytest.mark.tf


def build_small():
    return build_model("rnnlm", "small", layers=1, steps=3)


def two_device_plan():
    """Layer 0's ops on /CPU:1, the rest on /CPU:0 (colocation groups kept
    on their first member's device), in a topological order."""
    from tf_patch.extract import extract

    m = build_small()
    g = extract(m.graph, m.fetches, kind="CPU", default_cost=1.0, on_unknown="warn")
    place, first = {}, {}
    for n in g.topological_order():
        place[n] = "/CPU:1" if n.startswith("rnn/layer_0/") else "/CPU:0"
        grp = g.op(n).colocation_group
        if grp is not None:
            place[n] = first.setdefault(grp, place[n])
    return Plan.from_placement(g, place)


def test_session_config_is_one_core_per_device():
    cfg = session_config(2)
    assert cfg.intra_op_parallelism_threads == 1
    assert cfg.inter_op_parallelism_threads == 2
    assert cfg.device_count["CPU"] == 2
    assert session_config(2, inter_op=1).inter_op_parallelism_threads == 1
    # 0 means TensorFlow's own choice (every core), not "n"
    free = session_config(2, inter_op=0, intra_op=0)
    assert (free.inter_op_parallelism_threads, free.intra_op_parallelism_threads) == (0, 0)
    # each session its own executor threads, not the pool the process's first session sized
    assert cfg.use_per_session_threads


def test_each_session_gets_its_own_executor_threads():
    """A 1-thread session first (as profiling is) must not leave a later
    2-device session with one executor thread."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc to count threads")

    def threads():
        return len(os.listdir("/proc/self/task"))

    with PlacedRun(build_small, None, inter_op=1) as first:
        first.train(1)
        before = threads()
        with PlacedRun(build_small, two_device_plan(), inter_op=3) as second:
            second.train(1)
            assert threads() >= before + 3


def test_placed_runs_get_one_thread_per_device_used_and_time_in_turns():
    plan = two_device_plan()
    assert set(plan.placement.values()) == {"/CPU:0", "/CPU:1"}
    with PlacedRun(build_small, plan) as placed, PlacedRun(build_small, None) as default, \
            PlacedRun(build_small, None, inter_op=0) as free:
        assert placed.inter_op == 2 and default.inter_op == 1 and free.inter_op == 0
        losses = placed.train(3)
        assert len(losses) == 3 and all(v > 0 for v in losses)
        timing = time_interleaved([placed, default, free], rounds=2, steps=2, warmup=1)
        med = timing.step_us
        assert len(med) == 3 and all(m > 0 for m in med)
        assert len(timing.other_cores) == 2 and set(timing.kept) <= {0, 1} and len(timing.kept) >= 1
        assert "rounds" in timing.note()
        for run in (placed, default, free):
            assert len(run.times) == 4
            assert run.cores_used > 0
        assert placed.step == 3 + 1 + 4  # trained, warm-up, timed: each step has its own batch
        seen = placed.trace()
        assert seen["misplaced"] == [] and seen["order_violations"] == []
        if timing.kept == [0, 1]:
            assert med[0] == statistics.median(placed.times)


def test_transfer_fit_used_only_when_it_explains_the_points():
    sizes = [1 << 10, 1 << 16, 1 << 20, 1 << 24]
    good = choose_model(4.0, 2e-5, 0.99, sizes, [4.0, 5.3, 25.0, 340.0])
    assert (good.beta0, good.beta1, good.fallback) == (4.0, 2e-5, "")
    assert "not used" not in str(good)
    # logical CPU devices: time does not grow with size -> constant, the median
    flat = choose_model(6.0, -1e-8, 0.2, sizes, [2.0, 9.0, 3.0, 4.0])
    assert (flat.beta0, flat.beta1) == (3.5, 0.0) and flat.line == (6.0, -1e-8)
    assert "not used" in str(flat) and "copies nothing" in flat.fallback
    assert flat.cluster().route("/CPU:0", "/CPU:1").beta0 == 3.5
    gpu = choose_model(6.0, -1e-8, MIN_R2 - 0.01, sizes, [2.0, 9.0, 3.0, 4.0], kind="GPU")
    assert (gpu.beta0, gpu.beta1) == NVLINK_GG and "NVLink" in gpu.fallback


def test_transfer_fit_that_rests_on_one_point_is_not_used():
    from tf_patch.commfit import DEFAULT_SIZES, fit_line, without_one

    sizes = list(DEFAULT_SIZES)  # 1 KiB .. 16 MiB by powers of 4
    # measured here between logical CPU devices: flat noise and one slow 16 MiB hop
    one = [4.1, 5.3, 5.7, 1.0, 4.1, 7.7, 7.2, 42.7]
    b0, b1, r2 = fit_line(sizes, one)
    assert r2 >= MIN_R2  # R^2 alone would take the line
    fit = choose_model(b0, b1, r2, sizes, one)
    assert without_one(np.array(sizes), np.array(one)) == without_one(sizes, one)  # arrays as lists
    assert fit.beta1 == 0.0 and fit.beta0 == pytest.approx(statistics.median(one))
    assert "rests on one point" in fit.fallback and "16.00 MiB" in fit.fallback and fit.r2_without_one < 0.5
    gpu = choose_model(b0, b1, r2, sizes, one, kind="GPU")
    assert (gpu.beta0, gpu.beta1) == NVLINK_GG and "rests on one point" in gpu.fallback
    # also measured here: time growing over the three largest sizes, whichever point is left out
    grows = [0.7, 7.5, 4.8, 8.9, 12.0, 15.2, 69.4, 231.9]
    fit = choose_model(*fit_line(sizes, grows), sizes, grows)
    assert fit.fallback == "" and fit.beta1 > 0 and fit.r2_without_one >= MIN_R2
    # a GPU link: 10 us + 12 GB/s, with 3 % noise
    rng = np.random.default_rng(0)
    link = [(10.0 + s / 12e3) * (1 + 0.03 * rng.standard_normal()) for s in sizes]
    fit = choose_model(*fit_line(sizes, link), sizes, link, kind="GPU")
    assert fit.fallback == "" and fit.beta1 * 1e3 == pytest.approx(1 / 12, rel=0.1)


def test_timing_note_says_which_rounds_count():
    quiet = Timing([1.0], [0.1, 1.5, 0.0, 0.2], [0, 2, 3], 0.25).note()
    assert "3 of 4 rounds" in quiet and "up to 1.5" in quiet
    busy = Timing([1.0], [0.9, 1.5], [0, 1], 0.25).note()
    assert "0.9-1.5 cores" in busy and "busy" in busy
    assert "unknown" in Timing([1.0], [float("nan")], [0], 0.25).note()


def test_busy_cores_is_a_fraction_of_the_machine():
    b = busy_cores(0.05)
    assert b is None or 0 <= b <= (os.cpu_count() or 1) + 1e-6


def test_demo_presets_exist_and_are_bigger_than_small():
    for name in ("rnnlm", "nmt"):
        assert "demo" in presets(name)
        demo, small = build_model(name, "demo").config, build_model(name, "small").config
        assert demo["units"] >= 4 * small["units"]


def test_demo_prints_the_measured_table(capsys):
    from tf_patch import demo

    assert demo.main(["--model", "rnnlm", "--preset", "small", "--time-limit", "2", "--steps", "2",
                      "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for text in ("[5/5]", "Pesto ", "Expert ", "TF default (all on /CPU:0)", "TF on /CPU:0, all cores *",
                 "Pesto vs TF default placement:", "one executor thread per device", "0 ops off-plan",
                 "runs x", "m-etf's step / one device's", "m-etf (reference)", "anchor", "predicted: that x"):
        assert text in out, text


def test_contended_scales_every_op_and_nothing_else():
    from pesto.cluster import logical_cpus
    from pesto.graph import OpGraph
    from pesto.simulate import simulate

    g = OpGraph.from_edges({"a": 10.0, "b": 20.0, "c": 30.0, "d": 5.0},
                           [("a", "b", 64), ("a", "c", 64), ("b", "d", 8), ("c", "d", 8)])
    assert contended(g, 1.0) is g
    busy = contended(g, 1.25)
    for op in g.ops:
        assert busy.op(op.name).compute == {k: 1.25 * v for k, v in op.compute.items()}
        assert busy.op(op.name).output_bytes == op.output_bytes
    assert busy.edges == g.edges and busy.tensors == g.tensors
    # with free transfers a schedule stretches by the factor
    free = logical_cpus(2, beta=(0.0, 0.0), kind="GPU")  # from_edges costs ops for GPUs
    place = {"a": "/CPU:0", "b": "/CPU:0", "c": "/CPU:1", "d": "/CPU:0"}
    assert simulate(busy, free, place).makespan == pytest.approx(1.25 * simulate(g, free, place).makespan)


def test_parallel_factor_compares_measured_and_simulated_ratios():
    from pesto.simulate import simulate
    from solver import get_placer
    from tf_patch.commfit import choose_model

    def build():  # the small preset as the demo builds it (every tensor sized)
        return build_model("rnnlm", "small")

    graph, _ = profile_model(build, n_devices=2, steps=2)
    cluster = choose_model(3.0, 0.0, 1.0, [1, 2], [3.0, 3.0]).cluster()
    plan = get_placer("m-etf")(graph, cluster)
    par = parallel_factor(build, graph, cluster, plan, rounds=1, steps=2)
    assert par.placer == "m-etf"
    assert par.simulated == pytest.approx(simulate(graph, cluster, plan).makespan)
    one = simulate(graph, cluster, {o: "/CPU:0" for o in graph.names}).makespan
    assert par.simulated_one == pytest.approx(one)
    assert par.measured > 0 and par.measured_one > 0 and par.ratio > 0
    assert par.factor == pytest.approx(max(1.0, par.ratio / (par.simulated / par.simulated_one)))
    # one round: its ratio is the ratio of the two medians
    assert par.ratio == pytest.approx(par.measured / par.measured_one)
    assert f"x {par.factor:.2f}" in str(par)


def test_anchored_errors_put_every_prediction_at_the_reference_speed():
    from tf_patch.workflow import anchored_errors

    speed, errs = anchored_errors([10.0, 20.0, 40.0, float("nan")], [13.0, 24.0, 52.0, 7.0], ref=0)
    assert speed == pytest.approx(1.3)
    assert errs[0] == pytest.approx(0.0)
    assert errs[1] == pytest.approx(100 * (24.0 - 26.0) / 26.0)
    assert errs[2] == pytest.approx(0.0)
    assert errs[3] != errs[3]  # no device model, no error
    # no reference: the plain errors, of the prediction
    speed, errs = anchored_errors([10.0, 20.0], [13.0, 18.0], ref=None)
    assert speed == 1.0 and errs == pytest.approx([30.0, -10.0])


def test_demo_table_takes_errors_against_the_reference_row(capsys):
    from types import SimpleNamespace

    from tf_patch.demo import _print_table, _Row

    run = SimpleNamespace(cores_used=1.5)
    rows = [_Row("Pesto", 1.0, 20_000.0, run), _Row("Expert", 0.1, 30_000.0, run),
            _Row("m-etf (reference)", 0.1, 25_000.0, run), _Row("TF default", 0.0, 40_000.0, run),
            _Row("TF all cores *", 0.0, float("nan"), run)]
    timing = SimpleNamespace(step_us=[23_000.0, 27_000.0, 27_500.0, 46_200.0, 21_000.0], note=lambda: "test")
    _print_table(rows, timing, ref=2)
    out = capsys.readouterr().out
    lines = {ln.split("  ")[1].strip(): ln for ln in out.splitlines() if ln.startswith("  ") and "   " in ln}
    # speed now = 27.5 / 25 = 1.1: Pesto predicted 22.0 ms, measured 23.0 (+5 %)
    assert "22.000" in lines["Pesto"] and lines["Pesto"].split()[-2] == "+5%"
    assert lines["Expert"].split()[-2] == "-18%"  # 27.0 against 33.0
    assert lines["m-etf (reference)"].split()[-2] == "anchor"
    assert lines["TF default"].split()[-2] == "+5%"  # 46.2 against 44.0
    assert lines["TF all cores *"].split()[-2] == "-"
    assert "that x 1.100, m-etf (reference)'s measured" in out
    # without a reference the predictions are the profile's
    _print_table(rows[:2], SimpleNamespace(step_us=[23_000.0, 27_000.0], note=lambda: "test"), ref=None)
    out = capsys.readouterr().out
    assert "+15%" in out and "-10%" in out and "anchor" not in out and "that x" not in out
