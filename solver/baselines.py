"""Practitioners' baselines: single device, Expert (layer-wise by name scope), METIS.

All three run under TensorFlow's default scheduling (each device's FIFO ready
queue): :func:`solver.common.finalize` is called with ``order=None``. All
respect op kinds and colocation groups, and follow the memory-infeasible
behaviour of :mod:`pesto.memory`: the plan is always returned, with status
``"infeasible"`` and ``stats["memory_over"]`` when the simulated peak memory
exceeds a device's capacity.

Examples
--------
>>> from pesto.graph import OpGraph
>>> from pesto.cluster import gpus
>>> g = OpGraph.from_edges({"a": 1, "b": 2}, [("a", "b", 8)])
>>> place_single(g, gpus(2)).makespan
3.0
"""
from __future__ import annotations

import re
import time
from collections import Counter

from pesto.cluster import Cluster
from pesto.graph import OpGraph
from pesto.plan import Plan

from .common import finalize
from pesto.memory import MEMORY_NOTE, peak_repair, static_repair
from pesto.problem import Problem

__all__ = ["place_single", "place_expert", "place_metis", "expert_assignment", "fit_memory"]


def _main_gpus(prob: Problem) -> list[int]:
    """The GPUs, or the devices of the kind most ops allow if there is no GPU."""
    devs = prob.cluster.devices
    g = [d for d in range(prob.nd) if devs[d].kind == "GPU"]
    if g:
        return g
    count = Counter(k for op in prob.graph.ops for k in op.kinds)
    kind = max({d.kind for d in devs}, key=lambda k: count.get(k, 0))
    return [d for d in range(prob.nd) if devs[d].kind == kind]


def _fix_units(prob: Problem, place: list[int], weight=None) -> list[int]:
    """Make ``place`` respect kinds and colocation: each unit goes to the
    allowed device holding most of its weight (compute by default); a unit
    with no member on an allowed device goes to the allowed device with the
    least weight so far. Modifies and returns ``place``."""
    w = weight or [min(prob.dur[i][d] for d in prob.allowed[i]) for i in range(prob.n)]
    load = [0.0] * prob.nd
    for i in range(prob.n):
        load[place[i]] += w[i]
    for u, mem in enumerate(prob.members):
        allowed = prob.allowed[mem[0]]
        if len(mem) == 1 and place[mem[0]] in allowed:
            continue
        votes: dict = {}
        for i in mem:
            if place[i] in allowed:
                votes[place[i]] = votes.get(place[i], 0.0) + w[i] + 1e-9
        d = max(votes, key=lambda e: (votes[e], -e)) if votes else min(allowed, key=lambda e: (load[e], e))
        for i in mem:
            load[place[i]] -= w[i]
            place[i] = d
            load[d] += w[i]
    return place


def _done(graph, cluster, prob, place, placer, t0, stats=None, repair=True):
    stats = dict(stats or {})
    forced = static_repair(prob, place) if repair else []
    return fit_memory(graph, cluster, place, order=None, placer=placer, t0=t0, stats=stats,
                      forced=forced, repair=repair)


MEMORY_ROUNDS = 10  # at most this many re-simulations in fit_memory


