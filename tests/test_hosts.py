"""Across hosts: host-cluster presets, NIC links in the model, and a local
2-server TensorFlow cluster (loss equality, trace, the three faults).

Every server is stopped in a ``finally`` (fixtures and ``LocalServers``'s
context manager), and each test checks that no server process is left.
"""
import os
import socket
import threading
import time

import pytest

import pesto
from pesto.cluster import NETWORKS, Cluster, Network, hosts, preset, task_device, two_hosts
from pesto.errors import InvalidClusterError, InvalidPlanError
from pesto.graph import OpGraph
from pesto.problem import Problem
from pesto.simulate import simulate
from solver import get_placer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# -- clusters of hosts -------------------------------------------------------------
def test_hosts_preset_shape_and_nic_sharing():
    c = hosts(2, gpus_per_host=2, net="25gbe")
    assert c.names == [task_device(h, "GPU", k) for h in range(2) for k in range(2)]
    assert c.names[3] == "/job:worker/replica:0/task:1/device:GPU:1"
    h0, h1 = c.names[:2], c.names[2:]
    # every cross-host route holds the sender's NIC out and the receiver's NIC in
    assert {c.route(a, b).links for a in h0 for b in h1} == {("nic_out:0", "nic_in:1")}
    assert {c.route(b, a).links for a in h0 for b in h1} == {("nic_out:1", "nic_in:0")}
    assert c.route(h0[0], h0[1]).links == (f"nvlink:{h0[0]}>{h0[1]}",)
    r = c.route(h0[0], h1[0])
    assert (r.beta0, r.beta1) == (NETWORKS["25gbe"].beta0, NETWORKS["25gbe"].beta1)
    # 1 MB at 25 Gb/s is 320 µs, plus 25 µs latency
    assert c.transfer_time(h0[0], h1[0], 1_000_000) == pytest.approx(345.0)
    assert c.identical_groups() == [h0, h1]


def test_network_fits_are_named_and_ordered():
    assert set(NETWORKS) >= {"25gbe", "100gbe", "ib_hdr"}
    assert [NETWORKS[n].gbit_s for n in ("10gbe", "25gbe", "100gbe", "ib_hdr")] == \
        pytest.approx([10, 25, 100, 200])
    assert all(n.source for n in NETWORKS.values())
    lat = [NETWORKS[n].beta0 for n in ("25gbe", "100gbe", "ib_hdr")]
    assert lat == sorted(lat, reverse=True)
    own = Network("mine", 5.0, 1e-5, "measured here")
    c = hosts(3, 1, own)
    assert c.route(c.names[0], c.names[2]).beta0 == 5.0 and c.name == "hosts3x1_mine"
    with pytest.raises(InvalidClusterError, match="unknown network 'wifi'"):
        hosts(2, 2, "wifi")
    with pytest.raises(InvalidClusterError, match="at least one"):
        hosts(0, 2)
    with pytest.raises(InvalidClusterError, match="intra-host link"):
        hosts(2, 2, intra="carrier pigeon")


def test_hosts_variants_and_json_round_trip(tmp_path):
    for c in (hosts(4, 2, "ib_hdr", intra="pcie", with_cpu=True), hosts(2, 2, "100gbe"),
              hosts(2, 3, "10gbe", kind="CPU", intra=(20.0, 1e-4), memory=1 << 30), two_hosts(with_cpu=True)):
        path = tmp_path / f"{c.name}.json"
        c.to_json(str(path))
        back = Cluster.from_json(str(path))
        assert back == c and back.links == c.links and preset(str(path)) == c
    c = hosts(4, 2, "ib_hdr", intra="pcie", with_cpu=True)
    cpu1 = task_device(1, "CPU", 0)
    assert c.route(cpu1, c.names[0]).links == ("nic_out:1", "nic_in:0")
    assert c.route(cpu1, task_device(1, "GPU", 0)).links == (f"pcie:{cpu1}>{task_device(1, 'GPU', 0)}",)
    assert set(c.route(c.names[0], c.names[1]).links) == {f"up:{c.names[0]}", f"down:{c.names[1]}"}
    assert preset("hosts4x2_100gbe") == hosts(4, 2, "100gbe")
    with pytest.raises(InvalidClusterError, match="hostsNxG_NET"):
        preset("hosts2x2")
    with pytest.raises(InvalidClusterError, match="kind"):
        hosts(2, 2, kind="TPU")
    # two_hosts keeps its short names and the 10 GbE fit
    t = two_hosts()
    assert t.names[2] == "/job:worker/task:1/device:GPU:0" and t.route(t.names[0], t.names[2]).beta0 == 30.0


