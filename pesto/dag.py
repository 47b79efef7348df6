"""DAG algorithms on index adjacency lists: one place, one meaning per name.

Every function takes plain ``list[list[int]]`` successor / predecessor lists
(as :meth:`OpGraph.succ_idx` and :meth:`OpGraph.pred_idx` give them), so the
graph, the coarsener, the placers and the checker share one implementation.

* :func:`toposort` -- Kahn's order (deterministic), or :class:`CycleError`;
* :func:`find_cycle` -- one cycle among ops that Kahn's pass could not take;
* :func:`priority_order` -- the topological order that takes, among ready ops,
  the one of smallest key first (a list scheduler's order);
* :func:`top_levels` / :func:`bottom_levels` -- longest paths into / out of
  every vertex, with vertex and optional edge weights;
* :func:`reachability` -- descendants of every vertex as int bitsets;
* :func:`closure` -- the vertices reachable from some, themselves included;
* :class:`UnionFind` -- disjoint sets, optionally AND-ing a bit mask per set.

Examples
--------
>>> succ = [[1, 2], [3], [3], []]
>>> pred = [[], [0], [0], [1, 2]]
>>> toposort(succ, pred)
[0, 1, 2, 3]
>>> bottom_levels(succ, [1.0, 5.0, 2.0, 1.0])
[7.0, 6.0, 3.0, 1.0]
>>> top_levels(pred, [1.0, 5.0, 2.0, 1.0])
[1.0, 6.0, 3.0, 7.0]
>>> bin(reachability(succ)[0])
'0b1110'
"""
from __future__ import annotations

import heapq
from typing import Callable, Sequence

from .errors import CycleError

__all__ = ["toposort", "find_cycle", "priority_order", "top_levels", "bottom_levels",
           "reachability", "closure", "UnionFind"]

Adjacency = Sequence[Sequence[int]]


