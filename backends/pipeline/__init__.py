"""The pipeline backend: a plan's stages on ``torch.distributed.pipelining``, one rank each, under torchrun.

A pipeline plan (``hetpart plan MODEL --devices CLUSTER --objective throughput``; its ``pipeline``
section, :mod:`partitioner.plan.pipeline`) runs as one process per stage: stage ``s`` is a
``PipelineStage`` on rank ``s`` and its device, and ``ScheduleGPipe`` or ``Schedule1F1B`` drives
the plan's micro-batches through them, for inference or for training with a loss. Nothing here
re-implements the runtime: the stages, the schedules, the send/receive and the launcher are
torch's.

Modules:

============  ===================================================================================
module        what it does
============  ===================================================================================
``stages``    :class:`StageGraphs`: the captured graph cut into one module per stage (the values
              alive across each boundary are sent on, parameter names kept)
``runtime``   :func:`run_rank`: one rank: process group, ``PipelineStage``, schedule, steps,
              tied-gradient sums, timeouts that turn a dead peer into a clear error
``__main__``  ``python -m backends.pipeline plan.json``: the program torchrun starts on every rank
``launch``    :func:`torchrun_commands` (one per host) and :func:`run_local` (all ranks here)
``loss``      the training loss and its target, built identically on every process
``check``     :func:`check_results`: the ranks' outputs, loss and gathered gradients against the
              single-process model with the same micro-batching
============  ===================================================================================

Example:
    >>> from backends.pipeline import BACKEND
    >>> report = BACKEND.check(plan, model, inputs, model_spec="mlp:tiny", training=True)   # doctest: +SKIP
    >>> report.passed
    True
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

import torch

from backends.binding import present
from backends.compare import CheckReport
from backends.pipeline.check import check_results
from backends.pipeline.launch import rank_arguments, rank_errors, run_local, torchrun_commands
from backends.pipeline.runtime import RunOptions, physical_device, run_rank
from backends.pipeline.stages import StageGraphs
from backends.torch import BACKEND as TORCH_BACKEND
from partitioner.errors import HetpartError, PipelineRunError
from partitioner.ir import OpGraph
from partitioner.micro_batches import micro_batch_inputs


class PipelineBackend:
    """A pipeline plan as ``torch.distributed.pipelining`` stages (see the package docstring)."""

    name = "pipeline"
    runs = ("the plan's contiguous stages as torch.distributed.pipelining PipelineStages, one rank each, "
            "driven by ScheduleGPipe or Schedule1F1B under torchrun (inference or training)")

    def unsupported(self, graph: OpGraph) -> dict[str, str]:
        """What the torch backend cannot run (a stage is a piece of the same captured graph)."""
        return TORCH_BACKEND.unsupported(graph)

    def bind(self, plan: Any, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
        """Each stage's plan device → the device it runs on here (``host1/cuda:0`` → ``cuda:0``)."""
        _require_pipeline(plan)
        binding = {st["device"]: str(physical_device(st["device"], device_map or {})) for st in plan.pipeline["stages"]}
        missing = [f"{d} (as {p})" for d, p in binding.items() if not present(p)]
        if missing:
            raise HetpartError(f"the plan's stages use {', '.join(missing)}, not present on this machine; bind "
                               f"them to present devices, e.g. "
                               + " ".join(f"--bind {d}=cpu" for d, p in binding.items() if not present(p)))
        return binding

    def build(self, plan: Any, model: Any, device_map: Mapping[str, str] | None = None, **options: Any) -> Any:
        """The stage modules, in stage order, each on its bound device (``options``: ``micro_batch``,
        the inputs of one micro-batch; default zeros of the plan's recorded shapes)."""
        binding = self.bind(plan, device_map)
        micro_batch = options.get("micro_batch")
        if micro_batch is None:
            micro_batch = tuple(torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in plan.inputs)
        graphs = StageGraphs(plan, model, micro_batch)
        return [graphs.module(s, binding[d]) for s, d in enumerate(graphs.devices)]

    def check(self, plan: Any, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> CheckReport:
        """Run every rank here (:func:`run_local`) and compare with the model (:func:`check_results`).

        ``options``: ``model_spec`` (how the ranks rebuild the model: a zoo name or
        ``file.py:factory``; default the plan's model name), ``training``, ``schedule``, ``loss``,
        ``timeout_s`` (per collective) and ``run_timeout_s`` (the whole run).
        """
        _require_pipeline(plan)
        if not plan.source or plan.source == "<plan>":
            raise HetpartError("the ranks read the plan from its file: save it (plan.save(path)) and load it")
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        micro_batch_inputs(args, plan.pipeline["micro_batches"])  # the batch must split
        with tempfile.TemporaryDirectory(prefix="hetpart-pipeline-") as results:
            run_options = RunOptions(training=options.get("training", False), schedule=options.get("schedule"),
                                     loss=options.get("loss", "mse"), device_map=dict(device_map or {}),
                                     timeout_s=options.get("timeout_s", RunOptions.timeout_s), results=results)
            spec = options.get("model_spec") or plan.model_name
            run = run_local(plan, rank_arguments(plan.source, spec, run_options),
                            timeout_s=options.get("run_timeout_s", 600.0))
            if run.returncode != 0:
                raise PipelineRunError(f"the pipeline run failed (exit status {run.returncode}): "
                                       + rank_errors(run.output))
            return check_results(plan, model, args, run_options, results)


def _require_pipeline(plan: Any) -> None:
    from partitioner.plan.precision import refuse_precision

    refuse_precision(plan, "the pipeline backend")
    if not plan.pipeline:
        raise HetpartError(f"{plan.source} is not a pipeline plan (no pipeline section): plan one with "
                           f"`hetpart plan MODEL --devices 4x-cpu-host --objective throughput`")


BACKEND = PipelineBackend()

__all__ = ["BACKEND", "PipelineBackend", "RunOptions", "StageGraphs", "check_results", "rank_errors",
           "run_local", "run_rank", "torchrun_commands"]