def _fan_out(n_out=2, nbytes=4_000_000):
    """a -> b0..b(n-1): one tensor each, so a's host sends n transfers at once."""
    work = {"a": 10.0, **{f"b{i}": 10.0 for i in range(n_out)}}
    return OpGraph.from_edges(work, [("a", f"b{i}", nbytes) for i in range(n_out)])


def test_problem_and_simulator_route_through_the_nics():
    c = hosts(2, 2, "25gbe")
    prob = Problem.of(_fan_out(), c)
    link = {name: k for k, name in enumerate(c.links)}
    a, b = c.index[c.names[0]], c.index[c.names[2]]
    assert prob.route_links[a][b] == (link["nic_out:0"], link["nic_in:1"])
    assert prob.links[a][b] == prob.route_links[a][b]
    # two 4 MB tensors from host 0 to the two GPUs of host 1 share NIC out 0: the
    # second waits for the first, which it would not with a NIC per GPU
    g = _fan_out()
    place = {"a": c.names[0], "b0": c.names[2], "b1": c.names[3]}
    one = c.transfer_time(c.names[0], c.names[2], 4_000_000)
    shared = simulate(g, c, place)
    free = simulate(g, c.with_contention_free(), place)
    assert free.makespan == pytest.approx(10 + one + 10)
    assert shared.makespan == pytest.approx(10 + 2 * one + 10)
    nic = shared.busy()["nic_out:0"] * shared.makespan
    assert nic == pytest.approx(2 * one)


def test_solver_keeps_transfers_inside_a_host_on_a_slow_network():
    """Two chains joined at the end: on a 10 GbE network the solver keeps the
    chains' heavy tensors off the NIC (one host), on InfiniBand it may cross."""
    work = {f"{c}{i}": 100.0 for c in "xy" for i in range(6)}
    work["join"] = 1.0
    edges = [(f"{c}{i}", f"{c}{i + 1}", 50_000_000) for c in "xy" for i in range(5)]
    edges += [("x5", "join", 50_000_000), ("y5", "join", 50_000_000)]
    g = OpGraph.from_edges(work, edges)
    slow = hosts(2, 2, "10gbe")
    plan = pesto.solve(g, cluster=slow, time_limit=5, workers=1, seed=0)
    tasks = {d.split("/device:")[0] for d in plan.placement.values()}
    assert len(tasks) == 1
    assert simulate(g, slow, plan).makespan <= simulate(g, slow, {o: slow.names[0] for o in g.names}).makespan


def test_bench_hosts_counts_hosts_and_nic_bytes():
    from benchmarks.bench_hosts import measure, network_lines

    c = hosts(2, 2, "25gbe")
    g = _fan_out()
    m = measure(g, c, {"a": c.names[0], "b0": c.names[1], "b1": c.names[3]}, None)
    assert m["hosts_used"] == 2 and m["ops_per_host"] == "2/1"
    assert m["nic_mb"] == pytest.approx(4.0)  # only b1's tensor crosses hosts
    assert m["step_ms"] == pytest.approx(simulate(g, c, {"a": c.names[0], "b0": c.names[1],
                                                         "b1": c.names[3]}).makespan / 1000)
    rows = [{"graph": "g", "cluster": "2x2", "net": net, "placer": "pesto", **m} for net in ("25gbe", "ib_hdr")]
    (line,) = network_lines(rows)
    assert line.startswith("- g on 2x2: 25gbe: 2 host(s) used (ops per host 2/1), 4.0 MB")


