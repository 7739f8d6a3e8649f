"""An embedding split by table rows in an emitted module: each block on its device, masked lookups, a sum.

In: a private GraphModule, the node of an ``aten.embedding(W, ids, padding_idx, ...)`` the plan
splits along ``table`` (``devices = (home, d1, ...)``, ``fractions``;
:mod:`partitioner.solvers.split_tables`), the binding's physical devices and the module's split
record (:data:`backends.torch.splits.SPLIT_ATTR`). Out: the same module, in place, with the lookup
written as a person would by hand (Megatron's ``VocabParallelEmbedding``), for each device ``d``
holding rows ``[lo, hi)`` of ``W`` as its own parameter ``W_d``::

    ids_d  = ids.to(d)                                   # home reads ids where they are
    inside = logical_and(ids_d >= lo, ids_d < hi)
    part_d = where(inside[..., None], embedding(W_d, where(inside, ids_d - lo, 0)), 0.0)
    y      = part_home + part_d1.to(home) + ...          # the op's node, read by its consumers

The whole table never lands on one device; its blocks join under the original name in
``state_dict`` and in :func:`~backends.torch.splits.joined_gradients`. A padding index is moved
into the block that holds it (elsewhere: none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from backends.torch.attributes import attribute
from backends.torch.split_pieces import Pieces
from partitioner.errors import PlanMismatch
from partitioner.solvers.splits import shard_sizes

__all__ = ["rewrite_table_split"]

_aten = torch.ops.aten


def rewrite_table_split(gm: torch.fx.GraphModule, node: torch.fx.Node, entry: Mapping[str, Any],
                        physical: Mapping[str, torch.device], joined: dict) -> dict[str, str]:
    """Rewrite ``node`` split by table rows (module docstring); the logical device of each new node."""
    from backends.torch.split_pieces import replace_with_pieces

    op, devices = node.name, list(entry["devices"])
    if node.target is not _aten.embedding.default:
        raise PlanMismatch(f"plan.emit: op {op!r} is split table in the plan, but the captured graph's {op!r} is "
                           f"{node.target}: only aten embedding ops take table splits; re-plan (hetpart plan MODEL "
                           f"--split table)")
    w_node, ids = node.args[0], node.args[1]
    padding, by_freq, sparse = (list(node.args[2:]) + [-1, False, False][len(node.args) - 2:])[:3]
    padding = node.kwargs.get("padding_idx", padding)
    by_freq = node.kwargs.get("scale_grad_by_freq", by_freq)
    sparse = node.kwargs.get("sparse", sparse)
    if by_freq or sparse:
        raise PlanMismatch(f"plan.emit: op {op!r} looks up with scale_grad_by_freq={by_freq}, sparse={sparse}, which "
                           f"a table split cannot keep (each block would count and update its own rows); re-plan "
                           f"without table splits (--split cols,rows)")
    table = attribute(gm, str(w_node.target))
    sizes = shard_sizes(table.shape[0], entry["fractions"])
    names = replace_with_pieces(gm, str(w_node.target), table, list(torch.split(table, list(sizes), 0)),
                                tuple(physical[d] for d in devices), "split", 0, joined)
    pieces = Pieces(gm, node, physical)
    home, lo = devices[0], 0
    parts = []
    for i, (d, size, name) in enumerate(zip(devices, sizes, names)):
        hi = lo + size
        ids_d = ids if i == 0 else pieces.copy(ids, home, d)
        above = pieces.call(_aten.ge.Scalar, (ids_d, lo), i, d, name=f"{op}_above{i}")
        below = pieces.call(_aten.lt.Scalar, (ids_d, hi), i, d, name=f"{op}_below{i}")
        inside = pieces.call(_aten.logical_and.default, (above, below), i, d, name=f"{op}_inside{i}")
        shifted = pieces.call(_aten.sub.Tensor, (ids_d, lo), i, d, name=f"{op}_shifted{i}")
        local = pieces.call(_aten.where.ScalarOther, (inside, shifted, 0), i, d, name=f"{op}_local{i}")
        pad = padding - lo if padding is not None and lo <= padding < hi else -1
        rows = pieces.call(_aten.embedding.default, (pieces.attr(name, d), local, pad), i, d, name=f"{op}_rows{i}")
        mask = pieces.call(_aten.unsqueeze.default, (inside, -1), i, d, name=f"{op}_mask{i}")
        part = pieces.call(_aten.where.ScalarOther, (mask, rows, 0.0), i, d, name=f"{op}_shard{i}")
        parts.append(part if i == 0 else pieces.copy(part, d, home))
        lo = hi
    total = parts[0]
    for back in parts[1:-1]:
        total = pieces.call(_aten.add.Tensor, (total, back), 0, home, name=f"{op}_sum")
    node.target, node.args, node.kwargs = _aten.add.Tensor, (total, parts[-1]), {}
    if not w_node.users:
        gm.graph.erase_node(w_node)
    return pieces.placed
