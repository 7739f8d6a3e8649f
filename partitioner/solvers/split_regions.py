"""Split regions: column splits feeding a row split with nothing rejoined between (Megatron's MLP).

In: the original graph (its ops as :class:`Step` records, :func:`graph_steps`) and the splits a
placement (or a plan) gives its linears. Out: the region candidates of the graph
(:func:`region_candidates`: structure only), the regions a placement forms (:func:`formed`, and
:func:`regions_of` for a :class:`~partitioner.solvers.problem.Problem`'s placement), and what a formed
region saves against the same splits rejoined one by one (:class:`RegionPrice`, :func:`price_region`),
which :func:`~partitioner.solvers.problem.evaluate`, the ILP, the bounds and the oracle all read.

A *region* is a linear ``r`` whose input is produced, through *interior* ops only, by the linears
``c1..cm``: the interior ops are the ops on the paths from the ``c``'s to ``r``; every reader of a
``c``'s or an interior op's output is an interior op or ``r`` (never a graph output), an interior op
reads no parameter, and each ``c``'s output features are ``r``'s input features, or a divisor of
them (grouped key/value heads: k and v narrower than q, each of their features standing for a group
of query heads, repeated to them by ``unsqueeze``/``expand``/``reshape`` as HF's ``repeat_kv``
does). Interior ops are elementwise aten ops (:data:`ELEMENTWISE`, operands of one shape) or ops
that move the cut dimension or work beside it (:data:`HEAD_OPS`: views, transposes, slices and
concatenations along another dim, ``scaled_dot_product_attention`` over the heads). An interior op
may also read an *outside* tensor (:attr:`Region.outside`: an op's output that no ``c`` reaches, not
a linear the region could take: rotary tables, an attention mask, a gate) where it is the same for
every index of the cut dim (size 1 there, or no such dim: ``mul``/``add``/``sub``/``div``
broadcasting, an attention mask): each shard reads it whole. Each region tensor's *cut* (the dim the
shards divide and the ``c`` features per index of it) is followed from the ``c``'s outputs (their
last dim) through them, from shapes alone (:func:`_cuts`), so the planner's graph and the emitter's
fx graph find the same regions; ``r``'s input must come back cut along its last dim, and the largest
features per index (a head's, or a key/value head's group's) is the region's *granule*. Cases: an
MLP ``fc1 -> gelu -> fc2``, a SwiGLU ``silu(gate) * up -> down``, two linears back to back,
attention ``q, k, v -> unflatten, transpose -> sdpa -> transpose, flatten -> o_proj`` (by heads), HF
Llama's attention (the same with rotary tables and a mask from outside). A region whose interior
reads a parameter (a learned scale), an outside tensor cut like the region's (a full-width
residual), or repeats key/value heads otherwise (``repeat_interleave``) is not found.

A candidate *forms* under a placement when every ``c`` is split ``cols`` and ``r`` ``rows`` over the
same devices with the same fractions (so each device's shard of the ``c``'s outputs is its shard of
``r``'s input: :func:`~partitioner.solvers.splits.shard_sizes` of one width; a narrower ``c``'s
shards proportional), every shard a multiple of the granule (whole heads, whole groups), and every
interior op runs on the split's home. Anything else (members split otherwise, a hand-edited plan
whose members disagree, an interior op elsewhere) is not a region: its splits are priced and emitted
one by one.

Semantics of a formed region (``devices = (home, d1, ...)``, shares ``s_j``): the ``c``'s shards
are never rejoined; each device runs every interior op on its shard (``t_e(d_j, s_j)``: the op's
cost scaled to the share, like a split's shard) and ``r``'s shard on it; ``r``'s partial outputs are
summed at home. So each ``c``'s copies back to home and ``r``'s copies out of home are not made
(:attr:`RegionPrice.dropped`); the ``c``'s input copies and ``r``'s partials back remain, and each
outside tensor (available at home, where the interior ops ran whole) is copied home -> ``d_j`` for
every other device (:attr:`RegionPrice.added`: ``split`` transfers named after the op making it).
Priced:

* latency: :func:`~partitioner.solvers.splits.split_path_s` of one split whose shard on ``d_j`` is
  the ``c``'s shards, the interior ops' and ``r``'s shard there, whose copy to ``d_j`` is the ``c``'s
  input copies and the outside tensors' copies to it and whose copy back is ``r``'s partial (copies
  on distinct links overlap, on a shared link they wait, as for one split), in place of the separately rejoined splits' latencies
  plus the interior ops on home;
* busy time: home runs the interior ops' home shards in place of the whole ops, each other device
  its shards;
* links: the dropped copies' hops off, the outside tensors' copies' hops on (seconds, or bytes in a
  link budget), in ``evaluate`` and the ILP alike;
* memory: each other device's working set is at least the interior ops' shard working set plus the
  outside tensors' copies (home keeps the whole one it already counts: an overestimate by the
  shards' difference).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cost_models.precision import op_base_name
from partitioner.solvers.splits import Split, shard_sizes, split_op, split_path_s, split_weight

#: aten ops that act on each element of their operands (operands of one shape, or scalars), so a
#: shard of the last dimension in gives the same shard out.
ELEMENTWISE = frozenset({
    "gelu", "silu", "relu", "relu6", "tanh", "sigmoid", "erf", "exp", "neg", "square", "sqrt", "hardtanh",
    "leaky_relu", "elu", "mish", "hardswish", "hardsigmoid", "mul", "add", "sub", "div", "pow",
})


@dataclasses.dataclass(frozen=True)
class Step:
    """One op as region detection sees it (built from an OpGraph or an fx graph alike)."""

    kind: str                  # aten base name ("gelu", "linear"), "" for anything not aten
    reads: tuple[str, ...]     # the ops producing its tensor inputs ("" for a graph input)
    readers: tuple[str, ...]   # the ops reading its output
    params: bool               # it reads a parameter or buffer
    shape: tuple[int, ...]     # its one output's shape (() where it has several)
    in_shapes: tuple[tuple[int, ...], ...] = ()  # the shape of each of ``reads``


@dataclasses.dataclass(frozen=True)
class Region:
    """Column-split linears ``cols`` whose outputs reach ``row``'s input through ``interior`` only."""

    cols: tuple[str, ...]       # the column-split linears, in program order
    interior: tuple[str, ...]   # the ops between them, in program order
    row: str                    # the row-split linear
    width: int                  # features of the region's tensors (row's input, each col's output)
    granule: int = 1            # every shard's features a multiple of this (a head's, where heads are cut)
    layouts: tuple[tuple[int, int], ...] = ()  # per interior op: its output's cut dim and features per index
    outside: tuple[str, ...] = ()  # ops outside the region whose outputs interior ops read whole (rotary tables, masks)

    @property
    def members(self) -> tuple[str, ...]:
        return (*self.cols, *self.interior, self.row)


