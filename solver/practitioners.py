"""Practitioners' placers: single device, Expert (layers in contiguous stages, a
user mapping, or the paper's split by name), METIS.

All three run under TensorFlow's default scheduling (each device's FIFO ready
queue): :func:`pesto.finalize.finalize` is called with ``order=None``. All
respect op kinds and colocation groups, and follow the memory-infeasible
behaviour of :mod:`pesto.memory`: over-full devices are repaired by
simulation (:func:`pesto.finalize.fit_memory`, as in the list schedulers of
:mod:`solver.heuristics`); the plan is returned over capacity only when no
repair fits, with status ``"infeasible"`` and a
:class:`~pesto.outcome.MemoryInfo` (``over``, ``forced``).

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
from typing import Mapping, Sequence

from pesto.cluster import Cluster
from pesto.dag import top_levels
from pesto.deadline import Deadline
from pesto.graph import OpGraph
from pesto.finalize import fit_memory
from pesto.memory import static_repair
from pesto.outcome import ExpertInfo, HeuristicInfo
from pesto.plan import Plan
from pesto.problem import Problem
from pesto.simulate import simulate

from .parallel.cut import split_stages

__all__ = ["place_single", "place_expert", "place_metis", "expert_assignment", "expert_blocks",
           "pipeline_cuts"]


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


def _done(graph, cluster, prob, place, placer, t0, info=(), repair=True):
    """The FIFO plan of ``place``, repaired by simulation
    (:func:`pesto.finalize.fit_memory`); if that stays over capacity, also
    from the static repair (:func:`pesto.memory.static_repair`, whose
    schedule-free model is too pessimistic to run first), keeping the plan
    least over capacity."""
    start = list(place)
    plan = fit_memory(graph, cluster, place, order=None, placer=placer, t0=t0, info=info, repair=repair)
    if plan.status != "infeasible" or not repair:
        return plan
    stuck = static_repair(prob, start)
    other = fit_memory(graph, cluster, start, order=None, placer=placer, t0=t0, info=info, forced=stuck)
    return min((other, plan), key=lambda p: (_overrun(prob, p), p.makespan))


def _overrun(prob: Problem, plan: Plan) -> int:
    return sum(max(0, b - prob.cap[prob.dev_index[d]]) for d, b in (plan.peak_memory or {}).items())


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
    return _done(graph, cluster, prob, place, "single", t0, info=(HeuristicInfo(device=prob.dev_names[main]),),
                 repair=False)


# -- Expert ---------------------------------------------------------------------------
LAYER_RE = re.compile(r"layer_?(\d+)")
CELL_RE = re.compile(r"cell_(\d+)/branch_(\d+)")
FIRST_WORDS = ("embed",)
LAST_WORDS = ("softmax", "attention", "loss", "output_projection")


def expert_assignment(graph: OpGraph, n_devices: int) -> tuple[list[int], dict]:
    """Device slot (0..n_devices-1) of every op by the Pesto paper's name rules
    (``place_expert(..., rule="paper")``; the default Expert also times it).

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

    What that gives on the zoo models (:mod:`tf_patch.zoo` scopes), ``n`` GPUs:

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


EXPERT_RULES = ("auto", "layers", "scopes", "paper")
GRAD_SCOPES = re.compile(r"^(gradients(_\d+)?|gradient_tape|training|train)$")
LAYER_PART = re.compile(r"^layer_?(\d+)$")


def place_expert_paper(graph: OpGraph, cluster: Cluster) -> Plan:
    """Expert as the Pesto paper defines it: the layer-wise split by name
    (:func:`expert_assignment`), kept for comparison with the paper.

    Equivalent to ``place_expert(graph, cluster, rule="paper")``.
    """
    return place_expert(graph, cluster, rule="paper").replace(placer="expert-paper")


