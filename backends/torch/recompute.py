"""Recompute: the ops a training plan recomputes run under ``torch.utils.checkpoint``.

In: a placed graph module (:func:`backends.torch.module.place_module`: ops in issue order, copies
and streamed fetches inserted) and its plan's ``training_state["recompute"]`` list
(:mod:`partitioner.plan.training_state`). Out: the module with every maximal run of recomputed
ops (consecutive in issue order, on one logical device, with the copies and fetches between
them) moved into a child graph module ``_hetpart_recompute_<i>`` and called as
``torch.utils.checkpoint.checkpoint(region, *inputs, use_reentrant=False)``: autograd saves the
region's inputs only, and backward runs the region again to get what its ops would have saved.
``preserve_rng_state`` keeps its default (true), so a dropout recomputed in backward draws the
mask it drew in forward. A streamed weight fetched inside a region is fetched again by the
recomputation.

:func:`region_runs` is the grouping alone, shared with the generated file
(:mod:`backends.torch.source`), which writes each run as a nested function of ``forward``.

Refused: an op that writes a tensor in place, or a normalization updating running statistics in
training (recomputing either would write twice), and a module called whole (a symbolic trace's ``call_module``: its parameters would be registered twice).
Recompute needs autograd: under ``torch.no_grad`` a region simply runs (checkpoint saves nothing
then, as nothing would be saved anyway). A plan with recomputed ops is a training plan: an
inference plan with a ``training_state`` section is refused when the plan is made
(:func:`partitioner.plan.training_state.check_training_state`).

Example:
    >>> checkpoint_recomputed(gm, plan)   # doctest: +SKIP
    [['linear', 'gelu']]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.fx
import torch.utils.checkpoint

from partitioner.errors import HetpartError

__all__ = ["REGION_PREFIX", "check_recomputable", "checkpoint_recomputed", "recompute_regions", "recomputed_ops",
           "region_runs"]

REGION_PREFIX = "_hetpart_recompute_"


def recomputed_ops(plan: Any) -> frozenset[str]:
    """The ops whose activations backward recomputes (empty without a ``training_state`` section)."""
    section = plan.training_state
    return frozenset(section.get("recompute", ())) if section else frozenset()


def region_runs(nodes: Iterable[Any], placement: Mapping[str, str], recompute: frozenset[str],
                name: Callable[[Any], str | None]) -> list[list[Any]]:
    """Maximal runs of recomputed ops, in the given (issue) order: ``name(node)`` is the plan op a
    node runs, None for a copy or fetch the emitter added (it joins the run of the op after it, so
    a weight fetched for a recomputed op is fetched again by the recomputation), "" for a node
    that ends any run (an input, the output); a run ends at an op not recomputed, or at a
    recomputed op on another device.

    Example:
        >>> region_runs(["a", "to", "b", "c", "to_2", "d"], {"a": "cuda:0", "b": "cuda:0", "c": "cpu", "d": "cpu"},
        ...             frozenset({"a", "b", "d"}), lambda n: None if n.startswith("to") else n)
        [['a', 'to', 'b'], ['to_2', 'd']]
    """
    runs: list[list[Any]] = []
    current: list[Any] = []
    device: str | None = None
    pending: list[Any] = []
    for node in nodes:
        op = name(node)
        if op is None:
            pending.append(node)
            continue
        if op in recompute and current and placement.get(op) == device:
            current += [*pending, node]
        elif op in recompute:
            current = [*pending, node]
            runs.append(current)
            device = placement.get(op)
        else:
            current = []
        pending = []
    return runs


def check_recomputable(node: torch.fx.Node) -> None:
    """Refuse an op backward cannot run a second time (see the module docstring)."""
    if node.op == "call_module":
        raise HetpartError(f"cannot recompute {node.name}: it calls module {node.target} whole (symbolic_trace "
                           f"capture), so its checkpointed region would own its parameters twice; re-plan "
                           f"with capture 'export' or drop it from training_state.recompute")
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        raise HetpartError(f"cannot recompute {node.name} ({node.target}): it writes a tensor in place, and "
                           f"backward's recomputation would write it again; drop it from training_state.recompute")
    if schema is not None and _updates_statistics(node, [a.name for a in schema.arguments]):
        raise HetpartError(f"cannot recompute {node.name} ({node.target}): in training it updates running "
                           f"statistics, and backward's recomputation would update them again; drop it from "
                           f"training_state.recompute")


def _updates_statistics(node: torch.fx.Node, names: list[str]) -> bool:
    """A normalization in training mode with running statistics (batch norm, instance norm)."""
    flag = next((n for n in ("training", "use_input_stats") if n in names), None)
    if flag is None or "running_mean" not in names:
        return False
    def value(name: str) -> Any:
        i = names.index(name)
        return node.args[i] if i < len(node.args) else node.kwargs.get(name)
    return value(flag) is True and isinstance(value("running_mean"), torch.fx.Node)


def checkpoint_recomputed(gm: torch.fx.GraphModule, plan: Any) -> list[list[str]]:
    """Put each run of recomputed ops of ``gm`` under a checkpoint, in place (see the module
    docstring); returns the plan ops of each run.

    Raises:
        HetpartError: a recomputed op that is not in the graph, writes in place, or is a module
            called whole.
    """
    recompute = recomputed_ops(plan)
    if not recompute:
        return []
    graph = gm.graph
    present = {n.name for n in graph.nodes}
    missing = sorted(recompute - present)
    if missing:
        raise HetpartError(f"training_state.recompute names {', '.join(missing[:5])}, not ops of the captured graph: "
                           f"the plan is not this model's")

    def op_of(node: torch.fx.Node) -> str | None:
        if node.name in plan.placement:
            return node.name
        return None if node.op in ("call_method", "call_function") else ""  # "": ends a run (output)

    runs = region_runs(graph.nodes, plan.placement, recompute, op_of)
    done = []
    for i, run in enumerate(runs):
        for node in run:
            if node.name in recompute:
                check_recomputable(node)
        _checkpoint_region(gm, run, f"{REGION_PREFIX}{i}")
        done.append([n.name for n in run if n.name in recompute])
    graph.lint()
    gm.recompile()
    return done


def _checkpoint_region(gm: torch.fx.GraphModule, run: list[torch.fx.Node], attr: str) -> None:
    """Move the contiguous nodes ``run`` into a child graph module called through a checkpoint."""
    inside = set(run)
    sub = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    for node in run:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in env:
                env[arg] = sub.placeholder(arg.name)
                env[arg].meta = {**arg.meta, "hetpart_value": _plan_name(arg)}  # what strict devices call it
                inputs.append(arg)
        env[node] = sub.node_copy(node, lambda n: env[n])
    outputs = [n for n in run if any(u not in inside for u in n.users)]
    sub.output(tuple(env[n] for n in outputs))
    region = torch.fx.GraphModule(torch.nn.Module(), sub, class_name="RecomputedRegion")
    gm.add_submodule(attr, region)
    graph = gm.graph
    with graph.inserting_before(run[0]):
        fn = graph.get_attr(attr)
        call = graph.call_function(torch.utils.checkpoint.checkpoint, (fn, *inputs), {"use_reentrant": False})
        items = [graph.call_function(operator.getitem, (call, i)) for i in range(len(outputs))]
    for node, item in zip(outputs, items):
        item.meta = {**node.meta, "hetpart_value": node.meta.get("hetpart_value", node.name)}  # its name in the plan
        node.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
    for node in reversed(run):
        graph.erase_node(node)


def _plan_name(node: torch.fx.Node) -> str:
    """The plan's name of ``node``'s value (as :func:`backends.torch.strict.fx_sites` names copies)."""
    if node.op == "get_attr":
        return str(node.target)
    return node.meta.get("hetpart_op", node.meta.get("hetpart_value", node.name))


def recompute_regions(module: torch.nn.Module) -> Iterator[torch.fx.GraphModule]:
    """The checkpointed regions of an emitted module (for strict devices: their code is watched too)."""
    for name, child in module.named_children():
        if name.startswith(REGION_PREFIX) and isinstance(child, torch.fx.GraphModule):
            yield child
