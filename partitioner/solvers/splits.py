"""Splits: one linear's weight cut over two or more devices, and what such a cut costs.

(Embeddings split by table rows and elementwise ops and norms split by batch are
:mod:`partitioner.solvers.split_axes`'s, fused experts ops' :mod:`partitioner.solvers.expert_streaming`'s
and :mod:`partitioner.solvers.expert_devices`'; :mod:`partitioner.solvers.split_offers` offers and
prices every kind. This module imports none of them: :func:`assemble_price` builds their prices.)

In: an op of the original graph (an aten ``linear`` whose own 2-D weight no other op reads), the
problem's devices and cost model, and :class:`SplitOptions`. Out: :class:`Split` values (which ones
an op is offered is :mod:`partitioner.solvers.split_offers`'s) and each one's :class:`SplitPrice`
(:func:`price_split`), which :func:`~partitioner.solvers.problem.evaluate`, the ILP, the bounds and
the oracle all read.

A split is a kind of placement (``DESIGN.md``, "Splits are a kind of placement"). Its semantics,
for a linear ``y = x W^T + b`` with ``W`` of shape ``[out, in]`` placed with ``devices = (d_0 = home,
d_1, ..., d_{n-1})`` and ``fractions = (f_0, ..., f_{n-1})`` summing to one, each device keeping a
block of :func:`shard_sizes` in device order:

* ``cols`` (output features): ``d_i`` keeps its block of the rows of ``W`` (and of ``b``). The
  input ``x`` (on ``home``, where the node's inputs arrive as for any op) is copied whole to each
  other device; each device computes its shard of ``y``; each other shard is copied back and the
  shards are concatenated on ``home``, where the node's consumers read ``y``;
* ``rows`` (the reduction dimension): ``d_i`` keeps its block of the columns of ``W``, ``home`` the
  whole bias; only ``d_i``'s slice of ``x[..., :]`` is copied to it; each other device's partial
  product (the whole output's bytes) is copied back and the partials are summed on ``home``.

Prices (``t(d, g)``: the cost model's time of the op scaled to a share ``g`` of its flops and
weight bytes on device ``d``, its input read whole for ``cols`` and in part for ``rows``; ``t_i =
t(d_i, f_i)``; ``in_i``, ``out_i``: the copy home -> ``d_i`` and back, each the transfer time of
its bytes over the route):

* latency (:func:`split_path_s`): the copies out run in device order, each starting when every
  link on its route (``problem.hops`` labels) is free, so copies on distinct links overlap and
  copies sharing one wait for each other: ``A_i = max(0, free links) + in_i``, ``sent = max_i A_i``.
  ``home``'s shard starts at ``sent`` (it is issued after the copies; asynchronous on an
  accelerator) and ends at ``sent + t_0``; ``d_i``'s shard ends at ``A_i + t_i``, then its copy
  back runs, in device order, when its links are free: ``B_i = max(A_i + t_i, free links) +
  out_i``. The op adds ``max(sent + t_0, max_i B_i)`` (computed as ``sent + max(t_0, max_i (B_i -
  sent))``). With two devices that is ``in_1 + max(t_0, t_1 + out_1)``: the home shard beside the
  other shard and its copy back (the concatenation or sum on ``home`` is a copy of the output the
  size of the op's own write, left out as it is for a ``cat`` beside a matmul);
* throughput: each device is busy its ``t_i``; every copy loads its links, in every objective;
* memory: each device holds its shard of the weight (``home`` the bias too for ``rows``); ``home``
  the op's whole working set, each other device its shard's (its input copy and its output shard);
* a split op's weights are never streamed. Splits are priced for inference (no training, no
  precision, no pipeline stages, not ``makespan``); :class:`~partitioner.solvers.problem.Problem`
  refuses the other combinations by name.

Which splits an op is offered (degrees, groups of devices, fractions) is
:mod:`partitioner.solvers.split_offers`'s.

A split in time (axis ``time``: one accelerator computing the linear from chunks of its weight
streamed from the host) is :mod:`partitioner.solvers.chunked_streaming`'s; it is priced as a
:class:`SplitPrice` too (every copy listed in ``copies``, which every reader of a price sums).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from cost_models.precision import op_base_name
from partitioner.errors import HetpartError

#: The axes an op may be split along, and what each means (``table`` and ``batch``: ops other than
#: linears, :mod:`partitioner.solvers.split_axes`).
AXES: dict[str, str] = {
    "cols": "output features: weight rows split, the output shards concatenated",
    "rows": "reduction dimension: weight columns and the input split, the partial outputs summed",
    "time": "in time: the weight's row chunks (a fused experts op's expert groups) streamed from the host one "
            "after another through a few chunk buffers on one accelerator (partitioner/solvers/chunked_streaming.py, "
            "expert_streaming.py)",
    "experts": "a fused experts op's experts divided between two devices, the routed rows copied to the other "
               "and its output summed back (partitioner/solvers/expert_devices.py)",
    "table": "table rows: an embedding's table cut into blocks of rows, the indices copied to each device, each "
             "block's lookups (others masked to zero) summed at home (partitioner/solvers/split_tables.py)",
    "batch": "batch: an elementwise op's or a norm's rows (the leading dimension, or the sequence when the batch is "
             "smaller than the devices) cut over the devices, the outputs concatenated at home; a norm's weight and "
             "bias on every device (partitioner/solvers/split_batches.py)",
}
#: The axes of linears (:data:`SPLITTABLE_OPS`); the others' ops are named in split_axes.py.
LINEAR_AXES = ("cols", "rows", "time")
#: Op kinds (aten base names) that take cols, rows and time splits.
SPLITTABLE_OPS = frozenset({"linear"})


@dataclasses.dataclass(frozen=True)
class SplitOptions:
    """Which splits a problem offers (``Options.splits``; ``None`` there: none)."""

    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # the home device's share, each in (0, 1)
    proportional: bool = True                         # also the share proportional to each device's rate
    balanced: bool = True                             # also the share whose two branches end together
    axes: tuple[str, ...] = ("cols", "rows")         # among AXES ("time" opts in to time splits)
    chunks: tuple[int, ...] = (2, 4, 8, 16, 32)       # time splits: the chunk counts offered, each >= 2
    degrees: tuple[int, ...] = (2, 4, 8)              # how many devices a split may span, each >= 2 (see split_choices)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        object.__setattr__(self, "axes", tuple(self.axes))
        object.__setattr__(self, "chunks", tuple(self.chunks))
        object.__setattr__(self, "degrees", tuple(self.degrees))
        bad_degrees = [n for n in self.degrees if isinstance(n, bool) or not isinstance(n, int) or n < 2]
        if bad_degrees or not self.degrees:
            raise HetpartError(f"split degrees {list(self.degrees)}: each is a whole number of devices a split spans, "
                               f"at least 2, e.g. (2, 4, 8) (CLI: --split cols,rows@2/4/8)")
        bad_chunks = [n for n in self.chunks if isinstance(n, bool) or not isinstance(n, int) or n < 2]
        if bad_chunks or not self.chunks:
            raise HetpartError(f"split chunks {list(self.chunks)}: each is a whole number of weight chunks a time "
                               f"split streams, at least 2, e.g. (4, 8, 16)")
        bad = [f for f in self.fractions if not 0.0 < f < 1.0]
        if bad:
            raise HetpartError(f"split fractions {bad} are not in (0, 1): each is the home device's share of "
                               f"the op, e.g. (0.25, 0.5, 0.75)")
        unknown = [a for a in self.axes if a not in AXES]
        if unknown or not self.axes:
            raise HetpartError(f"split axes {list(self.axes)}: each must be one of {', '.join(AXES)}")


def resolve_splits(value: Any) -> SplitOptions | None:
    """The ``splits`` option as :class:`SplitOptions` (None: no splits).

    Takes None or False (off), True or ``"on"`` (the defaults), a :class:`SplitOptions`, a mapping
    of its fields (``{"fractions": [0.5], "axes": ["cols"], "degrees": [2, 8]}``), or the CLI's text
    ``AXES[:F/F...][@D/D...]`` (``"cols"``, ``"cols,rows:0.25/0.5/0.75"``, ``"cols,rows@2/8"``: the
    degrees, how many devices a split may span; ``"time"`` adds time splits, whose chunk counts a
    ``/``-separated list of whole numbers names when ``time`` is the only axis: ``"time:8/16"``).

    Example:
        >>> resolve_splits("cols:0.5").fractions, resolve_splits("cols:0.5").axes
        ((0.5,), ('cols',))
        >>> resolve_splits("cols,rows@8").degrees
        (8,)
    """
    if value is None or value is False or value == "off":
        return None
    if value is True or value == "on":
        return SplitOptions()
    if isinstance(value, SplitOptions):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {f.name for f in dataclasses.fields(SplitOptions)})
        if unknown:
            raise HetpartError(f"splits={dict(value)!r}: unknown key {unknown[0]!r}; the keys are fractions, "
                               f"proportional, balanced, axes, chunks and degrees")
        return SplitOptions(**value)
    if isinstance(value, str):
        text, at, degrees_text = value.partition("@")
        degrees: dict[str, tuple[int, ...]] = {}
        if at:
            try:
                degrees = {"degrees": tuple(int(n) for n in degrees_text.split("/"))}
            except ValueError:
                raise HetpartError(f"--split {value!r}: degrees (after '@') are whole numbers of devices separated "
                                   f"by '/', e.g. cols,rows@2/4/8") from None
        axes_text, _, fractions_text = text.partition(":")
        axes = tuple(a.strip() for a in axes_text.split(",") if a.strip())
        if axes == ("time",) and fractions_text:
            try:
                chunks = tuple(int(n) for n in fractions_text.split("/"))
            except ValueError:
                raise HetpartError(f"--split {value!r}: time splits take chunk counts, whole numbers separated by "
                                   f"'/', e.g. time:8/16") from None
            return SplitOptions(axes=axes, chunks=chunks, **degrees)
        try:
            fractions = tuple(float(f) for f in fractions_text.split("/")) if fractions_text else None
        except ValueError:
            raise HetpartError(f"--split {value!r}: fractions are numbers separated by '/', e.g. "
                               f"cols,rows:0.25/0.5/0.75") from None
        return SplitOptions(**({"fractions": fractions} if fractions else {}), axes=axes or ("cols", "rows"),
                            **degrees)
    raise HetpartError(f"splits={value!r}: expected True, 'on', 'AXES[:F/F...][@D/D...]' (e.g. 'cols:0.25/0.5/0.75', "
                       f"'cols,rows@2/8') or {{'fractions': [...], 'axes': [...], 'degrees': [...]}}")


@dataclasses.dataclass(frozen=True, order=True)
class Split:
    """One op split over ``n >= 2`` distinct devices: ``devices[0]`` (home) reads its input and
    rejoins its output; ``fractions[i]`` is ``devices[i]``'s share (they sum to one)."""

    axis: str
    devices: tuple[str, ...]
    fractions: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.devices) < 2 or len(set(self.devices)) != len(self.devices) \
                or len(self.fractions) != len(self.devices):
            raise HetpartError(f"split {self.axis} over {list(self.devices)} with fractions {list(self.fractions)}: a "
                               f"split spans two or more distinct devices, one fraction each")

    @property
    def home(self) -> str:
        return self.devices[0]

    @property
    def others(self) -> tuple[str, ...]:
        """The devices beside home, in order."""
        return self.devices[1:]

    @property
    def label(self) -> str:
        """``cols[cuda:0=0.75,cpu=0.25]``: the split in one word (row and column names use it)."""
        return f"{self.axis}[" + ",".join(f"{d}={f:g}" for d, f in zip(self.devices, self.fractions)) + "]"

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "devices": list(self.devices), "fractions": list(self.fractions)}


