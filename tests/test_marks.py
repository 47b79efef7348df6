"""Op marks: tf_patch.marks sets them from TensorFlow's names and types (no TensorFlow needed),
pesto.step.marks reads them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pesto.errors import BatchMarkError, InvalidGraphError
from pesto.graph import Op, OpGraph
from pesto.step import anchors, backward_ops, forward_ops, split
from pesto.step.slicing import partial_tensors
from tf_patch.marks import (gradient_ops, input_ops, is_marked, mark_batch, mark_phases, mark_step,
                            optimizer_scopes, update_ops)

GRAPHS = Path(__file__).resolve().parent.parent / "benchmarks" / "graphs"


@pytest.fixture(scope="module")
def rnnlm():
    return mark_step(OpGraph.from_json(GRAPHS / "rnnlm_2x2048.json.gz"))


@pytest.fixture(scope="module")
def resnet():
    return mark_step(OpGraph.from_json(GRAPHS / "keras_resnet50.json.gz"))


def test_rnnlm_marks(rnnlm):
    batch = {op.name: op.batch for op in rnnlm.ops}
    assert input_ops(rnnlm) == ["inputs", "targets"] and optimizer_scopes(rnnlm) == {"train"}
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
    assert input_ops(resnet) == ["x", "y"]                        # captured variables are no inputs
    assert not any(op.batch for op in resnet.ops if op.persistent_bytes)


def test_backward_is_the_gradient_scopes_and_what_follows(rnnlm):
    back = backward_ops(rnnlm)
    assert back == gradient_ops(rnnlm) and not back & forward_ops(rnnlm)
    assert all(n in back for n in rnnlm.names if n.startswith("gradients/"))
    assert not any(n in back for n in rnnlm.names if n.startswith(("rnn/", "embed/", "loss/")))
    assert "train/update_rnn/layer_0/kernel/ResourceApplyAdam" in back


def test_zoo_split_keeps_the_step_at_one_slice(rnnlm):
    one = split(rnnlm, 1).graph
    assert one.num_ops == rnnlm.num_ops and one.total_work() == pytest.approx(rnnlm.total_work())
    four = split(rnnlm, 4).graph
    batched = sum(op.compute["GPU"] for op in rnnlm.ops if op.batch)
    assert four.total_work() > rnnlm.total_work() - batched      # copies add up to at least t / M each


def test_existing_marks_are_kept():
    g = OpGraph.from_edges({"x": 1, "y": 1}, [("x", "y", 8)])
    g = OpGraph([replace(g.op("x"), type="Placeholder"), replace(g.op("y"), batch=False)], g.edges, g.tensors)
    assert [op.batch for op in mark_batch(g).ops] == [True, False]
    g = OpGraph([replace(g.op("x"), phase="weight-grad", anchor="y"), g.op("y")], g.edges, g.tensors)
    assert (mark_step(g).op("x").phase, mark_step(g).op("x").anchor) == ("weight-grad", "y")


def test_errors_name_the_fix():
    g = OpGraph([Op("a", {"GPU": 1.0}, type="MatMul")], name="noinput")
    with pytest.raises(BatchMarkError, match="no data input found.*pass inputs="):
        mark_batch(g)
    with pytest.raises(BatchMarkError, match="no op named as a data input: 'nope'"):
        mark_batch(g, inputs=["nope"])
    assert mark_batch(g, inputs=["a"]).op("a").batch is True
    with pytest.raises(InvalidGraphError, match=r"no op is marked as backward \(Op.phase.*loss="):
        backward_ops(mark_step(g, inputs=["a"]))   # no gradient scope: no phase marks
    with pytest.raises(InvalidGraphError, match="loss op 'l' is not in graph"):
        backward_ops(g, loss="l")


def test_update_ops_include_every_variable_write_and_variable():
    ops = [Op("v", {"GPU": 0.0}, persistent_bytes=4, type="VarHandleOp"),
           Op("m/assign", {"GPU": 1.0}, type="AssignVariableOp"), Op("m/f", {"GPU": 1.0}, type="Relu")]
    assert update_ops(OpGraph(ops)) == {"v", "m/assign"}


def test_phases_anchors_and_roles_of_a_tf_step(rnnlm):
    ops = {op.name: op for op in rnnlm.ops}
    assert ops["rnn/layer_0/t3/MatMul"].phase == "forward" and ops["embed/embedding_lookup"].phase == "forward"
    assert ops["gradients/rnn/layer_0/t3/MatMul_grad/MatMul_1"].phase == "input-grad"
    assert ops["gradients/AddN_79"].phase == "weight-grad" and ops["gradients/AddN_79"].role == "grad-sum"
    assert ops["train/update_rnn/layer_0/kernel/ResourceApplyAdam"].phase == "update"
    assert anchors(rnnlm)["gradients/rnn/layer_0/t3/MatMul_grad/MatMul_1"] == "rnn/layer_0/t3/MatMul"
    assert all(ops[a].phase == "forward" and ops[a].batch for a in anchors(rnnlm).values())
    assert is_marked(rnnlm) and not is_marked(OpGraph.from_json(GRAPHS / "rnnlm_2x2048.json.gz"))


def test_marks_survive_json_and_leave_old_files_alone(rnnlm, tmp_path):
    rnnlm.to_json(str(tmp_path / "g.json"))
    back = OpGraph.from_json(tmp_path / "g.json")
    assert [(o.phase, o.anchor, o.role) for o in back.ops] == [(o.phase, o.anchor, o.role) for o in rnnlm.ops]
    assert back.op("rnn/layer_0/t3/MatMul") == rnnlm.op("rnn/layer_0/t3/MatMul")
    plain = Op("a", {"GPU": 1.0}).to_dict()
    assert not {"phase", "anchor", "role"} & set(plain)   # defaults are not written
    with pytest.raises(InvalidGraphError, match="phase must be one of"):
        OpGraph([Op("a", {"GPU": 1.0}, phase="backward")])
    with pytest.raises(InvalidGraphError, match="role must be one of"):
        OpGraph([Op("a", {"GPU": 1.0}, role="sum")])


def test_a_graph_without_gradient_scopes_gets_no_phase_but_roles():
    g = OpGraph([Op("a", {"GPU": 1.0}, type="AddN"), Op("b", {"GPU": 1.0}, type="MatMul")])
    assert [(o.phase, o.role) for o in mark_phases(g).ops] == [(None, "grad-sum"), (None, "")]


def test_backward_with_a_loss_needs_no_marks():
    g = OpGraph.from_edges({"x": 1, "loss": 1, "d": 1}, [("x", "loss"), ("loss", "d")])
    assert backward_ops(g, loss="loss") == {"d"}


def test_the_solver_reads_marks_and_the_facade_sets_them():
    """The solver never infers marks: it names the unmarked ops; the facade
    (:func:`pesto.api.marked`) marks a TensorFlow-named graph by tf_patch.marks."""
    from pesto.api import marked
    from solver.parallel.search import with_marks
    from solver.parallel.cut import phases

    raw = OpGraph.from_json(GRAPHS / "rnnlm_2x2048.json.gz")
    with pytest.raises(BatchMarkError, match=r"op\(s\) without batch marks") as exc:
        with_marks(raw)
    assert exc.value.ops == [op.name for op in raw.ops if op.batch is None]
    batch_only = OpGraph([replace(op, phase=None, anchor=None) for op in mark_step(raw).ops], raw.edges,
                         raw.tensors, name="batch-only")
    with pytest.raises(InvalidGraphError, match="no op is marked as backward"):
        phases(batch_only)
    done = marked(raw)
    assert is_marked(done) and marked(done) is done
    assert [(o.batch, o.phase, o.anchor, o.role) for o in done.ops] == \
        [(o.batch, o.phase, o.anchor, o.role) for o in mark_step(raw).ops]
