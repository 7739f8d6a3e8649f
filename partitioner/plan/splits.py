"""The plan's ``splits`` section: each op split over devices, and the checks it must pass.

In: a solve's placement (:func:`splits_record`), or a plan file's section (:func:`read_splits`).
Out: ``{op: {"axis": "cols" | "rows" | "table" | "batch", "devices": [home, d1, ...], "fractions": [f0, f1, ...],
"bytes": [b_home, b1, ...]}}`` (two or more devices, one fraction and one ``bytes`` entry each; ``bytes``: each
shard's parameter bytes, adding up to the op's; plans written with two devices read the same); the op
runs on ``devices[0]`` in ``placement`` (its home, where its input arrives and its output is
rejoined). A time split (:mod:`partitioner.solvers.chunked_streaming`) is ``{"axis": "time",
"devices": [accelerator, host], "chunks": n, "bytes": [b_accelerator, b_host]}``: the op computes on
the accelerator from ``n`` row chunks of its weight held on the host (``bytes``: the bias kept on the
accelerator, the weight on the host). A time split by expert (a fused experts op, its experts streamed
group by group, :mod:`partitioner.solvers.expert_streaming`) adds ``"by": "expert"``: ``chunks`` groups of
whole experts; its op computes on the accelerator and the view owning its fused weight (the op's producer
holding ``bytes[1]``) is placed with it. An experts split (:mod:`partitioner.solvers.expert_devices`) is
``{"axis": "experts", "devices": [home, other], "fractions": [f, 1 - f], "bytes": [b_home, b_other]}``: each
device's share of the experts (``bytes``: its experts' bytes, home's with the op's own), the view placed
with the op too. :func:`check_splits` runs when a plan is built or loaded:
fractions in (0, 1) summing to one, one per device (a time split: a whole number of chunks, at least
2, an accelerator then the plan's host), two or more distinct devices of the plan, a known axis, the home being
the op's device, no streaming, inference. :func:`check_splits_against_graph` runs with the graph (``plan.check_graph``, emission):
the op takes splits along that axis (cols, rows, time: an aten linear with its own 2-D weight;
table: an embedding alone reading its table; batch: an elementwise op or a norm,
:mod:`partitioner.solvers.split_axes`; ``by: expert`` and experts: a grouped matmul whose weight view
owns a 3-D parameter, with at least ``chunks`` experts). A batch split's ``bytes`` are the op's
parameters on each device (a norm's weight and bias on all of them). Every refusal names the op, the
split and the splits it can take.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from partitioner.errors import PlanMismatch
from partitioner.plan.fields import FieldReader, _key

if TYPE_CHECKING:
    from partitioner.ir import OpGraph
    from partitioner.solvers.chunked_streaming import TimeSplit
    from partitioner.solvers.problem import Placement, Problem
    from partitioner.solvers.splits import Split

__all__ = ["check_splits", "check_splits_against_graph", "expert_weight_op", "read_splits", "refuse_splits", "split_of",
           "splits_record"]

_KEYS = ("axis", "devices", "fractions")
_TIME_KEYS = ("axis", "devices", "chunks")
_CAN_TAKE = ("cols, rows (linears), table (embeddings) or batch (elementwise ops and norms) over two or more "
             "distinct devices of the plan, the first being the op's own, with one fraction per device, each in "
             "(0, 1), summing to one")


def splits_record(problem: Problem, placement: Placement) -> dict[str, Any]:
    """The section for ``placement``'s splits, keyed by the split op's name."""
    from partitioner.solvers.splits import split_op

    return {split_op(problem, n).name: {**sp.to_dict(), "bytes": list(problem.split_price[(n, sp)].param_bytes)}
            for n, sp in placement.split.items()}


def read_splits(r: FieldReader, value: Any) -> dict[str, Any]:
    """The section's types: op -> {axis: str, devices: [str, ...], fractions: [number, ...]}."""
    out = {}
    for op, entry in r.mapping(value, "splits").items():
        path = _key("splits", op)
        timed = isinstance(entry, Mapping) and entry.get("axis") == "time"
        e = r.keys(entry, path, _TIME_KEYS if timed else _KEYS, ("bytes", "by") if timed else ("bytes",))
        devices = [r.string(d, f"{path}.devices[{i}]") for i, d in enumerate(r.array(e["devices"], f"{path}.devices"))]
        if timed:
            out[op] = {"axis": "time", "devices": devices, "chunks": r.count(e["chunks"], f"{path}.chunks")}
            if "by" in e:
                if e["by"] != "expert":
                    r.fail(f"{path}.by", f"{e['by']!r}: a time split's chunks are a linear's weight rows (no 'by' "
                                         f"key) or groups of a fused experts op's experts (\"by\": \"expert\")")
                out[op]["by"] = "expert"
            if "bytes" in e:
                out[op]["bytes"] = [r.count(b, f"{path}.bytes[{i}]")
                                    for i, b in enumerate(r.array(e["bytes"], f"{path}.bytes"))]
            continue
        fractions = []
        for i, f in enumerate(r.array(e["fractions"], f"{path}.fractions")):
            if isinstance(f, bool) or not isinstance(f, (int, float)):
                r.fail(f"{path}.fractions[{i}]", f"{f!r} is not a number")
            fractions.append(float(f))
        out[op] = {"axis": r.string(e["axis"], f"{path}.axis"), "devices": devices, "fractions": fractions}
        if "bytes" in e:
            out[op]["bytes"] = [r.count(b, f"{path}.bytes[{i}]") for i, b in enumerate(r.array(e["bytes"], f"{path}.bytes"))]
    return out


