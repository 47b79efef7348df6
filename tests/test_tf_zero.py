"""ZeRO plans run in TensorFlow (issue 30, item 4: sharded optimizer state).

A data-parallel plan with a sharded optimizer (``Strategy(shard_optimizer=1|2)``,
:func:`pesto.step.replicate`: reduce-scatter, each replica updates its ``1 / R``
shard, the updated parameters all-gathered) is carried onto TF's replicated step
(:func:`tf_patch.replicastep.replicate_graph` with ``shard_optimizer``): each
replica runs the optimizer update on its piece of every variable only, with
piece slots, and trains with the unsharded replicated step's losses and weights
(and the single-device step's). Models are tiny; no timing is asserted.
"""
import dataclasses
import os
import re

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from keras_blocks import attention_block  # noqa: E402
from pesto.api import marked as with_marks  # noqa: E402
from pesto.errors import MicroBatchError  # noqa: E402
from pesto.solvelog import SolveLog  # noqa: E402
from solver.parallel.realise import realise  # noqa: E402
from solver.parallel.strategy import Strategy  # noqa: E402
from tf_patch.replicastep import chunk_sizes, replicate_model, replica_zero  # noqa: E402
from tf_patch.slicemap import result_view  # noqa: E402
from tf_patch.workflow import PlacedRun  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf

TINY = dict(layers=1, units=16, batch=8, steps=3, vocab=50, optimizer="adam", lr=0.01)


def _solved(graph, replicas, shard, cluster=None, recompute=False):
    """The data-parallel plan (ZeRO-``shard``, recomputing or not) as the search returns it (it
    won), its savers in the log."""
    r = realise(with_marks(graph), cluster or pesto.gpus(replicas, beta=(0.0, 1e-9)),
                Strategy(replicas=replicas, shard_optimizer=shard, recompute=recompute))
    steps = {f"data-parallel M=1 {r.strategy.savers}".strip(): r.plan.makespan, "M=1": 2 * r.plan.makespan}
    log = SolveLog(recipe="step search", graph_kind="replicated", replicas=replicas, savers=r.strategy.savers,
                   steps=steps)
    return dataclasses.replace(r, plan=r.plan.replace(log=log))


def _train(model, plan, devices, steps=4):
    with PlacedRun(lambda: model, plan, n_devices=devices) as run:
        losses = run.train(steps)
        seen = run.trace()
        g = run.model.graph
        with g.as_default():
            reads = {h: tf.raw_ops.ReadVariableOp(resource=g.get_tensor_by_name(h + ":0"),
                                                  dtype=g.get_operation_by_name(h).get_attr("dtype"))
                     for h in _handles(g)}
        values = run.sess.run(reads)
    return losses, seen, values


def _handles(graph):
    return [op.name for op in graph.get_operations() if op.type == "VarHandleOp"]


