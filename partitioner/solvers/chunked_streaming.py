"""Time splits: a linear computed on an accelerator from weight chunks streamed one after another.

In: an op of the original graph (an aten ``linear`` whose own 2-D weight no other op reads), the
problem's devices and cost model, and the chunk counts offered (``SplitOptions.chunks``). Out: the
:class:`TimeSplit` choices the op may take (:func:`time_split_choices`) and each one's price, a
:class:`~partitioner.solvers.splits.SplitPrice` that :func:`~partitioner.solvers.problem.evaluate`,
the ILP, the bounds and the oracle read like any split's.

A time split is a split in time (``DESIGN.md``, "Splits are a kind of placement"): where whole
weight streaming needs the op's whole weight in a buffer on the device, a time split keeps the
weight in host memory as ``n`` chunks of its output rows and streams them one after another
through :data:`SLOTS` chunk buffers on the device, so an op larger than the device's free memory
still computes there. For ``y = x W^T + b`` with ``W`` of shape ``[out, in]`` placed with
``devices = (home, host)`` and ``chunks = n``:

* chunk ``i`` is rows ``[r_i, r_{i+1})`` of ``W`` (``n`` near-equal parts, :func:`chunk_sizes`);
  ``home`` (an accelerator, where the node's input arrives and its consumers read ``y``) computes
  ``y_i = x W_i^T + b_i`` from chunk ``i`` copied in, and ``y`` is the concatenation of the
  ``y_i`` along the last dimension (the output shards of a ``cols`` split, all on one device);
* memory: the host holds ``W`` (its chunks); ``home`` holds the bias (and any other tensor the op
  owns) and, while the op runs, its working set: the input, the output shards and the
  concatenated output (``x + 2 y``) and :data:`SLOTS` chunk buffers of the largest chunk;
* copies: every chunk once per step, host -> home, pinned (``"split"`` transfers; each chunk's copy
  pays the route's latency), on the links in every objective;
* time: with ``c_i`` chunk ``i``'s copy and ``k_i`` its compute on ``home`` (the cost model's time of
  the op scaled to the chunk's share of the flops, weight and output, reading the whole input, its
  launch overhead included), copies in order on the link, computes in order on ``home``, a copy
  starting once a buffer is free (:data:`SLOTS` buffers), the op takes ``K_n`` of the recursion
  ``C_0 = K_0 = 0``, ``C_i = max(C_{i-1}, K_{i-SLOTS}) + c_i``, ``K_i = max(K_{i-1}, C_i) + k_i``.
  With equal chunks it is ``c + k + (n - 1) max(c, k)``: the first chunk's copy, then whichever of
  copies and computes is slower, then the last chunk's compute (a two-stage flow shop; two
  buffers already reach it, so more do not shorten it). The first chunk is not assumed
  prefetched during earlier ops (the emitted module may fetch it earlier: the price is then an
  upper bound on the run). With ``latency`` the op adds that time to the path, with ``throughput``
  to ``home``'s load (the device waits for copies while the op runs). The ``y_i`` concatenation
  is left out, as for a split's rejoin;
* a time-split op's weights are not also streamed whole (``split_or_stream``). Time splits are
  priced for inference with the ``latency`` or ``throughput`` objective, without precision or
  pipeline stages, with weight streaming allowed; :class:`~partitioner.solvers.problem.Problem`
  refuses the other combinations by name.

Chunk counts offered: ``SplitOptions.chunks`` (each at most the weight's rows), on every accelerator
the op may run on, with the host holding the chunks; a pinned op keeps its pin (its home). Only
linears take a time split by rows. A fused experts op of a mixture-of-experts layer (transformers'
grouped matmul over a transposed fused weight) takes a time split by expert instead, its chunks groups
of whole experts: :mod:`partitioner.solvers.expert_streaming`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from partitioner.errors import HetpartError
from partitioner.solvers.splits import SplitPrice, split_weight

#: The axis word of a time split (beside ``cols`` and ``rows``).
AXIS = "time"
#: Chunk buffers a time split holds on its device: the chunk being computed and two being copied
#: (the emitted module fetches chunks through its weight streamer, which keeps two copies in flight).
SLOTS = 3
#: Chunk counts offered by default.
CHUNKS = (2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True, order=True)
class TimeSplit:
    """One linear computed on ``devices[0]`` (home) from ``chunks`` weight chunks held on
    ``devices[1]`` (the host) and streamed in one after another."""

    axis: str
    devices: tuple[str, str]
    chunks: int

    def __post_init__(self) -> None:
        if self.axis != AXIS:
            raise HetpartError(f"a time split's axis is {AXIS!r}, not {self.axis!r}")
        if self.chunks < 2:
            raise HetpartError(f"a time split streams its weight in at least 2 chunks, not {self.chunks}")

    @property
    def home(self) -> str:
        return self.devices[0]

    @property
    def other(self) -> str:
        return self.devices[1]

    @property
    def others(self) -> tuple[str, ...]:
        """The host, whose memory holds the weight (the split's devices beside home)."""
        return self.devices[1:]

    @property
    def fractions(self) -> tuple[float, float]:
        """Home's and the host's share of the op's compute: all of it on home."""
        return (1.0, 0.0)

    @property
    def label(self) -> str:
        """``time[cuda:0<-cpu,8]``: the time split in one word (row and column names use it)."""
        return f"{AXIS}[{self.home}<-{self.other},{self.chunks}]"

    def to_dict(self) -> dict[str, Any]:
        return {"axis": AXIS, "devices": list(self.devices), "chunks": self.chunks}


def chunk_sizes(length: int, chunks: int) -> tuple[int, ...]:
    """Rows of the weight in each chunk: ``chunks`` near-equal parts, the larger ones first (as
    ``torch.tensor_split`` cuts). The emitter cuts with the same sizes.

    Example:
        >>> chunk_sizes(10, 4)
        (3, 3, 2, 2)
    """
    if not 2 <= chunks <= length:
        raise HetpartError(f"a weight of {length} rows cannot be streamed in {chunks} chunks: a time split takes "
                           f"2 to {length} chunks")
    base, extra = divmod(length, chunks)
    return tuple(base + 1 if i < extra else base for i in range(chunks))


def pipeline_s(copies: Sequence[float], computes: Sequence[float], slots: int = SLOTS) -> float:
    """Seconds from the first chunk's copy to the last chunk's compute (the module docstring's
    recursion: copies in order, computes in order, a copy waits for a free buffer).

    Example:
        >>> pipeline_s([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])   # copy-bound: c + k + 2 max(c, k)
        7.0
    """
    c_end: list[float] = []
    k_end: list[float] = []
    for i, (c, k) in enumerate(zip(copies, computes)):
        free = k_end[i - slots] if i >= slots else 0.0
        c_end.append(max(c_end[-1] if c_end else 0.0, free) + c)
        k_end.append(max(k_end[-1] if k_end else 0.0, c_end[-1]) + k)
    return k_end[-1] if k_end else 0.0


def price_time_split(problem: Any, node: str, split: TimeSplit) -> SplitPrice:
    """The price of ``split`` for ``node`` in ``problem`` (see the module docstring)."""
    from partitioner.solvers.splits import split_op

    g = problem.original
    op = split_op(problem, node)
    weight = g.params[split_weight(op, g.params)]
    out_f = weight.shape[0]
    bias = next((g.params[n] for n in op.owned_params if n != weight.name and n in g.params
                 and len(g.params[n].shape) == 1), None)
    x_bytes = sum(g.tensors[t].nbytes for t in op.inputs)
    y_bytes = sum(g.tensors[t].nbytes for t in op.outputs)
    row_bytes = weight.nbytes // out_f
    device = problem.devices.device(split.home)
    copies, computes, chunk_bytes = [], [], []
    for rows in chunk_sizes(out_f, split.chunks):
        share = rows / out_f
        w = row_bytes * rows
        b = bias.nbytes * rows // out_f if bias is not None else 0
        chunk = dataclasses.replace(op, flops=int(op.flops * share), param_bytes=w + b,
                                    bytes_read=x_bytes + w + b, bytes_written=int(y_bytes * share))
        computes.append(problem.costs.op_time(chunk, device).seconds)
        copies.append(problem.costs.transfer_time(w, split.other, split.home, problem.devices, pinned=True).seconds)
        chunk_bytes.append(w)
    seconds = pipeline_s(copies, computes)
    resident = op.param_bytes - weight.nbytes  # the bias and anything else the op owns stay on home
    work = x_bytes + 2 * y_bytes + SLOTS * max(chunk_bytes)
    return SplitPrice(
        devices=split.devices, shard_s=(seconds, 0.0), param_bytes=(resident, weight.nbytes), work_bytes=(work, 0),
        latency_s=max(seconds, sum(copies)),
        copies=tuple((split.other, split.home, b, c) for b, c in zip(chunk_bytes, copies)))


def time_split_choices(problem: Any, node: str, chunks: Sequence[int]) -> tuple[TimeSplit, ...]:
    """Every time split ``node`` may take: one splittable linear (views folded into it), each
    accelerator that can run it, each offered chunk count up to its weight's rows."""
    ops = [problem.original.ops[m] for m in problem.members[node]]
    linears = [op for op in ops if not op.is_view]
    if len(linears) != 1 or split_weight(linears[0], problem.original.params) is None:
        return ()
    rows = problem.original.params[split_weight(linears[0], problem.original.params)].shape[0]
    host = problem.host
    return tuple(TimeSplit(AXIS, (d, host), n) for d in problem.allowed[node] if d != host
                 for n in sorted(set(chunks)) if 2 <= n <= rows)
