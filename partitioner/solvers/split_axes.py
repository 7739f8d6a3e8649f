"""Splits of ops other than linears: which op takes which axis, the choices offered, and the price.

In: an op of the original graph, the problem (devices, cost model, transfer times) and
:class:`~partitioner.solvers.splits.SplitOptions`. Out: whether the op takes an axis of
:data:`OP_AXES` (:func:`why_not_on_axis`: None, or why not in words), the
:class:`~partitioner.solvers.splits.Split` choices it may take along those axes
(:func:`~partitioner.solvers.split_offers.axis_choices`) and each one's
:class:`~partitioner.solvers.splits.SplitPrice` (:func:`price_axis_split`), which
:func:`~partitioner.solvers.split_offers.price_offered` hands over to.

The axes (each opted in by name: ``SplitOptions.axes``, CLI ``--split cols,rows,table,batch``):

* ``table`` (:mod:`partitioner.solvers.split_tables`): an aten ``embedding`` whose table no other
  op reads, each device holding a block of the table's rows, its partial outputs summed at home;
* ``batch`` (:mod:`partitioner.solvers.split_batches`): an elementwise op or a norm of
  :data:`~partitioner.solvers.split_batches.BATCH_OPS`, its rows (the leading dimension, or the
  sequence when the batch has fewer rows than devices) cut over the devices, the output shards
  concatenated at home.

Shares follow the linears' rule (:func:`~partitioner.solvers.split_offers.split_choices`): the offered
fractions, the one proportional to each device's rate, and the balanced one, for every ordered
tuple of devices that can run the op (home first), where the split dimension has a row for each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from partitioner.solvers import split_batches, split_tables
from partitioner.solvers.splits import AXES

#: The axes of ops other than linears: axis -> (what it means, the module that prices it).
OP_AXES: dict[str, tuple[str, Any]] = {
    split_tables.TABLE_AXIS: (AXES[split_tables.TABLE_AXIS], split_tables),
    split_batches.BATCH_AXIS: (AXES[split_batches.BATCH_AXIS], split_batches),
}


def family(axis: str) -> Any:
    """The module that prices and checks ``axis`` (one of :data:`OP_AXES`)."""
    return OP_AXES[axis][1]


def why_not_on_axis(op: Any, graph: Any, axis: str, n_devices: int = 2) -> str | None:
    """Why ``op`` of ``graph`` takes no split along ``axis`` over ``n_devices`` (None: it does).

    Example:
        >>> why_not_on_axis(graph.ops["linear"], graph, "table")           # doctest: +SKIP
        'it is aten.linear.default, and only aten embedding ops take table splits'
    """
    return family(axis).why_not(op, graph, n_devices)


def axes_of(op: Any, graph: Any) -> tuple[str, ...]:
    """The axes of :data:`OP_AXES` ``op`` takes (over two devices)."""
    return tuple(a for a in OP_AXES if why_not_on_axis(op, graph, a) is None)


def splittable_on(graph: Any, axes: Sequence[str]) -> frozenset[str]:
    """The ops of ``graph`` that take one of ``axes`` (of :data:`OP_AXES`): the planner keeps each
    out of coarse groups (a coarse group is never split)."""
    wanted = [a for a in axes if a in OP_AXES]
    return frozenset(op.name for op in graph.ops.values()
                     if any(why_not_on_axis(op, graph, a) is None for a in wanted))


def price_axis_split(problem: Any, node: str, split: Any) -> Any:
    """The :class:`~partitioner.solvers.splits.SplitPrice` of ``split`` (an axis of :data:`OP_AXES`)."""
    return family(split.axis).price(problem, node, split)
