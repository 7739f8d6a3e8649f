"""Split regions in an emitted module: column shards feed the row split's shards, never rejoined.

In: a private GraphModule about to be placed and the plan (its ``splits`` section and placement).
Out: the regions the plan forms (:func:`plan_regions`, found on the graph *before* the splits are
rewritten, with the rule :func:`~partitioner.solvers.split_regions.formed` that ``evaluate`` prices),
and, once :mod:`backends.torch.splits` has cut every split linear, the same module with each
region joined (:func:`join_regions`), as a person would write Megatron's MLP by hand::

    h0 = gelu(fc1_shard0)                 # on home, over its shard of fc1's output
    h1 = gelu(fc1_shard1)                 # on the other device, over its shard
    y = fc2_shard0(h0) + fc2_shard1(h1).to(home)

Each interior op is replicated per shard (``<op>_shard<j>``, on the shard's device, strict-devices site
``<op>.shard<j>``; a reshape's size at the cut dimension, a head count, set to the shard's), each
col's shard outputs feed them directly (the cols' concatenation and its copy
back are gone), and the row's shard ``j`` reads the last interior op's shard ``j`` (its input slices
and copy out are gone). A tensor the interior reads from outside the region (rotary tables, a mask)
is read by the home's shard as it is and copied home -> each other device once
(``<op>_to_<row>_shard<j>``, the plan's ``split`` transfer of ``<op>``). Every part of a region is
issued right before the row op (``meta["hetpart_anchor"]``), which stays the sum of the partials at
home. A plan whose members
disagree (other devices, fractions or axes, an interior op elsewhere) forms no region: its splits
are emitted one by one, as they are priced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from cost_models.precision import op_base_name
from partitioner.solvers.split_regions import Region, Step, formed, region_candidates
from partitioner.solvers.splits import shard_sizes

__all__ = ["ANCHOR_META", "REGION_SITES_ATTR", "cut_literal", "fx_steps", "join_regions", "plan_regions"]

#: node meta: the op a split or region part is issued right before
ANCHOR_META = "hetpart_anchor"
#: module attribute: each region interior shard's strict-devices site -> its logical device
REGION_SITES_ATTR = "_hetpart_region_sites"


def fx_steps(gm: torch.fx.GraphModule) -> dict[str, Step]:
    """Every ``call_function`` node of ``gm`` as a :class:`~partitioner.solvers.split_regions.Step`
    (graph inputs and the graph output read as ``""``, attributes as parameters), in program order."""
    out = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        ins = node.all_input_nodes
        first: dict[str, tuple[int, ...]] = {}
        for a in ins:
            if a.op != "get_attr":
                shaped = a.meta.get("val", a.meta.get("tensor_meta"))
                first.setdefault(a.name if a.op == "call_function" else "",
                                 tuple(shaped.shape) if hasattr(shaped, "shape") else ())
        readers = tuple(dict.fromkeys(u.name if u.op == "call_function" else "" for u in node.users))
        val = node.meta.get("val", node.meta.get("tensor_meta"))
        shape = tuple(val.shape) if hasattr(val, "shape") else ()
        kind = op_base_name(str(node.target)) if isinstance(node.target, torch._ops.OpOverload) else ""
        out[node.name] = Step(kind, tuple(first), readers, any(a.op == "get_attr" for a in ins), shape,
                              tuple(first.values()))
    return out


def _widths(gm: torch.fx.GraphModule, plan: Any) -> dict[str, tuple[int, int]]:
    """Each split linear's weight shape ``(out, in)``."""
    nodes = {n.name: n for n in gm.graph.nodes}
    out = {}
    for op in plan.splits:
        node = nodes.get(op)
        if node is not None and node.op == "call_function" and len(node.args) >= 2 \
                and getattr(node.args[1], "op", None) == "get_attr":
            weight = attribute(gm, str(node.args[1].target))
            if weight.dim() == 2:
                out[op] = tuple(weight.shape)
    return out


def plan_regions(gm: torch.fx.GraphModule, plan: Any) -> tuple[Region, ...]:
    """The regions ``plan`` forms in ``gm`` (before its splits are rewritten)."""
    if not plan.splits:
        return ()
    widths = _widths(gm, plan)
    candidates = region_candidates(fx_steps(gm), widths)

    def split_of(op: str) -> tuple[str, tuple, tuple] | None:
        e = plan.splits.get(op)
        return (e["axis"], tuple(e["devices"]), tuple(e["fractions"])) if e is not None and "fractions" in e else None

    def device_of(op: str) -> str:
        return "" if op in plan.splits or op in plan.weights else plan.placement.get(op, "")

    return formed(candidates, split_of, device_of, widths)


