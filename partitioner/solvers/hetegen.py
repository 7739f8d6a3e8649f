"""The HeteGen baseline: every linear split between the accelerator and the host CPU by one rule.

In: a :class:`~partitioner.solvers.problem.Problem` with splits offered (``Options.splits``). Out: a
:class:`~partitioner.solvers.problem.Solution` named ``hetegen``, costed like every plan by
:func:`~partitioner.solvers.problem.evaluate`.

HeteGen (MLSys'24) runs each linear layer on the CPU and the GPU at once, each with a part of the
weight, at the profiled ratio that makes the two parts end together (``T_gpu = T_cpu + T_comm``); the
rest of the model runs on the GPU. Here that is: every node computes on the fastest accelerator (its
fallback the host, as :func:`~partitioner.solvers.single.solve_single` does), and every node that can
take a split over (that accelerator, the host) takes it by output columns at
:func:`~partitioner.solvers.split_offers.balanced_share` (HeteGen's ratio on hetpart's prices). Shards stay
resident: hetpart does not stream a split's shard, so where HeteGen would copy the GPU part's
weights in from host memory this baseline needs them to fit (``evaluate`` says when they do not).
The ILP starts from it and offers the same split, so a plan is never slower than it.
"""

from __future__ import annotations

import time

from partitioner.solvers.problem import Placement, Problem, Solution, Status, accelerator_devices
from partitioner.solvers.single import solve_single
from partitioner.solvers.split_offers import balanced_share

#: The name plans and benches list it under.
NAME = "hetegen"


def solve_hetegen(problem: Problem) -> Solution:
    """HeteGen's placement of ``problem`` (see the module docstring).

    Returns an empty, infeasible solution (with a note) when the problem offers no splits or has no
    accelerator.

    Example:
        >>> sol = solve_hetegen(problem)                                  # doctest: +SKIP
        >>> {sp.axis for sp in sol.placement.split.values()}
        {'cols'}
    """
    start = time.perf_counter()
    accelerators = list(accelerator_devices(problem.devices))
    if not problem.split_choices or not accelerators:
        why = "no op may be split (plan with splits=True)" if accelerators else "no accelerator to share with the host"
        return Solution(NAME, Placement({}), Status.INFEASIBLE, None, time.perf_counter() - start, why)
    gpu = min(accelerators, key=lambda d: sum(problem.compute[n].get(d, float("inf")) for n in problem.nodes))
    device = dict(solve_single(problem, gpu).placement.device)
    split = {}
    for node, choices in problem.split_choices.items():
        if device[node] != gpu or not any(sp.axis == "cols" for sp in choices):  # HeteGen splits linears by columns
            continue
        share = balanced_share(problem, node, (gpu, problem.host), "cols")
        chosen = [sp for sp in choices if sp.axis == "cols" and sp.devices == (gpu, problem.host)
                  and sp.fractions[0] == share]
        if chosen:
            split[node] = chosen[0]
    note = f"{len(split)} linears split between {gpu} and {problem.host} at HeteGen's balanced ratio"
    return Solution(NAME, Placement(device, split=split), Status.HEURISTIC, None, time.perf_counter() - start, note)
