"""An elementwise op or a norm split by batch in an emitted module: rows out, each computed, rows back.

In: a private GraphModule, the node of an op the plan splits along ``batch`` (``devices = (home,
d1, ...)``, ``fractions``; :mod:`partitioner.solvers.split_batches`), the binding's physical
devices and the module's split record (:data:`backends.torch.splits.SPLIT_ATTR`). Out: the same
module, in place, with the op written as a person would by hand, for each device ``d`` taking rows
``[lo, hi)`` of the split dimension (the batch, or the sequence when the batch has fewer rows than
devices: :func:`~partitioner.solvers.split_batches.cut_dim`)::

    x_d = x[lo:hi].to(d)                   # each tensor input; home slices, the other devices copy
    y_d = op(x_d, ..., weight_d, bias_d)   # a norm's weight and bias: a copy on each device
    y   = cat([y_home, y_d1.to(home), ...], dim)   # the op's node, read by its consumers

A parameter (a norm's weight and bias) is copied whole to each device as its own parameter; the
copies join as one under the original name in ``state_dict``, and their gradients are summed by
:func:`~backends.torch.splits.joined_gradients`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.split_pieces import Pieces
from partitioner.errors import PlanMismatch
from partitioner.solvers.split_batches import BATCH_OPS, NORM_OPS, cut_dim
from partitioner.solvers.splits import shard_sizes

__all__ = ["rewrite_batch_split"]

_aten = torch.ops.aten


def rewrite_batch_split(gm: torch.fx.GraphModule, node: torch.fx.Node, entry: Mapping[str, Any],
                        physical: Mapping[str, torch.device], joined: dict) -> dict[str, str]:
    """Rewrite ``node`` split by batch (module docstring); the logical device of each new node."""
    from backends.torch.split_pieces import replace_with_pieces

    op, devices = node.name, list(entry["devices"])
    base = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    val = node.meta.get("val")
    aten = getattr(node.target, "namespace", None) == "aten"
    if not aten or base not in BATCH_OPS or not isinstance(val, torch.Tensor):
        raise PlanMismatch(f"plan.emit: op {op!r} is split batch in the plan, but the captured graph's {op!r} is "
                           f"{node.target}: only aten elementwise ops and norms ({', '.join(sorted(BATCH_OPS))}) of "
                           f"one known output take batch splits; re-plan (hetpart plan MODEL --split batch)")
    kept = len(node.args[1]) if base in NORM_OPS else 0  # a norm's normalized_shape
    dim = cut_dim(tuple(val.shape), kept, len(devices))
    if dim is None:
        raise PlanMismatch(f"plan.emit: op {op!r} is split batch over {len(devices)} devices, but its output of shape "
                           f"{list(val.shape)} has no batch or sequence dimension with a row for each; re-plan")
    sizes = shard_sizes(val.shape[dim], entry["fractions"])
    pieces = Pieces(gm, node, physical)
    home = devices[0]
    copies: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # each attribute's copy on each device
    for arg in node.all_input_nodes:
        if arg.op == "get_attr":
            tensor = attribute(gm, str(arg.target))
            shared = [n.name for n in gm.graph.nodes if n.op == "get_attr" and n.target == arg.target
                      and n is not arg] + [u.name for u in arg.users if u is not node]
            if shared:
                raise PlanMismatch(f"plan.emit: op {op!r} is split batch, but {arg.target} it reads is read by "
                                   f"{shared[0]!r} too: a batch split copies only tensors its op alone reads; re-plan "
                                   f"without batch splits of {op!r}")
            if tensor.dim() > len(val.shape) - 1 - dim:
                raise PlanMismatch(f"plan.emit: op {op!r} reads {arg.target} of shape {list(tensor.shape)}, which "
                                   f"spans its split dimension {dim}; a batch split copies only parameters that "
                                   f"broadcast over it; re-plan without batch splits of {op!r}")
            names = replace_with_pieces(gm, str(arg.target), tensor, [tensor] * len(devices),
                                        tuple(physical[d] for d in devices), "copy", None, joined)
            copies[arg] = [pieces.attr(name, d) for name, d in zip(names, devices)]
    activations = [a for a in node.all_input_nodes if a not in copies]
    shards, lo = [], 0
    for i, (d, rows) in enumerate(zip(devices, sizes)):
        own: dict[torch.fx.Node, torch.fx.Node] = {}
        for j, x in enumerate(activations):
            part = pieces.call(_aten.slice.Tensor, (x, dim, lo, lo + rows), 0, home, name=f"{op}_rows{i}")
            own[x] = part if i == 0 else pieces.copy(part, home, d, part=j)
        for attr, per_device in copies.items():
            own[attr] = per_device[i]
        args = torch.fx.node.map_arg(node.args, lambda n: own[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: own[n])
        y = pieces.call(node.target, args, i, d, kwargs=kwargs, name=f"{op}_shard{i}")
        shards.append(y if i == 0 else pieces.copy(y, d, home))
        lo += rows
    node.target, node.args, node.kwargs = _aten.cat.default, (shards, dim), {}
    for attr in copies:
        if not attr.users:
            gm.graph.erase_node(attr)
    return pieces.placed
