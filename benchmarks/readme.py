"""Put the placement results into docs/results.md (between two marker lines).

``make bench`` calls :func:`update_readme` after :mod:`benchmarks.placement`,
so the results page's table is always the one the last full run produced. The table
is built from ``benchmarks/results/placement.csv``: per workload and cluster,
Expert (with the rule it used), the best baseline (any placer but Pesto's that fits memory), Pesto
(``pesto.solve``), their ratios, the lower bound and gap, and placement time.
"""
from __future__ import annotations

import csv
from pathlib import Path

START = "<!-- results:start (written by `make bench`: benchmarks/readme.py) -->"
END = "<!-- results:end -->"
PESTO = ("cpsat", "mip")


def _f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def table(rows: list[dict]) -> str:
    """Markdown table of Pesto against Expert and the best baseline."""
    out = ["| workload | cluster | ops | Expert (ms) | best baseline (ms) | Pesto (ms) | vs Expert | "
           "vs best baseline | bound (ms) / gap | Pesto time (s) | plan from |",
           "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["workload"], r["cluster"]), []).append(r)
    for (wl, cl), rs in groups.items():
        by = {r["placer"]: r for r in rs}
        pesto = by.get("cpsat")
        if pesto is None or _f(pesto.get("step_ms")) is None:
            continue
        ok = [r for r in rs if r["placer"] not in PESTO and _f(r.get("step_ms")) is not None
              and r.get("oom") != "True" and r.get("valid") != "False"]
        best = min(ok, key=lambda r: _f(r["step_ms"]), default=None)
        exp = by.get("expert")
        p = _f(pesto["step_ms"])
        e = _f(exp["step_ms"]) if exp else None
        b = _f(best["step_ms"]) if best else None
        bound = _f(pesto.get("bound_ms"))
        gap = _f(pesto.get("gap"))
        def ms(x):
            return "" if x is None else f"{x:.2f}"

        def pct(a, b):
            return "" if a is None or b is None else f"{100 * (a / b - 1):+.1f}%"

        best_cell = "" if best is None else f"{b:.2f} ({best['placer_label']})"
        bound_cell = ms(bound) + ("" if gap is None else f" / {100 * gap:.1f}%")
        wall = _f(pesto.get("wall_s")) or 0.0
        rule = f" ({exp['rule']})" if exp and exp.get("rule") else ""
        out.append(f"| {pesto['label']} | {cl} | {pesto['ops']} | {ms(e)}{rule} | {best_cell} | {ms(p)} | "
                   f"{pct(p, e)} | {pct(p, b)} | {bound_cell} | {wall:.1f} | {pesto.get('winner') or ''} |")
    return "\n".join(out)


def update_readme(results: Path, readme: Path) -> bool:
    """Replace the text between the markers in ``readme`` with the table and
    the run's date and machine (from ``placement.meta.json`` / ``placement.md``).
    Returns False (and changes nothing) when the markers are missing."""
    text = readme.read_text()
    if START not in text or END not in text:
        return False
    with open(results / "placement.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    head = ""
    md = results / "placement.md"
    if md.exists():
        lines = md.read_text().splitlines()
        head = "\n".join(l for l in lines[2:4] if l.strip())
    body = f"{START}\n{head}\n\n{table(rows)}\n\nFull tables: `benchmarks/results/placement.md`.\n{END}"
    pre, rest = text.split(START, 1)
    _, post = rest.split(END, 1)
    readme.write_text(pre + body + post)
    return True
