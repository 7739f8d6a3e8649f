"""The plan's optional live-state sections: the memory probe that set its caps, and fallback plans.

In: a :class:`~cost_models.live_memory.Probe` (``probe``) and fallback plans solved ahead of time
(``fallbacks``), or those sections of a plan file (:func:`read_probe`, :func:`read_fallbacks`,
checked field by field; :func:`check_fallbacks`, checked against the primary plan). Out: the
sections as values, and :func:`plan_that_fits`: which plan runs with the memory available now.
Plans without the sections (every plan made before them) stay valid::

    probe      {"taken_at": UTC time, "base": the base profile's source,
                "margin": {"fraction": f} | {"bytes": n},
                "devices": {device: {"source": "nvml" | "torch" | "profile", "free", "total",
                                     "used": bytes | null, "utilization": percent | null, "cap"}},
                "notes": [each fallback taken, in words]}
    fallbacks  [{"fraction": f in (0, 1), "plan": a whole plan (without probe or fallbacks)}, ...]

A fallback plan is the same model solved with every accelerator's memory scaled to ``fraction``
of the primary plan's capacity; a plan *needs* on each device the bytes its ``memory.used`` says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cost_models.units import format_bytes
from partitioner.errors import HetpartError, NoPlanFits
from partitioner.options import check_fractions

if TYPE_CHECKING:
    from partitioner.plan.fields import FieldReader
    from partitioner.plan.record import Plan

__all__ = ["FallbackPlan", "check_fractions", "check_fallbacks", "read_probe", "read_fallbacks", "plan_needs",
           "plan_labels", "plan_that_fits"]

_PROBE_KEYS = ("taken_at", "base", "margin", "devices", "notes")
_READING_KEYS = ("source", "free", "total", "used", "utilization", "cap")
_SOURCES = ("nvml", "torch", "profile")


@dataclasses.dataclass(frozen=True)
class FallbackPlan:
    """A plan solved ahead of time for less memory: every accelerator at ``fraction`` of the primary's."""

    fraction: float
    plan: Plan

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "plan": self.plan.to_dict()}


def plan_needs(plan: Plan) -> dict[str, int]:
    """Bytes the plan needs on each device (its predicted ``memory.used``)."""
    return {device: int(m["used"]) for device, m in plan.memory.items()}


def plan_labels(plan: Plan) -> tuple[str, ...]:
    """``("primary", "fallback 0.75", ...)``: the names logs and ``hetpart watch`` use."""
    return ("primary", *(f"fallback {f.fraction:g}" for f in plan.fallbacks))


def plan_that_fits(plan: Plan, available: Mapping[str, int]) -> int:
    """Index of the plan to run with ``available`` bytes per device: 0 for the primary when it fits,
    else ``1 + i`` for the first fallback that fits. Devices missing from ``available`` are not
    limited.

    Raises:
        NoPlanFits: no plan fits; names each device short, its available memory and the least
            any plan needs there.

    Example:
        >>> plan_that_fits(plan, {"cuda:0": 2**30})       # doctest: +SKIP
        0
    """
    unknown = sorted(set(available) - set(plan.devices.names()))
    if unknown:
        raise HetpartError(f"the memory probe reports {', '.join(unknown)}, not devices of the plan "
                           f"({', '.join(plan.devices.names())}); return {{device: free bytes}} for the plan's devices")
    plans = (plan, *(f.plan for f in plan.fallbacks))
    needs = [plan_needs(p) for p in plans]
    for index, need in enumerate(needs):
        if all(need.get(d, 0) <= free for d, free in available.items()):
            return index
    labels = plan_labels(plan)
    least = {d: min(n.get(d, 0) for n in needs) for d in available}
    short = [d for d in available if available[d] < least[d]]
    if short:
        lines = [f"{d}: {format_bytes(available[d])} available, the plans need at least {format_bytes(least[d])} "
                 f"({', '.join(f'{label} {format_bytes(n.get(d, 0))}' for label, n in zip(labels, needs))})"
                 for d in short]
    else:  # each plan is short somewhere, but on different devices
        lines = [f"{label}: " + ", ".join(f"{d} needs {format_bytes(n.get(d, 0))}, {format_bytes(free)} available"
                                          for d, free in available.items() if n.get(d, 0) > free)
                 for label, n in zip(labels, needs)]
    lowest = (f"below {min(f.fraction for f in plan.fallbacks):g}" if plan.fallbacks
              else "(partition(..., fallbacks=[0.75, 0.5]))")
    raise NoPlanFits("no plan fits the memory available now, nothing was run:\n  " + "\n  ".join(lines) +
                     f"\nfree memory on {', '.join(short) or 'those devices'}, or plan a fallback level {lowest} "
                     f"(CLI: hetpart plan --fallbacks)")


