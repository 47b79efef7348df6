"""Enforce a :class:`pesto.Plan` on a tf.Graph: devices and op order.

1. Check the plan against the graph's colocation groups *before* TF sees it:
   a group split over devices raises :class:`pesto.InvalidPlanError` naming
   the group and its devices. A gradient sum's colocation with its first
   summand (:func:`tf_patch.extract.aggregation_colocated`) is no group: the
   plan may put the sum elsewhere.
2. Set each op's device (plan ``/CPU:1`` -> ``/job:localhost/.../device:CPU:1``),
   and clear the ``_class`` of each placed gradient sum the plan is free to
   move (the same rule), so TensorFlow's placer does not join it back to its
   first summand (``Applied.unbound`` lists them).
3. Add the plan's per-device order as control dependencies between
   consecutive ops of a device, skipping pairs already ordered by a path in
   the graph (ops without inputs, e.g. variable handles, are not chained:
   they cost nothing and an edge into a handle would reach its initialiser).
   Every edge is checked first: one that would close a cycle (a
   plan whose orders contradict the data flow across devices) raises
   :class:`pesto.CycleError` with the cycle, and nothing is changed.
   TensorFlow's runtime then fuses some pairs of ops into one kernel
   (:mod:`tf_patch.fusion`: oneDNN's Conv2D + BiasAdd and
   Conv2DBackpropFilter + BiasAddGrad). An order edge is left out only where
   such a fusion needs it: an edge into a Conv2D or BiasAdd it fuses (a
   control input stops the fusion), or one that would run from the fused
   kernel into its own input (the step stopped with ``Retval[0] does not
   have value``: ResNet50, edge ``conv -> bias read``). An edge into one of
   a fused backprop pair is copied onto the other, so both still fuse.
   ``Applied.left_out`` lists them with the reason, ``Applied.note`` counts
   them. A plan that puts the two ops of a pair the unplaced step fuses on
   different devices would keep them apart, and the unfused kernels round
   differently (the losses were no longer the unplaced step's bit for bit):
   :func:`keep_fusions` moves the pair's bias op (BiasAdd, BiasAddGrad,
   the cheap one) onto its partner's device first, next to it in the order;
   ``Applied.moved`` lists the moves.
4. :func:`verify` creates a session with ``allow_soft_placement=False`` and
   grappler's reordering passes off (:func:`tf_patch.devices.session_config`),
   so TF's own placer accepts the placement or fails loudly.

Examples
--------
>>> info = apply_plan(model.graph, plan)                      # doctest: +SKIP
>>> len(info.control_edges), info.skipped                     # doctest: +SKIP
"""
from __future__ import annotations

from . import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from dataclasses import dataclass, field

from pesto.dag import reachability, toposort
from pesto.errors import CycleError, InvalidPlanError

from .extract import aggregation_colocated, class_attr, colocation_groups
from .devices import map_devices, session_config, tf_device
from .fusion import fusions as find_fusions

__all__ = ["Applied", "Order", "REASONS", "check_colocation", "control_edges_for", "keep_fusions", "apply_plan",
           "order_note", "verify"]


@dataclass
class Applied:
    """What :func:`apply_plan` did."""

    devices: dict = field(default_factory=dict)        # op -> TF device string
    control_edges: list = field(default_factory=list)  # (a, b): b waits for a (all edges added)
    skipped: int = 0                                   # consecutive pairs already ordered
    left_out: list = field(default_factory=list)       # (a, b, reason): order edges not added
    fusions: list = field(default_factory=list)        # tf_patch.fusion.Fusion kept intact
    order_edges: int = 0                               # order edges that needed a control edge
    plan: object = None                                # the plan as applied (devices of this machine)
    note: str = ""                                     # how plan devices were mapped, how the order held
    n_devices: int = 0                                 # devices a session needs
    moved: list = field(default_factory=list)          # (op, plan device, device run on): keep_fusions
    unbound: list = field(default_factory=list)        # gradient sums whose _class was cleared

    @property
    def fusion_guarded(self) -> int:
        """Order edges left out to keep a oneDNN fusion (:attr:`left_out`)."""
        return len(self.left_out)

    @property
    def fused(self) -> dict:
        """Op fused away -> the name its fused kernel runs under (traces show that one)."""
        return {f.fused_away: f.survivor for f in self.fusions}


