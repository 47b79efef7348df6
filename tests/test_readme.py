"""Every fenced block of README.md and docs/*.md runs as written, or is listed in
SKIPPED with why.

Each document runs in a fresh folder standing for the root of a clone: it holds the
clone's virtual environment (``.venv``, a link to the one running the tests, so
``source .venv/bin/activate`` works) and the cached graphs (``benchmarks/graphs``,
data the documents read), nothing else; Python sees the installed package only
(:mod:`installed`). A document's ``sh`` blocks run in order in one bash, stopping at
the first failing command, as in one terminal; its ``python`` blocks run in order in
one interpreter, as a session would; ``text`` blocks show output and are not run.
Every block must say its language, so none is left out unseen.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import installed

DOCS = [installed.ROOT / "README.md"] + sorted((installed.ROOT / "docs").glob("*.md"))

#: Blocks not run, each named by a line it contains, with the reason.
SKIPPED = {
    "make demo   #": "installs, then profiles and trains for ~3 minutes; `make test` is this suite "
                    "itself (CI runs it); `make demo` is measured in benchmarks/results/demo_runs.md",
    "tf_patch.opgraph(tf_graph, [train_op]": "a fragment: `tf_graph` and `train_op` are the reader's "
                                             "own TensorFlow model",
    'tf_patch.keras_step(model, "sparse': "traces and trains MobileNetV2 and solves it for the default 60 s "
                                  "(several minutes); tests/test_tf.py covers keras_step and apply",
    "micro_batches=4)  # Keras": "a fragment: the model, loss, optimizer, data and LossStep are the "
                                 "reader's own; tests/test_tf_microbatch.py runs each of the three forms",
    "make notebooks": "runs the notebooks at full size (~20 minutes); tests/test_notebooks.py runs "
                      "them on the small setting",
}
LANGUAGES = {"sh": "shell", "python": "python", "text": "output shown, not run"}


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(info string, code, line number) of every fenced block."""
    out = []
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```\s*$", text, re.M | re.S):
        out.append((m.group(1).strip(), m.group(2), text[:m.start()].count("\n") + 1))
    return out


def _skip_reason(code: str) -> str | None:
    hits = [reason for key, reason in SKIPPED.items() if key in code]
    assert len(hits) <= 1, f"two SKIPPED entries match one block:\n{code}"
    return hits[0] if hits else None


def _name(doc: Path) -> str:
    return str(doc.relative_to(installed.ROOT))


#: (document, info string, code, line) of every block of every document.
ALL = [(_name(d), info, code, line) for d in DOCS for info, code, line in blocks(d.read_text())]


def _todo(doc: str, language: str) -> list[tuple[int, str]]:
    return [(n, c) for d, info, c, n in ALL if d == doc and info == language and not _skip_reason(c)]


def _docs_with(language: str) -> list[str]:
    return sorted({d for d, info, c, _ in ALL if info == language and not _skip_reason(c)})


def test_every_block_says_its_language():
    untagged = [f"{doc}:{line}" for doc, info, _, line in ALL if info not in LANGUAGES]
    assert not untagged, f"blocks {untagged}: tag them sh, python or text (or list them)"


def test_docs_are_found():
    assert "README.md" in {d for d, *_ in ALL} and len(DOCS) > 1


def test_every_skipped_entry_names_a_block():
    for key in SKIPPED:
        assert sum(key in code for _, _, code, _ in ALL) == 1, f"SKIPPED entry {key!r} matches no block (or several)"


@pytest.fixture
def clone(tmp_path):
    """A fresh folder standing for a clone's root (see the module docstring)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the documents' commands use .venv; these tests run outside a virtual environment")
    root = tmp_path / "clone"
    root.mkdir()
    (root / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "graphs").symlink_to(installed.ROOT / "benchmarks" / "graphs", target_is_directory=True)
    return root


def _env(clone: Path) -> dict:
    return installed.env(clone.parent / f"{clone.name}-site", MPLBACKEND="Agg")


@pytest.mark.slow
@pytest.mark.tf
@pytest.mark.parametrize("doc", _docs_with("sh"))
def test_shell_blocks_run_as_written(clone, doc):
    # one terminal per document, top to bottom, as a reader follows it (its first
    # block's `source .venv/bin/activate` holds for the blocks after it)
    pytest.importorskip("tensorflow")  # the walkthroughs profile zoo models
    todo = _todo(doc, "sh")
    script = "".join(f"echo '--- {doc} line {n}'\n{code}\n" for n, code in todo)
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=clone, env=_env(clone),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.count(f"--- {doc} line") == len(todo) and "Traceback" not in r.stderr
    if (clone / "graph.json").exists():
        # the CLI walkthrough says the cached graph is the same, op for op (the zoo once named
        # the projection's reshape at the root scope, so a plan of one did not fit the other)
        from pesto import OpGraph
        made = OpGraph.from_json(str(clone / "graph.json"))
        cached = OpGraph.from_json(str(installed.ROOT / "benchmarks" / "graphs" / "rnnlm_2x2048.json.gz"))
        assert set(made.names) == set(cached.names)


def test_shell_walkthrough_is_run():
    assert "docs/cli.md" in _docs_with("sh") and "README.md" in _docs_with("sh")


@pytest.mark.slow
@pytest.mark.parametrize("doc", _docs_with("python"))
def test_python_blocks_run_as_written(clone, doc):
    todo = _todo(doc, "python")
    driver = clone / "run_blocks.py"
    driver.write_text(
        "import json, sys\n"
        "ns = {'__name__': '__main__'}\n"
        "for line, code in json.load(open(sys.argv[1])):\n"
        f"    print(f'--- {doc} line {{line}}', flush=True)\n"
        f"    exec(compile(code, f'{doc}:{{line}}', 'exec'), ns)\n")
    (clone / "blocks.json").write_text(json.dumps(todo))
    r = subprocess.run([sys.executable, str(driver), "blocks.json"], cwd=clone, env=_env(clone),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert r.stdout.count(f"--- {doc} line") == len(todo)
    if doc == "README.md":
        assert (clone / "gantt.png").exists()  # the API example's chart
