"""Seeded generators of synthetic op graphs for tests and benchmarks.

``layered_dag`` mimics a training step: layers of ops with edges mostly to the
next layer, some skip edges, optional CPU-only ops and colocation groups.
``training_step`` is a marked layered training step (TensorFlow's names, phase
marks), the uniform-stage workload of the pipeline schedules.
``lstm_grid`` and ``transformer_like`` give the shapes the coarsening paper
cares about at any size (e.g. 40,000 ops).
"""
from __future__ import annotations

import random

from pesto.graph import Edge, Op, OpGraph, Tensor
from tf_patch.marks import mark_phases


def _mk(ops, edge_list, name):
    """One tensor ``u:0`` per producer (size: its largest edge), shared by all
    its consumers; duplicate edges and self loops dropped."""
    edges = []
    seen = set()
    for u, v, b in edge_list:
        if (u, v) in seen or u == v:
            continue
        seen.add((u, v))
        t = f"{u}:0"
        edges.append((u, v, t, b))
    out_bytes = {}
    for u, v, t, b in edges:
        out_bytes[u] = max(out_bytes.get(u, 0), b)
    tensors = [Tensor(f"{u}:0", u, b) for u, b in out_bytes.items()]
    ops = [Op(o.name, o.compute, kinds=o.kinds, persistent_bytes=o.persistent_bytes,
              output_bytes=out_bytes.get(o.name, 0), temporary_bytes=o.temporary_bytes,
              colocation_group=o.colocation_group, scope=o.scope, type=o.type) for o in ops]
    return OpGraph(ops, [Edge(u, v, (t,)) for u, v, t, b in edges], tensors, name=name)


