"""Time-split linears in an emitted module: the weight's row chunks on the host, streamed in one by one.

In: a private GraphModule about to be placed (:func:`backends.torch.module.place_module`), the plan's
``splits`` section (its ``time`` entries, :mod:`partitioner.plan.splits`) and the binding's physical
devices. Out: the same module, in place, with each time-split ``aten.linear(x, W, b)`` (``devices =
(home, host)``, ``chunks = n``) rewritten as a person would write it by hand::

    y_0 = aten.linear(x, streamer.get("W_chunk0", home), b_0)   # chunk 0 copied in, then computed
    y_1 = aten.linear(x, streamer.get("W_chunk1", home), b_1)   # (on CUDA the next chunks' copies
    ...                                                          #  run on the streamer's side stream)
    y = aten.cat([y_0, ..., y_{n-1}], -1)

``W_chunk{i}`` (rows of ``W`` cut with :func:`~partitioner.solvers.chunked_streaming.chunk_sizes`) are
new parameters made on the host, never the whole weight on ``home``; they are fetched through the
module's :class:`~backends.torch.streaming.WeightStreamer` in schedule order, which on CUDA keeps the
next two chunks in flight on a side stream (pinned host copies) while the current one computes: the
chunk buffers :data:`~partitioner.solvers.chunked_streaming.SLOTS` prices. The bias is cut alike
into ``b_i`` and lives on ``home``. The op's node keeps its name and becomes the concatenation, so
its consumers and the plan's placement are unchanged. Each chunk's linear runs as the op's home
shard (strict-devices site ``"<op>.shard0"``), each chunk's fetch as the op's split copy
(``"<op>.chunk<i>"``, counted as one transfer of the op's weight bytes).

``state_dict`` keeps the original's keys (the chunks joined on the host) and ``load_state_dict``
cuts them, as for split linears (:data:`~backends.torch.splits.SPLIT_ATTR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.split_pieces import SPLIT_ATTR, joined_pieces, replace_with_pieces, shard_site
from partitioner.errors import PlanMismatch
from partitioner.solvers.chunked_streaming import chunk_sizes

__all__ = ["CHUNK_SITES", "chunk_linears", "chunk_site", "label_fetches"]

#: module attribute: each chunk's attribute target -> the strict-devices site of its fetch
CHUNK_SITES = "_hetpart_chunk_sites"

_LINEARS = (torch.ops.aten.linear.default,)


def chunk_site(op: str, index: int) -> str:
    """The strict-devices name of the fetch of chunk ``index`` of time-split op ``op``."""
    return f"{op}.chunk{index}"


def chunk_linears(gm: torch.fx.GraphModule, plan: Any, physical: Mapping[str, torch.device]
                  ) -> tuple[dict[str, str], dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Rewrite every time-split op of ``plan`` in ``gm`` (see the module docstring).

    Returns the logical device each new node runs on, each new attribute's logical home (the host
    for chunks, the op's device for bias pieces) and, per op, its chunks' ``(target, logical device
    fetched to)`` in fetch order, for the module's streamer.

    Raises:
        PlanMismatch: a time-split op of the plan is not an aten linear in ``gm``.
    """
    timed = {op: e for op, e in plan.splits.items() if e["axis"] == "time" and e.get("by") != "expert"}
    if not timed:
        return {}, {}, {}
    host = plan.devices.host_device().name
    nodes = {n.name: n for n in gm.graph.nodes}
    joined: dict[str, tuple[int | None, tuple[str, ...]]] = joined_pieces(gm)
    placed: dict[str, str] = {}
    homes: dict[str, str] = {}
    fetches: dict[str, list[tuple[str, str]]] = {}
    sites: dict[str, str] = dict(getattr(gm, CHUNK_SITES, {}))
    for op, entry in timed.items():
        node = nodes.get(op)
        if node is None or node.op != "call_function" or node.target not in _LINEARS:
            raise PlanMismatch(f"plan.emit: op {op!r} is split in time in the plan, but the captured graph's {op!r} is "
                               f"{getattr(node, 'target', 'missing')}: only aten linear ops take time splits; re-plan "
                               f"(hetpart plan MODEL --split time)")
        home = entry["devices"][0]
        x, w_node, b_node = (list(node.args) + [None])[:3]
        b_node = node.kwargs.get("bias", b_node)
        weight = attribute(gm, str(w_node.target))
        sizes = chunk_sizes(weight.shape[0], int(entry["chunks"]))
        chunks = _cut(gm, str(w_node.target), weight, sizes, physical[host], joined)
        biases: tuple[str | None, ...] = (None,) * len(sizes)
        if b_node is not None:
            biases = _cut(gm, str(b_node.target), attribute(gm, str(b_node.target)), sizes, physical[home], joined)
        homes.update({c: host for c in chunks})
        homes.update({b: home for b in biases if b is not None})
        fetches[op] = [(c, home) for c in chunks]
        ys = []
        for i, (chunk, bias) in enumerate(zip(chunks, biases)):
            with gm.graph.inserting_before(node):
                w = gm.graph.get_attr(chunk)
                b = gm.graph.get_attr(bias) if bias is not None else None
                y = gm.graph.call_function(torch.ops.aten.linear.default, (x, w, b))
            w.meta["hetpart_device"] = host
            sites[chunk] = chunk_site(op, i)
            if b is not None:
                b.meta["hetpart_device"] = home
            y.meta["hetpart_device"] = home
            y.meta["hetpart_split"] = {"op": shard_site(op, 0)}
            placed[y.name] = home
            ys.append(y)
        node.target, node.args, node.kwargs = torch.ops.aten.cat.default, (ys, -1), {}
        for n in (w_node, b_node):
            if n is not None and not n.users:
                gm.graph.erase_node(n)
    setattr(gm, SPLIT_ATTR, joined)
    setattr(gm, CHUNK_SITES, sites)
    return placed, homes, fetches


def label_fetches(gm: torch.fx.GraphModule) -> None:
    """After the transfers pass made each chunk's streamer fetch: give the fetch its strict-devices
    site (the op's split copy, one per chunk) and drop the chunks' unread attribute nodes."""
    sites = getattr(gm, CHUNK_SITES, {})
    for node in list(gm.graph.nodes):
        if node.op == "call_method" and node.target == "get" and len(node.args) == 3 and str(node.args[1]) in sites:
            node.meta["hetpart_split"] = {"tensor": sites[str(node.args[1])], "kind": "split"}
        elif node.op == "get_attr" and str(node.target) in sites and not node.users:
            gm.graph.erase_node(node)


def _cut(gm: torch.fx.GraphModule, target: str, tensor: torch.Tensor, sizes: tuple[int, ...], device: torch.device,
         joined: dict) -> tuple[str, ...]:
    """Put ``tensor``'s row chunks (``sizes`` along dim 0) on ``device`` as new parameters beside it,
    remove it, and remember how to join them."""
    pieces = list(torch.split(tensor, list(sizes), dim=0))
    return replace_with_pieces(gm, target, tensor, pieces, (device,) * len(pieces), "chunk", 0, joined)
