"""Split linears in an emitted module: each shard on its device, the copies and the rejoin.

In: a private GraphModule about to be placed (:func:`backends.torch.module.place_module`), the plan's
``splits`` section (:mod:`partitioner.plan.splits`) and the binding's physical devices. Out: the same
module, in place, with each split ``aten.linear(x, W, b)`` (``devices = (home, other)``) rewritten as
a person would write it by hand::

    x_other = x.to(other)                     # cols: the whole input; rows: x[..., k:]
    y_other = aten.linear(x_other, W_other, b_other)  # issued first where ``other`` is not the host
    y_home  = aten.linear(x, W_home, b_home)          # (so asynchronous accelerator work overlaps)
    y = aten.cat([y_home, y_other.to(home)], -1)      # rows: y_home + y_other.to(home)

``W_home`` and ``W_other`` (the first ``k`` rows of ``W`` and the rest for ``cols``, its first ``k``
columns and the rest for ``rows``, ``k`` from :func:`~partitioner.solvers.splits.shard_sizes`) are
new parameters created on their devices, never the whole weight on one of them; for ``cols`` the
bias is cut alike, for ``rows`` it stays whole on ``home``. The op's node keeps its name and becomes
the rejoin, so its consumers and the plan's placement are unchanged. Each new node carries
``meta["hetpart_split"]``: the strict-devices site it runs (``"<op>.shard0"`` on home,
``"<op>.shard1"`` on other, or the split copy of ``<op>``).

The module's ``state_dict`` keeps the original's keys (each shard pair joined on the host) and its
``load_state_dict`` takes them (cut into the shards): :data:`SPLIT_ATTR` maps each original tensor
name to its shards. :func:`joined_gradients` gives each split parameter's gradient under its
original name (compare with the original model's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from partitioner.errors import PlanMismatch
from partitioner.solvers.splits import shard_sizes

__all__ = ["SPLIT_ATTR", "joined_gradients", "planned_shards", "replace_with_pieces", "shard_site", "split_linears"]

#: module attribute: original tensor name -> (axis dim or None for a whole tensor, (shard names...))
SPLIT_ATTR = "_hetpart_splits"

_LINEARS = (torch.ops.aten.linear.default,)


def shard_site(op: str, index: int) -> str:
    """The strict-devices name of shard ``index`` of split op ``op``."""
    return f"{op}.shard{index}"


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
    if not hasattr(gm, "_hetpart_state_order"):  # the original's key order, which state_dict keeps
        gm._hetpart_state_order = list(gm.state_dict(keep_vars=True))
    placed: dict[str, str] = {}
    joined: dict[str, tuple[int | None, tuple[str, ...]]] = dict(getattr(gm, SPLIT_ATTR, {}))
    for op, entry in plan.splits.items():
        if entry["axis"] in ("time", "experts"):  # backends/torch/chunked.py, expert_chunks.py, expert_devices.py
            continue
        node = nodes.get(op)
        if node is None or node.op != "call_function" or node.target not in _LINEARS:
            raise PlanMismatch(f"plan.emit: op {op!r} is split {entry['axis']} in the plan, but the captured graph's "
                               f"{op!r} is {getattr(node, 'target', 'missing')}: only aten linear ops take splits; "
                               f"re-plan (hetpart plan MODEL --split)")
        placed.update(_rewrite(gm, node, entry, physical, joined))
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
    home, other = entry["devices"]
    x, w_node, b_node = (list(node.args) + [None])[:3]
    b_node = node.kwargs.get("bias", b_node)
    weight = attribute(gm, str(w_node.target))
    out_f, in_f = weight.shape
    k, _ = shard_sizes(out_f if axis == "cols" else in_f, entry["fractions"])
    dim = 0 if axis == "cols" else 1
    w_names = _replace(gm, str(w_node.target), weight, dim, k, (physical[home], physical[other]), joined)
    b_names: tuple[str | None, str | None] = (None, None)
    if b_node is not None:
        bias = attribute(gm, str(b_node.target))
        if axis == "cols":
            b_names = _replace(gm, str(b_node.target), bias, 0, k, (physical[home], physical[other]), joined)
        else:
            b_names = (_replace(gm, str(b_node.target), bias, None, k, (physical[home],), joined)[0], None)
    placed: dict[str, str] = {}

    def make(kind: str, target: Any, args: tuple, device: str, site: dict, name: str) -> torch.fx.Node:
        with graph.inserting_before(node):
            n = graph.create_node(kind, target, args, {}, name=name)
        n.meta["hetpart_device"] = device
        n.meta["hetpart_split"] = site
        placed[n.name] = device
        return n

    def attr(name: str | None, device: str) -> torch.fx.Node | None:
        if name is None:
            return None
        with graph.inserting_before(node):
            n = graph.get_attr(name)
        n.meta["hetpart_device"] = device
        return n

    own, away = {"op": shard_site(op, 0)}, {"op": shard_site(op, 1)}
    copy = {"tensor": op, "kind": "split"}
    if axis == "cols":
        x_home, x_part = x, x
    else:
        x_home = make("call_function", torch.ops.aten.slice.Tensor, (x, -1, 0, k), home, own, f"{op}_in0")
        x_part = make("call_function", torch.ops.aten.slice.Tensor, (x, -1, k, None), home, own, f"{op}_in1")
    x_other = make("call_method", "to", (x_part, physical[other]), home, copy, f"{op}_to_{_word(other)}")
    x_other.meta["hetpart_device"] = other  # its input is read on home; the copy lives on other
    w0, w1 = attr(w_names[0], home), attr(w_names[1], other)
    b0, b1 = attr(b_names[0], home), attr(b_names[1], other)
    shard0 = ("call_function", torch.ops.aten.linear.default, (x_home, w0, b0), home, own, f"{op}_shard0")
    shard1 = ("call_function", torch.ops.aten.linear.default, (x_other, w1, b1), other, away, f"{op}_shard1")
    on_host = physical[other].type == "cpu" and physical[home].type != "cpu"
    first, second = (shard0, shard1) if on_host else (shard1, shard0)  # the accelerator's shard goes out first
    made = {spec[-1]: make(*spec) for spec in (first, second)}
    y0, y1 = made[f"{op}_shard0"], made[f"{op}_shard1"]
    back = make("call_method", "to", (y1, physical[home]), other, copy, f"{op}_to_{_word(home)}")
    back.meta["hetpart_device"] = home  # the value lives on home once copied
    if axis == "cols":
        node.target, node.args, node.kwargs = torch.ops.aten.cat.default, ([y0, back], -1), {}
    else:
        node.target, node.args, node.kwargs = torch.ops.aten.add.Tensor, (y0, back), {}
    for n in (w_node, b_node):
        if n is not None and not n.users:
            graph.erase_node(n)
    return placed


def _word(device: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in str(device))


def _replace(gm: torch.fx.GraphModule, target: str, tensor: torch.Tensor, dim: int | None, k: int,
             devices: tuple[torch.device, ...], joined: dict) -> tuple[str, ...]:
    """Put ``tensor``'s shards (cut at ``k`` along ``dim``; None: whole) on ``devices`` as new
    parameters beside it, remove it, and remember how to join them."""
    pieces = [tensor] if dim is None else list(torch.split(tensor, [k, tensor.shape[dim] - k], dim=dim))
    return replace_with_pieces(gm, target, tensor, pieces, devices, "split", dim, joined)


def replace_with_pieces(gm: torch.fx.GraphModule, target: str, tensor: torch.Tensor, pieces: list[torch.Tensor],
                        devices: tuple[torch.device, ...], word: str, dim: int | None, joined: dict) -> tuple[str, ...]:
    """Register each of ``pieces`` (cut from ``tensor``, a parameter or buffer at ``target``) on its
    device beside it as ``<name>_<word><i>`` (a parameter when ``tensor`` is one, with its
    ``requires_grad``), remove ``tensor``, and record in ``joined`` the dim they join along and their
    names (:data:`SPLIT_ATTR`). Returns the new attributes' names."""
    owner, _, name = target.rpartition(".")
    module = gm.get_submodule(owner) if owner else gm
    names = []
    for i, (piece, device) in enumerate(zip(pieces, devices)):
        local = f"{name}_{word}{i}"
        value = piece.detach().to(device).clone()
        if isinstance(tensor, torch.nn.Parameter):
            module.register_parameter(local, torch.nn.Parameter(value, requires_grad=tensor.requires_grad))
        else:
            module.register_buffer(local, value)
        names.append(f"{owner}.{local}" if owner else local)
    delattr(module, name)
    joined[target] = (dim, tuple(names))
    return tuple(names)


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
        if dim is None:
            state[prefix + names[0]] = whole
            continue
        sizes = [attribute(module, n).shape[dim] for n in names]
        for n, piece in zip(names, torch.split(whole, sizes, dim=dim)):
            state[prefix + n] = piece


def joined_gradients(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Each parameter's gradient by its original name: a split parameter's shards' gradients joined
    on the host, every other parameter's as it is.

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
            out[target] = grads[0].to("cpu") if dim is None else torch.cat([g.to("cpu") for g in grads], dim=dim)
    return out
