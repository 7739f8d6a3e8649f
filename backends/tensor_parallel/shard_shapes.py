"""Whether a model's own code computes with one tensor-parallel rank's shards: a capture of a copy holding them.

In: the plan, the model it was made for and its example inputs, the split linears of its layout
(:class:`~backends.tensor_parallel.layout.SplitLinear`: module path, axis, each rank's features) and
the head counts set per rank (:class:`~backends.tensor_parallel.heads.HeadCount`). Out:
:func:`shard_capture_error`: None when, for every rank, a copy of the model on the ``meta`` device
whose split linears hold that rank's shard shapes (and whose head count attributes hold that rank's
counts) captures as the plan's model did; otherwise ``(rank, error)`` for the first that does not.

Why: across ranks an attention region runs the module's own code on each rank's block of heads
(:mod:`~backends.tensor_parallel.heads`). A view may write a head count into the captured graph as
a literal that the module holds in no attribute: HF Llama's ``repeat_kv`` expands its key/value
heads by ``hidden_states.shape``, which the capture records as the number. Whether the code derives
that count from a shape (and so computes with the rank's heads) or writes a constant (and so cannot)
is not in the graph; running the code on the rank's shapes tells the two apart. The capture traces
with fake tensors (a copy holding no weights, nothing computed), where a plain call on ``meta``
tensors would stop at data-dependent checks such as HF's packed-sequence test. The values are
checked afterwards as for every plan: ``hetpart check`` compares the ranks with the model.

Example:
    >>> shard_capture_error(plan, model, inputs, layout.linears, layout.heads)   # doctest: +SKIP
    None
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from backends.tensor_parallel.heads import HeadCount, set_head_counts

__all__ = ["shard_capture_error", "shard_copy"]


def shard_capture_error(plan: Any, model: torch.nn.Module, inputs: Sequence[Any] | None, linears: Sequence[Any],
                        heads: Sequence[HeadCount]) -> tuple[int, str] | None:
    """None when every rank's shard copy of ``model`` captures (see the module docstring), else the
    first failing rank and its error (one line).

    ``linears``: the layout's split linears (``.module``, ``.axis``, ``.sizes`` per rank)."""
    from backends.torch.module import captured_as_planned  # backends.torch imports the tensor-parallel layer

    ranks = len(linears[0].sizes) if linears else 0
    seen: set[tuple[Any, ...]] = set()
    for rank in range(ranks):
        key = (tuple(s.sizes[rank] for s in linears), tuple(h.counts[rank] for h in heads))
        if key in seen:  # even blocks: every rank alike
            continue
        seen.add(key)
        shards = shard_copy(model, linears, rank)
        set_head_counts(shards, heads, rank)
        try:
            captured_as_planned(plan, shards, None if inputs is None else tuple(inputs), on_meta=True)
        except Exception as error:  # any failure to trace the rank's shapes refuses it; the caller names the op
            return rank, " ".join(str(error).split())[:400]
    return None


def shard_copy(model: torch.nn.Module, linears: Sequence[Any], rank: int) -> torch.nn.Module:
    """A copy of ``model`` on the ``meta`` device (no weight copied) whose split linears hold rank
    ``rank``'s shapes: a ``cols`` linear its block of output features (and of the bias), a ``rows``
    linear its block of input features (its bias whole, added once after the all-reduce)."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        empty = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = torch.nn.Parameter(empty, tensor.requires_grad) \
            if isinstance(tensor, torch.nn.Parameter) else empty
    shards = copy.deepcopy(model, memo)
    for split in linears:
        linear = shards.get_submodule(split.module)
        size = split.sizes[rank]
        if split.axis == "cols":
            linear.weight = torch.nn.Parameter(linear.weight.new_empty(size, linear.weight.shape[1]))
            if linear.bias is not None:
                linear.bias = torch.nn.Parameter(linear.bias.new_empty(size))
            linear.out_features = size
        else:
            linear.weight = torch.nn.Parameter(linear.weight.new_empty(linear.weight.shape[0], size))
            linear.in_features = size
    return shards
