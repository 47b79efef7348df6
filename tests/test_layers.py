"""The architecture, checked: imports point only downward, and functions stay short.

Layers (ARCHITECTURE.md): the pesto core <- coarsen/ <- solver/ <- the facade.
A module's layer is read from the code, not from a list kept here: its top
package (``coarsen``, ``solver``, ``tf_patch``), and inside ``pesto/`` the
facade is the package's doors -- ``__init__``, ``__main__``, the modules that
``pesto/__init__.py`` imports on first use (PEP 562 ``__getattr__``) and the
console scripts of pyproject.toml; every other pesto module is core.
tf_patch/ uses the core and the public ``pesto`` and ``solver`` packages.
These tests read the source (AST), so a violation names the file, line and
import.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pesto", "coarsen", "solver", "tf_patch")
PROJECT = ("pesto", "coarsen", "solver", "tf_patch", "benchmarks")

# What each layer may import from the project (prefix match on module names);
# no layer but the facade may import a facade module (FORBIDDEN_FACADE below).
ALLOWED = {
    "core": ("pesto",),
    "coarsen": ("pesto", "coarsen"),
    "solver": ("pesto", "coarsen", "solver"),
    "facade": PROJECT,
    "tf_patch": ("pesto", "tf_patch"),
}
# tf_patch may also use these package fronts (their public names only, e.g.
# ``pesto.solve``, ``solver.get_placer``), never their inner modules
PUBLIC_FRONTS = {"tf_patch": ("pesto", "solver")}
# The only project imports allowed inside a function, with the reason.
LAZY_OK = {
    ("pesto/__init__.py", "pesto.api"): "PEP 562: the facade (and with it the solver, OR-Tools) loads on first use",
    ("pesto/cli.py", "tf_patch"): "TensorFlow models for `pesto profile` / `place MODEL`: Pesto works without TF",
    ("pesto/cli.py", "benchmarks"): "the optional benchmarks package behind `pesto bench` (a source checkout)",
    ("tf_patch/__init__.py", "tf_patch.opgraphs"): "PEP 562: the TensorFlow-needing names load on first use, "
                                                   "so tf_patch.marks imports without TensorFlow",
}
# Functions allowed over MAX_LINES, with their own cap and the reason.
MAX_LINES = 80
LONG_OK = {("pesto/engine.py", "_run"): 150}  # the simulator's profiled hot loop


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield ".".join(rel.with_suffix("").parts), rel, ast.parse(path.read_text(), str(rel))


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(mod: str, tree: ast.AST):
    """(line, imported module, inside a function?) for every project import."""
    funcs = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    pkg = mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the package
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            # ``from pkg import mod`` imports the module pkg.mod
            names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT:
                yield node.lineno, name, id(node) in funcs


def _console_scripts() -> set[str]:
    """Modules of pyproject.toml's ``[project.scripts]`` (``pesto = "pesto.cli:console"``)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r'^\s*[\w.-]+\s*=\s*"([\w.]+):\w+"', section, re.M))


def _facade() -> set[str]:
    """The pesto package's doors: ``__init__``, ``__main__``, what ``__init__``
    imports on first use, and the console scripts' modules."""
    init = ROOT / "pesto" / "__init__.py"
    lazy = {name for _, name, inside in _imports("pesto.__init__", ast.parse(init.read_text())) if inside}
    return {"pesto.__init__", "pesto.__main__"} | lazy | _console_scripts()


FACADE = _facade()


def _layer(mod: str) -> str:
    top = mod.split(".")[0]
    if top == "pesto":
        return "facade" if mod in FACADE else "core"
    return top


def _is_facade(name: str) -> bool:
    """An import of the facade: a facade module, or the ``pesto`` package
    itself (whose ``solve``/``evaluate`` are the facade's)."""
    return name in FACADE or f"{name}.__init__" in FACADE


def test_imports_point_downward():
    bad = []
    for mod, rel, tree in _modules():
        layer = _layer(mod)
        for line, name, _ in _imports(mod, tree):
            if name in PUBLIC_FRONTS.get(layer, ()):
                continue
            if not name.startswith(ALLOWED[layer]):
                bad.append(f"{rel}:{line} ({layer}) imports {name}")
            elif layer != "facade" and _is_facade(name):
                bad.append(f"{rel}:{line} ({layer}) imports the facade ({name})")
    assert not bad, "imports that point upward:\n" + "\n".join(bad)


def test_no_project_import_inside_functions():
    """Only the imports of LAZY_OK may wait until a function runs."""
    bad = []
    for mod, rel, tree in _modules():
        for line, name, inside in _imports(mod, tree):
            allowed = any(rel.as_posix() == path and (name == target or name.startswith(target + "."))
                          for path, target in LAZY_OK)
            if inside and not allowed:
                bad.append(f"{rel}:{line} imports {name} inside a function")
    assert not bad, "\n".join(bad)


