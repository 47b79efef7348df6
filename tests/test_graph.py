"""OpGraph: validation errors naming the culprit, queries, JSON and networkx round trips."""
import json
import math

import networkx as nx
import pytest
from hypothesis import given, settings

from pesto.errors import CycleError, InvalidGraphError, SchemaError
from pesto.graph import Edge, Op, OpGraph, Tensor
from strategies import dags


def diamond():
    ops = [Op("a", {"GPU": 1.0}, output_bytes=10), Op("b", {"GPU": 2.0, "CPU": 5.0}),
           Op("c", {"CPU": 3.0}, colocation_group="g"), Op("d", {"GPU": 4.0, "CPU": 4.0}, colocation_group="g")]
    tensors = [Tensor("a:0", "a", 10), Tensor("b:0", "b", 0), Tensor("c:0", "c", 7), Tensor("c:1", "c", 5)]
    edges = [Edge("a", "b", ("a:0",)), Edge("a", "c", ("a:0",)), Edge("b", "d", ()),
             Edge("c", "d", ("c:0", "c:1"))]
    return OpGraph(ops, edges, tensors, name="diamond")


# -- queries -----------------------------------------------------------------------
def test_queries_on_diamond():
    g = diamond()
    assert g.num_ops == 4 and g.num_edges == 4 and len(g) == 4
    assert g.topological_order()[0] == "a" and g.topological_order()[-1] == "d"
    assert sorted(g.successors("a")) == ["b", "c"] and sorted(g.predecessors("d")) == ["b", "c"]
    assert g.edge_bytes("c", "d") == 12 and g.edge_bytes("b", "d") == 0
    assert g.edge("b", "d").is_control and not g.edge("a", "b").is_control
    assert g.consumers() == {"a:0": ["b", "c"], "b:0": [], "c:0": ["d"], "c:1": ["d"]}
    assert g.colocation_groups() == {"g": ["c", "d"]}
    assert g.kinds() == {"GPU", "CPU"}
    # GPU work: a 1 + b 2 + c (CPU only, its fastest 3) + d 4
    assert g.total_work("GPU") == 10.0
    # longest compute path a -> c -> d = 1 + 3 + 4
    assert g.critical_path("GPU") == 8.0
    assert g.data_succ_idx()[g.index["b"]] == []  # b -> d is a control edge
    assert {t[0]: t[3] for t in g.tensor_table()}["a:0"] == [g.index["b"], g.index["c"]]


def test_op_defaults_and_normalisation():
    import numpy as np
    op = Op("x", {"GPU": np.float32(2.5)}, kinds="GPU", output_bytes=np.int64(7))
    assert op.kinds == frozenset({"GPU"})  # a bare string is one kind, not its letters
    assert type(op.compute["GPU"]) is float and type(op.output_bytes) is int
    assert Op("y", {"GPU": 1, "CPU": 2}).kinds == frozenset({"GPU", "CPU"})
    assert hash(op) == hash(Op("x", {"GPU": 2.5}, kinds=["GPU"], output_bytes=7))
    assert Edge("a", "b", "a:0").tensors == ("a:0",)


# -- bad inputs --------------------------------------------------------------------
def test_cycle_error_prints_the_cycle():
    with pytest.raises(CycleError) as ei:
        OpGraph.from_edges({"a": 1, "b": 1, "c": 1, "d": 1},
                           [("a", "b"), ("b", "c"), ("c", "d"), ("d", "b")])
    assert set(ei.value.cycle) == {"b", "c", "d"}
    msg = str(ei.value)
    assert "cycle" in msg
    # printed in edge order and closed: "x -> y -> z -> x" with consecutive real edges
    parts = msg.split(": ", 1)[1].split(" -> ")
    assert parts[0] == parts[-1] and len(parts) == 4
    edges = {("b", "c"), ("c", "d"), ("d", "b")}
    assert all((u, v) in edges for u, v in zip(parts, parts[1:]))


