"""Splits of ops other than linears: which op takes which axis, the choices offered, and the price.

In: an op of the original graph, the problem (devices, cost model, transfer times) and
:class:`~partitioner.solvers.splits.SplitOptions`. Out: whether the op takes an axis of
:data:`OP_AXES` (:func:`why_not_on_axis`: None, or why not in words), the
:class:`~partitioner.solvers.splits.Split` choices it may take along those axes
(:func:`axis_choices`) and each one's :class:`~partitioner.solvers.splits.SplitPrice`
(:func:`price_axis_split`), which :func:`~partitioner.solvers.splits.price_split` hands over to.

The axes (each opted in by name: ``SplitOptions.axes``, CLI ``--split cols,rows,table,batch``):

* ``table`` (:mod:`partitioner.solvers.split_tables`): an aten ``embedding`` whose table no other
  op reads, each device holding a block of the table's rows, its partial outputs summed at home;
* ``batch`` (:mod:`partitioner.solvers.split_batches`): an elementwise op or a norm of
  :data:`~partitioner.solvers.split_batches.BATCH_OPS`, its rows (the leading dimension, or the
  sequence when the batch has fewer rows than devices) cut over the devices, the output shards
  concatenated at home.

Shares follow the linears' rule (:func:`~partitioner.solvers.splits.split_choices`): the offered
fractions, the one proportional to each device's rate, and the balanced one, for every ordered
tuple of devices that can run the op (home first), where the split dimension has a row for each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from partitioner.solvers import split_batches, split_tables

#: The axes of ops other than linears: axis -> (what it means, the module that prices it).
OP_AXES: dict[str, tuple[str, Any]] = {
    split_tables.TABLE_AXIS: ("table rows: an embedding's table cut into blocks of rows, the indices copied to each "
                              "device, each block's lookups (others masked to zero) summed at home", split_tables),
    split_batches.BATCH_AXIS: ("batch: an elementwise op's or a norm's rows (the leading dimension, or the sequence "
                               "when the batch is smaller than the devices) cut over the devices, the outputs "
                               "concatenated at home; a norm's weight and bias on every device", split_batches),
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


def axis_choices(problem: Any, node: str, options: Any, device_sets: Sequence[tuple[str, ...]]) -> list[Any]:
    """The splits of ``node`` along the axes of :data:`OP_AXES` in ``options.axes``, over each
    ordered device tuple of ``device_sets`` (home first), at each offered share of home."""
    from partitioner.solvers.split_offers import balanced_share, offered_shares
    from partitioner.solvers.splits import Split

    ops = [problem.original.ops[m] for m in problem.members[node]]
    if len(ops) != 1:
        return []
    op, graph = ops[0], problem.original
    out = []
    for axis in (a for a in options.axes if a in OP_AXES):
        for devices in device_sets:
            if why_not_on_axis(op, graph, axis, len(devices)) is not None:
                continue
            balanced = [balanced_share(problem, node, devices, axis)] if options.balanced else []
            for f in dict.fromkeys(s for s in offered_shares(problem, node, devices, options) + balanced
                                   if 0.0 < s < 1.0):
                out.append(Split(axis, devices, (f, round(1.0 - f, 10))))
    return out


def price_axis_split(problem: Any, node: str, split: Any) -> Any:
    """The :class:`~partitioner.solvers.splits.SplitPrice` of ``split`` (an axis of :data:`OP_AXES`)."""
    return family(split.axis).price(problem, node, split)


def assemble_price(problem: Any, split: Any, shard_s: Sequence[float], param_bytes: Sequence[int],
                   work_bytes: Sequence[int], out_bytes: Sequence[int], back_bytes: Sequence[int]) -> Any:
    """A :class:`~partitioner.solvers.splits.SplitPrice` from per-shard values (index 0: home):
    ``out_bytes[i]`` copied home -> ``devices[i]``, ``back_bytes[i]`` copied back (home's own: 0);
    its path is :func:`~partitioner.solvers.splits.split_path_s`'s, as a linear's."""
    from partitioner.solvers.splits import SplitPrice, split_path_s

    others = split.devices[1:]
    ins = [(split.home, d, int(b), problem.transfer_s(int(b), split.home, d)) for d, b in zip(others, out_bytes[1:])]
    outs = [(d, split.home, int(b), problem.transfer_s(int(b), d, split.home)) for d, b in zip(others, back_bytes[1:])]
    return SplitPrice(devices=tuple(split.devices), shard_s=tuple(shard_s),
                      param_bytes=tuple(int(b) for b in param_bytes), work_bytes=tuple(int(b) for b in work_bytes),
                      latency_s=split_path_s(problem, split.devices, shard_s, [c[3] for c in ins],
                                             [c[3] for c in outs]),
                      copies=tuple(ins) + tuple(outs))
