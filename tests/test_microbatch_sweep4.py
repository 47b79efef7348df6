"""The fourth hostile sweep's micro-batch cases (``M_*``, issue 29 items 3 and 4): one
search under one clock, a fixed M honoured, replicas x M dividing the batch,
``-o`` never overwriting an input. Each test asserts the exit code and the
message naming the culprit; the signal tests bound the wall time after the
signal generously (the limit is 60 s: a swallowed signal runs to it)."""
from __future__ import annotations

import gzip
import hashlib
import signal
import threading
import time

import pytest

import pesto
from mb_strategies import layered_step
from pesto.cli import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK
from pesto.errors import MicroBatchError
from test_cli_sweep import pesto_process, run


@pytest.fixture(scope="module")
def small():
    """A 4-layer step whose layers dwarf their activations (pipelines pay off)."""
    return layered_step(4, act=100_000, t=1000.0)


@pytest.fixture
def small_path(tmp_path, small):
    path = tmp_path / "mb_small.json"
    small.to_json(str(path))
    return path


@pytest.fixture
def mid_path(tmp_path):
    """A 100-layer step (601 ops): each phase of the search takes a while."""
    path = tmp_path / "mb_mid.json"
    layered_step(100, act=100_000, t=1000.0).to_json(str(path))
    return path


# == signals in every phase (M_sig_*) ================================================
@pytest.mark.slow
@pytest.mark.parametrize("phase, line", [
    ("screening", "data-parallel: step"),     # M_sig_auto_screen_*
    ("slice model", "slice model M="),        # M_sig_auto_slice_* (was SIGABRT)
    ("exact", "exact M=1: start"),            # M_sig_auto_exact1_* (was swallowed)
])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_in_any_phase_writes_the_best_plan(tmp_path, mid_path, phase, line, sig):
    _signalled(tmp_path, mid_path, phase, line, sig, "auto")


@pytest.mark.slow
@pytest.mark.parametrize("phase, line", [("screening", "gpipe M=4: step"), ("slice model", "slice model M=4: start"),
                                         ("recipe", "exact M=4: start")])   # M_sig_m4_*
def test_a_signal_with_a_fixed_m_writes_the_best_plan(tmp_path, mid_path, phase, line):
    _signalled(tmp_path, mid_path, phase, line, signal.SIGINT, 4)


def _signalled(tmp_path, mid_path, phase, line, sig, m):
    """Send ``sig`` when ``line`` shows (a plan exists by then: before the first
    plan, a stop exits 130 with nothing written, as the plain solve does)."""
    out, sent = tmp_path / "p.json", []
    t = time.perf_counter()
    rc, _, err = pesto_process("place", mid_path, "--micro-batches", m, "--batch-size", 16, "--time-limit", 60,
                               "-o", out, signal_on=line, sig=sig, sent=sent)
    end = time.perf_counter()
    assert rc == EXIT_INTERRUPTED, err
    assert f"interrupted ({signal.Signals(sig).name})" in err
    assert "terminate called" not in err
    assert pesto.Plan.from_json(str(out)).status == "interrupted"
    # it stops soon after the signal, well before its 60 s limit (a swallowed signal runs on)
    assert end - sent[0] < 15 and end - t < 50, f"{phase}: {end - sent[0]:.1f} s after the signal, {end - t:.1f} s in all"


def test_an_interrupt_in_the_api_returns_the_best_plan(small):
    # what the signal handler does: the deadline interrupted from another thread
    import solver.parallel.search as ss
    real = ss._Search.screen

    def screen(self, m):
        if m == 2:
            self.deadline.interrupt("SIGINT")
        return real(self, m)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ss._Search, "screen", screen)
        t = time.perf_counter()
        r = pesto.solve_step(small, cluster=pesto.v100x2_nvlink(), micro_batches="auto", batch_size=8,
                             time_limit=60, workers=1)
    assert time.perf_counter() - t < 20
    assert r.plan.status == "interrupted" and r.plan.log.stopped == "SIGINT"
    pesto.check_plan(r.graph, pesto.v100x2_nvlink(), r.plan).raise_if_invalid()


# == the time limit (M_500_*, M_tl1_*, M_scale_*) =====================================
def test_five_hundred_gpus_keep_the_limit_and_name_the_skipped(small):
    # M_500_auto_cli: the ring all-reduce of 500 replicas was built unbounded (75 s, 3.7 GB)
    t = time.perf_counter()
    r = pesto.solve_step(small, gpus=500, micro_batches="auto", batch_size=1000, time_limit=3, workers=1)
    assert time.perf_counter() - t < 3 * 3 + 2   # the README's tolerance (2 s), 3x for a loaded machine (was 75 s)
    assert "all-reduce rings" in r.plan.log.skipped["data-parallel"]


def test_a_one_second_limit_holds(mid_path):
    # M_tl1_*: 3.5 s for a 1 s limit (the first data-parallel plan, fixed-M screening, the bound untimed)
    g = pesto.OpGraph.from_json(str(mid_path))
    for m in ("auto", 4):
        t = time.perf_counter()
        pesto.solve_step(g, gpus=2, micro_batches=m, batch_size=16, time_limit=1, workers=1)
        assert time.perf_counter() - t < 1 + 2 + 2, m


# == sizes (M_cli_m1e6) ===============================================================
def test_a_million_micro_batches_is_refused_before_splitting(capsys, small_path, small):
    t = time.perf_counter()
    rc, _, err = run(capsys, "place", small_path, "--micro-batches", 1000000, "--time-limit", 5)
    assert rc == EXIT_INPUT and "more than 2000000" in err and "M=1000000" in err
    with pytest.raises(MicroBatchError, match="split step would have about"):
        pesto.solve_step(small, micro_batches=1_000_000, time_limit=5)
    assert time.perf_counter() - t < 10


