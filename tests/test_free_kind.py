"""The ``free`` kind (solver/parallel/kinds.py): one free placement of the split step, screened
with the search's list placer, its split (weight gradients summed in place) the one the count's
exact passes place when it is the count's best."""
from __future__ import annotations

from pathlib import Path

import pytest

import pesto
from pesto.api import marked
from pesto.cluster import gpus, v100x4_pcie
from pesto.plan import check_plan
from pesto.step.slicing import weight_grad_ops
from mb_strategies import deep_step
from solver.parallel.kinds import KINDS
from solver.parallel.realise import realise
from solver.parallel.search import _Search, with_marks
from solver.parallel.strategy import Strategy

FREE = Strategy(micro_batches=2, schedule="free", weight_grads="accumulate")
SLOW = (5.0, 2.5e-5)
GRAPHS = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"


@pytest.fixture(scope="module")
def deep():
    return with_marks(deep_step(4, weight=30_000_000, t=1000.0))


def test_the_kind_offers_one_in_place_strategy_per_count_above_one(deep):
    kind = KINDS["free"]
    assert kind.candidates(deep, gpus(4), 2) == [FREE] and kind.lists and not kind.solves
    assert kind.candidates(deep, gpus(4), 1) == [] and kind.candidates(deep, gpus(1), 4) == []
    assert _Search.name_of(kind, FREE) == "free M=2 accumulate"


def test_a_free_placement_places_the_in_place_split_validly(deep):
    c = gpus(4, beta=SLOW)
    r = realise(deep, c, FREE, place=_Search.list_placer)
    assert check_plan(r.graph, c, r.plan).ok
    in_place = pesto.step_graph(deep, 2, "micro-batched", in_place=weight_grad_ops(deep))
    assert r.graph.names == in_place.names and not [n for n in r.graph.names if "@acc" in n]
    assert r.strategy == FREE and r.graph_kind == "micro-batched"
    # the practitioner's layer stages: a layer's copies on one GPU, more than one GPU used
    assert all(r.plan.placement[f"layer_{k}/a@mb0"] == r.plan.placement[f"layer_{k}/a@mb1"] for k in range(4))
    assert len(set(r.plan.placement.values())) > 1


def test_realise_needs_the_placer_and_refuses_what_it_cannot_run(deep):
    with pytest.raises(ValueError, match="needs its placer"):
        realise(deep, gpus(4), FREE)
    for bad in (Strategy(schedule="free", stages=1), Strategy(micro_batches=2, schedule="free", stages=2),
                Strategy(micro_batches=2, schedule="free", recompute=True)):
        with pytest.raises(ValueError, match="M > 1 slices, one stage and no memory savers"):
            realise(deep, gpus(4), bad, place=_Search.list_placer)


def test_on_a_sequence_model_it_beats_data_parallelism_and_the_pipelines():
    """NMT-4x1024 (an encoder-decoder LSTM, grappler's V100 costs) on 4 PCIe GPUs: the layers'
    time steps of two slices overlap as a wavefront; data parallelism is link-bound and the
    pipelines run each slice's stage as a block. Summing in place drops the accumulate ops."""
    g = with_marks(marked(pesto.OpGraph.from_json(GRAPHS / "nmt_4x1024.json.gz")))
    c = v100x4_pcie(with_cpu=False)
    free = realise(g, c, FREE, place=_Search.list_placer)
    separate = realise(g, c, Strategy(micro_batches=2, schedule="free"), place=_Search.list_placer)
    assert check_plan(free.graph, c, free.plan).ok
    others = [realise(g, c, s).plan.makespan for s in (Strategy(replicas=4),
                                                         Strategy(stages=4, micro_batches=2, schedule="1f1b"))]
    assert free.plan.makespan < min(separate.plan.makespan, *others), (free.plan.makespan, separate.plan.makespan,
                                                                        others)


def test_the_search_screens_it_deterministically_and_exact_never_loses_its_plan(deep):
    c = gpus(4, beta=SLOW)
    a, b = (pesto.solve(deep, cluster=c, micro_batches=2, batch_size=4, time_limit=3, deterministic=True,
                        workers=1) for _ in range(2))
    assert "free M=2 accumulate" in a.log.steps
    assert a.log.steps == b.log.steps and a.placement == b.placement and a.makespan == b.makespan
    assert a.makespan <= a.log.steps["free M=2 accumulate"]
    graph = pesto.step_graph(deep, a.log.micro_batches, a.log.graph_kind, a.log.replicas,
                             joined=a.log.joined, in_place=a.log.in_place)
    assert check_plan(graph, c, a).ok


def test_the_search_skips_it_where_the_best_plan_is_near_the_work_over_the_gpus():
    """Small weights on fast links: data parallelism runs at about the work over the GPUs."""
    p = pesto.solve(deep_step(4, weight=1000, t=1000.0), cluster=gpus(4), micro_batches="auto", batch_size=4,
                    time_limit=3, deterministic=True, workers=1)
    assert "free M=2 accumulate" not in p.log.steps
    assert p.log.skipped["free M=2 accumulate"].startswith("not built: the best plan so far")
