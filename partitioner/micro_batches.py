"""Pipeline options of a plan: whether it is a pipeline, its micro-batches, one micro-batch's inputs.

In: the device set, the objective and the pipeline options a user gave (``micro_batches``,
``schedule``, ``stages``; any may be ``None``), and the example inputs of one step. Out: a
:class:`~partitioner.solvers.pipeline.PipelineSpec` with the defaults filled in (or ``None``: not a
pipeline plan), and the inputs of one micro-batch, which is what the graph is captured with (op
costs are per micro-batch; a step runs ``M`` of them).

A plan is a pipeline when the user gives any pipeline option, or asks for ``throughput`` on a
cluster profile (devices on more than one host). The default number of micro-batches is the
largest divisor of the batch not above ``2 x`` the number of devices (enough to keep the bubble
under a third with one stage per device, while micro-batches stay as large as possible); the
default schedule is 1F1B (the same bubble as GPipe with less memory). Every input's first
dimension is the batch: it must divide by ``M``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cost_models.profiles import DeviceSet
from partitioner.errors import HetpartError
from partitioner.solvers.pipeline import PipelineSpec, Schedule

__all__ = ["pipeline_spec_for", "micro_batch_inputs", "split_micro_batches", "batch_size"]


def batch_size(inputs: Any) -> int | None:
    """The first dimension of the first tensor input (``None`` when there is no tensor input)."""
    for x in _as_tuple(inputs):
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return None


def pipeline_spec_for(
    devices: DeviceSet,
    objective: str,
    *,
    micro_batches: int | None = None,
    schedule: str | Schedule | None = None,
    stages: int | None = None,
    batch: int | None = None,
) -> PipelineSpec | None:
    """The pipeline spec of a plan, defaults filled in, or ``None`` when the plan is no pipeline.

    Raises:
        HetpartError: a pipeline option with another objective than throughput, or a number of
            micro-batches that does not divide the batch.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> pipeline_spec_for(load_profile("4x-cpu-host"), "throughput", batch=8)
        PipelineSpec(micro_batches=8, schedule=<Schedule.ONE_F_ONE_B: '1f1b'>, stages=None)
    """
    asked = micro_batches is not None or schedule is not None or stages is not None
    objective = getattr(objective, "value", objective)
    if not asked and not (objective == "throughput" and len(devices.hosts()) > 1):
        return None
    if objective != "throughput":
        raise HetpartError(f"--micro-batches, --schedule and --stages plan pipeline stages, whose objective is "
                           f"throughput; got --objective {objective}: use --objective throughput")
    if micro_batches is None:
        micro_batches = _default_micro_batches(batch, len(devices))
    elif batch is not None and batch % micro_batches:
        raise HetpartError(f"--micro-batches {micro_batches} does not divide the batch of {batch}: a step's batch "
                           f"is split into equal micro-batches; use a divisor of {batch} "
                           f"({', '.join(str(d) for d in _divisors(batch))})")
    return PipelineSpec(micro_batches, Schedule(schedule) if schedule is not None else Schedule.ONE_F_ONE_B, stages)


def micro_batch_inputs(inputs: Any, micro_batches: int) -> tuple:
    """The first ``1 / micro_batches`` of every tensor input along its first dimension.

    Raises:
        HetpartError: an input whose first dimension does not divide by ``micro_batches``.

    Example:
        >>> import torch
        >>> [x.shape[0] for x in micro_batch_inputs((torch.zeros(8, 3),), 4)]
        [2]
    """
    return split_micro_batches(inputs, micro_batches)[0]


def split_micro_batches(inputs: Any, micro_batches: int) -> list[tuple]:
    """The inputs of each of ``micro_batches`` equal micro-batches: every tensor input cut along its
    first dimension (views, in order); 0-d tensors and other values are passed to each as they are.

    Raises:
        HetpartError: an input whose first dimension does not divide by ``micro_batches``.

    Example:
        >>> import torch
        >>> [x[0].tolist() for x in split_micro_batches((torch.arange(4),), 2)]
        [[0, 1], [2, 3]]
    """
    columns = []
    for i, x in enumerate(_as_tuple(inputs)):
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) == 0:
            columns.append([x] * micro_batches)
            continue
        if shape[0] % micro_batches:
            raise HetpartError(f"input {i} has {shape[0]} rows (shape {tuple(shape)}), which do not split into "
                               f"{micro_batches} equal micro-batches: use --micro-batches dividing {shape[0]}")
        rows = shape[0] // micro_batches
        columns.append([x[k * rows:(k + 1) * rows] for k in range(micro_batches)])
    return [tuple(column[k] for column in columns) for k in range(micro_batches)]


def _default_micro_batches(batch: int | None, devices: int) -> int:
    most = 2 * max(devices, 1)
    if batch is None:
        return most
    return max(d for d in _divisors(batch) if d <= most)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _as_tuple(inputs: Any) -> Sequence[Any]:
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)