@dataclasses.dataclass(frozen=True)
class SplitPrice:
    """What one split costs (see the module docstring); tuples per device, in the split's order."""

    devices: tuple[str, ...]            # the split's devices, home first
    shard_s: tuple[float, ...]          # each shard's compute time on its device
    param_bytes: tuple[int, ...]        # each device's bytes of the op's parameters
    work_bytes: tuple[int, ...]         # each device's working set
    latency_s: float                    # seconds the split op adds to one sample's sequential path
    copies: tuple[tuple[str, str, int, float], ...] = ()  # every copy: (src, dst, bytes, seconds)

    @property
    def copy_in(self) -> int:
        """Bytes copied out of home (to the other devices)."""
        return sum(b for src, _, b, _ in self.copies if src == self.devices[0])

    @property
    def copy_out(self) -> int:
        """Bytes copied back to home."""
        return sum(b for _, dst, b, _ in self.copies if dst == self.devices[0])

    @property
    def copy_in_s(self) -> float:
        return sum(s for src, _, _, s in self.copies if src == self.devices[0])

    @property
    def copy_out_s(self) -> float:
        return sum(s for _, dst, _, s in self.copies if dst == self.devices[0])

    @property
    def critical_s(self) -> float:
        """The least any objective can charge the op: its longest shard."""
        return max(self.shard_s)


