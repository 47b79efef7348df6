"""The engine's replay pinned down: golden results of 20 seeded random graphs
(recorded from the pure-Python engine before it was compiled, so the compiled
loop is proven to give identical times, orders, transfers and tie-breaks) and
hand-checkable invariants on a few hundred more.

Regenerate the golden file only on purpose (a behaviour change):
``python tests/test_engine_golden.py --record``.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.generators import layered_dag, transformer_like
from pesto.cluster import Cluster, Device, Route, gpus, two_hosts, v100x4_pcie
from pesto.engine import replay
from pesto.errors import InvalidPlanError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.problem import Problem

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "engine_golden.json.gz")
COMBOS = [(policy, links) for policy in ("order", "fifo", "priority") for links in ("fcfs", "free")]


def _bus() -> Cluster:
    """3 GPUs and a CPU whose every transfer holds one shared bus (integer
    costs: many equal times, so tie-breaks matter)."""
    names = ["/GPU:0", "/GPU:1", "/GPU:2", "/CPU:0"]
    devs = [Device(nm, "CPU" if "CPU" in nm else "GPU") for nm in names]
    routes = [Route(a, b, ("bus",) if "CPU" not in a + b else ("bus", f"host:{b}"), 1.0, 0.01)
              for a in names for b in names if a != b]
    return Cluster(devs, routes, name="bus")


def _cluster(rnd: random.Random) -> Cluster:
    which = rnd.randrange(4)
    if which == 0:
        return gpus(3, beta=(1.0, 0.01), with_cpu=True, cpu_beta=(2.0, 0.02))
    if which == 1:
        return v100x4_pcie(with_cpu=True)
    if which == 2:
        return two_hosts(with_cpu=True)
    return _bus()


def random_graph(rnd: random.Random, n: int) -> OpGraph:
    """Integer durations (many ties), GPU/CPU/either ops, 1-3 tensors per op
    (some of 0 bytes), tensors shared by several consumers, control edges."""
    ops = []
    for i in range(n):
        t = float(rnd.randint(0, 10))
        r = rnd.random()
        compute = {"CPU": t} if r < 0.1 else {"GPU": t, "CPU": 2 * t} if r < 0.3 else {"GPU": t}
        ops.append(compute)
    produced = {i: [Tensor(f"o{i}:{k}", f"o{i}", rnd.choice([0, 100, 100, 300, 1000]))
                    for k in range(rnd.choice([1, 1, 2, 3]))] for i in range(n)}
    p = rnd.choice([0.05, 0.1, 0.2])
    edges = []
    for j in range(n):
        for i in range(max(0, j - 15), j):
            if rnd.random() < p:
                if rnd.random() < 0.1:
                    edges.append(Edge(f"o{i}", f"o{j}", ()))
                else:
                    outs = produced[i]
                    edges.append(Edge(f"o{i}", f"o{j}", tuple(
                        t.name for t in rnd.sample(outs, rnd.randint(1, len(outs))))))
    tensors = [t for i in range(n) for t in produced[i]]
    op_list = [Op(f"o{i}", ops[i], output_bytes=sum(t.bytes for t in produced[i])) for i in range(n)]
    return OpGraph(op_list, edges, tensors, name="golden")


def case(seed: int, n_lo: int = 20, n_hi: int = 80):
    """(problem, placement, order, priority) of one seeded random case."""
    rnd = random.Random(seed)
    g = random_graph(rnd, rnd.randint(n_lo, n_hi))
    c = _cluster(rnd)
    prob = Problem.of(g, c)
    dev = [rnd.choice(prob.allowed[i]) for i in range(prob.n)]
    order: list[list[int]] = [[] for _ in range(prob.nd)]
    for i in _random_topo(prob, rnd):
        order[dev[i]].append(i)
    priority = [float(rnd.randint(0, 5)) for _ in range(prob.n)]
    return prob, dev, order, priority


def _random_topo(prob: Problem, rnd: random.Random) -> list[int]:
    indeg = [len(p) for p in prob.pred]
    ready = [i for i in range(prob.n) if indeg[i] == 0]
    out = []
    while ready:
        i = ready.pop(rnd.randrange(len(ready)))
        out.append(i)
        for j in prob.succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return out


def run_case(prob, dev, order, priority, policy, links):
    kw = {"order": order} if policy == "order" else {"priority": priority} if policy == "priority" else {}
    return replay(prob, dev, policy=policy, links=links, **kw)


def as_json(run) -> dict:
    return {"start": list(run.start), "finish": list(run.finish), "ran": [list(r) for r in run.ran],
            "xfers": [[i, t, b, d, s, f, list(js)] for i, t, b, d, s, f, js in run.xfers],
            "finished": list(run.finished), "makespan": run.makespan}


def record() -> None:
    out = {}
    for seed in range(20):
        prob, dev, order, priority = case(seed)
        for policy, links in COMBOS:
            out[f"{seed}/{policy}/{links}"] = as_json(run_case(prob, dev, order, priority, policy, links))
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with gzip.open(GOLDEN, "wt") as f:
        json.dump(out, f, separators=(",", ":"))


@pytest.fixture(scope="module")
def golden():
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("seed", range(20))
def test_replay_matches_golden(golden, seed):
    prob, dev, order, priority = case(seed)
    for policy, links in COMBOS:
        got = as_json(run_case(prob, dev, order, priority, policy, links))
        assert got == golden[f"{seed}/{policy}/{links}"], (seed, policy, links)


def _big(name: str):
    """A few-thousand-op generator graph on two hosts (shared NICs), seeded
    random placement, order = a random topological order, priority = placed rank."""
    g = layered_dag(3000, width=16, seed=1) if name == "layered" else transformer_like(8)
    prob = Problem.of(g, two_hosts())
    rnd = random.Random(7)
    dev = [rnd.choice(prob.allowed[i]) for i in range(prob.n)]
    order: list[list[int]] = [[] for _ in range(prob.nd)]
    for i in _random_topo(prob, rnd):
        order[dev[i]].append(i)
    return prob, dev, order, prob.placed_bottom_levels(dev)


def digest(run) -> str:
    return hashlib.sha256(json.dumps(as_json(run)).encode()).hexdigest()[:16]


# sha256 of the results recorded from the pure-Python engine
BIG = {
    "layered": {"fifo/fcfs": "93364310073d4a4c", "fifo/free": "fc1e3960cd1c0a39",
                "order/fcfs": "07bff49838ef6ab7", "order/free": "84bb0899a775b93e",
                "priority/fcfs": "6b8a26f0c0fa052a", "priority/free": "490eef1bd6194151"},
    "transformer": {"fifo/fcfs": "41fbec2835b2952a", "fifo/free": "d4a3935340072775",
                    "order/fcfs": "483fdde389db0f06", "order/free": "41857e3ce9d85144",
                    "priority/fcfs": "18197b71d78acd14", "priority/free": "db07acbc3b7cc7b6"},
}


@pytest.mark.parametrize("name", ["layered", "transformer"])
def test_replay_matches_golden_digest_on_bigger_graphs(name):
    prob, dev, order, priority = _big(name)
    got = {f"{policy}/{links}": digest(run_case(prob, dev, order, priority, policy, links))
           for policy, links in COMBOS}
    assert got == BIG[name]


def _ready_time(prob, dev, run, j) -> float:
    """When op ``j``'s last input is on its device (from the run's transfers)."""
    arrive = {}
    for i, t, b, d, s, f, js in run.xfers:
        for k in js:
            arrive[k] = max(arrive.get(k, 0.0), f)
    r = arrive.get(j, 0.0)
    for q in prob.pred[j]:
        r = max(r, run.finish[q])
    return r


@pytest.mark.parametrize("seed", range(100, 400))
def test_replay_invariants(seed):
    prob, dev, order, priority = case(seed, 5, 40)
    policy, links = COMBOS[seed % len(COMBOS)]
    run = run_case(prob, dev, order, priority, policy, links)
    n = prob.n
    assert sorted(run.finished) == list(range(n)) and sorted(i for r in run.ran for i in r) == list(range(n))
    for d, seq in enumerate(run.ran):
        assert all(dev[i] == d for i in seq)
        prev = 0.0
        for i in seq:
            assert run.finish[i] == run.start[i] + prob.dur[i][d]
            ready = _ready_time(prob, dev, run, i)
            # no device idles while the op it runs next is ready (order: the next in line)
            assert run.start[i] == max(prev, ready)
            prev = run.finish[i]
    if policy == "order":
        assert run.ran == order
    # one transfer per (tensor, remote device with consumers), after the producer, of the route's time
    want = set()
    for t, (_, i, b, cons) in enumerate(prob.tensors):
        if b > 0:
            want |= {(t, dev[j]) for j in cons if dev[j] != dev[i]}
    assert sorted((t, d) for _, t, _, d, _, _, _ in run.xfers) == sorted(want)
    per_link: dict = {}
    for i, t, b, d, s, f, js in run.xfers:
        a = dev[i]
        assert s >= run.finish[i] and f == s + (prob.beta0[a][d] + prob.beta1[a][d] * b)
        if links == "free":
            assert s == run.finish[i]
        for l in prob.route_links[a][d] if links == "fcfs" else ():
            per_link.setdefault(l, []).append((s, f))
    for spans in per_link.values():
        spans.sort()
        assert all(f0 <= s1 for (_, f0), (s1, _) in zip(spans, spans[1:]))
    assert run.makespan == max([*run.finish, *(x[5] for x in run.xfers)], default=0.0)


if __name__ == "__main__" and "--record" in sys.argv:
    record()


# -- the compiled engine's surroundings ------------------------------------------------
def test_placed_ranks_is_the_dag_longest_path():
    from pesto.dag import bottom_levels
    from pesto.kernels import placed_ranks
    for seed in range(30):
        prob, dev, _, _ = case(seed)
        nb = {(i, j): b for i in range(prob.n) for j, b in prob.outs[i]}

        def edge(i, j):
            a, b = dev[i], dev[j]
            return prob.beta0[a][b] + prob.beta1[a][b] * nb[i, j] if a != b and nb[i, j] > 0 else 0.0

        want = bottom_levels(prob.succ, [prob.dur[i][dev[i]] for i in range(prob.n)], edge=edge,
                             order=prob.topo)
        assert placed_ranks(prob, dev).tolist() == want == prob.placed_bottom_levels(dev)


def test_run_lists_and_arrays_agree():
    prob, dev, order, priority = case(3)
    run = replay(prob, dev, policy="priority", priority=priority)
    assert isinstance(run.start, list) and all(type(x) is float for x in run.start)
    assert run.start == run.start_array.tolist() and run.finish == run.finish_array.tolist()
    assert type(run.makespan) is float
    assert all(type(j) is int for r in run.ran for j in r)
    # a numpy placement gives the same run as a list
    assert as_json(replay(prob, np.array(dev), policy="order", order=order)) == \
        as_json(replay(prob, dev, policy="order", order=order))


def test_replay_rejects_bad_orders_and_placements():
    prob, dev, order, _ = case(5)
    moved = [list(q) for q in order]
    d0 = next(d for d, q in enumerate(moved) if q)
    d1 = (d0 + 1) % prob.nd
    moved[d1].append(moved[d0].pop())
    with pytest.raises(InvalidPlanError, match="another device"):
        replay(prob, dev, policy="order", order=moved)
    twice = [list(q) for q in order]
    twice[d0][-1] = twice[d0][0]  # one op twice, another missing
    with pytest.raises(InvalidPlanError, match="exactly once"):
        replay(prob, dev, policy="order", order=twice)
    with pytest.raises(ValueError, match="devices for"):
        replay(prob, dev[:-1])
    with pytest.raises(ValueError, match="outside"):
        replay(prob, [prob.nd] * prob.n)
    with pytest.raises(ValueError, match="values for"):
        replay(prob, dev, policy="priority", priority=[0.0])
    # a deadlocking order names the heads it waits on
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 0)])
    p = Problem.of(g, gpus(1))
    with pytest.raises(InvalidPlanError, match="deadlocks.*b"):
        replay(p, [0, 0], policy="order", order=[[1, 0]])


def test_disabled_jit_runs_the_same_engine_as_plain_python():
    """``NUMBA_DISABLE_JIT=1`` (for a debugger) runs the one engine as Python:
    same results as compiled."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, json; sys.path.insert(0, 'tests'); import test_engine_golden as t\n"
            "prob, dev, order, prio = t.case(7)\n"
            "print(json.dumps([t.as_json(t.run_case(prob, dev, order, prio, p, l)) for p, l in t.COMBOS]))\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                         check=True).stdout
    prob, dev, order, prio = case(7)
    assert json.loads(out) == [as_json(run_case(prob, dev, order, prio, p, l)) for p, l in COMBOS]


