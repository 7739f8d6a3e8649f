"""Row-sparse gradients: the gather ops whose tables a training plan updates row by row.

In: a training plan (its ``training_state`` section, :mod:`partitioner.plan.training_state`), the
captured graph's op nodes by name, and for each parameter every op node reading its tensor (under
any of its names, so tied weights count). Out: the graph with each sparse parameter's gather
(``aten.embedding``, ``aten.embedding_bag``) called with ``sparse=True``, so its backward makes a
row-sparse gradient (a COO tensor of the rows the batch touched) and never writes a dense
table-sized one. Shared by :mod:`backends.torch.module` (get_attr nodes of the unlifted graph)
and :mod:`backends.torch.source` (placeholders of the lifted graph): the same nodes, the same
refusals.

Refused, naming the parameter and the fix: a sparse update for an op that is no gather, for a
parameter the gather does not read as its table, or for a parameter another op also reads (a
tied weight: the other reader's gradient is dense, so the sum is).

Example:
    >>> mark_sparse_gradients(plan, ops, readers)   # doctest: +SKIP
    ['emb.weight']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from partitioner.errors import HetpartError
from partitioner.plan.training_state import param_states

__all__ = ["mark_sparse_gradients", "sparse_argument"]


def sparse_argument(target: Any) -> int | None:
    """The position of the ``sparse`` flag of a gather op whose first argument is its table
    (``aten.embedding``: 4, ``aten.embedding_bag``: 5); None for any other op.

    Example:
        >>> sparse_argument(torch.ops.aten.embedding.default)
        4
        >>> sparse_argument(torch.ops.aten.linear.default) is None
        True
    """
    if not isinstance(target, torch._ops.OpOverload):
        return None
    names = [a.name for a in target._schema.arguments]
    if not names or names[0] != "weight" or "sparse" not in names or target._schema.is_mutable:
        return None
    return names.index("sparse")


def mark_sparse_gradients(plan: Any, ops: Mapping[str, torch.fx.Node],
                          readers: Mapping[str, Sequence[torch.fx.Node]]) -> list[str]:
    """Set ``sparse=True`` on the gather of every parameter the plan updates row-sparsely, in
    place; returns those parameters' names.

    Parameters:
        plan: a plan; without a ``training_state`` section nothing changes.
        ops: op name → its node in the graph being emitted.
        readers: parameter name → every op node reading that tensor, under any of its names.

    Raises:
        HetpartError: a sparse update for an op that is no gather, for a tensor its gather does
            not read as the table, or for a tensor another op reads too (tied weights).
    """
    marked = []
    for ps in param_states(plan).values():
        if not ps.sparse:
            continue
        node = ops.get(ps.op)
        if node is None:
            raise HetpartError(f"training_state gives {ps.name} a sparse update by op {ps.op}, which is not in the "
                               f"captured graph: the plan is not this model's")
        index = sparse_argument(node.target)
        if node.op == "call_module":
            raise HetpartError(f"training_state gives {ps.name} a sparse update, but {ps.op} calls module "
                               f"{node.target} whole (symbolic_trace capture), whose sparse flag cannot be set "
                               f"here; re-plan with capture 'export'")
        if index is None:
            raise HetpartError(f"training_state gives {ps.name} a sparse update, but its op {ps.op} "
                               f"({node.target}) is no gather (embedding, embedding_bag): its gradient is dense; "
                               f"set its update to 'dense' or re-plan")
        reading = list(readers.get(ps.name, ()))
        table = node.args[0] if node.args else node.kwargs.get("weight")
        if not isinstance(table, torch.fx.Node) or node not in reading:
            raise HetpartError(f"training_state gives {ps.name} a sparse update by {ps.op}, which does not read "
                               f"{ps.name} as its table")
        others = sorted({n.name for n in reading if n is not node})
        if others:
            raise HetpartError(f"training_state gives {ps.name} a sparse update, but {ps.name} is also read by "
                               f"{', '.join(others)} (tied weights): its gradient is the sum of a sparse and a dense "
                               f"one, so it is dense; set its update to 'dense' or re-plan")
        if len(node.args) > index:
            node.args = (*node.args[:index], True, *node.args[index + 1:])
        else:
            node.kwargs = {**node.kwargs, "sparse": True}
        marked.append(ps.name)
    return marked