def check_splits(plan: Any, r: FieldReader) -> None:
    """What a split must be whatever the model (see the module docstring)."""
    from partitioner.solvers.splits import AXES

    names = plan.devices.names()
    for op, entry in plan.splits.items():
        path = _key("splits", op)
        what = f"op {op!r} split {_label(entry)}"
        if op not in plan.placement:
            r.fail(path, f"{what}: no op {op!r} in placement; a split names an op of the plan")
        if entry["axis"] not in AXES:
            r.fail(f"{path}.axis", f"{what}: unknown axis {entry['axis']!r}; an op can take {_CAN_TAKE}")
        if entry["axis"] == "time":
            _check_time_split(plan, r, op, entry)
            continue
        devices, fractions = list(entry["devices"]), list(entry["fractions"])
        if len(devices) < 2 or len(set(devices)) != len(devices) or any(d not in names for d in devices):
            r.fail(f"{path}.devices", f"{what}: devices {devices} are not two or more distinct devices of the plan "
                                      f"({', '.join(names)}); an op can take {_CAN_TAKE}")
        if len(fractions) != len(devices):
            r.fail(f"{path}.fractions", f"{what}: {len(fractions)} fractions for {len(devices)} devices; give one "
                                        f"fraction per device (an op can take {_CAN_TAKE})")
        if not all(0.0 < f < 1.0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
            r.fail(f"{path}.fractions", f"{what}: fractions {fractions} do not sum to one (their sum is "
                                        f"{sum(fractions):g}; each must be in (0, 1)): set them to shares of the op "
                                        f"that sum to one, or re-plan (an op can take {_CAN_TAKE})")
        if plan.placement[op] != devices[0]:
            r.fail(f"{path}.devices", f"{what}: the op runs on {plan.placement[op]!r} in placement, but a split op "
                                      f"runs on its first device, {devices[0]!r}")
        total = plan.op_bytes.get(op, (0, None))[1]
        if entry["axis"] == "experts":
            _check_expert_weight(plan, r, op, entry)
        elif entry["axis"] == "batch":
            if "bytes" in entry and total is not None and list(entry["bytes"]) != [total] * len(devices):
                r.fail(f"{path}.bytes", f"{what}: bytes {list(entry['bytes'])} are not the op's {total:,} parameter "
                                        f"bytes on each device (model.op_bytes): a batch split copies them to each")
        elif "bytes" in entry and total is not None and (len(entry["bytes"]) != len(devices)
                                                         or sum(entry["bytes"]) != total):
            r.fail(f"{path}.bytes", f"{what}: shard bytes {list(entry['bytes'])} do not add up to the op's "
                                    f"{total:,} parameter bytes (model.op_bytes)")
        if op in plan.weights:
            r.fail(path, f"{what}: the plan also streams its weights; a split op's shards stay resident")
        if plan.training:
            r.fail(path, f"{what}: splits are planned for inference, and this plan is a training plan")


_CAN_TAKE_TIME = ("time splits of 2 or more chunks from the plan's host to the accelerator the op runs on "
                  "(devices [accelerator, host])")


def _check_time_split(plan: Any, r: FieldReader, op: str, entry: Mapping[str, Any]) -> None:
    """What a time split must be whatever the model: an accelerator of the plan, then its host, the
    op running on the first; 2 or more chunks; its bytes adding up to the op's; inference, not streamed."""
    path = _key("splits", op)
    what = f"op {op!r} split {_label(entry)}"
    host = plan.devices.host_device().name
    devices = list(entry["devices"])
    if len(devices) != 2 or devices[1] != host or devices[0] == host or devices[0] not in plan.devices.names():
        r.fail(f"{path}.devices", f"{what}: devices {devices} are not an accelerator of the plan and then its host "
                                  f"{host!r}; an op can take {_CAN_TAKE_TIME}")
    if isinstance(entry["chunks"], bool) or not isinstance(entry["chunks"], int) or entry["chunks"] < 2:
        r.fail(f"{path}.chunks", f"{what}: {entry['chunks']!r} chunks; an op can take {_CAN_TAKE_TIME}")
    if plan.placement[op] != devices[0]:
        r.fail(f"{path}.devices", f"{what}: the op runs on {plan.placement[op]!r} in placement, but a time-split op "
                                  f"runs on its first device, {devices[0]!r}")
    total = plan.op_bytes.get(op, (0, None))[1]
    if entry.get("by") == "expert":
        _check_expert_weight(plan, r, op, entry)
    elif "bytes" in entry and total is not None and (len(entry["bytes"]) != 2 or sum(entry["bytes"]) != total):
        r.fail(f"{path}.bytes", f"{what}: bytes {list(entry['bytes'])} (kept on the accelerator, held on the host) do "
                                f"not add up to the op's {total:,} parameter bytes (model.op_bytes)")
    if op in plan.weights:
        r.fail(path, f"{what}: the plan also streams its weights whole; a time split streams them in chunks instead")
    if plan.training:
        r.fail(path, f"{what}: time splits are planned for inference, and this plan is a training plan")


def expert_weight_op(plan: Any, op: str, entry: Mapping[str, Any]) -> str | None:
    """The op owning the fused weight of ``op``, split by expert (in time, or between devices): its
    producer (``model.edges``) whose parameter bytes are the split's ``bytes`` less the op's own
    (without ``bytes``: its producer with the most parameter bytes); None when no producer holds
    parameters."""
    producers = [u for u, v in plan.edges if v == op and plan.op_bytes.get(u, (0, 0))[1] > 0]
    if "bytes" in entry and len(entry["bytes"]) == 2:
        weight = sum(entry["bytes"]) - plan.op_bytes.get(op, (0, 0))[1]
        producers = [u for u in producers if plan.op_bytes[u][1] == weight]
    return max(producers, key=lambda u: plan.op_bytes[u][1], default=None)


def _check_expert_weight(plan: Any, r: FieldReader, op: str, entry: Mapping[str, Any]) -> None:
    """A split by expert: its weight's view is a producer of the op holding the weight's bytes, placed
    with it; in time, ``bytes[0]`` is the op's own parameter bytes (between devices, home's experts too)."""
    path = _key("splits", op)
    what = f"op {op!r} split {_label(entry)}"
    if not plan.op_bytes or not plan.edges:
        return  # a plan without op sizes or edges (hand-made, or older): checked with the graph
    view = expert_weight_op(plan, op, entry)
    if view is None:
        r.fail(f"{path}.bytes", f"{what}: no producer of the op holds the bytes of a fused expert weight that "
                                f"{list(entry.get('bytes', []))} make (model.edges, model.op_bytes); a split by expert "
                                f"takes an experts op whose weight's view owns the weight")
    own = plan.op_bytes.get(op, (0, 0))[1]
    if "bytes" in entry and entry["axis"] == "time" and entry["bytes"][0] != own:
        r.fail(f"{path}.bytes", f"{what}: bytes {list(entry['bytes'])} keep {entry['bytes'][0]:,} on the accelerator, "
                                f"but the op owns {own:,} parameter bytes (model.op_bytes)")
    if plan.placement[view] != plan.placement[op]:
        r.fail(_key("placement", view), f"{plan.placement[view]!r}, but {view!r} owns the weight of {what}, which "
                                        f"runs on {plan.placement[op]!r}: the view is placed with its experts op")


def split_of(entry: Mapping[str, Any]) -> Split | TimeSplit:
    """The :class:`~partitioner.solvers.splits.Split` (or
    :class:`~partitioner.solvers.chunked_streaming.TimeSplit`) an entry of the section stands for."""
    from partitioner.solvers.chunked_streaming import TimeSplit
    from partitioner.solvers.expert_devices import ExpertSplit
    from partitioner.solvers.expert_streaming import ExpertTimeSplit
    from partitioner.solvers.splits import Split

    if entry["axis"] == "experts":
        return ExpertSplit("experts", tuple(entry["devices"]), tuple(float(f) for f in entry["fractions"]))
    if entry["axis"] == "time" and entry.get("by") == "expert":
        return ExpertTimeSplit("time", tuple(entry["devices"]), int(entry["chunks"]))
    if entry["axis"] == "time":
        return TimeSplit("time", tuple(entry["devices"]), int(entry["chunks"]))
    return Split(entry["axis"], tuple(entry["devices"]), tuple(float(f) for f in entry["fractions"]))


def check_splits_against_graph(plan: Any, graph: OpGraph) -> None:
    """Each split op takes that split on ``graph``: along cols, rows or time an aten linear with its
    own 2-D weight, whose split dimension has room for one shard per device; along table or batch an op
    :mod:`partitioner.solvers.split_axes` names; else :class:`PlanMismatch` naming the op, the split
    and the splits it can take."""
    from partitioner.solvers.expert_streaming import entry_cuts_experts, experts_weight
    from partitioner.solvers.split_axes import OP_AXES
    from partitioner.solvers.split_offers import splits_it_takes, why_not_split
    from partitioner.solvers.splits import split_weight

    for op, entry in plan.splits.items():
        node = graph.ops.get(op)
        if node is None:
            continue  # the fingerprint check names a graph that is not the plan's
        found = experts_weight(graph, node)
        if entry_cuts_experts(entry):
            if found is None:
                raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: it is {node.kind}, "
                                   f"not a grouped matmul reading a fused 3-D expert weight through a view that owns "
                                   f"it; keep it whole (remove it from the splits section), or re-plan")
            experts = graph.params[found[1]].shape[0]
            if entry["axis"] == "experts" and experts < 2:
                raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: its weight has "
                                   f"{experts} expert; keep it whole (remove it from the splits section)")
            if entry["axis"] == "time" and entry["chunks"] > experts:
                raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: its weight has "
                                   f"{experts} experts, fewer than {entry['chunks']} groups; it can take time splits "
                                   f"by expert of 2 to {experts} chunks")
            continue
        if found is not None:
            raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: it is a fused experts op "
                               f"({node.kind}); it can take time splits by expert (\"by\": \"expert\") or experts splits "
                               f"(axis \"experts\") only")
        why = why_not_split(node, graph, entry["axis"], len(entry["devices"]))
        if why is not None:
            takes = splits_it_takes(node, graph)
            fix = "keep it whole: remove it from the splits section, or re-plan" if takes == "no split" else \
                "re-plan, or keep it whole: remove it from the splits section"
            raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: {why}; it can take "
                               f"{takes} ({fix})")
        if entry["axis"] in OP_AXES:
            continue
        shape = graph.params[split_weight(node, graph.params)].shape
        if entry["axis"] == "time":
            if entry["chunks"] > shape[0]:
                raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: its weight of shape "
                                   f"{list(shape)} has {shape[0]} rows, fewer than {entry['chunks']} chunks; it can "
                                   f"take time splits of 2 to {shape[0]} chunks")
            continue
        length, n = (shape[0] if entry["axis"] == "cols" else shape[1]), len(entry["devices"])
        if length < n:
            raise PlanMismatch(f"{plan.source}: op {op!r} cannot take split {_label(entry)}: its weight of shape "
                               f"{list(shape)} has {length} {'output feature' if entry['axis'] == 'cols' else 'input'}"
                               f"{'s' if length != 1 else ''}, fewer than its {n} devices; split it over at most "
                               f"{length} devices, or along the other axis")


