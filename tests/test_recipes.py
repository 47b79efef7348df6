"""The recipes (solver.recipes, solver.passes, solver.status, solver.options):
recipes and their order, skip reasons, the winner, never worse than a
given plan, the status rule, the options checked once."""
from __future__ import annotations

import pytest

from benchmarks.generators import layered_dag
from pesto.cluster import gpus, hosts
from pesto.graph import OpGraph
from pesto.plan import Plan, check_plan
from solver.options import SHARES, SolveOptions, pass_shares
from solver.recipes import RECIPES, PASSES, improve, new_run, run_recipe, run_passes, solve
from solver.registry import get_placer, heuristic_placers
from solver.passes import choose
from solver.status import final_status

CLUSTER = gpus(2)


def _names(plan: Plan) -> list[str]:
    return [s.name for s in plan.log.passes]


def _notes(plan: Plan) -> dict[str, str]:
    return {s.name: s.note for s in plan.log.passes}


# -- recipes -------------------------------------------------------------------------
def test_every_pass_of_the_recipes_is_known_and_each_recipe_ends_with_status():
    for passes in RECIPES.values():
        assert set(passes) <= set(PASSES) and passes[-1] == "status"
    with pytest.raises(ValueError, match="ends with the 'status' pass"):
        new_run(layered_dag(20, seed=0), CLUSTER, ("heuristics",), SolveOptions())
    with pytest.raises(ValueError, match="unknown passes"):
        new_run(layered_dag(20, seed=0), CLUSTER, ("heuristics", "magic", "status"), SolveOptions())


def test_the_full_recipe_runs_its_passes_in_order():
    g = layered_dag(300, width=8, seed=1)
    plan = solve(g, CLUSTER, SolveOptions(time_limit=6, workers=1, target_vertices=40, deterministic=True))
    # one GPU group: the "one group" pass has nothing to do and leaves no record
    assert _names(plan) == [s for s in RECIPES["full"] if s != "one group"]
    assert plan.log.recipe == "full" and plan.log.winner in plan.log.candidates
    assert {"cpsat", "lns", "refine"} <= set(plan.log.candidates)
    check_plan(g, CLUSTER, plan).raise_if_invalid()


def test_a_small_graph_runs_the_paper_list_and_the_exact_solver_wins():
    g = layered_dag(12, width=3, seed=2)
    plan = solve(g, CLUSTER, SolveOptions(time_limit=5, workers=1))
    assert _names(plan) == list(RECIPES["paper"]) and plan.log.recipe == "paper"
    assert _notes(plan)["coarsen"] == "not needed"
    assert plan.log.winner == "cpsat" and plan.status == "optimal"


# -- skip reasons -------------------------------------------------------------------------
def test_predicted_overruns_skip_the_search_passes_and_say_why():
    # a cost unit of 1000 s per m-TOPO run: after the first heuristic nothing optional fits in 60 s
    g = layered_dag(300, width=8, seed=1)
    run = new_run(g, CLUSTER, RECIPES["full"], SolveOptions(time_limit=60, workers=1, target_vertices=40),
                  name="full", unit=1000.0)
    plan = run_passes(run)
    notes = _notes(plan)
    for pass_name in ("coarsen", "lns", "local search"):
        assert notes[pass_name].startswith("skipped: time limit (needs ~"), (pass_name, notes[pass_name])
    assert notes["exact"] == "skipped: time limit (no time to coarsen and expand)"
    assert "1 of 1 not or partly re-ordered" in notes["reschedule"]  # only the best start, as it came
    assert plan.log.stopped == "time limit" and plan.log.winner == "m-topo"
    others = [h for h in heuristic_placers() if h != "m-topo"]
    assert all(plan.log.skipped[h].startswith("skipped: time limit (needs ~") for h in others)
    assert "final check skipped" in notes["status"]
    check_plan(g, CLUSTER, plan).raise_if_invalid()


def test_one_group_is_skipped_when_its_share_is_under_two_seconds():
    g = layered_dag(60, width=6, seed=3)
    c = hosts(2, 2, "25gbe")
    passes = ("heuristics", "one group", "reschedule", "status")
    plan = run_recipe(g, c, passes, SolveOptions(time_limit=5, workers=1, deterministic=True), name="full")
    assert _notes(plan)["one group"].startswith("skipped: 1.") and _notes(plan)["one group"].endswith("s for it")
    assert plan.log.stopped == ""  # not a stop: the pass had too small a share to be worth it


