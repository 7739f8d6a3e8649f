"""The plan's optional ``pipeline`` section: stages, ranks, hosts, micro-batches and schedule.

In: a pipeline problem and its placement (:func:`pipeline_record`), or the section of a plan file
(:func:`read_pipeline`, checked field by field; :func:`check_pipeline`, checked against the rest
of the plan). Out: the section as plain values. Plans without the section (every plan made before
pipelines existed, and every non-pipeline plan) stay valid: the section is optional.

The section (one entry per stage; stage ``s`` runs on rank ``s``)::

    pipeline  {"micro_batches": M, "schedule": "gpipe" | "1f1b", "world_size": S,
               "step_s", "bottleneck_s", "bubble_s", "optimizer_s",          # predicted
               "stages": [{"index", "device", "host", "node_rank", "rank", "local_rank",
                           "ops": count, "forward_s", "compute_s", "send_s", "send_bytes",
                           "sends": [tensor, ...], "optimizer_s", "in_flight", "memory"}, ...]}

Ranks follow the stages: hosts are numbered (``node_rank``) in the order their first stage
appears, and a host's stages take consecutive ranks, which is how ``torchrun`` numbers the
processes of ``--nnodes`` nodes started with ``--node-rank``. Which ops a stage runs is the
``placement`` of the plan (the ops placed on the stage's device).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from partitioner.plan.values import _REPLAN

if TYPE_CHECKING:
    from partitioner.plan.fields import FieldReader
    from partitioner.solvers.pipeline import PipelineCost
    from partitioner.solvers.problem import Placement, Problem

__all__ = ["pipeline_record", "read_pipeline", "check_pipeline", "cost_from_record", "summary_lines",
           "PIPELINE_KEYS", "STAGE_KEYS"]

PIPELINE_KEYS = ("micro_batches", "schedule", "world_size", "step_s", "bottleneck_s", "bubble_s",
                 "optimizer_s", "stages")
STAGE_KEYS = ("index", "device", "host", "node_rank", "rank", "local_rank", "ops", "forward_s", "compute_s",
              "send_s", "send_bytes", "sends", "optimizer_s", "in_flight", "memory")
_SECONDS = ("forward_s", "compute_s", "send_s", "optimizer_s")
_COUNTS = ("index", "node_rank", "rank", "local_rank", "ops", "send_bytes", "in_flight", "memory")


def pipeline_record(problem: Problem, placement: Placement) -> dict[str, Any]:
    """The ``pipeline`` section of the plan of ``placement`` (see the module docstring).

    Example:
        >>> pipeline_record(problem, solution.placement)["world_size"]   # doctest: +SKIP
        4
    """
    from partitioner.solvers.pipeline import pipeline_cost

    cost = pipeline_cost(problem, placement)
    hosts: dict[str, int] = {}
    local: dict[str, int] = {}
    stages = []
    for st in cost.stages:
        host = problem.devices.device(st.device).host
        hosts.setdefault(host, len(hosts))
        local[host] = local.get(host, -1) + 1
        stages.append({
            "index": st.index, "device": st.device, "host": host, "node_rank": hosts[host], "rank": st.index,
            "local_rank": local[host], "ops": sum(len(problem.members[n]) for n in st.nodes),
            "forward_s": st.forward_s, "compute_s": st.compute_s, "send_s": st.send_s,
            "send_bytes": st.send_bytes, "sends": list(st.sends), "optimizer_s": st.optimizer_s,
            "in_flight": st.in_flight, "memory": st.memory,
        })
    return {"micro_batches": cost.spec.micro_batches, "schedule": cost.spec.schedule.value,
            "world_size": len(stages), "step_s": cost.step_s, "bottleneck_s": cost.bottleneck_s,
            "bubble_s": cost.bubble_s, "optimizer_s": cost.optimizer_s, "stages": stages}


def read_pipeline(r: FieldReader, value: Any) -> dict[str, Any]:
    """The section read from decoded JSON, every field's type checked (``{}`` when absent)."""
    if value in (None, {}):
        return {}
    top = r.keys(value, "pipeline", PIPELINE_KEYS)
    out: dict[str, Any] = {
        "micro_batches": r.count(top["micro_batches"], "pipeline.micro_batches"),
        "schedule": r.string(top["schedule"], "pipeline.schedule"),
        "world_size": r.count(top["world_size"], "pipeline.world_size"),
    }
    for key in ("step_s", "bottleneck_s", "bubble_s", "optimizer_s"):
        out[key] = r.number(top[key], f"pipeline.{key}")
    stages = []
    for i, raw in enumerate(r.array(top["stages"], "pipeline.stages")):
        path = f"pipeline.stages[{i}]"
        st = r.keys(raw, path, STAGE_KEYS)
        entry: dict[str, Any] = {"device": r.string(st["device"], f"{path}.device"),
                                 "host": r.string(st["host"], f"{path}.host"),
                                 "sends": list(r.string_list(st["sends"], f"{path}.sends"))}
        entry.update({k: r.count(st[k], f"{path}.{k}") for k in _COUNTS})
        entry.update({k: r.number(st[k], f"{path}.{k}") for k in _SECONDS})
        stages.append({k: entry[k] for k in STAGE_KEYS})
    out["stages"] = stages
    return out


