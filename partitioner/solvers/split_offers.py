"""Which splits an op is offered: the degrees, groups of devices and fractions of its :class:`Split` choices.

In: a problem (its devices, the devices each node allows, each node's whole-op compute), a node and
:class:`~partitioner.solvers.splits.SplitOptions`. Out: the node's :class:`Split` choices
(:func:`split_choices`), which :class:`~partitioner.solvers.problem.Problem` prices with
:func:`price_offered` (every axis's price), and which splits an op can take at all
(:func:`why_not_split`, :func:`splits_it_takes`, :func:`splittable_ops`: the refusals and the
planner's coarsening read them). The layer above the split kinds (linears in
:mod:`partitioner.solvers.splits`, tables and batches in :mod:`partitioner.solvers.split_axes`,
fused experts in :mod:`partitioner.solvers.expert_streaming`), so none of them imports another.

Per degree of ``SplitOptions.degrees`` (how many devices a split spans): degree 2, for every ordered
pair of devices that can run the op and each axis, the home shares ``SplitOptions.fractions``, with
``proportional`` the share proportional to each device's priced rate for the whole op (``t(other) /
(t(home) + t(other))``, rounded to two decimals), and with ``balanced`` the share at which the home
shard ends when the other shard and its copy back do (:func:`balanced_share`: HeteGen's rule ``T_gpu
= T_cpu + T_comm``, found on the prices themselves, so fixed per-op costs and the copies count);
degree ``k > 2``, per home, one group of ``k`` devices (home's like peers, else the next devices of
any kind) in even shares (and rate-proportional ones for a mixed group). A pinned op, and a node of
several ops kept together by coarsening (views folded into the linear aside), stays whole; with
splits asked, the planner keeps every splittable linear out of coarse groups.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

from partitioner.solvers.expert_streaming import experts_weight
from partitioner.solvers.split_axes import OP_AXES, price_axis_split, splittable_on, why_not_on_axis
from partitioner.solvers.splits import (AXES, LINEAR_AXES, Split, SplitOptions, SplitPrice, even_shares, price_split,
                                       split_weight, why_not_splittable)

__all__ = ["axis_choices", "balanced_share", "offered_shares", "partners", "peers", "price_offered", "proportional_shares",
           "split_choices", "splits_it_takes", "splittable_ops", "why_not_split"]


def split_choices(problem: Any, node: str, options: SplitOptions) -> tuple[Split, ...]:
    """Every split ``node`` may take: along ``table`` and ``batch``, a node of one op that takes them over
    each ordered pair (:func:`axis_choices`); one splittable linear
    (with views folded into it), each axis, and for each degree ``k`` of ``options.degrees`` and each home the node allows:

    * ``k == 2``: every other allowed device unlike home and the next one like it (:func:`partners`),
      each offered fraction (``fractions``, with
      ``proportional`` the rate-proportional share, with ``balanced`` :func:`balanced_share`);
    * ``k > 2``: home and the next ``k - 1`` allowed devices with home's figures (:func:`peers`,
      profile order, wrapping) in even shares; where home has fewer such peers, home and the next
      ``k - 1`` allowed devices of any kind, in even shares and (``proportional``) in shares
      proportional to each device's priced rate (:func:`proportional_shares`). So a host of eight
      like accelerators is offered one split of each degree per home, not every subset.
    """
    allowed = problem.allowed[node]
    if node in problem.pins or len(allowed) < 2:
        return ()
    pairs = [(home, other) for home in allowed for other in partners(allowed, home, peers(problem, allowed, home))] \
        if 2 in options.degrees else []
    out: list[Split] = axis_choices(problem, node, options, pairs)
    ops = [problem.original.ops[m] for m in problem.members[node]]
    linears = [op for op in ops if not op.is_view]
    if len(linears) != 1 or split_weight(linears[0], problem.original.params) is None:
        return tuple(dict.fromkeys(out))
    op = linears[0]
    weight = problem.original.params[split_weight(op, problem.original.params)]
    axes = [a for a in options.axes if a in ("cols", "rows")]
    for home in allowed:
        alike = peers(problem, allowed, home)
        if 2 in options.degrees:
            for other in partners(allowed, home, alike):
                shares = offered_shares(problem, node, (home, other), options)
                for axis in axes:
                    length = weight.shape[0] if axis == "cols" else weight.shape[1]
                    if length < 2:
                        continue
                    balanced = [balanced_share(problem, node, (home, other), axis)] if options.balanced else []
                    for f in dict.fromkeys(s for s in shares + balanced if 0.0 < s < 1.0):
                        out.append(Split(axis, (home, other), (f, round(1.0 - f, 10))))
        for k in sorted(d for d in set(options.degrees) if 2 < d <= len(allowed)):
            group = (home, *alike[:k - 1]) if len(alike) >= k - 1 else (home, *_after(allowed, home)[:k - 1])
            fractions = [even_shares(k)]
            if len(alike) < k - 1 and options.proportional:
                fractions.append(proportional_shares(problem, node, group))
            for axis in axes:
                length = weight.shape[0] if axis == "cols" else weight.shape[1]
                if length < k:
                    continue
                out += [Split(axis, group, f) for f in dict.fromkeys(fractions) if f is not None]
    return tuple(dict.fromkeys(out))


def offered_shares(problem: Any, node: str, devices: tuple[str, ...], options: SplitOptions) -> list[float]:
    """Home's shares offered for a split of ``node`` over ``devices``: ``options.fractions`` and,
    with ``proportional``, home's rate over the devices' summed rates for the whole op (two decimals)."""
    shares = list(options.fractions)
    times = [problem.compute[node][d] for d in devices]
    if options.proportional and all(t > 0 for t in times):
        shares.append(round((1.0 / times[0]) / sum(1.0 / t for t in times), 2))
    return shares


def partners(allowed: Sequence[str], home: str, alike: Sequence[str]) -> list[str]:
    """The devices a two-way split with ``home`` pairs it with: every allowed device unlike ``home``,
    and of the devices like it (``alike``, :func:`peers`) only the next one. Pairs with the other like
    devices would be priced the same but for which device's memory and links they use, and on a host of
    eight GPUs they would make 72 pairs of every op, more columns than HiGHS searches in a minute
    (a two-layer GPT-3-width stack on ``8xh100-nvlink``: no split found in 30 s with every pair,
    optimal in about a second with one per home).

    Example:
        >>> partners(["cpu", "cuda:0", "cuda:1", "cuda:2"], "cuda:0", ["cuda:1", "cuda:2"])
        ['cpu', 'cuda:1']
    """
    like = set(alike)
    return [d for d in allowed if d != home and (d not in like or (alike and d == alike[0]))]


def _after(allowed: Sequence[str], home: str) -> list[str]:
    """The allowed devices after ``home`` in profile order, wrapping around."""
    i = list(allowed).index(home)
    return list(allowed[i + 1:]) + list(allowed[:i])


def peers(problem: Any, allowed: Sequence[str], home: str) -> list[str]:
    """The allowed devices after ``home`` (profile order, wrapping) with its figures and capacity
    (on whichever host: the links a split's copies cross are priced on their own)."""
    kinds = _LIKE.get(problem)
    if kinds is None:  # each device's figures without its name and host, once per problem
        host = problem.devices.device(problem.device_names[0]).host
        kinds = {d: (dataclasses.replace(problem.devices.device(d), name="peer", host=host), problem.capacity[d])
                 for d in problem.device_names}
        _LIKE[problem] = kinds
    return [d for d in _after(allowed, home) if kinds[d] == kinds[home]]


#: problem -> each device's figures and capacity (peers compares them for every node of a problem)
_LIKE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def proportional_shares(problem: Any, node: str, devices: Sequence[str]) -> tuple[float, ...] | None:
    """Each device's share of ``node`` proportional to its priced rate (``1 / t(d)`` of the whole
    op), two decimals, each at least 0.01, summing to one (None: a device cannot run it in finite time)."""
    times = [problem.compute[node][d] for d in devices]
    if any(not 0.0 < t < float("inf") for t in times):
        return None
    rates = [1.0 / t for t in times]
    shares = [max(0.01, round(r / sum(rates), 2)) for r in rates[1:]]
    first = round(1.0 - sum(shares), 10)
    return (first, *shares) if first >= 0.01 else None


def balanced_share(problem: Any, node: str, devices: tuple[str, str], axis: str) -> float:
    """Home's share (two decimals, in [0.01, 0.99]) at which, split along ``axis`` over ``devices``,
    the home shard takes as long as the other shard plus its copy back: the share that minimises the
    split's latency ``copy in + max(home, other + copy back)`` up to rounding (each side is monotone
    in the share). Found by bisection on :func:`price_offered` itself, once per problem, node, devices
    and axis (the offers and the ``hetegen`` baseline both ask).

    Example:
        >>> balanced_share(problem, "linear", ("cuda:0", "cpu"), "cols")   # doctest: +SKIP
        0.97
    """
    found = _BALANCED.setdefault(problem, {})
    key = (node, tuple(devices), axis)
    if key not in found:
        found[key] = _bisect_share(problem, node, tuple(devices), axis)
    return found[key]


#: problem -> (node, devices, axis) -> its balanced share
_BALANCED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bisect_share(problem: Any, node: str, devices: tuple[str, ...], axis: str) -> float:
    """:func:`balanced_share`'s bisection."""
    def home_ahead(f: float) -> bool:  # the home shard is still the longer branch at share f
        price = price_offered(problem, node, Split(axis, devices, (f, round(1.0 - f, 10))))
        return price.shard_s[0] >= price.shard_s[1] + price.copy_out_s  # two devices: one copy back

    low, high = 1, 99  # in hundredths: home_ahead(low / 100) may already hold, home_ahead(high / 100) may not
    if home_ahead(low / 100):
        return low / 100
    if not home_ahead(high / 100):
        return high / 100
    while high - low > 1:  # invariant: not home_ahead(low), home_ahead(high)
        mid = (low + high) // 2
        low, high = (low, mid) if home_ahead(mid / 100) else (mid, high)
    best = min((low, high), key=lambda h: price_offered(
        problem, node, Split(axis, devices, (h / 100, round(1.0 - h / 100, 10)))).latency_s)
    return best / 100


def price_offered(problem: Any, node: str, split: Split) -> SplitPrice:
    """The :class:`~partitioner.solvers.splits.SplitPrice` of ``split`` of ``node``, whatever its axis:
    a linear's (:func:`~partitioner.solvers.splits.price_split`), or a ``table`` or ``batch`` split's
    (:func:`~partitioner.solvers.split_axes.price_axis_split`)."""
    if split.axis in OP_AXES:
        return price_axis_split(problem, node, split)
    return price_split(problem, node, split)


def axis_choices(problem: Any, node: str, options: Any, device_sets: Sequence[tuple[str, ...]]) -> list[Any]:
    """The splits of ``node`` along the axes of :data:`OP_AXES` in ``options.axes``, over each
    ordered device tuple of ``device_sets`` (home first), at each offered share of home."""
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


def why_not_split(op: Any, graph: Any, axis: str, n_devices: int = 2) -> str | None:
    """Why ``op`` of ``graph`` takes no split along ``axis`` (any of :data:`AXES`; None: it does)."""
    if axis in OP_AXES:
        return why_not_on_axis(op, graph, axis, n_devices)
    experts = experts_weight(graph, op) is not None
    if axis == "experts" or (axis == "time" and experts):
        return None if experts else f"it is {op.kind}, and only a fused experts op (a grouped matmul over a 3-D " \
                                    f"weight) takes experts splits"
    why = why_not_splittable(op, graph.params)
    return None if why is None else why.replace("take splits", f"take {axis} splits")


def splits_it_takes(op: Any, graph: Any) -> str:
    """The axes ``op`` can take, in words for a refusal ("cols, rows or time splits", "batch
    splits", or "no split")."""
    axes = [a for a in AXES if why_not_split(op, graph, a) is None]
    return f"{', '.join(axes[:-1])} or {axes[-1]} splits" if len(axes) > 1 else f"{axes[0]} splits" if axes \
        else "no split"


def splittable_ops(graph: Any, options: SplitOptions | None) -> frozenset[str]:
    """The ops of ``graph`` that ``options`` may split: its linears (with their own 2-D weight) when
    ``options.axes`` names an axis of :data:`LINEAR_AXES`, and the ops taking one it names among
    ``table`` and ``batch`` (None: no op)."""
    if options is None:
        return frozenset()
    linears = any(a in LINEAR_AXES for a in options.axes)
    return frozenset(op.name for op in graph.ops.values() if linears and split_weight(op, graph.params)) \
        | splittable_on(graph, options.axes)
