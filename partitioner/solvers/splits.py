"""Split choices: one linear's weight cut over two devices, and what such a cut costs.

In: an op of the original graph (an aten ``linear`` whose own 2-D weight no other op reads), the
problem's devices and cost model, and :class:`SplitOptions`. Out: the :class:`Split` choices the op
may take (:func:`split_choices`) and each one's :class:`SplitPrice`, which
:func:`~partitioner.solvers.problem.evaluate`, the ILP, the bounds and the oracle all read.

A split is a kind of placement (``DESIGN.md``, "Splits are a kind of placement"). Its semantics,
for a linear ``y = x W^T + b`` with ``W`` of shape ``[out, in]`` placed with ``devices = (home,
other)`` and ``fractions = (f, 1 - f)``:

* ``cols`` (output features): ``home`` keeps the first ``round(f * out)`` rows of ``W`` (and of
  ``b``), ``other`` the rest. The input ``x`` (on ``home``, where the node's inputs arrive as for
  any op) is copied to ``other``; each device computes its shard of ``y``; ``other``'s shard is
  copied back and the two are concatenated on ``home``, where the node's consumers read ``y``;
* ``rows`` (the reduction dimension): ``home`` keeps the first ``round(f * in)`` columns of ``W``
  and the whole bias, ``other`` the rest; only ``x[..., k:]`` is copied to ``other``; ``other``'s
  partial product (the whole output's bytes) is copied back and summed on ``home``.

Prices (``t(d, g)``: the cost model's time of the op scaled to a share ``g`` of its flops and
weight bytes on device ``d``, its input read whole for ``cols`` and in part for ``rows``):

* latency: ``copy(home -> other) + max(t(home, f), t(other, 1 - f) + copy(other -> home))``: the
  home shard is issued first (asynchronous on an accelerator) and runs beside the copy, the other
  shard and its copy back (the concatenation or sum on ``home`` is a copy of the output the
  size of the op's own write, left out as it is for a ``cat`` beside a matmul);
* throughput: ``home`` is busy ``t(home, f)``, ``other`` ``t(other, 1 - f)``; both copies load
  their links, in every objective;
* memory: each device holds its shard of the weight (``home`` the bias too for ``rows``); ``home``
  the op's whole working set, ``other`` its shard's (its input copy and its output shard);
* a split op's weights are never streamed. Splits are priced for inference (no training, no
  precision, no pipeline stages, not ``makespan``); :class:`~partitioner.solvers.problem.Problem`
  refuses the other combinations by name.

Fractions offered: ``SplitOptions.fractions`` (home's share), with ``proportional`` the share
proportional to each device's priced rate for the whole op (``t(other) / (t(home) + t(other))``,
rounded to two decimals), and with ``balanced`` the share at which the home shard ends when the other
shard and its copy back do (:func:`balanced_share`: HeteGen's rule ``T_gpu = T_cpu + T_comm``, found
on the prices themselves, so fixed per-op costs and the copies count), for every ordered pair of
devices that can run the op and each axis. A pinned op, and a
node of several ops kept together by coarsening (views folded into the linear aside), stays whole;
with splits asked, the planner keeps every splittable linear out of coarse groups.

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

#: The axes a linear may be split along, and what each means.
AXES: dict[str, str] = {
    "cols": "output features: weight rows split, the output shards concatenated",
    "rows": "reduction dimension: weight columns and the input split, the partial outputs summed",
    "time": "in time: the weight's row chunks (a fused experts op's expert groups) streamed from the host one "
            "after another through a few chunk buffers on one accelerator (partitioner/solvers/chunked_streaming.py, "
            "expert_streaming.py)",
    "experts": "a fused experts op's experts divided between two devices, the routed rows copied to the other "
               "and its output summed back (partitioner/solvers/expert_devices.py)",
}
#: Op kinds (aten base names) that take splits.
SPLITTABLE_OPS = frozenset({"linear"})


@dataclasses.dataclass(frozen=True)
class SplitOptions:
    """Which splits a problem offers (``Options.splits``; ``None`` there: none)."""

    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # the home device's share, each in (0, 1)
    proportional: bool = True                         # also the share proportional to each device's rate
    balanced: bool = True                             # also the share whose two branches end together
    axes: tuple[str, ...] = ("cols", "rows")         # among AXES ("time" opts in to time splits)
    chunks: tuple[int, ...] = (2, 4, 8, 16, 32)       # time splits: the chunk counts offered, each >= 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        object.__setattr__(self, "axes", tuple(self.axes))
        object.__setattr__(self, "chunks", tuple(self.chunks))
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
    of its fields (``{"fractions": [0.5], "axes": ["cols"]}``), or the CLI's text ``AXES[:F/F...]``
    (``"cols"``, ``"cols,rows:0.25/0.5/0.75"``; ``"time"`` adds time splits, whose chunk counts a
    ``/``-separated list of whole numbers names when ``time`` is the only axis: ``"time:8/16"``).

    Example:
        >>> resolve_splits("cols:0.5").fractions, resolve_splits("cols:0.5").axes
        ((0.5,), ('cols',))
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
                               f"proportional, balanced, axes and chunks")
        return SplitOptions(**value)
    if isinstance(value, str):
        axes_text, _, fractions_text = value.partition(":")
        axes = tuple(a.strip() for a in axes_text.split(",") if a.strip())
        if axes == ("time",) and fractions_text:
            try:
                chunks = tuple(int(n) for n in fractions_text.split("/"))
            except ValueError:
                raise HetpartError(f"--split {value!r}: time splits take chunk counts, whole numbers separated by "
                                   f"'/', e.g. time:8/16") from None
            return SplitOptions(axes=axes, chunks=chunks)
        try:
            fractions = tuple(float(f) for f in fractions_text.split("/")) if fractions_text else None
        except ValueError:
            raise HetpartError(f"--split {value!r}: fractions are numbers separated by '/', e.g. "
                               f"cols,rows:0.25/0.5/0.75") from None
        return SplitOptions(**({"fractions": fractions} if fractions else {}), axes=axes or ("cols", "rows"))
    raise HetpartError(f"splits={value!r}: expected True, 'on', 'AXES[:F/F...]' (e.g. 'cols:0.25/0.5/0.75') or "
                       f"{{'fractions': [...], 'axes': [...]}}")


@dataclasses.dataclass(frozen=True, order=True)
class Split:
    """One op split over two devices: ``devices[0]`` (home) reads its input and rejoins its output."""

    axis: str
    devices: tuple[str, str]
    fractions: tuple[float, float]

    @property
    def home(self) -> str:
        return self.devices[0]

    @property
    def other(self) -> str:
        return self.devices[1]

    @property
    def label(self) -> str:
        """``cols[cuda:0=0.75,cpu=0.25]``: the split in one word (row and column names use it)."""
        return f"{self.axis}[" + ",".join(f"{d}={f:g}" for d, f in zip(self.devices, self.fractions)) + "]"

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "devices": list(self.devices), "fractions": list(self.fractions)}


@dataclasses.dataclass(frozen=True)
class SplitPrice:
    """What one split costs (see the module docstring)."""

    shard_s: tuple[float, float]        # each shard's compute time on its device
    param_bytes: tuple[int, int]        # each device's bytes of the op's parameters
    work_bytes: tuple[int, int]         # each device's working set
    copy_in: int                        # bytes copied home -> other
    copy_out: int                       # bytes copied other -> home
    copy_in_s: float
    copy_out_s: float
    copies: tuple[tuple[str, str, int, float], ...] = ()  # every copy: (src, dst, bytes, seconds)

    @property
    def latency_s(self) -> float:
        """Seconds the split op adds to one sample's sequential path."""
        return self.copy_in_s + max(self.shard_s[0], self.shard_s[1] + self.copy_out_s)

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