@pytest.mark.parametrize("replicas, level", [(2, 1), (4, 2)])
def test_a_zero_plan_trains_as_the_unsharded_replicated_step(replicas, level):
    """ZeRO-1 and ZeRO-2 build the same TF step (TF frees the gradient outside the shard either way)."""
    whole = build_model("rnnlm", "small", **TINY)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    runs = {}
    for shard in (0, level):
        result = result_view(_solved(graph, replicas, shard))   # ZeRO is a saver TF builds
        model, plan, rmap = replicate_model(build_model("rnnlm", "small", micro_batches=replicas, **TINY), result)
        runs[shard] = (*_train(model, plan, replicas), model, rmap)
    (plain, _, before, _, _), (losses, seen, after, model, rmap) = runs[0], runs[level]
    with PlacedRun(lambda: build_model("rnnlm", "small", **TINY), None, n_devices=1) as run:
        single = run.train(4)
    np.testing.assert_allclose(losses, plain, rtol=1e-6)
    np.testing.assert_allclose(losses, single, rtol=1e-5)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 100
    assert set(seen["devices"].values()) == {f"/CPU:{k}" for k in range(replicas)}
    # the weights after 4 steps: every replica's equal to the unsharded step's
    weights = [h for h in before if h.startswith("rep") and h in after]
    assert len(weights) >= replicas * len(whole.graph.get_collection("trainable_variables"))
    for h in weights:
        np.testing.assert_allclose(after[h], before[h], rtol=1e-5, atol=1e-7, err_msg=h)
    ops = {op.name: op for op in model.graph.get_operations()}
    # each replica updates a piece of each dense variable, with piece slots: no whole update, no whole slots
    dense = [n for n, op in ops.items() if op.type == "ResourceApplyAdam"]
    assert dense and all(n.startswith("allreduce/") and n.endswith("/update") for n in dense)
    whole_slots = {n for n in ops if n.startswith("rep") and "/Adam" in n and ops[n].type == "VarHandleOp"}
    assert not whole_slots   # the sparse gradient's too: each replica updates its rows (ceil(50 / R))
    rows = [n for n in ops if "/embed/embedding/r" in n and n.endswith("/slot_1") and ops[n].type == "VarHandleOp"]
    assert len(rows) == replicas and {tuple(after[n].shape) for n in rows} <= {(-(-50 // replicas), 16),
                                                                               (50 - 3 * 13, 16)}
    assert not any(op.type.startswith("ResourceScatter") and n.startswith("rep") for n, op in ops.items())
    kernel = before["rep0/rnn/layer_0/kernel"].size
    pieces = [n for n in ops if n.endswith("rnn/layer_0/kernel/slot_1")]
    assert len(pieces) == replicas
    assert {after[n].size for n in pieces} <= {-(-kernel // replicas), kernel % replicas}
    # Pesto's shard updates and slots map onto those pieces; only the inputs TF splits once stay unmapped
    update = "train/update_rnn/layer_0/kernel/ResourceApplyAdam@r1"
    assert rmap.ops[update][0].endswith("/update") and rmap.ops[update][0] in ops
    assert {n.split("@")[0] for n in rmap.unmapped_pesto} <= {"inputs", "targets"}
    assert any(n.endswith("@allgather@r0") for n in rmap.ops)
    # replica 0 under the split step's names: what a later plan starts from
    assert set(replica_zero(after)) >= {"rnn/layer_0/kernel", "softmax/w"}


def test_result_view_accepts_a_sharded_optimizer_alone_and_with_recomputation():
    class R:
        graph, micro_batches, replicas, graph_kind = None, 1, 2, "replicated"

        def __init__(self, savers):
            self.plan = type("P", (), {"log": SolveLog(recipe="step search", savers=savers)})()

    assert result_view(R("ZeRO-1")).replicas == 2 and result_view(R("ZeRO-2")).replicas == 2
    assert result_view(R("ZeRO-2 recompute")).replicas == 2   # built: tests/test_tf_savers.py


def test_a_keras_optimizer_update_of_several_ops_cannot_be_sharded():
    """A Keras 3 optimizer updates a variable with several ops (not one ResourceApply*):
    refused, naming the variable, before anything is built."""
    tf.keras.utils.set_random_seed(0)
    model, x = attention_block(batch=8, seq=6, width=8, classes=3)
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.5), x, y, n_devices=2)
    result = _solved(step.graph, 2, 1)
    with pytest.raises(MicroBatchError, match="sharded optimizer \\(ZeRO\\) needs each dense gradient read by one"):
        step.apply(result)
    step.close()


@pytest.mark.parametrize("level, recompute", [(1, False), (2, True)])
def test_demo_auto_trains_a_zero_winner(capsys, monkeypatch, level, recompute):
    """The demo's ``auto`` path (profile, solve, carry, place, train) with a ZeRO-1 winner, and a
    ZeRO-2 one that recomputes (``recompute_replicated`` on the sharded step; forced: the
    zoo's presets fit memory)."""
    from tf_patch import demo

    def zero(graph, cluster, **_):
        return _solved(graph, 2, level, cluster, recompute)

    monkeypatch.setattr(demo, "solve_step", zero)
    assert demo.main(["--model", "rnnlm", "--preset", "small", "--micro-batches", "auto", "--time-limit", "1",
                      "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "carried onto TF's replicated step" in out and "trace: 0 ops off-plan, 0/" in out
    assert out.count("equal within 1e-05 relative") == 2 and "NOT EQUAL" not in out


def test_the_search_screens_no_zero_plan_for_a_keras_optimizer_tf_cannot_shard():
    """A Keras 3 optimizer's update (several ops) is marked ``unshardable`` by the front end,
    so the search keeps ZeRO out (every plan it picks runs in TF); a graph-mode zoo step's
    ``ResourceApply*`` updates stay shardable."""
    from pesto.step.marks import shardable
    from tf_patch.marks import mark_step

    tf.keras.utils.set_random_seed(0)
    model, x = attention_block(batch=8, seq=6, width=8, classes=3)
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = tf_patch.keras_step(model, loss, tf.keras.optimizers.SGD(0.5), x, y, n_devices=2)
    assert not shardable(with_marks(step.graph))
    r = pesto.solve_step(step.graph, cluster=pesto.gpus(2), micro_batches="auto", batch_size=8, time_limit=3,
                         workers=1)
    assert not any("ZeRO" in name for name in r.plan.log.steps), r.plan.log.steps
    step.close()
    from pathlib import Path
    zoo = pesto.OpGraph.from_json(str(Path(__file__).resolve().parents[1] / "benchmarks/graphs/transformer_6.json.gz"))
    assert shardable(mark_step(zoo))
    # v1 SGD's sparse update (the embedding's rows negated, scaled, scatter-added): sharded by rows
    sgd = build_model("rnnlm", "small", **{**TINY, "optimizer": "sgd"})
    assert shardable(tf_patch.opgraph(sgd.graph, sgd.fetches, "v100", on_unknown="ignore")[0])


def test_a_zero3_plan_trains_as_the_unsharded_replicated_step():
    """ZeRO-3 (FSDP): each replica holds a piece of every dense variable; its reads are the
    concatenation of every replica's piece, one for the forward and one for the backward
    readers; the update writes the replica's piece only, no whole variable is written."""
    replicas = 2
    whole = build_model("rnnlm", "small", **TINY)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    runs = {}
    for shard in (0, 3):
        result = result_view(_solved(graph, replicas, shard))
        model, plan, rmap = replicate_model(build_model("rnnlm", "small", micro_batches=replicas, **TINY), result)
        runs[shard] = (*_train(model, plan, replicas), model, rmap)
    (plain, _, before, _, _), (losses, seen, after, model, rmap) = runs[0], runs[3]
    np.testing.assert_allclose(losses, plain, rtol=1e-6)
    assert seen["misplaced"] == [] and seen["order_violations"] == []
    ops = {op.name: op for op in model.graph.get_operations()}
    # the slices read the gathered pieces: forward and backward concatenations per replica
    kernel = "rnn/layer_0/kernel"
    assert any(n.startswith(f"zero3/r1/{kernel}/forward") for n in ops)
    assert any(n.startswith(f"zero3/r1/{kernel}/backward") for n in ops)
    assert not any(op.type == "AssignVariableOp" and n.endswith("/assign") for n, op in ops.items())
    # no replica holds a whole variable (the embedding's too: a lookup gathers its rows' pieces), only Adam's
    # scalars; each piece is placed on its replica's device
    whole_vars = {n for n, op in ops.items() if op.type == "VarHandleOp" and n.startswith("rep")}
    assert whole_vars == {f"rep{r}/beta{k}_power" for r in range(replicas) for k in (1, 2)}
    assert any(op.type == "GatherV2" and op.inputs[0].op.name.startswith("zero3/r1/embed/embedding/forward")
               for op in ops.values())
    # the weights after 4 steps, joined from the pieces (replica r holds piece (r + 1) mod R), equal
    # the unsharded step's
    for name in (kernel, "softmax/w"):
        pieces = {int(n.split("/r")[1].split("/")[0]): n for n in after if n.endswith(f"/{name}/param")}
        assert len(pieces) == replicas, (name, sorted(after))
        joined = np.concatenate([np.reshape(after[pieces[(c - 1) % replicas]], [-1]) for c in range(replicas)])
        np.testing.assert_allclose(joined, np.reshape(before[f"rep0/{name}"], [-1]), rtol=1e-5, atol=1e-7)
    # Pesto's gathers map onto the concatenations
    assert any(k.endswith("@fwgather@r1") for k in rmap.ops) and any(k.endswith("@bwgather@r0") for k in rmap.ops)


def _resident(model, plan, values) -> dict:
    """Bytes of the TF step's variables per device of ``plan`` (their values after training: a
    ZeRO-1/2 update's transient parameter piece is empty between steps)."""
    out: dict[str, int] = {}
    for op in model.graph.get_operations():
        if op.type == "VarHandleOp":
            assert op.name in plan.placement, op.name   # every variable placed by the plan
            out[plan.placement[op.name]] = out.get(plan.placement[op.name], 0) + values[op.name].nbytes
    return out


@pytest.mark.parametrize("replicas, level, optimizer", [(2, 0, "adam"), (2, 1, "adam"), (2, 2, "adam"),
                                                        (2, 3, "adam"), (4, 3, "adam"), (2, 3, "sgd"),
                                                        (2, 1, "sgd")])
def test_each_replica_holds_the_variables_pestos_memory_model_counts(replicas, level, optimizer):
    """The bytes of the variables resident on each replica's device (every ``VarHandleOp``'s value
    after two steps, on its device in the TF plan) equal Pesto's persistent bytes of the same plan
    on that device (its replicated graph's ops' ``persistent_bytes``): ZeRO-1/2 whole weights and
    ``1 / R`` of the optimizer state (the embedding's, a sparse gradient's, by rows), ZeRO-3 ``1 / R``
    of both (no whole variable anywhere). Tolerance, both stated: Adam's two scalar accumulators
    (``beta1_power``, ``beta2_power``), which the model shards as optimizer state (``ceil(4 / R)``
    bytes) and TF keeps whole in each replica; and for ``R = 4`` the pieces' rounding: TF cuts a
    variable into ``ceil(n / R)`` elements (an embedding ``ceil(rows / R)`` rows) and a smaller last
    piece, the model counts ``ceil(bytes / R)`` each, so a replica differs by at most ``R - 1`` rows
    (elements; an embedding row is 16 floats here, the widest) per variable; summed over the
    replicas they agree but for the scalars. With SGD (no slots; the embedding's update one
    scatter-add) as with Adam, the losses stay the single-device step's."""
    tiny = {**TINY, "optimizer": optimizer}
    whole = build_model("rnnlm", "small", **tiny)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    result = _solved(graph, replicas, level)
    counted: dict[str, int] = {}
    for op in result.graph.ops:
        if op.persistent_bytes:
            d = result.plan.placement[op.name]
            counted[d] = counted.get(d, 0) + op.persistent_bytes
    model, plan, _ = replicate_model(build_model("rnnlm", "small", micro_batches=replicas, **tiny),
                                     result_view(result))
    losses, seen, values = _train(model, plan, replicas, steps=2)
    assert seen["misplaced"] == []
    with PlacedRun(lambda: build_model("rnnlm", "small", **tiny), None, n_devices=1) as run:
        np.testing.assert_allclose(losses, run.train(2), rtol=1e-5)
    held = _resident(model, plan, values)
    assert sorted(held) == sorted(counted) == [f"/GPU:{k}" for k in range(replicas)]
    scalars = 0 if level == 0 or optimizer == "sgd" else 2 * (4 - -(-4 // replicas))
    variables = len([op for op in result.graph.ops if op.persistent_bytes and op.name.endswith("@r0")])
    rounding = 0 if replicas == 2 else variables * (replicas - 1) * 16 * 4   # R = 2: every size is even
    for d in counted:
        assert abs(held[d] - scalars - counted[d]) <= rounding, (d, held[d], counted[d])
    assert sum(held.values()) - replicas * scalars == sum(counted.values())
    if level == 3:   # what ZeRO-3 saves is there: a replica holds about 1 / R of the step's variables
        assert max(held.values()) < 1.1 * sum(op.persistent_bytes for op in graph.ops) / replicas


def test_a_sparse_update_read_elsewhere_cannot_be_sharded_by_rows():
    """A sparse gradient's update is sharded by rows only when its ops are waited for, not read,
    outside it (a replica's copy works on its rows only): refused, naming the variable."""
    from tf_patch.replicastep import replicate_graph, variable_values

    model = build_model("rnnlm", "small", micro_batches=2, **TINY)
    with model.graph.as_default():
        rows = tf.identity(model.graph.get_tensor_by_name("train/update_embed/embedding/Unique:0"), name="rows_seen")
    fetches = [model.loss.name, model.train_op.name, rows.op.name]
    values = variable_values(model.graph, model.init_op, fetches)
    replicate_graph(model.graph, fetches, 2, values=values)   # unsharded: built
    with pytest.raises(MicroBatchError, match="shards a sparse gradient's update by rows") as err:
        replicate_graph(model.graph, fetches, 2, values=values, shard_optimizer=1)
    assert err.value.culprit == "embed/embedding" and "rows_seen" in str(err.value)


def test_a_zero1_plan_summing_in_place_trains_as_the_unsharded_replicated_step():
    """ZeRO-1 on the in-place split (R=2, M=2, weight_grads="accumulate": the slices'
    weight gradients summed in place, then reduce-scattered), what the search now
    builds its ZeRO-1 and bucket twins on when the in-place split is the faster:
    TF's replicated step runs it with every op where the plan puts it, and trains
    as the un-split step does."""
    from solver.parallel.strategy import Strategy as S

    whole = build_model("rnnlm", "small", **TINY)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    r = realise(with_marks(graph), pesto.gpus(2, beta=(0.0, 1e-9)),
                S(replicas=2, micro_batches=2, weight_grads="accumulate", shard_optimizer=1))
    # no add: the dense gradients summed in place; the embedding's rows and indices concatenated (as TF does)
    joins = [n for n in r.graph.names if "@acc" in n]
    assert joins and all(r.graph.op(n).type == "Concat" and "embedding_lookup_grad" in n for n in joins)
    assert any(n.endswith("@allgather@r0") for n in r.graph.names)
    log = SolveLog(recipe="step search", graph_kind="replicated", replicas=2, micro_batches=2, savers="ZeRO-1",
                   steps={"data-parallel M=2 accumulate ZeRO-1": r.plan.makespan})
    result = result_view(dataclasses.replace(r, plan=r.plan.replace(log=log)))
    assert result.in_place   # read from the plan's graph: every weight gradient's copy 1 reads copy 0's sum
    model, plan, rmap = replicate_model(build_model("rnnlm", "small", micro_batches=4, **TINY), result)
    losses, seen, _ = _train(model, plan, 2)
    assert any("/acc_1" in t for ts in rmap.ops.values() for t in ts)
    with PlacedRun(lambda: build_model("rnnlm", "small", **TINY), None, n_devices=1) as run:
        single = run.train(4)
    np.testing.assert_allclose(losses, single, rtol=1e-5)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 100


def _received_tf(model, plan, r, targets):
    """Bytes TF's replicated step moves into replica ``r``'s device for the ops ``targets``
    (op name -> whether it is replica ``r``'s): each input produced on another device (static shapes)."""
    dev = f"/GPU:{r}"
    total = 0
    for name in targets:
        op = model.graph.get_operation_by_name(name)
        assert plan.placement[name] == dev, name
        for t in op.inputs:
            if plan.placement.get(t.op.name, dev) == dev:
                continue
            if t.shape.is_fully_defined():
                total += t.shape.num_elements() * t.dtype.size
            else:   # a replica k's updated rows (a transient piece variable's read): chunk (k + 1) mod R of 50
                k = int(re.fullmatch(r"allreduce/\d+/embed/embedding/r(\d+)/updated", t.op.name).group(1))
                replicas = len({d for d in plan.placement.values()})
                total += chunk_sizes(50, replicas)[(k + 1) % replicas] * t.shape[1] * t.dtype.size
    return total


@pytest.mark.parametrize("replicas, level", [(2, 0), (4, 0), (2, 1), (4, 1)])
def test_the_model_moves_the_embedding_s_bytes_tensorflow_moves(replicas, level):
    """An embedding's sparse gradient: the bytes Pesto's replicated graph sends into each replica
    for it (its ring steps' inputs from another device) equal what TF's replicated step sends
    into that replica's device for it (the inputs of its concatenations of every replica's rows and
    indices, ``allgather/<k>/r<r>/``; ZeRO-1: and of its variable's updated row pieces,
    ``.../r<r>/whole``): ``(R - 1)`` times a replica's rows, plus ``(R - 1) / R`` of the variable
    under ZeRO-1 (50 rows: a replica's piece is ``ceil(50 / R)`` rows in TF, ``ceil(bytes / R)``
    in the model: equal for R = 2, at most R - 1 rows apart for R = 4)."""
    whole = build_model("rnnlm", "small", **TINY)
    graph, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100", on_unknown="ignore")
    result = _solved(graph, replicas, level)
    sparse = [n for n in result.graph.names if re.match(r".*embedding_lookup_grad/Reshape(_1)?:0@(ag|pg)\d+@r\d+$", n)]
    assert sparse and not [n for n in result.graph.names if "embedding_lookup_grad" in n and "@rs" in n]
    model, plan, _ = replicate_model(build_model("rnnlm", "small", micro_batches=replicas, **TINY),
                                     result_view(result))
    names = [op.name for op in model.graph.get_operations()]
    row = 16 * 4
    for r in range(replicas):
        pl = result.plan.placement
        mine = [n for n in sparse if n.endswith(f"@r{r}")]
        pesto_bytes = sum(result.graph.tensor(t).bytes for n in mine for p in result.graph.predecessors(n)
                          if pl[p] != pl[n] for t in result.graph.edge(p, n).tensors)
        targets = [n for n in names if re.fullmatch(rf"allgather/\d+/r{r}/embed/embedding/[vi]", n)
                   or (level and re.fullmatch(rf"allreduce/\d+/embed/embedding/r{r}/whole", n))]
        assert len(targets) == 2 + (level > 0)
        tf_bytes = _received_tf(model, plan, r, targets)
        assert abs(pesto_bytes - tf_bytes) <= (0 if replicas == 2 or not level else (replicas - 1) * row), \
            (r, pesto_bytes, tf_bytes)
    # the rows move (R - 1) times a replica's share, not an all-reduce's 2 (R - 1)
    from pesto.step.slicing import sparse_partials

    rows = sum(graph.tensor(t).bytes for t in sparse_partials(with_marks(graph)))
    assert rows and tf_bytes >= (replicas - 1) * rows // replicas