def check_colocation(graph, placement) -> None:
    """Raise InvalidPlanError if ``placement`` splits a TF colocation group.

    Groups are computed from the tf.Graph itself (``_class`` attributes and
    resource edges), not trusted from the plan's OpGraph.
    """

    ops = [graph.get_operation_by_name(n) for n in placement if _has_op(graph, n)]
    # include colocation partners not in the plan (e.g. a variable's initializer)
    groups = colocation_groups(ops)
    members: dict[str, dict[str, list]] = {}
    for op_name, g in groups.items():
        members.setdefault(g, {}).setdefault(placement[op_name], []).append(op_name)
    bad = []
    for g, by_dev in sorted(members.items()):
        if len(by_dev) > 1:
            where = "; ".join(f"{d}: {sorted(v)[:3]}{'...' if len(v) > 3 else ''}"
                              for d, v in sorted(by_dev.items()))
            bad.append(f"colocation group {g!r} is split over {sorted(by_dev)} ({where})")
    if bad:
        raise InvalidPlanError(bad)


def _has_op(graph, name):
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:
        return False


@dataclass
class Order:
    """What :func:`control_edges_for` decided.

    ``edges``: the control edges to add (the plan's order edges kept, plus
    copies of an edge into one op of a fused pair onto the other, so that
    both keep equal control inputs and still fuse); ``skipped``: consecutive
    pairs a path of the graph orders already; ``left_out``: ``(a, b,
    reason)`` order edges not added (:data:`REASONS`); ``fusions``: the
    oneDNN merges kept intact; ``order_edges``: the plan's order edges that
    needed a control edge (kept + left out).
    """

    edges: list
    skipped: int
    left_out: list
    fusions: list
    order_edges: int


#: why an order edge was left out (the keys of ``Applied.left_out``'s reasons)
REASONS = {"stops-fusion": "into a Conv2D or BiasAdd oneDNN fuses (a control input stops the fusion)",
           "fusion-cycle": "would close a cycle through a fused kernel",
           "inside-fusion": "between two ops of one fused kernel",
           "aborts-tf": "would give a Conv2D and its BiasAdd the same control inputs (oneDNN's merge then "
                        "aborts TensorFlow)"}


def control_edges_for(graph, plan, *, max_bitset_ops: int = 60000) -> Order:
    """The control edges enforcing ``plan.order`` on ``graph``.

    A consecutive pair (a, b) on a device is skipped when a path a -> ... ->
    b exists already (reachability by bitsets; for graphs over
    ``max_bitset_ops`` only direct edges are detected). The other pairs are
    order edges; an order edge is left out only where a runtime fusion of
    :mod:`tf_patch.fusion` needs it: it would stop a fusion oneDNN makes in
    the unplaced step, or close a cycle through a fused kernel
    (:func:`_guard_fusions`).

    Returns
    -------
    Order

    Raises
    ------
    CycleError
        The plan's order contradicts the data flow (a cycle without any
        fusion); nothing is changed.
    """
    ops = graph.get_operations()
    names, idx, succ, sources = _successors(graph)
    reach = _reach(succ, names) if len(ops) <= max_bitset_ops else None
    cand, skipped, chain = [], 0, {"next": {}, "prev": {}, "pos": {}}
    for seq in plan.order.values():
        seq = [idx[n] for n in seq if n in idx and n not in sources]
        chain["pos"].update((k, p) for p, k in enumerate(seq))
        for a, b in zip(seq, seq[1:]):
            chain["next"][a], chain["prev"][b] = b, a
            if b in succ[a] or (reach is not None and (reach[a] >> b) & 1):
                skipped += 1
            else:
                cand.append((a, b))
    _toposort(_with_edges(succ, cand), names, what="graph with the plan's control edges")
    fus = find_fusions(graph, plan.placement)
    pairs = [(f.pattern, idx[f.ops[0]], idx[f.ops[1]]) for f in fus]
    left, mirror = _guard_fusions(succ, names, cand, pairs, chain, exact=reach is not None)
    _break_fused_cycles(succ, names, cand, pairs, left, mirror)
    edges = [e for e in cand if e not in left] + [m for e, ms in mirror.items() if e not in left for m in ms]
    _spare_unfused(graph, idx, edges, left, [f for f in find_fusions(graph, plan.placement, control=False)
                                             if f.pattern == "Conv2D+BiasAdd" and f not in fus])
    edges = [e for e in edges if e not in left]
    return Order([(names[a], names[b]) for a, b in dict.fromkeys(edges)], skipped,
                 [(names[a], names[b], why) for (a, b), why in left.items()], fus, len(cand))


