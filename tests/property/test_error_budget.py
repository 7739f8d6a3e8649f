"""The accuracy budget in the certificate: with ``precision.max_error`` and measured per-weight
errors, the ILP's (device, dtype) choice is within gap 0 of brute force over every placement that
keeps the estimated error within the budget (``evaluate`` refuses the others), and the budget
really binds on some instances (it changes the optimum)."""

from __future__ import annotations

import dataclasses
import random

from partitioner.solvers.packing_error import estimated_error
from partitioner.solvers.problem import Problem, node_dtypes
from tests.property.oracle import optimum
from tests.property.test_certificates import _packed_instance, check


def _budgeted(problem: Problem, seed: int, share: float) -> Problem:
    """``problem`` with random measured errors per weight (int4 worse than int8) and a budget of
    ``share`` of the unbudgeted optimum's estimated error."""
    rng = random.Random(seed)
    errors = {}
    for op in problem.quantizable.values():
        e8 = rng.uniform(0.002, 0.02)
        errors[op] = {"int8": e8, "int4": e8 * rng.uniform(3, 8)}
    precision = dataclasses.replace(problem.precision, weight_errors=errors, max_error=1e9)
    free = Problem(problem.graph, problem.devices, dataclasses.replace(problem.options, precision=precision))
    _, best = optimum(free)
    if best is None:
        return free
    budget = max(share * estimated_error(free, node_dtypes(free, best)), 1e-4)
    precision = dataclasses.replace(precision, max_error=budget)
    return Problem(problem.graph, problem.devices, dataclasses.replace(problem.options, precision=precision))


def test_error_budget_keeps_the_certificate_and_binds() -> None:
    binding = checked = 0
    for seed in range(60):
        problem = _packed_instance(seed)
        if problem is None:
            continue
        free_best, free_placement = optimum(_budgeted(problem, seed, 1e9))
        for share in (0.5, 0.2):
            budgeted = _budgeted(problem, seed, share)
            info = {"objective": "latency", "pipeline": False, "streaming": True, "training": False, "tied": False,
                    "coarsened": False, "pinned": False, "pinned producer, several consumers": False,
                    "nodes": len(budgeted.nodes), "candidates": 0}
            failures = check(budgeted, info, "highs", False)
            assert not failures, (seed, share, failures)
            best, placement = optimum(budgeted)
            if placement is not None:
                error = estimated_error(budgeted, node_dtypes(budgeted, placement))
                assert error <= budgeted.precision.max_error * (1 + 1e-9)
            checked += 1
            binding += best > free_best * (1 + 1e-9)
        if binding >= 2 and checked >= 6:
            break
    assert checked >= 4 and binding >= 1, (checked, binding)
