"""Pipeline splits users get today, costed with hetpart's pipeline semantics.

In: a :class:`~partitioner.solvers.problem.Problem` with a pipeline spec. Out: a
:class:`~partitioner.solvers.problem.Solution` per baseline: the nodes, in topological order, cut
into one contiguous stage per pipeline device. The pipeline devices are what a user of these tools
gives ranks to: the accelerators of the cluster (every CPU device when there are none), in profile
order; the stage count is the spec's, else as many as there are such devices (1F1B: at most ``M``).
None of them looks at device speed or memory; all are evaluated by
:func:`~partitioner.solvers.pipeline.pipeline_cost`.

=========================  ======================================================================
baseline                   split
=========================  ======================================================================
``pippy-equal-size``       PiPPy's default ``split_into_equal_size(n)``: walk the nodes, cut when
                           the running parameter size reaches ``total / n``
``deepspeed-parameters``   DeepSpeed's ``partition_method="parameters"``: contiguous parts whose
                           largest parameter count is as small as possible
``flop-balanced``          the FLOP-balancing dynamic program of the PyTorch proposal: contiguous
                           parts whose largest FLOP count is as small as possible, every device
                           assumed identical (one throughput number)
=========================  ======================================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from cost_models.profiles import DeviceKind
from partitioner.errors import SolverUnavailable
from partitioner.solvers.problem import Placement, Problem, Solution, Status

__all__ = ["PIPELINE_BASELINES", "run_pipeline_baseline", "pipeline_devices"]

PIPELINE_BASELINES: tuple[str, ...] = ("pippy-equal-size", "deepspeed-parameters", "flop-balanced")


def pipeline_devices(problem: Problem) -> tuple[str, ...]:
    """The devices the baselines put stages on: the accelerators, else the CPUs, in profile order."""
    accelerators = tuple(d.name for d in problem.devices if d.kind is not DeviceKind.CPU)
    devices = accelerators or problem.device_names
    spec = problem.options.pipeline
    return devices[: spec.max_stages(len(devices))] if spec is not None else devices


def run_pipeline_baseline(name: str, problem: Problem) -> Solution:
    """Split ``problem`` the way baseline ``name`` does (see the module docstring).

    Example:
        >>> sol = run_pipeline_baseline("deepspeed-parameters", problem)   # doctest: +SKIP
        >>> sorted(set(sol.placement.device.values()))
        ['host0/cuda:0', 'host1/cuda:0']
    """
    splits: dict[str, Callable[[Sequence[float], int], list[int]]] = {
        "pippy-equal-size": _running_threshold, "deepspeed-parameters": _min_max, "flop-balanced": _min_max,
    }
    if name not in splits:
        raise SolverUnavailable(f"unknown pipeline baseline {name!r}: use one of {', '.join(PIPELINE_BASELINES)}")
    start = time.perf_counter()
    devices = pipeline_devices(problem)
    nodes = problem.nodes
    if name == "flop-balanced":
        weights = [float(sum(problem.original.ops[m].flops for m in problem.members[n])) for n in nodes]
    else:
        weights = [float(problem.param_bytes[n]) for n in nodes]
    parts = min(len(devices), len(nodes))
    cuts = splits[name](weights, parts)
    bounds = [0, *cuts, len(nodes)]
    device = {nodes[v]: devices[s] for s in range(parts) for v in range(bounds[s], bounds[s + 1])}
    return Solution(name, Placement(device), Status.HEURISTIC, None, time.perf_counter() - start,
                    f"{parts} stages on {', '.join(devices[:parts])}")


def _running_threshold(weights: Sequence[float], parts: int) -> list[int]:
    """Cut after the node at which the running total reaches ``total / parts`` (PiPPy), keeping at
    least one node for every remaining part."""
    total = sum(weights)
    share = total / parts if parts else total
    cuts: list[int] = []
    running = 0.0
    n = len(weights)
    for i, w in enumerate(weights):
        running += w
        remaining = parts - 1 - len(cuts)
        if remaining and (running >= share or n - (i + 1) == remaining) and i + 1 < n:
            cuts.append(i + 1)
            running = 0.0
    return cuts


def _min_max(weights: Sequence[float], parts: int) -> list[int]:
    """Cut points of the contiguous split into ``parts`` non-empty parts whose heaviest part is
    lightest (ties: the later cut, so leading zero-weight nodes join the first part)."""
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    back = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for i in range(p, n - (parts - p) + 1):
            for k in range(p - 1, i):
                value = max(best[p - 1][k], prefix[i] - prefix[k])
                if value <= best[p][i]:
                    best[p][i], back[p][i] = value, k
    cuts, i = [], n
    for p in range(parts, 0, -1):
        i = back[p][i]
        cuts.append(i)
    return sorted(c for c in cuts if 0 < c < n)