def _guard_fusions(succ, names, cand, pairs, chain, *, exact: bool):
    """``(left, mirror)``: the order edges ``cand`` to leave out (edge ->
    reason) and the copies to add with a kept edge (edge -> copies), around
    the fused ``pairs`` ``(pattern, i, j)`` (op indices, the pattern's order).

    * ``Conv2D + BiasAdd`` (p, s): fused only while neither has a control
      input, so an order edge into either is left out (``stops-fusion``);
      the edge out of p (to v) is left out when v reaches s (``fusion-cycle``:
      the fused kernel would wait on v, which waits on it).
    * ``Conv2DBackpropFilter + BiasAddGrad`` (siblings reading one
      gradient): fused while their control inputs are equal, so an edge into
      one is copied onto the other. Of the two, ``a`` comes first on the
      device and ``b`` later: adjacent, the edge a -> b is inside the kernel
      (``inside-fusion``); else the kernel takes b's turn (the edge out of a
      left out) or, where an op between them needs a's output, a's turn (the
      edge into b left out), or both where neither alone breaks every cycle;
      where a reaches b through order edges between other ops,
      :func:`_break_fused_cycles` leaves one of those out.

    Reachability (``exact``: bitsets; else direct edges only) is on the
    graph with the order edges that touch no fused op.
    """
    member = {k for _, i, j in pairs for k in (i, j)}
    cset = set(cand)
    reach = _reach(_with_edges(succ, [e for e in cand if not member & set(e)]), names) if exact else None

    def reaches(x, y):
        return y in succ[x] if reach is None else bool((reach[x] >> y) & 1)

    def edge(a, b):
        return (a, b) if (a, b) in cset else None

    nxt, prv, left, mirror = chain["next"], chain["prev"], {}, {}
    for pattern, i, j in pairs:
        if pattern == "Conv2D+BiasAdd":
            left.update({(prv[k], k): "stops-fusion" for k in (i, j) if edge(prv.get(k), k)})
            if edge(i, nxt.get(i)) and reaches(nxt[i], j):
                left[(i, nxt[i])] = "fusion-cycle"
            continue
        a, b = sorted((i, j), key=chain["pos"].get)
        in_a, out_a, in_b = edge(prv.get(a), a), edge(a, nxt.get(a)), edge(prv.get(b), b)
        if in_a:
            mirror.setdefault(in_a, []).append((in_a[0], b))
        if nxt.get(a) == b:
            if out_a:
                left[out_a] = "inside-fusion"
            continue
        if reaches(a, b):  # through order edges between other ops: _break_fused_cycles leaves one out
            if in_b:
                mirror.setdefault(in_b, []).append((in_b[0], a))
            continue
        b_turn = in_b is None or not reaches(a, in_b[0])
        a_turn = out_a is None or not reaches(out_a[1], b)
        if b_turn and in_b:
            mirror.setdefault(in_b, []).append((in_b[0], a))
        drop = [out_a] if b_turn else [in_b] if a_turn else [out_a, in_b]
        left.update({e: "fusion-cycle" for e in drop if e})
    return left, mirror


