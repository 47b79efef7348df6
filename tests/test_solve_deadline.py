"""pesto.solve keeps its word: one deadline, interrupts return the best plan,
deterministic mode repeats itself (issue 15)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import pesto
from benchmarks.generators import layered_dag
from pesto.deadline import CHECK_EVERY
from pesto.plan import Plan, check_plan

CLUSTER = pesto.v100x2_nvlink()

# Ctrl-C as in a terminal, however pytest was started (conftest.ctrl_c)
pytestmark = pytest.mark.usefixtures("ctrl_c")


def _same_plan(a: Plan, b: Plan) -> bool:
    return (a.placement == b.placement and {d: list(o) for d, o in a.order.items()} ==
            {d: list(o) for d, o in b.order.items()} and a.start == b.start and a.makespan == b.makespan
            and a.lower_bound == b.lower_bound and a.status == b.status)


def test_a_tiny_limit_skips_the_search_passes_and_still_returns_a_plan():
    g = layered_dag(2000, width=12, seed=3)
    plan = pesto.solve(g, cluster=CLUSTER, time_limit=0.05, workers=1)
    assert check_plan(g, CLUSTER, plan).ok
    skipped = {s.name for s in plan.log.passes if s.note.startswith("skipped: time limit")}
    assert {"exact", "lns", "local search"} <= skipped and plan.log.stopped == "time limit"


def test_sigint_during_a_solve_returns_the_best_plan_marked_interrupted():
    g = layered_dag(600, width=8, seed=4)
    timer = threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        plan = pesto.solve(g, cluster=CLUSTER, time_limit=600, workers=1, target_vertices=100)
    finally:
        timer.cancel()
    assert plan.status == "interrupted" and plan.log.stopped == "SIGINT"
    assert check_plan(g, CLUSTER, plan).ok
    assert any(s.note == "skipped: SIGINT" for s in plan.log.passes) or plan.log.pass_named("local search")
    # the handlers are back: a later Ctrl-C is an ordinary KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_deterministic_mode_gives_the_same_plan_twice():
    g = layered_dag(400, width=8, seed=5)
    a, b = (pesto.solve(g, cluster=CLUSTER, time_limit=3, seed=1, workers=2, target_vertices=60,
                        deterministic=True) for _ in range(2))
    assert a.log.deterministic and _same_plan(a, b)
    assert [s.name for s in a.log.passes] == [s.name for s in b.log.passes]


def test_cli_ctrl_c_writes_the_best_plan_and_exits_130(tmp_path):
    g = layered_dag(600, width=8, seed=6)
    gpath, ppath = tmp_path / "g.json", tmp_path / "p.json"
    g.to_json(str(gpath))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "pesto", "place", str(gpath), "--time-limit", "600",
                             "--target-vertices", "100", "-o", str(ppath)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    # wait until the heuristics pass has made plans (its "done" progress line), then interrupt
    deadline = time.monotonic() + 120
    line = ""
    while "heuristics: done" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT)" in err
    data = json.loads(ppath.read_text())
    assert data["status"] == "interrupted"
    assert check_plan(g, CLUSTER, Plan.from_dict(data)).ok


def test_the_paper_recipe_past_its_deadline_still_returns_a_heuristic_plan():
    # the exact pass is skipped once the deadline has passed (here: during the
    # heuristics); the expanded heuristics must then be the candidates
    g = layered_dag(300, width=8, seed=7)
    plan = pesto.solve(g, cluster=CLUSTER, time_limit=1e-4, workers=1, recipe="paper", target_vertices=60)
    assert check_plan(g, CLUSTER, plan).ok
    assert plan.log.pass_named("exact").note == "skipped: time limit" and plan.log.winner in pesto.api.HEURISTICS



CHILD = r"""
import json, os, signal, sys
import pesto
import solver.heuristics as H
from benchmarks.generators import layered_dag
from pesto.plan import check_plan
# SIGINT this process from inside m-ETF's loop, at its 100th pick, and count the picks after it
calls = {"n": 0, "after": 0}
first_start = H._first_start
def picking(*args):
    calls["n"] += 1
    if calls["n"] == 100:
        os.kill(os.getpid(), signal.SIGINT)
    elif calls["n"] > 100:
        calls["after"] += 1
    return first_start(*args)
