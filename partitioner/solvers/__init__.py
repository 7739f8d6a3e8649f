"""Solvers: one interface, ``solve(problem) -> Solution``, many implementations.

The ILP (``ilp.py``, the default) and the baselines it is compared with and warm-started from:
``single:<device>`` (everything on one device), ``greedy`` (accelerate's ``infer_auto_device_map``
fill with ``dispatch_model``'s run-time semantics), ``sequential-fill`` (the same fill, computing
where placed), ``heft`` (list scheduling by upward rank); for ONNX graphs also ``ort-fallback``
(onnxruntime's provider order) and ``openvino-pipeline`` (OpenVINO HETERO's split by weight bytes);
for pipeline problems the splits users make today (``pipeline_baselines.py``) and the exact chain
dynamic program (``pipeline_dp.py``); with splits offered, ``hetegen`` (every linear split between
the accelerator and the host at HeteGen's balanced ratio, ``hetegen.py``) and, where a host has like
accelerators, ``megatron`` (every linear split evenly over them, column splits into row splits not
rejoined, ``megatron.py``); for training, the offload systems ``zero-offload``,
``fsdp2-offload`` and ``torchao-offload`` (``offload_baselines.py``).
All are costed by :func:`~partitioner.solvers.problem.evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence

from partitioner.errors import SolverUnavailable
from partitioner.solvers.greedy import solve_greedy, solve_sequential_fill
from partitioner.solvers.heft import solve_heft
from partitioner.solvers.hetegen import NAME as HETEGEN, solve_hetegen
from partitioner.solvers.megatron import NAME as MEGATRON, solve_megatron
from partitioner.solvers.offload_baselines import TRAINING_BASELINES, run_training_baseline
from partitioner.solvers.openvino_pipeline import solve_openvino_pipeline
from partitioner.solvers.ort_fallback import solve_ort_fallback
from partitioner.solvers.pipeline_baselines import PIPELINE_BASELINES, run_pipeline_baseline
from partitioner.solvers.problem import Problem, Solution
from partitioner.solvers.single import solve_single

#: Baselines besides ``single:<device>``, in the order plans list them.
BASELINE_NAMES: tuple[str, ...] = ("greedy", "sequential-fill", "heft")
#: Baselines of the placements ONNX users get today, listed after the others in ONNX plans.
ONNX_BASELINE_NAMES: tuple[str, ...] = ("ort-fallback", "openvino-pipeline")
#: Baselines of plans that offer splits (``Options.splits``), listed after the others.
SPLIT_BASELINE_NAMES: tuple[str, ...] = (HETEGEN, MEGATRON)


def run_baseline(name: str, problem: Problem, *, no_split: Sequence[str] = ()) -> Solution:
    """Run the baseline called ``name`` on ``problem``.

    Example:
        >>> run_baseline("single:cuda:0", problem).placement.device   # doctest: +SKIP
    """
    if name.startswith("single:"):
        return solve_single(problem, name.removeprefix("single:"))
    if name == "greedy":
        return solve_greedy(problem, no_split=no_split)
    if name == "sequential-fill":
        return solve_sequential_fill(problem, no_split=no_split)
    if name == "heft":
        return solve_heft(problem)
    if name in PIPELINE_BASELINES:
        return run_pipeline_baseline(name, problem)
    if name in TRAINING_BASELINES:
        return run_training_baseline(name, problem)
    if name == "ort-fallback":
        return solve_ort_fallback(problem)
    if name == "openvino-pipeline":
        return solve_openvino_pipeline(problem)
    if name == HETEGEN:
        return solve_hetegen(problem)
    if name == MEGATRON:
        return solve_megatron(problem)
    raise SolverUnavailable(
        f"unknown solver {name!r}: use 'auto', 'highs', 'cbc', "
        f"{', '.join(repr(b) for b in BASELINE_NAMES + ONNX_BASELINE_NAMES + SPLIT_BASELINE_NAMES)} "
        f"or 'single:<device>'"
    )
