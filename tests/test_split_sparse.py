"""A sparse gradient (an embedding's ``IndexedSlices``) in the micro-batched step
(:func:`pesto.step.split`), as TensorFlow's split step runs it: each slice makes
its own rows (``1 / M`` of the batch's), and the slices' rows and indices are
concatenated once (``t@acc{M-1}``), not summed by ``M - 1`` adds of the full
tensor; replicas split so gather their concatenated rows. The graph is
``tests/test_replicate_sparse.py``'s; the TF check is in ``tests/test_tf_slicemap.py``.
"""
from pathlib import Path

import pytest

from pesto.cluster import gpus
from pesto.api import marked
from pesto.plan import check_plan
from pesto.errors import MicroBatchError
from pesto.graph import OpGraph
from pesto.step import compose, replicate, split
from pesto.step.slicing import (BANDWIDTH, FLOOR_US, choose_weight_grads, concat_op, sparse_partials,
                                weight_grad_costs)
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan
from test_replicate_sparse import IDS, ROWS, _embedding_step, _received

T6 = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs" / "transformer_6.json.gz"
SPARSE = {"rows:0": ROWS, "ids:0": IDS}


def _ceil(a, n):
    return -(-a // n)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_each_slice_makes_its_own_rows_and_one_concatenation_joins_them(m):
    s = split(_embedding_step(), m)
    g = s.graph
    for t, b in SPARSE.items():
        op = t.split(":")[0]
        for i in range(m):   # sliced as an activation: the slice's rows
            assert g.tensor(f"{t}@mb{i}").bytes == _ceil(b, m)
            assert g.op(f"{op}@mb{i}").output_bytes == _ceil(b, m)
        join = f"{t}@acc{m - 1}"
        assert not [n for n in g.names if n.startswith(f"{t}@acc") and n != join]   # no chain of adds
        assert sorted(g.predecessors(join)) == [f"{op}@mb{i}" for i in range(m)]
        assert g.op(join).type == "Concat" and g.tensor(join).bytes == g.op(join).output_bytes == b
        assert g.op(join).compute["GPU"] == max(FLOOR_US, 2 * b / BANDWIDTH["GPU"])
        assert s.origin[join].role == "accumulate" and s.origin[join].tensor == t and s.origin[join].slice == m - 1
    # the update reads what the un-split step's reads: the concatenated rows and indices
    assert g.edge("rows:0@acc" + str(m - 1), "uss").tensors == (f"rows:0@acc{m - 1}",)
    assert g.edge("ids:0@acc" + str(m - 1), "unique").tensors == (f"ids:0@acc{m - 1}",)
    # the dense weight gradient is still summed by M - 1 adds of its full bytes
    assert [g.tensor(f"dw:0@acc{k}").bytes for k in range(1, m)] == [g.tensor("dw:0@mb0").bytes] * (m - 1)


def test_the_concatenation_is_costed_as_a_memory_bound_copy():
    op = concat_op("rows:0@acc3", 9_000_000, {"GPU", "CPU"})
    assert op.compute == {"GPU": 20.0, "CPU": 360.0} and op.batch is False
    assert concat_op("tiny@acc1", 8, {"GPU"}).compute["GPU"] == FLOOR_US
    with pytest.raises(MicroBatchError, match="kind 'TPU' to cost the concatenation of 'rows:0'") as err:
        concat_op("rows:0@acc1", 8, {"TPU"}, what="rows:0")
    assert err.value.culprit == "TPU"


@pytest.mark.parametrize("rule", ["separate", "accumulate", "whole", {"dw": "accumulate", "rows": "accumulate"}])
def test_every_weight_gradient_rule_leaves_the_sparse_gradient_concatenated(rule):
    g = split(_embedding_step(), 4, weight_grads=rule).graph
    for op in ("rows", "ids"):
        assert f"{op}@all" not in g and f"{op}:0@acc3" in g
        assert [p for p in g.predecessors(f"{op}@mb1") if p.startswith(op)] == []   # no in-place chain
    dense = "whole" if rule == "whole" else "accumulate" if rule != "separate" else "separate"
    assert ("dw@all" in g) == (dense == "whole") and ("dw:0@acc1" in g) == (dense == "separate")


def test_a_mapping_cannot_run_a_sparse_gradient_whole():
    with pytest.raises(MicroBatchError, match="'rows' produces a sparse gradient") as err:
        split(_embedding_step(), 2, weight_grads={"rows": "whole"})
    assert err.value.culprit == "rows"


def test_no_rule_claims_a_saving_on_a_sparse_gradient():
    costs = {c.op: c for c in weight_grad_costs(_embedding_step(), 4)}
    for op, b in (("rows", ROWS), ("ids", IDS)):
        c = costs[op]
        assert c.separate_us == c.accumulate_us and c.whole_us is None and c.whole_bytes is None
        assert c.ops == (op,) and c.sum_bytes == b
        # the copies (4 x the floor) and the one concatenation, what split builds
        built = split(_embedding_step(), 4).graph
        assert c.separate_us == pytest.approx(sum(built.op(n).compute["GPU"] for n in built.names
                                                  if n.startswith(f"{op}@mb") or n == f"{op}:0@acc3"))
    assert costs["dw"].accumulate_us < costs["dw"].separate_us   # a dense weight gradient's adds still count
    assert choose_weight_grads(costs.values())["rows"] == "accumulate"   # which leaves it concatenated


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("zero", [0, 1])
def test_replicas_split_into_slices_gather_their_concatenated_rows(n, zero):
    g = _embedding_step()
    rep = replicate(g, n, shard_optimizer=zero)
    both = compose(split(rep.graph, 2), rep)
    for r in range(n):   # what each replica receives for the rows: the same as unsplit
        assert _received(both, r, {"rows:0"}) == _received(rep, r, {"rows:0"}) >= (n - 1) * (_ceil(ROWS, n) + _ceil(IDS, n))
        for t, b in SPARSE.items():
            cat = f"{t}@r{r}@acc1"
            assert both.graph.tensor(cat).bytes == _ceil(b, n)   # the replica's rows, whole
            assert both.graph.tensor(f"{t}@r{r}@mb1").bytes == _ceil(_ceil(b, n), 2)
            assert any(x.startswith(f"ids:0@ag0@r") for x in both.graph.successors(cat))   # the ring gathers it
    assert both.graph.tensor("rows:0@allreduce@r0").bytes == ROWS   # every replica's rows reach the update
    c = gpus(n, memory=10**9)
    sp = data_parallel_plan(g, c, micro_batches=2, shard_optimizer=zero)
    assert check_plan(sp.graph, c, sp.plan).ok


def test_a_pipeline_of_the_split_step_is_a_valid_plan():
    g, c = _embedding_step(), gpus(2, memory=10**9)
    sp = pipeline_plan(g, c, micro_batches=4, stages=2)
    assert check_plan(sp.graph, c, sp.plan).ok and "rows:0@acc3" in sp.plan.placement


@pytest.mark.skipif(not T6.exists(), reason="cached Transformer-6 graph")
def test_transformer6_slices_carry_the_step_s_rows_once():
    """Transformer-6's 16 MiB of embedding rows (and 32 KiB of indices) at M=4: 4 MiB per
    slice, one concatenation of 16 MiB each, where the dense model added 16 MiB three times."""
    g = marked(OpGraph.from_json(T6))
    sparse = sparse_partials(g)
    s = split(g, 4).graph
    for t in sparse:
        assert sum(s.tensor(f"{t}@mb{i}").bytes for i in range(4)) == 4 * _ceil(g.tensor(t).bytes, 4)
        assert s.tensor(f"{t}@acc3").bytes == g.tensor(t).bytes and f"{t}@acc1" not in s
    assert sum(g.tensor(t).bytes for t in sparse) > 16 * 2**20