def fit_memory(graph: OpGraph, cluster: Cluster, place: list[int], *, order, placer: str, t0: float,
               stats: dict, forced=(), repair: bool = True) -> Plan:
    """The plan of ``place`` (simulated by :func:`solver.common.finalize`),
    repaired while its simulated peak is over capacity.

    Whole colocation units move off over-full devices
    (:func:`pesto.memory.peak_repair`) and the placement is simulated again,
    at most ``MEMORY_ROUNDS`` times: first every move the static estimate
    asks for, then, once a round makes the overrun worse (timed peaks move
    with the schedule), one move at a time from the best placement so far,
    never retrying a unit whose move did not help. Returns the first plan
    that fits, else the one least over capacity, with its
    ``stats["memory_forced"]`` (the op indices ``forced`` by the placer, as
    names) and ``stats["memory_note"]``: a baseline returns an over-memory
    plan only when no repair fits. ``stats["memory_moved_units"]`` counts the
    units moved in the plan returned. ``place`` ends as that plan's placement.

    Examples
    --------
    >>> import time
    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph([Op(x, {"GPU": 1.0}, persistent_bytes=40) for x in "abc"])
    >>> p = fit_memory(g, gpus(2, memory=100), [0, 0, 0], order=None, placer="demo",
    ...                t0=time.perf_counter(), stats={})
    >>> p.status, p.stats["memory_moved_units"]
    ('heuristic', 1)
    """
    prob = Problem.of(graph, cluster)
    names = graph.names
    seq = None if order is None else [names[i] for i in order]
    start = list(place)

    def run():
        placement = {names[i]: prob.dev_names[place[i]] for i in range(prob.n)}
        plan = finalize(graph, cluster, placement, order=seq, placer=placer, t0=t0, stats=dict(stats))
        return sum(max(0, b - prob.cap[prob.dev_index[d]]) for d, b in plan.peak_memory.items()), plan

    best = (*run(), list(place))
    skip: set = set()
    one = None  # None: all moves per round; 1 after a round that did not help
    for _ in range(MEMORY_ROUNDS if repair else 0):
        if best[0] == 0:
            break
        place[:] = best[2]
        if not peak_repair(prob, place, best[1].peak_memory, max_moves=one, skip=skip):
            break
        over, plan = run()
        if over < best[0]:
            best = (over, plan, list(place))
        else:
            skip.update(prob.unit[i] for i in range(prob.n) if place[i] != best[2][i])
            one = 1
    over, plan, place[:] = best
    extra = dict(plan.stats)
    moved = len({prob.unit[i] for i in range(prob.n) if place[i] != start[i]})
    if moved:
        extra["memory_moved_units"] = moved
    if over and (forced or repair):
        extra["memory_forced"] = [names[i] for i in list(forced)[:50]]
        extra["memory_forced_count"] = len(forced)
        extra["memory_note"] = MEMORY_NOTE
    return plan.replace(stats=extra) if extra != plan.stats else plan