def place_expert(graph: OpGraph, cluster: Cluster, *, mapping: Mapping[str, str] | None = None,
                 rule: str = "auto", deadline: Deadline | None = None) -> Plan:
    """Expert placement: what a practitioner does by hand, under TF's FIFO scheduling.

    * ``mapping`` given (scope or name prefix -> device, e.g.
      ``{"encoder": "/GPU:0", "decoder": "/GPU:1"}``; TF device strings
      accepted): each op goes where the longest prefix of its scope, or
      name, says (gradient and optimizer ops follow their forward scope);
      rule ``"mapping"``.
    * otherwise the graph's layers become blocks (:func:`expert_blocks`):
      ``layer_<k>`` scopes when they hold most of the compute (rule
      ``"layers"``), else name scopes at the depth that splits the compute
      finest (rule ``"scopes"``); the blocks, in forward order, are cut into
      contiguous stages by :func:`pipeline_cuts` (balanced compute, small
      cuts), stage ``s`` on GPU ``s``. The cuts for 1, 2, ... all GPUs are
      simulated and the fastest kept (``ExpertInfo.stages``): an
      expert times a few splits and does not split when splitting is slower.
    * ``rule="paper"``: the layer split of the Pesto paper
      (:func:`expert_assignment`), kept for comparison; ``rule="auto"``
      (default) also times it when the graph has ``layer_<k>`` or
      ``cell_<k>/branch_<b>`` names and keeps it if it is faster.

    Kinds and colocation groups are then fixed (a group goes where most of its
    compute is) and memory is repaired (:func:`pesto.finalize.fit_memory`).
    Its :class:`~pesto.outcome.ExpertInfo` says which ``rule`` made the plan
    and the simulated step time of each split tried (``candidates``). With
    ``deadline``, no further split is timed once it has passed (``cut`` says
    why).

    Examples
    --------
    >>> from pesto.cluster import gpus
    >>> from pesto.graph import OpGraph
    >>> names = ["input"] + [f"{d}/block{b}/{op}" for d in ("fwd", "bwd") for b in range(4) for op in ("mm", "concat")]
    >>> g = OpGraph.from_edges({n: 10.0 for n in names}, [(u, v, 1 << 20) for u, v in zip(names, names[1:])])
    >>> p = place_expert(g, gpus(2), mapping={"fwd": "/GPU:0", "bwd": "GPU:1", "input": "/GPU:0"})
    >>> p.info_of(ExpertInfo).rule, p.placement["fwd/block0/concat"], p.placement["bwd/block3/concat"]
    ('mapping', '/GPU:0', '/GPU:1')
    >>> place_expert(g, gpus(2)).info_of(ExpertInfo).rule
    'scopes'
    """
    if rule not in EXPERT_RULES:
        raise ValueError(f"rule must be one of {EXPERT_RULES}, got {rule!r}")
    t0 = time.perf_counter()
    prob = Problem.of(graph, cluster)
    gpus = _main_gpus(prob)
    if mapping is not None:
        slots = _mapped_slots(graph, cluster, prob, mapping)
        place = _fix_units(prob, slots)
        return _done(graph, cluster, prob, place, "expert", t0, info=(ExpertInfo(rule="mapping"),))
    cands: dict = {}
    if rule in ("auto", "layers", "scopes"):
        blocks, found = expert_blocks(graph, prefer=None if rule == "auto" else rule)
        for k, slot in _stage_splits(prob, blocks, gpus).items():
            cands[f"{found}:{k}"] = (found, k, slot)
    if rule == "paper" or (rule == "auto" and _has_paper_names(graph)) or not cands:
        slot, summary = expert_assignment(graph, len(gpus))
        cands["paper"] = ("paper", len(set(slot)), [gpus[s] for s in slot])
    weight = [min(prob.dur[i][d] for d in prob.allowed[i]) for i in range(prob.n)]
    timed, fixed, cut = {}, {}, None
    for key, (_, _, slot) in cands.items():
        if timed and deadline is not None and deadline.expired():
            cut = deadline.reason or "time limit"
            break
        place = fixed[key] = _fix_units(prob, list(slot), weight)
        sched = simulate(graph, cluster, {graph.names[i]: prob.dev_names[place[i]] for i in range(prob.n)},
                         mode="fifo")
        over = sum(max(0, sched.peak_memory[d.name] - d.memory) for d in cluster.devices)
        timed[key] = (over, sched.makespan)
    best = min(timed, key=lambda k: (timed[k], k))
    found, k, _ = cands[best]
    info = ExpertInfo(rule=found, stages=k, candidates={key: round(v[1], 3) for key, v in timed.items()}, cut=cut)
    return _done(graph, cluster, prob, fixed[best], "expert", t0, info=(info,))


