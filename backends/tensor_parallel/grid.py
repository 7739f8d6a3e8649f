"""Pipeline stages x tensor-parallel groups: a pipeline plan whose stages split linears, on a 2-D mesh.

In: a plan with a ``pipeline`` section (``S`` stages) and a ``splits`` section whose ops each split
over their stage's device and one other device, the model, one step's inputs and
:class:`~backends.tensor_parallel.runtime.RunOptions`; torchrun's environment with ``S x T``
processes (``T = 2``, the splits' two devices). Out: one pipeline step, as
:mod:`backends.pipeline.runtime` runs it, with every stage's split linears sharded over its
tensor-parallel group; with ``results``, ``rank<R>.pt``: the outputs and losses (last stage) and
every gradient gathered to its full tensor under the model's name.

The grid (:func:`grid_of`): a ``DeviceMesh`` of shape ``(S, T)``, dimensions ``("pp", "tp")``; rank
``s * T + t`` runs stage ``s`` on ``groups[s][t]``: ``t = 0`` its stage device (every split's home
there), ``t = 1`` the other device of its splits (a stage without splits runs whole on both, the
second a replica on the stage device). Each rank builds its stage's module
(:class:`~backends.pipeline.stages.StageGraphs`), turns each split ``aten.linear`` into a call of an
``nn.Linear`` holding the same parameters under the same names (:func:`linear_calls`), and
``parallelize_module`` shards it over the ``tp`` sub-mesh with the style of
:mod:`~backends.tensor_parallel.layout`. A ``PipelineStage`` on the ``pp`` sub-mesh's group (the ranks
of one ``t``) and ``ScheduleGPipe`` / ``Schedule1F1B`` drive the plan's micro-batches; tied
parameters held by several stages have their gradients summed among those stages' ranks of the same
``t``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from backends.pipeline.join import join
from backends.pipeline.loss import first_output, loss_function, make_target
from backends.pipeline.runtime import physical_device, tied_groups
from backends.pipeline.stages import StageGraphs, parameter_names
from backends.tensor_parallel.layout import SplitLinear, split_linears
from backends.tensor_parallel.runtime import RunOptions, launch_hint
from partitioner.errors import HetpartError, PipelineRunError, PlanMismatch
from partitioner.micro_batches import micro_batch_inputs

__all__ = ["grid_of", "linear_calls", "run_grid_rank"]

TP = 2  # a split is over two devices


def grid_of(plan: Any) -> tuple[tuple[str, ...], ...]:
    """Each stage's tensor-parallel group of devices, in rank order (see the module docstring).

    Raises:
        PlanMismatch: a split op whose home is not its stage's device, or a stage whose splits are
            over several other devices.

    Example:
        >>> grid_of(plan)                      # doctest: +SKIP
        (('host0/cpu', 'host2/cpu'), ('host1/cpu', 'host3/cpu'))
    """
    stages = [st["device"] for st in plan.pipeline["stages"]]
    others: dict[int, dict[str, str]] = {s: {} for s in range(len(stages))}
    for op, entry in plan.splits.items():
        if len(entry["devices"]) != TP:
            raise PlanMismatch(f"{plan.source}: op {op!r} is split over {len(entry['devices'])} devices "
                               f"({', '.join(entry['devices'])}): a pipeline stage's tensor-parallel group is its "
                               f"device and one other ({TP} ranks); re-plan its splits over pairs (--split "
                               f"cols,rows@2), or run the plan in one process (plan.emit)")
        home, other = entry["devices"]
        if home not in stages:
            raise PlanMismatch(f"{plan.source}: op {op!r} is split with its home on {home}, which runs no pipeline "
                               f"stage ({', '.join(stages)}): a split's home must be its stage's device; re-plan")
        others[stages.index(home)][op] = other
    groups = []
    for s, device in enumerate(stages):
        seen = sorted(set(others[s].values()))
        if len(seen) > 1:
            by = ", ".join(f"{op} over {o}" for op, o in others[s].items())
            raise PlanMismatch(f"{plan.source}: stage {s} ({device}) splits ops over {len(seen)} other devices ({by}): "
                               f"a stage's tensor-parallel group is its device and one other; split them all "
                               f"over one device, or run the plan in one process (plan.emit)")
        groups.append((device, seen[0] if seen else device))
    return tuple(groups)


def linear_calls(gm: torch.fx.GraphModule, linears: Sequence[SplitLinear]) -> torch.fx.GraphModule:
    """``gm`` with each of ``linears``' ``aten.linear`` nodes turned into a call of an ``nn.Linear``
    at the module's path, holding the same parameter objects (so their names do not change); in
    place, and returned. Ops that ``gm`` does not hold (another stage's) are skipped."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for s in linears:
        node = nodes.get(s.op)
        if node is None:
            continue
        holder = gm.get_submodule(s.module)  # the GraphModule's copy of the model's path: weight and bias
        weight, bias = holder.get_parameter("weight"), getattr(holder, "bias", None)
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        linear.weight = weight
        if bias is not None:
            linear.bias = bias
        parent, _, leaf = s.module.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, leaf, linear)
        reads = [a for a in node.all_input_nodes if a.op == "get_attr"]
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(s.module, (node.args[0],))
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        for a in reads:
            if not a.users:
                gm.graph.erase_node(a)
    gm.graph.lint()
    gm.recompile()
    return gm


