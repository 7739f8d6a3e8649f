"""One rank of a tensor-parallel run: the plan's split linears sharded on a ``DeviceMesh``, the rest replicated.

In: a plan with a ``splits`` section, the model (rebuilt in this process: zoo names and
``file.py:factory`` give the same weights everywhere), its inputs, :class:`RunOptions`, and the
``torchrun`` environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Out: one
step run; with ``results`` set, ``rank<R>.pt`` written there: the outputs, in training the loss and
every parameter's gradient gathered to its full tensor under the model's parameter name (what
:mod:`backends.tensor_parallel.check` compares with the single-process model), and the step time.

What runs (``torch.distributed.tensor``, nothing home-made):

* the launch is checked first: ``WORLD_SIZE`` must be the number of the splits' devices (one rank
  each, :func:`rank_environment`); a mismatch stops every rank before anything starts, with both
  numbers and the command that starts the right number;
* rank ``r`` runs the mesh's ``r``-th device (:func:`~backends.tensor_parallel.layout.mesh_devices`;
  ``--bind`` maps it to a device here, ``cuda:0=cpu`` on a CPU machine); the process group is
  ``nccl`` when every rank has a CUDA device of its own, ``gloo`` otherwise;
* a one-dimensional ``DeviceMesh`` over the ranks; ``parallelize_module`` with each split's style
  (:class:`~backends.tensor_parallel.layout.Layout`): the split weights become ``DTensor``
  parameters sharded ``Shard(0)`` / ``Shard(1)``, every other parameter stays a plain tensor and
  every other op runs whole on every rank; an attention region's module gets the rank's head count
  (:mod:`~backends.tensor_parallel.heads`: Megatron's per-partition heads);
* training: the loss of :mod:`backends.pipeline.loss` (the same target on every process), one
  backward; a sharded weight's gradient is a ``DTensor``, gathered with ``full_tensor()``.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from backends.pipeline.join import join
from backends.pipeline.loss import first_output, loss_function, make_target
from backends.pipeline.runtime import physical_device
from backends.tensor_parallel.heads import set_head_counts
from backends.tensor_parallel.layout import layout_of, mesh_devices
from partitioner.errors import HetpartError, PipelineRunError

log = logging.getLogger(__name__)

__all__ = ["ERROR_PREFIX", "RANK_MODULE", "RunOptions", "run_rank", "rank_environment", "launch_hint"]

RANK_MODULE = "backends.tensor_parallel"
#: What a rank's error line starts with (``backends.pipeline.launch.rank_errors`` finds them by it).
ERROR_PREFIX = "hetpart tensor-parallel rank"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the tensor-parallel ranks run a plan."""

    training: bool = False                  # loss and backward (gradients gathered) instead of inference
    loss: str = "mse"                       # backends.pipeline.loss: mse | cross-entropy | file.py:function
    device_map: Mapping[str, str] = dataclasses.field(default_factory=dict)  # plan device -> physical device
    timeout_s: float = 300.0                # a collective waiting longer fails
    results: str | None = None              # folder for rank<R>.pt (the check reads them)
    seed: int = 0                           # the target's seed


def launch_hint(plan: Any, world: int) -> str:
    """The command that starts ``world`` tensor-parallel ranks of ``plan`` on this machine."""
    return (f"torchrun --standalone --nproc-per-node {world} -m {RANK_MODULE} {plan.source} "
            f"(or `hetpart launch {plan.source} --run`)")


def rank_environment(plan: Any, devices: Sequence[str]) -> tuple[int, int]:
    """``(rank, world_size)`` from torchrun's variables, checked against the plan's mesh.

    Raises:
        PipelineRunError: missing variables, or a world size other than the number of the
            splits' devices (both numbers named, with the command that starts the right one).

    Example (in a process torchrun started with ``--nproc-per-node 2``)::

        rank_environment(plan, ("cpu", "cuda:0"))     # (0, 2) or (1, 2)
    """
    try:
        rank, world = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE"))
    except KeyError as missing:
        raise PipelineRunError(f"{missing.args[0]} is not set: run the ranks with torchrun: "
                               f"{launch_hint(plan, len(devices))}") from None
    except ValueError as bad:
        raise PipelineRunError(f"torchrun's RANK / WORLD_SIZE are not integers: {bad}") from None
    if world != len(devices):
        raise PipelineRunError(
            f"{plan.source} splits its linears over {len(devices)} devices ({', '.join(devices)}): a device mesh "
            f"of {len(devices)} ranks, one per device, but this launch started {world} "
            f"process{'es' if world != 1 else ''} (WORLD_SIZE={world}); nothing was run: start {len(devices)}: "
            f"{launch_hint(plan, len(devices))}")
    if not 0 <= rank < world:
        raise PipelineRunError(f"RANK={rank} is outside 0..{world - 1}")
    return rank, world