def test_self_loop_is_a_cycle():
    with pytest.raises(CycleError, match="a -> a"):
        OpGraph.from_edges({"a": 1}, [("a", "a")])


@pytest.mark.parametrize("kwargs, culprit", [
    (dict(ops=[Op("a", {"GPU": 1})], edges=[Edge("a", "zz")]), "'zz'"),
    (dict(ops=[Op("a", {"GPU": 1})], edges=[Edge("qq", "a")]), "'qq'"),
])
def test_unknown_edge_endpoint(kwargs, culprit):
    with pytest.raises(InvalidGraphError, match=culprit):
        OpGraph(**kwargs)


@pytest.mark.parametrize("compute, culprit", [
    ({"GPU": -1.0}, "-1.0"),
    ({"GPU": float("nan")}, "nan"),
    ({"GPU": float("inf")}, "inf"),
    ({"GPU": None}, "None"),
    ({"GPU": "3"}, "'3'"),
])
def test_bad_cost(compute, culprit):
    with pytest.raises(InvalidGraphError, match=r"op 'bad'.*" + culprit):
        OpGraph([Op("ok", {"GPU": 1}), Op("bad", compute)])


def test_missing_cost_for_allowed_kind():
    with pytest.raises(InvalidGraphError, match=r"op 'bad' has no compute time for allowed kind 'CPU'"):
        OpGraph([Op("bad", {"GPU": 1}, kinds={"GPU", "CPU"})])


def test_op_allowed_on_no_kind():
    with pytest.raises(InvalidGraphError, match=r"op 'bad' is allowed on no device kind"):
        OpGraph([Op("bad", {})])
    with pytest.raises(InvalidGraphError, match=r"op 'bad2' is allowed on no device kind"):
        OpGraph([Op("bad2", {"GPU": 1}, kinds=())])


def test_colocation_group_without_common_kind():
    with pytest.raises(InvalidGraphError, match=r"colocation group 'v'.*'y'"):
        OpGraph([Op("x", {"GPU": 1}, colocation_group="v"), Op("y", {"CPU": 1}, colocation_group="v")])


def test_tensor_errors():
    ops = [Op("a", {"GPU": 1}), Op("b", {"GPU": 1})]
    with pytest.raises(InvalidGraphError, match=r"tensor 't' is produced by unknown op 'ghost'"):
        OpGraph(ops, [], [Tensor("t", "ghost", 1)])
    with pytest.raises(InvalidGraphError, match=r"unknown tensor 'nope'"):
        OpGraph(ops, [Edge("a", "b", ("nope",))], [])
    with pytest.raises(InvalidGraphError, match=r"tensor 'b:0' produced by 'b'"):
        OpGraph(ops, [Edge("a", "b", ("b:0",))], [Tensor("b:0", "b", 1)])
    with pytest.raises(InvalidGraphError, match=r"tensor 't' has invalid size -5"):
        OpGraph(ops, [], [Tensor("t", "a", -5)])
    with pytest.raises(InvalidGraphError, match=r"lists a tensor twice"):
        OpGraph(ops, [Edge("a", "b", ("t", "t"))], [Tensor("t", "a", 1)])


def test_duplicates():
    with pytest.raises(InvalidGraphError, match=r"duplicate op name 'a'"):
        OpGraph([Op("a", {"GPU": 1}), Op("a", {"GPU": 2})])
    with pytest.raises(InvalidGraphError, match=r"duplicate edge 'a' -> 'b'"):
        OpGraph([Op("a", {"GPU": 1}), Op("b", {"GPU": 2})], [Edge("a", "b"), Edge("a", "b")])
    with pytest.raises(InvalidGraphError, match=r"duplicate tensor name 't'"):
        OpGraph([Op("a", {"GPU": 1})], [], [Tensor("t", "a", 1), Tensor("t", "a", 1)])