def _break_fused_cycles(succ, names, cand, pairs, left, mirror, *, max_rounds: int = 1000) -> None:
    """Leave out order edges (into ``left``) until the graph with the kept
    edges and copies has no cycle once each fused pair is one kernel: a
    cycle :func:`_guard_fusions` does not break (it runs through order edges
    between other ops, or around several fused pairs) loses its first order
    edge."""
    rep = {i: j for _, i, j in pairs}  # a pair contracted onto its second op
    for _ in range(max_rounds):
        on_rep = {}
        for e in cand:
            if e not in left:
                for a, b in [e] + mirror.get(e, []):
                    on_rep.setdefault((rep.get(a, a), rep.get(b, b)), e)
        fused = [{rep.get(j, j) for j in s} for s in succ]
        for i, j in rep.items():
            fused[j] |= fused[i]
            fused[i] = set()
        for a, b in on_rep:
            fused[a].add(b)
        for k, s in enumerate(fused):
            s.discard(k)
        cyc = _cycle(fused)
        if cyc is None:
            return
        culprit = next((on_rep[p] for p in zip(cyc, cyc[1:] + cyc[:1]) if p in on_rep), None)
        if culprit is None:  # the graph's own edges: TF would hang unplaced too
            raise CycleError([names[k] for k in cyc], what="graph once oneDNN fuses its kernels")
        left[culprit] = "fusion-cycle"
    raise CycleError([], what=f"graph once oneDNN fuses its kernels (still cyclic after {max_rounds} rounds)")


def _spare_unfused(graph, idx, edges, left, pairs) -> None:
    """Leave out the order edges into a Conv2D + BiasAdd pair that oneDNN
    does not fuse (their control inputs differ) where they would give both
    the same control inputs: oneDNN would then try the merge and abort
    TensorFlow (a ``CHECK`` in ``mkl_layout_pass``)."""
    into = {}
    for a, b in edges:
        into.setdefault(b, set()).add(a)
    for f in pairs:
        conv, bias = (graph.get_operation_by_name(n) for n in f.ops)
        ic, ib = idx[conv.name], idx[bias.name]
        has = [{idx[c.name] for c in op.control_inputs} | into.get(i, set()) for op, i in ((conv, ic), (bias, ib))]
        if has[0] and has[0] == has[1]:
            left.update({(a, i): "aborts-tf" for i in (ic, ib) for a in into.get(i, ())})


def _successors(graph):
    """``(names, idx, succ, sources)`` of ``graph``'s ops: successor sets by
    index (data and control edges), and the ops without inputs (variable
    handles, constants, placeholders), which the order chains leave out:
    they cost nothing, and an edge into a variable handle would drag step
    ops into its initialiser's run."""
    ops = graph.get_operations()
    names = [op.name for op in ops]
    idx = {n: i for i, n in enumerate(names)}
    succ = [set() for _ in ops]
    for op in ops:
        for t in op.inputs:
            succ[idx[t.op.name]].add(idx[op.name])
        for c in op.control_inputs:
            succ[idx[c.name]].add(idx[op.name])
    return names, idx, succ, {op.name for op in ops if not op.inputs and not op.control_inputs}


