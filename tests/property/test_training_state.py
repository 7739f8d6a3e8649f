"""The brute-force oracle certifies the training-state choices: optimizer state with its weights, on
the host (stepped there) or on the host streamed to the accelerator for its step, recompute, saved
activations held on the host, streaming in both passes, host steps and streamed states beside
backward.

Small random training problems (latency and throughput, offload and recompute offered); the oracle
enumerates every device, stream, state and recompute choice and evaluates each on the original
graph. The ILP (HiGHS, gap 0) must reach that optimum, its bound must not exceed it, and its own
objective must be what ``evaluate`` says of its placement.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cost_models.profiles import load_profile_text
from models.synthetic import random_dag, random_profile
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
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
                                              delayed_update=draw(st.booleans()), save_on_host=draw(st.booleans())))
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
        problem = Problem(graph, profile, Options(training=True, streaming=False, save_on_host=False))
        if count_candidates(problem) > 4096:
            continue
        best, placement = optimum(problem)
        if placement is not None:
            found |= {"state"} if placement.state else set()
            found |= {"recompute"} if placement.recompute else set()
    assert found == {"state", "recompute"}


#: A slow host (20 GB/s: its Adam step takes 0.35 s per GB of parameters) beside a fast link (55 GB/s:
#: Adam's two moments in and out take 0.073 s per GB): where the cap allows, stepping host-held state
#: on the GPU wins.
SLOW_HOST = """
[devices.cpu]
kind = "cpu"
memory = "64GiB"
peak_flops = { float32 = 1e12 }
mem_bandwidth = "20GB/s"
launch_overhead = "2us"

[devices."cuda:0"]
kind = "gpu"
memory = "16GiB"
peak_flops = { float32 = 5e13 }
mem_bandwidth = "2000GB/s"
launch_overhead = "10us"

