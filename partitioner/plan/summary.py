"""The plan as a few lines for people: devices with their ops, memory and busy time; solver; baselines.

In: a :class:`~partitioner.plan.record.Plan`. Out: the text ``hetpart plan`` prints and
``Plan.summary()`` returns.
"""

from __future__ import annotations

from typing import Any

from cost_models.units import format_bytes, format_seconds
from partitioner.plan.values import TransferInfo


def summary_text(plan: Any) -> str:
    """A few lines for people: devices with their ops, memory and busy time; solver; baselines.

    Example:
        >>> print(plan.summary())                         # doctest: +SKIP
        plan for 'mlp' (5 ops) on h200-host: latency, inference, predicted 41.0 µs ...
    """
    mode = "training step" if plan.training else "inference"
    total = plan.predicted["total_s"]
    lines = [f"plan for {plan.model_name!r} ({plan.op_count} ops) on {plan.devices.name}: "
             f"{plan.objective}, {mode}, predicted {_seconds(total)} per step"]
    lower = plan.predicted.get("lower_bound_s")
    s = plan.solver
    gap = "" if s.gap is None else f", gap {s.gap:.2%}"
    lines.append(f"  solver     {s.name}: {s.status} in {format_seconds(s.seconds)}, bound "
                 f"{_seconds(s.bound)}{gap}; physical lower bound {_seconds(lower)}")
    lines.append(f"  costs      {costs_text(plan)}")
    busy = plan.predicted["per_device_s"]
    for device, ops in plan.per_device_ops().items():
        mem = plan.memory.get(device, {})
        used, cap = mem.get("used", 0), mem.get("capacity", plan.devices.device(device).memory)
        lines.append(f"  {device:<10} {len(ops):>5} ops  busy {_seconds(busy.get(device)):>9}  memory "
                     f"{format_bytes(used)} of {format_bytes(cap)} ({used / cap:.0%})")
    for label, seconds in plan.predicted.get("per_link_s", {}).items():
        if seconds:
            lines.append(f"  link {label:<16} busy {_seconds(seconds)}")
    kinds: dict[str, list[TransferInfo]] = {}
    for t in plan.transfers:
        kinds.setdefault(t.kind, []).append(t)
    for kind, items in kinds.items():
        lines.append(f"  {kind} transfers: {len(items)} per step, {format_bytes(sum(t.bytes for t in items))}, "
                     f"{_seconds(sum(t.seconds for t in items))}")
    if plan.weights:
        lines.append(f"  streamed weights: {len(plan.weights)} ops ({plan.stream_mode})")
    for name, b in plan.baselines.items():
        if b.total_s is None:
            lines.append(f"  baseline {name:<18} n/a")
            continue
        speedup = f"  speed-up {b.total_s / total:7.2f}x" if total else ""
        fits = "" if b.feasible else "  (does not fit: " + (b.note or "over a cap") + ")"
        lines.append(f"  baseline {name:<18} {_seconds(b.total_s):>9}{speedup}{fits}")
    return "\n".join(lines)


def costs_text(plan: Any, shown: int = 3) -> str:
    """Which cost model priced the plan: ``analytic (roofline of the profile)``, or for a measured
    one ``profiled (costs.json): cpu 150 ops measured, 12 priced analytically (a, b, c, ...)``.

    Example:
        >>> costs_text(plan)                               # doctest: +SKIP
        'analytic (roofline of the profile)'
    """
    costs = plan.costs or {"model": "analytic"}
    if costs["model"] == "analytic":
        return "analytic (roofline of the profile)"
    source = f" ({costs['source']})" if costs.get("source") else ""
    measured, fell_back = costs.get("measured", {}), costs.get("fell_back", {})
    parts = []
    for device in plan.devices.names():
        n, analytic = measured.get(device, 0), fell_back.get(device, ())
        if not n and not analytic:
            continue
        text = f"{device} {n} ops measured" if n else f"{device} not measured"
        if analytic:
            more = ", ..." if len(analytic) > shown else ""
            text += f", {len(analytic)} priced analytically ({', '.join(analytic[:shown])}{more})"
        parts.append(text)
    unsupported = costs.get("unsupported", {})
    if unsupported:
        parts.append(f"{len(unsupported)} ops failed on a device when measured and are not placed there")
    return f"{costs['model']}{source}: " + ("; ".join(parts) or "nothing measured")


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else format_seconds(value)