def keep_fusions(graph, plan):
    """``(plan, moved)``: ``plan`` with the bias op of each pair the unplaced
    step fuses (:mod:`tf_patch.fusion`, every op on one CPU device) but the
    plan splits over two CPU devices moved onto its partner's device.

    The BiasAdd goes right after its Conv2D (after the BiasAdd's inputs on
    that device, if any come later), the BiasAddGrad right before its
    Conv2DBackpropFilter (both read one gradient), so the pair runs as the
    one kernel it is unplaced. A move that would make the plan's orders
    contradict the data flow is not made (the pair stays split).
    ``moved``: ``(op, plan device, new device)``.
    """
    place = dict(plan.placement)
    if not any("CPU" in d.upper() for d in place.values()):
        return plan, []
    order = {d: list(seq) for d, seq in plan.order.items()}
    moved, graph_edges = [], None
    for f in find_fusions(graph, {n: "/CPU:0" for n in place}):
        op, partner = f.ops[1], f.ops[0]
        src, dst = place[op], place[partner]
        if src == dst or "CPU" not in src.upper() or "CPU" not in dst.upper() or op not in order.get(src, ()):
            continue
        seq = list(order[dst])
        if f.pattern == "Conv2D+BiasAdd":
            inputs = {t.op.name for t in graph.get_operation_by_name(op).inputs}
            seq.insert(1 + max(i for i, n in enumerate(seq) if n == partner or n in inputs), op)
        else:
            seq.insert(seq.index(partner), op)
        trial = {**order, src: [n for n in order[src] if n != op], dst: seq}
        graph_edges = graph_edges or _successors(graph)
        if _orders_cycle(graph_edges, trial) is None:
            order, place[op] = trial, dst
            moved.append((op, src, dst))
    if not moved:
        return plan, []
    return plan.replace(placement=place, order={d: tuple(seq) for d, seq in order.items()}), moved


def _orders_cycle(graph_edges, order):
    """A cycle of the graph (``_successors``) with each device's ``order``
    chained (sources left out), or None."""
    _, idx, succ, sources = graph_edges
    chains = []
    for seq in order.values():
        seq = [idx[n] for n in seq if n in idx and n not in sources]
        chains += zip(seq, seq[1:])
    return _cycle(_with_edges(succ, chains))


def _with_edges(succ, edges):
    out = [set(s) for s in succ]
    for a, b in edges:
        out[a].add(b)
    return out


def _lists(succ):
    """Successor lists (``pesto.dag`` walks them in order; ours may be sets)."""
    return [sorted(s) for s in succ]


def _reach(succ, names):
    """Bitsets: ``reach[i]`` has bit j set when a path i -> ... -> j exists."""
    succ = _lists(succ)
    return reachability(succ, toposort(succ, names=names, what="tf graph"))


def _cycle(succ):
    """A cycle of ``succ`` (op indices, in order), or None."""
    try:
        toposort(_lists(succ))
    except CycleError as exc:
        return exc.cycle
    return None


def _toposort(succ, names, what="tf graph"):
    return toposort(_lists(succ), names=names, what=what)


