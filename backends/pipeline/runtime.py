"""One rank of a pipeline plan: its stage on ``torch.distributed.pipelining``, run for some steps.

In: a plan with a ``pipeline`` section, the model (rebuilt in this process: zoo names and
``file.py:factory`` give the same weights everywhere), one step's inputs, :class:`RunOptions`, and
the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). Out: the steps run; with ``results`` set, ``rank<R>.pt`` written there: the step
times, the seconds of each step this stage spent in its forward and in its backward actions (summed
over the micro-batches; waits for a peer's tensors excluded), and for the first step the last stage's
outputs and losses and every stage's gradients under the model's parameter names (what
:mod:`backends.pipeline.check` compares).

What runs (``torch.distributed.pipelining``, nothing home-made):

* stage ``r`` (:class:`~backends.pipeline.stages.StageGraphs`) becomes a ``PipelineStage`` on
  rank ``r`` and the device its plan device is bound to (``host1/cuda:0`` -> ``cuda:0`` on its
  host; ``--bind`` overrides); the schedule is ``ScheduleGPipe`` or ``Schedule1F1B`` with the
  plan's micro-batches, driving inference (no loss) or training (the loss on the last stage, the
  mean over micro-batches, then the plan's optimizer on every stage);
* the process group is ``nccl`` when every stage is on a CUDA device of its own, ``gloo``
  otherwise; with gloo, stages on a GPU receive and send host tensors (their module moves them),
  so a pipeline may mix CPU and GPU stages (and a local check may put several stages on one GPU);
* parameters read by several stages (tied weights) are held by each; after backward their
  gradients are summed over those stages (an all-reduce in a group of just them), so every copy
  takes the same optimizer step;
* the ranks join first (:func:`~backends.pipeline.join.join`): a rank that never comes within the
  timeout is named in one error (with the likely causes) instead of a torch traceback;
* every collective has the launch's timeout: when a rank dies, the others fail within it (at
  once when its sockets close) with a :class:`~partitioner.errors.PipelineRunError` naming the
  rank, its stage and the step, instead of hanging.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from backends.pipeline.join import join
from backends.pipeline.loss import first_output, loss_function, make_target
from backends.pipeline.stages import StageGraphs, parameter_names
from partitioner.errors import HetpartError, PipelineRunError
from partitioner.micro_batches import micro_batch_inputs

log = logging.getLogger(__name__)

__all__ = ["RunOptions", "run_rank", "rank_environment", "physical_device", "tied_groups"]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the ranks run a pipeline plan."""

    training: bool = False                  # a training step (loss, backward, optimizer) instead of inference
    schedule: str | None = None             # "gpipe" | "1f1b"; None: the plan's
    steps: int = 1                          # steps to run (the first is the one checked)
    loss: str = "mse"                       # backends.pipeline.loss: mse | cross-entropy | file.py:function
    device_map: Mapping[str, str] = dataclasses.field(default_factory=dict)  # plan device -> physical device
    timeout_s: float = 300.0                # a collective waiting longer fails
    results: str | None = None              # folder for rank<R>.pt (check and timing)
    seed: int = 0                           # the target's seed