# -- a local cluster of tf.distribute.Servers ----------------------------------------
try:
    import tensorflow as tf

    import tf_patch
    from tf_patch.distributed import (LocalServers, PortInUseError, ServerStartError, WorkerLostError,
                                      free_ports, run_on_servers, run_step_on_servers, single_process_losses,
                                      task_plan)
    from tf_patch.extract import extract
    from tf_patch.workflow import run_placed
    from tf_patch.zoo import build_model
except ImportError:  # without TensorFlow the cluster tests above still run
    tf = None

needs_tf = pytest.mark.skipif(tf is None, reason="needs TensorFlow")


def _build():
    return build_model("rnnlm", "small", layers=1, steps=3, units=32, batch=8, vocab=200)


def _all_stopped(servers):
    return all(p.poll() is not None for p in servers.procs)


@pytest.fixture(scope="module")
def servers():
    s = LocalServers(2, 2, start_timeout=120, op_timeout=60)
    try:
        yield s.start()
    finally:
        s.close()
    assert _all_stopped(s)


@pytest.fixture(scope="module")
def plan():
    """A plan of the small RNNLM on 2 hosts x 2 logical CPU devices, over both tasks."""
    m = _build()
    g = extract(m.graph, m.fetches, kind="CPU", default_cost=10.0, kinds_fn=lambda t, k: frozenset({k}),
                on_unknown="ignore")
    c = hosts(2, 2, "25gbe", kind="CPU", intra=(20.0, 1e-4), memory=1 << 30)
    p = get_placer("m-etf")(g, c)
    assert len({d.split("/device:")[0] for d in p.placement.values()}) == 2
    return p


@pytest.mark.tf
@needs_tf
def test_losses_equal_single_process_and_nothing_off_plan(servers, plan):
    res = run_on_servers(_build, plan, servers, steps=4, timed=2, trace=True)
    single = single_process_losses(_build, 4, servers.kind)
    assert res.losses == pytest.approx(single, rel=1e-6, abs=1e-7)
    if not tf.config.list_physical_devices("GPU"):  # then run_placed's default device is this CPU too
        assert single == pytest.approx(run_placed(_build, None, n_devices=1, steps=4, timed=0).losses, rel=1e-6)
    tr = res.trace
    assert tr["misplaced"] == [] and tr["order_violations"] == []
    assert tr["traced"] > 0.9 * len(plan.placement) and tr["checked_edges"] > 0
    assert set(tr["ops_per_device"]) == set(servers.devices)  # all 2 x 2 devices ran planned ops
    assert res.applied.cross_task  # the training op's group waits on updates of both tasks
    assert f"{len(res.applied.cross_task)} control edges cross tasks" in res.applied.note


@pytest.mark.tf
@needs_tf
def test_keras_step_on_servers_matches_local_run(servers):
    import numpy as np

    def step():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(3)])
        x, y = np.random.RandomState(0).rand(16, 4).astype("float32"), np.arange(16) % 3
        return tf_patch.keras_step(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                   tf.keras.optimizers.SGD(0.1), x, y, n_devices=1)

    local = step()
    want = local.run(3)
    local.close()
    placed = step()
    plan = get_placer("m-etf")(placed.graph, hosts(2, 2, "25gbe"))
    losses, tr = run_step_on_servers(placed, plan, servers, steps=3)
    assert losses == pytest.approx(want, rel=1e-6)
    assert tr["misplaced"] == [] and tr["order_violations"] == [] and tr["traced"] > 0
    assert all("task:" in d for d in placed.applied.devices.values())


@pytest.mark.tf
@needs_tf
def test_task_plan_maps_short_names_and_rejects_missing_devices(servers, plan):
    flat = plan.replace(placement={o: f"/GPU:{i % 4}" for i, o in enumerate(plan.placement)}, order={})
    on = task_plan(flat, servers)
    assert sorted(set(on.placement.values())) == sorted(servers.devices)
    too_many = plan.replace(placement={o: "/job:worker/replica:0/task:5/device:GPU:0" for o in plan.placement},
                            order={})
    with pytest.raises(InvalidPlanError, match="task:5"):
        task_plan(too_many, servers)
    # a task's CPU:0 and GPU:k on CPU servers: the GPUs move up one logical device
    t1 = [task_device(1, "CPU", 0), task_device(1, "GPU", 0)]
    mixed = plan.replace(placement={o: t1[i % 2] for i, o in enumerate(plan.placement)}, order={})
    if servers.kind == "CPU":
        on = sorted(set(task_plan(mixed, servers).placement.values()))
        assert on == [servers.device(1, 0), servers.device(1, 1)]


