"""Docstring examples stay true: every example in the library's modules runs."""
import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["pesto", "coarsen", "solver"]
SKIP = {"pesto.__main__"}  # the entry point, no examples


def _modules():
    out = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"{pkg}."):
            if info.name not in SKIP:
                out.append(info.name)
    # the test/benchmark helpers that left the library keep their examples checked
    return out + ["benchmarks.generators", "benchmarks.external"]


@pytest.mark.parametrize("module", _modules())
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module}"


def test_examples_exist():
    """The examples are there to be run: the core modules must have some."""
    total = sum(doctest.testmod(importlib.import_module(m)).attempted
                for m in ["pesto.graph", "pesto.cluster", "pesto.plan", "pesto.simulate"])
    assert total >= 8
