"""Does a tensor-parallel run compute what the single-process model computes on the same inputs?

In: the plan, the model, its inputs, the :class:`~backends.tensor_parallel.runtime.RunOptions` the
ranks ran with and the folder they wrote ``rank<R>.pt`` to. Out: a
:class:`~backends.compare.CheckReport`: every rank's outputs against the model's; in training also
every rank's loss and every parameter's gradient (a sharded weight's gathered to its full tensor,
under the model's name) against one single-process step with the same loss and target. A plan with
pipeline stages (:mod:`backends.tensor_parallel.grid`) is compared with the pipeline's single-process
step (the same micro-batching): the last stage's ranks' outputs and loss, every rank's gradients,
and every gradient held by some rank. Each tensor is held to its dtype's tolerance
(:func:`~backends.compare.compare`). Nothing prints.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.compare import MISSING, CheckReport, compare
from backends.pipeline.check import read_results
from backends.pipeline.check import reference_step as pipeline_reference
from backends.pipeline.launch import rank_errors
from backends.pipeline.loss import first_output, loss_function, make_target
from backends.pipeline.runtime import RunOptions as PipelineOptions
from backends.pipeline.runtime import physical_device
from backends.tensor_parallel.grid import TP, grid_of
from backends.tensor_parallel.launch import run_ranks, world_size_of
from backends.tensor_parallel.layout import mesh_devices
from backends.tensor_parallel.runtime import ERROR_PREFIX, RunOptions
from partitioner.errors import HetpartError, PipelineRunError

__all__ = ["check_ranks", "check_results", "reference_step"]


def reference_step(model: torch.nn.Module, inputs: Sequence[Any],
                   options: RunOptions) -> tuple[list[torch.Tensor], torch.Tensor | None, dict[str, Any]]:
    """The single-process step: ``(outputs, loss, gradients by parameter name)`` (on a copy of the model).

    Example:
        >>> outs, loss, grads = reference_step(model, inputs, RunOptions(training=True))  # doctest: +SKIP
    """
    args = tuple(inputs)
    if not options.training:
        with torch.no_grad():
            return _leaves(model(*args)), None, {}
    model = copy.deepcopy(model)
    out = model(*args)
    target = make_target(options.loss, tuple(first_output(out).shape), options.seed)
    loss = loss_function(options.loss)(out, target)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return _leaves(out), loss.detach(), grads


def check_results(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], options: RunOptions,
                  results: str | Path) -> CheckReport:
    """Compare what every rank wrote to ``results`` with the single-process step: :func:`reference_step`,
    or for a plan with pipeline stages the pipeline's (:func:`backends.pipeline.check.reference_step`:
    the batch cut into the plan's micro-batches, the mean of their losses), whose outputs and
    losses the last stage's ranks hold and whose gradients are spread over the stages.

    Raises:
        PipelineRunError: a rank's file is missing (that rank did not finish).
    """
    world = world_size_of(plan)
    records = read_results(results, world)
    start = time.perf_counter()
    if plan.pipeline:
        pipe = PipelineOptions(training=options.training, loss=options.loss, seed=options.seed)
        named, ref_loss, ref_grads = pipeline_reference(model, inputs, plan.pipeline["micro_batches"], pipe)
        ref_outs = list(named.values())
    else:
        ref_outs, ref_loss, ref_grads = reference_step(model, inputs, options)
    reference_s = time.perf_counter() - start
    outputs, grads, losses = [], [], []
    for record in records:
        tag = f"rank {record['rank']} "
        if "outputs" in record:  # every rank of a tensor-parallel group; the last stage's of a grid
            got = record["outputs"]
            outputs += [compare(f"{tag}output[{i}]", got[i] if i < len(got) else MISSING, ref)
                        for i, ref in enumerate(ref_outs)]
            if options.training:
                loss = record["loss"] if "loss" in record else \
                    torch.tensor(statistics.fmean(record["losses"]), dtype=ref_loss.dtype)
                losses.append(compare(f"{tag}loss", loss, ref_loss, summed=True))
        if options.training:
            ours = record.get("grads", {})
            grads += [compare(f"{tag}{name}", g, ref_grads.get(name), summed=True) for name, g in ours.items()]
    if options.training:  # a gradient no rank holds
        held = {name for record in records for name in record.get("grads", {})}
        grads += [compare(name, MISSING, ref, summed=True) for name, ref in ref_grads.items()
                  if ref is not None and name not in held]
    loss = max(losses, key=lambda e: (not e.passed, e.max_abs)) if losses else None
    errors = [*outputs, *losses, *grads]
    sharded = sorted({m for record in records for m in record.get("sharded", [])})
    if plan.pipeline:
        binding = {d: str(physical_device(d, options.device_map)) for g in grid_of(plan) for d in g}
        what = (f"{len(grid_of(plan))} pipeline stages x {TP} tensor-parallel ranks ({plan.pipeline['schedule']}, "
                f"{plan.pipeline['micro_batches']} micro-batches, {len(sharded)} linears sharded)")
    else:
        binding = {d: str(physical_device(d, options.device_map)) for d in mesh_devices(plan)}
        what = f"tensor-parallel group of {world} ranks ({len(sharded)} linears sharded)"
    return CheckReport(
        model_name=plan.model_name, binding=binding, training=options.training, repeat=1,
        outputs=tuple(outputs), loss=loss, grads=tuple(grads), original_s=reference_s,
        emitted_s=max(statistics.median(r["step_s"]) for r in records), passed=all(e.passed for e in errors),
        emitted=what, loss_name=options.loss,
    )


def check_ranks(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], *, model_spec: str | None = None,
                options: RunOptions | None = None, run_timeout_s: float = 600.0) -> CheckReport:
    """Run every rank here (:func:`~backends.tensor_parallel.launch.run_ranks`) and compare with the
    model (:func:`check_results`). ``model_spec``: how the ranks rebuild the model (a zoo name or
    ``file.py:factory``; default the plan's model name).

    Raises:
        HetpartError: the plan was not read from a file (the ranks read it from there).
        PipelineRunError: a rank failed (its one-line error quoted).

    Example:
        >>> report = check_ranks(plan, model, inputs, model_spec="gpt:small",
        ...                      options=RunOptions(training=True, device_map={"cuda:0": "cpu"}))  # doctest: +SKIP
        >>> report.passed                                                                          # doctest: +SKIP
        True
    """
    if not plan.source or plan.source == "<plan>":
        raise HetpartError("the ranks read the plan from its file: save it (plan.save(path)) and load it")
    options = options or RunOptions()
    with tempfile.TemporaryDirectory(prefix="hetpart-tp-") as results:
        run_options = dataclasses.replace(options, results=results)
        run = run_ranks(plan, model_spec or plan.model_name, run_options, timeout_s=run_timeout_s)
        if run.returncode != 0:
            raise PipelineRunError(f"the tensor-parallel run failed (exit status {run.returncode}): "
                                   + rank_errors(run.output, ERROR_PREFIX))
        return check_results(plan, model, inputs, run_options, results)


def _leaves(out: Any) -> list[torch.Tensor]:
    return [x.detach().cpu() for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
