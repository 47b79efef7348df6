"""A plan of ``pesto.solve(micro_batches=M)`` enforced on TensorFlow's split step (issue 24, item 7).

Pesto splits the un-split step itself (``op@mb<i>``, ``t@acc<k>``);
TensorFlow builds its own split step (``mb<i>/...``). The name map must
account for every TF op (mapped or listed), the mapped plan must train the
TF split step with 0 ops off-plan and the un-split step's losses, and the
demo's ``--micro-batches auto`` must say which M it chose. Models are tiny;
no timing is asserted.
"""
import doctest
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tf_patch  # noqa: E402  (loads OR-Tools before TensorFlow)

tf = pytest.importorskip("tensorflow")

import pesto  # noqa: E402
from pesto.step import split as split_step  # noqa: E402
from pesto.step.slicing import parse_name, sparse_partials  # noqa: E402
from tf_patch import slicemap  # noqa: E402
from tf_patch.microstep import slice_of  # noqa: E402
from tf_patch.workflow import PlacedRun  # noqa: E402
from tf_patch.slicemap import mapped_hint, place_split, result_view, slice_map  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf

TINY = dict(layers=1, units=16, batch=8, steps=3, vocab=50, optimizer="sgd", lr=0.5)
#: the TF ops of a split step that no op of Pesto's split is: the input splits, the loss sum,
#: each slice's loss scaling and its gradient, the sparse sums' concat axes
TF_ONLY = ("microbatch/", "/scaled_loss", "accumulate/embed/embedding/values/axis",
           "accumulate/embed/embedding/indices/axis")


def _build(m):
    return lambda: build_model("rnnlm", "small", micro_batches=m, **TINY)


@pytest.fixture(scope="module")
def graphs():
    """The un-split step and TF's 2-slice step, grappler V100 costs."""
    whole, split = _build(1)(), _build(2)()
    step, _ = tf_patch.opgraph(whole.graph, whole.fetches, "v100")
    tf_split, _ = tf_patch.opgraph(split.graph, split.fetches, "v100")
    return step, tf_split


def test_every_tf_op_of_the_split_step_is_mapped_or_listed(graphs):
    step, tf_split = graphs
    kept = split_step(step, 2)
    pesto_split = kept.graph
    m = slice_map(step, pesto_split.names, tf_split, 2)
    assert slice_map(step, kept.origin, tf_split, 2) == m   # the kept transform's origins: the same map
    mapped = {t for ts in m.ops.values() for t in ts}
    assert mapped | set(m.unmapped_tf) == set(tf_split.names) and not mapped & set(m.unmapped_tf)
    assert set(m.ops) | set(m.unmapped_pesto) == set(pesto_split.names)
    assert m.unmapped_pesto == ()
    assert m.unmapped_tf and all(any(k in t for k in TF_ONLY) for t in m.unmapped_tf), m.unmapped_tf
    for name, ts in m.ops.items():
        origin = parse_name(name)
        if origin.role == "copy" and not step.op(origin.op).type == "Placeholder":
            assert ts == (ts[0],) and slice_of(ts[0]) == origin.slice, (name, ts)
            assert tf_split.op(ts[0]).type == step.op(origin.op).type, (name, ts)
        elif origin.role == "accumulate":
            assert ts[0].startswith("accumulate/"), (name, ts)
    assert f"{len(m.unmapped_tf)} TF ops with no Pesto op" in m.summary()


def test_a_sparse_gradient_s_slices_weigh_what_tensorflow_s_do(graphs):
    """The embedding's ``IndexedSlices``: each slice's rows and indices in Pesto's split weigh
    what TF's split step makes for that slice (a slice's tokens' rows: half of them), and their
    one concatenation what TF's ``accumulate/<variable>/values`` and ``/indices`` output."""
    step, tf_split = graphs
    kept = split_step(pesto.api.marked(step), 2)
    m = slice_map(step, kept.origin, tf_split, 2)
    sparse = sorted(sparse_partials(pesto.api.marked(step)))
    assert len(sparse) == 2   # rows and indices

    def tf_bytes(pesto_op, index):
        tf_op, = m.ops[pesto_op]
        return tf_split.tensor(f"{tf_op}:{index}").bytes, tf_op

    for t in sparse:
        op, index = t.rsplit(":", 1)
        for i in range(2):
            b, tf_op = tf_bytes(f"{op}@mb{i}", index)
            assert kept.graph.tensor(f"{t}@mb{i}").bytes == b and slice_of(tf_op) == i
        b, tf_op = tf_bytes(f"{t}@acc1", 0)
        assert kept.graph.tensor(f"{t}@acc1").bytes == b == step.tensor(t).bytes
        assert tf_op.startswith("accumulate/embed/embedding/") and tf_split.op(tf_op).type == "ConcatV2"