@dataclasses.dataclass(frozen=True)
class RegionPrice:
    """What a formed region changes against its members' splits rejoined one by one."""

    latency_s: float                       # the latency sum's change (negative: saved)
    busy_s: tuple[float, ...]              # each shard device's busy time change (split.devices order)
    work_bytes: tuple[int, ...]            # each device's interior working set (home: 0, counted whole)
    dropped: tuple[tuple[str, str, str, int, float], ...]  # copies not made: (split node, src, dst, bytes, s)
    added: tuple[tuple[str, str, str, int, float], ...] = ()  # outside tensors' copies: (op, home, d, bytes, s)


def graph_steps(graph: Any) -> dict[str, Step]:
    """Every op of an :class:`~partitioner.ir.OpGraph` as a :class:`Step`, in program order."""
    out = {}
    for op in graph.topological_order():
        readers = tuple(dict.fromkeys(c for t in op.outputs for c in graph.tensors[t].consumers))
        readers += ("",) if set(op.outputs) & set(graph.outputs) else ()  # a graph output is read whole
        shape = tuple(graph.tensors[op.outputs[0]].shape) if len(op.outputs) == 1 else ()
        kind = op_base_name(op.kind) if op.kind.startswith("aten.") else ""
        first = {}
        for t in op.inputs:
            first.setdefault(graph.tensors[t].producer or "", tuple(graph.tensors[t].shape))
        out[op.name] = Step(kind, tuple(first), readers, bool(op.params), shape, tuple(first.values()))
    return out


