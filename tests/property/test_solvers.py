"""Property tests on random DAGs and random profiles: every solver verifies, the ILP is never worse
than a feasible baseline, and with gap 0 on small graphs it equals brute-force enumeration."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from partitioner.solvers.bounds import physical_lower_bound
from partitioner.solvers.greedy import solve_greedy, solve_sequential_fill
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.single import solve_single
from partitioner.verify import verify_graph, verify_placement
from models.synthetic import random_dag, random_profile

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def baselines(problem: Problem) -> dict[str, Placement]:
    out = {f"single:{d}": solve_single(problem, d).placement for d in problem.device_names}
    out["greedy"] = solve_greedy(problem).placement
    out["sequential-fill"] = solve_sequential_fill(problem).placement
    out["heft"] = solve_heft(problem).placement
    return out


def _problem(seed: int, n_ops: int, n_devices: int, tight: bool, objective: Objective, streaming: bool = True,
             training: bool = False) -> Problem:
    graph = random_dag(seed, n_ops)
    verify_graph(graph)
    return Problem(graph, random_profile(seed, n_devices, tight=tight),
                   Options(objective=objective, streaming=streaming, training=training))


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    n_ops=st.integers(3, 14),
    n_devices=st.integers(2, 3),
    tight=st.booleans(),
    objective=st.sampled_from(list(Objective)),
    training=st.booleans(),
)
# the physical bound once added every optimizer step along the longest path; steps on several devices overlap
@example(seed=331, n_ops=7, n_devices=3, tight=False, objective=Objective.MAKESPAN, training=True)
# the makespan model's schedule of its placement beat evaluate's list schedule of it: the ILP is kept no worse than its start
@example(seed=6472, n_ops=13, n_devices=2, tight=True, objective=Objective.MAKESPAN, training=False)
def test_every_solver_verifies_and_the_ilp_is_never_worse(
    seed: int, n_ops: int, n_devices: int, tight: bool, objective: Objective, training: bool
) -> None:
    problem = _problem(seed, n_ops, n_devices, tight, objective, training=training)
    results = {name: evaluate(problem, pl) for name, pl in baselines(problem).items()}
    for name, pl in baselines(problem).items():
        verify_placement(problem, pl, results[name])
    feasible = {name: ev.total_s for name, ev in results.items() if ev.feasible}
    warm = min(feasible, key=feasible.get) if feasible else None
    sol = solve_ilp(problem, time_limit=30, gap=1e-6, warm_start=baselines(problem)[warm] if warm else None)
    if sol.status.value == "infeasible":
        assert not feasible, f"ILP says infeasible but {sorted(feasible)} fit"
        return
    ev = evaluate(problem, sol.placement)
    verify_placement(problem, sol.placement, ev)
    assert ev.feasible, ev.violations
    for name, total in feasible.items():
        assert ev.total_s <= total * (1 + 1e-6) + 1e-12, f"ILP {ev.total_s} worse than {name} {total}"
    assert sol.bound is not None and sol.bound <= ev.total_s * (1 + 1e-6)
    assert physical_lower_bound(problem) <= ev.total_s * (1 + 1e-9)


def brute_force(problem: Problem) -> float:
    """The best feasible total over every assignment of nodes to allowed devices (no streaming)."""
    best = float("inf")
    choices = [problem.allowed[n] for n in problem.nodes]
    for combo in itertools.product(*choices):
        ev = evaluate(problem, Placement(dict(zip(problem.nodes, combo))))
        if ev.feasible:
            best = min(best, ev.total_s)
    return best


@SETTINGS
@given(
    seed=st.integers(0, 10_000),
    n_ops=st.integers(2, 9),
    tight=st.booleans(),
    objective=st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]),
)
def test_ilp_with_gap_zero_equals_brute_force(seed: int, n_ops: int, tight: bool, objective: Objective) -> None:
    problem = _problem(seed, n_ops, 3, tight, objective, streaming=False)
    expected = brute_force(problem)
    sol = solve_ilp(problem, time_limit=30, gap=0.0)
    if expected == float("inf"):
        assert sol.status.value == "infeasible"
        return
    assert evaluate(problem, sol.placement).total_s == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_twelve_ops_equal_brute_force(objective: Objective) -> None:
    problem = Problem(random_dag(7, 12), random_profile(3, 2, tight=True), Options(objective=objective, streaming=False))
    sol = solve_ilp(problem, time_limit=60, gap=0.0)
    assert evaluate(problem, sol.placement).total_s == pytest.approx(brute_force(problem), rel=1e-6, abs=1e-12)


@SETTINGS
@given(seed=st.integers(0, 10_000), n_ops=st.integers(2, 7))
def test_makespan_ilp_is_at_most_every_topological_schedule(seed: int, n_ops: int) -> None:
    problem = _problem(seed, n_ops, 3, False, Objective.MAKESPAN, streaming=False)
    best = brute_force(problem)  # list schedules in topological order: an upper bound on the optimum
    sol = solve_ilp(problem, time_limit=30, gap=0.0)
    assert evaluate(problem, sol.placement).total_s <= best * (1 + 1e-6) + 1e-12


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_same_input_same_plan(solver: str) -> None:
    first = solve_ilp(_problem(11, 12, 3, True, Objective.LATENCY), solver=solver, gap=0.0, time_limit=30)
    second = solve_ilp(_problem(11, 12, 3, True, Objective.LATENCY), solver=solver, gap=0.0, time_limit=30)
    assert first.placement == second.placement
