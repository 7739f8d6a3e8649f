"""Fused experts ops split in time by expert, in an emitted module: expert groups streamed in one by one.

In: a private GraphModule about to be placed (:func:`backends.torch.module.place_module`), the plan's
``splits`` section (its ``time`` entries with ``by: expert``, :mod:`partitioner.plan.splits`) and the
binding's physical devices. Out: the same module, in place, with each such grouped matmul
``y = op(x, transpose(W), offs)`` (``W`` the fused ``[E, N, K]`` parameter, ``devices = (home, host)``,
``chunks = n``) rewritten as a person would write it by hand::

    w_0 = aten.transpose(streamer.get("W_chunk0", home), -2, -1)   # experts 0..e_1-1 copied in
    y_0 = expert_rows("op", x, w_0, offs, 0, e_1, False)          # their routed rows, computed
    w_1 = ...                                                      # (on CUDA the next groups' copies
    y_{n-1} = expert_rows("op", x, w_{n-1}, offs, e_{n-1}, E, True) #  run on the streamer's side stream)
    y = aten.cat([y_0, ..., y_{n-1}])

``W_chunk{i}`` (experts of ``W`` cut along its first dimension with
:func:`~partitioner.solvers.chunked_streaming.chunk_sizes`) are new parameters made on the host,
never the whole weight on ``home``, fetched through the module's weight streamer in schedule order
as a time-split linear's chunks are (:mod:`backends.torch.chunked`: the same strict-devices sites,
``"<op>.shard0"`` for the compute and ``"<op>.chunk<i>"`` for each fetch). :func:`expert_rows` runs
the captured op itself on the rows routed to the group's experts (``x`` is sorted by expert, so they
are contiguous: ``offs[first - 1]`` to ``offs[last - 1]``), with the group's offsets; the last group
adds the zero rows past ``offs[-1]`` (routed to no expert), so ``y`` has the op's shape. The op's
node keeps its name and becomes the concatenation; the view of ``W`` and ``W`` itself go.

``state_dict`` keeps the original's keys (the groups joined on the host) and ``load_state_dict`` cuts
them, as for split linears (:data:`~backends.torch.splits.SPLIT_ATTR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.chunked import CHUNK_SITES, chunk_site
from backends.torch.split_pieces import SPLIT_ATTR, joined_pieces, replace_with_pieces, shard_site
from partitioner.errors import PlanMismatch
from partitioner.solvers.chunked_streaming import chunk_sizes

__all__ = ["chunk_experts", "expert_rows", "operands"]

#: the grouped matmuls this rewrite takes (as ``namespace.op.overload``), resolved on use
_GROUPED = ("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")


def expert_rows(op: str, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, first: int, last: int,
                pad: bool) -> torch.Tensor:
    """The rows of ``x`` routed to experts ``first..last-1`` times their weights ``w`` (``[last - first,
    K, N]``), by the grouped matmul ``op`` (``"transformers.grouped_mm_fallback.default"``); with
    ``pad``, followed by zero rows up to ``x``'s row count.

    Example:
        >>> offs = torch.tensor([2, 3, 5], dtype=torch.int32)       # experts 0, 1, 2: rows 0-1, 2, 3-4
        >>> expert_rows("aten._grouped_mm.default", x, w[1:], offs, 1, 3, True).shape   # doctest: +SKIP
        torch.Size([3, N])
    """
    ends = offs.tolist()  # one device-to-host sync per group, as the captured fallback op makes per call
    start = ends[first - 1] if first else 0
    stop = ends[last - 1]
    namespace, name, overload = op.split(".")
    rows = getattr(getattr(getattr(torch.ops, namespace), name), overload)(x[start:stop], w, offs[first:last] - start)
    return torch.nn.functional.pad(rows, (0, 0, 0, x.shape[0] - stop)) if pad and stop < x.shape[0] else rows


def chunk_experts(gm: torch.fx.GraphModule, plan: Any, physical: Mapping[str, torch.device]
                  ) -> tuple[dict[str, str], dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Rewrite every op of ``plan`` split in time by expert in ``gm`` (see the module docstring).

    Returns the logical device each new node runs on, each new attribute's logical home (the host)
    and, per op, its groups' ``(target, logical device fetched to)`` in fetch order, for the module's
    streamer.

    Raises:
        PlanMismatch: an op split by expert is not a grouped matmul reading its weight through a view.
    """
    entries = {op: e for op, e in plan.splits.items() if e["axis"] == "time" and e.get("by") == "expert"}
    if not entries:
        return {}, {}, {}
    host = plan.devices.host_device().name
    nodes = {n.name: n for n in gm.graph.nodes}
    joined: dict[str, tuple[int | None, tuple[str, ...]]] = joined_pieces(gm)
    sites: dict[str, str] = dict(getattr(gm, CHUNK_SITES, {}))
    placed: dict[str, str] = {}
    homes: dict[str, str] = {}
    fetches: dict[str, list[tuple[str, str]]] = {}
    for op, entry in entries.items():
        node = nodes.get(op)
        x, view, offs = operands(op, node, "split in time by expert")
        attr = view.args[0]
        home = entry["devices"][0]
        weight = attribute(gm, str(attr.target))
        sizes = chunk_sizes(weight.shape[0], int(entry["chunks"]))
        pieces = list(torch.split(weight, list(sizes), dim=0))
        chunks = replace_with_pieces(gm, str(attr.target), weight, pieces, (physical[host],) * len(pieces), "chunk",
                                     0, joined)
        homes.update({c: host for c in chunks})
        fetches[op] = [(c, home) for c in chunks]
        ys, first = [], 0
        for i, (chunk, count) in enumerate(zip(chunks, sizes)):
            with gm.graph.inserting_before(node):
                w = gm.graph.get_attr(chunk)
                wt = gm.graph.call_function(view.target, (w, *view.args[1:]), dict(view.kwargs))
                y = gm.graph.call_function(expert_rows, (str(node.target), x, wt, offs, first, first + count,
                                                         i == len(sizes) - 1))
            w.meta["hetpart_device"] = host
            sites[chunk] = chunk_site(op, i)
            for n in (wt, y):
                n.meta["hetpart_device"] = home
                n.meta["hetpart_split"] = {"op": shard_site(op, 0)}
                placed[n.name] = home
            ys.append(y)
            first += count
        node.target, node.args, node.kwargs = torch.ops.aten.cat.default, (ys,), {}
        for n in (view, attr):
            if not n.users:
                gm.graph.erase_node(n)
    setattr(gm, SPLIT_ATTR, joined)
    setattr(gm, CHUNK_SITES, sites)
    return placed, homes, fetches