[[links]]
between = ["cpu", "cuda:0"]
bandwidth = "55GB/s"
latency = "10us"
"""


def _slow_host_problem(seed: int, cap_factor: float, objective: Objective = Objective.LATENCY) -> Problem:
    graph = random_dag(seed, 5, param_prob=1.0, param_sizes=(1 << 24,))
    params = sum(p.nbytes for p in graph.params.values())
    profile = load_profile_text(SLOW_HOST, "slow-host").with_memory({"cuda:0": int(params * cap_factor)})
    return Problem(graph, profile, Options(objective=objective, training=True, streaming=False, recompute=False,
                                           save_on_host=False))


@pytest.mark.parametrize(("seed", "cap_factor", "objective"), [
    (1, 2.5, Objective.LATENCY),   # two streamed states and one on the host
    (5, 3.0, Objective.LATENCY),   # four streamed states
    (22, 3.0, Objective.LATENCY),  # two streamed, one on the host
    (1, 2.5, Objective.THROUGHPUT),
])
def test_the_ilp_reaches_the_oracle_where_streamed_state_wins(seed: int, cap_factor: float, objective: Objective) -> None:
    problem = _slow_host_problem(seed, cap_factor, objective)
    best, placement = optimum(problem)
    if objective is Objective.LATENCY:
        assert placement is not None and placement.streamed_state  # the choice is what the optimum uses
    _certified(problem, best)


def _certified(problem: Problem, best: float) -> None:
    """The ILP at gap 0 reaches the oracle's optimum ``best``, says what ``evaluate`` says of its
    placement, and its bound and the lower bounds are not above it."""
    solution = solve_ilp(problem, solver="highs", gap=0.0, time_limit=30)
    ev = evaluate(problem, solution.placement)
    assert ev.feasible
    assert ev.total_s == pytest.approx(best, rel=TOLERANCE)
    assert solution.objective == pytest.approx(ev.total_s, rel=TOLERANCE)
    assert solution.bound is None or solution.bound <= best * (1 + TOLERANCE) + 1e-12
    assert physical_lower_bound(problem) <= best * (1 + TOLERANCE) + 1e-12
    assert memory_aware_lower_bound(problem) <= best * (1 + TOLERANCE) + 1e-12


def test_a_streamed_state_is_priced_as_its_copies_step_and_buffer() -> None:
    """One node's state streamed: the host holds the state, the GPU the weights, gradient and one
    buffer of the state; the link carries the state both ways; the step waits for it."""
    problem = _slow_host_problem(5, 3.0)
    node = max(problem.state_streamable, key=problem.index.__getitem__)
    gpu = {n: "cuda:0" for n in problem.nodes}
    resident = evaluate(problem, Placement(gpu))
    streamed = evaluate(problem, Placement(gpu, streamed_state=frozenset({node})))
    state = problem.state_mem[node]
    assert state == 2 * problem.trainable[node]  # Adam: two moments
    assert streamed.memory["cpu"] - resident.memory["cpu"] == state
    assert streamed.memory["cuda:0"] - resident.memory["cuda:0"] == -state + max(problem.state_parts[node])
    copies = [t for t in streamed.transfers if t.kind == "state"]
    assert {(t.src, t.dst, t.bytes) for t in copies} == {("cpu", "cuda:0", state), ("cuda:0", "cpu", state)}
    assert streamed.per_link_s["cpu<->cuda:0"] - resident.per_link_s["cpu<->cuda:0"] == pytest.approx(
        sum(t.seconds for t in copies))
    assert streamed.total_s >= resident.total_s  # the same step with the state coming and going
    bad = evaluate(problem, Placement(gpu, state={node: "cpu"}, streamed_state=frozenset({node})))
    assert any("streams its optimizer state" in v for v in bad.violations)


def _saved_problem(seed: int, recompute: bool, objective: Objective = Objective.LATENCY) -> Problem:
    """Five ops of 1 MiB weights on the slow host's GPU, capped at the parameters, the largest working
    set and half the saved activations: the rest of the activations must go somewhere."""
    graph = random_dag(seed, 5, param_prob=0.5, param_sizes=(1 << 20,))
    profile = load_profile_text(SLOW_HOST, "slow-host")
    options = Options(objective=objective, training=True, streaming=False, offload=False, recompute=recompute,
                      save_on_host=True)
    free = Problem(graph, profile, options)
    cap = sum(free.param_mem.values()) + max(free.work_mem.values()) + sum(free.saved.values()) // 2
    return Problem(graph, profile.with_memory({"cuda:0": cap}), options)


@pytest.mark.parametrize(("seed", "recompute", "objective"), [
    (10, False, Objective.LATENCY),   # three ops' activations on the host
    (12, False, Objective.LATENCY),
    (22, False, Objective.LATENCY),   # four
    (18, True, Objective.LATENCY),    # two on the host beside one recompute
    (12, False, Objective.THROUGHPUT),
])
def test_the_ilp_reaches_the_oracle_where_activations_on_the_host_win(
        seed: int, recompute: bool, objective: Objective) -> None:
    problem = _saved_problem(seed, recompute, objective)
    best, placement = optimum(problem)
    assert placement is not None and placement.saved_on_host  # the choice is what the optimum uses
    assert not placement.saved_on_host & placement.recompute
    _certified(problem, best)
    without = Problem(problem.original, problem.devices, dataclasses.replace(problem.options, save_on_host=False))
    assert optimum(without)[0] > best * (1 + 1e-3)  # it pays: without it the optimum is slower


def test_activations_on_the_host_are_priced_as_their_copies_and_buffer() -> None:
    """Two ops' saved activations on the host: the host holds them, the GPU one buffer of the
    larger; the link carries each out and back; the GPU pays each copy's issue latency."""
    problem = _saved_problem(22, recompute=True)
    a, b = sorted(problem.saved_hostable, key=problem.saved.__getitem__)[-2:]
    gpu = {n: "cuda:0" for n in problem.nodes}
    kept = evaluate(problem, Placement(gpu))
    held = evaluate(problem, Placement(gpu, saved_on_host=frozenset({a, b})))
    both = problem.saved[a] + problem.saved[b]
    assert held.memory["cpu"] - kept.memory["cpu"] == both
    assert held.memory["cuda:0"] - kept.memory["cuda:0"] == -both + max(problem.saved[a], problem.saved[b])
    copies = [t for t in held.transfers if t.kind == "saved"]
    assert sorted((t.tensor, t.src, t.dst, t.bytes) for t in copies) == sorted(
        [(a, "cuda:0", "cpu", problem.saved[a]), (a, "cpu", "cuda:0", problem.saved[a]),
         (b, "cuda:0", "cpu", problem.saved[b]), (b, "cpu", "cuda:0", problem.saved[b])])
    link = "cpu<->cuda:0"
    assert held.per_link_s[link] - kept.per_link_s[link] == pytest.approx(sum(t.seconds for t in copies))
    issue = 4 * 10e-6  # four copies, each the link's 10 us latency
    assert held.per_device_s["cuda:0"] - kept.per_device_s["cuda:0"] == pytest.approx(issue)
    assert held.critical_path_s - kept.critical_path_s == pytest.approx(issue)  # the copies themselves overlap
    bad = evaluate(problem, Placement(gpu, recompute=frozenset({a}), saved_on_host=frozenset({a})))
    assert any(f"op {a} both recomputes" in v for v in bad.violations)
    on_host = evaluate(problem, Placement({n: "cpu" for n in problem.nodes}, saved_on_host=frozenset({a})))
    assert any("where it computes" in v for v in on_host.violations)
    off = Problem(problem.original, problem.devices, dataclasses.replace(problem.options, save_on_host=False))
    refused = evaluate(off, Placement(gpu, saved_on_host=frozenset({a})))
    assert any("save_on_host allowed" in v for v in refused.violations)