@pytest.mark.tf
@needs_tf
def test_port_in_use_is_named_and_starts_nothing():
    with socket.socket() as held:
        held.bind(("localhost", 0))
        held.listen()
        port = held.getsockname()[1]
        s = LocalServers(2, 2, ports=[free_ports(1)[0], port])
        with pytest.raises(PortInUseError, match=f"{port}.*already in use"):
            s.start()
    assert s.procs == []


@pytest.mark.tf
@needs_tf
@pytest.mark.parametrize("python, timeout, match", [
    (["/bin/sh", "-c", "echo no tensorflow here >&2; exit 3"], 30, "(?s)exited with code 3.*no tensorflow here"),
    (["/bin/sh", "-c", "exec sleep 600"], 1, "did not report ready within 1 s"),
])
def test_server_that_does_not_start(python, timeout, match):
    s = LocalServers(2, 2, python=python, start_timeout=timeout)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=match):
        s.start()
    # bounded: the start timeout plus close's SIGTERM/SIGKILL grace, never a hang
    assert time.monotonic() - t0 < timeout + 15
    assert len(s.procs) == 2 and _all_stopped(s)


def _long_step(s):
    """A loop of ``n`` matmuls on task 1, summed on task 0."""
    g = tf.Graph()
    with g.as_default():
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        with tf.device(s.device(1, 0)):
            x = tf.random.uniform([100, 100], seed=1)
            y = tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, tf.tanh(tf.matmul(a, a) * 1e-3)), (0, x))[1]
        with tf.device(s.device(0, 0)):
            z = tf.reduce_sum(y)
    return g, n, z


@pytest.mark.tf
@needs_tf
def test_worker_killed_mid_step():
    s = LocalServers(2, 2, start_timeout=120, op_timeout=30)
    try:
        s.start()
        g, n, z = _long_step(s)
        sess = tf.compat.v1.Session(s.target, graph=g, config=s.session_config())
        sess.run(z, {n: 1})  # both tasks hold the step's graph: the next run is a step in progress
        killer = threading.Timer(1.0, s.procs[1].kill)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(WorkerLostError, match=r"task 1 .*exited with code -9"):
            try:
                sess.run(z, {n: 10_000_000})
            except tf.errors.OpError as exc:
                raise s.lost(exc) from exc
        s.close_session(sess)  # does not wait for the dead server
        assert time.monotonic() - t0 < s.op_timeout + 15  # never a hang
        killer.join()
        # the next placed run says so at once, before building a session
        with pytest.raises(WorkerLostError, match="task 1"):
            run_on_servers(_build, _flat_plan(), s, steps=1, timed=0)
    finally:
        s.close()
    assert _all_stopped(s)


def _flat_plan():
    m = _build()
    g = extract(m.graph, m.fetches, kind="CPU", default_cost=1.0, kinds_fn=lambda t, k: frozenset({k}),
                on_unknown="ignore")
    c = hosts(2, 2, "25gbe", kind="CPU", intra=(20.0, 1e-4), memory=1 << 30)
    return get_placer("single")(g, c)


@pytest.mark.tf
@needs_tf
@pytest.mark.slow
def test_demo_hosts_runs_and_leaves_nothing_running():
    """``make demo HOSTS=2`` in small: losses equal, plan enforced, servers stopped."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "tf_patch.demo_hosts", "--steps", "3", "--time-limit", "2",
                        "--timeout", "240"], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "equal: largest difference" in out and "0 ops off-plan" in out
    assert "host 1 (localhost:" in out and "predicted" in out and "measured" in out
    assert "servers stopped (2 processes, 0 left running)" in out