def rank_environment(plan: Any) -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's variables, checked against the plan.

    Raises:
        PipelineRunError: missing variables, or a world size other than the plan's stage count.
    """
    try:
        rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except KeyError as missing:
        raise PipelineRunError(f"{missing.args[0]} is not set: run the ranks with torchrun (print the command "
                               f"with `hetpart launch {plan.source}`)") from None
    except ValueError as bad:
        raise PipelineRunError(f"torchrun's RANK / WORLD_SIZE / LOCAL_RANK are not integers: {bad}") from None
    stages = plan.pipeline["stages"]
    if world != len(stages):
        per_host = {}
        for st in stages:
            per_host[st["host"]] = per_host.get(st["host"], 0) + 1
        hosts = ", ".join(f"{h}: {n}" for h, n in per_host.items())
        raise PipelineRunError(
            f"{plan.source} has {len(stages)} stages, one per rank, but this launch started {world} processes "
            f"(WORLD_SIZE={world}); start {len(stages)} ({hosts} per host): `hetpart launch {plan.source}` "
            f"prints the torchrun commands")
    if not 0 <= rank < world:
        raise PipelineRunError(f"RANK={rank} is outside 0..{world - 1}")
    return rank, world, local


def physical_device(plan_device: str, device_map: Mapping[str, str]) -> torch.device:
    """Where a plan device runs here: the binding, else its name without the host (``host1/cuda:0``
    -> ``cuda:0``; ``host0/cpu`` -> ``cpu``).

    Example:
        >>> physical_device("host2/cpu", {})
        device(type='cpu')
    """
    name = device_map.get(plan_device, plan_device.rpartition("/")[2])
    try:
        return torch.device(name)
    except RuntimeError:
        raise HetpartError(f"{plan_device} is bound to {name!r}, which is not a torch device; e.g. "
                           f"--bind {plan_device}=cpu") from None


def tied_groups(graphs: StageGraphs, names: Mapping[str, str]) -> dict[str, list[int]]:
    """Parameter (first name) → the stages holding it, for parameters more than one stage reads."""
    holders: dict[str, list[int]] = {}
    for s in range(graphs.num_stages):
        for target in graphs.attributes(s):
            if target in names:
                holders.setdefault(names[target], []).append(s)
    return {name: stages for name, stages in holders.items() if len(stages) > 1}


def run_rank(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], options: RunOptions) -> dict[str, Any]:
    """Run this process's stage for ``options.steps`` steps; returns (and with ``results`` writes)
    what it measured and, for the first step, its outputs, losses and gradients.

    Raises:
        PipelineRunError: the launch does not match the plan, or a step failed (a peer died or
            timed out); the message names this rank, its stage and device, and the step.

    Example (in each process started by torchrun)::

        run_rank(Plan.load("plan.json"), model, inputs, RunOptions(training=True))
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world, _ = rank_environment(plan)
    section = plan.pipeline
    schedule_name = options.schedule or section["schedule"]
    M = section["micro_batches"]
    stage_info = section["stages"][rank]
    devices = [physical_device(st["device"], options.device_map) for st in section["stages"]]
    device = devices[rank]
    own_gpus = all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)
    backend = "nccl" if own_gpus else "gloo"  # NCCL refuses two ranks on one GPU (a local check)
    comm = device if backend == "nccl" else torch.device("cpu")
    graphs = StageGraphs(plan, model, micro_batch_inputs(tuple(inputs), M))
    module = graphs.module(rank, device)
    runnable = module if comm == device else _OnDevice(module, device, comm)
    where = f"rank {rank} (stage {rank} on {stage_info['device']} -> {device})"
    if schedule_name == "1f1b" and M < world:
        raise PipelineRunError(f"{where}: Schedule1F1B needs at least as many micro-batches as stages "
                               f"({M} < {world}); use --schedule gpipe or re-plan with --micro-batches {world}")
    names = parameter_names(model)
    timeout = datetime.timedelta(seconds=options.timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL (and CUDA tensors under gloo) use the current device
    labels = [where if r == rank else f"rank {r} (stage {r} on {st['device']})"
              for r, st in enumerate(section["stages"])]
    store = join(rank, world, options.timeout_s, labels)  # a rank that never comes: named, not a torch traceback
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                            timeout=timeout)
    try:
        groups = {name: dist.new_group(stages) for name, stages in sorted(tied_groups(graphs, names).items())}
        stage = PipelineStage(runnable, rank, world, comm)
        busy = _time_actions(stage)
        loss_fn = loss_function(options.loss) if options.training else None
        schedule_cls = ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B
        schedule = schedule_cls(stage, M, loss_fn=loss_fn)
        target = None
        if options.training and rank == world - 1:
            out_meta = first_output(_output_meta(graphs))
            target = make_target(options.loss, (out_meta.shape[0] * M, *out_meta.shape[1:]), options.seed).to(comm)
        optimizer = _optimizer(plan.optimizer, module) if options.training else None
        record: dict[str, Any] = {"rank": rank, "device": str(device), "schedule": schedule_name, "step_s": [],
                                  "forward_s": [], "backward_s": []}
        for step in range(options.steps):
            busy.update(forward_s=0.0, backward_s=0.0)
            start = time.perf_counter()
            try:
                out, losses = _step(schedule, rank, world, inputs, target, options.training, module)
                if options.training:
                    _sum_tied(module, names, groups, rank)
            except (RuntimeError, ValueError, dist.DistBackendError) as exc:
                raise PipelineRunError(
                    f"{where}: step {step + 1} failed after {time.perf_counter() - start:.1f} s: "
                    f"{_first_line(exc)}; a peer rank probably stopped (or took longer than the "
                    f"{options.timeout_s:g} s timeout), so this rank stops too") from None
            if step == 0:
                record.update(_first_step(module, names, out, losses, rank, world))
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            record["step_s"].append(time.perf_counter() - start)
            record["forward_s"].append(busy["forward_s"])
            record["backward_s"].append(busy["backward_s"])
            log.info("step %d of %d took %.4f s", step + 1, options.steps, record["step_s"][-1])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    log.info("%s: %d steps, median %.4f s", where, options.steps, statistics.median(record["step_s"]))
    if options.results:
        torch.save(record, Path(options.results) / f"rank{rank}.pt")
    return record


