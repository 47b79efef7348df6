"""Symmetry detection (``Cluster.identical_groups`` / ``swap_keeps``, :mod:`pesto.symmetry`)
agrees with the definition checked by brute force, and stays fast on many devices."""
from __future__ import annotations

import random

import pytest

from pesto.cluster import Cluster, Device, Route, gpus, hosts, two_hosts, v100x4_pcie


def _brute_groups(cl: Cluster) -> list[list[str]]:
    """The definition: a device joins the first group whose first member it
    can be swapped with, a swap keeping kinds, route costs and link counts
    and mapping the set of links' route sets onto itself (every route read)."""
    use: dict[str, set] = {}
    for r in cl.routes:
        for link in r.links:
            use.setdefault(link, set()).add((r.src, r.dst))
    sharing = {frozenset(v) for v in use.values()}
    routes = {(r.src, r.dst): r for r in cl.routes}

    def swaps(a, b):
        da, db = cl.device(a), cl.device(b)
        if (da.kind, da.memory, da.speed) != (db.kind, db.memory, db.speed):
            return False
        sw = {a: b, b: a}
        for (x, y), r in routes.items():
            o = routes[(sw.get(x, x), sw.get(y, y))]
            if (o.beta0, o.beta1, len(o.links)) != (r.beta0, r.beta1, len(r.links)):
                return False
        if cl.contention_free:
            return True
        return {frozenset((sw.get(x, x), sw.get(y, y)) for x, y in s) for s in sharing} == sharing

    groups: list[list[str]] = []
    for n in cl.names:
        for g in groups:
            if swaps(g[0], n):
                g.append(n)
                break
        else:
            groups.append([n])
    return groups


def _random_cluster(rng: random.Random) -> Cluster:
    n = rng.randint(1, 7)
    devs = [Device(f"/GPU:{i}", rng.choice(["GPU", "GPU", "CPU"]), rng.choice([1, 1, 2]) << 30) for i in range(n)]
    pool = [f"L{k}" for k in range(rng.randint(1, 2 * n * n + 1))]
    routes = []
    for a in range(n):
        for b in range(n):
            if a != b:  # a link of its own, or 0-2 links drawn from a shared pool
                links = ([f"p{a}>{b}"] if rng.random() < 0.5
                         else rng.sample(pool, rng.randint(0, min(2, len(pool)))))
                routes.append(Route(devs[a].name, devs[b].name, tuple(links), rng.choice([1.0, 1.0, 2.0]), 0.1))
    return Cluster(devs, routes, contention_free=rng.random() < 0.2)


def test_groups_match_the_definition_on_random_clusters():
    rng = random.Random(7)
    for _ in range(400):
        cl = _random_cluster(rng)
        assert cl.identical_groups() == _brute_groups(cl), cl.to_dict()


@pytest.mark.parametrize("cl", [gpus(5), hosts(3, 2, "25gbe"), hosts(2, 2, "25gbe", intra="pcie"),
                                v100x4_pcie(), two_hosts()], ids=lambda c: c.name)
def test_groups_match_the_definition_on_presets(cl):
    assert cl.identical_groups() == _brute_groups(cl)


def test_swap_keeps_names_unknown_devices():
    with pytest.raises(Exception, match="/GPU:9"):
        gpus(2).swap_keeps("/GPU:0", "/GPU:9")


def test_five_hundred_gpus_are_one_group():
    # was cubic in devices (minutes at 500); the group is what CP-SAT's symmetry breaking uses
    cl = gpus(500)
    assert cl.identical_groups() == [cl.names]
    assert cl.swap_keeps("/GPU:0", "/GPU:499")