# -- the winner, the status rule ------------------------------------------------------------
def test_the_winner_is_feasible_first_then_shortest_then_earlier():
    a, b = Plan({}, {}, makespan=10.0, placer="a"), Plan({}, {}, makespan=9.0, placer="b")
    over = Plan({}, {}, makespan=5.0, placer="over", status="infeasible")
    assert choose([("a", a), ("b", b), ("over", over)])[0] == "b"
    assert choose([("a", a), ("a2", a.replace(placer="a2"))])[0] == "a"  # a tie: the earlier one
    assert choose([("over", over), ("o2", over.replace(makespan=4.0))])[0] == "o2"


@pytest.mark.parametrize("step, kw, want", [
    (10.0, dict(proved_optimal=False, exact_ran=False), "optimal"),  # at the bound
    (11.0, dict(proved_optimal=True, exact_ran=True), "optimal"),  # proved on the graph itself
    (11.0, dict(proved_optimal=False, exact_ran=True), "feasible"),
    (11.0, dict(proved_optimal=False, exact_ran=False), "heuristic"),
    (11.0, dict(proved_optimal=False, exact_ran=True, interrupted=True), "interrupted"),
])
def test_the_status_rule(step, kw, want):
    assert final_status(Plan({}, {}, makespan=step), 10.0, **kw) == want
    over = Plan({}, {}, makespan=step, status="infeasible")
    assert final_status(over, 10.0, **kw) == "infeasible"  # memory first, whatever else


def test_never_worse_than_a_given_plan():
    g = layered_dag(300, width=8, seed=4)
    given = solve(g, CLUSTER, SolveOptions(time_limit=4, workers=1, target_vertices=40, deterministic=True))
    # the given plan against the heuristics only (no search): it is a candidate and wins
    passes = ("heuristics", "reschedule", "status")
    again = run_recipe(g, CLUSTER, passes, SolveOptions(time_limit=30, workers=1, hint=given), name="full")
    assert again.makespan <= given.makespan + 1e-9
    assert again.log.candidates[again.log.winner] == again.makespan


# -- options ------------------------------------------------------------------------------
def test_options_are_checked_once_with_named_errors():
    for kw, exc, words in [(dict(time_limit=float("nan")), ValueError, "time_limit"),
                           (dict(workers=0), ValueError, "workers must be >= 1"),
                           (dict(seed=1.5), TypeError, "seed must be an int"),
                           (dict(backend="nope"), ValueError, "unknown placer 'nope' \\(backend\\)"),
                           (dict(hint="bogus"), ValueError, "unknown placer 'bogus' \\(hint\\)"),
                           (dict(heuristics=("m-etf", "m-eft")), ValueError, "'m-eft' \\(heuristics\\)"),
                           (dict(recipe="fast"), ValueError, "recipe must be"),
                           (dict(recipe="full", backend="mip"), ValueError, "runs CP-SAT only"),
                           (dict(coarsen_options={"method": "tall"}), ValueError, "coarsening method"),
                           (dict(lns_time=-1), ValueError, "lns_time")]:
        with pytest.raises(exc, match=words):
            SolveOptions(**kw)
    with pytest.raises(ValueError, match="workers"):
        SolveOptions().replace(workers=-3)  # a changed copy is checked again


def test_the_recipe_and_the_pass_times_follow_the_options():
    big, small = layered_dag(300, seed=0), layered_dag(10, seed=0)
    o = SolveOptions(time_limit=10, target_vertices=40)
    assert o.recipe_for(big) == "full" and o.recipe_for(small) == "paper"
    assert SolveOptions(backend="mip", target_vertices=40).recipe_for(big) == "paper"
    with pytest.raises(ValueError, match="hint=None"):
        SolveOptions(hint=None, target_vertices=40).recipe_for(big)
    full = o.pass_seconds("full")
    assert [full[k] for k in ("exact", "lns", "local search")] == pytest.approx([10 * s for s in SHARES])
    assert full["status"] == pytest.approx(min(10.0, 0.1 * (full["exact"] + full["local search"])))
    assert o.pass_seconds("paper")["exact"] == pytest.approx(9.0) and o.pass_seconds("paper")["lns"] == 0
    assert SolveOptions(time_limit=10, exact_time=1.0).pass_seconds("full")["exact"] == 1.0
    assert SolveOptions(time_limit=None).pass_seconds("full")["lns"] == 0.0
    assert pass_shares(("reschedule", "lns", "local search", "status")) == pytest.approx(
        {"exact": 0.0, "lns": 0.4 / 0.7, "local search": 0.3 / 0.7})


