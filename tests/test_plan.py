"""Plan, the independent checker (catches corrupted plans, names culprits),
memory profile (hand-computed), JSON, pesto.finalize.finalize."""
import json
import re
import time

import pytest
from hypothesis import assume, given, settings, strategies as st

from pesto.cluster import gpus, v100x2_nvlink
from pesto.errors import InvalidPlanError, SchemaError
from pesto.graph import Edge, Op, OpGraph, Tensor
from pesto.plan import Plan, Report, Transfer, check_plan, memory_profile
from pesto.simulate import simulate
from pesto.finalize import finalize
from strategies import clusters, dags, plans

G0, G1 = "/GPU:0", "/GPU:1"


def chain3():
    """a -> b -> c with persistent, output and temporary bytes."""
    ops = [Op("a", {"GPU": 2}, persistent_bytes=10, output_bytes=100, temporary_bytes=5),
           Op("b", {"GPU": 3}, output_bytes=50, temporary_bytes=20),
           Op("c", {"GPU": 1}, persistent_bytes=3, temporary_bytes=7)]
    edges = [Edge("a", "b", ("a:0",)), Edge("b", "c", ("b:0",))]
    return OpGraph(ops, edges, [Tensor("a:0", "a", 100), Tensor("b:0", "b", 50)], name="chain3")


C = gpus(2, beta=(1.0, 0.01))  # 100 bytes: 2 µs


# -- memory, by hand -----------------------------------------------------------------
def test_memory_one_device():
    g = chain3()
    s = simulate(g, C, dict.fromkeys("abc", G0))
    # a [0,2], b [2,5], c [5,6]; held: persistent 10 + 3 = 13 all step
    # t=0: + a.out 100 + a.tmp 5                          = 118
    # t=2: - a.tmp 5; + b.out 50 + b.tmp 20 (a.out held until b ends) = 183
    # t=5: - a.out 100 - b.tmp 20; + c.tmp 7               = 70
    assert s.peak_memory == {G0: 183, G1: 0}
    # static bound: 13 + outputs 150 + largest temporary 20 = 183 here
    assert memory_profile(g, C, s.placement) == {G0: 183, G1: 0}


def test_memory_outputs_freed_after_last_consumer():
    # a's 100-byte output is consumed by b and by d, which runs last
    ops = [Op("a", {"GPU": 1}, output_bytes=100), Op("b", {"GPU": 1}),
           Op("x", {"GPU": 1}, temporary_bytes=30), Op("d", {"GPU": 1})]
    g = OpGraph(ops, [Edge("a", "b", ("a:0",)), Edge("a", "d", ("a:0",)), Edge("x", "d", ())],
                [Tensor("a:0", "a", 100)])
    plan = Plan(dict.fromkeys("abxd", G0), {G0: ["a", "b", "x", "d"]})
    s = simulate(g, C, plan)
    # a [0,1] b [1,2] x [2,3] d [3,4]: a.out lives [0,4), so x's 30 bytes add to it: 130
    assert s.peak_memory[G0] == 130
    plan2 = Plan(dict.fromkeys("abxd", G0), {G0: ["x", "a", "b", "d"]})
    # x [0,1] first: 30 then a.out 100 alone: 100
    assert simulate(g, C, plan2).peak_memory[G0] == 100
    # a control edge does not keep a tensor alive: make d's input a control edge
    g3 = OpGraph(ops, [Edge("a", "b", ("a:0",)), Edge("a", "d", ()), Edge("x", "d", ())],
                 [Tensor("a:0", "a", 100)])
    # a.out now lives [0,2) (b is its last consumer): peak max(100, 30) = 100
    assert simulate(g3, C, plan).peak_memory[G0] == 100


def test_memory_received_tensors_and_sender_hold():
    g = chain3()
    s = simulate(g, C, {"a": G0, "b": G1, "c": G1})
    # a [0,2]; a:0 sent [2,4]; b [4,7]; c [7,8]
    # GPU:0: 10 + a.out held until the transfer ends [0,4) 100 + a.tmp [0,2) 5 = 115
    # GPU:1: 3; a:0 received [2,7) 100; b.out [4,8) 50; b.tmp [4,7) 20 -> at 4: 173
    #        at 7: -100 -20 +7 (c.tmp) = 60
    assert s.transfers[0].start == 2.0 and s.finish["c"] == 8.0
    assert s.peak_memory == {G0: 115, G1: 173}
    assert memory_profile(g, C, s.placement, s.start, s.finish, s.transfers) == s.peak_memory
    # static: GPU:1 = 3 + 50 + received 100 + temp 20 = 173; GPU:0 = 10 + 100 + 5
    assert memory_profile(g, C, s.placement) == {G0: 115, G1: 173}


