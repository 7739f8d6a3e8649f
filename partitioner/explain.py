"""Why an op (or a module) sits where it does, from a plan file alone.

In: a :class:`~partitioner.plan.Plan` and an op name or module path (a glob works too). Out: an
:class:`Explanation`: its device and whether its weights are streamed, its predicted time on
every device of the profile, the transfers it causes where it is and would cause on each other
device (its inputs from their producers' devices, its outputs to its consumers' devices), the
memory its weights take against each device's room (a streamed op's weights take stream buffers
where it computes, not their size: :func:`_fits`), and the pins and caps that bound it.
"""

from __future__ import annotations

import dataclasses
import fnmatch

from cost_models.analytic import transfer_time
from cost_models.units import format_bytes, format_seconds
from partitioner.errors import HetpartError
from partitioner.plan import Plan


@dataclasses.dataclass(frozen=True)
class DeviceOption:
    """What placing the target on one device would cost."""

    device: str
    compute_s: float | None        # None: the device cannot run every op of the target
    transfer_s: float              # activations crossing into and out of the target from there
    fits: bool                     # its weights (resident, or stream buffers where streamed) fit the device
    chosen: bool


@dataclasses.dataclass(frozen=True)
class Explanation:
    target: str
    ops: tuple[str, ...]
    devices: tuple[str, ...]       # where its ops run now
    streamed: int                  # how many of its ops stream their weights
    param_bytes: int
    options: tuple[DeviceOption, ...]
    pins: dict[str, str]
    notes: tuple[str, ...]

    def to_text(self) -> str:
        where = ", ".join(self.devices)
        head = f"{self.target}: {len(self.ops)} op(s) on {where}"
        if self.streamed:
            head += f", weights of {self.streamed} op(s) streamed from host memory"
        lines = [head, f"  parameters: {format_bytes(self.param_bytes)}"]
        if self.pins:
            lines.append("  pinned: " + ", ".join(f"{op} -> {d}" for op, d in list(self.pins.items())[:5]))
        lines.append(f"  {'device':<10} {'compute':>10} {'transfers':>10} {'total':>10}  memory")
        for o in self.options:
            compute = format_seconds(o.compute_s) if o.compute_s is not None else "cannot run"
            total = format_seconds(o.compute_s + o.transfer_s) if o.compute_s is not None else "-"
            mark = "  <- chosen" if o.chosen else ""
            lines.append(f"  {o.device:<10} {compute:>10} {format_seconds(o.transfer_s):>10} {total:>10}  "
                         f"{'fits' if o.fits else 'does not fit'}{mark}")
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def explain(plan: Plan, target: str) -> Explanation:
    """Explain where ``target`` (an op name, a module path, or a glob over either) runs and why.

    Example:
        >>> print(explain(Plan.load("plan.json"), "emb").to_text())   # doctest: +SKIP
    """
    ops = _select(plan, target)
    chosen = tuple(dict.fromkeys(plan.placement[op] for op in ops))
    per_device = plan.predicted.get("per_op_device_s")
    if per_device is None:
        raise HetpartError(f"{plan.source}: the plan has no per-device op times; re-plan with this hetpart")
    producers: dict[str, list[str]] = {}
    consumers: dict[str, list[str]] = {}
    for u, v in plan.edges:
        producers.setdefault(v, []).append(u)
        consumers.setdefault(u, []).append(v)
    inside = set(ops)
    param_bytes = sum(plan.op_bytes.get(op, (0, 0))[1] for op in ops)
    options = []
    for device in plan.devices.names():
        times = [per_device.get(op, {}).get(device) for op in ops]
        compute = None if any(t is None for t in times) else sum(times)  # type: ignore[arg-type]
        traffic = _traffic(plan, ops, inside, producers, consumers, device)
        options.append(DeviceOption(device, compute, traffic, _fits(plan, ops, device), device in chosen))
    pins = {op: d for op, d in dict(plan.constraints.get("pins", {})).items() if op in inside}
    return Explanation(target, ops, chosen, sum(1 for op in ops if op in plan.weights), param_bytes,
                       tuple(options), pins, _notes(plan, options, chosen, pins))