def _has_paper_names(graph: OpGraph) -> bool:
    return any(LAYER_RE.search(op.scope or op.name) or CELL_RE.search(op.scope or op.name)
               for op in graph.ops)


def _path(op) -> tuple[list[str], bool]:
    """An op's scope path with gradient and optimizer prefixes removed, and
    whether it had one (a backward or update op)."""
    text = op.scope or (op.name.rsplit("/", 1)[0] if "/" in op.name else "")
    parts = [x for x in text.split("/") if x]
    back = False
    while parts and GRAD_SCOPES.match(parts[0]):
        parts.pop(0)
        back = True
    if parts and parts[0].startswith("update_"):
        parts[0] = parts[0][len("update_"):]
        back = True
    return parts, back


def expert_blocks(graph: OpGraph, *, prefer: str | None = None) -> tuple[list[int], str]:
    """The layer block of every op (-1: none), numbered in forward order, and
    how the blocks were found (``"layers"`` or ``"scopes"``).

    A block is a forward scope prefix; an op (forward, gradient or optimizer:
    ``gradients/``, ``gradient_tape/``, ``train/update_`` are stripped) joins
    the longest block prefixing its scope. ``"layers"``: one block per layer
    number ``k`` of the ``layer_<k>`` parts, wherever they sit in the path
    (other ops by their first part), used when those hold at least half the
    compute. ``"scopes"``: prefixes of the depth (1 to 4)
    whose largest block has the smallest share of the compute (the first
    depth where it is at most a sixth). A colocation group takes the block of
    most of its members. Blocks are numbered by the compute-weighted mean
    earliest start of their forward ops.

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> names = [f"fwd/block{b}/{op}" for b in range(3) for op in ("mm", "concat")]
    >>> g = OpGraph.from_edges({n: 10.0 for n in names}, [(u, v, 1 << 20) for u, v in zip(names, names[1:])])
    >>> block, found = expert_blocks(g)
    >>> found, block[g.index["fwd/block0/concat"]] < block[g.index["fwd/block2/concat"]]
    ('scopes', True)
    """
    ops = graph.ops
    w = [min(op.compute[k] for k in op.kinds) for op in ops]
    total = sum(w) or 1.0
    paths = [_path(op) for op in ops]
    in_layer = sum(w[i] for i, (p, _) in enumerate(paths) if any(LAYER_PART.match(x) for x in p))
    found = prefer or ("layers" if in_layer >= total / 2 else "scopes")
    if found == "layers":
        keys = [_layer_prefix(p) for p, _ in paths]
    else:
        keys = _scope_keys(paths, w, total)
    return _number_blocks(graph, keys, w), found


def _layer_prefix(parts: list[str]) -> str:
    """``layer <k>`` for any path through a ``layer_<k>`` part (layer k of
    an encoder and a decoder, or of a forward and a backward stack, is one
    block, as stacked models are split by hand), else the first part."""
    for x in parts:
        m = LAYER_PART.match(x)
        if m:
            return f"layer {int(m.group(1))}"
    return parts[0] if parts else ""


def _scope_keys(paths, w, total) -> list[str]:
    """Each op's block key: the longest forward prefix (of the chosen depth) of its path."""
    best = None
    for depth in range(1, 5):
        fwd = {"/".join(p[:depth]) for p, back in paths if p and not back}
        keys = [_longest_prefix(p, fwd, depth) for p, _ in paths]
        share: Counter = Counter()
        for key, x in zip(keys, w):
            if key:
                share[key] += x
        top = max(share.values(), default=total) / total
        if best is None or top < best[0] - 1e-9:
            best = (top, keys)
        if top <= 1 / 6:
            break
    return best[1]


