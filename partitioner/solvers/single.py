"""The single-device baseline: every node on one device, with the host CPU as fallback.

In: a :class:`~partitioner.solvers.problem.Problem` and a device name. Out: a
:class:`~partitioner.solvers.problem.Solution` named ``single:<device>`` whose placement puts
every node on that device, except the nodes the device cannot run, which fall back to the host
CPU the way ONNX Runtime falls back from an execution provider to its CPU provider. Nothing is
streamed; the issue order is the topological order.
"""

from __future__ import annotations

import time

from partitioner.errors import HetpartError
from partitioner.solvers.problem import Placement, Problem, Solution, Status


def solve_single(problem: Problem, device: str) -> Solution:
    """Place every node of ``problem`` on ``device``; nodes it cannot run go to the host CPU.

    A node pinned to another device, or one neither ``device`` nor the host can run, goes to
    the first device allowed for it (profile order). Every fallback is counted in the
    solution's ``note``.

    Parameters:
        problem: the placement problem.
        device: a device name of ``problem.devices`` (``"cuda:0"``, ``"cpu"``, ...).

    Returns:
        A heuristic :class:`Solution` named ``single:<device>``.

    Raises:
        HetpartError: ``device`` is not a device of the problem's profile.

    Example:
        >>> sol = solve_single(problem, "cuda:0")            # doctest: +SKIP
        >>> set(sol.placement.device.values())
        {'cuda:0'}
    """
    start = time.perf_counter()
    if device not in problem.device_names:
        raise HetpartError(
            f"single-device baseline: no device {device!r} in profile {problem.devices.name!r}; "
            f"its devices are: {', '.join(problem.device_names)}"
        )
    placed = {node: _device_or_fallback(problem, node, device) for node in problem.nodes}
    fallen = [node for node in problem.nodes if placed[node] != device]
    return Solution(
        solver=f"single:{device}",
        placement=Placement(device=placed),
        status=Status.HEURISTIC,
        seconds=time.perf_counter() - start,
        note=_fallback_note(problem, device, fallen, placed),
    )


def _device_or_fallback(problem: Problem, node: str, device: str) -> str:
    """``device`` when it may run ``node``, else the host, else the first allowed device."""
    allowed = problem.allowed[node]
    if device in allowed:
        return device
    if problem.host in allowed:
        return problem.host
    return allowed[0]


def _fallback_note(problem: Problem, device: str, fallen: list[str], placed: dict[str, str]) -> str:
    """One sentence naming how many nodes left ``device``, where they went and a few examples."""
    if not fallen:
        return ""
    targets = sorted({placed[n] for n in fallen})
    examples = ", ".join(f"{n} ({problem.original.ops[problem.members[n][0]].kind})" for n in fallen[:3])
    return (
        f"{len(fallen)} of {len(problem.nodes)} nodes cannot run on {device} and fall back to "
        f"{', '.join(targets)}, e.g. {examples}"
    )
