"""Which devices of a cluster are interchangeable, in about the time it takes
to read the routes (``Cluster.identical_groups``, ``Cluster.swap_keeps``).

Swapping devices ``a`` and ``b`` maps a cluster onto itself when they have the
same kind, memory and speed, every route keeps its cost and number of links,
and (unless contention-free) every link's set of routes maps onto the set of
some link. Only the routes touching ``a`` or ``b`` change under the swap, so
one check reads O(devices) entries of a cost matrix (numpy) and the shared
links of those routes. Candidates for a device are found by hashing: twins
``a``, ``b`` (``w(a, m) == w(b, m)`` for every other ``m``, ``w(a, b) == w(b, a)
== c``) have equal sums ``sum_m R[m] * P[w(a, m)] + R[a] * P[c]``, so a device
is compared only with the groups whose first member shares such a key. On 500
identical GPUs that is 500 checks, not 125,000 route scans per device.

Shared links are compared by a 64-bit additive hash of their route sets (the
chance that two different sets collide is about 2**-64 per pair); everything
else is compared exactly.

>>> from pesto.cluster import gpus
>>> Swaps(gpus(3)).groups()
[[0, 1, 2]]
"""
from __future__ import annotations

import numpy as np

__all__ = ["Swaps"]

_MASK = (1 << 64) - 1


class Swaps:
    """Swap checks and identical groups of one cluster (device indices)."""

    def __init__(self, cluster):
        devices, index = cluster.devices, cluster.index
        n = self.n = len(devices)
        self.contention_free = cluster.contention_free
        users: dict[str, list] = {}
        for r in cluster.routes:
            for link in r.links:
                users.setdefault(link, []).append((index[r.src], index[r.dst]))
        shared = {link: u for link, u in users.items() if len(u) > 1}
        # a route's cost: (beta0, beta1, links, dedicated links) as one id, so
        # a route with a link of its own maps onto one with a link of its own
        ids: dict[tuple, int] = {}
        self.w = np.full((n, n), -1, dtype=np.int64)
        for r in cluster.routes:
            x, y = index[r.src], index[r.dst]
            own = sum(1 for link in r.links if link not in shared)
            self.w[x, y] = ids.setdefault((r.beta0, r.beta1, len(r.links), own), len(ids))
        kinds: dict[tuple, int] = {}
        self.kind = [kinds.setdefault((d.kind, d.memory, d.speed), len(kinds)) for d in devices]
        rng = np.random.default_rng(20211206)
        self.r = rng.integers(1, 1 << 63, size=n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.p = rng.integers(1, 1 << 63, size=max(1, len(ids)), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._shared_links(shared)

    def _shared_links(self, shared: dict) -> None:
        """Per device the routes touching it that hold shared links; per shared
        link the hash of its route set; the set of those hashes."""
        self.route_links: dict[tuple, list] = {}
        self.link_hash: dict[str, int] = {}
        for link, routes in shared.items():
            self.link_hash[link] = sum(self._route_hash(x, y) for x, y in routes) & _MASK
            for xy in routes:
                self.route_links.setdefault(xy, []).append(link)
        self.hashes = set(self.link_hash.values())
        self.touching: list[list] = [[] for _ in range(self.n)]
        for (x, y) in self.route_links:
            self.touching[x].append((x, y))
            if y != x:
                self.touching[y].append((x, y))

    def _route_hash(self, x: int, y: int) -> int:
        return (int(self.r[x]) * 0x9E3779B97F4A7C15 + int(self.r[y]) * 0xC2B2AE3D27D4EB4F) & _MASK

    def swap_keeps(self, a: int, b: int) -> bool:
        """Whether swapping devices ``a`` and ``b`` maps the cluster onto itself."""
        if self.kind[a] != self.kind[b]:
            return False
        if a == b:
            return True
        w = self.w
        keep = np.ones(self.n, dtype=bool)
        keep[[a, b]] = False
        if w[a, b] != w[b, a] or not (np.array_equal(w[a, keep], w[b, keep])
                                      and np.array_equal(w[keep, a], w[keep, b])):
            return False
        if self.contention_free or not self.link_hash:
            return True
        sw = {a: b, b: a}
        delta: dict[str, int] = {}
        for x, y in set(self.touching[a]) | set(self.touching[b]):
            d = self._route_hash(sw.get(x, x), sw.get(y, y)) - self._route_hash(x, y)
            for link in self.route_links[(x, y)]:
                delta[link] = delta.get(link, 0) + d
        return all((self.link_hash[link] + d) & _MASK in self.hashes for link, d in delta.items())

    def _keys(self, a: int) -> set:
        """The twin keys of device ``a``: one per cost it has to another device."""
        row, col = self.w[a].copy(), self.w[:, a].copy()
        others = np.arange(self.n) != a
        out = int((self.r[others] * self.p[row[others]]).sum(dtype=np.uint64))
        inn = int((self.r[others] * self.p[col[others]] * np.uint64(3)).sum(dtype=np.uint64))
        ra = int(self.r[a])
        return {(self.kind[a], int(c), (out + ra * int(self.p[c])) & _MASK,
                 (inn + ra * int(self.p[c]) * 3) & _MASK) for c in np.unique(row[others])}

    def groups(self) -> list[list[int]]:
        """Interchangeable devices: each device joins the first earlier group
        whose first member it can swap with (groups in order of their first device)."""
        groups: list[list[int]] = []
        by_key: dict[tuple, list[int]] = {}
        for a in range(self.n):
            keys = self._keys(a)
            for g in sorted({g for k in keys for g in by_key.get(k, ())}):
                if self.swap_keeps(groups[g][0], a):
                    groups[g].append(a)
                    break
            else:
                for k in keys:
                    by_key.setdefault(k, []).append(len(groups))
                groups.append([a])
        return groups
