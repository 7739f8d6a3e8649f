"""Interchangeable streamed weights: the ``stream_order`` rows keep the optimum and a canonical start.

Nodes with the same weights (bytes, stream copies) on one accelerator are interchangeable as to
which of them streams: the formulation orders them (``Formulation._stream_classes``), the warm
start is renamed to obey the order (``Formulation.canonical``), and ``Milp.without_ordering``
frees the rows for a search that may use any of the equal-cost placements.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cost_models.profiles import load_profile
from partitioner import from_module
from partitioner.solvers.formulation import Formulation, Units
from partitioner.solvers.highs import run_highs
from partitioner.solvers.ilp import solve_ilp
from partitioner.solvers.problem import Options, Placement, Problem, evaluate


class Tower(nn.Module):
    """Six identical linear layers: their weights are interchangeable when streamed."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _problem() -> Problem:
    graph = from_module(Tower(), (torch.randn(1024, 512),), name="tower")
    profile = load_profile("cpu-gpu-npu")
    cap = graph.total_param_bytes() * 3 // 2  # beside the activations: weights of three layers
    return Problem(graph, profile.with_memory({"cuda:0": cap, "npu:0": cap // 8}), Options())


def _optimum(f: Formulation, *, ordered: bool) -> float:
    milp = f.milp if ordered else f.milp.without_ordering()
    run = run_highs(milp, time_limit=60, gap=0.0)
    assert run.state == "optimal"
    return run.objective


def test_identical_linears_form_a_class_and_the_rows_keep_the_optimum() -> None:
    problem = _problem()
    f = Formulation(problem, Units())
    linears = [n for n in problem.nodes if problem.param_bytes[n] > 0]
    assert ("cuda:0", linears) in f.stream_classes
    assert len(f.milp.ordering_rows) >= len(linears) - 1
    assert _optimum(f, ordered=True) == pytest.approx(_optimum(f, ordered=False), rel=1e-9)
    free = f.milp.without_ordering()
    assert free.ordering_rows == [] and free.num_rows == f.milp.num_rows
    assert all(free.row_lower[i] == -float("inf") and free.row_upper[i] == float("inf") for i in f.milp.ordering_rows)


def test_a_start_streaming_other_members_is_renamed_to_obey_the_rows_at_equal_cost() -> None:
    problem = _problem()
    f = Formulation(problem, Units())
    linears = [n for n in problem.nodes if problem.param_bytes[n] > 0]
    device = {n: "cuda:0" for n in problem.nodes}
    first_four = Placement(device, {n: problem.host for n in linears[:4]})  # the rows want the last four streamed
    assert f.milp.without_ordering().violation(f.start_values(first_four)) <= 1e-9  # it fits ...
    assert f.milp.violation(f.start_values(first_four)) > 1e-6                      # ... but breaks the order
    renamed = f.canonical(first_four)
    assert set(renamed.streamed) == set(linears[-4:])
    assert f.milp.violation(f.start_values(renamed)) <= 1e-9
    assert evaluate(problem, renamed).total_s == evaluate(problem, first_four).total_s
    assert evaluate(problem, renamed).feasible == evaluate(problem, first_four).feasible


def test_solve_ilp_from_a_start_that_breaks_the_order_is_optimal_and_honest() -> None:
    problem = _problem()
    linears = [n for n in problem.nodes if problem.param_bytes[n] > 0]
    start = Placement({n: "cuda:0" for n in problem.nodes}, {n: problem.host for n in linears[:4]})
    sol = solve_ilp(problem, gap=0.0, warm_start=start)
    unordered = _optimum(Formulation(problem, Units(), symmetry=False), ordered=False)
    assert sol.status.value == "optimal"
    assert set(sol.placement.streamed) == set(linears[-3:])  # three stream, the last three of the class
    assert evaluate(problem, sol.placement).total_s <= evaluate(problem, start).total_s
    assert sol.bound <= evaluate(problem, sol.placement).total_s * (1 + 1e-9)
    assert sol.objective * Units().time == pytest.approx(unordered, rel=1e-6)
