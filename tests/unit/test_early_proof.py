"""The finest level's proving run started early, beside the coarse levels, and the better starts
offered to it while it runs.

An offer must reach the running solver (after its root node) and count in the answer; a vector
that breaks a row is refused; the ILP started in the background answers what ``solve_ilp``
does; and ``solve_multilevel`` on two cores (the proof beside the coarse levels) and on one (one
level after the other) both give true certificates: each one's bound is at most the other's
objective.
"""

from __future__ import annotations

import logging
import threading

import pytest

from models.synthetic import random_dag, random_profile
from partitioner.solvers import highs, ilp, multilevel
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.highs import SideBySide, _Board, run_highs
from partitioner.solvers.multilevel import coarser_levels, solve_multilevel
from partitioner.solvers.problem import Options, Problem, Status, evaluate
from tests.unit.test_two_phase import _model


def test_the_board_keeps_the_best_offer_and_counts_it_as_an_incumbent() -> None:
    board = _Board(0.01, 100.0)
    assert board.offered() == (0, None, float("inf"))
    assert board.offer([1.0], 99.0)
    assert not board.offer([2.0], 99.5)      # worse than the offer kept
    assert board.offer([3.0], 98.0)
    assert board.offered() == (2, [3.0], 98.0)
    assert board.figures() == (98.0, float("-inf"))
    assert not board.stopped()
    assert board.post(float("inf"), 97.1)    # 98 - 97.1 <= 1% of 98: the offer is part of the proof


def test_an_offered_optimum_is_taken_by_the_running_solver_and_answered(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # about 3 s to optimal from HEFT's start: the root is done long before
    _, formulation, start = _model(seed=3, n_ops=150, n_devices=3)
    monkeypatch.setattr(highs, "MIN_RACE", 1e9)  # no second run: the proving run alone must take the offer
    monkeypatch.setattr(highs, "SEARCH_AFTER", 60.0)
    optimum = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start)
    assert optimum.state == "optimal" and optimum.objective < formulation.milp.objective_of(start)
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        runs = SideBySide(formulation.milp, time_limit=60, gap=0.0, start=start)
        broken = list(optimum.values)
        broken[0] = 7.0  # a binary out of its bounds
        assert not runs.offer(broken)
        assert runs.offer(optimum.values)
        assert not runs.offer(optimum.values)  # not better than the offer kept
        result = runs.finish()
    assert any(r.message.startswith("a run took the offered start") for r in caplog.records)
    assert result.state == "optimal"
    assert result.objective == pytest.approx(optimum.objective, rel=1e-6)
    assert result.bound <= result.objective * (1 + 1e-9)
    assert formulation.milp.violation(result.values) <= 1e-6
    assert not [t for t in threading.enumerate() if t.name.startswith("highs-")]


def test_an_offer_no_run_took_is_still_the_answer() -> None:
    _, formulation, start = _model(seed=3, n_ops=150, n_devices=3)
    optimum = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start)
    runs = SideBySide(formulation.milp, time_limit=0.05, gap=0.0, start=start)  # stops before its root ends
    assert runs.offer(optimum.values)
    result = runs.finish()
    assert result.objective == pytest.approx(optimum.objective, rel=1e-9)
    assert formulation.milp.objective_of(result.values) == pytest.approx(optimum.objective, rel=1e-9)


def test_the_ilp_started_in_the_background_answers_what_solve_ilp_does(monkeypatch: pytest.MonkeyPatch) -> None:
    problem, _, _ = _model(seed=11, n_ops=80, n_devices=3)
    heft = solve_heft(problem).placement
    plain = ilp.solve_ilp(problem, gap=0.0, warm_start=heft, proof_first=False)
    running = ilp.start_ilp(problem, warm_start=heft, time_limit=60, gap=0.0)
    assert running is not None
    assert running.offer(plain.placement) or evaluate(problem, plain.placement).total_s >= evaluate(
        problem, heft).total_s
    sol = running.finish()
    assert sol.status is Status.OPTIMAL and sol.solver == "ilp:highs"
    assert evaluate(problem, sol.placement).total_s == pytest.approx(plain.objective, rel=1e-6)
    assert sol.bound <= evaluate(problem, sol.placement).total_s * (1 + 1e-9)
    monkeypatch.setattr(highs, "side_by_side_here", lambda: False)  # one core: no background run
    assert ilp.start_ilp(problem, warm_start=heft, time_limit=60, gap=0.0) is None


@pytest.mark.parametrize("beside", [True, False])
def test_multilevel_on_two_cores_and_on_one_gives_true_certificates(
        beside: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    graph = random_dag(7, 300, layers=10, param_sizes=(1 << 20, 1 << 22))
    profile = random_profile(7, 3)
    cap = graph.total_param_bytes() // 3
    profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    problem = Problem(graph, profile, Options())
    assert len(coarser_levels(problem)) >= 2  # so that levels are solved beside the finest level's proof
    monkeypatch.setattr(multilevel, "side_by_side_here", lambda: beside)
    with caplog.at_level(logging.INFO, logger="partitioner.solvers.multilevel"):
        sol, warm = solve_multilevel(problem, solve_heft(problem), time_limit=60, gap=0.01)
    assert any("proved beside the coarse levels" in r.message for r in caplog.records) == beside
    total = evaluate(problem, sol.placement).total_s
    assert evaluate(problem, sol.placement).feasible
    assert sol.status in (Status.OPTIMAL, Status.WITHIN_GAP)
    assert sol.bound <= total * (1 + 1e-9) and total - sol.bound <= 0.01 * total * (1 + 1e-9)
    assert warm is not None and evaluate(problem, warm.placement).feasible
    other = ilp.solve_ilp(problem, time_limit=60, gap=0.01)  # the finest level alone: both bounds hold for both
    assert sol.bound <= other.objective * (1 + 1e-9) and other.bound <= total * (1 + 1e-9)


def test_cancelling_the_running_solver_leaves_no_thread_behind() -> None:
    problem, _, _ = _model(seed=3, n_ops=150, n_devices=3)  # seconds to optimal: still running when cancelled
    running = ilp.start_ilp(problem, warm_start=solve_heft(problem).placement, time_limit=60, gap=0.0)
    assert running is not None and not running.done()
    running.cancel()
    assert running.done()
    assert not [t for t in threading.enumerate() if t.name.startswith("highs-")]