def layered_dag(n: int, *, width: int = 8, seed: int = 0, skip_prob: float = 0.1,
                cpu_only_prob: float = 0.0, coloc_prob: float = 0.0, name: str | None = None,
                max_time: float = 100.0, max_bytes: int = 1 << 20) -> OpGraph:
    """``n`` ops in layers of about ``width``; each op feeds 1-2 ops in the
    next layer and, with ``skip_prob``, one op further ahead. Each tensor
    ``u:0`` is shared by all consumers of ``u``.

    Examples
    --------
    >>> g = layered_dag(200, width=8, seed=0, cpu_only_prob=0.1, coloc_prob=0.1)
    >>> g.num_ops, g == layered_dag(200, width=8, seed=0, cpu_only_prob=0.1, coloc_prob=0.1)
    (200, True)
    """
    rng = random.Random(seed)
    layers = []
    k = 0
    while k < n:
        w = min(n - k, max(1, rng.randint(width // 2 or 1, width)))
        layers.append([f"op{k + i}" for i in range(w)])
        k += w
    ops = []
    groups = 0
    for li, layer in enumerate(layers):
        for nm in layer:
            cpu = rng.random() < cpu_only_prob
            t = round(rng.uniform(1, max_time), 1)
            compute = {"CPU": t * 4} if cpu else {"GPU": t}
            grp = None
            if coloc_prob and rng.random() < coloc_prob:
                grp = f"g{rng.randint(0, max(1, n // 20))}"
            ops.append(Op(nm, compute, persistent_bytes=rng.randint(0, 1 << 16),
                          temporary_bytes=rng.randint(0, 1 << 12), colocation_group=grp,
                          scope=f"layer{li}", type="Synthetic"))
    # colocated ops must share kinds: give every group the kinds of its first member
    first: dict = {}
    fixed = []
    for op in ops:
        if op.colocation_group is not None:
            f = first.setdefault(op.colocation_group, op)
            if f.kinds != op.kinds:
                op = Op(op.name, dict(f.compute), persistent_bytes=op.persistent_bytes,
                        temporary_bytes=op.temporary_bytes, colocation_group=op.colocation_group,
                        scope=op.scope, type=op.type)
        fixed.append(op)
    edges = []
    for li in range(len(layers) - 1):
        nxt = layers[li + 1]
        for u in layers[li]:
            b = rng.randint(1, max_bytes)
            for v in rng.sample(nxt, min(len(nxt), rng.randint(1, 2))):
                edges.append((u, v, b))
            if rng.random() < skip_prob and li + 2 < len(layers):
                far = layers[rng.randint(li + 2, min(len(layers) - 1, li + 5))]
                edges.append((u, rng.choice(far), b))
        # keep every op of the next layer reachable
        for v in nxt:
            if not any(e[1] == v for e in edges[-3 * len(layers[li]):]):
                edges.append((rng.choice(layers[li]), v, rng.randint(1, max_bytes)))
    return _mk(fixed, edges, name or f"layered{n}")


def random_dag(n: int, *, p: float = 0.2, seed: int = 0, name: str | None = None) -> OpGraph:
    """Erdos-Renyi DAG over a random order: edge i->j (i<j) with probability p."""
    rng = random.Random(seed)
    ops = [Op(f"v{i}", {"GPU": round(rng.uniform(1, 50), 1)}) for i in range(n)]
    edges = [(f"v{i}", f"v{j}", rng.randint(0, 1 << 18))
             for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    return _mk(ops, edges, name or f"random{n}")


def lstm_grid(layers: int, steps: int, *, ops_per_cell: int = 10, seed: int = 0) -> OpGraph:
    """Forward + backward of a stacked RNN unrolled over ``steps``: a grid of
    cells, each a small chain of ``ops_per_cell`` ops; cell (l, t) feeds
    (l, t+1) and (l+1, t); the backward grid mirrors it."""
    rng = random.Random(seed)
    ops, edges = [], []

    def cell(prefix):
        names = [f"{prefix}/o{k}" for k in range(ops_per_cell)]
        for k, nm in enumerate(names):
            ops.append(Op(nm, {"GPU": round(rng.uniform(2, 60), 1)}, scope=prefix.rsplit("/", 1)[0],
                          type="Cell"))
            if k:
                edges.append((names[k - 1], nm, rng.randint(1 << 12, 1 << 20)))
        return names[0], names[-1]

    fwd, bwd = {}, {}
    for l in range(layers):
        for t in range(steps):
            fwd[l, t] = cell(f"fwd/layer{l}/t{t}")
    for l in range(layers):
        for t in range(steps):
            bwd[l, t] = cell(f"bwd/layer{l}/t{t}")
    big = 1 << 20
    for l in range(layers):
        for t in range(steps):
            if t + 1 < steps:
                edges.append((fwd[l, t][1], fwd[l, t + 1][0], big))
                edges.append((bwd[l, t + 1][1], bwd[l, t][0], big))
            if l + 1 < layers:
                edges.append((fwd[l, t][1], fwd[l + 1, t][0], big))
                edges.append((bwd[l + 1, t][1], bwd[l, t][0], big))
            edges.append((fwd[l, t][1], bwd[l, t][0], big))
    for t in range(steps):
        edges.append((fwd[layers - 1, t][1], bwd[layers - 1, t][0], big))
    return _mk(ops, edges, f"lstm{layers}x{steps}")


def transformer_like(blocks: int, *, heads: int = 8, ops_per_head: int = 6, seed: int = 0) -> OpGraph:
    """Blocks of multi-head attention (``heads`` parallel chains joined by a
    concat) and a feed-forward chain, forward then mirrored backward."""
    rng = random.Random(seed)
    ops, edges = [], []

    def op(nm, scope):
        ops.append(Op(nm, {"GPU": round(rng.uniform(2, 80), 1)}, scope=scope, type="T"))
        return nm

    def stack(prefix, prev):
        for b in range(blocks):
            sc = f"{prefix}/block{b}"
            joins = []
            for h in range(heads):
                last = prev
                for k in range(ops_per_head):
                    cur = op(f"{sc}/h{h}/o{k}", sc)
                    edges.append((last, cur, rng.randint(1 << 14, 1 << 21)))
                    last = cur
                joins.append(last)
            cat = op(f"{sc}/concat", sc)
            for j in joins:
                edges.append((j, cat, 1 << 20))
            last = cat
            for k in range(2 * ops_per_head):
                cur = op(f"{sc}/ffn/o{k}", sc)
                edges.append((last, cur, 1 << 21))
                last = cur
            edges.append((prev, last, 1 << 21))  # residual
            prev = last
        return prev

    src = op("input", "input")
    mid = stack("fwd", src)
    loss = op("loss", "loss")
    edges.append((mid, loss, 1 << 10))
    stack("bwd", loss)
    return _mk(ops, edges, f"transformer{blocks}")


def training_step(layers: int = 4, *, act: int = 1_000_000, weight: int = 4000, t: float = 10.0,
                  back: float = 2.0) -> OpGraph:
    """A training step as TensorFlow names it: input ``x``; per layer a variable
    ``layer_l/w`` (read by ``layer_l/read``, updated by ``train/apply_l``, one
    colocation group), a forward op ``layer_l/f`` (``act`` bytes out) and, under
    ``gradients/layer_l/f_grad/``, ``dx`` (reads the layer's weight and the
    gradient from above) and ``dw`` (reads the layer's input: a weight gradient,
    ``weight`` bytes); forward ops take ``t`` µs, backward ones (``dx``,
    ``dw``) ``back * t`` (``back=1``: uniform stages, ``T_F = T_B = T_W``).
    Phase, anchor and role marks by the TensorFlow front end's rule
    (:func:`tf_patch.marks.mark_phases`).

    >>> g = training_step(2, back=1.0)
    >>> sorted({op.phase for op in g.ops if op.batch}), g.op("gradients/layer_0/f_grad/dw").compute["GPU"]
    (['forward', 'input-grad', 'weight-grad'], 10.0)
    """
    ops = [Op("x", {"GPU": 0.5}, output_bytes=act, batch=True, type="Placeholder")]
    ts, es = [Tensor("x:0", "x", act)], []

    def add(name, time, out, batch, **kw):
        ops.append(Op(name, {"GPU": time}, output_bytes=out, batch=batch, scope=name.rpartition("/")[0], **kw))
        if out:
            ts.append(Tensor(f"{name}:0", name, out))

    def edge(u, v):
        es.append(Edge(u, v, (f"{u}:0",)))

    prev = "x"
    for l in range(layers):
        add(f"layer_{l}/w", 0.0, weight, False, persistent_bytes=weight, colocation_group=f"w{l}")
        add(f"layer_{l}/read", 0.0, weight, False, colocation_group=f"w{l}")
        add(f"layer_{l}/f", t, act, True)
        edge(f"layer_{l}/w", f"layer_{l}/read")
        edge(prev, f"layer_{l}/f")
        edge(f"layer_{l}/read", f"layer_{l}/f")
        prev = f"layer_{l}/f"
    grad = prev
    for l in reversed(range(layers)):
        below = f"layer_{l - 1}/f" if l else "x"
        dx, dw = f"gradients/layer_{l}/f_grad/dx", f"gradients/layer_{l}/f_grad/dw"
        add(dx, back * t, act, True)
        add(dw, back * t, weight, True)
        add(f"train/apply_{l}", 1.0, 0, False, colocation_group=f"w{l}", type="ResourceApplyGradientDescent")
        for u, v in [(grad, dx), (f"layer_{l}/read", dx), (grad, dw), (below, dw), (dw, f"train/apply_{l}")]:
            edge(u, v)
        es.append(Edge(f"layer_{l}/w", f"train/apply_{l}", (f"layer_{l}/w:0",)))
        grad = dx
    return mark_phases(OpGraph(ops, es, ts, name=f"layered{layers}"))


def uniform_stages(stages: int = 4, *, t: float = 24_000.0, act: int = 1 << 30, params: int = 400_000_000,
                   batch: int = 24) -> OpGraph:
    """A training step of ``stages`` identical layers (issue 30's uniform-stage
    check: ``T_F = T_B = T_W``, weights too large for data parallelism).

    Layer ``l``: a variable ``layer_<l>/w`` (``12 params`` persistent bytes:
    fp32 weights and Adam's two slots) read by ``layer_<l>/read`` (the
    ``4 params``-byte weight tensor), one colocation group with its update
    ``train/update_<l>``; a forward op ``layer_<l>/f`` (``act`` bytes out),
    its input gradient ``gradients/layer_<l>/dx`` (``act`` bytes; reads the
    weight and the gradient from above) and weight gradient
    ``gradients/layer_<l>/dw`` (``4 params`` bytes; reads the layer's input
    and the gradient from above). ``f``, ``dx`` and ``dw`` each take ``t`` µs
    over the whole batch (``t / M`` per slice once split in ``M``); the data
    input and the loss are small. Marks (batch, phase, anchor, role) are set
    here: ``dw`` is ``"joinable"`` (a GEMM over the concatenated slices, as a
    front end builds a dense layer's: the search may run it whole).
    With the defaults a layer holds 4.5 GiB: four of them do not fit one 16 GB
    V100 (data parallelism), one per GPU does.

    >>> g = uniform_stages(4)
    >>> g.num_ops, g.op("gradients/layer_2/dw").phase, g.op("gradients/layer_2/dw").anchor
    (26, 'weight-grad', 'layer_2/f')
    >>> sum(op.persistent_bytes for op in g.ops) / 2**30 > 16
    True
    """
    ops = [Op("data", {"GPU": 2.0}, output_bytes=act, batch=True, phase="forward", scope="data")]
    tensors, edges = [Tensor("data:0", "data", act)], []

    def add(name, time, out, batch, phase, **kw):
        ops.append(Op(name, {"GPU": time}, output_bytes=out, batch=batch, phase=phase,
                      scope=name.rpartition("/")[0], **kw))
        if out:
            tensors.append(Tensor(f"{name}:0", name, out))

    def edge(u, v):
        edges.append(Edge(u, v, (f"{u}:0",)))

    prev, weight = "data", 4 * params
    for l in range(stages):
        add(f"layer_{l}/w", 0.0, 0, False, "forward", persistent_bytes=12 * params, colocation_group=f"w{l}")
        add(f"layer_{l}/read", 0.0, weight, False, "forward", colocation_group=f"w{l}")
        add(f"layer_{l}/f", t, act, True, "forward")
        edges.append(Edge(f"layer_{l}/w", f"layer_{l}/read", ()))
        edge(prev, f"layer_{l}/f")
        edge(f"layer_{l}/read", f"layer_{l}/f")
        prev = f"layer_{l}/f"
    add("loss/xent", 2.0, act, True, "forward")
    edge(prev, "loss/xent")
    grad = "loss/xent"
    for l in reversed(range(stages)):
        below, f = (f"layer_{l - 1}/f" if l else "data"), f"layer_{l}/f"
        dx, dw = f"gradients/layer_{l}/dx", f"gradients/layer_{l}/dw"
        add(dx, t, act, True, "input-grad", anchor=f)
        add(dw, t, weight, True, "weight-grad", anchor=f, role="joinable")
        add(f"train/update_{l}", 1.0, 0, False, "update", colocation_group=f"w{l}")
        for u, v in [(grad, dx), (f"layer_{l}/read", dx), (grad, dw), (below, dw), (dw, f"train/update_{l}")]:
            edge(u, v)
        edges.append(Edge(f"layer_{l}/w", f"train/update_{l}", ()))
        grad = dx
    return OpGraph(ops, edges, tensors, name=f"uniform{stages}_b{batch}")
