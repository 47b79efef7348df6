"""Run the notebooks as a reader runs them and save them with their outputs.

``make notebooks`` (or ``python notebooks/execute.py [NOTEBOOK ...]``) executes
each notebook top to bottom in a fresh ``python3`` kernel started in
``notebooks/`` (as Jupyter does), at full size, and writes it back with its
outputs (tables, figures) so they show when browsing the repository. The
notebook's metadata then records a hash of its code cells
(``metadata.pesto.source_sha256``): ``tests/test_notebooks.py`` fails when a
cell was edited after the outputs were made. ``--small`` runs the quick
version the tests run (``PESTO_NB_SMALL=1``) without saving it.

Needs the ``notebooks`` extra (``pip install -e .[notebooks]``: nbclient,
ipykernel); full size takes about 20 minutes for 01, 2 for 02 and 1 for 03 on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def source_hash(nb) -> str:
    """SHA-256 of the notebook's code cells, in order."""
    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode("utf-8") + b"\0")
    return h.hexdigest()


def execute(path: Path, *, small: bool = False, timeout: int = 7200):
    """The notebook at ``path`` executed from its folder; outputs in place,
    per-cell timing metadata dropped (it would change on every run)."""
    os.environ["PESTO_NB_SMALL"] = "1" if small else "0"
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nb.metadata["pesto"] = {"source_sha256": source_hash(nb), "small": small}
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    ap.add_argument("--small", action="store_true", help="the quick version; nothing is saved")
    args = ap.parse_args(argv)
    for path in args.notebooks or sorted(HERE.glob("*.ipynb")):
        t0 = time.perf_counter()
        nb = execute(path.resolve(), small=args.small)
        if not args.small:
            nbformat.write(nb, path)
        print(f"{path.name}: executed in {time.perf_counter() - t0:.0f} s"
              + ("" if args.small else ", saved with its outputs"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