def check_pipeline(plan: Any, r: FieldReader) -> None:
    """The section agrees with the plan: known schedule, ranks 0..S-1 in order, stage devices in
    the device set and holding the ops placed there, no op placed outside the stages."""
    section = plan.pipeline
    if not section:
        return
    from partitioner.solvers.pipeline import Schedule

    schedules = tuple(s.value for s in Schedule)
    if section["schedule"] not in schedules:
        r.fail("pipeline.schedule", f"{section['schedule']!r} is not a schedule; use one of {', '.join(schedules)}")
    stages = section["stages"]
    if section["world_size"] != len(stages) or not stages:
        r.fail("pipeline.world_size", f"{section['world_size']}, but the plan lists {len(stages)} stages")
    _check_counts(plan, r)
    names = plan.devices.names()
    per_device: dict[str, int] = {}
    for op, device in plan.placement.items():
        per_device[device] = per_device.get(device, 0) + 1
    for i, st in enumerate(stages):
        path = f"pipeline.stages[{i}]"
        if st["index"] != i or st["rank"] != i:
            r.fail(path, f"stage {i} has index {st['index']} and rank {st['rank']}; stage s runs on rank s")
        if st["device"] not in names:
            r.fail(f"{path}.device", f"{st['device']!r} is not in the plan's devices ({', '.join(names)})")
        if plan.devices.device(st["device"]).host != st["host"]:
            r.fail(f"{path}.host", f"{st['host']!r}, but {st['device']} is on "
                                   f"{plan.devices.device(st['device']).host!r}")
        if per_device.get(st["device"], 0) != st["ops"]:
            r.fail(f"{path}.ops", f"{st['ops']}, but placement puts {per_device.get(st['device'], 0)} ops on "
                                  f"{st['device']}")
    order = [names.index(st["device"]) for st in stages]
    if order != sorted(set(order)):
        r.fail("pipeline.stages", "stage devices must be distinct and in the profile's order")
    outside = sorted(set(per_device) - {st["device"] for st in stages})
    if outside:
        r.fail("placement", f"ops are placed on {', '.join(outside)}, which is no pipeline stage")