def _time_actions(stage: Any) -> dict[str, float]:
    """Time the stage's forward and backward actions (``forward_one_chunk``, ``backward_one_chunk``:
    its compute and the schedule's work around it, not the waits for a peer's tensors); the
    returned dict sums them over a step, which ``run_rank`` resets each step."""
    busy = {"forward_s": 0.0, "backward_s": 0.0}
    for method, key in (("forward_one_chunk", "forward_s"), ("backward_one_chunk", "backward_s")):
        original = getattr(stage, method)

        def timed(*args: Any, _original: Any = original, _key: str = key, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                busy[_key] += time.perf_counter() - start

        setattr(stage, method, timed)
    return busy


class _OnDevice(torch.nn.Module):
    """A stage on ``device`` that receives and sends ``comm`` tensors (gloo: host memory)."""

    def __init__(self, module: torch.nn.Module, device: torch.device, comm: torch.device) -> None:
        super().__init__()
        self.module, self.device, self.comm = module, device, comm

    def forward(self, *args: Any) -> Any:
        out = self.module(*(a.to(self.device) if isinstance(a, torch.Tensor) else a for a in args))
        if isinstance(out, tuple):
            return tuple(o.to(self.comm) for o in out)
        return out.to(self.comm)


def _step(schedule: Any, rank: int, world: int, inputs: Sequence[Any], target: Any, training: bool,
          module: torch.nn.Module) -> tuple[Any, list]:
    losses: list = []
    args = tuple(inputs) if rank == 0 else ()
    if not training:
        with torch.no_grad():
            out = schedule.step(*args)
        return out, losses
    for p in module.parameters():
        p.grad = None
    kwargs = {"target": target, "losses": losses} if rank == world - 1 else {}
    out = schedule.step(*args, **kwargs)
    return out, losses


def _first_step(module: torch.nn.Module, names: Mapping[str, str], out: Any, losses: list, rank: int,
                world: int) -> dict[str, Any]:
    grads = {names.get(n, n): p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    record: dict[str, Any] = {"grads": grads}
    if rank == world - 1:
        record["outputs"] = _detached(out)
        record["losses"] = [float(x.detach()) for x in losses]
    return record


def _sum_tied(module: torch.nn.Module, names: Mapping[str, str], groups: Mapping[str, Any], rank: int) -> None:
    """All-reduce the gradients of parameters several stages hold, among those stages."""
    params = {names.get(n, n): p for n, p in module.named_parameters()}
    for name, group in groups.items():
        if name in params and params[name].grad is not None:
            dist.all_reduce(params[name].grad, group=group)


def _optimizer(name: str, module: torch.nn.Module) -> torch.optim.Optimizer | None:
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return None
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "sgd-momentum" else 0.0)


def _output_meta(graphs: StageGraphs) -> Any:
    vals = [a.meta.get("val") for a in torch.utils._pytree.tree_leaves(graphs.nodes[-1].args[0])
            if isinstance(a, torch.fx.Node)]
    return vals[0] if len(vals) == 1 else tuple(vals)


def _detached(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    if isinstance(out, (tuple, list)):
        return tuple(_detached(o) for o in out)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