def _longest_prefix(parts: list[str], known: set, depth: int) -> str:
    for k in range(min(depth, len(parts)), 0, -1):
        key = "/".join(parts[:k])
        if key in known:
            return key
    return ""


def _number_blocks(graph: OpGraph, keys: list[str], w: list[float]) -> list[int]:
    """Block numbers from keys: units vote, then blocks ordered by the
    compute-weighted mean earliest start of their ops (forward ones when any)."""
    n = len(keys)
    unit_key: dict = {}
    for grp, members in graph.colocation_groups().items():
        votes = Counter(keys[graph.index[m]] for m in members if keys[graph.index[m]])
        if votes:
            unit_key[grp] = max(votes, key=lambda k: (votes[k], k))
    keys = [unit_key.get(op.colocation_group, keys[i]) if op.colocation_group else keys[i]
            for i, op in enumerate(graph.ops)]
    topo = graph.topo_idx()
    start = top_levels(graph.pred_idx(), w, order=topo)
    fwd = [not _path(op)[1] for op in graph.ops]
    acc: dict = {}
    for i in range(n):
        if keys[i]:
            a = acc.setdefault(keys[i], [0.0, 0.0, 0.0, 0.0])
            x = w[i] + 1e-6
            a[0 if fwd[i] else 2] += x * (start[i] - w[i])
            a[1 if fwd[i] else 3] += x
    pos = {k: (a[0] / a[1] if a[1] else a[2] / a[3]) for k, a in acc.items()}
    order = sorted(pos, key=lambda k: (pos[k], k))
    num = {k: b for b, k in enumerate(order)}
    return [num[k] if k else -1 for k in keys]


def pipeline_cuts(work: Sequence[float], cut: Sequence[float], k: int) -> list[int]:
    """Split blocks ``0..m-1`` into ``k`` contiguous non-empty stages
    minimising the largest stage cost, a stage's cost being its ``work``
    plus the ``cut`` cost on both its boundaries (``cut[j]``: between blocks
    ``j`` and ``j + 1``); the classic pipeline-partition DP, O(k m^2)
    (:func:`solver.parallel.cut.split_stages`).
    ``work`` may be a list per stage (``work[s][b]``, for devices of
    different speeds). Returns the first block of each stage.

    Examples
    --------
    >>> pipeline_cuts([1, 1, 1, 1, 4], [0, 0, 0, 0], 2)
    [0, 4]
    >>> pipeline_cuts([1, 1, 1, 1], [5, 0, 5], 2)
    [0, 2]
    """
    return list(split_stages(work, [0.0, *cut], k))   # the one partition DP


