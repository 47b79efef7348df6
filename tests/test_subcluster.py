"""One-GPU-group solves (solver/subcluster.py, the recipe's "one group"
pass): on a slow network a one-host plan must not be lost."""
from __future__ import annotations

import pytest

import pesto
from benchmarks.generators import layered_dag
from pesto.cluster import gpus, hosts, v100x2_nvlink
from pesto.errors import InvalidClusterError
from solver.subcluster import gpu_groups


def test_gpu_groups_one_per_kind_of_host_and_none_on_one_host():
    assert [len(g) for g in gpu_groups(hosts(4, 2, "25gbe"))] == [2]
    assert gpu_groups(hosts(2, 2, "25gbe", with_cpu=True))[0][0].endswith("task:0/device:GPU:0")
    assert gpu_groups(v100x2_nvlink()) == [] and gpu_groups(gpus(4)) == []


def test_subset_refuses_unknown_devices_and_keeps_routes():
    c = hosts(2, 2, "25gbe")
    with pytest.raises(InvalidClusterError, match="unknown device"):
        c.subset(["/GPU:9"])
    a, b = c.names[0], c.names[2]
    assert c.subset([a, b]).route(a, b) == c.route(a, b)


def test_one_group_pass_gives_a_start_no_worse_than_one_host_alone():
    """Two hosts on a slow network: the solve runs the recipe on host 0
    alone as a start, so its plan is never worse than that start (and the
    pass is in the log)."""
    g = layered_dag(400, width=6, seed=3)
    cluster = hosts(2, 2, "10gbe")
    plan = pesto.solve(g, cluster=cluster, time_limit=12, workers=1)
    group = next(s for s in plan.log.passes if s.name == "one group")
    assert group.makespan is not None and plan.makespan <= group.makespan + 1e-6
    pesto.check_plan(g, cluster, plan).raise_if_invalid()
    # on one host there is no group pass
    one = pesto.solve(g, cluster=cluster.subset(gpu_groups(cluster)[0]), time_limit=3, workers=1)
    assert all(s.name != "one group" for s in one.log.passes)
