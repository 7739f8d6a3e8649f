"""The ``openvino-pipeline`` baseline: OpenVINO HETERO's pipeline-parallel split by weight bytes.

In: a :class:`~partitioner.solvers.problem.Problem`. Out: a
:class:`~partitioner.solvers.problem.Solution` named ``openvino-pipeline``.

OpenVINO's HETERO device, with ``MODEL_DISTRIBUTION_POLICY`` = ``PIPELINE_PARALLEL``, splits a
model into consecutive stages by weight size alone:

* the model's size is taken as its weight bytes × :data:`SIZE_FACTOR` (1.2); activations are not
  counted and time is not modelled;
* the devices are the accelerators in order (profile order here), then the CPU, whose memory counts
  as unlimited. When the model fits the accelerators, each takes a share proportional to its
  memory; when it does not, each takes its memory's worth and the CPU the rest;
* walking the nodes in topological order and summing their weights × 1.2, the stage of device
  ``i`` ends where the running sum reaches the shares of devices ``0..i``: among the positions whose
  sum lies within :data:`TOLERANCE` (0.95–1.05×) of that target, at the one where the fewest output
  elements cross (tensors made at or before it and read after it, graph inputs included). Where no
  position falls in that range (one node's weights jump over it), the stage ends at the last
  position not above 1.05× the target;
* a node its stage's device cannot run goes to the host CPU (OpenVINO falls back the same way).

The evaluation (:func:`~partitioner.solvers.problem.evaluate`) then costs the stages and marks the
placement as not fitting when activations push a device over its cap.
"""

from __future__ import annotations

import math
import time

from partitioner.solvers.problem import Placement, Problem, Solution, Status, accelerator_devices

SIZE_FACTOR = 1.2
TOLERANCE = (0.95, 1.05)


def solve_openvino_pipeline(problem: Problem) -> Solution:
    """Consecutive stages by weight bytes over the accelerators, then the CPU (module docstring).

    Example:
        >>> sol = solve_openvino_pipeline(problem)            # doctest: +SKIP
        >>> sorted(set(sol.placement.device.values()))
        ['cpu', 'cuda:0']
    """
    start = time.perf_counter()
    nodes = problem.nodes
    accel = list(accelerator_devices(problem.devices))
    weights = [SIZE_FACTOR * problem.param_bytes[n] for n in nodes]
    total = sum(weights)
    room = [problem.capacity[d] for d in accel]
    if accel and total <= sum(room):
        shares = [total * r / sum(room) for r in room]
        stages = accel
    else:
        shares = [*room, max(0.0, total - sum(room))]
        stages = [*accel, problem.host]
    cumulative = [0.0] * len(nodes)
    running = 0.0
    for k, w in enumerate(weights):
        running += w
        cumulative[k] = running
    crossing = _crossing_elements(problem)
    cuts, previous, target = [], -1, 0.0
    for share in shares[:-1]:
        target += share
        cut = _cut(cumulative, crossing, previous, target)
        cuts.append(cut)
        previous = cut
    placed, stage = {}, 0
    for k, node in enumerate(nodes):
        while stage < len(cuts) and k > cuts[stage]:
            stage += 1
        device = stages[stage]
        allowed = problem.allowed[node]
        placed[node] = device if device in allowed else (problem.host if problem.host in allowed else allowed[0])
    used = [d for d in stages if d in placed.values()]
    return Solution(solver="openvino-pipeline", placement=Placement(device=placed), status=Status.HEURISTIC,
                    seconds=time.perf_counter() - start,
                    note=f"stages {' -> '.join(used)} by weight bytes x {SIZE_FACTOR}")


def _cut(cumulative: list[float], crossing: list[int], previous: int, target: float) -> int:
    """The last node index of a stage whose weights should reach ``target`` (see the docstring)."""
    low, high = TOLERANCE[0] * target, TOLERANCE[1] * target
    candidates = [k for k in range(previous + 1, len(cumulative)) if low <= cumulative[k] <= high]
    if candidates:
        return min(candidates, key=lambda k: (crossing[k], k))
    below = [k for k in range(previous + 1, len(cumulative)) if cumulative[k] <= high]
    return below[-1] if below else previous


def _crossing_elements(problem: Problem) -> list[int]:
    """Elements of the tensors that cross a cut placed after each node (topological positions)."""
    position = {n: k for k, n in enumerate(problem.nodes)}
    diff = [0] * (len(problem.nodes) + 1)
    shapes = problem.original.tensors
    for t in problem.tensors:
        first = position[t.producer] if t.producer is not None else -1
        last = max(position[c] for c in t.consumers)
        if last <= first:
            continue
        elements = math.prod(d for d in shapes[t.name].shape if d > 0) if t.name in shapes else t.bytes
        diff[max(first, 0)] += elements   # cuts after positions first .. last-1 see it cross
        diff[last] -= elements
    out, running = [], 0
    for k in range(len(problem.nodes)):
        running += diff[k]
        out.append(running)
    return out


__all__ = ["SIZE_FACTOR", "TOLERANCE", "solve_openvino_pipeline"]
