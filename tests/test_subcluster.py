"""One-GPU-group candidates (solver/subcluster.py): what the pipeline adds on
multi-host clusters so that a slow network does not cost a one-host plan."""
from __future__ import annotations

import pytest

import pesto

from benchmarks.generators import layered_dag
from pesto.cluster import gpus, heterogeneous, hosts, v100x2_nvlink
from pesto.plan import check_plan
from solver.subcluster import gpu_groups, place_on_groups


def test_gpu_groups_one_per_kind_of_host_and_none_on_one_host():
    assert [len(g) for g in gpu_groups(hosts(4, 2, "25gbe"))] == [2]
    assert gpu_groups(hosts(2, 2, "25gbe", with_cpu=True))[0][0].endswith("task:0/device:GPU:0")
    assert gpu_groups(v100x2_nvlink()) == [] and gpu_groups(gpus(4)) == []


def test_group_plans_use_one_group_and_keep_their_step_on_the_full_cluster():
    g = layered_dag(120, width=6, seed=3)
    cluster = hosts(2, 2, "25gbe")
    group = gpu_groups(cluster)[0]
    plans, errors = place_on_groups(g, cluster, time_limit=10, seed=0)
    assert set(plans) == {f"m-etf@{group[0]}", f"m-sct@{group[0]}"} and errors == {}
    sub = cluster.subset(group)
    for p in plans.values():
        assert set(p.placement.values()) <= set(group)
        check_plan(g, cluster, p).raise_if_invalid()
        # the other host idles: the same step on the sub-cluster
        assert pesto.simulate(g, sub, p).makespan == pytest.approx(p.makespan)


def test_subset_refuses_unknown_devices_and_keeps_routes():
    from pesto.errors import InvalidClusterError
    c = hosts(2, 2, "25gbe")
    with pytest.raises(InvalidClusterError, match="unknown device"):
        c.subset(["/GPU:9"])
    a, b = c.names[0], c.names[2]
    assert c.subset([a, b]).route(a, b) == c.route(a, b)
