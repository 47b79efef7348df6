"""One meaning per name (issue 29): the solve's recipes and passes, the heuristics, and the
names they replaced. Old module paths no longer import, old keywords warn, old plan files load.

Old -> new: ``solver.pipeline`` -> ``solver.recipes`` (``PIPELINES`` -> ``RECIPES``,
``run_pipeline`` -> ``run_recipe``, ``STAGES`` -> ``PASSES``, ``run_stages`` -> ``run_passes``),
``solver.stages`` -> ``solver.passes``, ``solver.baselines`` -> ``solver.practitioners``,
``tf_patch.pipeline`` -> ``tf_patch.workflow``, ``pesto.Stage`` -> ``pesto.PassLog``,
``SolveLog.pipeline``/``stages``/``stage()`` -> ``recipe``/``passes``/``pass_named()``, the pass
``"baselines"`` -> ``"heuristics"``, ``registry.baselines()`` -> ``heuristic_placers()``,
``pesto.solve(pipeline=)`` -> ``recipe=``, ``solver.bounds.phases``/``Phases`` ->
``chain_heads``/``ChainHeads``, ``pesto.engine.Run`` -> ``ReplayResult``.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest

import pesto
from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.solvelog import PassLog, SolveLog

ROOT = Path(__file__).resolve().parents[1]
OLD_MODULES = ["solver.pipeline", "solver.stages", "solver.baselines", "tf_patch.pipeline"]
NEW_MODULES = ["solver.recipes", "solver.passes", "solver.practitioners"]


def _source(name: str) -> Path:
    """Where module ``name`` would be, in the package as imported (not an installed copy elsewhere)."""
    package, _, module = name.rpartition(".")
    return Path(importlib.import_module(package).__file__).parent / f"{module}.py"


@pytest.mark.parametrize("name", OLD_MODULES)
def test_old_module_paths_are_gone(name):
    """No file for the old module in its package as imported (an editable install of another
    checkout may still hold one, so ``find_spec`` would look there)."""
    assert not _source(name).exists(), f"{name} came back: the names issue renamed it"


@pytest.mark.parametrize("name", NEW_MODULES)
def test_new_module_paths_import(name):
    importlib.import_module(name)


def test_tf_patch_workflow_is_where_the_tf_loop_lives():
    assert (ROOT / "tf_patch" / "workflow.py").is_file() and not (ROOT / "tf_patch" / "pipeline.py").exists()
    import tf_patch
    assert "workflow" in tf_patch._MODULES and "pipeline" not in tf_patch._MODULES


def test_old_attribute_names_are_gone():
    from pesto import engine
    from solver import bounds, options, recipes, registry
    from solver.parallel import search
    gone = [(recipes, "PIPELINES"), (recipes, "STAGES"), (recipes, "run_pipeline"), (recipes, "run_stages"),
            (registry, "baselines"), (options, "PIPELINE_NAMES"), (options, "stage_shares"),
            (options.SolveOptions, "stage_seconds"), (options.SolveOptions, "pipeline_for"),
            (options.SolveOptions, "baseline_names"), (bounds, "phases"), (bounds, "Phases"), (engine, "Run"),
            (search, "STAGES"), (SolveLog, "stage")]
    back = [f"{getattr(m, '__name__', m)}.{a}" for m, a in gone if hasattr(m, a)]
    assert not back, f"old names came back: {back}"
    assert "pipeline" not in {f.name for f in options.SolveOptions.__dataclass_fields__.values()}
    assert {"recipe", "passes"} <= set(SolveLog.__dataclass_fields__) and "stages" not in SolveLog.__dataclass_fields__


def test_each_recipe_is_a_list_of_passes_and_the_heuristics_pass_replaced_baselines():
    from solver.budget import COSTS
    from solver.recipes import PASSES, RECIPES
    assert set(RECIPES) == {"full", "paper"}
    for passes in RECIPES.values():
        assert set(passes) <= set(PASSES) and passes[-1] == "status"
    assert "heuristics" in PASSES and "baselines" not in PASSES and "baselines" not in COSTS


def test_pipeline_keyword_warns_and_means_recipe():
    g = OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])
    with pytest.warns(DeprecationWarning, match=r"recipe='paper'") as caught:
        plan = pesto.solve(g, gpus=2, time_limit=5, workers=1, pipeline="paper")
    assert caught[0].filename == __file__   # the warning points at the caller's line
    assert plan.log.recipe == "paper"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the new keyword does not warn
        assert pesto.solve(g, gpus=2, time_limit=5, workers=1, recipe="paper").log.recipe == "paper"
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="disagree"):
        pesto.solve(g, gpus=2, time_limit=5, recipe="full", pipeline="paper")


def test_pesto_stage_is_a_deprecated_alias_of_passlog():
    with pytest.warns(DeprecationWarning, match="PassLog"):
        assert pesto.Stage is PassLog
    assert "Stage" not in pesto.__all__ and "PassLog" in pesto.__all__


def test_plan_json_is_written_with_the_new_keys_and_old_files_still_load(tmp_path):
    log = SolveLog(recipe="full", passes=(PassLog("heuristics", 0.5, 90.0, "8 plans"), PassLog("status", 0.1)),
                   winner="m-etf")
    d = log.to_dict()
    assert d["recipe"] == "full" and [p["name"] for p in d["passes"]] == ["heuristics", "status"]
    assert "pipeline" not in d and "stages" not in d
    old = dict(d, pipeline=d.pop("recipe"), stages=d.pop("passes"))
    old["stages"][0]["name"] = "baselines"
    back = SolveLog.from_dict(json.loads(json.dumps(old)))
    assert back == log and back.pass_named("heuristics").makespan == 90.0


def test_a_plan_file_with_an_old_log_loads(tmp_path):
    g = OpGraph.from_edges({"a": 20, "b": 30}, [("a", "b", 1000)])
    plan = pesto.solve(g, gpus=2, time_limit=5, workers=1)
    path = tmp_path / "plan.json"
    plan.to_json(path)
    d = json.loads(path.read_text())
    d["log"] = dict(d["log"], pipeline=d["log"].pop("recipe"), stages=d["log"].pop("passes"))
    path.write_text(json.dumps(d))
    assert Plan.from_json(path).log == plan.log


OLD_WORDS = re.compile(r"\b(PIPELINES|STAGES|run_pipeline|run_stages|stage_seconds|stage_shares|pipeline_for|"
                       r"lns_stage|baseline_names|PIPELINE_NAMES)\b|solver[./](pipeline|stages|baselines)\b|"
                       r"tf_patch[./]pipeline\b|\blog\.(stages|pipeline)\b|\bpesto\.engine\.Run\b")


def test_no_source_or_doc_uses_an_old_name():
    files = [p for d in ("pesto", "coarsen", "solver", "tf_patch", "benchmarks", "tests", "docs", "notebooks")
             for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".ipynb") and "results" not in p.parts]
    files += [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "Makefile"]
    hits = [f"{p.relative_to(ROOT)}:{k}: {line.strip()[:100]}" for p in files if p.exists() and p.name != "test_names.py"
            for k, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OLD_WORDS.search(line)]
    assert not hits, "old names:\n" + "\n".join(hits)


def test_pesto_microbatch_shadows_no_module():
    """``pesto.microbatch`` was a function and a module at once; now neither exists (the
    transforms are :mod:`pesto.step`; ``pesto.solve(micro_batches=)`` is the entry)."""
    assert importlib.util.find_spec("pesto.microbatch") is None
    assert not hasattr(pesto, "microbatch")


def test_cli_recipe_flag_chooses_the_passes(tmp_path, capsys):
    from benchmarks.generators import layered_dag
    from pesto.cli import EXIT_OK, main
    path = tmp_path / "g.json"
    layered_dag(60, width=6, seed=3).to_json(str(path))
    out = tmp_path / "plan.json"
    rc = main(["place", str(path), "--recipe", "paper", "--target-vertices", "20", "--time-limit", "3",
               "-o", str(out)])
    assert rc == EXIT_OK and "paper recipe: coarsen" in capsys.readouterr().out
    assert Plan.from_json(str(out)).log.recipe == "paper"
