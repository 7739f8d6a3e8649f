"""Split linears in an emitted module: each shard on its device, the copies and the rejoin.

In: a private GraphModule about to be placed (:func:`backends.torch.module.place_module`), the plan's
``splits`` section (:mod:`partitioner.plan.splits`) and the binding's physical devices. Out: the same
module, in place, with each split ``aten.linear(x, W, b)`` (``devices = (home, d1, ..., dn)``)
rewritten as a person would write it by hand (two devices shown; each further device adds its
copy in, shard and copy back)::

    x_other = x.to(other)                     # cols: the whole input; rows: its slice of x[..., :]
    y_other = aten.linear(x_other, W_other, b_other)  # issued first where ``other`` is not the host
    y_home  = aten.linear(x, W_home, b_home)          # (so asynchronous accelerator work overlaps)
    y = aten.cat([y_home, y_other.to(home)], -1)      # rows: y_home + y_other.to(home)

``W_home``, ``W_other``, ... (blocks of ``W``'s rows for ``cols``, of its columns for ``rows``, the
sizes from :func:`~partitioner.solvers.splits.shard_sizes`) are new parameters created on their
devices, never the whole weight on one of them; for ``cols`` the bias is cut alike, for ``rows`` it
stays whole on ``home``. The op's node keeps its name and becomes the rejoin, so its consumers and
the plan's placement are unchanged. Each new node carries ``meta["hetpart_split"]``: the
strict-devices site it runs (``"<op>.shard<i>"`` on ``devices[i]``, or the split copy of ``<op>``).
Column splits feeding a row split over the same devices and fractions form a region
(:mod:`backends.torch.split_regions`): their shards are not rejoined.

The module's ``state_dict`` keeps the original's keys (each shard pair joined on the host) and its
``load_state_dict`` takes them (cut into the shards): :data:`SPLIT_ATTR` maps each original tensor
name to its shards (a tensor copied whole to several devices, a batch-split norm's weight: its
copies, joined as the first and their gradients summed). An embedding split by table rows and an
elementwise op or norm split by batch are rewritten by :mod:`backends.torch.split_tables` and
:mod:`backends.torch.split_batches`. :func:`joined_gradients` gives each split parameter's gradient under its
original name (compare with the original model's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.split_pieces import SPLIT_ATTR, device_word, joined_pieces, replace_with_pieces, shard_site
from backends.torch.split_regions import join_regions, plan_regions, remember_inputs
from partitioner.errors import PlanMismatch
from partitioner.solvers.split_axes import OP_AXES
from partitioner.solvers.splits import shard_sizes

__all__ = ["SPLIT_ATTR", "joined_gradients", "planned_shards", "replace_with_pieces", "shard_site", "split_linears"]

_LINEARS = (torch.ops.aten.linear.default,)



def planned_shards(plan: Any) -> dict[str, str]:
    """Each shard's site -> the logical device it runs on (for :class:`~backends.strict_devices.StrictDevices`)."""
    return {shard_site(op, i): d for op, e in plan.splits.items() for i, d in enumerate(e["devices"])}


def split_linears(gm: torch.fx.GraphModule, plan: Any,
                  physical: Mapping[str, torch.device]) -> tuple[dict[str, str], dict[str, str]]:
    """Rewrite every split op of ``plan`` in ``gm`` (see the module docstring). Returns the logical
    device each new node runs on (its inputs are copied there) and each new attribute's logical
    home, for the transfers pass."""
    if not plan.splits:
        return {}, {}
    nodes = {n.name: n for n in gm.graph.nodes}
    placed: dict[str, str] = {}
    joined: dict[str, tuple[int | None, tuple[str, ...]]] = joined_pieces(gm)
    regions = plan_regions(gm, plan)  # found before the rewrite, by the rule evaluate prices
    remember_inputs(gm, regions)
    for op, entry in plan.splits.items():
        if entry["axis"] in ("time", "experts"):  # backends/torch/chunked.py, expert_chunks.py, expert_devices.py
            continue
        if entry["axis"] in OP_AXES:  # an embedding by table rows, an elementwise op or norm by batch
            placed.update(rewrite_op_split(gm, nodes.get(op), op, entry, physical, joined))
            continue
        node = nodes.get(op)
        if node is None or node.op != "call_function" or node.target not in _LINEARS:
            raise PlanMismatch(f"plan.emit: op {op!r} is split {entry['axis']} in the plan, but the captured graph's "
                               f"{op!r} is {getattr(node, 'target', 'missing')}: only aten linear ops take splits; "
                               f"re-plan (hetpart plan MODEL --split)")
        placed.update(_rewrite(gm, node, entry, physical, joined))
    join_regions(gm, regions, plan, placed, physical)  # column shards into row shards, nothing rejoined between
    setattr(gm, SPLIT_ATTR, joined)
    if not getattr(gm, "_hetpart_split_hooks", False):
        gm._register_state_dict_hook(_join_state)
        gm._register_load_state_dict_pre_hook(_cut_state, with_module=True)
        gm._hetpart_split_hooks = True
    gm.graph.lint()
    homes = {n.target: n.meta["hetpart_device"] for n in gm.graph.nodes
             if n.op == "get_attr" and "hetpart_device" in n.meta}
    return placed, homes


