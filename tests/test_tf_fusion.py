"""Order edges around TensorFlow's runtime fusions (issue 25, item 3).

oneDNN merges Conv2D + BiasAdd and Conv2DBackpropFilter + BiasAddGrad after
the plan's control edges are in place (:mod:`tf_patch.fusion`). Each case
below orders a small conv step so that one rule of
:func:`tf_patch.apply.control_edges_for` applies, runs it, and checks that
the fusion still happens (the partition graphs TensorFlow reports), that the
edges left out are exactly those the rule names, that every kept edge holds
in a trace, and that the step computes the unplaced values bit for bit.

They run where oneDNN fuses in this process, which is observed
(:func:`tf_patch.fusion.onednn_fuses`), not guessed: TensorFlow turns oneDNN
on by default only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX.
Elsewhere they skip, and one test runs this file again in a process with
``TF_ENABLE_ONEDNN_OPTS=1``, so the rules are tested there too.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import tf_patch  # noqa: E402
from pesto import Plan  # noqa: E402
from tf_patch.apply import apply_plan  # noqa: E402
from tf_patch.extract import extract  # noqa: E402
from tf_patch.fusion import fusions, onednn_fuses  # noqa: E402
from tf_patch.workflow import trace_check  # noqa: E402

pytestmark = pytest.mark.tf
t1 = tf.compat.v1
OFF = ("oneDNN does not fuse in this process (a Conv2D + BiasAdd ran as two kernels; TF_ENABLE_ONEDNN_OPTS="
       f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, and TensorFlow turns oneDNN on by default only on CPUs "
       "with AVX512_VNNI/AVX512_BF16/AVX_VNNI/AMX): test_the_rules_hold_with_onednn_turned_on covers them")


@pytest.fixture
def fusing():
    """Skip where oneDNN does not fuse in this process (observed)."""
    if not onednn_fuses():
        pytest.skip(OFF)
FUSED = {"_MklNativeConv2DWithBias": "Conv2D+BiasAdd",
         "_MklNativeConv2DBackpropFilterWithBias": "Conv2DBackpropFilter+BiasAddGrad"}


def _conv_step(bias_control=False):
    """x -> Conv2D -> BiasAdd -> Relu -> loss (+ an unrelated ``other``
    term), its gradients and two SGD updates, all float32. The ops of
    interest are named: conv, b_read, biasadd, other, filter_grad, bias_grad,
    w_step (scales the filter gradient)."""
    g = tf.Graph()
    with g.as_default():
        rng = np.random.default_rng(0)
        x = tf.constant(rng.normal(size=(2, 8, 8, 3)).astype(np.float32), name="x")
        w = t1.get_variable("w", initializer=rng.normal(size=(3, 3, 3, 4)).astype(np.float32), use_resource=True)
        b = t1.get_variable("b", initializer=rng.normal(size=(4,)).astype(np.float32), use_resource=True)
        w_read = tf.raw_ops.ReadVariableOp(resource=w.handle, dtype=tf.float32, name="w_read")
        b_read = tf.raw_ops.ReadVariableOp(resource=b.handle, dtype=tf.float32, name="b_read")
        conv = tf.nn.conv2d(x, w_read, 1, "SAME", name="conv")
        biasadd = tf.nn.bias_add(conv, b_read, name="biasadd")
        other = tf.reduce_sum(tf.square(x, name="other"), name="other_sum")
        if bias_control:
            biasadd.op._add_control_input(g.get_operation_by_name("other"))
        loss = tf.add(tf.reduce_sum(tf.square(tf.nn.relu(biasadd))), other, name="loss")
        gw, gb = tf.gradients(loss, [w_read, b_read])
        upd = [t1.assign_sub(w, tf.multiply(gw, 0.01, name="w_step")).op,
               t1.assign_sub(b, tf.multiply(gb, 0.01, name="b_step")).op]
        init = t1.global_variables_initializer()
    names = {op.type: op.name for op in g.get_operations()}
    return g, [loss] + upd, init, names, [w, b]


def _run(g, fetches, init, variables, config):
    """Values after one step, and the partition graphs' op type by name."""
    with t1.Session(graph=g, config=config) as sess:
        sess.run(init)
        md = t1.RunMetadata()
        opts = t1.RunOptions(output_partition_graphs=True, trace_level=t1.RunOptions.FULL_TRACE)
        loss = sess.run(fetches, options=opts, run_metadata=md)[0]
        values = [loss] + sess.run([v.read_value() for v in variables])
    kinds = {n.name: n.op for pg in md.partition_graphs for n in pg.node}
    return values, kinds, md