def toposort(succ: Adjacency, pred: Adjacency | None = None, *, names: Sequence[str] | None = None,
             what: str = "op graph") -> list[int]:
    """A topological order of the vertices ``0..n-1`` (deterministic).

    Among ready vertices the one made ready last is taken first (depth first
    along chains), ties by index: the same graph always gives the same order.

    Parameters
    ----------
    succ : successor lists
    pred : predecessor lists, optional (derived from ``succ`` when omitted)
    names : vertex names for the error message, optional
    what : what the graph is, for the error message

    Raises
    ------
    CycleError
        With the vertices (or their ``names``) of one cycle.

    Examples
    --------
    >>> toposort([[1], [2], [0]], names=["a", "b", "c"])
    Traceback (most recent call last):
    ...
    pesto.errors.CycleError: op graph has a cycle: a -> b -> c -> a
    """
    n = len(succ)
    indeg = [len(p) for p in pred] if pred is not None else _indegrees(succ)
    stack = [i for i in range(n - 1, -1, -1) if indeg[i] == 0]
    order = []
    while stack:
        i = stack.pop()
        order.append(i)
        for j in reversed(succ[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if len(order) < n:
        cycle = find_cycle(succ, {i for i in range(n) if indeg[i] > 0})
        raise CycleError([names[k] for k in cycle] if names is not None else cycle, what=what)
    return order


def _indegrees(succ: Adjacency) -> list[int]:
    indeg = [0] * len(succ)
    for s in succ:
        for j in s:
            indeg[j] += 1
    return indeg


def find_cycle(succ: Adjacency, left: set[int]) -> list[int]:
    """One cycle among ``left``, the vertices Kahn's pass could not take.

    Each of them has a predecessor in ``left``: walking predecessors must
    repeat a vertex. Returns the cycle in edge order (the last feeds the first),
    starting at its smallest vertex.

    >>> find_cycle([[1], [2], [0], []], {0, 1, 2})
    [0, 1, 2]
    """
    back: dict[int, int] = {}
    for i in sorted(left):
        for j in succ[i]:
            if j in left and j not in back:
                back[j] = i
    i = min(left)
    seen: dict[int, int] = {}
    path = []
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = back[i]
    cycle = path[seen[i]:]
    cycle.reverse()
    k = cycle.index(min(cycle))  # start at the smallest vertex: one answer per cycle
    return cycle[k:] + cycle[:k]


def priority_order(succ: Adjacency, pred: Adjacency, key: Sequence[float]) -> list[int]:
    """The topological order that takes, among vertices whose predecessors are
    all taken, the one with the smallest ``key`` first (ties by index).

    Sorting by a solver's start times alone can contradict the graph when the
    times carry a float tolerance; this cannot.

    >>> priority_order([[1], [2], []], [[], [0], [1]], [1.0, 0.9999, 0.5])
    [0, 1, 2]
    >>> priority_order([[], []], [[], []], [2.0, 1.0])
    [1, 0]
    """
    left = [len(p) for p in pred]
    heap = [(key[i], i) for i in range(len(succ)) if left[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(i)
        for j in succ[i]:
            left[j] -= 1
            if left[j] == 0:
                heapq.heappush(heap, (key[j], j))
    if len(out) < len(succ):
        raise CycleError(find_cycle(succ, set(range(len(succ))) - set(out)))
    return out


def top_levels(pred: Adjacency, weight: Sequence[float], *,
               edge: Callable[[int, int], float] | None = None,
               order: Sequence[int] | None = None) -> list[float]:
    """Longest path from any source to the *end* of each vertex:
    ``weight[i] + max(top[p] + edge(p, i))`` over predecessors ``p``.

    ``order`` is a topological order (computed when omitted); ``edge`` an
    optional edge weight (default 0). ``max(top_levels(...))`` is the critical
    path.
    """
    n = len(pred)
    if order is None:
        order = toposort(_reverse(pred), pred)
    top = [0.0] * n
    for i in order:
        best = 0.0
        for p in pred[i]:
            v = top[p] + (edge(p, i) if edge is not None else 0.0)
            if v > best:
                best = v
        top[i] = best + weight[i]
    return top


def bottom_levels(succ: Adjacency, weight: Sequence[float], *,
                  edge: Callable[[int, int], float] | None = None,
                  order: Sequence[int] | None = None) -> list[float]:
    """Longest path from the *start* of each vertex to any sink:
    ``weight[i] + max(edge(i, j) + bottom[j])`` over successors ``j``
    (the "upward rank" of list schedulers).

    ``order`` is a topological order (computed when omitted); ``edge`` an
    optional edge weight (default 0).
    """
    n = len(succ)
    if order is None:
        order = toposort(succ)
    bot = [0.0] * n
    for i in reversed(order):
        best = 0.0
        for j in succ[i]:
            v = bot[j] + (edge(i, j) if edge is not None else 0.0)
            if v > best:
                best = v
        bot[i] = weight[i] + best
    return bot


def _reverse(adj: Adjacency) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in adj]
    for i, s in enumerate(adj):
        for j in s:
            out[j].append(i)
    return out


def closure(adj: Adjacency, starts) -> set[int]:
    """The vertices reachable from ``starts`` along ``adj`` (successors: the
    descendants; predecessors: the ancestors), ``starts`` included.

    >>> sorted(closure([[1, 2], [3], [3], []], [1])), sorted(closure([[], [0], [0], [1, 2]], [3]))
    ([1, 3], [0, 1, 2, 3])
    """
    seen = set(starts)
    stack = list(seen)
    while stack:
        for j in adj[stack.pop()]:
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def reachability(succ: Adjacency, order: Sequence[int] | None = None) -> list[int]:
    """Descendants of every vertex as an int bitset (bit ``j`` of ``reach[i]``
    is set when a path leads from ``i`` to ``j``; ``i`` itself is not set).

    O(n * edges / wordsize): meant for graphs of at most a few thousand vertices.
    """
    if order is None:
        order = toposort(succ)
    reach = [0] * len(succ)
    for i in reversed(order):
        r = 0
        for j in succ[i]:
            r |= reach[j] | (1 << j)
        reach[i] = r
    return reach


class UnionFind:
    """Disjoint sets over ``n`` items; with ``masks``, each set keeps the AND
    of its members' masks (e.g. the device kinds all of them allow).

    The root of a set is its smallest member, so results do not depend on the
    order of unions.

    >>> uf = UnionFind(3, masks=[0b11, 0b01, 0b10])
    >>> uf.union(0, 1), uf.mask[uf.find(1)]
    (0, 1)
    >>> uf.find(2), uf.same(0, 2)
    (2, False)
    """

    def __init__(self, n: int, masks: Sequence[int] | None = None):
        self.parent = list(range(n))
        self.mask = [int(m) for m in masks] if masks is not None else None

    def find(self, a: int) -> int:
        p = self.parent
        root = a
        while p[root] != root:
            root = p[root]
        while p[a] != root:  # path compression
            p[a], a = root, p[a]
        return root

    def union(self, a: int, b: int) -> int:
        """Join the sets of ``a`` and ``b``; return the new root."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        if self.mask is not None:
            self.mask[ra] &= self.mask[rb]
        return ra

    def same(self, a: int, b: int) -> bool:
        return self.find(a) == self.find(b)