def test_bad_memory_fields():
    with pytest.raises(InvalidGraphError, match=r"op 'm' has invalid persistent_bytes -1"):
        OpGraph([Op("m", {"GPU": 1}, persistent_bytes=-1)])
    with pytest.raises(InvalidGraphError, match=r"op 'm' has invalid temporary_bytes 1.5"):
        OpGraph([Op("m", {"GPU": 1}, temporary_bytes=1.5)])


def test_unknown_op_lookup():
    with pytest.raises(InvalidGraphError, match="'nobody'"):
        diamond().op("nobody")


# -- JSON --------------------------------------------------------------------------
def test_json_round_trip_is_lossless(tmp_path):
    g = diamond()
    text = g.to_json()
    assert OpGraph.from_json(text) == g
    path = tmp_path / "g.json"
    g.to_json(path)
    back = OpGraph.from_json(str(path))
    assert back == g and back.name == "diamond"
    assert back.op("b").kinds == frozenset({"GPU", "CPU"}) and back.op("c").colocation_group == "g"
    assert OpGraph.from_json(path) == g  # a pathlib.Path works too
    assert g != OpGraph.from_edges({"a": 1}, [])
    gz = tmp_path / "g.json.gz"
    g.to_json(gz)
    assert gz.read_bytes()[:2] == b"\x1f\x8b"  # really gzip
    assert OpGraph.from_json(gz) == g


@settings(max_examples=40, deadline=None)
@given(dags())
def test_json_round_trip_random(g):
    back = OpGraph.from_json(g.to_json())
    assert back == g
    assert back.topological_order() == g.topological_order()
    assert [t.bytes for t in back.tensors] == [t.bytes for t in g.tensors]


def _doc():
    return json.loads(diamond().to_json())


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.pop("ops"), r"missing required field 'ops'"),
    (lambda d: d.pop("edges"), r"missing required field 'edges'"),
    (lambda d: d["ops"][0].pop("compute"), r"lacks required field 'compute'"),
    (lambda d: d["ops"][1].pop("name"), r"lacks required field 'name'"),
    (lambda d: d["tensors"][0].pop("bytes"), r"lacks required field 'bytes'"),
    (lambda d: d["edges"][0].pop("dst"), r"lacks required field 'dst'"),
    (lambda d: d.update(version=2), r"unsupported version 2"),
    (lambda d: d.pop("version"), r"unsupported version None"),
    (lambda d: d.update(format="pesto.plan"), r"expected format 'pesto.opgraph'"),
    (lambda d: d.update(ops=[None]), r"malformed"),
])
def test_json_schema_errors(mutate, pattern):
    d = _doc()
    mutate(d)
    with pytest.raises(SchemaError, match=pattern):
        OpGraph.from_json(json.dumps(d))


def test_json_not_json_and_not_object():
    with pytest.raises(SchemaError, match="not valid JSON"):
        OpGraph.from_json("{not json")
    with pytest.raises(SchemaError, match="expected a JSON object"):
        OpGraph.from_dict([1, 2])


def test_json_semantic_error_still_named():
    d = _doc()
    d["edges"].append({"src": "d", "dst": "a", "tensors": []})
    with pytest.raises(CycleError):
        OpGraph.from_json(json.dumps(d))


# -- networkx ----------------------------------------------------------------------
def test_networkx_round_trip_keeps_tensors():
    g = diamond()
    back = OpGraph.from_networkx(g.to_networkx())
    assert back == g


def test_from_networkx_shared_tensor_names_dedup():
    d = nx.DiGraph(name="nx")
    d.add_node("a", compute={"GPU": 2.0}, persistent_bytes=5)
    d.add_node("b", time=1.0)
    d.add_node("c", time=1.0)
    d.add_node("e", time=1.0)
    d.add_edge("a", "b", tensor="a:0", bytes=64)
    d.add_edge("a", "c", tensor="a:0", bytes=64)
    d.add_edge("a", "e", bytes=16)            # its own tensor "a->e"
    d.add_edge("b", "e", control=True)
    g = OpGraph.from_networkx(d)
    assert g.name == "nx"
    assert sorted(t.name for t in g.tensors) == ["a->e", "a:0"]
    assert g.consumers()["a:0"] == ["b", "c"]
    # output bytes default to the distinct tensors produced: 64 + 16, not 64 + 64 + 16
    assert g.op("a").output_bytes == 80 and g.op("a").persistent_bytes == 5
    assert g.edge("b", "e").is_control


