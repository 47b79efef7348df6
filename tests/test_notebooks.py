"""The notebooks run headless on small settings and are committed without outputs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_coarsening_vs_solver.ipynb", "02_placement_explained.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs: strip them"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert tagged and "PESTO_NB_SMALL" in tagged[0].source


def _kernel_name():
    """The python3 kernel; jupyter_client starts it with this interpreter
    (it maps the spec's "python" to sys.executable)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        pytest.skip(f"no python3 kernelspec; run `{sys.executable} -m ipykernel install --sys-prefix`")
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_headless(path, monkeypatch):
    monkeypatch.setenv("PESTO_NB_SMALL", "1")
    # the notebooks' example graphs come from benchmarks.generators (not installed):
    # the kernel finds it from the repository root, as `jupyter` started there does
    monkeypatch.setenv("PYTHONPATH", str(path.parents[1]))
    # conftest sets MPLBACKEND=Agg for the test process; the kernel needs its inline backend
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name=_kernel_name(),
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 1, "the notebook should draw its figures"
    text = "".join(o.get("text", "") for o in outputs)
    assert "step" in text
    # the kernel ran on the small setting, in this interpreter's environment
    assert os.environ["PESTO_NB_SMALL"] == "1"
