"""The plan as a few lines for people: devices with their ops, memory and busy time; solver; baselines.

In: a :class:`~partitioner.plan.record.Plan`. Out: the text ``hetpart plan`` prints and
``Plan.summary()`` returns; every name from the plan is on one line, control characters escaped.
"""

from __future__ import annotations

from typing import Any

from cost_models.units import format_bytes, format_seconds
from partitioner.plan.batch import summary_lines as batch_lines
from partitioner.plan.pipeline import summary_lines
from partitioner.plan.precision import precision_lines
from partitioner.plan.training_state import training_state_lines
from partitioner.plan.values import TransferInfo
from partitioner.terminal import one_line


def summary_text(plan: Any) -> str:
    """A few lines for people: devices with their ops, memory and busy time; solver; baselines.

    Example:
        >>> print(plan.summary())                         # doctest: +SKIP
        plan for 'mlp' (5 ops) on h200-host: latency, inference, predicted 41.0 µs ...
    """
    mode = "training step" if plan.training else "inference"
    total = plan.predicted["total_s"]
    lines = [f"plan for '{one_line(plan.model_name)}' ({plan.op_count} ops) on {one_line(plan.devices.name)}: "
             f"{plan.objective}, {mode}, predicted {_seconds(total)} per step"]
    lines += solver_lines(plan)
    lines.append(f"  costs      {costs_text(plan)}")
    lines += summary_lines(plan)
    lines += batch_lines(plan)
    lines += precision_lines(plan)
    lines += training_state_lines(plan)
    busy = plan.predicted["per_device_s"]
    for device, ops in plan.per_device_ops().items():
        mem = plan.memory.get(device, {})
        used, cap = mem.get("used", 0), mem.get("capacity", plan.devices.device(device).memory)
        lines.append(f"  {one_line(device):<10} {len(ops):>5} ops  busy {_seconds(busy.get(device)):>9}  memory "
                     f"{format_bytes(used)} of {format_bytes(cap)} ({used / cap:.0%})")
    for label, seconds in plan.predicted.get("per_link_s", {}).items():
        if seconds:
            lines.append(f"  link {one_line(label):<16} busy {_seconds(seconds)}")
    kinds: dict[str, list[TransferInfo]] = {}
    for t in plan.transfers:
        kinds.setdefault(t.kind, []).append(t)
    for kind, items in kinds.items():
        lines.append(f"  {one_line(kind)} transfers: {len(items)} per step, {format_bytes(sum(t.bytes for t in items))}, "
                     f"{_seconds(sum(t.seconds for t in items))}")
    if plan.weights:
        lines.append(f"  streamed weights: {len(plan.weights)} ops ({plan.stream_mode})")
    if plan.splits:
        shown = [one_line(f"{op} time: {e['chunks']} {'expert groups' if e.get('by') == 'expert' else 'chunks'} "
                          f"{e['devices'][1]}->{e['devices'][0]}" if e["axis"] == "time"
                          else f"{op} {e['axis']} " + "+".join(f"{d} {f:g}" for d, f in zip(e["devices"], e["fractions"])))
                 for op, e in list(plan.splits.items())[:4]]
        more = f" and {len(plan.splits) - 4} more" if len(plan.splits) > 4 else ""
        lines.append(f"  split ops: {len(plan.splits)} ({', '.join(shown)}{more})")
    for name, b in plan.baselines.items():
        if b.total_s is None:
            lines.append(f"  baseline {one_line(name):<20} n/a")
            continue
        speedup = f"  speed-up {b.total_s / total:7.2f}x" if total else ""
        fits = "" if b.feasible else "  (does not fit: " + one_line(b.note or "over a cap") + ")"
        lines.append(f"  baseline {one_line(name):<20} {_seconds(b.total_s):>9}{speedup}{fits}")
    if plan.probe:  # --devices detect
        lines.append(f"  free memory read at {plan.probe['taken_at']}: " + ", ".join(
            f"{one_line(d)} {format_bytes(r['free'])} free ({r['source']}), cap {format_bytes(r['cap'])}"
            for d, r in plan.probe["devices"].items()))
    for f in plan.fallbacks:
        used = ", ".join(f"{one_line(d)} {format_bytes(m['used'])}" for d, m in f.plan.memory.items() if m["used"])
        lines.append(f"  fallback {f.fraction:g}: {_seconds(f.plan.predicted.get('total_s'))}, memory {used or 'none'}")
    return "\n".join(lines)


def solver_lines(plan: Any) -> list[str]:
    """The solver's lines: whose placement, what is proven (status, bound, gap, over what), the
    lower bound every placement obeys, and the ILP's own result when a baseline's placement won.

    Example:
        >>> solver_lines(plan)[0]                         # doctest: +SKIP
        '  solver     ilp:highs: within gap in 2.10 s (gap 0.42%, asked 1.00%), bound 5.55 ms'
    """
    s = plan.solver
    lines = [f"  solver     {s.name}: {proof_text(s, format_seconds(s.seconds))}"]
    if s.ilp is not None:
        lines.append(f"  ILP        {s.ilp.name}: {proof_text(s.ilp)}, its placement {_seconds(s.ilp.objective)}; "
                     f"the plan keeps {s.name}'s, which is faster")
    lower = plan.predicted.get("lower_bound_s")
    if lower is not None:
        lines.append(f"  lower bound {_seconds(lower)} for any placement (memory-aware)")
    if s.note:
        lines.append(f"  note       {s.note}")
    return lines


def proof_text(s: Any, took: str = "") -> str:
    """``within gap in 2.1 s (gap 0.42%, asked 1.00%), bound 5.55 ms over placements keeping 120
    groups whole`` for a SolverInfo (``took``: the time, when it is to be shown)."""
    parts = [s.status + (f" in {took}" if took else "")]
    if s.gap is not None:
        asked = f", asked {s.requested_gap:.2%}" if s.requested_gap is not None else ""
        parts.append(f" (gap {s.gap:.2%}{asked})")
    if s.bound is not None:
        scope = f" over placements keeping {s.nodes} groups whole" if s.nodes else ""
        parts.append(f", bound {_seconds(s.bound)}{scope}")
    return "".join(parts)


def asked_text(plan: Any) -> str:
    """What the plan was asked beyond the defaults (its ``request``): ``memory cuda:0=2GB, training True``.

    Example:
        >>> asked_text(plan)                               # doctest: +SKIP
        'devices h200-host, memory cuda:0=2GB'
    """
    from partitioner.options import PlanOptions

    if not plan.request:
        return "not recorded (a plan made before plans recorded their request)"
    return PlanOptions.from_record(plan.request).describe()


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
    busy = sum(costs.get("busy", {}).values())
    if busy:
        parts.append(f"{busy} of {sum(measured.values())} ops measured while the machine was busy (their times may be "
                     f"too high: profile again when it is quiet)")
    unsupported = costs.get("unsupported", {})
    if unsupported:
        parts.append(f"{len(unsupported)} ops failed on a device when measured and are not placed there")
    return f"{costs['model']}{source}: " + ("; ".join(parts) or "nothing measured")


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else format_seconds(value)
