"""Cheap physical lower bounds on a problem's objective, printed beside every plan.

In: a :class:`~partitioner.solvers.problem.Problem`. Out: seconds no placement can beat,
whatever the solver: every node on its fastest allowed device with free transfers (for
``latency``: the sum; for ``makespan``: the longest path), and the total of that work spread
evenly over all devices (for ``throughput`` and ``makespan``); for pipeline stages, the work once
(the first micro-batch's trip) plus ``M - 1`` times its share per device. Streaming and memory
caps only add time, so they are ignored here.
"""

from __future__ import annotations

from partitioner.solvers.problem import Objective, Problem


def fastest(problem: Problem, node: str) -> float:
    """A node's time on its fastest allowed device, with its cheapest optimizer step."""
    compute = min(problem.compute[node].values())
    step = min(problem.opt_step[node].values()) if problem.options.training else 0.0
    return compute + step


def physical_lower_bound(problem: Problem) -> float:
    """Seconds that no placement of ``problem`` can beat.

    Example:
        >>> physical_lower_bound(problem) <= evaluate(problem, placement).total_s   # doctest: +SKIP
        True
    """
    best = {n: fastest(problem, n) for n in problem.nodes}
    total = sum(best.values())
    objective = problem.options.objective
    spec = problem.options.pipeline
    if spec is not None:  # every stage time <= the bottleneck, and they add up to at least the work
        compute = sum(min(problem.compute[n].values()) for n in problem.nodes)
        steps = sum(best.values()) - compute
        devices = len(problem.device_names)
        return compute * (1 + (spec.micro_batches - 1) / devices) + steps / devices
    if objective is Objective.LATENCY:
        return total
    spread = total / len(problem.device_names)
    if objective is Objective.THROUGHPUT:
        return max(spread, max(best.values(), default=0.0))
    finish: dict[str, float] = {}
    for n in problem.nodes:
        ready = max((finish[u] for u in problem.graph.dag.predecessors(n)), default=0.0)
        finish[n] = ready + best[n]
    return max(spread, max(finish.values(), default=0.0))