def shard_sizes(length: int, fractions: Sequence[float]) -> tuple[int, int]:
    """Rows (``cols``) or columns (``rows``) of the weight each device keeps: home's share rounded,
    at least one each. The emitter cuts with the same sizes.

    Example:
        >>> shard_sizes(10, (0.75, 0.25))
        (8, 2)
    """
    if length < 2:
        raise HetpartError(f"a dimension of {length} cannot be split over two devices")
    first = min(max(1, round(length * fractions[0])), length - 1)
    return first, length - first


def _bias_param(op: Any, params: Mapping[str, Any], weight: str) -> Any:
    return next((params[n] for n in op.owned_params if n != weight and n in params and len(params[n].shape) == 1),
                None)


def price_split(problem: Any, node: str, split: Split) -> SplitPrice:
    """The :class:`SplitPrice` of ``split`` for ``node`` in ``problem`` (its devices, cost model and
    transfer times)."""
    g = problem.original
    op = split_op(problem, node)
    weight = g.params[split_weight(op, g.params)]
    bias = _bias_param(op, g.params, weight.name)
    out_f, in_f = weight.shape
    x_bytes = sum(g.tensors[t].nbytes for t in op.inputs)
    y_bytes = sum(g.tensors[t].nbytes for t in op.outputs)
    sizes = shard_sizes(out_f if split.axis == "cols" else in_f, split.fractions)
    total = out_f if split.axis == "cols" else in_f
    shares = (sizes[0] / total, sizes[1] / total)
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
    if split.axis == "cols":
        copy_in, copy_out = x_bytes, y_bytes - int(y_bytes * shares[0])
    else:
        copy_in, copy_out = x_bytes - int(x_bytes * shares[0]), y_bytes
    home_work = problem.work_mem[node]
    return SplitPrice(
        shard_s=(shard_s[0], shard_s[1]), param_bytes=(shard_params[0], shard_params[1]),
        work_bytes=(home_work, shard_work[1]), copy_in=copy_in, copy_out=copy_out,
        copy_in_s=problem.transfer_s(copy_in, split.home, split.other),
        copy_out_s=problem.transfer_s(copy_out, split.other, split.home),
        copies=((split.home, split.other, copy_in, problem.transfer_s(copy_in, split.home, split.other)),
                (split.other, split.home, copy_out, problem.transfer_s(copy_out, split.other, split.home))))


