"""The brute-force oracle certifies the training-state choices: optimizer state on the host or with
its weights, recompute, streaming in both passes, host steps beside backward.

Small random training problems (latency and throughput, offload and recompute offered); the oracle
enumerates every device, stream, state and recompute choice and evaluates each on the original
graph. The ILP (HiGHS, gap 0) must reach that optimum, its bound must not exceed it, and its own
objective must be what ``evaluate`` says of its placement.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.synthetic import random_dag, random_profile
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Problem, evaluate
from tests.property.oracle import count_candidates, optimum

TOLERANCE = 1e-6


@st.composite
def training_problems(draw: st.DrawFn) -> Problem:
    seed = draw(st.integers(0, 10**6))
    objective = draw(st.sampled_from([Objective.LATENCY, Objective.THROUGHPUT]))
    graph = random_dag(seed, draw(st.integers(2, 4)), param_prob=0.8, param_sizes=(1 << 20, 1 << 24))
    profile = random_profile(seed, 2, tight=True)
    cap = max(1 << 20, max(op.param_bytes for op in graph.ops.values())) * draw(st.sampled_from((2, 3, 5)))
    profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    problem = Problem(graph, profile, Options(objective=objective, training=True, streaming=draw(st.booleans()),
                                              delayed_update=draw(st.booleans())))
    assume(count_candidates(problem) <= 4096)
    return problem


@pytest.mark.parametrize("solver", ["highs"])
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(problem=training_problems())
def test_the_ilp_reaches_the_oracles_optimum_over_training_state(problem: Problem, solver: str) -> None:
    best, _ = optimum(problem)
    solution = solve_ilp(problem, solver=solver, gap=0.0, time_limit=30)
    if best == float("inf"):
        assert not evaluate(problem, solution.placement).feasible if solution.placement.device else True
        return
    ev = evaluate(problem, solution.placement)
    assert ev.feasible
    assert ev.total_s <= best * (1 + TOLERANCE) + 1e-12
    assert solution.bound is None or solution.bound <= best * (1 + TOLERANCE) + 1e-12
    assert solution.objective == pytest.approx(ev.total_s, rel=TOLERANCE)
    assert physical_lower_bound(problem) <= best * (1 + TOLERANCE) + 1e-12
    assert memory_aware_lower_bound(problem) <= best * (1 + TOLERANCE) + 1e-12


def test_the_oracle_sees_offloaded_state_and_recompute() -> None:
    """At least one drawn instance's optimum keeps some state on the host or recomputes."""
    found = set()
    for seed in range(40):
        graph = random_dag(seed, 3, param_prob=0.9, param_sizes=(1 << 22, 1 << 24))
        profile = random_profile(seed, 2, tight=True)
        cap = max(1 << 20, max(op.param_bytes for op in graph.ops.values())) * 2
        profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
        problem = Problem(graph, profile, Options(training=True, streaming=False))
        if count_candidates(problem) > 4096:
            continue
        best, placement = optimum(problem)
        if placement is not None:
            found |= {"state"} if placement.state else set()
            found |= {"recompute"} if placement.recompute else set()
    assert found == {"state", "recompute"}
