"""A generation plan for people: both phases side by side, what differs between them, baselines.

In: a :class:`~partitioner.plan.generation.GenerationPlan`. Out: the text ``hetpart plan --generate``
prints and ``GenerationPlan.summary()`` returns; names from the plan are put on one line each.
"""

from __future__ import annotations

from typing import Any

from cost_models.units import format_bytes, format_seconds
from partitioner.terminal import one_line

SHOWN_DIFFERENCES = 6  # modules listed where the phases use weights differently


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else format_seconds(seconds)


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def generation_summary(gen: Any) -> str:
    r, p = gen.request, gen.predicted
    pre, dec = gen.prefill, gen.decode
    lines = [f"generation plan for '{one_line(pre.model_name)}' on {one_line(pre.devices.name)}: "
             f"prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new, batch {r['batch']}, cache "
             f"{r['max_context']} tokens; objective {r['objective']}",
             f"  request    {_s(p['request_s'])} predicted (prefill {_s(p['prefill_s'])} + "
             f"{max(r['new_tokens'] - 1, 0)} decode steps of {_s(p['decode_s'])})"]
    s = gen.solver
    gap = "n/a" if s.gap is None else f"{s.gap:.2%}"
    lines.append(f"  solver     {one_line(s.name)}: {s.status}, bound {_s(s.bound)}, gap {gap}, {s.seconds:.1f} s"
                 + (f" ({one_line(s.note)})" if s.note else ""))
    lines.append(f"  {'':<18} {'prefill':>24}  {'decode':>24}")
    lines.append(f"  {'time per step':<18} {_s(p['prefill_s']):>24}  {_s(p['decode_s']):>24}")
    lines.append(f"  {'tokens/s':<18} {_rate(p['prefill_tokens_per_s']):>24}  {_rate(p['decode_tokens_per_s']):>24}")
    for device in pre.devices.names():
        counts = []
        for plan in (pre, dec):
            ops = sum(1 for d in plan.placement.values() if d == device)
            busy = plan.predicted["per_device_s"].get(device)
            counts.append(f"{ops} ops, busy {_s(busy)}")
        lines.append(f"  {one_line(device):<18} {counts[0]:>24}  {counts[1]:>24}")
    for device in pre.devices.names():
        used = [plan.memory.get(device, {}).get("used", 0) for plan in (pre, dec)]
        cap = pre.memory.get(device, {}).get("capacity", pre.devices.device(device).memory)
        lines.append(f"  {'memory ' + one_line(device):<18} {format_bytes(used[0]):>24}  {format_bytes(used[1]):>24}"
                     f"  of {format_bytes(cap)}")
    lines += _precision_rows(gen)
    streamed = [len(plan.weights) for plan in (pre, dec)]
    lines.append(f"  {'streamed weights':<18} {str(streamed[0]) + ' ops':>24}  {str(streamed[1]) + ' ops':>24}")
    differ = gen.phase_difference()
    if differ:
        lines.append(f"  the phases use the weights of {len(differ)} modules differently:")
        for module, a, b in differ[:SHOWN_DIFFERENCES]:
            lines.append(f"    {one_line(module)}: prefill {one_line(a)}, decode {one_line(b)}")
        if len(differ) > SHOWN_DIFFERENCES:
            lines.append(f"    ... and {len(differ) - SHOWN_DIFFERENCES} more")
    else:
        lines.append("  both phases use every weight where it is (the same placement for both)")
    request = p["request_s"]
    for name, b in gen.baselines.items():
        fits = "" if b["feasible"] else "  (does not fit: " + one_line(b["note"] or "over a cap") + ")"
        ratio = f"  {b['request_s'] / request:6.2f}x" if request and b["request_s"] and b["feasible"] else ""
        lines.append(f"  baseline {one_line(name):<22} prefill {_s(b['prefill_s']):>9}  decode {_s(b['decode_s']):>9}"
                     f"  request {_s(b['request_s']):>9}{ratio}{fits}")
    return "\n".join(lines)


def _precision_rows(gen: Any) -> list[str]:
    """Rows of a plan made with ``precision``: its setting, each phase's 16-bit ops and packed weights."""
    section = gen.precision
    if not section:
        return []
    setting = section["setting"]
    shown = setting if isinstance(setting, str) else ", ".join(f"{k}={v}" for k, v in setting.items())
    rows = [f"  {'precision':<18} {one_line(str(shown))} (each weight stored one way, shared by both phases)"]
    low = [f"{len(section[p]['ops'])} ops" for p in ("prefill", "decode")]
    rows.append(f"  {'16-bit ops':<18} {low[0]:>24}  {low[1]:>24}")
    packed = []
    for phase in ("prefill", "decode"):
        counts: dict[str, int] = {}
        for w in section[phase]["weights"].values():
            counts[w] = counts.get(w, 0) + 1
        held = sum(section[phase]["weight_bytes"].values())
        packed.append((", ".join(f"{n} {w}" for w, n in sorted(counts.items())) + f" ({format_bytes(held)})")
                      if counts else "none")
    rows.append(f"  {'packed weights':<18} {packed[0]:>24}  {packed[1]:>24}")
    return rows
