"""Pesto without TensorFlow: the library solves and the CLI places JSON graphs;
``tf_patch`` and ``pesto profile`` say what to install.

Each test runs a fresh Python in which an import hook refuses ``tensorflow``
(and its submodules) as a missing package would, whether or not TensorFlow is
installed here.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK_TF = """\
import sys

class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTensorFlow())
"""


def _run_without_tf(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TF + code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_the_hook_blocks_tensorflow():
    r = _run_without_tf("import tensorflow\n")
    assert r.returncode != 0 and "No module named 'tensorflow'" in r.stderr


def test_pesto_solves_without_tensorflow():
    r = _run_without_tf(
        "import pesto\n"
        "g = pesto.OpGraph.from_edges({'a': 20, 'b': 30, 'c': 40}, [('a', 'b', 1000), ('a', 'c', 1000)])\n"
        "plan = pesto.solve(g, gpus=2, time_limit=5, workers=1)\n"
        "pesto.check_plan(g, pesto.v100x2_nvlink(with_cpu=False), plan).raise_if_invalid()\n"
        "assert 'tensorflow' not in sys.modules\n"
        "print(plan.status)\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "optimal"


def test_cli_places_a_json_graph_without_tensorflow(tmp_path):
    import pesto

    graph, out = tmp_path / "g.json", tmp_path / "plan.json"
    pesto.OpGraph.from_edges({"a": 20, "b": 30, "c": 40, "d": 10},
                             [("a", "b", 1000), ("a", "c", 1000), ("b", "d", 10), ("c", "d", 10)]).to_json(str(graph))
    r = _run_without_tf("from pesto.cli import main\nsys.exit(main(sys.argv[1:]))\n",
                        "place", str(graph), "--gpus", "2", "--time-limit", "3", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    plan = pesto.Plan.from_dict(json.loads(out.read_text()))
    assert set(plan.placement) == {"a", "b", "c", "d"}


def test_tf_patch_without_tensorflow_names_what_to_install():
    r = _run_without_tf(
        "try:\n"
        "    import tf_patch\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc)\n"
        "else:\n"
        "    sys.exit('tf_patch imported without TensorFlow')\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ImportError tensorflow ")
    assert "TensorFlow" in r.stdout and "pip install" in r.stdout and "[tf]" in r.stdout


def test_cli_profile_without_tensorflow_exits_3_naming_the_extra(tmp_path):
    r = _run_without_tf("from pesto.cli import main\nsys.exit(main(sys.argv[1:]))\n",
                        "profile", "rnnlm", "-o", str(tmp_path / "g.json"))
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert "tensorflow" in r.stderr.lower() and "pip install" in r.stderr and "[tf]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "g.json").exists()
