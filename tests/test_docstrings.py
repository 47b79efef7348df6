"""Docstring examples stay true: every example in the library's modules runs."""
import doctest
import importlib
import pkgutil
import re

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
    # the test/benchmark helpers that left the library keep their examples checked; the
    # TensorFlow front end's marks need no TensorFlow
    return out + ["benchmarks.generators", "benchmarks.external", "tf_patch.marks"]


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


def test_library_examples_need_only_the_library():
    """An installed package has no benchmarks/ or tests/: the library's
    examples build their graphs themselves (``OpGraph.from_edges``)."""
    finder = doctest.DocTestFinder()
    outside = re.compile(r"^\s*(from|import)\s+(benchmarks|tests|strategies)\b", re.M)
    bad = [f"{test.name}: {ex.source.strip()}" for m in _modules() if m.split(".")[0] in PACKAGES
           for test in finder.find(importlib.import_module(m)) for ex in test.examples if outside.search(ex.source)]
    assert not bad, "examples importing what the package does not ship:\n" + "\n".join(bad)
