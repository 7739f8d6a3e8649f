"""The training placements users get today when a model's training state does not fit the GPU.

In: a training :class:`~partitioner.solvers.problem.Problem`. Out: a heuristic
:class:`~partitioner.solvers.problem.Solution`, costed by
:func:`~partitioner.solvers.problem.evaluate` like every placement (with the dense updates these
systems make: the planner prices them on a problem without row-sparse updates).

Every op computes on the main accelerator (the host where the accelerator cannot run it), as in
all three systems; the rules differ in what leaves it (``../shared/research/training-offload.md``):

* ``zero-offload`` (DeepSpeed ZeRO-Offload, ZeRO-2 with ``offload_optimizer.device: cpu``): every
  trainable parameter's gradient, float32 master copy, optimizer state and step on the host; the
  weights stay on the GPU and the updated ones are copied back; the CPU step runs after backward
  (the delayed update of the paper is not in DeepSpeed);
* ``fsdp2-offload`` (FSDP2's ``CPUOffloadPolicy``): parameters, gradients and optimizer state on
  the host, each parameter copied to the GPU before use in forward and in backward, each gradient
  copied back, the optimizer step on the CPU after backward;
* ``torchao-offload`` (torchao's ``CPUOffloadOptimizer``): parameters of at least 4,096 elements
  (``minimal_size``) keep their state on the host, the others a GPU optimizer; gradients are
  copied out during backward, the CPU step runs after backward.
"""

from __future__ import annotations

from partitioner.errors import SolverUnavailable
from partitioner.solvers.problem import Placement, Problem, Solution, Status, accelerator_devices

__all__ = ["TRAINING_BASELINES", "run_training_baseline"]

TRAINING_BASELINES: tuple[str, ...] = ("zero-offload", "fsdp2-offload", "torchao-offload")
TORCHAO_MINIMAL_SIZE = 4096  # elements: smaller parameters keep a GPU optimizer


def run_training_baseline(name: str, problem: Problem) -> Solution:
    """The placement the offload system ``name`` makes of ``problem`` (see the module docstring)."""
    if name not in TRAINING_BASELINES:
        raise SolverUnavailable(f"unknown training baseline {name!r}: use one of {', '.join(TRAINING_BASELINES)}")
    p = problem
    accelerators = accelerator_devices(p.devices)
    if not p.options.training or not accelerators:
        return Solution(name, Placement({}), Status.HEURISTIC, note="needs a training problem with an accelerator")
    gpu = accelerators[0]
    device = {n: gpu if gpu in p.allowed[n] else p.allowed[n][0] for n in p.nodes}
    state: dict[str, str] = {}
    streamed: dict[str, str] = {}
    for n in p.nodes:
        if device[n] == p.host:
            continue
        if name == "fsdp2-offload":
            if p.param_bytes[n] > 0:
                streamed[n] = p.host
        elif p.trainable[n] > 0 and (name == "zero-offload" or _largest_elements(p, n) >= TORCHAO_MINIMAL_SIZE):
            state[n] = p.host
    placement = Placement(device, streamed=streamed, state=state, overlap=False)
    return Solution(name, placement, Status.HEURISTIC)


def _largest_elements(p: Problem, node: str) -> int:
    """Elements of the largest trainable parameter owned by ``node``'s ops."""
    graph = p.original
    sizes = [graph.params[name].nbytes // max(1, _itemsize(graph.params[name].dtype))
             for op in p.members[node] for name in graph.ops[op].owned_params if graph.params[name].trainable]
    return max(sizes, default=0)


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "int64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "bool": 1}.get(dtype, 4)
