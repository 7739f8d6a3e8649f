"""Experts splits in an emitted module: a fused experts op's experts divided between two devices.

In: a private GraphModule about to be placed (:func:`backends.torch.module.place_module`), the plan's
``splits`` section (its ``experts`` entries, :mod:`partitioner.plan.splits`) and the binding's physical
devices. Out: the same module, in place, with each such grouped matmul ``y = op(x, transpose(W), offs)``
(``devices = (home, other)``, home keeping experts ``[0, k)``) rewritten as a person would write it::

    ends = expert_ends(offs)                                      # where each expert's rows end (home)
    x_other = x.to(other)
    y_other = expert_output(x_other, transpose(W_split1), ends, k, E)   # issued first
    y_home = expert_output(x, transpose(W_split0), ends, 0, k)
    y = aten.add(y_home, y_other.to(home))

``W_split0`` and ``W_split1`` (experts of ``W`` cut along its first dimension with
:func:`~partitioner.solvers.splits.shard_sizes`) are new parameters made on their devices, never the
whole weight on one. :func:`expert_output` multiplies each of its experts' routed rows by that
expert's weight (``torch.mm``, as transformers' grouped-matmul fallback does) into an output of ``y``'s
shape, zero on the rows of the other device's experts. The op's node keeps its name and becomes the sum;
the strict-devices sites are a split's (``"<op>.shard0"``, ``"<op>.shard1"``, the op's split copies),
and ``state_dict`` keeps the original's keys (:data:`~backends.torch.splits.SPLIT_ATTR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.expert_chunks import operands
from backends.torch.split_pieces import SPLIT_ATTR, joined_pieces, replace_with_pieces, shard_site
from partitioner.solvers.splits import shard_sizes

__all__ = ["expert_ends", "expert_output", "split_experts"]


def expert_ends(offs: torch.Tensor) -> list[int]:
    """Where each expert's rows end, read once on the device holding ``offs``."""
    return [int(e) for e in offs.tolist()]


def expert_output(x: torch.Tensor, w: torch.Tensor, ends: list[int], first: int, last: int) -> torch.Tensor:
    """``y``-shaped: the rows of ``x`` routed to experts ``first..last-1`` times their weights ``w``
    (``[last - first, K, N]``), zero on every other row.

    Example:
        >>> expert_output(x, w[2:], [2, 3, 5, 5], 2, 4).shape == (x.shape[0], w.shape[2])   # doctest: +SKIP
        True
    """
    start = ends[first - 1] if first else 0
    parts, begin = [], start
    for i, end in enumerate(ends[first:last]):
        parts.append(torch.mm(x[begin:end], w[i]))
        begin = end
    rows = torch.cat(parts) if parts else x[start:start].new_zeros(0, w.shape[2])
    return torch.nn.functional.pad(rows, (0, 0, start, x.shape[0] - begin))


def split_experts(gm: torch.fx.GraphModule, plan: Any,
                  physical: Mapping[str, torch.device]) -> tuple[dict[str, str], dict[str, str]]:
    """Rewrite every experts split of ``plan`` in ``gm`` (see the module docstring). Returns the logical
    device each new node runs on and each new attribute's logical home, for the transfers pass."""
    entries = {op: e for op, e in plan.splits.items() if e["axis"] == "experts"}
    if not entries:
        return {}, {}
    nodes = {n.name: n for n in gm.graph.nodes}
    joined: dict[str, tuple[int | None, tuple[str, ...]]] = joined_pieces(gm)
    placed: dict[str, str] = {}
    homes: dict[str, str] = {}
    graph = gm.graph
    for op, entry in entries.items():
        node = nodes.get(op)
        x, view, offs = operands(op, node, "split by expert between devices")
        attr = view.args[0]
        home, other = entry["devices"]
        weight = attribute(gm, str(attr.target))
        experts = weight.shape[0]
        k, rest = shard_sizes(experts, entry["fractions"])
        pieces = list(torch.split(weight, [k, rest], dim=0))
        names = replace_with_pieces(gm, str(attr.target), weight, pieces, (physical[home], physical[other]), "split",
                                    0, joined)
        homes.update({names[0]: home, names[1]: other})
        own, away = {"op": shard_site(op, 0)}, {"op": shard_site(op, 1)}
        copy = {"tensor": op, "kind": "split"}

        def make(target: Any, args: tuple, device: str | None, site: dict, kind: str = "call_function") -> torch.fx.Node:
            with graph.inserting_before(node):
                n = graph.create_node(kind, target, args, {})
            n.meta["hetpart_split"] = site
            if device is not None:
                n.meta["hetpart_device"] = device
                placed[n.name] = device
            return n

        ends = make(expert_ends, (offs,), None, own)  # a list of ints, read on home: never copied itself
        placed[ends.name] = home  # offs reaches home, as the plan's copies say
        x_other = make("to", (x, physical[other]), other, copy, "call_method")
        placed[x_other.name] = home  # the copy is issued where x lives; its value lives on other
        weights = []
        for name, device, site in ((names[0], home, own), (names[1], other, away)):
            with graph.inserting_before(node):
                w = graph.get_attr(name)
            w.meta["hetpart_device"] = device
            weights.append(make(view.target, (w, *view.args[1:]), device, site))
        on_host = physical[other].type == "cpu" and physical[home].type != "cpu"
        specs = [(expert_output, (x, weights[0], ends, 0, k), home, own),
                 (expert_output, (x_other, weights[1], ends, k, experts), other, away)]
        made = [make(*spec) for spec in (specs if on_host else specs[::-1])]  # the accelerator's side goes first
        y_home, y_other = (made[0], made[1]) if on_host else (made[1], made[0])
        back = make("to", (y_other, physical[home]), home, copy, "call_method")
        placed[back.name] = other  # issued where y_other lives; its value lives on home
        node.target, node.args, node.kwargs = torch.ops.aten.add.Tensor, (y_home, back), {}
        for n in (view, attr):
            if not n.users:
                graph.erase_node(n)
    setattr(gm, SPLIT_ATTR, joined)
    return placed, homes
