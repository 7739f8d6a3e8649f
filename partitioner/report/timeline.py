"""The predicted schedule of a plan as Gantt bars, rebuilt from the plan file alone.

In: a :class:`~partitioner.plan.Plan` (placement, schedule, edges, transfers, per-op times).
Out: a :class:`Timeline`: one :class:`Bar` per op on its device's row, one per activation or
streamed-weight copy on the row of each link it crosses, and per-device bars for the copies of
shared parameters (``kind="param"``) and, in training, the optimizer step (``kind="optimizer"``).

How bars are placed follows the plan's objective, as :func:`partitioner.solvers.problem.evaluate`
costs it:

* ``latency`` (eager execution): one sequential clock. Ops run one after another in schedule
  order; an activation copy sits on its link between its producer's end and its first consumer
  on the destination (it runs just before that consumer and delays it); copies of graph inputs
  and of shared parameters come first; streamed weights in ``"sync"`` mode are copied just before
  their op; the optimizer step of each device (training) comes last.
* ``makespan`` (devices run concurrently): a list schedule in schedule order. An op starts when
  its device is free and every input has arrived (its producers' end, plus the copy's seconds when
  the producer ran elsewhere; ops without producers wait for the graph inputs copied to their
  device). Copies do not queue on a link (the cost model does not make links exclusive), so link
  bars may overlap. Shared-parameter copies and then the optimizer step follow the last op.
* ``throughput`` (pipelined steady state): each device's ops back to back from time 0, in
  schedule order, and each link's copies back to back from time 0.

Streamed weights with ``stream_mode="prefetch"`` run beside compute: they are placed back to back
on their link from time 0 in schedule order, and each streamed op's bar includes the copy's issue
latency (the route's latency), as the cost model charges it. A copy over several links is split
over their rows in proportion to each link's ``latency + bytes / bandwidth``.

How the end relates to ``predicted["total_s"]``: for latency the sequential clock ends at
``predicted["critical_path_s"]`` and the timeline's end is the larger of that and the busiest
link, which is ``total_s`` (up to rounding). For throughput the longest row is ``total_s``. For
makespan it is the cost model's list schedule replayed op by op: it matches ``total_s`` when the
plan was solved without coarsening, and comes close otherwise (the solver schedules coarse groups
as units, and a plan file does not say which op reads which graph input). Plans without
``per_op_s`` spread each device's busy time evenly over its ops; plans without ``edges`` are
drawn as if each op waited for the one before it.

Example:
    >>> tl = timeline(plan)                                   # doctest: +SKIP
    >>> tl.rows, round(tl.end_s / plan.predicted["total_s"], 3)   # doctest: +SKIP
    (('cpu', 'cuda:0', 'cpu<->cuda:0'), 1.0)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from partitioner.plan import Plan, TransferInfo

__all__ = ["Bar", "Timeline", "timeline", "producer_of"]

_OUTPUT_INDEX = re.compile(r"^(.*)\.(\d+)$")


@dataclasses.dataclass(frozen=True)
class Bar:
    """One interval on one row of the Gantt chart."""

    row: str          # device name, or link label ("cpu<->cuda:0")
    name: str         # op name; tensor name (copies); parameter name; "optimizer step"
    start_s: float
    end_s: float
    kind: str         # "op" | "activation" | "weights" | "param" | "optimizer"
    device: str       # the device it is drawn in the colour of: the op's, or the copy's destination

    @property
    def seconds(self) -> float:
        """The bar's length."""
        return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Bars of one plan; ``rows`` lists every device of the profile, then the links with bars."""

    objective: str
    rows: tuple[str, ...]
    bars: tuple[Bar, ...]

    @property
    def end_s(self) -> float:
        """When the last bar ends (0 for an empty timeline)."""
        return max((b.end_s for b in self.bars), default=0.0)

    def row_bars(self, row: str) -> tuple[Bar, ...]:
        """The bars of ``row``, by start time."""
        return tuple(sorted((b for b in self.bars if b.row == row), key=lambda b: (b.start_s, b.end_s)))


def producer_of(tensor: str, ops: Mapping[str, object]) -> str | None:
    """The op that produced an activation tensor: its own name, ``op`` for ``"op.i"``, else None
    (a graph input).

    Example:
        >>> producer_of("split.1", {"split": "cuda:0"}), producer_of("x", {"split": "cuda:0"})
        ('split', None)
    """
    if tensor in ops:
        return tensor
    m = _OUTPUT_INDEX.match(tensor)
    return m.group(1) if m and m.group(1) in ops else None


def timeline(plan: Plan) -> Timeline:
    """The plan's predicted schedule as Gantt bars (see the module docstring for the rules).

    Example:
        >>> bars = timeline(plan).row_bars("cuda:0")          # doctest: +SKIP
        >>> bars[0].name, bars[0].kind   # doctest: +SKIP
        ('linear', 'op')
    """
    builder = _Builder(plan)
    if plan.objective == "throughput":
        builder.throughput()
    elif plan.objective == "makespan":
        builder.makespan()
    else:
        builder.latency()
    links = [link.label for link in plan.devices.links]
    used = {b.row for b in builder.bars}
    rows = (*plan.devices.names(), *(label for label in links if label in used))
    return Timeline(plan.objective, rows, tuple(builder.bars))


class _Builder:
    """The bars of one plan, placed by one of the three objective rules."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.bars: list[Bar] = []
        self.index = {op: i for i, op in enumerate(plan.schedule)}
        self.order = list(plan.schedule) + sorted(op for op in plan.placement if op not in self.index)
        self.position = {op: i for i, op in enumerate(self.order)}
        self.preds: dict[str, list[str]] = {op: [] for op in plan.placement}
        self.succs: dict[str, list[str]] = {op: [] for op in plan.placement}
        for u, v in plan.edges:
            self.preds[v].append(u)
            self.succs[u].append(v)
        self.seconds = _op_seconds(plan)
        self.streamed = {t.tensor: t for t in plan.transfers if t.kind == "weights"}

    # -- pieces shared by the rules -----------------------------------------------------------

    def op_bar(self, op: str, start: float) -> float:
        """Put ``op`` on its device from ``start``; returns its end."""
        device = self.plan.placement[op]
        seconds = self.seconds[op]
        if op in self.streamed and self.plan.stream_mode == "prefetch":
            home = self.streamed[op].src
            seconds += sum(link.latency for link in self.plan.devices.route(home, device))
        self.bars.append(Bar(device, op, start, start + seconds, "op", device))
        return start + seconds

    def copy_bars(self, t: TransferInfo, start: float) -> float:
        """Put a copy on the rows of the links it crosses, hop after hop; returns its end."""
        pinned = not (t.kind == "weights" and self.plan.stream_mode == "sync")
        for label, seconds in _hop_seconds(self.plan, t, pinned):
            self.bars.append(Bar(label, t.tensor, start, start + seconds, t.kind, t.dst))
            start += seconds
        return start

    def back_to_back(self, transfers: Iterable[TransferInfo]) -> None:
        """Copies on their links from time 0, each link one copy at a time."""
        free: dict[str, float] = {}
        for t in transfers:
            pinned = not (t.kind == "weights" and self.plan.stream_mode == "sync")
            for label, seconds in _hop_seconds(self.plan, t, pinned):
                start = free.get(label, 0.0)
                self.bars.append(Bar(label, t.tensor, start, start + seconds, t.kind, t.dst))
                free[label] = start + seconds

    def param_bar(self, t: TransferInfo, start: float) -> float:
        """A shared parameter's synchronous copy, charged to its destination's row."""
        self.bars.append(Bar(t.dst, t.tensor, start, start + t.seconds, "param", t.dst))
        return start + t.seconds

    def optimizer_bar(self, device: str, start: float) -> float:
        """Training: the optimizer step, the busy time of ``device`` not spent on its ops and copies."""
        seconds = self.optimizer_seconds(device)
        if seconds > 0:
            self.bars.append(Bar(device, "optimizer step", start, start + seconds, "optimizer", device))
        return start + seconds

    def optimizer_seconds(self, device: str) -> float:
        if not self.plan.training:
            return 0.0
        busy = self.plan.predicted["per_device_s"].get(device) or 0.0
        spent = sum(b.seconds for b in self.bars if b.row == device and b.kind in ("op", "param"))
        leftover = busy - spent
        return leftover if leftover > 1e-9 * max(busy, 1e-12) else 0.0

    def activation_anchors(self) -> tuple[list[TransferInfo], dict[str, list[TransferInfo]]]:
        """Activation copies of graph inputs, and the others keyed by the op they must precede
        (the first consumer on the destination in schedule order; the producer's next op when the
        plan has no edges)."""
        first: list[TransferInfo] = []
        before: dict[str, list[TransferInfo]] = {}
        for t in self.plan.transfers:
            if t.kind != "activation":
                continue
            producer = producer_of(t.tensor, self.plan.placement)
            if producer is None:
                first.append(t)
                continue
            consumers = [v for v in self.succs[producer] if self.plan.placement[v] == t.dst]
            if consumers:
                anchor = min(consumers, key=self.position.__getitem__)
            else:
                after = self.position[producer] + 1
                anchor = self.order[after] if after < len(self.order) else ""
            before.setdefault(anchor, []).append(t)
        return first, before

    # -- the three rules ----------------------------------------------------------------------

    def latency(self) -> None:
        plan = self.plan
        first, before = self.activation_anchors()
        clock = 0.0
        for t in first:
            clock = self.copy_bars(t, clock)
        for t in plan.transfers:
            if t.kind == "param":
                clock = self.param_bar(t, clock)
        for op in self.order:
            for t in before.get(op, ()):
                clock = self.copy_bars(t, clock)
            if op in self.streamed and plan.stream_mode == "sync":
                clock = self.copy_bars(self.streamed[op], clock)
            clock = self.op_bar(op, clock)
        for t in before.get("", ()):
            clock = self.copy_bars(t, clock)
        for device in plan.devices.names():
            clock = self.optimizer_bar(device, clock)
        if plan.stream_mode == "prefetch":
            self.back_to_back(self.in_schedule_order(self.streamed.values()))

    def throughput(self) -> None:
        plan = self.plan
        free = {d: 0.0 for d in plan.devices.names()}
        for t in plan.transfers:
            if t.kind == "param":
                free[t.dst] = self.param_bar(t, free[t.dst])
        for op in self.order:
            device = plan.placement[op]
            free[device] = self.op_bar(op, free[device])
        for device in plan.devices.names():
            self.optimizer_bar(device, free[device])
        copies = [t for t in plan.transfers if t.kind in ("activation", "weights")]
        self.back_to_back(self.in_schedule_order(copies))

    def makespan(self) -> None:
        plan = self.plan
        inputs_at: dict[str, float] = {}
        for t in plan.transfers:
            if t.kind == "activation" and producer_of(t.tensor, plan.placement) is None:
                inputs_at[t.dst] = max(inputs_at.get(t.dst, 0.0), self.copy_bars(t, 0.0))
        sent: dict[tuple[str, str], list[TransferInfo]] = {}   # (producer, destination) -> copies
        for t in plan.transfers:
            producer = producer_of(t.tensor, plan.placement) if t.kind == "activation" else None
            if producer is not None:
                sent.setdefault((producer, t.dst), []).append(t)
        free = {d: 0.0 for d in plan.devices.names()}
        end: dict[str, float] = {}
        previous = ""
        for op in self.order:
            device = plan.placement[op]
            preds = self.preds[op] if plan.edges else ([previous] if previous else [])
            ready = inputs_at.get(device, 0.0) if not preds else 0.0
            for u in preds:
                copies = sent.get((u, device), []) if plan.placement[u] != device else []
                ready = max(ready, end.get(u, 0.0) + max((t.seconds for t in copies), default=0.0))
            start = max(free[device], ready)
            if op in self.streamed and plan.stream_mode == "sync":
                start = self.copy_bars(self.streamed[op], start)
            end[op] = free[device] = self.op_bar(op, start)
            previous = op
        for (producer, _), copies in sent.items():   # each copy leaves when its producer ends
            for t in copies:
                self.copy_bars(t, end.get(producer, 0.0))
        clock = max(end.values(), default=0.0)
        for t in plan.transfers:
            if t.kind == "param":
                clock = self.param_bar(t, clock)
        for device in plan.devices.names():
            self.optimizer_bar(device, clock)
        if plan.stream_mode == "prefetch":
            self.back_to_back(self.in_schedule_order(self.streamed.values()))

    def in_schedule_order(self, transfers: Iterable[TransferInfo]) -> list[TransferInfo]:
        """Copies sorted by the schedule position of the op they come from or feed."""
        def key(t: TransferInfo) -> int:
            op = t.tensor if t.kind == "weights" else producer_of(t.tensor, self.plan.placement)
            return self.index.get(op, -1) if op is not None else -1
        return sorted(transfers, key=key)


def _op_seconds(plan: Plan) -> dict[str, float]:
    """Each op's own time on its device: ``per_op_s``, or its device's busy time spread evenly."""
    per_op = plan.predicted.get("per_op_s") or {}
    count: dict[str, int] = {}
    for device in plan.placement.values():
        count[device] = count.get(device, 0) + 1
    busy = plan.predicted["per_device_s"]
    out = {}
    for op, device in plan.placement.items():
        seconds = per_op.get(op)
        if seconds is None:
            seconds = (busy.get(device) or 0.0) / count[device]
        out[op] = float(seconds)
    return out


def _hop_seconds(plan: Plan, t: TransferInfo, pinned: bool) -> list[tuple[str, float]]:
    """The copy's seconds split over the links of its route (one entry for a direct link)."""
    route = plan.devices.route(t.src, t.dst)
    if len(route) <= 1:
        return [(link.label, t.seconds) for link in route]
    weight = [link.latency + t.bytes / (link.bandwidth if pinned else link.pageable) for link in route]
    total = sum(weight) or 1.0
    return [(link.label, t.seconds * w / total) for link, w in zip(route, weight)]
