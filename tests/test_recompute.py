"""pesto.step.recompute: activation recomputation as a step transform (issue 30, item 4)."""
from __future__ import annotations

import pytest

from mb_strategies import deep_step
from pesto.cluster import gpus
from pesto.errors import BatchMarkError, InvalidGraphError
from pesto.graph import Op, OpGraph
from pesto.plan import check_plan
from pesto.simulate import simulate
from pesto.step import compose, recompute, replicate, split
from pesto.step.recompute import layer_blocks
from solver.parallel.pipelines import data_parallel_plan, pipeline_plan

ACT = 1_000_000


def _one_gpu(graph):
    s = simulate(graph, gpus(1, memory=10**12), {n: "/GPU:0" for n in graph.names})
    return s.makespan, s.peak_memory["/GPU:0"]


def test_blocks_are_the_layers():
    g = deep_step(4)
    blocks = layer_blocks(g)
    assert [b[0] for b in blocks] == [f"layer_{l}/a" for l in range(4)]
    assert all(len(b) == 3 for b in blocks)   # a, b, c: the variables and their reads are not batched


def test_peak_drops_and_step_grows_by_the_forward_again():
    g = deep_step(6, act=ACT)
    r = recompute(g)
    copies = [n for n, o in r.origin.items() if o.role == "recompute"]
    # the backward reads a and b; c is the block's output (the next block's input): not copied
    assert sorted(copies) == sorted(f"layer_{l}/{x}@rc" for l in range(6) for x in "ab")
    again = sum(r.graph.op(n).compute["GPU"] for n in copies)
    forward = sum(g.op(n).compute["GPU"] for b in layer_blocks(g) for n in b)
    (t0, p0), (t1, p1) = _one_gpu(g), _one_gpu(r.graph)
    assert t1 - t0 == pytest.approx(again)   # one device: the step grows by the copies' work
    assert again <= forward
    # without: a, b, c of every layer live from forward to backward; with: the layers' outputs
    # plus about two layers' copies
    assert p0 >= 18 * ACT
    assert p1 <= p0 - 6 * ACT


def test_copies_run_late_and_originals_die_after_the_forward():
    g = deep_step(4)
    r = recompute(g)
    s = simulate(r.graph, gpus(1, memory=10**12), {n: "/GPU:0" for n in r.graph.names})
    for l in range(3):   # the last layer's copies wait for the loss gradient
        assert s.start[f"layer_{l}/a@rc"] >= s.finish[f"gradients/layer_{l + 1}/c_grad"]
    assert r.graph.successors("layer_1/a") == ["layer_1/b"]   # no backward op reads the original
    assert set(r.graph.predecessors("gradients/layer_1/b_grad")) == {"gradients/layer_1/c_grad", "layer_1/a@rc"}
    assert r.graph.op("layer_1/a@rc").phase == "recompute" and r.graph.op("layer_1/a@rc").anchor == "layer_1/a"


def test_given_blocks_and_refusals():
    g = deep_step(3)
    r = recompute(g, blocks=[["layer_1/a", "layer_1/b"]])   # c_grad (anchored to c) keeps reading b
    assert [n for n, o in r.origin.items() if o.role == "recompute"] == ["layer_1/a@rc"]
    r = recompute(g, blocks=[["layer_1/a", "layer_1/b", "layer_1/c"]])
    assert sorted(n for n, o in r.origin.items() if o.role == "recompute") == ["layer_1/a@rc", "layer_1/b@rc"]
    with pytest.raises(InvalidGraphError, match="batched forward ops"):
        recompute(g, blocks=[["layer_1/w"]])
    with pytest.raises(InvalidGraphError, match="two blocks"):
        recompute(g, blocks=[["layer_1/a"], ["layer_1/a"]])
    with pytest.raises(InvalidGraphError, match="no layer-like blocks"):
        recompute(OpGraph([Op("a", {"GPU": 1.0}, batch=True, phase="forward")]))
    bad = OpGraph([Op("layer_0/a@rc", {"GPU": 1.0}, batch=True, phase="forward")])
    with pytest.raises(BatchMarkError, match="recompute makes"):
        recompute(bad, blocks=[["layer_0/a@rc"]])


def test_composes_with_split_and_replicate():
    g = deep_step(3)
    r = recompute(g)
    both = compose(split(r.graph, 2), r)
    o = both.origin["layer_1/a@rc@mb1"]
    assert (o.op, o.slice, o.role) == ("layer_1/a", 1, "recompute")
    assert both.copies("layer_1/a") == ("layer_1/a@mb0", "layer_1/a@mb1")
    rep = compose(replicate(r.graph, 2), r)
    assert rep.origin["layer_0/b@rc@r1"].role == "recompute" and rep.origin["layer_0/b@rc@r1"].replica == 1


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelines_and_data_parallel_of_the_recomputed_step_are_valid(schedule):
    g = deep_step(4)
    cluster = gpus(2, memory=10**12)
    r = recompute(g)
    sp = pipeline_plan(r.graph, cluster, schedule=schedule, micro_batches=4)
    assert check_plan(sp.graph, cluster, sp.plan).ok
    # a copy runs on its block's stage, in the slice's backward task
    pl = sp.plan.placement
    assert pl["layer_0/a@rc@mb2"] == pl["layer_0/a@mb2"] == pl["gradients/layer_0/b_grad@mb2"]
    base = pipeline_plan(g, cluster, schedule=schedule, micro_batches=4)
    assert max(sp.plan.peak_memory.values()) < max(base.plan.peak_memory.values())
    dp = data_parallel_plan(r.graph, cluster, micro_batches=2)
    assert check_plan(dp.graph, cluster, dp.plan).ok


