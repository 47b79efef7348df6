"""One graph for solving and running (issue 31, item 2).

A micro-batched plan of ``pesto.solve_step`` applied to a Keras step is
solved on the split step TF traces (its ops costed at the micro-batch size),
Pesto's plan mapped onto it as the hint, and enforced 1:1: every TF op
placed, 0 ops off-plan, the un-split step's losses, and a plan
``pesto.check_plan`` accepts on that traced graph. Models are tiny; no timing
is asserted. ``micro_batches="auto"``'s split counts are re-scored on the
split steps TF traces, and the choice follows those figures.
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
from tf_patch.workflow import contended  # noqa: E402
from tf_patch.slicemap import rescore_split, result_view  # noqa: E402

from keras_blocks import attention_block, convnext_like, lstm_gru  # noqa: E402

pytestmark = pytest.mark.tf

CLUSTER = pesto.gpus(2, beta=(0.0, 1e-9))


def _cnn():
    return convnext_like(batch=8, size=16, width=4, classes=3)


def _attention():
    return attention_block(batch=8, seq=6, width=8, classes=3)


def _rnn():
    return lstm_gru(batch=8, steps=5, features=4, lstm=8, gru=6, classes=3)


def _keras(family):
    """The un-split Keras step of ``family`` (SGD, 3 classes, batch 8), and a
    function tracing it again in ``m`` slices."""
    tf.keras.utils.set_random_seed(0)
    model, x = family()
    y = tf.random.uniform((8,), 0, 3, dtype=tf.int32, seed=2)
    loss, opt = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), tf.keras.optimizers.SGD(0.1)
    return (tf_patch.keras_step(model, loss, opt, x, y),
            lambda m: tf_patch.keras_step(model, loss, opt, x, y, micro_batches=m))


def _micro_batched(step_graph, m):
    """``pesto.solve_step``'s result for ``m`` micro-batches, the micro-batched
    plan itself (not a data-parallel winner)."""
    result = pesto.solve_step(step_graph, cluster=CLUSTER, micro_batches=m, batch_size=8, time_limit=2, workers=1)
    view = result_view(result)
    if view.graph_kind != "micro-batched":
        split = split_step(step_graph, m).graph
        view = type(view)(pesto.solve(split, cluster=CLUSTER, time_limit=2, workers=1), split, m, 1, "micro-batched")
    return view


@pytest.mark.parametrize("family", [_cnn, _attention, _rnn], ids=["cnn", "attention", "rnn"])
def test_a_micro_batched_plan_is_solved_on_tf_s_split_step_and_runs_1_to_1(family):
    step, _ = _keras(family)
    whole = step.run(2)
    step.reset()
    result = _micro_batched(step.graph, 2)
    step.apply(result, cluster=CLUSTER, time_limit=2)
    assert step.micro_batches == 2
    placed = step.placed
    assert set(placed.plan.placement) == set(step.graph.names)      # 1:1: every TF op has its device
    def index(placement):    # the plan's /GPU:k runs on this machine's /GPU:k or logical /CPU:k
        return {n: d.rsplit(":", 1)[-1] for n, d in placement.items()}

    moved = {op for op, _, _ in step.applied.moved}   # oneDNN's fused pairs kept whole on logical CPUs
    assert {n: d for n, d in index(step.applied.plan.placement).items() if n not in moved} == \
        {n: d for n, d in index(placed.plan.placement).items() if n not in moved}
    assert placed.plan.makespan <= placed.hint.makespan + 1e-6
    report = pesto.check_plan(step.graph, CLUSTER, placed.plan)
    assert report.ok, str(report)
    np.testing.assert_allclose(step.run(2), whole, rtol=1e-6)
    seen = step.check()
    assert seen["misplaced"] == [] and seen["order_violations"] == [] and seen["checked_edges"] > 0
    step.close()


def test_auto_s_split_counts_are_rescored_on_the_traced_split_steps():
    step, again = _keras(_attention)
    result = pesto.solve_step(step.graph, cluster=CLUSTER, micro_batches="auto", batch_size=8, time_limit=6,
                              workers=1)
    traced = {}

    def trace(m):
        traced[m] = again(m).graph
        return traced[m]

    r = rescore_split(result, step.graph, trace, CLUSTER, top=2, time_limit=1)
    assert r.rows and {row.micro_batches for row in r.rows} == set(traced) and 1 not in traced
    for row in r.rows:
        assert row.graph is traced[row.micro_batches] and row.traced == row.plan.makespan
        assert set(row.plan.placement) == set(row.graph.names)
        assert pesto.check_plan(row.graph, CLUSTER, row.plan).ok
    estimated = [row for row in r.rows if row.estimate == row.estimate]
    assert estimated and any(abs(row.traced - row.estimate) > 1e-3 * row.estimate for row in estimated)
    figures = {f"M={row.micro_batches}": row.traced for row in r.rows}
    mine = r.replicated and result_view(result).graph_kind == "replicated"   # a replicated plan at hand
    figures.update({"M=1": r.unsplit, **dict([r.replicated] if mine else [])})
    assert r.best == min(figures, key=figures.get)
    table = r.table().splitlines()
    for row in r.rows:   # compute/M next to the traced figure
        line = next(t for t in table if t.split()[0] == f"M={row.micro_batches}")
        assert f"{row.estimate / 1000:.3f}" in line and f"{row.traced / 1000:.3f}" in line
    # the choice follows the traced figures: split steps that trace 100x dearer are not chosen
    dear = rescore_split(result, step.graph, lambda m: contended(traced[m], 100.0), CLUSTER, top=2, time_limit=1)
    assert not dear.best.startswith("M=") or dear.best == "M=1", dear.table()
    assert all(row.traced > 50 * r.unsplit for row in dear.rows)


def test_function_examples_run():
    from tf_patch import function

    result = doctest.testmod(function)
    assert result.attempted >= 1 and result.failed == 0


def test_a_replicated_figure_without_its_plan_is_shown_not_chosen():
    # auto's winner was a split count; Pesto's data-parallel figure (no plan at hand to
    # train) is shown beside the traced figures but the choice is among plans it has
    from types import SimpleNamespace
    from pesto.solvelog import SolveLog
    g = pesto.OpGraph.from_edges({"a": 10.0, "b": 10.0}, [("a", "b")])
    plan = pesto.evaluate(g, {"a": "/GPU:0", "b": "/GPU:0"}, cluster=CLUSTER)
    log = SolveLog(recipe="step search", steps={"M=1": 30.0, "M=2": 20.0, "data-parallel": 1.0})
    result = SimpleNamespace(plan=plan.replace(log=log), graph=g, micro_batches=2, replicas=1,
                             graph_kind="micro-batched")
    r = rescore_split(result, g, lambda m: g, CLUSTER, top=0, time_limit=1)
    assert r.replicated == ("data-parallel", 1.0) and r.best == "M=1" and "data-parallel" in r.table()
