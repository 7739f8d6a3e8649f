"""Experts splits: a fused experts op's experts divided between two devices, each computing its own.

In: an experts op of the original graph in one node with the view owning its fused weight (as for a
time split by expert, :mod:`partitioner.solvers.expert_streaming`), the problem's devices and cost
model, and :class:`~partitioner.solvers.splits.SplitOptions` (axis ``experts``, its ``fractions``).
Out: the :class:`ExpertSplit` choices the op may take (:func:`expert_device_choices`) and each one's
:class:`~partitioner.solvers.splits.SplitPrice`, read by every solver like a two-device split's.

For ``y = op(x, W, offs)`` (``W`` the ``[E, K, N]`` view of the fused weight, ``x`` the routed rows
sorted by expert) placed with ``devices = (home, other)`` and ``fractions = (f, 1 - f)``:

* ``home`` keeps experts ``[0, k)`` of ``W``, ``other`` experts ``[k, E)`` (``k`` = ``E f`` rounded,
  at least one each: :func:`~partitioner.solvers.splits.shard_sizes`), resident;
* ``x`` (on ``home``, where the node's inputs arrive) is copied whole to ``other``; where each
  expert's rows end is read on ``home`` once (``offs``, a few bytes, as the captured op reads it);
  each device computes the rows routed to its experts into an output of ``y``'s shape, zero
  elsewhere; ``other``'s is copied back and the two are summed on ``home`` (``y``'s bytes, whatever
  the routing: the copies are fixed when planning);
* routing is unknown when planning: each side is priced with the **uniform routing assumption**
  (``S / E`` rows per expert), its share of the op's flops, of ``x`` and of ``y``, reading the
  experts its rows can touch; its output written whole;
* latency ``copy(x) + max(t(home), t(other) + copy(y))``; throughput each device its side, both
  copies on their links; memory: each device its experts (``home`` the op's other tensors too),
  ``home`` the working set ``x + offs + 2 y``, ``other`` ``x + y``.

Fractions offered: ``SplitOptions.fractions`` (home's share of the experts), for every ordered pair
of devices that can run the op, when ``experts`` is among the split axes; a pinned op stays whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from partitioner.frontends.aten_costs import grouped_weight_share
from partitioner.solvers.expert_streaming import node_experts
from partitioner.solvers.splits import Split, SplitPrice, shard_sizes, split_path_s

__all__ = ["AXIS", "ExpertSplit", "expert_device_choices", "price_expert_devices"]

#: The axis word of an experts split.
AXIS = "experts"


@dataclasses.dataclass(frozen=True)
class ExpertSplit(Split):
    """A fused experts op's experts divided between ``devices[0]`` (home: reads ``x``, sums ``y``) and
    ``devices[1]``, home's share of the experts ``fractions[0]``: a :class:`Split` along
    :data:`AXIS` over two devices, priced by :func:`price_expert_devices`."""

    @property
    def other(self) -> str:
        return self.devices[1]


def price_expert_devices(problem: Any, node: str, split: ExpertSplit) -> SplitPrice:
    """The price of ``split`` for ``node`` in ``problem`` (see the module docstring)."""
    op, weight = node_experts(problem, node)
    g = problem.original
    experts = weight.shape[0]
    x = g.tensors[op.inputs[0]]
    rows = x.shape[0] if x.shape else 0
    offs_bytes = sum(g.tensors[t].nbytes for t in op.inputs[2:])
    y_bytes = sum(g.tensors[t].nbytes for t in op.outputs)
    expert_bytes = weight.nbytes // experts
    counts = shard_sizes(experts, split.fractions)
    shard_s, params = [], []
    for device, count in zip(split.devices, counts):
        share = count / experts  # uniform routing: S / E rows per expert
        w = expert_bytes * count
        touched = grouped_weight_share(round(rows * share), count)
        side = dataclasses.replace(op, flops=int(op.flops * share), param_bytes=w,
                                   bytes_read=int(x.nbytes * share) + offs_bytes + round(w * touched),
                                   bytes_written=y_bytes)
        shard_s.append(problem.costs.op_time(side, problem.devices.device(device)).seconds)
        params.append(w)
    resident = problem.param_bytes[node] - weight.nbytes
    copy_in_s = problem.transfer_s(x.nbytes, split.home, split.other)
    copy_out_s = problem.transfer_s(y_bytes, split.other, split.home)
    return SplitPrice(
        devices=split.devices, shard_s=(shard_s[0], shard_s[1]), param_bytes=(params[0] + resident, params[1]),
        work_bytes=(x.nbytes + offs_bytes + 2 * y_bytes, x.nbytes + y_bytes),
        latency_s=split_path_s(problem, split.devices, shard_s, (copy_in_s,), (copy_out_s,)),
        copies=((split.home, split.other, x.nbytes, copy_in_s), (split.other, split.home, y_bytes, copy_out_s)))


def expert_device_choices(problem: Any, node: str, options: Any) -> tuple[ExpertSplit, ...]:
    """Every experts split ``node`` may take: one experts op and its weight's view, not pinned, each
    ordered pair of devices that can run it, each offered fraction (distinct expert counts)."""
    found = node_experts(problem, node)
    allowed = problem.allowed[node]
    if found is None or node in problem.pins or len(allowed) < 2:
        return ()
    experts = found[1].shape[0]
    if experts < 2:
        return ()
    out: list[ExpertSplit] = []
    for home in allowed:
        for other in allowed:
            if other == home:
                continue
            seen = set()
            for f in options.fractions:
                k = shard_sizes(experts, (f, 1.0 - f))[0]
                if k not in seen:
                    seen.add(k)
                    out.append(ExpertSplit(AXIS, (home, other), (k / experts, (experts - k) / experts)))
    return tuple(out)