def refuse_splits(plan: Any, backend: str) -> None:
    """Raise when ``plan`` splits ops: ``backend`` runs every op whole (only ``plan.emit(model)`` cuts
    the shards, :mod:`backends.torch.splits`).

    Raises:
        HetpartError: names the backend, the split ops and the fix.
    """
    from partitioner.errors import HetpartError

    if plan.splits:
        ops = ", ".join(repr(op) for op in list(plan.splits)[:3]) + (" ..." if len(plan.splits) > 3 else "")
        over = "two devices" if all(len(e["devices"]) == 2 for e in plan.splits.values()) else "several devices"
        noun = "linears" if all(e["axis"] in ("cols", "rows", "time") for e in plan.splits.values()) else "ops"
        raise HetpartError(f"{plan.source} splits {len(plan.splits)} {noun} over {over} ({ops}), but {backend} "
                           f"runs every op whole: run it with plan.emit(model) (CLI: hetpart check / hetpart run), "
                           f"or re-plan without --split")


def _label(entry: Mapping[str, Any]) -> str:
    if entry.get("axis") == "time":
        devices = list(entry.get("devices", [])) + ["?", "?"]
        by = ",by=expert" if entry.get("by") == "expert" else ""
        return f"time[{devices[0]}<-{devices[1]},{entry.get('chunks')}{by}]"
    devices, fractions = entry.get("devices", []), entry.get("fractions", [])
    return f"{entry.get('axis')}[" + ",".join(f"{d}={f:g}" for d, f in zip(devices, fractions)) + "]"
