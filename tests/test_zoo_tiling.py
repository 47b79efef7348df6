"""tf_patch.zoo.tiling: a stack tiled from its one-layer profile is the stack
profiled whole (GPT and BERT at small sizes), and the rule's checks."""
import functools
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import tf_patch  # noqa: E402
from pesto.errors import InvalidGraphError  # noqa: E402
from pesto.graph import Edge, Op, OpGraph, Tensor  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402
from tf_patch.zoo.gpt import parameters, sparse_update_bytes  # noqa: E402
from tf_patch.zoo.tiling import canonical, chain_tensors, layer_of, tile  # noqa: E402

pytestmark = pytest.mark.tf


@functools.lru_cache(maxsize=None)
def profiled(kind: str, layers: int) -> OpGraph:
    """The canonical graph of the small preset at ``layers``, profiled whole
    with grappler's V100 model (as benchmarks/make_graphs.py does)."""
    m = build_model(kind, "small", layers=layers)
    g, _ = tf_patch.opgraph(m.graph, m.fetches, "v100", name=kind, tensor_sizes=sparse_update_bytes(m))
    return canonical(g)


def _edges(g):
    return {(e.src, e.dst, tuple(sorted(e.tensors))) for e in g.edges}


@pytest.mark.parametrize("kind,layers", [("gpt", 3), ("bert", 2)])
def test_tile_of_one_layer_is_the_profiled_stack(kind, layers):
    one, full = profiled(kind, 1), profiled(kind, layers)
    tiled = tile(one, layers)
    a, b = {op.name: op for op in full.ops}, {op.name: op for op in tiled.ops}
    assert a.keys() == b.keys()
    assert _edges(full) == _edges(tiled)
    assert {(t.name, t.src, t.bytes) for t in full.tensors} == {(t.name, t.src, t.bytes) for t in tiled.tensors}
    for name, op in a.items():   # every field, costs to grappler's rounding
        x, y = op.to_dict(), b[name].to_dict()
        assert x.pop("compute") == pytest.approx(y.pop("compute"), rel=1e-9, abs=1e-9), name
        assert x == y, name
    per_layer = [sum(1 for n in b if layer_of(n) == k) for k in range(layers)]
    assert len(set(per_layer)) == 1 and per_layer[0] > 100
    assert tiled.total_work("GPU") == pytest.approx(full.total_work("GPU"), rel=1e-3)
    assert all(op.batch is not None for op in tiled.ops)
    pers = sum(op.persistent_bytes for op in tiled.ops)
    assert pers == sum(op.persistent_bytes for op in full.ops)
    cfg = build_model(kind, "small", layers=layers).config
    assert pers == 12 * parameters(cfg, kind) + 8   # weights + Adam slots (fp32), Adam's beta powers


def test_canonical_names_gradient_sums_by_layer():
    g = profiled("gpt", 3)
    sums = [op.name for op in g.ops if op.type == "AddN"]
    assert {layer_of(n) for n in sums} == {None, 0, 1, 2}
    assert all(n.startswith(f"gradients/layer_{layer_of(n)}/AddN_") for n in sums if layer_of(n) is not None)
    assert [n for n in sums if layer_of(n) is None] == ["gradients/ln_f/AddN_0"]   # the head's own sum
    assert canonical(g).to_dict() == g.to_dict()   # idempotent


def chain_graph():
    """embed -> layer_0/f -> head -> loss -> gradients/head -> gradients/layer_0/g -> gradients/embed,
    with a weight (layer_0/w) and its update, and a shared constant."""
    ops = [Op("embed", {"GPU": 1.0}, output_bytes=8, batch=True),
           Op("lr", {"GPU": 0.0}, batch=False),
           Op("layer_0/w", {"GPU": 0.0}, persistent_bytes=100, colocation_group="coloc:layer_0/w", batch=False),
           Op("layer_0/f", {"GPU": 2.0}, output_bytes=8, batch=True),
           Op("head", {"GPU": 1.0}, output_bytes=8, batch=True),
           Op("gradients/head", {"GPU": 1.0}, output_bytes=8, batch=True),
           Op("gradients/layer_0/g", {"GPU": 3.0}, output_bytes=8, batch=True),
           Op("gradients/layer_0/dw", {"GPU": 3.0}, output_bytes=8, batch=True),
           Op("gradients/embed", {"GPU": 1.0}, batch=True),
           Op("train/update_layer_0/w", {"GPU": 1.0}, colocation_group="coloc:layer_0/w", batch=False),
           Op("train", {"GPU": 0.0}, batch=False)]
    t = {n: Tensor(f"{n}:0", n, 8) for n in ("embed", "lr", "layer_0/f", "head", "gradients/head",
                                              "gradients/layer_0/g", "gradients/layer_0/dw")}
    edges = [("embed", "layer_0/f", "embed"), ("layer_0/w", "layer_0/f", None), ("layer_0/f", "head", "layer_0/f"),
             ("head", "gradients/head", "head"), ("gradients/head", "gradients/layer_0/g", "gradients/head"),
             ("embed", "gradients/layer_0/dw", "embed"), ("gradients/head", "gradients/layer_0/dw", "gradients/head"),
             ("gradients/layer_0/g", "gradients/embed", "gradients/layer_0/g"),
             ("gradients/layer_0/dw", "train/update_layer_0/w", "gradients/layer_0/dw"),
             ("lr", "train/update_layer_0/w", "lr"), ("train/update_layer_0/w", "train", None)]
    return OpGraph(ops, [Edge(u, v, (t[x].name,) if x else ()) for u, v, x in edges], list(t.values()), name="chain")


def test_tile_wires_the_chain_and_shares_the_rest():
    g = chain_graph()
    ch = chain_tensors(g, {op.name for op in g.ops if layer_of(op.name) == 0})
    assert (ch.x, ch.y, ch.grad_y, ch.grad_x) == ("embed:0", "layer_0/f:0", "gradients/head:0",
                                                  "gradients/layer_0/g:0")
    t = tile(g, 3)
    assert t.num_ops == 6 + 5 * 3 and sum(op.persistent_bytes for op in t.ops) == 300
    assert sorted(t.predecessors("layer_1/f")) == ["layer_0/f", "layer_1/w"]
    assert t.successors("layer_2/f") == ["head"] and "head" not in t.successors("layer_0/f")
    assert sorted(t.predecessors("gradients/layer_1/dw")) == ["gradients/layer_2/g", "layer_0/f"]
    assert sorted(t.predecessors("gradients/layer_2/g")) == ["gradients/head"]
    assert t.predecessors("gradients/embed") == ["gradients/layer_0/g"]
    assert sorted(t.successors("lr")) == [f"train/update_layer_{k}/w" for k in range(3)]
    assert sorted(t.predecessors("train")) == [f"train/update_layer_{k}/w" for k in range(3)]
    assert t.op("train/update_layer_2/w").colocation_group == "coloc:layer_2/w"
    assert tile(g, 1).to_dict()["edges"] and _edges(tile(g, 1)) == _edges(g)


def test_tile_refuses_what_is_not_one_layer_of_a_chain():
    g = chain_graph()
    with pytest.raises(InvalidGraphError, match="found layers \\[0, 1\\]"):
        tile(tile(g, 2), 3)
    d = g.to_dict()
    d["edges"] = [e for e in d["edges"] if e["src"] != "gradients/layer_0/g"]   # no gradient leaves the block
    with pytest.raises(InvalidGraphError, match="exactly one per-sample gradient output"):
        tile(OpGraph.from_dict(d), 2)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        tile(g, 0)