# -- single device ---------------------------------------------------------------
def place_single(graph: OpGraph, cluster: Cluster) -> Plan:
    """Everything on the fastest GPU (the first one among equals).

    Ops (or colocation groups) that cannot run there go to the fastest device
    of a kind they allow. No memory repair: if the GPU is too small the plan
    comes back with status ``"infeasible"`` (an honest OOM). Without GPUs,
    the fastest device of the kind most ops allow is used.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 1, "b": 1}, [("a", "b", 8)])
    >>> sorted(set(place_single(g, gpus(2, speeds=[1.0, 2.0])).placement.values()))
    ['/GPU:1']
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    devs = cluster.devices
    main = max(_main_gpus(prob), key=lambda d: (devs[d].speed, -d))
    place = [0] * prob.n
    for mem in prob.members:
        allowed = prob.allowed[mem[0]]
        d = main if main in allowed else max(allowed, key=lambda e: (devs[e].speed, -e))
        for i in mem:
            place[i] = d
    return _done(graph, cluster, prob, place, "single", t0, stats={"device": prob.dev_names[main]},
                 repair=False)


# -- Expert ---------------------------------------------------------------------------
LAYER_RE = re.compile(r"layer_?(\d+)")
CELL_RE = re.compile(r"cell_(\d+)/branch_(\d+)")
FIRST_WORDS = ("embed",)
LAST_WORDS = ("softmax", "attention", "loss", "output_projection")


def expert_assignment(graph: OpGraph, n_devices: int) -> tuple[list[int], dict]:
    """Device slot (0..n_devices-1) of every op, as a practitioner splits by name scope.

    Mapping (looked up in ``op.scope``, then ``op.name``; gradient ops carry
    their forward scope under ``gradients/`` so they follow their layer):

    * ``cell_<k>/branch_<b>`` (NASNet cells): branch ``b`` on slot ``b mod n``,
      so the branches of every cell run side by side on all GPUs;
    * ``layer_<k>`` (also ``layer<k>``): stacked layer ``k``. The layers found
      are spread contiguously over the slots, balancing their compute
      (layer ``k`` goes to slot ``floor(n * compute before its middle / total)``);
    * names with ``embed``: with the first layer (slot of the lowest ``k``, else 0);
    * ``softmax``, ``attention``, ``loss``, ``output_projection``: with the
      last layer (slot of the highest ``k``, else ``n - 1``);
    * anything else follows the majority of its already-assigned neighbours
      (forward and backward sweeps in topological order, repeated while
      something changes); ops still unassigned, and the whole graph when no
      op has a layer or cell scope (keywords alone do not say how to split),
      get the generic split: contiguous chunks of the topological order
      balancing compute.

    What that gives on the zoo models (:mod:`pesto.zoo` scopes), ``n`` GPUs:

    * rnnlm: ``embed`` + the first layers on GPU 0, ``rnn/layer_<k>/t<s>``
      in contiguous blocks, ``softmax``/``loss`` with the last layer;
    * nmt: ``encoder/layer_k`` and ``decoder/layer_k`` share a GPU (layer k
      of both stacks, as GNMT is split by hand), ``embed_src``/``embed_tgt``
      on the first GPU, ``attention/t<s>``, ``output_projection`` and ``loss``
      on the last;
    * transformer: ``layer_<k>/...`` (its attention included) in contiguous
      blocks, ``embed`` first, ``output_projection``/``loss`` last;
    * nasnet: ``cell_<k>/branch_<b>`` on GPU ``b mod n``; ``stem`` and
      ``cell_<k>/combine`` follow their neighbours, ``softmax``/``loss`` on
      the last GPU.

    Returns the slots and a summary (how many ops each rule matched).

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph, Edge
    >>> ops = [Op(f"layer_{k}/m", {"GPU": 1.0}, scope=f"layer_{k}") for k in range(4)]
    >>> g = OpGraph(ops, [Edge(f"layer_{k}/m", f"layer_{k+1}/m") for k in range(3)])
    >>> expert_assignment(g, 2)[0]
    [0, 0, 1, 1]
    """
    ops = graph.ops
    n = len(ops)
    w = [min(op.compute[k] for k in op.kinds) for op in ops]
    slot = [-1] * n
    layer = [-1] * n
    kind = [""] * n  # "cell", "layer", "first", "last"
    for i, op in enumerate(ops):
        for text in (op.scope, op.name):
            m = CELL_RE.search(text)
            if m:
                slot[i] = int(m.group(2)) % n_devices
                kind[i] = "cell"
                break
            m = LAYER_RE.search(text)
            if m:
                layer[i] = int(m.group(1))
                kind[i] = "layer"
                break
        if kind[i]:
            continue
        low = (op.scope + "/" + op.name).lower()
        if any(word in low for word in FIRST_WORDS):
            kind[i] = "first"
        elif any(word in low for word in LAST_WORDS):
            kind[i] = "last"
    layers = sorted({l for l in layer if l >= 0})
    layer_slot = _layer_slots(layers, layer, w, n_devices)
    first = layer_slot[layers[0]] if layers else 0
    last = layer_slot[layers[-1]] if layers else n_devices - 1
    for i in range(n):
        if kind[i] == "layer":
            slot[i] = layer_slot[layer[i]]
        elif kind[i] == "first":
            slot[i] = first
        elif kind[i] == "last":
            slot[i] = last
    matched = sum(1 for s in slot if s >= 0)
    summary = {"cell": kind.count("cell"), "layer": kind.count("layer"), "first": kind.count("first"),
               "last": kind.count("last")}
    topo = graph.topo_idx()
    if summary["cell"] + summary["layer"] == 0:
        summary["fallback"] = "generic"
        return _generic_split(topo, w, n_devices), summary
    _follow_neighbours(slot, topo, graph.succ_idx(), graph.pred_idx())
    left = [i for i in range(n) if slot[i] < 0]
    summary["neighbours"] = n - matched - len(left)
    if left:
        gen = _generic_split(topo, w, n_devices)
        for i in left:
            slot[i] = gen[i]
        summary["generic"] = len(left)
    return slot, summary


def _layer_slots(layers: list[int], layer: list[int], w: list[float], n_devices: int) -> dict:
    """Slot of each stacked layer: contiguous blocks balancing layer compute
    (layer ``k`` goes to the slot holding the middle of its compute)."""
    layer_slot: dict = {}
    if not layers:
        return layer_slot
    lw = Counter()
    for i, l in enumerate(layer):
        if l >= 0:
            lw[l] += w[i]
    total = sum(lw.values()) or 1.0
    acc = 0.0
    for l in layers:
        mid = acc + lw[l] / 2
        layer_slot[l] = min(n_devices - 1, int(n_devices * mid / total)) if total > 0 else 0
        acc += lw[l]
    # with equal weights the rule above can leave slots unused; spread by count then
    if len(set(layer_slot.values())) < min(n_devices, len(layers)) and sum(lw.values()) == 0:
        for k, l in enumerate(layers):
            layer_slot[l] = k * n_devices // len(layers)
    return layer_slot


def _follow_neighbours(slot: list[int], topo: list[int], succ, pred) -> None:
    """Give each op without a slot the majority slot of its assigned
    neighbours (forward and backward sweeps, repeated while something
    changes, at most 6 times). Modifies ``slot``."""
    changed = True
    sweeps = 0
    while changed and sweeps < 6:
        changed = False
        sweeps += 1
        for seq in (topo, topo[::-1]):
            for i in seq:
                if slot[i] >= 0:
                    continue
                votes = Counter(slot[j] for j in pred[i] if slot[j] >= 0)
                votes.update(slot[j] for j in succ[i] if slot[j] >= 0)
                if votes:
                    slot[i] = max(votes, key=lambda s: (votes[s], -s))
                    changed = True


def _generic_split(topo: list[int], w: list[float], k: int) -> list[int]:
    """Contiguous chunks of a topological order, balancing compute over ``k``
    (op ``i`` goes to the chunk holding the middle of its compute)."""
    total = sum(w)
    out = [0] * len(w)
    if total <= 0:  # no compute figures: balance op counts
        for pos, i in enumerate(topo):
            out[i] = pos * k // max(1, len(topo))
        return out
    acc = 0.0
    for i in topo:
        out[i] = min(k - 1, int(k * (acc + w[i] / 2) / total))
        acc += w[i]
    return out


def place_expert(graph: OpGraph, cluster: Cluster) -> Plan:
    """Expert placement (Pesto section 5.2): layer-wise split by name scope.

    Slots from :func:`expert_assignment` map to the main GPUs in device order;
    then kinds and colocation groups are fixed (a group goes where most of
    its compute is), and devices over their static memory shed whole groups to
    devices with room (:func:`pesto.memory.static_repair`). Run under TF's
    default FIFO scheduling. ``stats["expert"]`` counts the ops each rule
    matched.
    """
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    gpus = _main_gpus(prob)
    slots, summary = expert_assignment(graph, len(gpus))
    place = [gpus[s] for s in slots]
    _fix_units(prob, place)
    return _done(graph, cluster, prob, place, "expert", t0, stats={"expert": summary})


# -- METIS ------------------------------------------------------------------------------
def place_metis(graph: OpGraph, cluster: Cluster) -> Plan:
    """METIS k-way partition of the op graph over the main GPUs (pymetis).

    Vertex weight: compute time (µs, at least 1); edge weight: bytes carried
    (scaled into METIS's integer range, at least 1); the adjacency is made
    symmetric. Target part sizes follow device speeds. Afterwards kinds and
    colocation groups are fixed and over-full devices repaired as in Expert,
    and the plan runs under TF's default FIFO scheduling.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> g = OpGraph.from_edges({"a": 5, "b": 5, "c": 5, "d": 5}, [("a", "b", 100), ("c", "d", 100)])
    >>> p = place_metis(g, gpus(2))
    >>> p.placement["a"] == p.placement["b"] != p.placement["c"] == p.placement["d"]
    True
    """
    import pymetis

    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    gpus = _main_gpus(prob)
    n = prob.n
    k = len(gpus)
    stats: dict = {}
    if k == 1 or n <= 1:
        place = [gpus[0]] * n
    else:
        nbrs: list[dict] = [dict() for _ in range(n)]
        for i in range(n):
            for j, nb in prob.outs[i]:
                nbrs[i][j] = nbrs[i].get(j, 0) + nb
                nbrs[j][i] = nbrs[j].get(i, 0) + nb
        maxb = max((b for d in nbrs for b in d.values()), default=0)
        scale = max(1.0, maxb / 1_000_000)  # keep weights well inside 32-bit sums
        xadj, adjncy, ew = [0], [], []
        for i in range(n):
            for j, b in nbrs[i].items():
                adjncy.append(j)
                ew.append(1 + int(b / scale))
            xadj.append(len(adjncy))
        work = [min(prob.dur[i][d] for d in prob.allowed[i]) for i in range(n)]
        wmax = max(work, default=0.0)
        wscale = max(1.0, wmax / 100_000)
        vw = [1 + int(x / wscale) for x in work]
        speeds = [prob.cluster.devices[d].speed for d in gpus]
        tp = [s / sum(speeds) for s in speeds]
        if hasattr(pymetis, "CSRAdjacency"):
            adj = pymetis.CSRAdjacency(xadj, adjncy)
            cut, parts = pymetis.part_graph(k, adj, vweights=vw, eweights=ew, tpwgts=tp)
        else:  # pymetis < 2025.2
            cut, parts = pymetis.part_graph(k, xadj=xadj, adjncy=adjncy, vweights=vw, eweights=ew,
                                            tpwgts=tp)
        stats["edge_cut"] = int(cut)
        place = [gpus[p] for p in parts]
    _fix_units(prob, place)
    return _done(graph, cluster, prob, place, "metis", t0, stats=stats)