def split_weight(op: Any, params: Mapping[str, Any]) -> str | None:
    """The parameter a split cuts, or None: ``op`` is an aten linear whose own 2-D weight no other op
    reads (a tied embedding table is read by its gather too, so that linear stays whole)."""
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in SPLITTABLE_OPS:
        return None
    for name in op.owned_params:
        param = params.get(name)
        if param is None or len(param.shape) != 2:
            continue
        return name if tuple(param.users) == (op.name,) else None
    return None


def why_not_splittable(op: Any, params: Mapping[str, Any]) -> str | None:
    """Why ``op`` takes no split (None: it does), in words for a refusal."""
    if split_weight(op, params) is not None:
        return None
    if op.kind.split(".")[0] != "aten" or op_base_name(op.kind) not in SPLITTABLE_OPS:
        return f"it is {op.kind}, and only aten linear ops take splits"
    return "its 2-D weight is read by another op too (tied), or it owns none"


def shard_sizes(length: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Rows (``cols``) or columns (``rows``) of the weight each device keeps: the cut after device
    ``i`` at ``round(length * (f_0 + ... + f_i))``, moved so that every device keeps at least one
    (two devices: home's share rounded). The emitter cuts with the same sizes.

    Example:
        >>> shard_sizes(10, (0.75, 0.25)), shard_sizes(8, (1 / 3, 1 / 3, 1 / 3))
        ((8, 2), (3, 2, 3))
    """
    n = len(fractions)
    if length < n:
        raise HetpartError(f"a dimension of {length} cannot be split over {n} devices (each keeps at least one)")
    cuts, total = [0], 0.0
    for i, f in enumerate(fractions[:-1]):
        total += f
        cuts.append(min(max(cuts[-1] + 1, round(length * total)), length - (n - 1 - i)))
    cuts.append(length)
    return tuple(b - a for a, b in zip(cuts, cuts[1:]))


def _bias_param(op: Any, params: Mapping[str, Any], weight: str) -> Any:
    return next((params[n] for n in op.owned_params if n != weight and n in params and len(params[n].shape) == 1),
                None)


def split_path_s(problem: Any, devices: Sequence[str], shard_s: Sequence[float],
                 copies_in: Sequence[float], copies_out: Sequence[float]) -> float:
    """Seconds from a split op's input on home to its output rejoined there (the module
    docstring's latency): ``copies_in[i]``/``copies_out[i]`` are the copy to and from
    ``devices[i + 1]``. Copies run in device order, each when every link of its route
    (``problem.hops``) is free; the home shard starts when the last copy out is done (``sent``).

    Example (two devices: ``copy in + max(home, other + copy back)``):
        >>> split_path_s(problem, ("cpu", "cuda:0"), (3.0, 1.0), (1.0,), (0.5,))   # doctest: +SKIP
        4.0
    """
    home, others = devices[0], devices[1:]
    free: dict[str, float] = {}
    arrived = []
    for d, c in zip(others, copies_in):
        route = problem.hops(home, d)
        end = max([0.0, *(free.get(lbl, 0.0) for lbl in route)]) + c
        free.update((lbl, end) for lbl in route)
        arrived.append(end)
    sent = max(arrived)
    free = {lbl: t - sent for lbl, t in free.items()}  # from here on, seconds after ``sent``
    ends = []
    for d, t, c, a in zip(others, shard_s[1:], copies_out, arrived):
        route = problem.hops(d, home)
        end = max([t - (sent - a), *(free.get(lbl, -sent) for lbl in route)]) + c
        free.update((lbl, end) for lbl in route)
        ends.append(end)
    return sent + max([shard_s[0], *ends])


def assemble_price(problem: Any, split: Any, shard_s: Sequence[float], param_bytes: Sequence[int],
                   work_bytes: Sequence[int], out_bytes: Sequence[int], back_bytes: Sequence[int]) -> Any:
    """A :class:`~partitioner.solvers.splits.SplitPrice` from per-shard values (index 0: home):
    ``out_bytes[i]`` copied home -> ``devices[i]``, ``back_bytes[i]`` copied back (home's own: 0);
    its path is :func:`~partitioner.solvers.splits.split_path_s`'s, as a linear's."""
    others = split.devices[1:]
    ins = [(split.home, d, int(b), problem.transfer_s(int(b), split.home, d)) for d, b in zip(others, out_bytes[1:])]
    outs = [(d, split.home, int(b), problem.transfer_s(int(b), d, split.home)) for d, b in zip(others, back_bytes[1:])]
    return SplitPrice(devices=tuple(split.devices), shard_s=tuple(shard_s),
                      param_bytes=tuple(int(b) for b in param_bytes), work_bytes=tuple(int(b) for b in work_bytes),
                      latency_s=split_path_s(problem, split.devices, shard_s, [c[3] for c in ins],
                                             [c[3] for c in outs]),
                      copies=tuple(ins) + tuple(outs))


def price_split(problem: Any, node: str, split: Split) -> SplitPrice:
    """The :class:`SplitPrice` of ``split`` for ``node`` in ``problem`` (its devices, cost model and
    transfer times): a linear's (``cols`` or ``rows``; every axis's:
    :func:`~partitioner.solvers.split_offers.price_offered`)."""
    g = problem.original
    op = split_op(problem, node)
    weight = g.params[split_weight(op, g.params)]
    bias = _bias_param(op, g.params, weight.name)
    out_f, in_f = weight.shape
    x_bytes = sum(g.tensors[t].nbytes for t in op.inputs)
    y_bytes = sum(g.tensors[t].nbytes for t in op.outputs)
    total = out_f if split.axis == "cols" else in_f
    sizes = shard_sizes(total, split.fractions)
    shares = tuple(k / total for k in sizes)
    row_bytes = weight.nbytes // total  # bytes of one weight row (cols) or column (rows)
    bias_bytes = bias.nbytes if bias is not None else 0
    other_bytes = op.param_bytes - weight.nbytes - bias_bytes  # owned tensors neither weight nor bias
    shard_params, shard_work, shard_s = [], [], []
    for i, (d, share) in enumerate(zip(split.devices, shares)):
        w = row_bytes * sizes[i]
        if split.axis == "cols":
            b = bias.nbytes * sizes[i] // out_f if bias is not None else 0
            read, written = x_bytes, int(y_bytes * share)
        else:
            b = bias_bytes if i == 0 else 0
            read, written = int(x_bytes * share), y_bytes
        params = w + b + (other_bytes if i == 0 else 0)
        shard = dataclasses.replace(op, flops=int(op.flops * share), param_bytes=w + b,
                                    bytes_read=read + w + b, bytes_written=written)
        shard_s.append(problem.costs.op_time(shard, problem.devices.device(d)).seconds)
        shard_params.append(params)
        shard_work.append(read + written)
    cuts = [sum(sizes[:i]) / total for i in range(len(sizes) + 1)]  # each shard's start, as a share

    def part(nbytes: int, i: int) -> int:  # bytes of shard i's slice of a tensor of nbytes
        return int(nbytes * cuts[i + 1]) - int(nbytes * cuts[i])

    home, others = split.home, split.others
    ins = [x_bytes if split.axis == "cols" else part(x_bytes, i) for i in range(1, len(sizes))]
    outs = [part(y_bytes, i) if split.axis == "cols" else y_bytes for i in range(1, len(sizes))]
    ins_s = [problem.transfer_s(b, home, d) for b, d in zip(ins, others)]
    outs_s = [problem.transfer_s(b, d, home) for b, d in zip(outs, others)]
    return SplitPrice(
        devices=split.devices, shard_s=tuple(shard_s), param_bytes=tuple(shard_params),
        work_bytes=(problem.work_mem[node], *shard_work[1:]),
        latency_s=split_path_s(problem, split.devices, shard_s, ins_s, outs_s),
        copies=tuple((home, d, b, s) for d, b, s in zip(others, ins, ins_s))
        + tuple((d, home, b, s) for d, b, s in zip(others, outs, outs_s)))


def even_shares(k: int) -> tuple[float, ...]:
    """``k`` equal shares summing to one (to 1e-10).

    Example:
        >>> even_shares(4)
        (0.25, 0.25, 0.25, 0.25)
    """
    first = round(1.0 / k, 10)
    return (*(first,) * (k - 1), round(1.0 - first * (k - 1), 10))


def split_op(problem: Any, node: str) -> Any:
    """The one linear of ``node`` a split cuts."""
    return next(problem.original.ops[m] for m in problem.members[node] if not problem.original.ops[m].is_view)
