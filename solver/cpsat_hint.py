"""Hints for :class:`solver.cpsat_model.CpsatModel`: a plan as a full solution.

A plan's placement is relabelled to obey the model's symmetry breaking
(:func:`canonical`), its per-device order is rescheduled left-shifted in the
model's integer units by the scheduling engine (:func:`hint_schedule`, a
:class:`pesto.engine.Timeline`), and every model variable gets
the value that schedule implies (:func:`set_hint`), so CP-SAT starts from a
complete feasible solution: on big coarse graphs the first solution is then
immediate.
"""
from __future__ import annotations

from typing import Mapping

from pesto.engine import Timeline
from pesto.errors import InvalidPlanError
from pesto.plan import Plan
from pesto.simulate import simulate

__all__ = ["canonical", "set_hint", "hint_schedule"]


def canonical(model, placement: Mapping[str, str]) -> dict[str, str]:
    """Relabel devices inside each symmetric group of ``model`` in first-use
    order (ops in topological order).

    Examples
    --------
    >>> from pesto.graph import OpGraph
    >>> from pesto.cluster import gpus
    >>> from solver.cpsat_model import CpsatModel
    >>> g = OpGraph.from_edges({"a": 1, "b": 2}, [("a", "b", 10)])
    >>> canonical(CpsatModel(g, gpus(4)), {"a": "/GPU:3", "b": "/GPU:2"})
    {'a': '/GPU:0', 'b': '/GPU:1'}
    """
    if not model.sym_groups:
        return dict(placement)
    p = model.problem
    mapping: dict[str, str] = {}
    for grp in model.sym_groups:
        gnames = [p.dev_names[k] for k in grp]
        used = []
        for i in p.topo:
            d = placement[p.names[i]]
            if d in gnames and d not in used:
                used.append(d)
        rest = [d for d in gnames if d not in used]
        for old, new in zip(used + rest, gnames):
            mapping[old] = new
    return {op: mapping.get(d, d) for op, d in placement.items()}


def set_hint(model, plan: Plan) -> bool:
    """Replace ``model``'s hints by ``plan`` (placement, order, and times
    recomputed in model units). Returns False, leaving no hint, if the plan is
    not a plan of the model's graph and cluster."""
    model.model.clear_hints()
    p = model.problem
    try:
        if not plan.has_times:
            plan = simulate(model.graph, model.cluster, plan).to_plan(placer=plan.placer)
        placement = canonical(model, plan.placement)
        dev = [p.dev_index[placement[nm]] for nm in p.names]
        if any(dev[i] not in model.x[i] for i in range(p.n)):
            return False
        # the plan's per-device order, mapped through the relabelling
        seq = sorted(range(p.n), key=lambda i: (plan.start[p.names[i]], plan.finish[p.names[i]]))
        st, en, xfer = hint_schedule(model, dev, seq)
    except (KeyError, InvalidPlanError, RuntimeError, TypeError):
        return False  # not a plan of this graph and cluster: solve without it
    ms = _hint_ops(model, dev, st, en)
    ms = max(ms, _hint_transfers(model, dev, en, xfer))
    model.model.add_hint(model.makespan, max(ms, model.ms_min))
    model.hint_units = ms
    return True


def _hint_ops(model, dev, st, en) -> int:
    """Placement literals, start/end, symmetry and receive literals; returns
    the last op end."""
    m = model.model
    for it, hint_vars in model.item_hint_vars.items():
        for var, k in hint_vars:
            m.add_hint(var, dev[it] == k)
    for i in range(len(st)):
        m.add_hint(model.start[i], st[i])
        m.add_hint(model.end[i], en[i])
    for var, its, k in model.sym_aux:
        m.add_hint(var, any(dev[it] == k for it in its))
    for (name, e), y in model.recv.items():
        u, cs = model.recv_info[(name, e)]
        m.add_hint(y, dev[u] != e and any(dev[c] == e for c in cs))
    return max(en, default=0)


def _hint_transfers(model, dev, en, xfer) -> int:
    """Transfer-unit literals, sizes and times, then the ``same_dev`` literals;
    returns the last transfer end (0 if none)."""
    m, last = model.model, 0
    for unit in model.units_info:
        u, e = unit.u, unit.e
        got = xfer.get(unit.key)
        if unit.own_sent:
            m.add_hint(unit.sent, got is not None)
        for z, a in unit.sources:
            if z is not unit.sent:
                m.add_hint(z, got is not None and dev[u] == a)
        size_hint = 0
        for var, coeffs in unit.size_vars:
            size_hint = sum(cf for cf, (name, b, cs) in zip(coeffs, unit.tensors)
                            if dev[u] != e and any(dev[c] == e for c in cs))
            m.add_hint(var, size_hint)
        if got is not None:
            m.add_hint(unit.start, got[0])
            m.add_hint(unit.end, got[1])
            last = max(last, got[1])
        else:
            fs = unit.fixed_size
            m.add_hint(unit.start, en[u])
            m.add_hint(unit.end, en[u] + (fs if isinstance(fs, int) else size_hint if fs is not None else 0))
    for same, u, c in model.same_vars:
        m.add_hint(same, dev[u] == dev[c])
    return last


def hint_schedule(model, dev: list[int], seq: list[int]):
    """Left-shifted schedule in model units of placement ``dev`` and op
    sequence ``seq``, by :class:`pesto.engine.Timeline`: ops per device in
    that order (never before their predecessors), durations and transfer times
    in model units, transfers on the model's links first come first served
    (bundled per producer and destination when the model aggregates them).
    Feasible for the model whatever the sequence's times were.

    Returns per-op starts and ends and, per transfer unit key, its (start, end).

    Raises
    ------
    RuntimeError
        ``seq`` contradicts the graph.
    """
    p, units = model.problem, model.units
    tl = Timeline(p, dur=model.size, comm=lambda a, b, nbytes: units(p.comm(a, b, nbytes)),
                  links="fcfs" if model.contended else "free", placement=dev, bundle=model.aggregated)
    done = [False] * p.n
    pending = list(seq)
    # commit in the given sequence, but never before predecessors (robust to ties)
    while pending:
        rest = []
        for i in pending:
            if all(done[q] for q in p.pred[i]):
                tl.commit(i, dev[i], tl.earliest(i, dev[i]))
                done[i] = True
            else:
                rest.append(i)
        if len(rest) == len(pending):
            raise RuntimeError("hint order contradicts the graph")
        pending = rest
    return [int(t) for t in tl.start], [int(t) for t in tl.finish], _unit_times(model, dev, tl)


def _unit_times(model, dev, tl) -> dict:
    """(start, end) of every transfer unit the timeline sent, by unit key."""
    p, xfer = model.problem, {}
    tensor_id = {t[0]: k for k, t in enumerate(p.tensors)} if model.units_info else {}
    for unit in model.units_info:
        u, e = unit.u, unit.e
        end = tl.arrive.get((u, e) if model.aggregated else (tensor_id[unit.key[0]], e))
        if end is not None:
            length = sum(model.units(p.comm(dev[u], e, b)) for _, b, cs in unit.tensors
                         if any(dev[c] == e for c in cs))
            xfer[unit.key] = (int(end) - length, int(end))
    return xfer