def test_the_facade_is_read_from_the_code_and_named_in_architecture_md():
    assert {"pesto.__init__", "pesto.__main__", "pesto.api", "pesto.cli"} <= FACADE
    assert _layer("pesto.graph") == "core" and _layer("tf_patch.zoo.rnnlm") == "tf_patch"
    diagram = (ROOT / "ARCHITECTURE.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    facade_rows = diagram.split("\nfacade", 1)[1].split("|", 1)[0]  # up to the arrow to solver/
    missing = [m for m in sorted(FACADE) if f"pesto/{m.split('.')[1]}.py" not in facade_rows]
    assert not missing, f"facade modules not named in ARCHITECTURE.md's layer diagram: {missing}"


def test_only_solver_imports_ortools_and_it_loads_it_with_deepbind_first():
    """OR-Tools' native libraries must be loaded by :mod:`pesto.deepbind`
    before any module imports OR-Tools: solver/__init__ (run before every
    solver module) imports it before anything else of the project."""
    users = sorted(str(rel) for mod, rel, tree in _modules() for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   and any(n.split(".")[0] == "ortools" for n in
                           ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])))
    outside = [u for u in users if not u.startswith("solver/") and u != "pesto/deepbind.py"]
    assert not outside, f"OR-Tools imported outside solver/: {outside}"
    init = ast.parse((ROOT / "solver" / "__init__.py").read_text())
    first = next(name for _, name, _ in _imports("solver.__init__", init))
    assert first == "pesto.deepbind", first


def test_the_core_loads_neither_solver_nor_ortools_nor_tensorflow():
    core = [mod for mod, _, _ in _modules() if _layer(mod) == "core" and mod not in ("pesto.deepbind",)]
    code = (f"import sys\nimport {', '.join(m.removesuffix('.__init__') for m in core)}\n"
            "import pesto\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'solver', 'coarsen', 'ortools', 'tensorflow'})\n"
            "assert not loaded, loaded\n"
            "assert callable(pesto.solve) and 'solver' in sys.modules and 'ortools' in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


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


@pytest.mark.parametrize("first", ["pesto", "pesto.graph", "solver", "coarsen", "tf_patch", "tf_patch.demo"])
def test_any_package_can_be_imported_first(first):
    """No import cycle bites whichever package a user imports first."""
    code = f"import {first}; import pesto; assert callable(pesto.solve)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


# TensorFlow op types and scope names: only the front end (tf_patch/) may read them.
TF_NAMES = re.compile(r"gradients[/(_]|gradients\b|_grad\b|gradient_tape|\bAddN\b|\bAddV2\b|AccumulateNV2|"
                      r"Apply(Adam|GradientDescent|Momentum)|\(Resource\)|\bPlaceholder|IteratorGetNext|"
                      r"(Assign|AssignAdd|AssignSub)VariableOp|VarHandleOp|ReadVariableOp|VariableV2|"
                      r"Scatter(Add|Sub)")
TF_FREE = ("pesto", "coarsen", "solver")
# The one exception, with its reason (file, the string literal).
TF_OK = {("solver/practitioners.py", r"^(gradients(_\d+)?|gradient_tape|training|train)$"):
         "the Pesto paper's Expert baseline splits by name scopes as its human expert does, on "
         "graphs no front end marked (every plain solve runs it); reading marks instead would "
         "change it and the placement figures"}
# Not TensorFlow graph names: Pesto's device names are TensorFlow's device strings by design
# (pesto.cluster.task_device names a host's devices /job:worker/replica:0/task:1/device:GPU:0).


def _code_strings(tree: ast.AST):
    """(line, text) of every string constant that is not a docstring."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_tensorflow_names_outside_the_front_end():
    """The core, the coarsener and the solver read what ops are from their marks
    (Op.batch, phase, anchor, role), never from TensorFlow's op types or scope
    names (``tf_patch/marks.py`` turns those into marks). Docstrings may name them."""
    bad = []
    for mod, rel, tree in _modules():
        if rel.parts[0] not in TF_FREE:
            continue
        for line, text in _code_strings(tree):
            m = TF_NAMES.search(text)
            if m and (rel.as_posix(), text) not in TF_OK:
                bad.append(f"{rel}:{line} {m.group(0)!r} in {text[:60]!r}")
    assert not bad, "TensorFlow names outside tf_patch/:\n" + "\n".join(bad)


def test_the_tf_names_check_finds_them():
    tree = ast.parse('"""gradients/ in a docstring is fine."""\n'
                     'ROOT = re.compile(r"^(gradients(_\\d+)?|gradient_tape)$")\n'
                     'SUMS = {"AddN", "AddV2"}\nx = name.endswith("_grad")\nt = "Placeholder"\n')
    hits = sorted(line for line, text in _code_strings(tree) if TF_NAMES.search(text))
    assert hits == [2, 3, 3, 4, 5]