def test_memory_received_once_per_device():
    ops = [Op("a", {"GPU": 1}, output_bytes=100), Op("b", {"GPU": 1}), Op("c", {"GPU": 1})]
    g = OpGraph(ops, [Edge("a", "b", ("a:0",)), Edge("a", "c", ("a:0",))], [Tensor("a:0", "a", 100)])
    s = simulate(g, C, {"a": G0, "b": G1, "c": G1})
    assert s.peak_memory[G1] == 100 and memory_profile(g, C, s.placement)[G1] == 100


def test_memory_zero_length_ops_count():
    g = OpGraph([Op("y", {"GPU": 1}, temporary_bytes=10), Op("z", {"GPU": 0}, temporary_bytes=40)])
    s = simulate(g, C, {"z": G0, "y": G0})
    # y [0,1] then z [1,1]: y's 10 are freed at 1, z's 40 count at that instant
    assert (s.start["z"], s.finish["z"]) == (1.0, 1.0) and s.peak_memory[G0] == 40
    # z [0,0] then y [0,1]: z is over before y starts at the same instant -> 40, not 50
    s = simulate(g, C, Plan(dict.fromkeys("yz", G0), {G0: ["z", "y"]}))
    assert s.start["y"] == 0.0 and s.peak_memory[G0] == 40
    # ...and the static bound (largest temporary only) still holds
    assert memory_profile(g, C, s.placement)[G0] == 40


def test_over_capacity_is_reported_and_finalize_marks_infeasible():
    g = chain3()
    pl = {"a": G0, "b": G1, "c": G1}
    small = C.with_memory({G1: 150})
    s = simulate(g, small, pl)
    r = check_plan(g, small, s.to_plan())
    assert not r.ok and len(r.violations) == 1
    assert "/GPU:1" in r.violations[0] and "173" in r.violations[0] and "150" in r.violations[0]
    # without times the static bound is used
    r2 = check_plan(g, small, Plan.from_placement(g, pl))
    assert not r2.ok and "/GPU:1" in r2.violations[0]
    assert check_plan(g, small, Plan.from_placement(g, pl), check_memory=False).ok
    plan = finalize(g, small, pl, placer="test", t0=time.perf_counter(), status="optimal")
    assert plan.status == "infeasible" and plan.stats["memory_over"] == {G1: 173}
    assert plan.makespan == 8.0 and plan.placer == "test"
    fine = finalize(g, C, pl, order=["a", "b", "c"], placer="test", t0=time.perf_counter(),
                    lower_bound=6.0, stats={"note": 1})
    assert fine.status == "heuristic" and fine.lower_bound == 6.0 and fine.stats == {"note": 1}
    assert check_plan(g, C, fine).ok and fine.wall_time >= 0


def _naive_peak(g, c, s):
    """Reference, straight from the definition: the peak over every allocation
    moment of the bytes live then. A moment is (time, rank): ops starting
    together go shortest first, received tensors before ops. An interval [s, e)
    is live from its own moment while time < e; a zero-length one only at its
    own moment."""
    pl = s.placement
    rank = {n: k for k, n in enumerate(sorted(g.names, key=lambda n: (s.start[n], s.finish[n])))}
    iv = {d.name: [] for d in c.devices}  # (start, end, bytes, rank)
    for op in g.ops:
        d = pl[op.name]
        last = s.finish[op.name]
        for e in g.edges:
            if e.src == op.name and e.tensors and pl[e.dst] == d:
                last = max(last, s.finish[e.dst])
        for t in s.transfers:
            if g.tensor(t.tensor).src == op.name:
                last = max(last, t.finish)
        iv[d].append((s.start[op.name], last, op.output_bytes, rank[op.name]))
        iv[d].append((s.start[op.name], s.finish[op.name], op.temporary_bytes, rank[op.name]))
    for t in s.transfers:
        end = max([t.finish] + [s.finish[x] for x in g.consumers()[t.tensor] if pl[x] == t.dst])
        iv[t.dst].append((t.start, end, g.tensor(t.tensor).bytes, -1))

    def live(i, moment):
        s0, e0, _, r0 = i
        if e0 <= s0:
            return moment == (s0, r0)
        return (s0, r0) <= moment and moment[0] < e0

    out = {}
    for d in iv:
        base = sum(op.persistent_bytes for op in g.ops if pl[op.name] == d)
        moments = [(i[0], i[3]) for i in iv[d]]
        out[d] = base + max((sum(i[2] for i in iv[d] if live(i, m)) for m in moments), default=0)
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_memory_profile_matches_naive_reference(data):
    g = data.draw(dags())
    c = data.draw(clusters())
    p = data.draw(plans(g, c))
    s = simulate(g, c, p)
    assert s.peak_memory == _naive_peak(g, c, s)


