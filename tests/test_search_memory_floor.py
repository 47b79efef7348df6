"""The search rules out what cannot fit before building it (``pesto.memory.step_activations``):
GPT-1.3B on 8 V100s spent its screening on data parallelism (39.6 GiB per GPU) and M=1, 2."""
from __future__ import annotations

import pytest

import pesto
from mb_strategies import layered_step
from pesto.errors import MicroBatchMemoryError
from pesto.memory import live_across, step_activations


@pytest.fixture
def big():
    """4 layers, 40 MB activations each: 0.16 GB live at the loss, weights tiny."""
    return layered_step(4, act=40_000_000, t=1000.0)


def test_step_activations_are_the_bytes_live_at_the_loss(big):
    a = step_activations(big)
    assert a.op == "layer_3/f"
    assert a.batched + a.shared == live_across(big, a.op)
    assert a.per_slice(4) == -(-a.batched // 4) + a.shared


def test_data_parallel_and_whole_step_are_skipped_when_they_cannot_fit(big):
    cluster = pesto.cluster.gpus(4, memory=30_000_000)   # M=1: 160 MB over 4 GPUs > 30 MB
    r = pesto.solve_step(big, cluster=cluster, micro_batches="auto", batch_size=16, time_limit=10, workers=1)
    skipped = r.plan.log.skipped
    assert "needs at least" in skipped["data-parallel"] and "over 1 GPU" in skipped["data-parallel"]
    assert "needs at least" in skipped["M=1"]
    assert r.micro_batches > 1 and r.plan.status != "infeasible"
    pesto.check_plan(r.graph, cluster, r.plan).raise_if_invalid()


def test_a_fixed_count_that_cannot_fit_is_refused_by_name(big):
    cluster = pesto.cluster.gpus(2, memory=30_000_000)    # M=2: 80 MB over 2 GPUs > 30 MB
    with pytest.raises(MicroBatchMemoryError, match=r"M=2: needs at least .* per GPU"):
        pesto.solve_step(big, cluster=cluster, micro_batches=2, batch_size=16, time_limit=5, workers=1)


def test_memory_bound_steps_screen_more_slices_and_leaner_plans_first(big):
    # GPT-1.3B on 8 V100s: M=2 and GPipe took the screening time, the 1F1B plan of M=16 that fits never ran
    lines = []
    cluster = pesto.cluster.gpus(4, memory=30_000_000)
    pesto.solve_step(big, cluster=cluster, micro_batches="auto", batch_size=16, time_limit=3, workers=1,
                     deterministic=True, progress=lines.append)
    built = [ln.split(":")[0] for ln in lines if ": step " in ln and ("gpipe" in ln or "1f1b" in ln)]
    assert built and built[0].startswith("1f1b M=16"), built
    counts = [int(b.split("M=")[1].split()[0]) for b in built]
    assert counts == sorted(counts, reverse=True), built


def test_the_slice_model_is_skipped_and_named_on_a_huge_split(monkeypatch):
    # 50k marked ops, M=8: the slice model's split and grid took 9 s of a 6 s share (36 s for a 30 s limit)
    import solver.parallel.search as ss
    monkeypatch.setattr(ss, "SLICE_MAX_OPS", 10)
    r = pesto.solve_step(layered_step(4, act=100_000, t=1000.0), cluster=pesto.cluster.gpus(2), micro_batches=2,
                         batch_size=8, time_limit=5, workers=1)
    assert "more than 10" in r.plan.log.skipped["slice M=2"]
    assert "slice M=2" not in r.plan.log.steps
