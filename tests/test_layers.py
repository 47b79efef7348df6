"""The architecture, checked: imports point only downward, and functions stay short.

Layers (ARCHITECTURE.md): the pesto core (graph, cluster, plan, memory,
problem arrays, dag, engine, simulate, errors) <- coarsen/ <- solver/ <- the
facade (pesto.api, pesto.cli). tf_patch/ (with its model zoo and the demos)
uses the core and the public ``pesto`` and ``solver`` fronts only. These tests read the source (AST), so a
violation names the file, line and import.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pesto", "coarsen", "solver", "tf_patch")
FACADE = {"pesto.api", "pesto.cli", "pesto.__init__", "pesto.__main__"}
PROJECT = ("pesto", "coarsen", "solver", "tf_patch", "benchmarks")

# What each layer may import from the project (prefix match on module names).
ALLOWED = {
    "core": ("pesto",),
    "coarsen": ("pesto", "coarsen"),
    "solver": ("pesto", "coarsen", "solver"),
    "facade": PROJECT,
    "tf_patch": ("pesto", "tf_patch"),
}
# Functions allowed over MAX_LINES, with their own cap and the reason.
MAX_LINES = 80
LONG_OK = {("pesto/engine.py", "_run"): 150}  # the simulator's profiled hot loop


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield ".".join(rel.with_suffix("").parts), rel, ast.parse(path.read_text(), str(rel))


def _layer(mod: str) -> str:
    if mod in FACADE:
        return "facade"
    return "core" if mod.startswith("pesto") else mod.split(".")[0]


def _imports(mod: str, tree: ast.AST):
    """(line, imported module, inside a function?) for every project import."""
    funcs = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    pkg = mod.rsplit(".", 1)[0] if not mod.endswith("__init__") else mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT:
                yield node.lineno, name, id(node) in funcs


def test_imports_point_downward():
    bad = []
    for mod, rel, tree in _modules():
        allowed = ALLOWED[_layer(mod)]
        for line, name, _ in _imports(mod, tree):
            if name in ("pesto", "solver") and _layer(mod) == "tf_patch":
                continue  # tf_patch may use the public pesto.solve and solver.get_placer
            if not name.startswith(allowed):
                bad.append(f"{rel}:{line} ({_layer(mod)}) imports {name}")
            elif _layer(mod) in ("core", "coarsen", "solver") and name in ("pesto", "pesto.api"):
                bad.append(f"{rel}:{line} ({_layer(mod)}) imports the facade ({name})")
    assert not bad, "imports that point upward:\n" + "\n".join(bad)


def test_no_project_import_inside_functions():
    """Only TensorFlow code (tf_patch) and the optional benchmarks package may
    be imported lazily."""
    bad = []
    for mod, rel, tree in _modules():
        for line, name, inside in _imports(mod, tree):
            if not inside:
                continue
            lazy_ok = name.startswith(("tf_patch", "benchmarks"))
            if not lazy_ok:
                bad.append(f"{rel}:{line} imports {name} inside a function")
    assert not bad, "\n".join(bad)


def _code_lines(lines: list[str], node: ast.AST) -> int:
    body = node.body
    skip = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for k in range(node.lineno, node.end_lineno + 1)
               if k not in skip and lines[k - 1].strip() and not lines[k - 1].strip().startswith("#"))


def test_functions_are_short():
    long = []
    for _, rel, tree in _modules():
        lines = (ROOT / rel).read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(lines, node)
                cap = LONG_OK.get((rel.as_posix(), node.name), MAX_LINES)
                if n > cap:
                    long.append(f"{rel}:{node.lineno} {node.name}: {n} code lines (max {cap})")
    assert not long, "\n".join(long)


@pytest.mark.parametrize("first", ["pesto", "solver", "coarsen", "tf_patch"])
def test_any_package_can_be_imported_first(first):
    """No import cycle bites whichever package a user imports first."""
    import subprocess
    import sys

    code = f"import {first}; import pesto; assert callable(pesto.solve)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
