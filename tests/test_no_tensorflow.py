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
    """``import tf_patch`` works (its marks need no TensorFlow); its TensorFlow
    names and modules raise an ImportError naming the ``tf`` extra."""
    r = _run_without_tf(
        "import tf_patch\n"
        "for what in ('tf_patch.opgraph_for', 'import tf_patch.extract', 'import tf_patch.zoo.rnnlm'):\n"
        "    try:\n"
        "        exec(what)\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, exc.name, exc)\n"
        "    else:\n"
        "        sys.exit(what + ' without TensorFlow')\n"
        "assert 'tensorflow' not in sys.modules\n")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("ImportError tensorflow ") for line in lines), lines
    assert all("TensorFlow" in line and "pip install" in line and "[tf]" in line for line in lines)


def _tf_named_step() -> dict:
    """A TensorFlow training step as the zoo's JSON graphs are: TF names and types, no marks."""
    import pesto

    names = [("x", "Placeholder", 64, 0), ("w", "VarHandleOp", 16, 16), ("read", "ReadVariableOp", 16, 0),
             ("dense/MatMul", "MatMul", 64, 0), ("gradients/dense/MatMul_grad/MatMul_1", "MatMul", 16, 0),
             ("train/update_w/ResourceApplyGradientDescent", "ResourceApplyGradientDescent", 0, 0)]
    ops = [pesto.Op(n, {"GPU": 10.0}, output_bytes=b, persistent_bytes=p, type=t, scope=n.rpartition("/")[0])
           for n, t, b, p in names]
    ts = [pesto.Tensor(f"{n}:0", n, b) for n, _, b, _ in names if b]
    es = [("w", "read"), ("x", "dense/MatMul"), ("read", "dense/MatMul"),
          ("x", "gradients/dense/MatMul_grad/MatMul_1"), ("dense/MatMul", "gradients/dense/MatMul_grad/MatMul_1"),
          ("gradients/dense/MatMul_grad/MatMul_1", "train/update_w/ResourceApplyGradientDescent")]
    edges = [pesto.Edge(u, v, (f"{u}:0",)) for u, v in es]
    edges.append(pesto.Edge("w", "train/update_w/ResourceApplyGradientDescent", ()))
    return pesto.OpGraph(ops, edges, ts, name="tfstep").to_dict()


def test_marks_of_a_tf_named_graph_need_no_tensorflow(tmp_path):
    graph, out = tmp_path / "g.json", tmp_path / "plan.json"
    graph.write_text(json.dumps(_tf_named_step()))
    r = _run_without_tf(
        "import pesto\n"
        "from tf_patch.marks import mark_step\n"
        f"g = mark_step(pesto.OpGraph.from_json({str(graph)!r}))\n"
        "print(sorted((o.name, o.batch, o.phase) for o in g.ops))\n"
        "assert 'tensorflow' not in sys.modules\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "('gradients/dense/MatMul_grad/MatMul_1', True, 'weight-grad')" in r.stdout
    r = _run_without_tf("from pesto.cli import main\nsys.exit(main(sys.argv[1:]))\n",
                        "place", str(graph), "--gpus", "2", "--placer", "gpipe", "--micro-batches", "2",
                        "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dense/MatMul@mb1" in json.loads(out.read_text())["placement"]


def test_cli_profile_without_tensorflow_exits_3_naming_the_extra(tmp_path):
    r = _run_without_tf("from pesto.cli import main\nsys.exit(main(sys.argv[1:]))\n",
                        "profile", "rnnlm", "-o", str(tmp_path / "g.json"))
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert "tensorflow" in r.stderr.lower() and "pip install" in r.stderr and "[tf]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "g.json").exists()