def run_rank(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], options: RunOptions) -> dict[str, Any]:
    """Run this process's rank for one step; returns (and with ``results`` writes) its outputs and,
    in training, its loss and gathered gradients. ``model`` is moved and sharded in place (each
    rank builds its own); a plan with pipeline stages runs through
    :func:`~backends.tensor_parallel.grid.run_grid_rank`.

    Raises:
        PipelineRunError: the launch does not match the plan's mesh, or the step failed (a peer
            died or timed out); the message names this rank and its device.
        PlanMismatch: a split the tensor-parallel styles cannot run (see :mod:`~backends.tensor_parallel.layout`).

    Example (in each process started by torchrun)::

        run_rank(Plan.load("plan.json"), model, inputs, RunOptions(training=True))
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    if plan.pipeline:
        raise HetpartError(f"{plan.source} has pipeline stages: its ranks are stages x tensor-parallel ranks; run "
                           f"them with backends.tensor_parallel.grid.run_grid_rank (python -m backends.tensor_parallel "
                           f"does)")
    devices = mesh_devices(plan)
    rank, world = rank_environment(plan, devices)  # before anything starts
    physical = [physical_device(d, options.device_map) for d in devices]
    if len({d.type for d in physical}) > 1:
        raise HetpartError(f"the tensor-parallel ranks would run on {', '.join(map(str, physical))}: a device mesh "
                           f"has one device type; bind them alike, e.g. "
                           + " ".join(f"--bind {d}=cpu" for d, p in zip(devices, physical) if p.type != "cpu"))
    device = physical[rank]
    layout = layout_of(plan, model, inputs)
    where = f"rank {rank} (tensor-parallel rank {rank} of {world} on {devices[rank]} -> {device})"
    own_gpus = all(d.type == "cuda" for d in physical) and len(set(physical)) == len(physical)
    backend = "nccl" if own_gpus else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    labels = [where if r == rank else f"rank {r} (tensor-parallel on {d})" for r, d in enumerate(devices)]
    store = join(rank, world, options.timeout_s, labels)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=options.timeout_s))
    try:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
        model = parallelize_module(model.to(device), mesh, layout.plan())
        set_head_counts(model, layout.heads, rank)  # attention regions: each rank computes with its heads
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in inputs)
        start = time.perf_counter()
        try:
            record = _step(model, args, options)
        except (RuntimeError, ValueError, dist.DistBackendError) as exc:
            raise PipelineRunError(f"{where}: the step failed after {time.perf_counter() - start:.1f} s: "
                                   f"{_first_line(exc)}; a peer rank probably stopped (or took longer than the "
                                   f"{options.timeout_s:g} s timeout), so this rank stops too") from None
        record.update(rank=rank, device=str(device), step_s=[time.perf_counter() - start],
                      sharded=sorted(s.module for s in layout.linears))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if options.results:
        torch.save(record, Path(options.results) / f"rank{rank}.pt")
    return record


def _step(model: torch.nn.Module, args: tuple, options: RunOptions) -> dict[str, Any]:
    """One forward (and in training a backward), and what the check compares."""
    from torch.distributed.tensor import DTensor

    if not options.training:
        with torch.no_grad():
            out = model(*args)
        return {"outputs": _leaves(out)}
    out = model(*args)
    first = first_output(out)
    target = make_target(options.loss, tuple(first.shape), options.seed).to(first.device)
    loss = loss_function(options.loss)(out, target)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():  # the same order on every rank: full_tensor() is a collective
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            grads[name] = g.detach().cpu()
    return {"outputs": _leaves(out), "loss": loss.detach().cpu(), "grads": grads}


def _leaves(out: Any) -> list[torch.Tensor]:
    """The output's tensors, on the host; an all-gather or all-reduce still in flight (a style's
    output is an ``AsyncCollectiveTensor``) is waited for first."""
    return [_waited(x).detach().cpu() for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


def _waited(x: torch.Tensor) -> torch.Tensor:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return x.wait() if isinstance(x, AsyncCollectiveTensor) else x


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
