"""Readers for public task-graph scheduling benchmarks with known optima.

* Sinnen (Auckland) graphs in GXL: ``<node id>`` with an integer ``Weight``
  (compute time) and ``<edge from to>`` with ``Weight`` (communication time,
  paid only when the two tasks run on different processors).
* Kasahara STG files: ``n``, then ``id cost #preds pred...`` lines; tasks 0 and
  n+1 are zero-cost entry/exit dummies (dropped by default: they change no
  makespan), ``#`` comment footer.

Both use the classic model: identical processors, contention-free comm. With
:func:`classic_cluster` an edge of weight ``w`` carries ``w`` bytes and the
route costs ``0 + 1 * bytes`` µs, so a remote edge costs exactly ``w``.

Examples
--------
>>> import os
>>> p = "/work/shared/external/stg/50/rand0000.stg"
>>> g = read_stg(p) if os.path.exists(p) else None
>>> g is None or g.num_ops == 50
True
"""
from __future__ import annotations

import csv
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from pesto.cluster import Cluster, gpus
from pesto.graph import Edge, Op, OpGraph, Tensor

# The sets live in shared/external beside the checkout (PESTO_EXTERNAL overrides).
EXTERNAL = Path(os.environ.get("PESTO_EXTERNAL", Path(__file__).resolve().parents[2] / "shared" / "external"))

__all__ = ["read_gxl", "read_stg", "classic_cluster", "sinnen_optima", "stg_optima", "EXTERNAL"]


def _weight(elem) -> int:
    for attr in elem.findall("attr"):
        if attr.get("name") == "Weight":
            child = attr[0]
            return int(float(child.text))
    raise ValueError(f"GXL element {elem.attrib} has no Weight")


def read_gxl(path) -> OpGraph:
    """A Sinnen GXL task graph as an OpGraph (compute on kind ``GPU``).

    Each edge carries its own tensor of ``Weight`` bytes (no sharing between
    consumers, as in the classic model).
    """
    root = ET.parse(path).getroot()
    graph = root.find("graph")
    ops, edges, tensors = [], [], []
    for node in graph.findall("node"):
        ops.append(Op(node.get("id"), {"GPU": float(_weight(node))}))
    for e in graph.findall("edge"):
        u, v, w = e.get("from"), e.get("to"), _weight(e)
        t = f"{u}->{v}"
        tensors.append(Tensor(t, u, w))
        edges.append(Edge(u, v, (t,)))
    return OpGraph(ops, edges, tensors, name=graph.get("id") or Path(path).stem)


def read_stg(path, *, drop_dummies: bool = True) -> OpGraph:
    """A Kasahara STG file as an OpGraph without communication (control edges)."""
    lines = [ln.split() for ln in Path(path).read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    n = int(lines[0][0])
    cost, preds = {}, {}
    for row in lines[1:]:
        i, c, k = int(row[0]), int(row[1]), int(row[2])
        cost[i] = c
        preds[i] = [int(x) for x in row[3:3 + k]]
    dummies = {0, n + 1} if drop_dummies else set()
    ops = [Op(str(i), {"GPU": float(c)}) for i, c in cost.items() if i not in dummies]
    edges = [Edge(str(p), str(i), ()) for i, ps in preds.items() if i not in dummies
             for p in ps if p not in dummies]
    return OpGraph(ops, edges, name=Path(path).stem)


def classic_cluster(processors: int) -> Cluster:
    """``processors`` identical, fully connected, contention-free devices where
    a transfer of ``b`` bytes takes ``b`` µs."""
    return gpus(processors, beta=(0.0, 1.0), contention_free=True, name=f"classic{processors}")


def sinnen_optima(root: Path | str = EXTERNAL) -> list[tuple[str, int, int]]:
    """Rows ``(gxl path, processors, optimal makespan)`` of ``sinnen/optima.tsv``."""
    root = Path(root) / "sinnen"
    out = []
    with open(root / "optima.tsv") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            out.append((str(root / row["graph"]), int(row["processors"]), int(row["optimal_makespan"])))
    return out


def stg_optima(root: Path | str = EXTERNAL, size: int = 50) -> list[tuple[str, int, int, int]]:
    """Rows ``(stg path, P, low, high)`` for the files present (``low == high``
    when the optimum is proven)."""
    root = Path(root) / "stg"
    out = []
    for p in (2, 4, 8, 16):
        fn = root / f"Case{size}_{p}_OPT.csv"
        if not fn.exists():
            continue
        for row in csv.reader(open(fn)):
            if not row or not row[0].strip():
                continue
            path = root / row[0].strip()
            if not path.exists():
                continue
            low = int(row[2])
            high = int(row[3]) if len(row) > 3 and row[3].strip() else low
            out.append((str(path), int(row[1]), low, high))
    return out
