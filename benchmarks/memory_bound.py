"""Why the memory-bound workloads need more than one GPU: their bytes.

Run: ``python -m benchmarks.memory_bound [--out DIR]`` (no TensorFlow; reads
``benchmarks/graphs``). Writes ``memory_bound.md``.

For each memory-bound workload (``benchmarks/make_graphs.py``: GPT-1.3B,
GPT-2.7B, BERT-Large, tiled from one profiled layer):

* ``persistent``: weights and Adam's two slots (fp32: 12 B per parameter);
* ``activations``: the bytes every plan holds when the loss's cross-entropy
  ends (:func:`pesto.memory.live_across`: produced before, read by the
  backward pass after); with the persistent bytes, a floor on what the
  devices together hold then, whatever the plan;
* ``one_gpu``: what ``pesto.memory.check_feasible`` says for one 16 GB V100
  (it checks the persistent bytes against all devices' memory: it rejects
  GPT-2.7B; GPT-1.3B's and BERT-Large's persistent bytes fit, their floor
  does not);
* ``v100x8``: the same check on ``v100x8_nvlink`` (passes: the persistent
  bytes fit 8 GPUs; the whole batch's activations do not, so a plan needs
  micro-batches).

Examples
--------
>>> [f.key for f in map(figures, KEYS) if f.floor_bytes > 16 * 2**30]  # doctest: +SKIP
['gpt_1.3b', 'gpt_2.7b', 'bert_large']
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from pesto.cluster import gpus, preset
from pesto.errors import InfeasibleError
from pesto.memory import check_feasible, fmt_bytes, live_across

from .make_graphs import MEMORY_BOUND, by_key, load

HERE = Path(__file__).resolve().parent
KEYS = tuple(w.key for w in MEMORY_BOUND)
#: The op whose end splits the step: the loss's cross-entropy (its second
#: output, the logits' gradient, starts the backward pass).
LOSS_OP = "loss/SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits"


@dataclass(frozen=True)
class MemoryFigures:
    """One workload's bytes (module doc)."""

    key: str
    label: str
    ops: int
    persistent_bytes: int
    activation_bytes: int
    one_gpu: str      # check_feasible on one V100 16 GB: "fits" or the error
    v100x8: str       # the same on v100x8_nvlink

    @property
    def floor_bytes(self) -> int:
        return self.persistent_bytes + self.activation_bytes

    @property
    def parameters(self) -> float:
        """Parameters implied by the persistent bytes (weight + 2 Adam slots, fp32)."""
        return self.persistent_bytes / 12


def _check(graph, cluster) -> str:
    try:
        check_feasible(graph, cluster)
    except InfeasibleError as exc:
        return f"InfeasibleError ({exc.culprit})"
    return "passes"


def figures(key: str) -> MemoryFigures:
    w = by_key(key)
    g, source = load(w)
    if not source.startswith("zoo"):
        raise FileNotFoundError(f"{key}: no cached graph; run python -m benchmarks.make_graphs --only {key}")
    return MemoryFigures(key, w.label, g.num_ops, sum(op.persistent_bytes for op in g.ops),
                         live_across(g, LOSS_OP), _check(g, gpus(1)),
                         _check(g, preset("v100x8_nvlink", with_cpu=False)))


def table(rows) -> str:
    head = ("| workload | ops | parameters | persistent (weights + Adam) | activations at the loss "
            "| floor | one V100 16 GB: check_feasible | v100x8_nvlink |\n|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {f.label} | {f.ops} | {f.parameters / 1e9:.2f} B | {fmt_bytes(f.persistent_bytes)} | "
        f"{fmt_bytes(f.activation_bytes)} | {fmt_bytes(f.floor_bytes)} | {f.one_gpu} | {f.v100x8} |\n"
        for f in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    text = "# Memory-bound workloads\n\n" + __doc__.split("\n\n", 2)[2].split("\nExamples")[0] + "\n" + \
        table([figures(k) for k in KEYS])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "memory_bound.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