@pytest.mark.parametrize("seed", range(0, 20, 3))
def test_python_twins_match_golden(golden, seed, monkeypatch):
    """The interpreted twins small problems run before anything is compiled
    give the golden results too."""
    from pesto import engine, kernels
    monkeypatch.setattr(engine, "kernel", lambda fn, n: kernels.interpreted(fn))
    monkeypatch.setattr(kernels, "kernel", lambda fn, n: kernels.interpreted(fn))
    prob, dev, order, priority = case(seed)
    for policy, links in COMBOS:
        got = as_json(run_case(prob, dev, order, priority, policy, links))
        assert got == golden[f"{seed}/{policy}/{links}"], (seed, policy, links)


def test_small_solve_on_a_fresh_install_compiles_nothing(tmp_path):
    """With an empty numba cache, solving a small graph runs the Python twins
    (no compile inside its time limit); ``warm_up`` then fills the cache."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import pesto\nfrom pesto import engine, kernels\n"
            "g = pesto.OpGraph.from_edges({'a': 2, 'b': 3, 'c': 4}, [('a', 'b', 9), ('a', 'c', 9)])\n"
            "p = pesto.solve(g, time_limit=5, workers=1)\n"
            "print(p.status, len(engine._run.signatures), len(kernels._placed_ranks.signatures))\n"
            "engine.warm_up()\n"
            "print(len(engine._run.signatures) > 0, kernels._cached_on_disk(engine._run))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    assert out[0] == "optimal 0 0"
    assert out[1] == "True True"