def run_grid_rank(plan: Any, model: torch.nn.Module, inputs: Sequence[Any], options: RunOptions) -> dict[str, Any]:
    """Run this process's (stage, tensor-parallel rank) of the grid for one step.

    Raises:
        PipelineRunError: the launch's world size is not stages x 2 (both numbers, and the command),
            or the step failed (this rank, its stage and its device named).
        PlanMismatch: a split the grid or the styles cannot run (named, with the fix).

    Example (in each of the 4 processes ``torchrun --nproc-per-node 4 -m backends.tensor_parallel
    plan.json`` starts)::

        run_grid_rank(Plan.load("plan.json"), model, inputs, RunOptions(training=True))
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    groups = grid_of(plan)
    S = len(groups)
    rank, world = _grid_environment(plan, S)
    s, t = divmod(rank, TP)
    section = plan.pipeline
    M = section["micro_batches"]
    schedule_name = section["schedule"]
    devices = [physical_device(d, options.device_map) for g in groups for d in g]
    if {d.type for d in devices} != {"cpu"}:
        raise HetpartError(f"the grid's ranks would run on {', '.join(map(str, devices))}: the grid runs on gloo "
                           f"with host tensors here; bind every device to cpu (--bind DEVICE=cpu)")
    device = devices[rank]
    micro_batch = micro_batch_inputs(tuple(inputs), M)
    # the pipeline's checks run on the plan without its splits (the planner prices no splits with stages
    # yet, and the splits do not change which stage runs what); the layout checks the splits
    graphs = StageGraphs(dataclasses.replace(plan, splits={}), model, micro_batch)
    mine = {op: groups[s] for op, e in plan.splits.items() if e["devices"][0] == groups[s][0]}
    linears = split_linears(plan, model, micro_batch, mine, captured=graphs.gm) if mine else ()
    module = linear_calls(graphs.module(s, device), linears)
    names = parameter_names(model)
    where = f"rank {rank} (stage {s}, tensor-parallel rank {t}, on {groups[s][t]} -> {device})"
    labels = [where if r == rank else f"rank {r} (stage {r // TP}, tensor-parallel rank {r % TP})"
              for r in range(world)]
    store = join(rank, world, options.timeout_s, labels)
    dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=options.timeout_s))
    try:
        mesh = init_device_mesh("cpu", (S, TP), mesh_dim_names=("pp", "tp"))
        if linears:
            module = parallelize_module(module, mesh["tp"], {x.module: x.style() for x in linears})
        tied = {}
        for name, stages in sorted(tied_groups(graphs, names).items()):
            for column in range(TP):  # every rank makes every group, in the same order
                group = dist.new_group([st * TP + column for st in stages])
                if column == t and s in stages:
                    tied[name] = group
        stage = PipelineStage(module, s, S, device, group=mesh["pp"].get_group())
        loss_fn = loss_function(options.loss) if options.training else None
        schedule = (ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B)(stage, M, loss_fn=loss_fn)
        start = time.perf_counter()
        try:
            out, losses = _step(schedule, s, S, inputs, graphs, options, module)
            if options.training:
                params = {names.get(n, n): p for n, p in module.named_parameters()}
                for name, group in tied.items():
                    if params[name].grad is not None:
                        dist.all_reduce(params[name].grad, group=group)
            grads = {}
            for n, p in module.named_parameters():  # the same order on both ranks of the stage: a collective
                if p.grad is not None:
                    g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                    grads[names.get(n, n)] = g.detach().cpu()
        except (RuntimeError, ValueError, dist.DistBackendError) as exc:
            raise PipelineRunError(f"{where}: the step failed after {time.perf_counter() - start:.1f} s: "
                                   f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}; "
                                   f"a peer rank probably stopped, so this rank stops too") from None
        record: dict[str, Any] = {"rank": rank, "stage": s, "tp": t, "device": str(device), "grads": grads,
                                  "step_s": [time.perf_counter() - start], "sharded": sorted(x.module for x in linears),
                                  "schedule": schedule_name}
        if s == S - 1:
            record["outputs"] = [o.detach().cpu() for o in torch.utils._pytree.tree_leaves(out)
                                 if isinstance(o, torch.Tensor)]
            record["losses"] = [float(x.detach()) for x in losses]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if options.results:
        torch.save(record, Path(options.results) / f"rank{rank}.pt")
    return record


def _grid_environment(plan: Any, stages: int) -> tuple[int, int]:
    """``(rank, world_size)`` from torchrun's variables, checked against the grid's ``stages x 2``."""
    try:
        rank, world = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE"))
    except (KeyError, ValueError):
        raise PipelineRunError(f"RANK / WORLD_SIZE are not set: run the ranks with torchrun: "
                               f"{launch_hint(plan, stages * TP)}") from None
    if world != stages * TP:
        raise PipelineRunError(
            f"{plan.source} has {stages} pipeline stages whose linears split over {TP} devices each: a device mesh "
            f"of {stages} x {TP} = {stages * TP} ranks, but this launch started {world} "
            f"process{'es' if world != 1 else ''} (WORLD_SIZE={world}); nothing was run: start {stages * TP}: "
            f"{launch_hint(plan, stages * TP)}")
    return rank, world


def _step(schedule: Any, s: int, S: int, inputs: Sequence[Any], graphs: StageGraphs, options: RunOptions,
          module: torch.nn.Module) -> tuple[Any, list]:
    losses: list = []
    args = tuple(inputs) if s == 0 else ()
    if not options.training:
        with torch.no_grad():
            return schedule.step(*args), losses
    kwargs: dict[str, Any] = {}
    if s == S - 1:
        meta = [a.meta.get("val") for a in torch.utils._pytree.tree_leaves(graphs.nodes[-1].args[0])
                if isinstance(a, torch.fx.Node)]
        shape = first_output(meta[0] if len(meta) == 1 else tuple(meta)).shape
        M = graphs.plan.pipeline["micro_batches"]
        kwargs = {"target": make_target(options.loss, (shape[0] * M, *shape[1:]), options.seed), "losses": losses}
    return schedule.step(*args, **kwargs), losses