def graph_widths(graph: Any) -> dict[str, tuple[int, int]]:
    """Each splittable linear's weight shape ``(out, in)`` (:func:`~partitioner.solvers.splits.split_weight`)."""
    out = {}
    for op in graph.ops.values():
        weight = split_weight(op, graph.params)
        if weight is not None:
            out[op.name] = tuple(graph.params[weight].shape)
    return out


def region_candidates(steps: Mapping[str, Step], widths: Mapping[str, tuple[int, int]]) -> tuple[Region, ...]:
    """Every region of the graph (see the module docstring), whatever the placement.

    ``steps``: the ops in program order; ``widths``: the linears that take splits, with their
    weight's ``(out, in)``.

    Example:
        >>> [r.members for r in region_candidates(graph_steps(g), graph_widths(g))]   # doctest: +SKIP
        [('linear_4', 'gelu', 'linear_5')]
    """
    order = {name: i for i, name in enumerate(steps)}
    out = []
    for row, (_, width) in widths.items():
        if len(steps[row].reads) != 1 or not steps[row].reads[0]:
            continue
        cols, maybe, ok = set(), set(), True
        frontier, seen = [steps[row].reads[0]], set()
        while frontier and ok:
            u = frontier.pop()
            if u in seen:
                continue
            seen.add(u)
            step = steps.get(u)
            if step is None or u == row or not step.shape:
                ok = False
            elif u in widths and width % widths[u][0] == 0 and len(step.reads) == 1 \
                    and step.shape[-1] == widths[u][0]:
                cols.add(u)  # narrower than the row's input: grouped key/value heads, each feature for several
            elif step.kind in ELEMENTWISE | HEAD_OPS and not step.params and step.reads:
                maybe.add(u)
                frontier.extend(step.reads)
        interior = set()  # the ops reached from the cols; every other read is an outside tensor
        for u in sorted(maybe, key=order.get):
            if set(steps[u].reads) & (cols | interior):
                interior.add(u)
        outside = {r for u in interior for r in steps[u].reads} - cols - interior
        inside = interior | {row}
        if not ok or not cols or any(not set(steps[u].readers) <= inside for u in cols | interior) \
                or any(not r or r not in steps or r in widths for r in outside):
            continue
        ordered = tuple(sorted(interior, key=order.get))
        cut = _cuts(steps, {c: width // widths[c][0] for c in cols}, ordered)
        last = cut.get(steps[row].reads[0]) if cut is not None else None
        if last is None or last != (len(steps[steps[row].reads[0]].shape) - 1, 1):
            continue
        granule = math.lcm(*(unit for _, unit in cut.values()))
        out.append(Region(tuple(sorted(cols, key=order.get)), ordered, row, width, granule,
                          tuple(cut[e] for e in ordered), tuple(sorted(outside, key=order.get))))
    return tuple(sorted(out, key=lambda r: order[r.row]))


#: aten ops between a region's linears that move or regroup the cut dimension (heads): views,
#: transposes, attention over the heads, copies
HEAD_OPS = frozenset({"unflatten", "view", "reshape", "_unsafe_view", "flatten", "transpose", "permute",
                      "scaled_dot_product_attention", "clone", "contiguous", "alias", "slice", "cat", "unsqueeze",
                      "expand"})
_RESHAPES = frozenset({"unflatten", "view", "reshape", "_unsafe_view", "flatten"})
_PERMUTES = frozenset({"transpose", "permute"})


def _cuts(steps: Mapping[str, Step], cols: Mapping[str, int],
          interior: Sequence[str]) -> dict[str, tuple[int, int]] | None:
    """Each region tensor's cut: ``(dim, row features per index)``, from the cols' outputs (their
    last dim; ``cols[c]`` row features per feature of ``c``: 1, or a key/value col's query heads per
    key/value head) through the interior ops in program order, read from shapes alone (so the
    planner's and the emitter's graphs agree); None where an op cannot run on a shard."""
    cut: dict[str, tuple[int, int]] = {c: (len(steps[c].shape) - 1, per) for c, per in cols.items()}
    for e in interior:
        step = steps[e]
        whole = [shape for r, shape in zip(step.reads, step.in_shapes) if r not in cut]  # outside tensors
        ins = [cut[r] for r in step.reads if r in cut]
        shapes = [shape for r, shape in zip(step.reads, step.in_shapes) if r in cut]
        if whole and step.kind not in ("mul", "add", "sub", "div", "scaled_dot_product_attention"):
            return None
        if step.kind in ELEMENTWISE or step.kind in ("clone", "contiguous", "alias"):
            if len(set(ins)) != 1 or any(shape != step.shape for shape in shapes) \
                    or not all(_broadcast(shape, step.shape, ins[0][0]) for shape in whole):
                return None
            cut[e] = ins[0]
        elif step.kind == "unsqueeze" and len(ins) == 1:
            dim, unit = ins[0]
            shape = shapes[0]
            at = next((i for i in range(len(step.shape)) if step.shape[i] == 1
                       and tuple(step.shape[:i]) + tuple(step.shape[i + 1:]) == tuple(shape)), None)
            if at is None:
                return None
            cut[e] = (dim + (at <= dim), unit)
        elif step.kind == "expand" and len(ins) == 1:
            dim, _ = ins[0]
            if len(step.shape) != len(shapes[0]) or step.shape[dim] != shapes[0][dim]:
                return None  # repeats along the cut dim
            cut[e] = ins[0]
        elif step.kind == "slice" and len(ins) == 1:
            dim, _ = ins[0]
            if len(step.shape) != len(shapes[0]) or step.shape[dim] != shapes[0][dim]:
                return None  # the slice cuts the cut dim
            cut[e] = ins[0]
        elif step.kind == "cat" and ins:
            dim, _ = ins[0]
            if len(set(ins)) != 1 or any(len(s) != len(step.shape) or s[dim] != step.shape[dim] for s in shapes):
                return None  # joined along the cut dim
            cut[e] = ins[0]
        elif step.kind in _RESHAPES and len(ins) == 1:
            moved = _reshaped(step.in_shapes[0], step.shape, *ins[0])
            if moved is None:
                return None
            cut[e] = moved
        elif step.kind in _PERMUTES and len(ins) == 1:
            dim, unit = ins[0]
            shape = tuple(shapes[0])
            size = shape[dim]
            swaps = [(a, b) for a in range(len(shape)) for b in range(a + 1, len(shape))
                     if _swapped(shape, a, b) == tuple(step.shape)] if step.kind == "transpose" and shape != step.shape else []
            moved = {b if a == dim else a if b == dim else dim for a, b in swaps}
            if len(moved) == 1:  # the one swap that gives this shape (heads and tokens told apart by it)
                cut[e] = (moved.pop(), unit)
            elif sorted(shape) != sorted(step.shape) or list(step.shape).count(size) != 1:
                return None  # not a permutation, or the cut dim cannot be told apart by its size
            else:
                cut[e] = (list(step.shape).index(size), unit)
        elif step.kind == "scaled_dot_product_attention" and len(ins) == 3 and len(whole) <= 1:
            q, k, _ = shapes
            heads = len(q) - 3
            if len(set(ins)) != 1 or ins[0][0] != heads or q != k or step.shape[:-1] != q[:-1] \
                    or not all(_broadcast(mask, step.shape, heads) for mask in whole):
                return None  # heads cut alike in q, k and v (no grouped heads), a mask alike for every head
            cut[e] = ins[0]
        else:
            return None
    return cut


def _swapped(shape: tuple[int, ...], a: int, b: int) -> tuple[int, ...]:
    out = list(shape)
    out[a], out[b] = out[b], out[a]
    return tuple(out)


def _broadcast(shape: Sequence[int], out: Sequence[int], dim: int) -> bool:
    """Whether an outside tensor of ``shape`` broadcasts against ``out`` alike for every index of
    its cut dim ``dim`` (size 1 there, or no such dim): each shard reads it whole."""
    at = dim - (len(out) - len(shape))
    return len(shape) <= len(out) and (at < 0 or shape[at] == 1)


def _reshaped(shape: Sequence[int], out: Sequence[int], dim: int, unit: int) -> tuple[int, int] | None:
    """Where a reshape from ``shape`` to ``out`` puts the cut dim ``dim`` (``unit`` features per
    index): the dim of ``out`` after the same leading elements, split (more features per index) or
    merged with the dims right after it (fewer); None where the cut is not the outermost of them."""
    pre = math.prod(shape[:dim])
    at = next((i for i in range(len(out)) if math.prod(out[:i]) == pre and out[i] != 1), None)
    if at is None:
        return None
    size, new = shape[dim], out[at]
    if new == size:
        return at, unit
    if new < size and size % new == 0 and any(math.prod(out[at + 1:at + 1 + m]) == size // new
                                              for m in range(1, len(out) - at)):
        return at, unit * (size // new)
    merged = new // size if new % size == 0 else 0
    if merged and unit % merged == 0 and any(math.prod(shape[dim + 1:dim + 1 + m]) == merged
                                             for m in range(1, len(shape) - dim)):
        return at, unit // merged
    return None


def formed(candidates: Sequence[Region], split_of: Callable[[str], tuple[str, tuple, tuple] | None],
           device_of: Callable[[str], str], widths: Mapping[str, tuple[int, int]]) -> tuple[Region, ...]:
    """The candidates that form a region: every col split ``cols``, the row ``rows``, over the same
    devices with the same fractions and shard sizes, every interior op on their home.

    ``split_of(op)``: ``(axis, devices, fractions)`` of the op's split, or None where it is whole;
    ``device_of(op)``: the device it runs on (a split op: its home). The one rule price and emission
    both apply (a plan's sections, or a placement)."""
    out = []
    for region in candidates:
        row = split_of(region.row)
        if row is None or row[0] != "rows":
            continue
        _, devices, fractions = row
        sizes = shard_sizes(widths[region.row][1], fractions)
        if all(size % region.granule == 0 for size in sizes) and all(
                split_of(c) is not None and split_of(c)[0] == "cols" and tuple(split_of(c)[1]) == tuple(devices)
                and tuple(split_of(c)[2]) == tuple(fractions) and _scaled(widths[c][0], region.width, fractions) == sizes
                for c in region.cols) and all(device_of(e) == devices[0] for e in region.interior):
            out.append(region)
    return tuple(out)


def _scaled(out: int, width: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """A col of ``out`` features' shard sizes at ``fractions``, in row features (``width`` of them):
    a key/value col's shards hold whole groups of query heads when these equal the row's."""
    return tuple(s * (width // out) for s in shard_sizes(out, fractions))


# -- a problem's regions ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RegionOffer:
    """The regions a problem can form and their prices (``Problem.region_offer``)."""

    regions: tuple[Region, ...] = ()                       # the candidates whose members are nodes that split
    price: Mapping[tuple[int, Split], RegionPrice] = dataclasses.field(default_factory=dict)  # (index, cols split)
    node_of: Mapping[str, str] = dataclasses.field(default_factory=dict)  # op -> its node
    widths: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # linear -> (out, in)
    spared: Mapping[tuple[str, Any], frozenset] = dataclasses.field(default_factory=dict)  # (node, split) -> copies

    def linears(self) -> frozenset[str]:
        """The nodes that are a col or the row of some candidate (their splits may drop copies)."""
        return frozenset(self.node_of[op] for r in self.regions for op in (*r.cols, r.row))

    def interior_nodes(self, index: int) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.node_of[e] for e in self.regions[index].interior))


def offer_regions(problem: Any) -> RegionOffer:
    """The candidates ``problem`` can form (each col and the row a node of its own that takes splits,
    views folded in aside; each interior op in a node of that region's interior ops only) and the
    price of every split all of a candidate's members are offered."""
    g = problem.original
    node_of = {m: n for n, ms in problem.members.items() for m in ms}
    widths = graph_widths(g)
    regions = []
    for region in region_candidates(graph_steps(g), widths):
        linears = (*region.cols, region.row)
        if any(node_of[op] not in problem.split_choices or split_op(problem, node_of[op]).name != op for op in linears):
            continue
        if any(set(problem.members[node_of[e]]) - set(region.interior) for e in region.interior):
            continue
        regions.append(region)
    offer = RegionOffer(tuple(regions), {}, node_of, widths)
    price = {}
    for i, region in enumerate(offer.regions):
        for sp in problem.split_choices[node_of[region.cols[0]]]:
            if not isinstance(sp, Split) or sp.axis != "cols":
                continue
            row = dataclasses.replace(sp, axis="rows")
            if row not in problem.split_choices[node_of[region.row]] or any(
                    sp not in problem.split_choices[node_of[c]] for c in region.cols):
                continue
            price[(i, sp)] = price_region(problem, offer, region, sp)
    spared: dict[tuple[str, Any], set] = {}  # each member split's copies some region could drop
    for (i, sp), region_price in price.items():
        row = dataclasses.replace(sp, axis="rows")
        for n, src, dst, _, _ in region_price.dropped:
            for split in (sp, row):
                spared.setdefault((n, split), set()).add((src, dst))
    return dataclasses.replace(offer, price=price, spared={k: frozenset(v) for k, v in spared.items()})


def _as_triple(sp: Any) -> tuple[str, tuple, tuple] | None:
    return (sp.axis, tuple(sp.devices), tuple(sp.fractions)) if isinstance(sp, Split) else None


def regions_of(problem: Any, placement: Any) -> tuple[tuple[int, Split], ...]:
    """The regions ``placement`` forms in ``problem``: each one's index in ``problem.region_offer``
    and its cols' split (together the key of its price). A pure function of the placement, so
    evaluate, the ILP's answer and the oracle agree on it.

    Example:
        >>> regions_of(problem, placement)                      # doctest: +SKIP
        ((0, Split(axis='cols', devices=('cuda:0', 'cpu'), fractions=(0.5, 0.5))),)
    """
    offer = problem.region_offer
    if not offer.price:
        return ()
    node_of = offer.node_of

    def split_of(op: str) -> tuple[str, tuple, tuple] | None:
        return _as_triple(placement.split.get(node_of[op]))

    def device_of(op: str) -> str:
        n = node_of[op]
        return placement.device[n] if n not in placement.streamed and n not in placement.split else ""

    index = {r: i for i, r in enumerate(offer.regions)}
    keys = ((index[r], placement.split[node_of[r.cols[0]]]) for r in formed(offer.regions, split_of, device_of,
                                                                               offer.widths))
    return tuple(k for k in keys if k in offer.price)


def _interior_shards(problem: Any, interior: Sequence[str], width: int, split: Split) -> tuple[list[float], list[int]]:
    """Each device's time and working set running the ops ``interior`` on its shard."""
    g = problem.original
    sizes = shard_sizes(width, split.fractions)
    times, work = [0.0] * len(sizes), [0] * len(sizes)
    for e in interior:
        op = g.ops[e]
        whole = sum(g.tensors[t].nbytes for t in op.inputs + op.outputs)
        for j, (d, size) in enumerate(zip(split.devices, sizes)):
            share = size / width
            shard = dataclasses.replace(op, flops=int(op.flops * share), bytes_read=int(op.bytes_read * share),
                                        bytes_written=int(op.bytes_written * share))
            times[j] += problem.costs.op_time(shard, problem.devices.device(d)).seconds
            work[j] = max(work[j], int(whole * share))
    return times, work


def price_region(problem: Any, offer: RegionOffer, region: Region, split: Split) -> RegionPrice:
    """What ``region`` formed with its cols split ``split`` (its row split alike along ``rows``)
    changes against the same splits rejoined one by one (see the module docstring)."""
    node_of = offer.node_of
    home, devices = split.home, split.devices
    cols = [(node_of[c], problem.split_price[(node_of[c], split)]) for c in region.cols]
    row_node = node_of[region.row]
    row = problem.split_price[(row_node, dataclasses.replace(split, axis="rows"))]
    interior_nodes = tuple(dict.fromkeys(node_of[e] for e in region.interior))
    whole = sum(problem.compute[n][home] for n in interior_nodes)
    shard_t, shard_work = _interior_shards(problem, region.interior, region.width, split)
    dropped = [(n, src, dst, b, s) for n, price in cols for src, dst, b, s in price.copies if dst == home]
    dropped += [(row_node, src, dst, b, s) for src, dst, b, s in row.copies if src == home]
    added = [(o, home, d, nbytes, problem.transfer_s(nbytes, home, d))
             for o, nbytes in outside_bytes(problem.original, region) for d in devices[1:]]
    ins = [sum(s for _, price in cols for src, dst, _, s in price.copies if src == home and dst == d)
           + sum(s for _, _, dst, _, s in added if dst == d) for d in devices[1:]]
    backs = [sum(s for src, dst, _, s in row.copies if src == d and dst == home) for d in devices[1:]]
    branches = [sum(price.shard_s[j] for _, price in cols) + shard_t[j] + row.shard_s[j] for j in range(len(devices))]
    path = split_path_s(problem, devices, branches, ins, backs)
    separate = sum(price.latency_s for _, price in cols) + whole + row.latency_s
    busy = tuple(shard_t[j] - (whole if j == 0 else 0.0) for j in range(len(devices)))
    held = sum(nbytes for _, nbytes in outside_bytes(problem.original, region))  # the copies on each other device
    work = tuple(0 if j == 0 else w + held for j, w in enumerate(shard_work))
    return RegionPrice(path - separate, busy, work, tuple(dropped), tuple(added))


def outside_bytes(graph: Any, region: Region) -> tuple[tuple[str, int], ...]:
    """Each outside tensor ``region``'s interior reads (its producing op) and its bytes in ``graph``."""
    return tuple((o, graph.tensors[graph.ops[o].outputs[0]].nbytes) for o in region.outside)


def interior_floor(problem: Any, node: str) -> float:
    """The least an interior node can be charged in any region, in the latency sum or on one device
    (its fastest shard); ``inf`` where it is in no region. Bounds take the smaller of this and the
    whole node's time."""
    offer, best = problem.region_offer, float("inf")
    for i, sp in offer.price:
        region = offer.regions[i]
        members = [e for e in region.interior if offer.node_of[e] == node]
        if members:
            times, _ = _interior_shards(problem, members, region.width, sp)
            best = min(best, min(times))
    return best


def droppable(problem: Any, node: str, split: Any) -> frozenset[tuple[str, str]]:
    """The ``(src, dst)`` copies of ``node``'s ``split`` some region could drop (bounds leave them out)."""
    return problem.region_offer.spared.get((node, split), frozenset())


@dataclasses.dataclass(frozen=True)
class RegionEffect:
    """What the regions of one placement change in its evaluation (every region's price, summed)."""

    busy_s: Mapping[str, float]          # device -> busy time change
    extra_s: float                       # latency: the change beyond the busy times'
    link_s: Mapping[str, float]          # link label -> load change (the dropped copies' hops)
    work_bytes: Mapping[str, int]        # device -> the largest interior shard working set there
    dropped: frozenset[tuple[str, str, str]]  # (split node, src, dst) of each copy not made
    added: tuple[tuple[str, str, str, int, float], ...] = ()  # outside tensors' copies made: (op, home, d, bytes, s)


def region_effect(problem: Any, placement: Any) -> RegionEffect:
    """The :class:`RegionEffect` of ``placement``'s regions (:func:`regions_of`) in ``problem``."""
    busy: dict[str, float] = {}
    links: dict[str, float] = {}
    work: dict[str, int] = {}
    extra, dropped, added = 0.0, set(), []
    for key in regions_of(problem, placement):
        price, split = problem.region_offer.price[key], key[1]
        for d, b, w in zip(split.devices, price.busy_s, price.work_bytes):
            busy[d] = busy.get(d, 0.0) + b
            work[d] = max(work.get(d, 0), w)
        extra += price.latency_s - sum(price.busy_s)
        for n, src, dst, nbytes, _ in price.dropped:
            dropped.add((n, src, dst))
            for label in problem.hops(src, dst):
                links[label] = links.get(label, 0.0) - problem.hop_s(nbytes, src, dst, label)
        for copy in price.added:
            _, src, dst, nbytes, _ = copy
            added.append(copy)
            for label in problem.hops(src, dst):
                links[label] = links.get(label, 0.0) + problem.hop_s(nbytes, src, dst, label)
    return RegionEffect(busy, extra, links, work, frozenset(dropped), tuple(added))


def interior_ops(graph: Any) -> frozenset[str]:
    """The interior ops of every region candidate of an OpGraph (with splits asked, the planner keeps
    them out of coarse groups, as it keeps the splittable linears, so every region can form)."""
    return frozenset(e for r in region_candidates(graph_steps(graph), graph_widths(graph)) for e in r.interior)