# -- checker on good and corrupted plans -------------------------------------------
def _simulated(data, contention_free=None, **kw):
    g = data.draw(dags(zero_times=False, **kw))
    c = data.draw(clusters(contention_free=contention_free))
    p = data.draw(plans(g, c))
    s = simulate(g, c, p, mode=data.draw(st.sampled_from(["order", "fifo"])))
    plan = s.to_plan()
    assert check_plan(g, c, plan).ok
    return g, c, plan


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_checker_catches_an_op_shifted_earlier(data):
    g, c, plan = _simulated(data)
    movable = [n for n in g.names if plan.start[n] > 0]
    assume(movable)
    n = data.draw(st.sampled_from(movable))
    dt = min(plan.start[n], 0.5)
    bad = plan.replace(start={**plan.start, n: plan.start[n] - dt},
                       finish={**plan.finish, n: plan.finish[n] - dt})
    r = check_plan(g, c, bad, check_memory=False)
    assert not r.ok and any(repr(n) in v for v in r.violations), str(r)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_checker_catches_two_ops_swapped_on_a_device(data):
    g, c, plan = _simulated(data)
    pairs = [(d, k) for d, seq in plan.order.items() for k in range(len(seq) - 1)]
    assume(pairs)
    d, k = data.draw(st.sampled_from(pairs))
    seq = list(plan.order[d])
    a, b = seq[k], seq[k + 1]
    seq[k], seq[k + 1] = b, a
    bad = plan.replace(order={**plan.order, d: seq})
    r = check_plan(g, c, bad, check_memory=False)
    assert not r.ok and any(re.search(rf"\b{a}\b", v) and re.search(rf"\b{b}\b", v)
                            for v in r.violations), str(r)
    # without times only a DAG contradiction is visible
    untimed = Plan(plan.placement, bad.order)
    if g.has_edge(a, b):
        assert not check_plan(g, c, untimed).ok


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_checker_catches_a_split_colocation_group(data):
    g, c, plan = _simulated(data, min_ops=5)
    groups = {k: m for k, m in g.colocation_groups().items() if len(m) > 1}
    assume(groups)
    name = data.draw(st.sampled_from(sorted(groups)))
    member = groups[name][-1]
    here = plan.placement[member]
    others = [d.name for d in c.devices if d.name != here and d.kind in g.op(member).kinds]
    assume(others)
    there = data.draw(st.sampled_from(others))
    order = {d: [o for o in seq if o != member] for d, seq in plan.order.items()}
    order.setdefault(there, []).append(member)
    bad = Plan({**plan.placement, member: there}, order)
    r = check_plan(g, c, bad, check_memory=False)
    assert any(f"colocation group {name!r}" in v for v in r.violations), str(r)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_checker_catches_a_dropped_op(data):
    g, c, plan = _simulated(data)
    n = data.draw(st.sampled_from(list(g.names)))
    pl = {k: v for k, v in plan.placement.items() if k != n}
    r = check_plan(g, c, plan.replace(placement=pl))
    assert not r.ok and any(f"op {n!r} is not placed" in v for v in r.violations)
    order = {d: [o for o in seq if o != n] for d, seq in plan.order.items()}
    r = check_plan(g, c, plan.replace(order=order))
    assert any(f"op {n!r} is missing from the order" in v for v in r.violations)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_checker_catches_overlapping_transfers_on_a_link(data):
    g, c, plan = _simulated(data, contention_free=False, min_ops=4, edge_prob=0.5)
    shared = []
    ts = [t for t in plan.transfers if t.finish > t.start]
    for i, x in enumerate(ts):
        for y in ts[i + 1:]:
            common = set(c.route(x.src, x.dst).links) & set(c.route(y.src, y.dst).links)
            if common:
                shared.append((x, y, sorted(common)))
    assume(shared)
    x, y, links = data.draw(st.sampled_from(shared))
    first, second = sorted([x, y], key=lambda t: t.start)
    moved = Transfer(second.tensor, second.src, second.dst, first.start,
                     first.start + (second.finish - second.start))
    transfers = [moved if t is second else t for t in plan.transfers]
    r = check_plan(g, c, plan.replace(transfers=transfers), check_memory=False)
    assert any("overlap on link" in v and any(l in v for l in links) for v in r.violations), str(r)