def apply_plan(graph, plan, *, order: bool = True, n_devices: int = 0) -> Applied:
    """Set devices (and, with ``order``, control edges) on ``graph`` in place.

    Plan devices are mapped onto this machine first
    (:func:`tf_patch.devices.map_devices`), and a oneDNN pair the plan
    splits is joined (:func:`keep_fusions`, ``Applied.moved``): ``/GPU:k`` stays where there are
    enough GPUs, else runs on logical CPU device ``/CPU:k``; ``Applied.note``
    says which, ``Applied.n_devices`` how many devices a session needs (at
    least ``n_devices``), and how much of the order is enforced
    (:func:`order_note`).

    Raises
    ------
    InvalidPlanError
        The plan splits a colocation group, or names an op not in the graph.
    CycleError
        The plan's order would close a cycle.
    """

    plan, note, needed = map_devices(plan, n_devices)
    missing = [n for n in plan.placement if not _has_op(graph, n)]
    if missing:
        raise InvalidPlanError([f"plan places op {m!r} that is not in the tf.Graph" for m in missing[:20]])
    plan, moved = keep_fusions(graph, plan)
    check_colocation(graph, plan.placement)
    decided = control_edges_for(graph, plan) if order else Order([], 0, [], [], 0)
    out = Applied(skipped=decided.skipped, left_out=decided.left_out, fusions=decided.fusions,
                  order_edges=decided.order_edges, plan=plan, n_devices=needed, moved=moved)
    out.note = note + ("; " + order_note(out) if order else "")
    # decided before any change: clearing one sum's _class changes the rule's answer for the next
    out.unbound = sorted(n for n in plan.placement if aggregation_colocated(graph.get_operation_by_name(n)))
    if moved:
        out.note += (f"; {len(moved)} bias op(s) moved onto the device of the convolution they fuse with "
                     "unplaced (so the step computes its values bit for bit)")
    for name, dev in plan.placement.items():
        d = tf_device(dev)
        graph.get_operation_by_name(name)._set_device(d)
        out.devices[name] = d
    for name in out.unbound:
        graph.get_operation_by_name(name)._clear_attr("_class")
    # ops outside the plan that TF colocates with a placed op (initialisers,
    # Adam's beta powers' initial values...) follow it, so nothing is split
    _follow_colocation(graph, out.devices)
    for a, b in decided.edges:
        graph.get_operation_by_name(b)._add_control_input(graph.get_operation_by_name(a))
    out.control_edges = decided.edges
    return out


def order_note(applied: Applied) -> str:
    """One sentence: how many of the plan's order edges are enforced, and why
    any are left out (:data:`REASONS`).

    Examples
    --------
    >>> a = Applied(left_out=[("c", "r", "fusion-cycle")], order_edges=40, skipped=9)
    >>> order_note(a)  # doctest: +NORMALIZE_WHITESPACE
    'order: 39 of 40 order edges enforced (9 more pairs already ordered by the graph), 1 left out (2.5 %):
    1 would close a cycle through a fused kernel; 0 oneDNN fusions kept'
    """
    n, k = applied.order_edges, len(applied.left_out)
    text = (f"order: {n - k} of {n} order edges enforced ({applied.skipped} more pairs already ordered by the "
            f"graph), {k} left out ({100 * k / max(n, 1):.1f} %)")
    if k:
        counts = {}
        for *_, why in applied.left_out:
            counts[why] = counts.get(why, 0) + 1
        text += ": " + ", ".join(f"{c} {REASONS[w]}" for w, c in sorted(counts.items(), key=lambda x: -x[1]))
    return text + f"; {len(applied.fusions)} oneDNN fusions kept"


def _follow_colocation(graph, devices):
    """Put each op outside ``devices`` (op -> device) that TF colocates with
    a placed op on that op's device. Runs after :func:`apply_plan` cleared
    the ``_class`` of the placed gradient sums it unbinds, so the rule is
    :func:`check_colocation`'s: an unplaced sum keeps its ``_class``, which TF
    binds, so it follows its first summand's group like any other op."""
    import tensorflow as tf

    for op in graph.get_operations():
        if op.name in devices:
            continue
        target = None
        for loc in class_attr(op):
            if loc.startswith(b"loc:@") and loc[5:].decode() in devices:
                target = devices[loc[5:].decode()]
        if target is None:
            for t in op.inputs:
                if t.op.name in devices and (t.dtype.base_dtype == tf.resource or t.dtype._is_ref_dtype):
                    target = devices[t.op.name]
        if target is not None:
            op._set_device(target)


def verify(graph, n_devices: int, *, kind: str = "CPU", init_op=None, fetches=None, feed=None):
    """Create a session with no soft placement and run ``init_op`` (and
    ``fetches`` once if given): TF's placer must accept the placement.
    Returns the open session (caller closes it)."""
    import tensorflow as tf

    sess = tf.compat.v1.Session(graph=graph, config=session_config(n_devices, kind=kind))
    try:
        if init_op is not None:
            sess.run(init_op)
        if fetches is not None:
            sess.run(fetches, feed or {})
    except Exception:
        sess.close()
        raise
    return sess