def _fits(plan: Plan, ops: tuple[str, ...], device: str) -> bool:
    """Whether the device's memory holds the target's weights if all of it ran there: its recorded use,
    less the target's weights resident there now and its share of the stream buffers, plus what it
    would hold there: the weights of its unstreamed ops (and of streamed ops whose weights live there),
    and buffers for the ops that keep streaming (two of the largest for prefetch, one for sync). For
    the device where it runs now this is the recorded use, which the plan's checks hold within capacity."""
    size = {op: plan.op_bytes.get(op, (0, 0))[1] for op in plan.placement}
    factor = 2 if plan.stream_mode == "prefetch" else 1
    inside = set(ops)

    def buffer(streamed: list[str]) -> int:
        return factor * max((size[op] for op in streamed), default=0)

    others = [op for op, home in plan.weights.items() if op not in inside and plan.placement[op] == device]
    streaming_now = [op for op in ops if op in plan.weights and plan.placement[op] == device]
    streaming_there = [op for op in ops if plan.weights.get(op, device) != device]
    resident_now = sum(size[op] for op in ops if plan.weights.get(op, plan.placement[op]) == device)
    resident_there = sum(size[op] for op in ops if plan.weights.get(op, device) == device)
    used = plan.memory.get(device, {}).get("used", 0)
    capacity = plan.memory.get(device, {}).get("capacity", plan.devices.device(device).memory)
    moved = (used - resident_now + resident_there
             + buffer(others + streaming_there) - buffer(others + streaming_now))
    return moved <= capacity


def _select(plan: Plan, target: str) -> tuple[str, ...]:
    if target in plan.placement:
        return (target,)
    ops = [op for op, path in plan.modules.items()
           if path == target or path.startswith(target + ".") or fnmatch.fnmatchcase(path, target)
           or fnmatch.fnmatchcase(op, target)]
    if not ops:
        modules = sorted({p.split(".")[0] for p in plan.modules.values() if p})
        raise HetpartError(f"no op or module {target!r} in the plan for {plan.model_name!r}; "
                           f"top-level modules are: {', '.join(modules[:12])}")
    order = {op: i for i, op in enumerate(plan.schedule)}
    return tuple(sorted(ops, key=lambda op: order.get(op, 0)))


def _traffic(plan: Plan, ops: tuple[str, ...], inside: set[str], producers: dict, consumers: dict,
             device: str) -> float:
    """Seconds of activation copies into and out of the target if it ran on ``device``
    (a tensor crosses once per destination device, however many consumers it has there)."""
    copies: set[tuple[str, str, str]] = set()  # (producer op, from, to)
    for op in ops:
        for u in producers.get(op, ()):
            if u not in inside and plan.placement[u] != device:
                copies.add((u, plan.placement[u], device))
        for v in consumers.get(op, ()):
            if v not in inside and plan.placement[v] != device:
                copies.add((op, device, plan.placement[v]))
    return sum(transfer_time(plan.op_bytes.get(u, (0, 0))[0], src, dst, plan.devices).seconds
               for u, src, dst in copies)


def _notes(plan: Plan, options: list[DeviceOption], chosen: tuple[str, ...], pins: dict[str, str]) -> tuple[str, ...]:
    notes = []
    runnable = [o for o in options if o.compute_s is not None]
    best = min(runnable, key=lambda o: o.compute_s + o.transfer_s) if runnable else None
    if pins:
        notes.append("it is pinned: the solver had no choice")
    if best is not None and best.device not in chosen:
        if not best.fits:
            notes.append(f"{best.device} would be faster for it alone but its parameters do not fit there")
        else:
            notes.append(f"{best.device} would be faster for it alone; the solver trades that for the whole "
                         f"plan's objective ({plan.objective}): other ops, transfers or memory elsewhere")
    unable = [o.device for o in options if o.compute_s is None]
    if unable:
        notes.append(f"cannot run on {', '.join(unable)} (unsupported ops)")
    return tuple(notes)