def _rewrite(gm: torch.fx.GraphModule, node: torch.fx.Node, entry: Mapping[str, Any],
             physical: Mapping[str, torch.device], joined: dict) -> dict[str, str]:
    graph = gm.graph
    op, axis = node.name, entry["axis"]
    devices = tuple(entry["devices"])
    home, n = devices[0], len(devices)
    x, w_node, b_node = (list(node.args) + [None])[:3]
    b_node = node.kwargs.get("bias", b_node)
    weight = attribute(gm, str(w_node.target))
    out_f, in_f = weight.shape
    sizes = shard_sizes(out_f if axis == "cols" else in_f, entry["fractions"])
    dim = 0 if axis == "cols" else 1
    where = tuple(physical[d] for d in devices)
    w_names = _replace(gm, str(w_node.target), weight, dim, sizes, where, joined)
    b_names: tuple[str | None, ...] = (None,) * n
    if b_node is not None:
        bias = attribute(gm, str(b_node.target))
        if axis == "cols":
            b_names = _replace(gm, str(b_node.target), bias, 0, sizes, where, joined)
        else:
            b_names = (_replace(gm, str(b_node.target), bias, None, sizes, where[:1], joined)[0],) + (None,) * (n - 1)
    placed: dict[str, str] = {}

    def make(kind: str, target: Any, args: tuple, device: str, site: dict, name: str) -> torch.fx.Node:
        with graph.inserting_before(node):
            made = graph.create_node(kind, target, args, {}, name=name)
        made.meta["hetpart_device"] = device
        made.meta["hetpart_split"] = site
        placed[made.name] = device
        return made

    def attr(name: str | None, device: str) -> torch.fx.Node | None:
        if name is None:
            return None
        with graph.inserting_before(node):
            made = graph.get_attr(name)
        made.meta["hetpart_device"] = device
        return made

    sites = [{"op": shard_site(op, i)} for i in range(n)]
    copy = {"tensor": op, "kind": "split"}
    if axis == "cols":
        parts = [x] * n
    else:
        cuts = [sum(sizes[:i]) for i in range(n + 1)]
        parts = [make("call_function", torch.ops.aten.slice.Tensor, (x, -1, cuts[i], cuts[i + 1] if i < n - 1 else None),
                      home, sites[0], f"{op}_in{i}") for i in range(n)]
    inputs = [parts[0]]
    for d, part in zip(devices[1:], parts[1:]):
        moved = make("call_method", "to", (part, physical[d]), home, copy, f"{op}_to_{device_word(d)}")
        moved.meta["hetpart_device"] = d  # its input is read on home; the copy lives on d
        inputs.append(moved)
    specs = [("call_function", torch.ops.aten.linear.default,
              (inputs[i], attr(w_names[i], d), attr(b_names[i], d)), d, sites[i], f"{op}_shard{i}")
             for i, d in enumerate(devices)]
    # the accelerators' shards go out first (asynchronous), a host shard of an accelerator-homed op after home's
    late = [i for i in range(1, n) if physical[devices[i]].type == "cpu" and physical[home].type != "cpu"]
    order = [i for i in range(1, n) if i not in late] + [0] + late
    shards = {i: make(*specs[i]) for i in order}
    pieces = [shards[0]]
    for i, d in enumerate(devices[1:], 1):
        name = f"{op}_to_{device_word(home)}" if n == 2 else f"{op}_shard{i}_to_{device_word(home)}"
        back = make("call_method", "to", (shards[i], physical[home]), d, copy, name)
        back.meta["hetpart_device"] = home  # the value lives on home once copied
        pieces.append(back)
    if axis == "cols":
        node.target, node.args, node.kwargs = torch.ops.aten.cat.default, (pieces, -1), {}
    else:
        total = pieces[0]
        for i, piece in enumerate(pieces[1:-1], 1):
            total = make("call_function", torch.ops.aten.add.Tensor, (total, piece), home, sites[0], f"{op}_sum{i}")
        node.target, node.args, node.kwargs = torch.ops.aten.add.Tensor, (total, pieces[-1]), {}
    for used in (w_node, b_node):
        if used is not None and not used.users:
            graph.erase_node(used)
    return placed