# -- early stop ---------------------------------------------------------------------------
def _chain(n: int) -> OpGraph:
    """A chain with heavy transfers: the critical path is the lower bound and
    every op on one GPU reaches it (the "single" heuristic finds that plan)."""
    return OpGraph.from_edges({f"n{i}": 10 + i % 5 for i in range(n)},
                              [(f"n{i}", f"n{i + 1}", 10 ** 8) for i in range(n - 1)])


def _fork() -> OpGraph:
    """No heuristic plan reaches critical path / work (60 µs); CP-SAT proves 90 µs."""
    return OpGraph.from_edges({"a": 20, "b": 30, "c": 40}, [("a", "b", 1000), ("a", "c", 1000)])


def test_a_heuristic_plan_at_the_lower_bound_skips_the_search_passes_and_says_why():
    g = _chain(50)
    plan = solve(g, CLUSTER, SolveOptions(time_limit=60, workers=1, target_vertices=10))
    assert plan.log.recipe == "full" and plan.log.stopped_early and plan.status == "optimal"
    assert plan.log.stopped == "stopped early: incumbent within 1e-06 of the lower bound (critical path / work)"
    skipped = {s.name for s in plan.log.passes if s.note == f"skipped: {plan.log.stopped}"}
    assert skipped == {"one group", "coarsen", "exact", "lns", "local search"}
    assert _names(plan) == list(RECIPES["full"])  # each pass recorded, run or skipped
    assert "cpsat" not in plan.log.candidates and plan.makespan == plan.lower_bound
    check_plan(g, CLUSTER, plan).raise_if_invalid()


def test_the_paper_recipe_skips_the_exact_solver_when_a_heuristic_reaches_the_bound():
    plan = solve(_chain(3), CLUSTER, SolveOptions(time_limit=60, workers=1))
    assert plan.log.recipe == "paper" and plan.log.stopped_early
    assert _notes(plan)["exact"].startswith("skipped: stopped early: incumbent within 1e-06")
    assert plan.status == "optimal"


def test_a_graph_whose_heuristic_plans_miss_the_bound_runs_the_exact_pass():
    plan = solve(_fork(), CLUSTER, SolveOptions(time_limit=5, workers=1))
    assert not plan.log.stopped_early and plan.log.stopped == ""
    assert _notes(plan)["exact"] == "cpsat optimal on 3 vertices" and plan.log.winner == "cpsat"


def test_an_exact_proof_on_the_graph_itself_skips_the_searches_after_it():
    g = _fork()
    start = get_placer("m-topo")(g, CLUSTER)
    plan = improve(g, CLUSTER, [start], cpsat_time=5, lns_time=5, refine_time=5, workers=1)
    assert _notes(plan)["exact"] == "cpsat optimal on 3 vertices"
    assert plan.log.stopped_early
    assert plan.log.stopped == "stopped early: cpsat proved the incumbent optimal on the graph itself"
    assert _notes(plan)["lns"] == _notes(plan)["local search"] == f"skipped: {plan.log.stopped}"
    assert plan.status == "optimal" and plan.makespan < start.makespan


def test_progress_lines_name_each_pass_its_incumbent_and_bound_in_ms():
    lines = []
    plan = solve(_fork(), CLUSTER, SolveOptions(time_limit=5, workers=1, progress=lines.append))
    for st in _names(plan):
        start = next(ln for ln in lines if f"] {st}: start" in ln)
        done = next(ln for ln in lines if f"] {st}: done in " in ln)
        assert "bound " in start and "bound " in done  # "| incumbent 0.090 ms, bound ..." once there is one
    exact = next(ln for ln in lines if "] exact: start" in ln)
    assert exact.endswith("| incumbent 0.090 ms, bound 0.060 ms, gap 33.3%")  # critical path / work
    assert "status: done in " in lines[-1] and "incumbent 0.090 ms, bound 0.090 ms" in lines[-1]  # CP-SAT's bound
    assert not any("µs" in ln for ln in lines)
    assert any(ln.endswith("m-topo: 0.142 ms (heuristic)") for ln in lines)
