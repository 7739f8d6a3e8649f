"""HiGHS from a warm start in two phases: sub-MIP heuristics off first, then on from its incumbent.

The answer must be what one run with HiGHS's defaults proves (the same optimum, a bound no
higher than it), whichever phase ends the search, and progress reports must go on counting
from the first phase's start, with the first phase's bound where it is the higher one.
"""

from __future__ import annotations

import logging

import pytest

from models.synthetic import random_dag, random_profile
from partitioner.solvers import ilp
from partitioner.solvers.formulation import Formulation
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.highs import Progress, _later, run_highs
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
        two = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start, proof_seconds=0.05)
    assert any("searching with them" in r.message for r in caplog.records)  # 0.05 s did not prove it
    assert one.state == two.state == "optimal"
    assert two.objective == pytest.approx(one.objective, rel=1e-6)
    assert two.bound <= two.objective * (1 + 1e-9)
    assert formulation.milp.objective_of(two.values) == pytest.approx(two.objective, rel=1e-9)
    assert formulation.milp.without_ordering().violation(two.values) <= 1e-6  # phase 2 may break an ordering row


def test_a_first_phase_that_proves_the_gap_is_the_answer(caplog: pytest.LogCaptureFixture) -> None:
    _, formulation, start = _model(seed=11, n_ops=80, n_devices=3)
    with caplog.at_level(logging.DEBUG, logger="partitioner.solvers.highs"):
        result = run_highs(formulation.milp, time_limit=60, gap=0.0, start=start, proof_seconds=30.0)
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
