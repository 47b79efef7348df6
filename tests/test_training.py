"""pesto.training: batch marks for TensorFlow graphs without them, forward vs backward."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pesto.errors import BatchMarkError, InvalidGraphError
from pesto.graph import Op, OpGraph
from pesto.microbatch import partial_tensors, split_step
from pesto.training import backward_ops, data_inputs, infer_batch_marks, optimizer_scopes, step_ops

GRAPHS = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"


@pytest.fixture(scope="module")
def rnnlm():
    return infer_batch_marks(OpGraph.from_json(GRAPHS / "rnnlm_2x2048.json.gz"))


@pytest.fixture(scope="module")
def resnet():
    return infer_batch_marks(OpGraph.from_json(GRAPHS / "keras_resnet50.json.gz"))


def test_rnnlm_marks(rnnlm):
    batch = {op.name: op.batch for op in rnnlm.ops}
    assert data_inputs(rnnlm) == ["inputs", "targets"] and optimizer_scopes(rnnlm) == {"train"}
    assert batch["inputs"] and batch["embed/embedding_lookup"] and batch["rnn/layer_0/t3/MatMul"]
    assert batch["gradients/rnn/layer_0/t3/MatMul_grad/MatMul_1"] and batch["gradients/AddN_79"]
    assert not batch["rnn/layer_0/kernel"] and not batch["rnn/layer_0/t3/MatMul/ReadVariableOp"]
    assert not any(batch[n] for n in rnnlm.names if n.startswith("train/"))
    assert all(op.batch is not None for op in rnnlm.ops)
    # the per-time-step weight gradients are what AddN_79 sums: partials, whole per slice
    parts = partial_tensors(rnnlm)
    assert "gradients/rnn/layer_0/t3/MatMul_grad/MatMul_1:0" in parts
    assert "rnn/layer_0/t3/MatMul:0" not in parts


def test_keras_marks_leave_batch_norm_in_the_model(resnet):
    assert optimizer_scopes(resnet) == {"sgd_1_1"}
    writes = [op for op in resnet.ops if op.type == "AssignVariableOp" and op.scope.startswith("resnet50_1")]
    assert writes and not any(op.batch for op in writes)            # moving averages: once per step
    convs = [op for op in resnet.ops if op.type == "Conv2D"]
    assert convs and all(op.batch for op in convs)
    assert data_inputs(resnet) == ["x", "y"]                        # captured variables are no inputs
    assert not any(op.batch for op in resnet.ops if op.persistent_bytes)


def test_backward_is_the_gradient_scopes_and_what_follows(rnnlm):
    back = backward_ops(rnnlm)
    assert all(n in back for n in rnnlm.names if n.startswith("gradients/"))
    assert not any(n in back for n in rnnlm.names if n.startswith(("rnn/", "embed/", "loss/")))
    assert "train/update_rnn/layer_0/kernel/ResourceApplyAdam" in back


def test_zoo_split_keeps_the_step_at_one_slice(rnnlm):
    one = split_step(rnnlm, 1).graph
    assert one.num_ops == rnnlm.num_ops and one.total_work() == pytest.approx(rnnlm.total_work())
    four = split_step(rnnlm, 4).graph
    batched = sum(op.compute["GPU"] for op in rnnlm.ops if op.batch)
    assert four.total_work() > rnnlm.total_work() - batched      # copies add up to at least t / M each


def test_existing_marks_are_kept():
    g = OpGraph.from_edges({"x": 1, "y": 1}, [("x", "y", 8)])
    g = OpGraph([replace(g.op("x"), type="Placeholder"), replace(g.op("y"), batch=False)], g.edges, g.tensors)
    assert [op.batch for op in infer_batch_marks(g).ops] == [True, False]


def test_errors_name_the_fix():
    g = OpGraph([Op("a", {"GPU": 1.0}, type="MatMul")], name="noinput")
    with pytest.raises(BatchMarkError, match="no data input found.*pass inputs="):
        infer_batch_marks(g)
    with pytest.raises(BatchMarkError, match="no op named as a data input: 'nope'"):
        infer_batch_marks(g, inputs=["nope"])
    assert infer_batch_marks(g, inputs=["a"]).op("a").batch is True
    with pytest.raises(InvalidGraphError, match=r"no op under a gradient scope.*loss="):
        backward_ops(g)
    with pytest.raises(InvalidGraphError, match="loss op 'l' is not in graph"):
        backward_ops(g, loss="l")


def test_step_ops_include_every_variable_write_and_variable():
    ops = [Op("v", {"GPU": 0.0}, persistent_bytes=4, type="VarHandleOp"),
           Op("m/assign", {"GPU": 1.0}, type="AssignVariableOp"), Op("m/f", {"GPU": 1.0}, type="Relu")]
    assert step_ops(OpGraph(ops)) == {"v", "m/assign"}