# --------------------------------------------------------------------------------------------
# Reading the sections
# --------------------------------------------------------------------------------------------


def read_probe(r: FieldReader, value: Any) -> dict[str, Any]:
    """``probe``, checked field by field (absent: ``{}``)."""
    p = r.mapping(value, "probe")
    if not p:
        return {}
    p = r.keys(p, "probe", _PROBE_KEYS)
    margin = r.keys(p["margin"], "probe.margin", (), ("fraction", "bytes"))
    if len(margin) != 1:
        r.fail("probe.margin", "expected {\"fraction\": f} or {\"bytes\": n}")
    kind, amount = next(iter(margin.items()))
    devices = {}
    for device, reading in r.mapping(p["devices"], "probe.devices").items():
        path = f"probe.devices.{device}"
        reading = r.keys(reading, path, _READING_KEYS)
        source = r.string(reading["source"], f"{path}.source")
        if source not in _SOURCES:
            r.fail(f"{path}.source", f"{source!r} is not one of {', '.join(_SOURCES)}")
        devices[device] = {
            "source": source, "free": r.count(reading["free"], f"{path}.free"),
            "total": r.count(reading["total"], f"{path}.total"),
            "used": None if reading["used"] is None else r.count(reading["used"], f"{path}.used"),
            "utilization": r.number_or_null(reading["utilization"], f"{path}.utilization"),
            "cap": r.count(reading["cap"], f"{path}.cap")}
    return {"taken_at": r.string(p["taken_at"], "probe.taken_at"), "base": r.string(p["base"], "probe.base"),
            "margin": {kind: r.number(amount, f"probe.margin.{kind}") if kind == "fraction"
                       else r.count(amount, "probe.margin.bytes")},
            "devices": devices, "notes": list(r.string_list(p["notes"], "probe.notes"))}


def read_fallbacks(r: FieldReader, value: Any) -> tuple[FallbackPlan, ...]:
    """``fallbacks``: each nested plan read as a whole plan (its errors name ``fallbacks[i].plan``)."""
    from partitioner.plan.record import Plan  # the record imports the reader, which imports this

    out = []
    for i, item in enumerate(r.array(value, "fallbacks")):
        item = r.keys(item, f"fallbacks[{i}]", ("fraction", "plan"))
        fraction = r.number(item["fraction"], f"fallbacks[{i}].fraction")
        nested = r.mapping(item["plan"], f"fallbacks[{i}].plan")
        if "fallbacks" in nested or "probe" in nested:
            r.fail(f"fallbacks[{i}].plan", "a fallback plan carries no probe or fallbacks of its own")
        out.append(FallbackPlan(fraction, Plan.from_dict(nested, f"{r.source}: fallbacks[{i}].plan")))
    return tuple(out)


def check_fallbacks(plan: Plan, r: FieldReader) -> None:
    """Each fallback is a plan of the same graph on the same devices, its fraction in (0, 1)."""
    for i, fallback in enumerate(plan.fallbacks):
        path = f"fallbacks[{i}]"
        if not 0 < fallback.fraction < 1:
            r.fail(f"{path}.fraction", f"{fallback.fraction!r} is outside (0, 1)")
        nested = fallback.plan
        if nested.fallbacks or nested.probe:
            r.fail(f"{path}.plan", "a fallback plan carries no probe or fallbacks of its own")
        if nested.fingerprint != plan.fingerprint:
            r.fail(f"{path}.plan.model.fingerprint", f"{nested.fingerprint} is not the primary plan's "
                                                     f"({plan.fingerprint}): fallbacks are plans of the same graph")
        if nested.devices.names() != plan.devices.names():
            r.fail(f"{path}.plan.devices", f"devices {', '.join(nested.devices.names())} are not the primary "
                                           f"plan's ({', '.join(plan.devices.names())})")
        if nested.training != plan.training:
            r.fail(f"{path}.plan.training", "a fallback plans the same step (training or inference) as the primary")