def test_checker_catches_hand_made_faults():
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 100)])
    s = simulate(g, C, {"a": G0, "b": G1})
    good = s.to_plan()
    assert check_plan(g, C, good).ok
    cases = [
        (good.replace(transfers=()), "tensor 'a->b' needed by 'b' on /GPU:1 is never sent there"),
        (good.replace(finish={**good.finish, "b": 9.0}), "op 'b' runs"),
        (good.replace(makespan=1.0), "makespan 1.0 differs"),
        (good.replace(transfers=(Transfer("a->b", G0, G1, 0.5, 2.5),)), "leaves /GPU:0 at 0.5"),
        (good.replace(transfers=(Transfer("a->b", G0, G1, 1.0, 1.5),)), "takes 0.5 µs, needs 2"),
        (good.replace(transfers=good.transfers + (Transfer("zz", G0, G1, 1, 3),)), "unknown tensor 'zz'"),
        (good.replace(transfers=(Transfer("a->b", G0, "/GPU:8", 1, 3),)), "unknown device"),
        (good.replace(start={"a": 0.0}), "op 'b' has no start/finish time"),
        (good.replace(start={**good.start, "a": float("nan")}), "non-finite"),
        (good.replace(placement={**good.placement, "a": "/GPU:5"}), "unknown device '/GPU:5'"),
        (good.replace(placement={**good.placement, "ghost": G0}), "unknown op 'ghost'"),
        (good.replace(order={**good.order, "/TPU:0": ()}), "unknown device '/TPU:0'"),
        (good.replace(order={G0: ("a", "b"), G1: ()}), "op 'b' is ordered on /GPU:0 but placed on /GPU:1"),
        (good.replace(order={G0: ("a", "a"), G1: ("b",)}), "op 'a' appears twice"),
    ]
    for plan, expected in cases:
        r = check_plan(g, C, plan)
        assert any(expected in v for v in r.violations), (expected, str(r))
    cpu = OpGraph([Op("k", {"CPU": 1})])
    r = check_plan(cpu, v100x2_nvlink(), Plan({"k": G0}, {G0: ["k"]}))
    assert "op 'k' is placed on /GPU:0 of kind GPU, allowed ['CPU']" in r.violations


def test_report_and_raise():
    g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    r = check_plan(g, C, Plan({"a": G0, "b": G0}, {G0: ["b", "a"]}))
    assert not r and "cycle" in str(r)
    with pytest.raises(InvalidPlanError, match="cycle") as ei:
        r.raise_if_invalid()
    assert ei.value.violations == r.violations
    assert Report.from_json(r.to_json()).violations == r.violations
    assert str(check_plan(g, C, Plan.from_placement(g, {"a": G0, "b": G1}))) == "plan is valid"
    with pytest.raises(InvalidPlanError, match="'b' is not placed"):
        Plan.from_placement(g, {"a": G0})


# -- Plan ------------------------------------------------------------------------------
def test_plan_json_round_trip(tmp_path):
    g = chain3()
    s = simulate(g, C, {"a": G0, "b": G1, "c": G1})
    p = s.to_plan(placer="cpsat", status="optimal", lower_bound=7.5, wall_time=0.25,
                  stats={"solutions": 3, "note": "x"})
    back = Plan.from_json(p.to_json())
    assert back == p
    p.to_json(tmp_path / "p.json")
    assert Plan.from_json(tmp_path / "p.json") == p
    bare = Plan.from_placement(g, {"a": G0, "b": G0, "c": G1})
    assert Plan.from_json(bare.to_json()) == bare and not bare.has_times
    assert p.gap == pytest.approx((8.0 - 7.5) / 8.0) and bare.gap is None
    assert "cpsat [optimal]" in str(p) and p.devices_used() == [G0, G1]