def join_regions(gm: torch.fx.GraphModule, regions: tuple[Region, ...], plan: Any,
                 placed: dict[str, str], physical: Mapping[str, torch.device]) -> None:
    """Join each of ``regions`` in ``gm`` (its splits already cut by :mod:`backends.torch.splits`),
    in place; ``placed`` (node -> logical device) gains the interior shards and the outside tensors'
    copies and loses what is gone; ``physical``: each logical device's torch device."""
    graph = gm.graph
    sites: dict[str, str] = dict(getattr(gm, REGION_SITES_ATTR, {}))
    for region in regions:
        nodes = {n.name: n for n in graph.nodes}
        devices = tuple(plan.splits[region.row]["devices"])
        shards: dict[str, list[torch.fx.Node]] = {c: [nodes[f"{c}_shard{j}"] for j in range(len(devices))]
                                                  for c in region.cols}
        row_input = nodes[region.row].meta["hetpart_region_input"]
        sizes = shard_sizes(region.width, plan.splits[region.row]["fractions"])
        for o in region.outside:  # each other device reads its own copy, made from home's
            shards[o] = [nodes[o]]
            for j, device in enumerate(devices[1:], 1):
                with graph.inserting_after(nodes[o]):
                    copy = graph.create_node("call_method", "to", (nodes[o], physical[device]), {},
                                             name=f"{o}_to_{region.row}_shard{j}")
                copy.meta.update({"hetpart_device": device, "hetpart_split": {"tensor": o, "kind": "split"},
                                  ANCHOR_META: region.row})
                placed[copy.name] = devices[0]  # read on home, lives on the shard's device
                shards[o].append(copy)
        for e, (dim, unit) in zip(region.interior, region.layouts):
            node = nodes[e]
            shards[e] = []
            for j, device in enumerate(devices):
                def local(a: Any, j: int = j) -> Any:
                    return shards[a.name][j] if isinstance(a, torch.fx.Node) and a.name in shards else a
                args = _local_shape(node, dim, sizes[j] // unit)
                with graph.inserting_before(node):
                    clone = graph.create_node("call_function", node.target, torch.fx.map_arg(args, local),
                                              torch.fx.map_arg(node.kwargs, local), name=f"{e}_shard{j}")
                clone.meta.update({"hetpart_device": device, "hetpart_split": {"op": f"{e}.shard{j}"}})
                placed[clone.name] = device
                sites[f"{e}.shard{j}"] = device
                shards[e].append(clone)
        for j in range(len(devices)):  # the row's shard j reads the region's shard j
            row_shard = nodes[f"{region.row}_shard{j}"]
            row_shard.args = (shards[row_input][j], *row_shard.args[1:])
        members = set(region.members)
        for o in region.outside:
            del shards[o]
        for node in reversed(list(graph.nodes)):
            split = node.meta.get("hetpart_split", {})
            owner = split.get("op", split.get("tensor", "")).split(".shard")[0]
            if node.name in members or owner in members:
                if not node.users and node.name != region.row and node.op in ("call_function", "call_method"):
                    graph.erase_node(node)
                    placed.pop(node.name, None)
                elif node.name != region.row:
                    node.meta[ANCHOR_META] = region.row
    setattr(gm, REGION_SITES_ATTR, sites)


def cut_literal(node: torch.fx.Node, dim: int) -> int | None:
    """The size a reshape node (``unflatten``, ``view``, ``reshape``) or an ``expand`` writes at its
    output's cut dim ``dim`` (a head count, or ``-1``); None for any other op (it writes no size there)."""
    kind = op_base_name(str(node.target))
    if kind == "unflatten":
        ndim = node.args[0].meta["val"].dim()
        return int(node.args[2][dim - node.args[1] % ndim])
    if kind in ("view", "reshape", "_unsafe_view", "expand"):
        return int(node.args[1][dim])
    return None


def _local_shape(node: torch.fx.Node, dim: int, local: int) -> tuple:
    """``node``'s args for one shard: a reshape's or expand's size at the cut dim ``dim`` (its
    output's) set to the shard's ``local`` size (heads, key/value groups), unless it is ``-1``; every
    other op's args as they are."""
    kind = op_base_name(str(node.target))
    args = list(node.args)
    if cut_literal(node, dim) in (None, -1):
        return tuple(args)
    if kind == "unflatten":
        ndim = node.args[0].meta["val"].dim()
        sizes = list(args[2])
        sizes[dim - args[1] % ndim] = local
        args[2] = sizes
    else:
        shape = list(args[1])
        shape[dim] = local
        args[1] = shape
    return tuple(args)


def remember_inputs(gm: torch.fx.GraphModule, regions: tuple[Region, ...]) -> None:
    """Note each region row's input node name before the splits rewrite the row (its slices read it)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    for region in regions:
        row = nodes[region.row]
        row.meta["hetpart_region_input"] = row.args[0].name


def region_sites(module: torch.nn.Module) -> Mapping[str, str]:
    """Each region interior shard's strict-devices site -> its logical device (none: empty)."""
    return dict(getattr(module, REGION_SITES_ATTR, {}))