def rewrite_op_split(gm: torch.fx.GraphModule, node: torch.fx.Node | None, op: str, entry: Mapping[str, Any],
                     physical: Mapping[str, torch.device], joined: dict) -> dict[str, str]:
    """Rewrite ``node`` (op ``op`` of the plan) split along ``table`` or ``batch``; the logical
    device of each new node."""
    from backends.torch.split_batches import rewrite_batch_split
    from backends.torch.split_tables import rewrite_table_split

    if node is None or node.op != "call_function":
        raise PlanMismatch(f"plan.emit: op {op!r} is split {entry['axis']} in the plan, but the captured graph has no "
                           f"call {op!r}; re-plan (hetpart plan MODEL --split {entry['axis']})")
    rewrite = rewrite_table_split if entry["axis"] == "table" else rewrite_batch_split
    return rewrite(gm, node, entry, physical, joined)



def _replace(gm: torch.fx.GraphModule, target: str, tensor: torch.Tensor, dim: int | None, sizes: tuple[int, ...],
             devices: tuple[torch.device, ...], joined: dict) -> tuple[str, ...]:
    """Put ``tensor``'s shards (cut into ``sizes`` along ``dim``; None: whole) on ``devices`` as new
    parameters beside it, remove it, and remember how to join them."""
    pieces = [tensor] if dim is None else list(torch.split(tensor, list(sizes), dim=dim))
    return replace_with_pieces(gm, target, tensor, pieces, devices, "split", dim, joined)



def _join_state(module: torch.nn.Module, state: dict, prefix: str, _meta: Any) -> None:
    """state_dict hook: the shards of each split tensor joined under its original name (on the host)."""
    for target, (dim, names) in getattr(module, SPLIT_ATTR, {}).items():
        keys = [prefix + n for n in names]
        if not all(k in state for k in keys):
            continue
        pieces = [state.pop(k) for k in keys]
        state[prefix + target] = pieces[0].to("cpu") if dim is None else \
            torch.cat([p.detach().to("cpu") for p in pieces], dim=dim)
    order = {prefix + k: i for i, k in enumerate(getattr(module, "_hetpart_state_order", ()))}
    items = sorted(state.items(), key=lambda kv: order.get(kv[0], len(order)))
    state.clear()
    state.update(items)


def _cut_state(module: torch.nn.Module, state: dict, prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook: each split tensor's whole value cut into its shards' keys."""
    for target, (dim, names) in getattr(module, SPLIT_ATTR, {}).items():
        key = prefix + target
        if key not in state:
            continue
        whole = state.pop(key)
        if dim is None:  # whole copies, one on each device
            state.update({prefix + n: whole for n in names})
            continue
        sizes = [attribute(module, n).shape[dim] for n in names]
        for n, piece in zip(names, torch.split(whole, sizes, dim=dim)):
            state[prefix + n] = piece


def joined_gradients(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Each parameter's gradient by its original name: a split parameter's shards' gradients joined
    on the host (whole copies' summed), every other parameter's as it is.

    Example:
        >>> emitted(*inputs).sum().backward()                               # doctest: +SKIP
        >>> joined_gradients(emitted)["blocks.0.ff1.weight"].shape          # doctest: +SKIP
    """
    out: dict[str, torch.Tensor | None] = {}
    shards = {n for _, names in getattr(module, SPLIT_ATTR, {}).values() for n in names}
    for name, p in module.named_parameters():
        if name not in shards:
            out[name] = p.grad
    for target, (dim, names) in getattr(module, SPLIT_ATTR, {}).items():
        grads = [attribute(module, n).grad for n in names]
        if any(g is None for g in grads):
            out[target] = None
        else:
            out[target] = sum(g.to("cpu") for g in grads) if dim is None else \
                torch.cat([g.to("cpu") for g in grads], dim=dim)
    return out