def split_choices(problem: Any, node: str, options: SplitOptions) -> tuple[Split, ...]:
    """Every split ``node`` may take: one splittable linear (with views folded into it), each ordered
    pair of devices that can run it, each axis, each offered fraction."""
    ops = [problem.original.ops[m] for m in problem.members[node]]
    linears = [op for op in ops if not op.is_view]
    if len(linears) != 1 or split_weight(linears[0], problem.original.params) is None:
        return ()
    op = linears[0]
    weight = problem.original.params[split_weight(op, problem.original.params)]
    allowed = problem.allowed[node]
    if node in problem.pins or len(allowed) < 2:
        return ()
    out: list[Split] = []
    for home in allowed:
        for other in allowed:
            if other == home:
                continue
            shares = list(options.fractions)
            if options.proportional:
                t_home, t_other = problem.compute[node][home], problem.compute[node][other]
                if t_home + t_other > 0:
                    shares.append(round(t_other / (t_home + t_other), 2))
            for axis in (a for a in options.axes if a in ("cols", "rows")):
                length = weight.shape[0] if axis == "cols" else weight.shape[1]
                if length < 2:
                    continue
                balanced = [balanced_share(problem, node, (home, other), axis)] if options.balanced else []
                for f in dict.fromkeys(s for s in shares + balanced if 0.0 < s < 1.0):
                    out.append(Split(axis, (home, other), (f, round(1.0 - f, 10))))
    return tuple(dict.fromkeys(out))


def balanced_share(problem: Any, node: str, devices: tuple[str, str], axis: str) -> float:
    """Home's share (two decimals, in [0.01, 0.99]) at which, split along ``axis`` over ``devices``,
    the home shard takes as long as the other shard plus its copy back: the share that minimises the
    split's latency ``copy in + max(home, other + copy back)`` up to rounding (each side is monotone
    in the share). Found by bisection on :func:`price_split` itself.

    Example:
        >>> balanced_share(problem, "linear", ("cuda:0", "cpu"), "cols")   # doctest: +SKIP
        0.97
    """
    def home_ahead(f: float) -> bool:  # the home shard is still the longer branch at share f
        price = price_split(problem, node, Split(axis, devices, (f, round(1.0 - f, 10))))
        return price.shard_s[0] >= price.shard_s[1] + price.copy_out_s

    low, high = 1, 99  # in hundredths: home_ahead(low / 100) may already hold, home_ahead(high / 100) may not
    if home_ahead(low / 100):
        return low / 100
    if not home_ahead(high / 100):
        return high / 100
    while high - low > 1:  # invariant: not home_ahead(low), home_ahead(high)
        mid = (low + high) // 2
        low, high = (low, mid) if home_ahead(mid / 100) else (mid, high)
    best = min((low, high), key=lambda h: price_split(
        problem, node, Split(axis, devices, (h / 100, round(1.0 - h / 100, 10)))).latency_s)
    return best / 100


def split_op(problem: Any, node: str) -> Any:
    """The one linear of ``node`` a split cuts."""
    return next(problem.original.ops[m] for m in problem.members[node] if not problem.original.ops[m].is_view)