def test_from_networkx_errors():
    d = nx.DiGraph()
    d.add_node("a", time=1.0)
    d.add_node("nocost")
    with pytest.raises(InvalidGraphError, match="'nocost'"):
        OpGraph.from_networkx(d)
    d = nx.DiGraph()
    for n in "abc":
        d.add_node(n, time=1.0)
    d.add_edge("a", "b", tensor="t", bytes=10)
    d.add_edge("a", "c", tensor="t", bytes=20)
    with pytest.raises(InvalidGraphError, match="'t' declared twice"):
        OpGraph.from_networkx(d)
    d = nx.DiGraph()
    for n in "ab":
        d.add_node(n, time=1.0)
    d.add_edge("a", "b", tensors=["x", "y"])
    with pytest.raises(InvalidGraphError, match="tensor_bytes"):
        OpGraph.from_networkx(d)


def test_from_edges_output_bytes():
    g = OpGraph.from_edges({"a": 1, "b": 2, "c": 3}, [("a", "b", 8), ("a", "c", 4), ("b", "c")])
    assert g.op("a").output_bytes == 12 and g.op("b").output_bytes == 0 and g.op("c").output_bytes == 0
    assert len(g.tensors) == 3


def test_random_graph_generators_are_valid_and_seeded():
    from benchmarks.generators import layered_dag, lstm_grid, random_dag, transformer_like
    a = layered_dag(300, width=8, seed=3, cpu_only_prob=0.1, coloc_prob=0.2)
    b = layered_dag(300, width=8, seed=3, cpu_only_prob=0.1, coloc_prob=0.2)
    assert a == b and a.num_ops == 300
    assert any(op.kinds == frozenset({"CPU"}) for op in a.ops)
    assert a.colocation_groups()
    assert random_dag(30, p=0.2, seed=1).num_ops == 30
    assert lstm_grid(2, 3, ops_per_cell=4).num_ops == 2 * 3 * 4 * 2
    t = transformer_like(2, heads=2, ops_per_head=2)
    assert t.num_ops == 2 + 2 * 2 * (2 * 2 + 1 + 4)
    # every generated tensor is shared by all consumers of its producer
    assert all(len({tn for e in t.edges if e.src == s for tn in e.tensors}) <= 1 for s in t.names)


def test_names_and_kinds_must_be_strings():
    with pytest.raises(InvalidGraphError, match="non-empty string"):
        OpGraph([Op("", {"GPU": 1})])
    with pytest.raises(InvalidGraphError, match=r"op 'k'.*kind.*None"):
        OpGraph([Op("k", {None: 1})])
    with pytest.raises(InvalidGraphError, match="tensor name"):
        OpGraph([Op("a", {"GPU": 1})], [], [Tensor(7, "a", 1)])


@pytest.mark.parametrize("bytes_", [-5, 2.5, float("nan")])
def test_a_bad_edge_size_is_reported_against_the_edge(bytes_):
    # not against the producer's output_bytes, which is derived from it
    with pytest.raises(InvalidGraphError, match=r"edge 'a' -> 'b': invalid byte count"):
        OpGraph.from_edges({"a": 1, "b": 2}, [("a", "b", bytes_)])
    d = nx.DiGraph()
    d.add_node("a", time=1.0)
    d.add_node("b", time=1.0)
    d.add_edge("a", "b", bytes=bytes_)
    with pytest.raises(InvalidGraphError, match=r"edge 'a' -> 'b': invalid byte count"):
        OpGraph.from_networkx(d)