def _stage_splits(prob: Problem, blocks: list[int], gpus: list[int]) -> dict:
    """Device per op for the pipeline cuts over 1..len(gpus) stages (ops
    without a block follow their neighbours)."""
    m = max(blocks, default=-1) + 1
    if m == 0:
        return {}
    work = [0.0] * m
    for i, b in enumerate(blocks):
        if b >= 0:
            work[b] += min(prob.dur[i][d] for d in prob.allowed[i])
    diff = [0.0] * (m + 1)
    for _, q, nbytes, cons in prob.tensors:
        ends = [blocks[j] for j in (q, *cons) if blocks[j] >= 0]
        if nbytes and ends and min(ends) < max(ends):
            diff[min(ends)] += nbytes
            diff[max(ends)] -= nbytes
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    b0 = sum(prob.beta0[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    b1 = sum(prob.beta1[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    cut, acc = [], 0.0
    for j in range(m - 1):
        acc += diff[j]
        cut.append(b0 + b1 * acc if acc else 0.0)
    speed = [prob.cluster.devices[d].speed for d in gpus]
    out = {}
    for k in range(1, min(len(gpus), m) + 1):
        starts = pipeline_cuts([[x / speed[s] for x in work] for s in range(k)], cut, k)
        slot = stage_slots(blocks, starts)
        _follow_neighbours(slot, prob.topo, prob.succ, prob.pred)
        out[k] = [gpus[s] if s >= 0 else gpus[0] for s in slot]
    return out


def stage_slots(blocks: Sequence[int], starts: Sequence[int]) -> list[int]:
    """Stage per op of a contiguous split: block ``b`` is in stage ``s`` when
    ``starts[s] <= b < starts[s + 1]``; ops of no block (-1) get -1.

    >>> stage_slots([0, 1, -1, 2, 3], [0, 2])
    [0, 0, -1, 1, 1]
    """
    stage = [0] * (max(blocks, default=-1) + 1)
    for s, a in enumerate(starts):
        for b in range(a, starts[s + 1] if s + 1 < len(starts) else len(stage)):
            stage[b] = s
    return [stage[b] if b >= 0 else -1 for b in blocks]


def _mapped_slots(graph: OpGraph, cluster: Cluster, prob: Problem, mapping: Mapping[str, str]) -> list[int]:
    """Device per op from a prefix -> device mapping (longest prefix of the
    op's stripped scope path, or of its name; unmatched ops follow their
    neighbours, else the first main GPU)."""
    devs = {key.strip("/"): _device_named(cluster, dev) for key, dev in mapping.items()}
    slot = [-1] * prob.n
    for i, op in enumerate(graph.ops):
        parts, _ = _path(op)
        for text in ("/".join(parts + [op.name.rsplit("/", 1)[-1]]), op.name):
            hits = [k for k in devs if text == k or text.startswith(k + "/")]
            if hits:
                slot[i] = devs[max(hits, key=len)]
                break
    _follow_neighbours(slot, prob.topo, prob.succ, prob.pred)
    first = _main_gpus(prob)[0]
    return [s if s >= 0 else first for s in slot]


def _device_named(cluster: Cluster, name: str) -> int:
    """Index of a device by its name or a TF device string ending in ``KIND:i``."""
    if name in cluster.index:
        return cluster.index[name]
    tail = ":".join(name.upper().replace("/DEVICE:", "/").split("/")[-1].split(":")[-2:])
    hits = [k for k, d in enumerate(cluster.devices) if d.name.upper().endswith(tail)]
    if len(hits) != 1:
        raise ValueError(f"expert mapping: device {name!r} is not one device of the cluster "
                         f"({', '.join(d.name for d in cluster.devices)})")
    return hits[0]


# -- METIS ------------------------------------------------------------------------------
def _part_targets(speeds: list[float], least: float = 1e-6) -> list[float]:
    """METIS's target part weights: shares of the devices' speeds, each at
    least ``least`` (METIS works in float32 and rejects a share it rounds to
    0, e.g. a device of speed 1e-300 beside one of speed 1).

    >>> _part_targets([1.0, 1e-300])[1] > 0
    True
    """
    tp = [max(s / sum(speeds), least) for s in speeds]
    return [t / sum(tp) for t in tp]


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
    if len(gpus) > max(n, 1):  # METIS cannot cut n vertices into more parts (it prints errors): the n fastest
        gpus = sorted(sorted(gpus, key=lambda d: -prob.cluster.devices[d].speed)[:max(n, 1)])
    k = len(gpus)
    edge_cut = None
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
        tp = _part_targets(speeds)
        if hasattr(pymetis, "CSRAdjacency"):
            adj = pymetis.CSRAdjacency(xadj, adjncy)
            cut, parts = pymetis.part_graph(k, adj, vweights=vw, eweights=ew, tpwgts=tp)
        else:  # pymetis < 2025.2
            cut, parts = pymetis.part_graph(k, xadj=xadj, adjncy=adjncy, vweights=vw, eweights=ew,
                                            tpwgts=tp)
        edge_cut = int(cut)
        place = [gpus[p] for p in parts]
    _fix_units(prob, place)
    return _done(graph, cluster, prob, place, "metis", t0, info=(HeuristicInfo(edge_cut=edge_cut),) if edge_cut is not None else ())
