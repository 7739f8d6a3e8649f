"""The ``inspect`` view of a captured model: totals and a per-op cost table on each device.

In: an OpGraph and a DeviceSet (and whether to cost a training step). Out: an :class:`Inspection`
that renders as a text table or as a JSON-ready dict.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from cost_models.analytic import op_time
from cost_models.profiles import DeviceSet
from cost_models.training import Optimizer, parameter_memory, training_op_time
from cost_models.units import format_bytes, format_flops, format_seconds
from partitioner.ir import OpGraph


@dataclasses.dataclass(frozen=True)
class OpRow:
    """One op with its predicted time on every device (``None`` where the device cannot run it)."""

    name: str
    kind: str
    op_class: str
    module_path: str
    flops: int
    bytes_moved: int
    param_bytes: int
    seconds: dict[str, float | None]


@dataclasses.dataclass(frozen=True)
class Inspection:
    """Totals of a graph and its ops' costs on each device of a profile."""

    model: str
    profile: str
    training: bool
    op_count: int
    op_classes: dict[str, int]
    parameters: int
    parameter_bytes: int
    trainable_bytes: int
    memory_bytes: int
    flops: int
    total_seconds: dict[str, float | None]
    rows: tuple[OpRow, ...]

    def top(self, n: int) -> tuple[OpRow, ...]:
        """The ``n`` ops with the largest time on their slowest device (all ops for ``n <= 0``)."""
        key = lambda r: max((s for s in r.seconds.values() if s is not None), default=0.0)  # noqa: E731
        ranked = sorted(self.rows, key=key, reverse=True)
        return tuple(ranked if n <= 0 else ranked[:n])

    def to_dict(self, top: int = 0) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rows"] = [dataclasses.asdict(r) for r in self.top(top)]
        return data

    def to_text(self, top: int = 15) -> str:
        devices = list(self.total_seconds)
        mode = "training step (forward + backward)" if self.training else "forward"
        classes = ", ".join(f"{k} {v}" for k, v in sorted(self.op_classes.items(), key=lambda kv: -kv[1]))
        lines = [
            f"model     {self.model}",
            f"ops       {self.op_count}  ({classes})",
            f"params    {self.parameters:,} tensors, {format_bytes(self.parameter_bytes)} "
            f"({format_bytes(self.trainable_bytes)} trainable)",
        ]
        if self.training:
            lines.append(f"memory    {format_bytes(self.memory_bytes)} with gradients and optimizer state")
        lines += [
            f"FLOPs     {format_flops(self.flops)} per {mode}",
            f"profile   {self.profile}",
            "",
            "predicted time if every op ran on one device (ops run one after another):",
        ]
        for d in devices:
            total = self.total_seconds[d]
            lines.append(f"  {d:<10} {format_seconds(total) if total is not None else 'cannot run every op'}")
        shown = self.top(top)
        lines += ["", f"{'the ' + str(len(shown)) + ' most expensive ops' if top > 0 else 'all ops'} ({mode}):"]
        header = ["op", "class", "module", "FLOPs", "bytes", "params"] + devices
        table = [header] + [
            [
                r.name,
                r.op_class,
                r.module_path or "-",
                format_flops(r.flops) if r.flops else "-",
                format_bytes(r.bytes_moved) if r.bytes_moved else "-",
                format_bytes(r.param_bytes) if r.param_bytes else "-",
            ]
            + [format_seconds(r.seconds[d]) if r.seconds[d] is not None else "n/a" for d in devices]
            for r in shown
        ]
        widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
        for row in table:
            lines.append("  " + "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        return "\n".join(lines)


def inspect_graph(
    graph: OpGraph,
    devices: DeviceSet,
    *,
    training: bool = False,
    optimizer: Optimizer | str = Optimizer.ADAM,
    model_name: str | None = None,
) -> Inspection:
    """Cost every op of ``graph`` on every device of ``devices``.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> report = inspect_graph(graph, load_profile("h200-host"))   # doctest: +SKIP
        >>> print(report.to_text(top=10))                              # doctest: +SKIP
    """
    rows = []
    totals: dict[str, float | None] = {d.name: 0.0 for d in devices.devices}
    cost = training_op_time if training else op_time
    for op in graph.topological_order():
        seconds: dict[str, float | None] = {}
        for device in devices.devices:
            if device.supports(op.kind, op.op_class.value):
                seconds[device.name] = cost(op, device).seconds
                if totals[device.name] is not None:
                    totals[device.name] += seconds[device.name]
            else:
                seconds[device.name] = None
                totals[device.name] = None
        rows.append(
            OpRow(
                op.name, op.kind, op.op_class.value, op.module_path, op.flops,
                op.bytes_read + op.bytes_written, op.param_bytes, seconds,
            )
        )
    memory = sum(parameter_memory(op, optimizer, training=training) for op in graph.ops.values())
    return Inspection(
        model=model_name or graph.name,
        profile=devices.name,
        training=training,
        op_count=len(graph),
        op_classes=dict(Counter(op.op_class.value for op in graph.ops.values())),
        parameters=len(graph.params),
        parameter_bytes=graph.total_param_bytes(),
        trainable_bytes=graph.trainable_param_bytes(),
        memory_bytes=memory,
        flops=graph.total_flops() * (3 if training else 1),
        total_seconds=totals,
        rows=tuple(rows),
    )
