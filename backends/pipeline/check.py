"""Does a pipeline run compute what the single-process model computes on the same inputs?

In: the plan, the model, one step's inputs, the :class:`~backends.pipeline.runtime.RunOptions` the
ranks ran with and the folder they wrote ``rank<R>.pt`` to. Out: a
:class:`~backends.compare.CheckReport`: the last stage's outputs against the model's; in training
also the step's loss (the mean of the micro-batch losses) and every parameter's gradient (gathered
from the stages holding it) against single-process training with the same micro-batching: the
batch cut into the plan's ``M`` micro-batches, the loss of each, their mean backpropagated. Each
tensor is held to its dtype's tolerance (:func:`~backends.compare.compare`). The times are the
single-process step's median (here) and the pipeline's median step (slowest rank). Nothing prints.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.compare import MISSING, CheckReport, compare
from backends.pipeline.loss import first_output, loss_function, make_target
from backends.pipeline.runtime import RunOptions, physical_device
from partitioner.errors import PipelineRunError

__all__ = ["check_results", "reference_step", "read_results"]


def reference_step(model: torch.nn.Module, inputs: Sequence[Any], micro_batches: int,
                   options: RunOptions) -> tuple[dict[str, torch.Tensor], torch.Tensor | None, dict[str, Any]]:
    """The single-process step with the pipeline's micro-batching: ``(outputs, loss, gradients)``.

    Inference runs the whole batch (the pipeline's merged outputs are the micro-batches'
    outputs in order); training cuts the batch like the schedule does and backpropagates the mean
    of the micro-batch losses (gradients on a copy of the model, by parameter name).

    Example:
        >>> outs, loss, grads = reference_step(model, inputs, 4, RunOptions(training=True))  # doctest: +SKIP
    """
    args = tuple(inputs)
    if not options.training:
        with torch.no_grad():
            return _named(model(*args)), None, {}
    model = copy.deepcopy(model)
    loss_fn = loss_function(options.loss)
    per_mb = [tuple(x.chunk(micro_batches)[i] if isinstance(x, torch.Tensor) and x.dim() else x for x in args)
              for i in range(micro_batches)]
    outputs, losses = [], []
    target = None
    for i, mb in enumerate(per_mb):
        out = model(*mb)
        if target is None:
            shape = first_output(out).shape
            target = make_target(options.loss, (shape[0] * micro_batches, *shape[1:]), options.seed).chunk(micro_batches)
        loss = loss_fn(out, target[i])
        losses.append(loss)
        outputs.append(out)
    torch.stack(losses).mean().backward()
    merged = [torch.cat([o.detach() for o in leaves]) for leaves in zip(*(_leaves(o) for o in outputs))]
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return _named(merged[0] if len(merged) == 1 else tuple(merged)), torch.stack(losses).mean().detach(), grads


def check_results(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], options: RunOptions,
                  results: str | Path, *, repeat: int = 3) -> CheckReport:
    """Compare what the ranks wrote to ``results`` with :func:`reference_step` (see the docstring).

    Raises:
        PipelineRunError: a rank's file is missing (that rank did not finish).
    """
    section = plan.pipeline
    records = read_results(results, section["world_size"])
    last = records[-1]
    ref_outs, ref_loss, ref_grads = reference_step(model, inputs, section["micro_batches"], options)
    pipe_outs = _named(last.get("outputs"))
    outputs = tuple(compare(name, pipe_outs.get(name), ref) for name, ref in ref_outs.items())
    loss = grads = None
    if options.training:
        losses = last.get("losses") or []
        pipe_loss = torch.tensor(statistics.fmean(losses), dtype=ref_loss.dtype) if losses else None
        loss = compare("loss", pipe_loss, ref_loss, summed=True)
        gathered: dict[str, torch.Tensor] = {}
        for record in records:  # tied parameters: every holder has the summed gradient; take one
            for name, g in record.get("grads", {}).items():
                gathered.setdefault(name, g)
        grads = tuple(compare(name, gathered.get(name, MISSING), ref, summed=True)
                      for name, ref in ref_grads.items() if ref is not None or name in gathered)
    reference_s = _median_time(lambda: reference_step(model, inputs, section["micro_batches"], options), repeat)
    pipeline_s = max(statistics.median(r["step_s"]) for r in records)
    errors = [*outputs, *([loss] if loss else []), *(grads or ())]
    binding = {st["device"]: str(physical_device(st["device"], options.device_map)) for st in section["stages"]}
    schedule = records[0].get("schedule", section["schedule"])
    return CheckReport(
        model_name=plan.model_name, binding=binding, training=options.training, repeat=len(last["step_s"]),
        outputs=outputs, loss=loss, grads=grads or (), original_s=reference_s, emitted_s=pipeline_s,
        passed=all(e.passed for e in errors),
        emitted=f"pipeline of {section['world_size']} ranks ({schedule}, {section['micro_batches']} micro-batches)",
        loss_name=f"mean of the micro-batches' {options.loss}",
    )


def read_results(results: str | Path, world_size: int) -> list[dict[str, Any]]:
    """Every rank's ``rank<R>.pt`` from ``results``, in rank order.

    Raises:
        PipelineRunError: a rank's file is missing (that rank did not finish its steps).
    """
    records = []
    for rank in range(world_size):
        path = Path(results) / f"rank{rank}.pt"
        if not path.is_file():
            raise PipelineRunError(f"rank {rank} wrote no results ({path}): it did not finish its steps")
        records.append(torch.load(path, weights_only=False))
    return records


def _leaves(result: Any) -> list[torch.Tensor]:
    return [x for x in pytree.tree_leaves(result) if isinstance(x, torch.Tensor)]


def _named(result: Any) -> dict[str, torch.Tensor]:
    """The tensors of a result, named ``output`` (one) or ``output[i]`` (several)."""
    leaves = _leaves(result) if result is not None else []
    if len(leaves) == 1:
        return {"output": leaves[0]}
    return {f"output[{i}]": t for i, t in enumerate(leaves)}


def _median_time(fn: Any, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
