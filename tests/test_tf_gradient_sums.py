"""tf_patch: the colocation tf.gradients gives a gradient sum is not binding.

``tf.gradients`` builds each sum of gradient contributions (``AddN``)
colocated with its first summand's producer; along a residual stream that is
the previous layer's sum, so every layer's sum joined one colocation group and
a pipeline sent each layer's gradient to one device and back.
:func:`tf_patch.extract.aggregation_colocated` states the rule.
"""
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

from pesto import Plan  # noqa: E402
from pesto.errors import InvalidPlanError  # noqa: E402
from tf_patch.apply import apply_plan, check_colocation  # noqa: E402
from tf_patch.extract import aggregation_colocated, class_attr, colocation_groups, extract  # noqa: E402
from tf_patch.workflow import run_placed  # noqa: E402
from tf_patch.zoo import build_model  # noqa: E402

pytestmark = pytest.mark.tf
t1 = tf.compat.v1


def residual_mlp(layers=3):
    """x -> x + tanh(x W_k) per layer, loss = sum of squares; plain SGD by tf.gradients."""
    g = tf.Graph()
    with g.as_default():
        x = t1.placeholder(tf.float32, [4, 8], name="x")
        h = x
        for k in range(layers):
            with t1.variable_scope(f"layer_{k}"):
                w = t1.get_variable("w", [8, 8], initializer=t1.glorot_uniform_initializer(seed=k))
                h = tf.add(h, tf.tanh(tf.matmul(h, w)), name="residual")
        loss = tf.reduce_sum(tf.square(h), name="loss")
        train = t1.train.GradientDescentOptimizer(0.01).minimize(loss)
    return g, [train, loss]


def sums(graph):
    return [op for op in graph.get_operations() if op.type == "AddN" and op.name.startswith("gradients/")]


def test_residual_sums_are_colocated_by_tensorflow_but_not_grouped():
    g, fetches = residual_mlp()
    chained = [op for op in sums(g) if class_attr(op)]
    # TensorFlow chains the residual stream's sums: one _class target for all of them
    assert len(chained) >= 2 and len({tuple(class_attr(op)) for op in chained}) == 1
    assert all(aggregation_colocated(op) for op in chained)
    og = extract(g, fetches, kind="CPU", default_cost=1.0)
    assert not any(og.op(op.name).colocation_group for op in sums(g))
    updates = [o for o in og.ops if o.type == "ResourceApplyGradientDescent"]
    assert len(updates) == 3 and all(o.colocation_group for o in updates)  # variables' groups stay


def test_a_users_colocation_stays_binding():
    g = tf.Graph()
    with g.as_default():
        anchor = tf.constant(1.0, name="anchor")
        a = tf.square(anchor, name="a")
        b = tf.sqrt(anchor, name="b")
        with tf.name_scope("gradients_3"):  # a gradient scope, but the user's colocation
            with t1.colocate_with(anchor):
                users = tf.add_n([a, b], name="users")
            with t1.colocate_with(a.op, ignore_existing=True):  # what tf.gradients writes
                agg = tf.add_n([a, b], name="agg")
                other = tf.add(a, b, name="other")  # not a sum tf.gradients builds
        with t1.colocate_with(a.op, ignore_existing=True):
            outside = tf.add_n([a, b], name="outside")  # not under a gradient scope
    assert not aggregation_colocated(users.op)
    assert aggregation_colocated(agg.op)
    assert not aggregation_colocated(other.op)
    assert not aggregation_colocated(outside.op)
    groups = colocation_groups(g.get_operations())
    assert groups["gradients_3/users"] == groups["anchor"]
    assert groups["gradients_3/other"] == groups["a"] == groups["outside"]
    assert "gradients_3/agg" not in groups


@pytest.fixture(scope="module")
def gpt_small():
    m = build_model("gpt", "small")
    return m, extract(m.graph, m.fetches, kind="CPU", default_cost=1.0)


def residual_sums(m):
    """The sums tf.gradients colocated with the final layer norm's gradient (the chain)."""
    return [op.name for op in sums(m.graph) if class_attr(op) == [b"loc:@gradients/ln_f/mul_grad/Mul"]]


def sums_split_plan(g, chain):
    """Everything on /CPU:0 except the second half of the residual-stream sums (earlier layers)."""
    place = {o.name: "/CPU:0" for o in g.ops}
    for n in chain[len(chain) // 2:]:
        place[n] = "/CPU:1"
    return Plan.from_placement(g, place)


def test_gpt_sums_join_no_group(gpt_small):
    m, g = gpt_small
    chain = residual_sums(m)
    assert len(chain) >= 4  # AddN + AddN_1 of each layer's residual stream
    assert all(g.op(n).colocation_group is None for n in chain)
    assert not any(o.colocation_group for o in g.ops if o.type == "AddN")


def test_gpt_plan_splitting_the_sums_applies_and_trains_with_the_same_losses(gpt_small):
    m, g = gpt_small
    chain = residual_sums(m)
    plan = sums_split_plan(g, chain)
    check_colocation(m.graph, plan.placement)  # the rule's groups: nothing split
    base = run_placed(lambda: build_model("gpt", "small"), None, steps=3, timed=0)
    placed = run_placed(lambda: build_model("gpt", "small"), plan, steps=3, timed=0, trace=True)
    np.testing.assert_allclose(placed.losses, base.losses, rtol=1e-5)
    assert placed.trace["misplaced"] == []
    assert {placed.trace["devices"][n] for n in chain if n in placed.trace["devices"]} == {"/CPU:0", "/CPU:1"}
    assert set(chain) <= set(placed.applied.unbound)


def test_apply_clears_exactly_the_unbound_sums(gpt_small):
    m = build_model("gpt", "small")
    _, g = gpt_small
    chain = residual_sums(m)
    before = {op.name: class_attr(op) for op in m.graph.get_operations()}
    unbound = {op.name for op in m.graph.get_operations() if aggregation_colocated(op)}
    out = apply_plan(m.graph, sums_split_plan(g, chain), n_devices=2)
    assert set(out.unbound) == unbound and set(chain) <= unbound
    after = {op.name: class_attr(op) for op in m.graph.get_operations()}
    assert {n for n in before if before[n] != after[n]} == unbound
    assert all(after[n] == [] for n in unbound)


def test_a_variables_group_split_is_still_refused(gpt_small):
    m, g = gpt_small
    upd = next(o.name for o in g.ops if o.type.startswith("ResourceApply"))
    place = {o.name: "/CPU:0" for o in g.ops}
    place[upd] = "/CPU:1"
    with pytest.raises(InvalidPlanError, match="split"):
        check_colocation(m.graph, place)
