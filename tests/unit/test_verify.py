"""verify_placement recomputes what it checks: an evaluation that drops a transfer, sends one
nowhere needed, under-reports memory or calls an over-cap placement feasible is refused."""

from __future__ import annotations

import dataclasses

import pytest

from models.synthetic import random_dag, random_profile
from partitioner.errors import VerificationError
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.verify import verify_placement


@pytest.fixture(scope="module")
def split():
    """A random DAG placed alternately on two devices: several activation transfers."""
    graph = random_dag(7, 10)
    problem = Problem(graph, random_profile(7, 2), Options(objective=Objective.LATENCY, streaming=False))
    devices = problem.device_names
    placement = Placement({n: devices[i % 2] for i, n in enumerate(problem.nodes)})
    evaluation = evaluate(problem, placement)
    assert [t for t in evaluation.transfers if t.kind == "activation"]
    verify_placement(problem, placement, evaluation)  # the honest evaluation passes
    return problem, placement, evaluation


def test_a_dropped_transfer_is_named(split) -> None:
    problem, placement, ev = split
    dropped = next(t for t in ev.transfers if t.kind == "activation")
    kept = tuple(t for t in ev.transfers if t is not dropped)
    with pytest.raises(VerificationError, match=f"tensor {dropped.tensor} is read on {dropped.dst} but never sent"):
        verify_placement(problem, placement, dataclasses.replace(ev, transfers=kept))


def test_a_transfer_twice_and_one_nowhere_needed_are_named(split) -> None:
    problem, placement, ev = split
    first = next(t for t in ev.transfers if t.kind == "activation")
    with pytest.raises(VerificationError, match="sent to the same device twice"):
        verify_placement(problem, placement, dataclasses.replace(ev, transfers=(*ev.transfers, first)))
    stray = dataclasses.replace(first, dst=first.src)
    with pytest.raises(VerificationError, match="where no consumer reads it"):
        verify_placement(problem, placement, dataclasses.replace(ev, transfers=(*ev.transfers, stray)))


def test_memory_below_the_parameters_or_over_the_cap_while_feasible_is_named(split) -> None:
    problem, placement, ev = split
    d = max(problem.device_names, key=lambda name: ev.memory[name])
    with pytest.raises(VerificationError, match=f"memory on {d} is reported as 0 bytes"):
        verify_placement(problem, placement, dataclasses.replace(ev, memory={**ev.memory, d: 0}))
    over = {**ev.memory, d: problem.capacity[d] + 1}
    with pytest.raises(VerificationError, match=f"{d} holds [\\d,]+ bytes, over its capacity"):
        verify_placement(problem, placement, dataclasses.replace(ev, memory=over))
