"""HiGHS from a warm start in two runs: one proving (sub-MIP heuristics off), one searching (on),
side by side on two cores or one after the other.

The answer must be what one run with HiGHS's defaults proves (the same optimum, a bound no
higher than it), whichever run ends the search; one after the other, progress reports must go
on counting from the first run's start, with the first run's bound where it is the higher one;
side by side, the runs stop together once their best incumbent and best bound prove the gap,
report progress in the caller's thread, and leave no thread behind and stdout as it was.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from models.synthetic import random_dag, random_profile
from partitioner.solvers import highs, ilp
from partitioner.solvers.formulation import Formulation
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.highs import Progress, _Board, _later, _quiet_stdout, run_highs
from partitioner.solvers.problem import Options, Problem, Status, evaluate


def _model(seed: int = 5, n_ops: int = 120, n_devices: int = 4) -> tuple[Problem, Formulation, list[float]]:
    problem = Problem(random_dag(seed, n_ops, layers=n_ops // 10), random_profile(seed, n_devices, tight=True),
                      Options(streaming=True))
    start = solve_heft(problem).placement
    incumbent = evaluate(problem, start).total_s
    formulation = Formulation(problem, ilp._units(problem, incumbent), cutoff=incumbent)
    return problem, formulation, formulation.start_values(formulation.canonical(start))


def test_the_second_phase_searches_on_and_proves_the_same_optimum(caplog: pytest.LogCaptureFixture) -> None:
    _, formulation, start = _model(seed=3, n_ops=150, n_devices=3)  # about 3 s to optimal: 0.05 s cannot prove it
    one = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start)
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        two = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start, proof_seconds=0.05,
                        side_by_side=False)
    assert any("searching with them" in r.message for r in caplog.records)  # 0.05 s did not prove it
    assert one.state == two.state == "optimal"
    assert two.objective == pytest.approx(one.objective, rel=1e-6)
    assert two.bound <= two.objective * (1 + 1e-9)
    assert formulation.milp.objective_of(two.values) == pytest.approx(two.objective, rel=1e-9)
    assert formulation.milp.without_ordering().violation(two.values) <= 1e-6  # phase 2 may break an ordering row


def test_a_first_phase_that_proves_the_gap_is_the_answer(caplog: pytest.LogCaptureFixture) -> None:
    _, formulation, start = _model(seed=11, n_ops=80, n_devices=3)
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        result = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start, proof_seconds=30.0,
                           side_by_side=False)
    assert result.state == "optimal"
    assert not any("searching with them" in r.message for r in caplog.records)
    assert result.bound == pytest.approx(result.objective, rel=1e-6)


def test_solve_ilp_with_and_without_the_phases_agrees() -> None:
    problem, _, _ = _model()
    start = solve_heft(problem).placement
    plain = ilp.solve_ilp(problem, gap=0.0, warm_start=start, proof_first=False)
    phased = ilp.solve_ilp(problem, gap=0.0, warm_start=start, proof_first=True)
    assert plain.status is phased.status is Status.OPTIMAL
    assert evaluate(problem, phased.placement).total_s == pytest.approx(plain.objective, rel=1e-6)


def test_second_phase_progress_counts_from_the_start_and_keeps_the_higher_bound() -> None:
    seen: list[Progress] = []
    report = _later(seen.append, offset=2.0, bound=9000.0, scale=1000.0)  # model units: 9.0 in the caller's
    report(Progress(0.5, 10.0, 8.0, 0.2))    # the second run's own bound is lower
    report(Progress(1.5, 10.0, 9.5, 0.05))   # ... then higher
    assert [p.seconds for p in seen] == [2.5, 3.5]
    assert [p.bound for p in seen] == [9.0, 9.5]
    assert seen[0].gap == pytest.approx(0.1)
    assert seen[1].gap == pytest.approx(0.05)
    assert _later(None, offset=1.0, bound=None, scale=1.0) is None


def test_side_by_side_runs_prove_the_same_optimum_and_report_from_the_callers_thread(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    _, formulation, start = _model(seed=3, n_ops=150, n_devices=3)  # about 3 s to optimal
    monkeypatch.setattr(highs, "SEARCH_AFTER", 0.5)  # so that the searching run starts
    one = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start)
    seen: list[tuple[Progress, str]] = []
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        both = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start, proof_seconds=0.05, side_by_side=True,
                         progress=lambda p: seen.append((p, threading.current_thread().name)))
    ran = [r.message for r in caplog.records if r.message.startswith("side by side")]
    assert len(ran) == 1 and "proof" in ran[0] and "search" in ran[0]  # the proof took over 0.5 s
    assert one.state == "optimal" and both.state in ("optimal", "stopped")
    assert both.objective == pytest.approx(one.objective, rel=1e-6)
    assert both.bound <= both.objective * (1 + 1e-9)
    assert both.bound >= both.objective * (1 - 1e-6)  # the two runs together proved it
    assert formulation.milp.objective_of(both.values) == pytest.approx(both.objective, rel=1e-9)
    assert formulation.milp.without_ordering().violation(both.values) <= 1e-6
    assert seen, "a run of seconds reports progress"
    assert {name for _, name in seen} == {threading.main_thread().name}
    assert [p.seconds for p, _ in seen] == sorted(p.seconds for p, _ in seen)
    assert all(p.bound is None or p.bound <= p.incumbent * (1 + 1e-9) for p, _ in seen)
    assert not [t for t in threading.enumerate() if t.name.startswith("highs-")]
    os.write(1, b"stdout is back\n")
    assert "stdout is back" in capfd.readouterr().out


def test_a_quick_proof_side_by_side_starts_no_search(caplog: pytest.LogCaptureFixture) -> None:
    _, formulation, start = _model(seed=11, n_ops=40, n_devices=3)  # proved in well under a second
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        result = run_highs(formulation.milp, time_limit=60, gap=0.01, start=start, proof_seconds=30.0,
                           side_by_side=True)
    ran = [r.message for r in caplog.records if r.message.startswith("side by side")]
    assert len(ran) == 1 and "proof" in ran[0] and "search" not in ran[0]
    assert result.state == "optimal" and result.note == ""
    assert result.objective - result.bound <= 0.01 * result.objective * (1 + 1e-9)


def test_side_by_side_within_the_shortest_limit_still_answers() -> None:
    _, formulation, start = _model(seed=3, n_ops=150, n_devices=3)
    began = time.perf_counter()
    result = run_highs(formulation.milp, time_limit=0.05, gap=0.0, start=start, proof_seconds=0.05,
                       side_by_side=True)
    assert time.perf_counter() - began < 5.0
    assert result.state in ("optimal", "stopped") and result.values is not None
    assert formulation.milp.objective_of(result.values) <= formulation.milp.objective_of(start) * (1 + 1e-9)


def test_the_board_stops_both_runs_once_together_they_prove_the_gap() -> None:
    board = _Board(0.01, 100.0)
    assert not board.post(float("inf"), 95.0)   # the proving run: no incumbent of its own yet, a bound
    assert not board.post(99.5, float("-inf"))  # the searching run: a better incumbent, no bound yet
    assert board.figures() == (99.5, 95.0)
    assert board.post(float("inf"), 98.6)       # 99.5 - 98.6 <= 1% of 99.5
    assert board.wait(0.0)
    later = _Board(0.01, 100.0)
    assert not later.wait(0.01)                 # nothing ended: the searching run's wait runs out
    later.stop()                                # one run ended: the other stops at its next check
    assert later.post(float("inf"), float("-inf")) and later.wait(0.0)


def test_quiet_stdout_from_several_threads_leaves_stdout_as_it_was(capfd: pytest.CaptureFixture[str]) -> None:
    def quiet() -> None:
        for _ in range(20):
            with _quiet_stdout():
                time.sleep(0.001)

    threads = [threading.Thread(target=quiet) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.write(1, b"still printing\n")
    assert "still printing" in capfd.readouterr().out