def test_typed_outcomes_round_trip_and_make_the_stats_view():
    from pesto.outcome import CpsatInfo, MemoryInfo, RescheduleInfo
    g = chain3()
    s = simulate(g, C, {"a": G0, "b": G1, "c": G1})
    info = (CpsatInfo(model_status="optimal", model_makespan=8.0, symmetric_groups=[[G0, G1]]),
            MemoryInfo(over={G1: 200}, forced=["b"]),
            RescheduleInfo(candidates={"given": 9.0, "rank": 8.0}, schedule="rank"))
    p = s.to_plan(placer="cpsat", stats={"note": "x"}, info=info)
    # code reads typed fields; stats is their flat view (and the notes given)
    assert p.info_of(CpsatInfo).model_status == "optimal" and p.info_of(RescheduleInfo).cut is None
    assert p.stats["model_makespan"] == 8.0 and p.stats["reschedule"] == {"given": 9.0, "rank": 8.0}
    assert p.stats["memory_forced"] == ["b"] and p.stats["note"] == "x" and "reschedule_cut" not in p.stats
    back = Plan.from_json(p.to_json())
    assert back == p and back.info == p.info and isinstance(back.info[0], CpsatInfo)
    old = p.to_dict()
    del old["info"]  # a plan file written before typed outcomes: its stats still load
    assert Plan.from_dict(old).info == () and Plan.from_dict(old).stats["model_status"] == "optimal"
    newer = p.to_dict()
    newer["info"].append({"kind": "from-the-future", "x": 1})  # a kind this version does not know
    assert Plan.from_dict(newer).info == p.info
    bad = p.to_dict()
    bad["info"] = {"kind": "cpsat"}
    with pytest.raises(SchemaError, match="info"):
        Plan.from_dict(bad)


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.pop("placement"), "missing required field 'placement'"),
    (lambda d: d.pop("order"), "missing required field 'order'"),
    (lambda d: d.update(version=0), "unsupported version 0"),
    (lambda d: d.update(format="pesto.cluster"), "expected format 'pesto.plan'"),
    (lambda d: d.update(status="great"), "status must be one of"),
    (lambda d: d["transfers"][0].pop("finish"), r"transfers\[0\]' must be an object with tensor"),
])
def test_plan_json_schema_errors(mutate, pattern):
    g = chain3()
    d = json.loads(simulate(g, C, {"a": G0, "b": G1, "c": G1}).to_plan().to_json())
    mutate(d)
    with pytest.raises(SchemaError, match=pattern):
        Plan.from_json(json.dumps(d))


def test_plan_is_immutable():
    p = Plan({"a": G0}, {G0: ["a"]})
    with pytest.raises(TypeError):
        p.placement["a"] = G1
    with pytest.raises(ValueError, match="status"):
        Plan({"a": G0}, {G0: ["a"]}, status="good")


# -- findings (shared/findings/reliability-and-ux.md): malformed plan files and claims --
def _plan_doc():
    g = OpGraph.from_edges({"a": 2, "b": 3}, [("a", "b", 100)])
    c = gpus(2)
    return g, c, simulate(g, c, {"a": "/GPU:0", "b": "/GPU:1"}).to_plan()


@pytest.mark.parametrize("field, mutate", [
    ("start['a']", lambda d: d["start"].__setitem__("a", "abc")),
    ("order", lambda d: d.__setitem__("order", ["a", "b"])),
    ("order['/GPU:0']", lambda d: d["order"].__setitem__("/GPU:0", "a")),
    ("makespan", lambda d: d.__setitem__("makespan", "x")),
    ("lower_bound", lambda d: d.__setitem__("lower_bound", float("nan"))),
    ("placement", lambda d: d.__setitem__("placement", ["a"])),
])
def test_malformed_plan_fields_are_named(field, mutate):
    _, _, p = _plan_doc()
    d = json.loads(json.dumps(p.to_dict()))
    mutate(d)
    with pytest.raises(SchemaError, match=re.escape(repr(field))):
        Plan.from_dict(d)


def test_check_rejects_a_bound_above_the_makespan():
    g, c, p = _plan_doc()
    assert check_plan(g, c, p.replace(lower_bound=p.makespan)).ok
    rep = check_plan(g, c, p.replace(lower_bound=2 * p.makespan))
    assert not rep.ok and any("lower bound" in v for v in rep.violations)