def test_the_hint_keeps_the_mapped_devices_and_colocation_groups(graphs):
    step, tf_split = graphs
    pesto_split = split_step(step, 2).graph
    m = slice_map(step, pesto_split.names, tf_split, 2)
    origins = {n: parse_name(n) for n in pesto_split.names}  # slice 1's copies on GPU:1, the rest on GPU:0
    placement = {n: f"/GPU:{o.slice if o.role == 'copy' else 0}" for n, o in origins.items()}
    mapped = m.placement(placement)
    hint = mapped_hint(mapped, tf_split, "/GPU:0")
    assert set(hint) == set(tf_split.names)
    grouped = {op.name for op in tf_split.ops if op.colocation_group is not None}
    assert all(hint[t] == d for t, d in mapped.items() if t not in grouped)
    copies = {t for p, ts in m.ops.items() if origins[p].role == "copy" for t in ts if slice_of(t) == 1}
    assert len(copies) > 50 and {hint[t] for t in copies - grouped} == {"/GPU:1"}
    groups = {}
    for op in tf_split.ops:
        if op.colocation_group is not None:
            groups.setdefault(op.colocation_group, set()).add(hint[op.name])
    assert all(len(d) == 1 for d in groups.values())


def test_pesto_s_micro_batched_plan_trains_the_tf_split_step_placed(graphs):
    step, tf_split = graphs
    cluster = pesto.gpus(2, beta=(0.0, 1e-9))
    result = pesto.solve_step(step, cluster=cluster, micro_batches=2, batch_size=8, time_limit=3, workers=1)
    if result.graph_kind == "replicated":  # the data-parallel plan won: take the split step's own plan
        kept = split_step(step, 2)
        inner = pesto.solve(kept.graph, cluster=cluster, time_limit=2, workers=1)
        result = pesto.api.Solved(inner, kept.graph, pesto.api.Strategy(micro_batches=2, schedule="free"), kept)
    assert result_view(result).origin == result.transformed.origin   # place_split maps by the kept transform
    placed = place_split(result, step, tf_split, cluster, time_limit=2)
    assert placed.slices.unmapped_pesto == ()
    assert placed.plan.makespan <= placed.hint.makespan + 1e-6
    assert len(set(placed.plan.placement.values())) == 2
    whole = _build(1)()
    with tf.compat.v1.Session(graph=whole.graph) as sess:
        sess.run(whole.init_op)
        whole_losses = [float(sess.run(whole.fetches, whole.feed_fn(s))[1]) for s in range(2)]
    with PlacedRun(_build(2), placed.plan, n_devices=2) as run:
        losses = run.train(2)
        seen = run.trace()
    np.testing.assert_allclose(losses, whole_losses, rtol=1e-5)
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 0


def test_a_replicated_plan_is_sent_to_the_replicated_step():
    class Replicated:
        graph_kind, replicas, micro_batches, plan, graph = "replicated", 2, 2, None, None

    with pytest.raises(ValueError, match=r"runs on TF's replicated step.*replicate_model\(build_model\(\.\.\., "
                                         r"micro_batches=4\), result\).*FunctionStep.apply\(result\)"):
        place_split(Replicated(), None, None, None)


def test_slicemap_examples_run():
    assert doctest.testmod(slicemap).failed == 0


@pytest.mark.parametrize("argv, text", [
    (["--micro-batches", "0"], "micro_batches must be an integer >= 1, got 0"),
    (["--micro-batches", "-1"], "micro_batches must be an integer >= 1, got -1"),
    (["--model", "nmt", "--micro-batches", "3"], "micro_batches=3 does not divide the batch of 32 samples"),
    (["--micro-batches", "two"], "expected an integer >= 1 or 'auto', got 'two'"),
    (["--preset", "nope", "--micro-batches", "auto"], "--micro-batches auto needs the batch size"),
])
def test_demo_refuses_bad_micro_batches_by_name(argv, text, capsys):
    from tf_patch import demo

    with pytest.raises(SystemExit) as exc:
        demo.main(argv)
    assert exc.value.code == 2
    assert text in capsys.readouterr().err


def test_demo_auto_prints_each_candidate_and_the_m_it_chose(capsys):
    from tf_patch import demo

    assert demo.main(["--model", "rnnlm", "--preset", "small", "--micro-batches", "auto", "--time-limit", "2",
                      "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "pesto.solve(micro_batches='auto', batch_size=16)" in out
    for m in (1, 2, 4, 8, 16):   # each count's step, or why the 2 s limit left it out
        assert f"M={m} " in out, m
    table = out[out.index("[auto] the best split counts traced as TF runs them"):out.index("[auto] chose ")]
    assert "compute/M" in table and "traced" in table and "best on the traced graphs: " in table, out
    assert "M=1 " in table and "nan" not in table.split("M=1 ", 1)[1].splitlines()[0], table  # the un-split figure
    chosen = [line for line in out.splitlines() if line.startswith("[auto] chose ")]
    assert len(chosen) == 1, out
    assert "trace: 0 ops off-plan" in out
    assert "the chosen plan (" in out and ("the choice lost: measured" in out or "the choice held: measured" in out)
