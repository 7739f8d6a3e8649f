"""A plan's sections agree with each other, beyond the references the reader checks.

In: a :class:`~partitioner.plan.record.Plan` whose fields are typed and whose names all resolve
(:func:`~partitioner.plan.reader.check_references` ran). Out: nothing, or a
:class:`~partitioner.plan.values.PlanFormatError` naming the field that contradicts another: a
schedule that leaves out ops, memory over capacity or different from the device set's, weights
streamed from the device that uses them, a transfer that leaves another device than its
producer's or reaches one where no consumer runs (in a pipeline plan: a transfer that is not one
of the tensors the pipeline section sends from a stage to the next), and what the placement itself
implies (:mod:`partitioner.plan.implied`: memory below what it puts on a device, a crossing edge
without its copy). A hand-edited or damaged plan is refused here rather than run, and ``explain``
never calls such a placement "fits".
"""

from __future__ import annotations

from typing import Any

from partitioner.plan.implied import check_implied
from partitioner.plan.fields import _field, _key
from partitioner.plan.values import _REPLAN

__all__ = ["check_sections"]


def check_sections(plan: Any, r: Any) -> None:
    """Raise (through ``r``, the plan's :class:`~partitioner.plan.fields.FieldReader`) unless the
    schedule lists every op, memory is within and equal to the device set's capacities, streamed
    weights come from another device, and every transfer leaves its producer's device for a device
    where a consumer runs.

    Example:
        >>> check_sections(plan, FieldReader("plan.json"))   # doctest: +SKIP
    """
    if plan.schedule and len(plan.schedule) != len(plan.placement):
        missing = [op for op in plan.placement if op not in set(plan.schedule)]
        r.fail("schedule", f"lists {len(plan.schedule)} of the {len(plan.placement)} placed ops "
                           f"(missing: {', '.join(map(repr, missing[:3]))}{' ...' if len(missing) > 3 else ''}); "
                           f"every op must be issued once; {_REPLAN}")
    for device in plan.devices.names():
        if device not in plan.memory:
            r.fail("memory", f"has no entry for device {device!r}; every device of the plan needs "
                             f"{{\"used\", \"capacity\"}}")
        used, capacity = plan.memory[device]["used"], plan.memory[device]["capacity"]
        profile = plan.devices.device(device).memory
        if capacity != profile:
            r.fail(_field(_key("memory", device), "capacity"),
                   f"{capacity:,} bytes, but the plan's devices section gives {device} {profile:,} bytes; "
                   f"the two must agree; {_REPLAN}")
        if used > capacity:
            r.fail(_field(_key("memory", device), "used"),
                   f"{used:,} bytes, over the capacity of {capacity:,}: the placement does not fit "
                   f"{device}; a plan never exceeds a device; {_REPLAN}")
    for op, home in plan.weights.items():
        if home == plan.placement[op]:
            r.fail(_key("weights", op), f"streams op {op!r}'s weights from {home!r}, the device it runs on; "
                                        f"a streamed op keeps its weights on another device")
    consumers: dict[str, set[str]] = {}
    for u, v in plan.edges:
        consumers.setdefault(u, set()).add(plan.placement[v])
    stages = plan.pipeline["stages"] if plan.pipeline else []
    relayed = {(st["device"], nxt["device"]): set(st["sends"]) for st, nxt in zip(stages, stages[1:])}
    for i, t in enumerate(plan.transfers):
        path = f"transfers[{i}]"
        if t.src == t.dst:
            r.fail(path, f"copies {t.tensor!r} from {t.src} to itself; a transfer crosses devices")
        if t.kind == "activation" and stages:  # relayed stage to stage, through stages that do not read it
            if t.tensor not in relayed.get((t.src, t.dst), ()):
                r.fail(path, f"copies {t.tensor!r} {t.src} -> {t.dst}, but the pipeline section does not send it "
                             f"between these consecutive stages; the transfers contradict the pipeline")
        elif t.kind == "activation":
            producer = t.tensor if t.tensor in plan.placement else t.tensor.rpartition(".")[0]
            if producer not in plan.placement:
                continue  # a graph input: it starts on the host
            if t.src != plan.placement[producer]:
                r.fail(_field(path, "from"), f"{t.src!r}, but {producer!r}, which makes {t.tensor!r}, runs on "
                                             f"{plan.placement[producer]!r}; the transfers contradict the placement "
                                             f"(was it edited?); {_REPLAN}")
            if plan.edges and t.dst not in consumers.get(producer, set()):
                r.fail(_field(path, "to"), f"{t.dst!r}, but no consumer of {t.tensor!r} runs there; the "
                                           f"transfers contradict the placement (was it edited?); {_REPLAN}")
        elif t.kind == "weights" and t.tensor in plan.placement:
            if t.dst != plan.placement[t.tensor] or plan.weights.get(t.tensor, t.src) != t.src:
                r.fail(path, f"streams {t.tensor!r}'s weights {t.src} -> {t.dst}, but the plan runs it on "
                             f"{plan.placement[t.tensor]!r} with weights on "
                             f"{plan.weights.get(t.tensor, plan.placement[t.tensor])!r}; {_REPLAN}")
    check_implied(plan, r)  # what the placement implies: memory floors and the copies it needs
