"""Batch splits: an elementwise op or a norm cut by rows over several devices, and their price.

In: an op of the original graph whose aten base name is in :data:`BATCH_OPS` (one output, every
input of the output's shape, its parameters its own), and a
:class:`~partitioner.solvers.splits.Split` along ``batch`` with ``devices = (home, d1, ...)`` and
``fractions``. Out: whether it takes the split (:func:`why_not`), the dimension it is cut along
(:func:`split_dim`) and its :class:`~partitioner.solvers.splits.SplitPrice` (:func:`price`).

The split dimension is the leading one (the batch) when it has a row for every device; else the
second (the sequence: a batch of one), when it has and lies before a norm's normalised dimensions
(the rank of the norm's weight; one for a norm without a weight). Device ``i`` takes rows
``[lo_i, hi_i)`` of that dimension (sizes from :func:`~partitioner.solvers.splits.shard_sizes`):
home slices each input (its inputs arrive there, as for any op) and copies each other device's rows
to it; each device computes its rows (a norm with its own copy of the weight and bias); each output
shard is copied back and the shards are concatenated on ``home``, where the node's consumers read it.

Prices (``s_i``: device ``i``'s share of the rows): shard ``i`` does ``s_i`` of the op's flops,
reads ``s_i`` of each input and the op's parameters, writes ``s_i`` of the output; each device holds
the op's parameters whole; home the op's working set, each other device its rows of the inputs and
the output; copies: ``s_i`` of each input home -> ``d_i``, ``s_i`` of the output back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cost_models.precision import op_base_name

#: The axis name.
BATCH_AXIS = "batch"
#: Elementwise ops (aten base names) that take batch splits: unary, or binary over same-shape tensors.
ELEMENTWISE_OPS = frozenset({"add", "sub", "mul", "div", "neg", "exp", "pow", "rsqrt", "relu", "gelu", "silu",
                             "sigmoid", "tanh"})
#: Norms (aten base names) that take batch splits: each row normalised on its own.
NORM_OPS = frozenset({"layer_norm", "rms_norm"})
#: Every op kind that takes batch splits.
BATCH_OPS = ELEMENTWISE_OPS | NORM_OPS


def cut_dim(shape: tuple[int, ...], kept: int, n_devices: int) -> int | None:
    """The dimension of an output of ``shape`` a batch split over ``n_devices`` cuts, its last
    ``kept`` dimensions normalised together (a norm's): the leading one when it has a row for each
    device, else the second when the leading has one row (module docstring); None: neither.

    Example:
        >>> cut_dim((2, 128, 64), 1, 2), cut_dim((1, 128, 64), 1, 2), cut_dim((1, 64), 1, 2)
        (0, 1, None)
    """
    for dim in (0, 1):
        if dim >= len(shape) - kept:
            return None
        if shape[dim] >= n_devices:
            return dim
        if shape[dim] != 1:
            return None  # several rows, fewer than the devices: the batch is not cut, nor what follows it
    return None


def split_dim(op: Any, graph: Any, n_devices: int = 2) -> int | None:
    """The dimension a batch split of ``op`` over ``n_devices`` cuts (:func:`cut_dim`), or None.

    Example:
        >>> split_dim(graph.ops["layer_norm"], graph)    # output [2, 128, 64]   # doctest: +SKIP
        0
    """
    kept = 0  # trailing dimensions a norm normalises together: its weight's, one without a weight
    if op_base_name(op.kind) in NORM_OPS:
        kept = max((len(graph.params[p].shape) for p in op.owned_params if p in graph.params), default=1)
    return cut_dim(tuple(graph.tensors[op.outputs[0]].shape), kept, n_devices)


def why_not(op: Any, graph: Any, n_devices: int = 2) -> str | None:
    """Why ``op`` takes no batch split over ``n_devices`` (None: it does)."""
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in BATCH_OPS:
        return (f"it is {op.kind}, and only aten elementwise ops ({', '.join(sorted(ELEMENTWISE_OPS))}) and norms "
                f"({', '.join(sorted(NORM_OPS))}) take batch splits")
    if len(op.outputs) != 1:
        return f"it has {len(op.outputs)} outputs, and a batch split concatenates one"
    shape = graph.tensors[op.outputs[0]].shape
    for t in op.inputs:
        if graph.tensors[t].shape != shape:
            return (f"its input {t} of shape {list(graph.tensors[t].shape)} is broadcast to its output's "
                    f"{list(shape)}, and a batch split cuts inputs of the output's shape only")
    for name in op.params:
        param = graph.params.get(name)
        if param is not None and (name not in op.owned_params or tuple(param.users) != (op.name,)):
            return f"it reads parameter {name}, which another op reads too (a copy on each device would not be shared)"
    if split_dim(op, graph, n_devices) is None:
        return (f"its output of shape {list(shape)} has no batch (leading) or sequence (second, before a norm's "
                f"dimensions) dimension of {n_devices} rows or more")
    return None


def price(problem: Any, node: str, split: Any) -> Any:
    """The :class:`~partitioner.solvers.splits.SplitPrice` of batch split ``split`` of ``node``."""
    from partitioner.solvers.splits import assemble_price, shard_sizes, split_op

    g = problem.original
    op = split_op(problem, node)
    n = len(split.devices)
    dim = split_dim(op, g, n)
    length = g.tensors[op.outputs[0]].shape[dim]
    in_rows = sum(g.tensors[t].nbytes // length for t in dict.fromkeys(op.inputs))  # bytes of one row of each input
    out_row = g.tensors[op.outputs[0]].nbytes // length
    sizes = shard_sizes(length, split.fractions)
    shard_s, params, work = [], [], []
    for i, (d, rows) in enumerate(zip(split.devices, sizes)):
        shard = dataclasses.replace(op, flops=op.flops * rows // length, bytes_read=in_rows * rows + op.param_bytes,
                                    bytes_written=out_row * rows)
        shard_s.append(problem.costs.op_time(shard, problem.devices.device(d)).seconds)
        params.append(op.param_bytes)
        work.append(problem.work_mem[node] if i == 0 else (in_rows + out_row) * rows)
    return assemble_price(problem, split, shard_s, params, work, [0] + [in_rows * r for r in sizes[1:]],
                          [0] + [out_row * r for r in sizes[1:]])
