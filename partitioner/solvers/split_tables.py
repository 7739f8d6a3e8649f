"""Table splits: one embedding's table cut into blocks of rows over several devices, and their price.

In: an aten ``embedding`` of the original graph, ``y = W[ids]`` with ``W`` of shape ``[V, D]``
(owned by the op, read by no other op), and a :class:`~partitioner.solvers.splits.Split` along
``table`` with ``devices = (home, d1, ...)`` and ``fractions``. Out: whether it takes the split
(:func:`why_not`) and its :class:`~partitioner.solvers.splits.SplitPrice` (:func:`price`).

Semantics (Megatron's ``VocabParallelEmbedding``): device ``i`` keeps rows ``[lo_i, hi_i)`` of ``W``
(sizes from :func:`~partitioner.solvers.splits.shard_sizes`); the indices (on ``home``, where the
node's input arrives) are copied to every other device; each device looks up the indices in its
block (an index outside it reads local row 0 and its output row is masked to zero); each partial
output (the whole output's shape) is copied back and the partials are summed on ``home``, where the
node's consumers read ``y``.

Prices (``t(d, op')``: the cost model's time of a shard op ``op'`` on device ``d``; ``I``: the
indices' bytes, ``Y``: the output's, ``s_i``: device ``i``'s share of the rows):

* shard ``i`` reads the indices, its share ``s_i * Y`` of the looked-up rows (indices spread evenly
  over the table; a gather reads the rows it looks up, not its whole block) and its partial output
  again for the mask, and writes the masked partial and its
  local indices: ``bytes_read = I + s_i * Y + Y``, ``bytes_written = Y + I``; home also reads the
  others' partials to sum them (``+ (n - 1) * Y``);
* memory: each device holds its block of rows (home also the op's other parameters, if any); home
  the op's working set and the partial it sums, each other device the indices and its partial;
* copies: ``I`` home -> ``d_i`` and ``Y`` back, for each other device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cost_models.precision import op_base_name

#: The axis name, and the op kinds (aten base names) that take it.
TABLE_AXIS = "table"
GATHER_OPS = frozenset({"embedding"})


def table_param(op: Any, graph: Any) -> str | None:
    """The 2-D table ``op`` (an aten embedding) owns and alone reads, or None."""
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in GATHER_OPS:
        return None
    for name in op.owned_params:
        param = graph.params.get(name)
        if param is not None and len(param.shape) == 2:
            return name if tuple(param.users) == (op.name,) else None
    return None


def why_not(op: Any, graph: Any, n_devices: int = 2) -> str | None:
    """Why ``op`` takes no table split over ``n_devices`` (None: it does)."""
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in GATHER_OPS:
        return f"it is {op.kind}, and only aten {', '.join(sorted(GATHER_OPS))} ops take table splits"
    name = table_param(op, graph)
    if name is None:
        return "its 2-D table is read by another op too (tied to a linear), or it owns none"
    rows = graph.params[name].shape[0]
    if rows < n_devices:
        return f"its table has {rows} rows, fewer than the {n_devices} devices"
    return None


def price(problem: Any, node: str, split: Any) -> Any:
    """The :class:`~partitioner.solvers.splits.SplitPrice` of table split ``split`` of ``node``."""
    from partitioner.solvers.splits import assemble_price, shard_sizes, split_op

    g = problem.original
    op = split_op(problem, node)
    table = g.params[table_param(op, g)]
    rows = table.shape[0]
    row_bytes = table.nbytes // rows
    ids = sum(g.tensors[t].nbytes for t in op.inputs)
    y = sum(g.tensors[t].nbytes for t in op.outputs)
    n = len(split.devices)
    sizes = shard_sizes(rows, split.fractions)
    extra = op.param_bytes - table.nbytes  # owned tensors other than the table, kept at home
    shard_s, params, work = [], [], []
    for i, (d, size) in enumerate(zip(split.devices, sizes)):
        block = row_bytes * size
        read = ids + int(y * size / rows) + y + ((n - 1) * y if i == 0 else 0)
        shard = dataclasses.replace(op, param_bytes=block, bytes_read=read, bytes_written=y + ids)
        shard_s.append(problem.costs.op_time(shard, problem.devices.device(d)).seconds)
        params.append(block + (extra if i == 0 else 0))
        work.append(max(problem.work_mem[node], ids + 2 * y) if i == 0 else ids + y)
    return assemble_price(problem, split, shard_s, params, work, [0] + [ids] * (n - 1), [0] + [y] * (n - 1))