# == the batch (M_cli_auto_b1, M_cli_gpipe_m3_b32, M_cli_dp_m4_b30) ==================
@pytest.mark.parametrize("batch", [1, 17])
def test_replicas_times_m_divide_the_batch(small, batch):
    r = pesto.solve_step(small, cluster=pesto.v100x2_nvlink(), micro_batches="auto", batch_size=batch,
                         time_limit=2, workers=1)
    assert batch % (r.replicas * r.micro_batches) == 0
    assert "not a multiple of 2 replicas x 1" in r.plan.log.skipped["data-parallel"]


@pytest.mark.parametrize("placer, m, batch, says", [
    ("gpipe", 3, 32, "batch_size=32 is not a multiple of 1 replicas x 3"),
    ("data-parallel", 4, 30, "batch_size=30 is not a multiple of 2 replicas x 4"),
])
def test_baseline_placers_check_the_batch(capsys, small_path, placer, m, batch, says):
    rc, _, err = run(capsys, "place", small_path, "--placer", placer, "--micro-batches", m, "--batch-size", batch)
    assert rc == EXIT_INPUT and says in err


# == determinism (D4_det5, M_det_api_twice) ===========================================
def test_deterministic_micro_batch_files_are_identical(tmp_path, capsys, small_path):
    outs = [tmp_path / f"p{k}.json" for k in range(2)]
    for out in outs:
        rc, _, err = run(capsys, "place", small_path, "--micro-batches", "auto", "--batch-size", 4,
                         "--deterministic", "--time-limit", 1, "-o", out)
        assert rc == EXIT_OK, err
    assert outs[0].read_bytes() == outs[1].read_bytes()


def test_a_deterministic_solve_in_a_thread_equals_the_sequential_one(small):
    def solve():
        return pesto.solve_step(small, cluster=pesto.v100x2_nvlink(), micro_batches="auto", batch_size=4,
                                time_limit=1, workers=1, deterministic=True)
    first = solve()
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", solve()))
    th.start()
    th.join()
    second = box["r"]
    assert dict(first.plan.placement) == dict(second.plan.placement)
    assert first.plan.makespan == second.plan.makespan and first.steps == second.steps


# == a fixed M is honoured (M_api_fixed_m4) ===========================================
def test_a_fixed_m_is_never_replaced_by_data_parallelism(capsys, tmp_path, small_path):
    # only M=1 data parallelism wins on this step (test_microbatch_errors); M=4 must still be placed
    g = layered_step(4)
    r = pesto.solve_step(g, cluster=pesto.v100x2_nvlink(), micro_batches=4, time_limit=2, workers=1)
    assert r.micro_batches == 4 and "data-parallel" not in r.steps
    out = tmp_path / "p.json"
    rc, text, err = run(capsys, "place", small_path, "--micro-batches", 4, "--time-limit", 2, "-o", out)
    assert rc == EXIT_OK, err
    assert "4 micro-batch(es)" in text


# == -o never overwrites an input (M_o_clobbers_input_graph) ==========================
def test_the_derived_graph_path_never_overwrites_the_input(tmp_path, capsys, small):
    gpath = tmp_path / "model.graph.json.gz"
    gpath.write_bytes(gzip.compress(small.to_json().encode()))
    before = hashlib.sha1(gpath.read_bytes()).hexdigest()
    t = time.perf_counter()
    rc, _, err = run(capsys, "place", gpath, "--micro-batches", 2, "--time-limit", 5, "-o", tmp_path / "model.json")
    assert rc == EXIT_INPUT and f"{gpath}, which is the input graph" in err
    assert time.perf_counter() - t < 5   # before solving
    assert hashlib.sha1(gpath.read_bytes()).hexdigest() == before


# == a result that carries what it solved (issue 29 item 4) ===========================
@pytest.mark.parametrize("m", [1, 2])
def test_check_and_simulate_take_a_solved_result(small, m):
    c = pesto.v100x2_nvlink()
    r = pesto.solve_step(small, cluster=c, micro_batches=m, time_limit=1, workers=1)
    assert type(r).__name__ == "Solved" and r.strategy.micro_batches == m
    assert (r.graph is small) == (m == 1)
    assert pesto.check_plan(r, c).ok
    assert pesto.simulate(r, c).makespan == pytest.approx(r.plan.makespan)
    with pytest.raises(TypeError, match="give a plan"):
        pesto.check_plan(small, c)


# == a parallelism kind is one module and one table entry (issue 29 item 2) ============
def test_a_toy_kind_is_one_module_and_one_table_entry(small, monkeypatch):
    import toy_accumulation
    from solver.parallel.kinds import KINDS
    monkeypatch.setitem(KINDS, "accumulation", toy_accumulation.KIND)
    c = pesto.v100x2_nvlink()
    r = pesto.solve_step(small, cluster=c, micro_batches=2, time_limit=2, workers=1)
    assert "accumulation M=2" in r.steps
    assert r.plan.makespan <= r.steps["accumulation M=2"]
    pesto.check_plan(r, c).raise_if_invalid()


def test_a_hint_unused_by_a_fixed_m_is_said(small):
    # M_api_hint_with_mb: a plan of the un-split step with micro_batches=2 was silently ignored
    c = pesto.v100x2_nvlink()
    hint = pesto.solve(small, cluster=c, time_limit=1, workers=1)
    plan = pesto.solve(small, cluster=c, micro_batches=2, hint=hint, time_limit=1, workers=1)
    assert "starts nothing" in plan.log.skipped["hint"]