def test_a_shape_op_of_the_backward_does_not_trigger_the_copies():
    """A backward op that reads only the forward pass (a shape the gradient needs) runs
    during the forward pass: the trigger waits for the gradient from above instead."""
    from pesto.graph import Edge, Tensor

    g = deep_step(4)
    ops, es, ts = list(g.ops), list(g.edges), list(g.tensors)
    for l in range(4):
        shape = f"gradients/layer_{l}/c_grad/Shape"
        ops.append(Op(shape, {"GPU": 0.1}, output_bytes=8, batch=True, phase="input-grad",
                      anchor=f"layer_{l}/c", scope=f"gradients/layer_{l}/c_grad"))
        ts.append(Tensor(f"{shape}:0", shape, 8))
        es += [Edge(f"layer_{l}/c", shape, (f"layer_{l}/c:0",)), Edge(shape, f"gradients/layer_{l}/c_grad",
                                                                     (f"{shape}:0",))]
    g = OpGraph(ops, es, ts, name="deep4shape")
    r = recompute(g)
    s = simulate(r.graph, gpus(1, memory=10**12), {n: "/GPU:0" for n in r.graph.names})
    for l in range(3):
        assert f"gradients/layer_{l + 1}/c_grad/Shape" not in r.graph.predecessors(f"layer_{l}/a@rc")
        assert s.start[f"layer_{l}/a@rc"] >= s.finish[f"gradients/layer_{l + 1}/c_grad"]
    assert _one_gpu(r.graph)[1] < _one_gpu(g)[1]


def test_one_op_layers_have_nothing_to_recompute_and_say_so():
    # the uniform generator's layers are one op each: the backward reads only the block's input (kept
    # anyway), so the search's "recompute" candidate was the plain plan under another name
    from benchmarks.generators import uniform_stages
    g = uniform_stages(3, t=1000.0, batch=8, act=1 << 20, params=1 << 20)
    assert [len(b) for b in layer_blocks(g)] == [1, 1, 1]
    with pytest.raises(InvalidGraphError, match="nothing to recompute.*save no memory"):
        recompute(g)


def test_the_search_does_not_screen_a_recompute_that_saves_nothing():
    import pesto
    from benchmarks.generators import uniform_stages
    r = pesto.solve_step(uniform_stages(2, t=4000, batch=8, act=1 << 27, params=1 << 22),
                         cluster=gpus(2, memory=300 * 2**20), micro_batches=4, batch_size=8, time_limit=3, workers=1)
    assert r.plan.log.steps
    assert not any("recompute" in name for name in r.plan.log.steps), r.plan.log.steps


def test_the_last_block_waits_for_a_tape_gradient_that_does_not_read_the_loss():
    """A GradientTape step's gradient starts from a seed that reads no forward op, so no
    backward op is downstream of the loss: the last block's copies still wait for the
    gradient into it (the head's gradient), not for a shape op of the forward pass."""
    from pesto.graph import Edge, Tensor

    g = deep_step(4)
    ops = list(g.ops) + [Op("gradients/ones", {"GPU": 0.1}, output_bytes=4, batch=True, phase="input-grad",
                            scope="gradients"),
                         Op("gradients/loss_grad/Shape", {"GPU": 0.1}, output_bytes=8, batch=True,
                            phase="input-grad", anchor="loss", scope="gradients/loss_grad")]
    es = [e for e in g.edges if (e.src, e.dst) != ("loss", "gradients/loss_grad")]
    es += [Edge("gradients/ones", "gradients/loss_grad", ("gradients/ones:0",)),
           Edge("layer_3/c", "gradients/loss_grad/Shape", ("layer_3/c:0",)),
           Edge("gradients/loss_grad/Shape", "gradients/loss_grad", ("gradients/loss_grad/Shape:0",))]
    ts = list(g.tensors) + [Tensor("gradients/ones:0", "gradients/ones", 4),
                            Tensor("gradients/loss_grad/Shape:0", "gradients/loss_grad/Shape", 8)]
    tape = OpGraph(ops, es, ts, name="tape4")
    assert not set(tape.successors("loss"))   # nothing downstream of the loss
    r = recompute(tape)
    waits = set(r.graph.predecessors("layer_3/a@rc"))
    assert "gradients/loss_grad" in waits and "gradients/loss_grad/Shape" not in waits
    s = simulate(r.graph, gpus(1, memory=10**12), {n: "/GPU:0" for n in r.graph.names})
    for l in range(4):
        assert s.start[f"layer_{l}/a@rc"] >= s.finish["gradients/loss_grad"] >= s.finish["loss"]
    assert _one_gpu(r.graph)[1] < _one_gpu(tape)[1]
