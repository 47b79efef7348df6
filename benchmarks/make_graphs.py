"""Regenerate the cached benchmark graphs ``benchmarks/graphs/*.json.gz``.

Each workload is a zoo model profiled with grappler's analytical V100 cost
model (``tf_patch.opgraph_for(model, preset, costs="v100")``), so the graphs
and hence the benchmark figures do not depend on this machine. The cache
exists because profiling needs TensorFlow and takes a while; the placement
benchmark reads the JSON files only.

The memory-bound workloads (GPT-1.3B, GPT-2.7B, BERT-Large: their weights,
Adam slots and activations do not fit one 16 GB V100) are too big to profile
whole on a small machine: their one-layer model is profiled and tiled to the
full depth (:mod:`tf_patch.zoo.tiling` states the rule and its test).

Run ``python -m benchmarks.make_graphs [--only rnnlm_2x2048,gpt,...] [--force]``
(``--only`` takes workload keys or model names: ``--only gpt`` makes both GPTs).

Examples
--------
>>> [w.key for w in WORKLOADS][:2]
['rnnlm_2x2048', 'rnnlm_4x2048']
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GRAPHS = Path(__file__).resolve().parent / "graphs"


@dataclass(frozen=True)
class Workload:
    """A benchmark workload: a zoo model and preset, and a synthetic stand-in
    (a :mod:`benchmarks.generators` call) used only when the cached graph is
    missing and TensorFlow is not available; results say which was used."""

    key: str
    label: str
    model: str
    preset: str
    standin: tuple  # (generator name, args...)
    overrides: tuple = ()  # model field overrides, (name, value) pairs
    tiled: bool = False  # profile one layer and tile it (tf_patch.zoo.tiling)

    @property
    def path(self) -> Path:
        return GRAPHS / f"{self.key}.json.gz"


WORKLOADS = (
    Workload("rnnlm_2x2048", "RNNLM-2x2048", "rnnlm", "2x2048", ("lstm_grid", 2, 20)),
    Workload("rnnlm_4x2048", "RNNLM-4x2048", "rnnlm", "4x2048", ("lstm_grid", 4, 20)),
    Workload("rnnlm_16x1024", "RNNLM-16x1024", "rnnlm", "16x1024", ("lstm_grid", 16, 20)),
    Workload("nmt_2x1024", "NMT-2x1024", "nmt", "2x1024", ("lstm_grid", 4, 25)),
    Workload("nmt_4x1024", "NMT-4x1024", "nmt", "4x1024", ("lstm_grid", 8, 25)),
    Workload("transformer_6", "Transformer-6", "transformer", "6", ("transformer_like", 6)),
    # The paper's NASNet cells/channels at batch 16 on 64x64 images: grappler's estimator
    # refuses the full batch-64 224x224 step (it sums > 16 GB of tensors on one V100).
    Workload("nasnet_b16", "NASNet-like (b16, 64px)", "nasnet", "paper", ("layered_dag", 2000),
             (("batch", 16), ("image", 64))),
    # keras.applications training steps traced as a user would (tf_patch.keras_opgraph):
    # random weights, a synthetic batch of 32 224px images, 10 classes
    Workload("keras_mobilenetv2", "MobileNetV2 (Keras, b32, 224px)", "keras:mobilenetv2", "b32-224px",
             ("layered_dag", 4800), (("batch", 32), ("size", 224))),
    Workload("keras_resnet50", "ResNet50 (Keras, b32, 224px)", "keras:resnet50", "b32-224px",
             ("layered_dag", 5000), (("batch", 32), ("size", 224))),
)
#: Workloads whose training does not fit one 16 GB V100 (weights + Adam slots at 12 B
#: per parameter, fp32, and activations): kept out of :data:`WORKLOADS`, which the
#: placement benchmarks run on 2-4 GPUs; :func:`by_key`, :func:`select` and ``main`` see both.
MEMORY_BOUND = (
    Workload("gpt_1.3b", "GPT-1.3B (b16, seq 1024)", "gpt", "1.3b", ("transformer_like", 24), tiled=True),
    Workload("gpt_2.7b", "GPT-2.7B (b16, seq 1024)", "gpt", "2.7b", ("transformer_like", 32), tiled=True),
    Workload("bert_large", "BERT-Large (b32, seq 512)", "bert", "large", ("transformer_like", 24), tiled=True),
)


def by_key(key: str) -> Workload:
    for w in WORKLOADS + MEMORY_BOUND:
        if w.key == key:
            return w
    raise KeyError(f"unknown workload {key!r}; known: {[w.key for w in WORKLOADS + MEMORY_BOUND]}")


def select(spec: str) -> list:
    """The workloads named by ``spec``: comma-separated keys or model names.

    >>> [w.key for w in select("gpt,transformer_6")]
    ['gpt_1.3b', 'gpt_2.7b', 'transformer_6']
    """
    out = []
    for item in spec.split(","):
        found = [w for w in WORKLOADS + MEMORY_BOUND if w.model == item] or [by_key(item)]
        out += [w for w in found if w not in out]
    return out


def tiled_graph(w: Workload, costs: str = "v100"):
    """The graph of ``w`` from its one-layer model, profiled and tiled to the
    preset's depth (:func:`tf_patch.zoo.tiling.tile`)."""
    from tf_patch import opgraph
    from tf_patch.zoo import MODELS, build_model
    from tf_patch.zoo.gpt import sparse_update_bytes
    from tf_patch.zoo.tiling import canonical, tile

    if costs == "measured":
        raise ValueError(f"{w.key}: tiled workloads are costed with grappler's GPU models only")
    overrides = dict(w.overrides)
    layers = overrides.pop("layers", MODELS[w.model][1][w.preset]["layers"])
    model = build_model(w.model, w.preset, layers=1, **overrides)
    one, _ = opgraph(model.graph, model.fetches, costs, name=w.key, tensor_sizes=sparse_update_bytes(model))
    return tile(canonical(one), layers, name=w.key)


