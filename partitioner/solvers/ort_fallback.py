"""The ``ort-fallback`` baseline: onnxruntime's own placement of a model over execution providers.

In: a :class:`~partitioner.solvers.problem.Problem`. Out: a
:class:`~partitioner.solvers.problem.Solution` named ``ort-fallback``.

onnxruntime asks the execution providers, in the order the user lists them, which nodes they can
run (``GetCapability``); each claims every node it supports among those still unclaimed, and the
CPU provider takes the rest. It inserts a ``MemcpyToHost`` / ``MemcpyFromHost`` at every boundary,
has no cost model (a node goes to the first provider that supports it, however small) and no
memory model (a model that does not fit the GPU fails when the session is created).

Here the providers are the profile's accelerators in profile order (the main GPU first), then the
host CPU; "supports" is the device's ``supported_ops`` (and pins, which hetpart honours in every
baseline). A copy at each boundary is what :func:`~partitioner.solvers.problem.evaluate` charges
for every tensor read on another device; memory is not checked while placing, so the evaluation
marks the placement as not fitting when it does not. Where the first accelerator runs every op,
this is the placement of ``single:<that accelerator>``: what an onnxruntime user with
``providers=["CUDAExecutionProvider", "CPUExecutionProvider"]`` gets.
"""

from __future__ import annotations

import time

from partitioner.solvers.problem import Placement, Problem, Solution, Status, accelerator_devices


def solve_ort_fallback(problem: Problem) -> Solution:
    """Every node on the first accelerator (profile order) that supports it, else on the host CPU.

    Example:
        >>> sol = solve_ort_fallback(problem)                 # doctest: +SKIP
        >>> sol.solver, sol.status.value
        ('ort-fallback', 'heuristic')
    """
    start = time.perf_counter()
    providers = (*accelerator_devices(problem.devices), problem.host)
    placed = {}
    for node in problem.nodes:
        allowed = problem.allowed[node]
        placed[node] = next((d for d in providers if d in allowed), allowed[0])
    on_host = sum(1 for d in placed.values() if d == problem.host)
    note = f"{on_host} of {len(placed)} nodes fall back to {problem.host}" if on_host and len(providers) > 1 else ""
    return Solution(solver="ort-fallback", placement=Placement(device=placed), status=Status.HEURISTIC,
                    seconds=time.perf_counter() - start, note=note)


__all__ = ["solve_ort_fallback"]