def _check_counts(plan: Any, r: FieldReader) -> None:
    """The section's counts are those its stages run: at least one micro-batch (1F1B: one per stage),
    each stage's micro-batches in flight as its schedule keeps them, its memory the memory section's,
    and the ranks torchrun gives its hosts' processes."""
    from partitioner.solvers.pipeline import PipelineSpec

    section, stages = plan.pipeline, plan.pipeline["stages"]
    M, S = section["micro_batches"], len(stages)
    if M < 1:
        r.fail("pipeline.micro_batches", f"{M}: a pipeline step runs at least one micro-batch; {_REPLAN} "
                                         f"--micro-batches N")
    if section["schedule"] == "1f1b" and M < S:
        r.fail("pipeline.micro_batches", f"{M}, fewer than the {S} stages: 1F1B needs a micro-batch per stage; "
                                         f"{_REPLAN} --micro-batches {S} or --schedule gpipe")
    spec = PipelineSpec(M, section["schedule"])
    hosts: dict[str, int] = {}
    local: dict[str, int] = {}
    for i, st in enumerate(stages):
        path = f"pipeline.stages[{i}]"
        if st["in_flight"] != spec.in_flight(i, S):
            r.fail(f"{path}.in_flight", f"{st['in_flight']}, but stage {i} of {S} keeps {spec.in_flight(i, S)} "
                                        f"micro-batches in flight under {section['schedule']} with {M}; {_REPLAN}")
        used = plan.memory.get(st["device"], {}).get("used")
        if used is not None and st["memory"] != used:
            r.fail(f"{path}.memory", f"{st['memory']:,} bytes, but the memory section gives {st['device']} "
                                     f"{used:,}; the two must agree; {_REPLAN}")
        hosts.setdefault(st["host"], len(hosts))
        local[st["host"]] = local.get(st["host"], -1) + 1
        if (st["node_rank"], st["local_rank"]) != (hosts[st["host"]], local[st["host"]]):
            r.fail(path, f"node_rank {st['node_rank']} and local_rank {st['local_rank']}, but torchrun numbers "
                         f"this stage's process node_rank {hosts[st['host']]}, local_rank {local[st['host']]} "
                         f"(hosts in the order of their first stage, a host's stages one after another)")


def cost_from_record(plan: Any) -> PipelineCost:
    """The section as a :class:`~partitioner.solvers.pipeline.PipelineCost` (for the timeline)."""
    from partitioner.solvers.pipeline import PipelineCost, PipelineSpec, StageCost

    section = plan.pipeline
    spec = PipelineSpec(section["micro_batches"], section["schedule"])
    stages = tuple(
        StageCost(index=st["index"], device=st["device"], nodes=(), forward_s=st["forward_s"],
                  compute_s=st["compute_s"], send_s=st["send_s"], sends=tuple(st["sends"]),
                  send_bytes=st["send_bytes"], optimizer_s=st["optimizer_s"], in_flight=st["in_flight"],
                  memory=st["memory"], params_bytes=0, activation_bytes=0)
        for st in section["stages"])
    return PipelineCost(spec, stages, section["step_s"], section["bottleneck_s"], section["bubble_s"],
                        section["optimizer_s"], ())


def summary_lines(plan: Any) -> list[str]:
    """The pipeline's lines of the plan summary: the schedule, then one line per stage.

    Example:
        >>> print("\\n".join(summary_lines(plan)))                # doctest: +SKIP
          pipeline   2 stages, 1f1b, 4 micro-batches: bottleneck 51 µs per micro-batch, bubble 60 µs
          stage 0  rank 0  host0/cpu     24 ops  compute 51.0 µs  send 20.3 µs (2.00 KiB)  1 in flight  83.75 KiB
    """
    from cost_models.units import format_bytes, format_seconds
    from partitioner.terminal import one_line

    section = plan.pipeline
    if not section:
        return []
    lines = [f"  pipeline   {section['world_size']} stages, {section['schedule']}, {section['micro_batches']} "
             f"micro-batches: bottleneck {format_seconds(section['bottleneck_s'])} per micro-batch, bubble "
             f"{format_seconds(section['bubble_s'])}, optimizer {format_seconds(section['optimizer_s'])}"]
    width = max(len(one_line(st["device"])) for st in section["stages"])
    for st in section["stages"]:
        send = (f"send {format_seconds(st['send_s'])} ({format_bytes(st['send_bytes'])})"
                if st["index"] + 1 < section["world_size"] else "returns the outputs")
        lines.append(f"  stage {st['index']}  rank {st['rank']}  {one_line(st['device']):<{width}} {st['ops']:>5} ops  compute "
                     f"{format_seconds(st['compute_s'])}  {send}  {st['in_flight']} in flight  "
                     f"{format_bytes(st['memory'])}")
    return lines