def _placed(*blocks, bias_control=False):
    """Run the step unplaced, then on /CPU:0 in an order where the ops of
    each block (names; "F", "G" and "S" stand for the filter and bias
    gradients and the ShapeN of the filter gradient's inputs)
    run back to back; ``(applied, unplaced values, placed values, partition
    op types by name, trace check)``."""
    g, fetches, init, types, variables = _conv_step(bias_control)
    config = tf_patch.session_config(1)
    before, kinds, _ = _run(g, fetches, init, variables, config)
    og = extract(g, fetches, kind="CPU", default_cost=1.0)
    short = {"F": types["Conv2DBackpropFilter"], "G": types["BiasAddGrad"], "S": types["ShapeN"]}
    blocks = [[short.get(n, n) for n in block] for block in blocks]
    order = _order(og, blocks)
    assert all(" ".join(block) in " ".join(order) for block in blocks)  # the case this test is about
    plan = Plan({n: "/CPU:0" for n in order}, {"/CPU:0": tuple(order)})
    applied = apply_plan(g, plan, n_devices=1)
    after, kinds, md = _run(g, fetches, init, variables, config)
    return applied, before, after, kinds, trace_check(md, applied.plan, applied)


def _order(og, blocks):
    """A topological order of ``og`` running each block back to back: the
    first block's other ancestors, the block, the next block's, ..., the rest."""
    import heapq
    topo = og.topological_order()
    rank = {n: (2 * len(blocks), i) for i, n in enumerate(topo)}
    for t, block in reversed(list(enumerate(blocks))):
        stack = list(block)
        while stack:
            for p in og.predecessors(stack.pop()):
                if rank[p][0] > 2 * t:
                    rank[p] = (2 * t, rank[p][1])
                    stack.append(p)
        rank.update({n: (2 * t + 1, i) for i, n in enumerate(block)})
    indeg = {n: len(og.predecessors(n)) for n in topo}
    ready = [(rank[n], n) for n in topo if indeg[n] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        n = heapq.heappop(ready)[1]
        out.append(n)
        for s in og.successors(n):
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    return out


FORWARD = ["b_read", "w_read", "conv", "biasadd"]  # no order edge into or out of the forward pair
BACKWARD = ["S", "G", "F"]  # the backprop pair back to back: one edge inside the fused kernel


def _inside(applied):
    """The backprop pair's edge when it runs back to back (``BACKWARD``)."""
    pair = [f for f in applied.fusions if f.pattern == "Conv2DBackpropFilter+BiasAddGrad"][0].ops
    return [((pair[1], pair[0]), "inside-fusion")]


def _check(applied, before, after, kinds, trace, expect_left):
    assert sorted(applied.left_out) == sorted((a, b, why) for (a, b), why in expect_left)
    assert {FUSED[k] for k in kinds.values() if k in FUSED} == set(FUSED.values())  # both still fused
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    assert trace["order_violations"] == [] and trace["checked_edges"] == len(applied.control_edges) > 0
    assert f"{len(expect_left)} left out" in applied.note


def test_an_edge_from_the_conv_into_what_its_bias_add_reads_is_left_out(fusing):
    """conv -> b_read -> biasadd: fused, the kernel would wait on b_read, which waits on it."""
    res = _placed(["w_read", "conv", "b_read", "biasadd"], BACKWARD)
    _check(*res, [(("conv", "b_read"), "fusion-cycle")] + _inside(res[0]))


def test_an_edge_into_a_bias_add_oneDNN_fuses_is_left_out(fusing):
    """A control input on the BiasAdd (or the Conv2D) would stop the fusion."""
    res = _placed(["b_read", "w_read", "conv", "other", "biasadd"], BACKWARD)
    _check(*res, [(("other", "biasadd"), "stops-fusion")] + _inside(res[0]))


def test_a_conv_and_bias_add_that_do_not_fuse_never_get_equal_control_inputs(fusing):
    """The BiasAdd has its own control input ``other``, so oneDNN leaves the
    pair unfused; an order edge ``other -> conv`` would give the Conv2D the
    same one, and oneDNN's merge then aborts the process (a CHECK)."""
    g, fetches, *_ = _conv_step(bias_control=True)
    assert not [f for f in fusions(g, {op.name: "/CPU:0" for op in g.get_operations()})
                if f.pattern == "Conv2D+BiasAdd"]
    applied, before, after, kinds, trace = _placed(["b_read", "w_read", "other", "conv", "biasadd"],
                                                   BACKWARD, bias_control=True)
    assert sorted(applied.left_out) == sorted([("other", "conv", "aborts-tf")]
                                              + [(a, b, why) for (a, b), why in _inside(applied)])
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    assert "_MklNativeConv2DWithBias" not in kinds.values()


def test_adjacent_backprop_pair_runs_as_one_kernel_with_the_edge_into_it_copied(fusing):
    applied, *rest = _placed(FORWARD, ["other", "F", "G"])
    fgrad = [f for f in applied.fusions if f.pattern == "Conv2DBackpropFilter+BiasAddGrad"][0].ops
    _check(applied, *rest, [(fgrad, "inside-fusion")])
    into = {b: a for a, b in applied.control_edges}
    assert into.get(fgrad[0]) == into.get(fgrad[1]) == "other"  # equal control inputs: still fused


def test_a_backprop_pair_apart_fuses_at_the_later_ones_turn(fusing):
    """f, other, g: ``other`` needs nothing from f, so the kernel runs at g's
    turn, after ``other``: only f -> other is left out."""
    applied, *rest = _placed(FORWARD, ["F", "other", "G"])
    f = [x for x in applied.fusions if x.pattern == "Conv2DBackpropFilter+BiasAddGrad"][0].ops[0]
    _check(applied, *rest, [((f, "other"), "fusion-cycle")])


def test_a_backprop_pair_apart_fuses_at_the_earlier_ones_turn_when_between_needs_it(fusing):
    """f, w_step, g: w_step scales f's output, so the kernel runs at f's
    turn, before w_step: only w_step -> g is left out."""
    applied, *rest = _placed(FORWARD, ["F", "w_step", "G"])
    g = [x for x in applied.fusions if x.pattern == "Conv2DBackpropFilter+BiasAddGrad"][0].ops[1]
    _check(applied, *rest, [(("w_step", g), "fusion-cycle")])


def test_a_backprop_pair_joined_through_other_ops_loses_one_of_their_edges(fusing):
    """G, b_step, S, F: G -> b_step and S -> F are data edges, so the fused
    kernel would wait on S, which the order puts after b_step, which waits on
    the kernel: the order edge b_step -> S is left out."""
    applied, *rest = _placed(FORWARD, ["G", "b_step", "S", "F"])
    shape_n = next(n for n in applied.plan.placement if n.endswith("conv_grad/ShapeN"))
    _check(applied, *rest, [(("b_step", shape_n), "fusion-cycle")])


def test_a_pair_the_plan_splits_is_joined_on_one_device_unless_the_order_forbids(fusing):
    """BiasAddGrad on /CPU:1, its Conv2DBackpropFilter on /CPU:0: unfused the
    step rounds differently, so the BiasAddGrad moves next to the filter
    gradient (and the step computes the unplaced values bit for bit); where
    /CPU:0 runs the bias update ``b_step`` (which needs the BiasAddGrad)
    before the filter gradient, the move would contradict the data flow and
    is not made."""
    from tf_patch.apply import keep_fusions
    g, fetches, init, types, variables = _conv_step()
    before, *_ = _run(g, fetches, init, variables, tf_patch.session_config(2))
    og = extract(g, fetches, kind="CPU", default_cost=1.0)
    f, bias_grad = types["Conv2DBackpropFilter"], types["BiasAddGrad"]
    for blocks, joins in [([FORWARD, ["F", "G"]], True), ([FORWARD, ["G", "b_step", "F"]], False)]:
        order = _order(og, [[{"F": f, "G": bias_grad}.get(n, n) for n in b] for b in blocks])
        place = {n: "/CPU:1" if n == bias_grad else "/CPU:0" for n in order}
        plan = Plan(place, {d: tuple(n for n in order if place[n] == d) for d in ("/CPU:0", "/CPU:1")})
        joined, moved = keep_fusions(g, plan)
        assert moved == ([(bias_grad, "/CPU:1", "/CPU:0")] if joins else [])
        if joins:
            seq = list(joined.order["/CPU:0"])
            assert seq[seq.index(f) - 1] == bias_grad and joined.order["/CPU:1"] == ()
    applied = apply_plan(g, plan.replace(order={"/CPU:0": tuple(n for n in _order(og, [FORWARD]) if n != bias_grad),
                                                "/CPU:1": (bias_grad,)}), n_devices=2)
    after, kinds, _ = _run(g, fetches, init, variables, tf_patch.session_config(2))
    assert applied.moved and "1 bias op(s) moved" in applied.note
    assert "_MklNativeConv2DBackpropFilterWithBias" in kinds.values()
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


def test_predicted_fusions_are_those_tensorflow_makes_in_a_keras_cnn(fusing):
    """On a Keras CNN (biases, ZeroPadding2D before a valid conv, a dense
    layer), unplaced: the pairs :func:`fusions` predicts are exactly the
    fused kernels in TensorFlow's partition graphs, and Pad + Conv2D (also
    in oneDNN's list) is not merged by this TensorFlow."""
    tf.keras.utils.set_random_seed(0)
    inp = tf.keras.Input((10, 10, 3))
    h = tf.keras.layers.Conv2D(4, 3, activation="relu")(tf.keras.layers.ZeroPadding2D()(inp))
    h = tf.keras.layers.Conv2D(4, 3, strides=2)(h)
    out = tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(h))
    model = tf.keras.Model(inp, out)
    x = tf.random.normal((2, 10, 10, 3), seed=1)
    y = tf.random.uniform((2,), 0, 3, dtype=tf.int32, seed=2)
    step = tf_patch.keras_step(model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), "sgd", x, y,
                               n_devices=1)
    md = t1.RunMetadata()
    step._session().run(step._fetches(), step.feed, options=t1.RunOptions(output_partition_graphs=True),
                        run_metadata=md)
    kinds = {n.name: n.op for pg in md.partition_graphs for n in pg.node}
    predicted = fusions(step.tf_graph, {op.name: "/CPU:0" for op in step.graph.ops})
    made = {(FUSED[k], n) for n, k in kinds.items() if k in FUSED}
    assert {(f.pattern, f.survivor) for f in predicted} == made and len(made) == 4
    assert all(n not in kinds for f in predicted for n in [f.fused_away])
    assert not [k for k in kinds.values() if "Pad" in k and "Conv" in k]
    step.close()


@pytest.mark.slow  # a second TensorFlow process: about 25 s, only where oneDNN is off
def test_the_rules_hold_with_onednn_turned_on():
    """Where oneDNN does not fuse here, this file runs again in a process
    with ``TF_ENABLE_ONEDNN_OPTS=1``: every test above must pass there."""
    if onednn_fuses():
        pytest.skip("oneDNN fuses in this process: the tests above ran here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs",
                          os.path.abspath(__file__)], env=env, capture_output=True, text=True, timeout=600, cwd=root)
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    if "oneDNN does not fuse in this process" in out.stdout:
        pytest.skip("oneDNN does not fuse even with TF_ENABLE_ONEDNN_OPTS=1 (a TensorFlow built without it)")
    assert out.returncode == 0 and re.search(r"\b9 passed", out.stdout), tail