def operands(op: str, node: torch.fx.Node | None, how: str) -> tuple[Any, torch.fx.Node, Any]:
    """``(x, the weight's view, offs)`` of the grouped matmul ``node``, or PlanMismatch naming ``op``
    and ``how`` the plan splits it."""
    target = str(getattr(node, "target", "missing"))
    if node is None or node.op != "call_function" or target not in _GROUPED:
        raise PlanMismatch(f"plan.emit: op {op!r} is {how} in the plan, but the captured graph's {op!r} is "
                           f"{target}: only grouped matmuls ({', '.join(_GROUPED)}) take splits by expert; re-plan "
                           f"(hetpart plan MODEL --split)")
    args = list(node.args)
    offs = node.kwargs.get("offs", args[2] if len(args) > 2 else None)
    extra = {k: v for k, v in node.kwargs.items() if k != "offs" and v is not None}
    view = args[1] if len(args) > 1 else None
    if offs is None or extra or len(args) > 3 or not isinstance(view, torch.fx.Node) or view.op != "call_function" \
            or not view.args or not isinstance(view.args[0], torch.fx.Node) or view.args[0].op != "get_attr" \
            or len(view.users) != 1:
        raise PlanMismatch(f"plan.emit: op {op!r} is {how}, but the captured call is not "
                           f"op(x, view(weight), offs) with the weight read by that view alone (it is "
                           f"{node.format_node()}); re-plan without --split")
    return args[0], view, offs
