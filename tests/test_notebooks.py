"""The notebooks are committed with the outputs of their current source (made by
``make notebooks``), and run as a reader runs them: a kernel started in
``notebooks/`` that sees the installed package only (no ``benchmarks``)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import installed

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

HERE = installed.ROOT / "notebooks"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("notebooks_execute", HERE / "execute.py")
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_coarsening_vs_solver.ipynb", "02_placement_explained.ipynb", "03_micro_batches.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_the_outputs_of_their_source(path):
    nb = nbformat.read(path, as_version=4)
    made = nb.metadata.get("pesto", {})
    assert made.get("source_sha256") == execute.source_hash(nb), \
        f"{path.name}: its outputs are not from its current cells; run `make notebooks`"
    assert made.get("small") is False, f"{path.name}: committed from the small test run"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "run top to bottom once"
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "its figures show in the repository"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert tagged and "PESTO_NB_SMALL" in tagged[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_imports_only_the_installed_package(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not re.search(r"^\s*(from|import)\s+(benchmarks|tests)\b", cell.source, re.M), cell.source


def _kernel_name():
    """The python3 kernel; jupyter_client starts it with this interpreter
    (it maps the spec's "python" to sys.executable)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip("no python3 kernelspec; run `python -m ipykernel install --sys-prefix`")
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_as_a_reader_runs_it(path, tmp_path, monkeypatch):
    # the kernel inherits this environment: the installed package only, the small setting,
    # matplotlib's inline backend (conftest sets Agg for the test process)
    for key, value in installed.env(tmp_path, PESTO_NB_SMALL="1",
                                    MPLBACKEND="module://matplotlib_inline.backend_inline").items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name=_kernel_name(),
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook should draw its figures"
    assert "step" in "".join(o.get("text", "") for o in outputs)