H._first_start = picking
g, c = layered_dag(int(sys.argv[1]), width=16, seed=0), pesto.v100x2_nvlink()
plan = pesto.solve(g, cluster=c, time_limit=600, workers=1)
print(json.dumps({"status": plan.status, "stopped": plan.log.stopped, "skipped": dict(plan.log.skipped),
                  "winner": plan.log.winner, "valid": check_plan(g, c, plan).ok, "after": calls["after"]}))
"""


def test_sigint_inside_a_running_heuristic_stops_it_and_returns_the_first_plan():
    # the signal lands inside m-ETF's loop (m-TOPO, run first, has made its plan):
    # the loop must stop at its next deadline check, not run to its end
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    n = 6000
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["status"] == "interrupted" and res["stopped"] == "SIGINT" and res["valid"]
    assert res["skipped"]["m-etf"] == "Stopped: SIGINT"  # stopped inside its loop...
    assert res["after"] <= CHECK_EVERY < n  # ...within one check interval, not after n picks
    assert res["winner"] == "m-topo"
    assert all(v == "skipped: SIGINT" for k, v in res["skipped"].items() if k != "m-etf")


CHILD_TOPO = r"""
import json, os, signal, sys
import pesto
import solver.heuristics as H
from benchmarks.generators import layered_dag
# SIGINT this process from inside m-TOPO (the first heuristic, before any plan exists)
calls = {"n": 0, "after": 0}
real = H.Deadline.check
def check(self):
    calls["n"] += 1
    if calls["n"] == 2:
        os.kill(os.getpid(), signal.SIGINT)
    elif calls["n"] > 2:
        calls["after"] += 1
    return real(self)
H.Deadline.check = check
g, c = layered_dag(int(sys.argv[1]), width=16, seed=0), pesto.v100x2_nvlink()
try:
    pesto.solve(g, cluster=c, time_limit=600, workers=1)
    print(json.dumps({"raised": None}))
except KeyboardInterrupt as exc:
    print(json.dumps({"raised": str(exc), "after": calls["after"]}))
"""


def test_sigint_inside_the_first_heuristic_stops_it_and_raises_keyboard_interrupt():
    # m-TOPO runs to its end whatever the clock says, but Ctrl-C stops it at
    # its next check; with no plan yet the solve raises KeyboardInterrupt
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", CHILD_TOPO, "6000"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["raised"] == "SIGINT before any plan existed"
    assert res["after"] <= 1


def test_a_deterministic_slice_model_share_does_not_hang_on_the_wall_clock_pace(monkeypatch):
    """The slice model's share kept the recipe's first plan's predicted wall time back, in
    deterministic mode too: Transformer-6's ``slice M=8`` came out 72587.5 or 72419.1 µs by load."""
    import solver.parallel.search as ss
    from mb_strategies import layered_step
    from pesto.deadline import Deadline
    from solver.options import SolveOptions

    g, cluster = layered_step(4, act=100_000, t=1000.0), pesto.cluster.gpus(2)
    search = ss._Search(g, cluster, SolveOptions(micro_batches=2, batch_size=8, deterministic=True),
                        Deadline(30, deterministic=True))
    s = ss._Screened(ss.split_step(search.marked, 2), [], float("inf"))
    asked = []
    monkeypatch.setattr(ss, "solve_slices", lambda *a, time_limit, **k: asked.append(time_limit) or
                        (_ for _ in ()).throw(pesto.errors.PestoError("stop")))
    for pace in (0.0, 9.0):   # 9 s of a 10 s grant: the share would drop below SLICE_SHARE of it
        monkeypatch.setattr(search.pace, "predict", lambda ops, sims, pace=pace: pace)
        search.slice_start(s, 2, Deadline(10, deterministic=True))
    assert len(asked) == 2 and asked[0] == asked[1]