def standin_graph(w: Workload):
    """The synthetic stand-in graph of ``w`` (deterministic)."""
    from benchmarks import generators as rg

    gen, *args = w.standin
    g = getattr(rg, gen)(*args)
    from pesto.graph import OpGraph
    d = g.to_dict()
    d["name"] = f"{w.key}-standin"
    return OpGraph.from_dict(d)


def load(w: Workload):
    """``(graph, source)``: the cached zoo graph, or the stand-in when the cache is missing."""
    from pesto.graph import OpGraph

    if w.path.exists():
        return OpGraph.from_json(str(w.path)), "zoo (grappler V100)"
    return standin_graph(w), "synthetic stand-in (no cached zoo graph)"


def make(w: Workload, costs: str = "v100"):
    """Profile ``w`` and write its JSON; returns the graph."""
    from tf_patch import keras_opgraph, opgraph_for

    if w.model.startswith("keras:"):
        if costs != "v100":
            raise ValueError(f"{w.key}: Keras workloads are costed with grappler's V100 model only")
        from tf_patch.zoo.keras_apps import keras_model
        model, x, y = keras_model(w.model[6:], **dict(w.overrides))
        g, _ = keras_opgraph(model, "sparse_categorical_crossentropy", "sgd", x, y, name=w.key)
    elif w.tiled:
        g = tiled_graph(w, costs)
    else:
        g = opgraph_for(w.model, w.preset, costs=costs, **dict(w.overrides))
    GRAPHS.mkdir(parents=True, exist_ok=True)
    g.to_json(str(w.path))
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated workload keys or model names")
    ap.add_argument("--force", action="store_true", help="regenerate even if the JSON exists")
    ap.add_argument("--costs", default="v100", choices=["v100", "measured"])
    args = ap.parse_args(argv)
    todo = select(args.only) if args.only else list(WORKLOADS + MEMORY_BOUND)
    manifest_path = GRAPHS / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    failed = 0
    for w in todo:
        if w.path.exists() and not args.force:
            print(f"{w.key}: cached ({w.path.name}); --force to regenerate")
            continue
        t0 = time.perf_counter()
        try:
            g = make(w, args.costs)
        except Exception as exc:  # keep going: one broken model must not block the rest
            failed += 1
            print(f"{w.key}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        dt = time.perf_counter() - t0
        manifest[w.key] = {**({"tiled": "one layer profiled, tiled"} if w.tiled else {}),"model": w.model, "preset": w.preset, "overrides": dict(w.overrides),
                           "costs": args.costs,
                           "ops": g.num_ops, "edges": g.num_edges,
                           "gpu_work_ms": round(g.total_work("GPU") / 1000, 3),
                           "persistent_gb": round(sum(op.persistent_bytes for op in g.ops) / 1e9, 3),
                           "seconds": round(dt, 1), "date": time.strftime("%Y-%m-%d", time.gmtime()),
                           "python": platform.python_version()}
        try:
            import tensorflow as tf
            manifest[w.key]["tensorflow"] = tf.__version__
        except ImportError:
            pass
        print(f"{w.key}: {g.num_ops} ops, {g.num_edges} edges in {dt:.1f} s -> {w.path.name}")
        GRAPHS.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
