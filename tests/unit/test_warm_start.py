"""What makes the ILP fast without changing its answer: local search (its incremental costs equal
``evaluate``'s), the coarser levels (nested, cost-preserving), and the memory-aware lower bound
(valid, and far above the physical one under tight caps)."""

from __future__ import annotations

import random

import pytest

import models
from cost_models.profiles import load_profile
from models.synthetic import random_dag, random_profile
from partitioner import from_module
from partitioner.solvers.bounds import memory_aware_lower_bound, physical_lower_bound
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.local_search import _State, improve, rank
from partitioner.solvers.multilevel import coarser_levels, expand, solve_multilevel
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate


def _problem(seed: int, objective: Objective, n_ops: int = 30, streaming: bool = True, training: bool = False,
             tied: float = 0.3) -> Problem:
    graph = random_dag(seed, n_ops, tied_prob=tied, param_sizes=(1 << 20, 1 << 22))
    profile = random_profile(seed, 3)
    cap = graph.total_param_bytes() // 3 + (8 << 20)
    profile = profile.with_memory({d.name: min(cap, d.memory) for d in profile.devices if d.name != "cpu"})
    return Problem(graph, profile, Options(objective=objective, streaming=streaming, training=training))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("objective", [Objective.LATENCY, Objective.THROUGHPUT])
def test_incremental_costs_equal_evaluate_after_every_move(seed: int, objective: Objective) -> None:
    problem = _problem(seed, objective, streaming=seed % 2 == 0, training=False)
    rng = random.Random(seed)
    state = _State(problem, solve_heft(problem).placement)
    for _ in range(40):
        node = rng.choice(problem.nodes)
        device = rng.choice(problem.allowed[node])
        stream = node in problem.streamable and device != problem.host and rng.random() < 0.5
        state.move(node, device, stream)
        ev = evaluate(problem, state.placement())
        assert state.objective() == pytest.approx(ev.total_s, rel=1e-9)
        over = sum(max(0, ev.memory[d] - ev.capacity[d]) for d in ev.memory)
        assert state.overflow() == over


@pytest.mark.parametrize("seed", range(4))
def test_moving_a_run_at_once_and_undoing_it_match_evaluate(seed: int) -> None:
    problem = _problem(seed, Objective.LATENCY if seed % 2 else Objective.THROUGHPUT, streaming=True)
    rng = random.Random(seed)
    start = solve_heft(problem).placement
    state = _State(problem, start)
    for _ in range(20):
        i = rng.randrange(len(problem.nodes))
        run = problem.nodes[i:i + rng.choice((2, 4, 8))]  # neighbours share tensors: each is recosted once
        moves = []
        for n in run:
            device = rng.choice(problem.allowed[n])
            moves.append((n, device, n in problem.streamable and device != problem.host and rng.random() < 0.5))
        before = state.placement()
        undo = state.move_all(moves)
        ev = evaluate(problem, state.placement())
        assert state.objective() == pytest.approx(ev.total_s, rel=1e-9)
        assert state.overflow() == sum(max(0, ev.memory[d] - ev.capacity[d]) for d in ev.memory)
        state.move_all(undo)
        assert state.placement().device == before.device and state.placement().streamed == before.streamed
        assert state.objective() == pytest.approx(evaluate(problem, before).total_s, rel=1e-9)
        if rng.random() < 0.5:
            state.move_all(moves)  # keep it: the next run starts elsewhere


@pytest.mark.parametrize("objective", list(Objective))
def test_local_search_never_makes_a_start_worse(objective: Objective) -> None:
    problem = _problem(3, objective, n_ops=20)
    start = solve_heft(problem)
    better = improve(problem, start)
    assert rank(problem, better.placement) <= rank(problem, start.placement)
    assert better.solver == "heft+local-search"


def test_levels_are_nested_and_expanding_keeps_the_cost() -> None:
    graph = random_dag(7, 300, layers=10, param_sizes=(1 << 20, 1 << 22))
    problem = Problem(graph, random_profile(7, 3), Options())
    levels = coarser_levels(problem)
    assert len(levels) >= 2
    assert [len(lv.nodes) for lv, _ in levels] == sorted(len(lv.nodes) for lv, _ in levels)
    chain = [lv for lv, _ in levels] + [problem]
    for (coarse, group_of), finer in zip(levels, chain[1:]):
        assert set(group_of) == set(finer.nodes) and set(group_of.values()) == set(coarse.nodes)
        for node, group in group_of.items():
            assert set(finer.members[node]) <= set(coarse.members[group])
        placement = solve_heft(coarse).placement
        placement = Placement(placement.device, {n: coarse.host for n in coarse.streamable
                                                 if placement.device[n] != coarse.host})
        assert evaluate(finer, expand(finer, group_of, placement)).total_s == pytest.approx(
            evaluate(coarse, placement).total_s, rel=1e-12)


def test_multilevel_answers_for_the_problem_itself() -> None:
    problem = _problem(11, Objective.LATENCY, n_ops=120)
    sol, warm = solve_multilevel(problem, solve_heft(problem), time_limit=60, gap=0.0)
    direct = solve_ilp(problem, time_limit=60, gap=0.0)
    assert sol.objective == pytest.approx(direct.objective, rel=1e-6)
    assert sol.bound <= evaluate(problem, sol.placement).total_s * (1 + 1e-9)
    assert warm is not None and evaluate(problem, warm.placement).feasible


def test_the_memory_aware_bound_holds_and_sees_the_caps() -> None:
    module, inputs = models.get("gpt", "small", device="meta")
    graph = from_module(module, inputs)
    profile = load_profile("2xh200-host")
    cap = int(0.4 * graph.total_param_bytes())
    problem = Problem(graph, profile.with_memory({"cuda:0": cap, "cuda:1": cap}), Options())
    bound = memory_aware_lower_bound(problem)
    best = solve_ilp(problem, time_limit=3, gap=0.05)  # any feasible placement bounds it from above
    assert physical_lower_bound(problem) <= bound <= evaluate(problem, best.placement).total_s
    assert bound > 1.5 * physical_lower_bound(problem)  # the physical bound ignores what must stream or stay behind


def test_a_training_problem_keeps_its_start_with_its_training_state() -> None:
    """Local search does not model where optimizer state lives (solvers/train_state.py): a training
    start, with its offloaded state, comes back as it was, never worse."""
    problem = _problem(5, Objective.LATENCY, streaming=True, training=True)
    start = solve_heft(problem)
    trainable = [n for n in problem.nodes if problem.trainable[n] and start.placement.device[n] != problem.host]
    placement = Placement(dict(start.placement.device), state={n: problem.host for n in trainable[:2]})
    better = improve(problem, type(start)("heft", placement, start.status))
    assert better.placement == placement
    assert rank(problem, better.placement) == rank(problem, placement)
