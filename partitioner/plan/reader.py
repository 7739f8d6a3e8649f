"""Reading plan files: JSON text or decoded dicts checked field by field, and the cross-references.

In: a plan file's text or its decoded JSON. Out: the keyword arguments of
:class:`~partitioner.plan.record.Plan` (:func:`plan_fields`), every field's type checked; and
:func:`check_references`, which the Plan constructor runs so that every op, device and enum a
plan names exists. Every problem is a :class:`~partitioner.plan.values.PlanFormatError` naming
the file and the field path (``solver.gap``, ``placement["linear_3"]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from cost_models.profiles import DeviceSet
from partitioner.errors import HetpartError, ProfileError
from partitioner.plan.batch import read_batch
from partitioner.plan.fields import FieldReader, _field, _key, _show, ends_early, parse_json
from partitioner.plan.live import read_fallbacks, read_probe
from partitioner.plan.pipeline import read_pipeline
from partitioner.plan.precision import read_precision
from partitioner.plan.training_state import read_training_state
from partitioner.plan.splits import read_splits
from partitioner.plan.values import (
    _BASELINE_KEYS, _MEMORY_KEYS, _MODEL_KEYS, _OBJECTIVES, _OPTIMIZERS, _PREDICTED_MAPS,
    _PREDICTED_OPTIONAL, _PREDICTED_REQUIRED, _REPLAN, _SOLVER_KEYS, _SOLVER_OPTIONAL, _STATUSES, _STREAM_MODES,
    _TRANSFER_KEYS,
    _TRANSFER_KINDS, FORMAT_VERSION, TOP_LEVEL_KEYS, BaselineInfo, PlanFormatError, SolverInfo,
    InputSpec, TransferInfo, _finite_or_none,
)

#: dtypes a plan's tensor inputs may have (torch's names; the same as a profile's)
_TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                  "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")


def plan_fields(d: Any, source: str) -> dict[str, Any]:
    """The keyword arguments of ``Plan(...)`` read from decoded JSON: version, keys, every type."""
    r = FieldReader(source)
    top = r.mapping(d, "")
    if top.get("format") == "hetpart.generation-plan":  # partitioner.plan.generation.FORMAT
        r.fail("", "this is a generation plan (a prefill and a decode placement): read it with "
                   "GenerationPlan.load, run it with `hetpart generate MODEL --plan FILE`, check it with "
                   "`hetpart check MODEL --plan FILE --generate 32`")
    if "format_version" in top:
        _check_version(r, top["format_version"])
    r.keys(top, "", TOP_LEVEL_KEYS, ("constraints", "costs", "pipeline", "batch", "probe", "fallbacks", "precision",
                                         "request", "training_state", "splits"))
    model = r.keys(top["model"], "model", _MODEL_KEYS, ("capture", "inputs", "edges", "param_names", "op_bytes"))
    return dict(
        model_name=r.string(model["name"], "model.name"),
        fingerprint=r.string(model["fingerprint"], "model.fingerprint"),
        op_count=r.count(model["op_count"], "model.op_count"),
        modules=r.string_map(model["modules"], "model.modules", r.string),
        param_ops=r.string_list(model["param_ops"], "model.param_ops"),
        devices=_read_devices(r, top["devices"]),
        objective=r.string(top["objective"], "objective"),
        training=r.boolean(top["training"], "training"),
        optimizer=r.string(top["optimizer"], "optimizer"),
        placement=r.string_map(top["placement"], "placement", r.string),
        weights=r.string_map(top["weights"], "weights", r.string),
        stream_mode=r.string(top["stream_mode"], "stream_mode"),
        schedule=r.string_list(top["schedule"], "schedule"),
        transfers=tuple(_read_transfer(r, t, f"transfers[{i}]")
                        for i, t in enumerate(r.array(top["transfers"], "transfers"))),
        memory=top["memory"],            # checked by the constructor (read_memory)
        predicted=top["predicted"],      # checked by the constructor (read_predicted)
        solver=_read_solver(r, top["solver"]),
        baselines=r.string_map(top["baselines"], "baselines", lambda v, p: _read_baseline(r, v, p)),
        inputs=tuple(_read_input(r, v, f"model.inputs[{i}]")
                     for i, v in enumerate(r.array(model.get("inputs", []), "model.inputs"))),
        capture=r.string(model.get("capture", "export"), "model.capture"),
        **_read_edges(r, model.get("edges", [])),
        param_names=r.string_map(model.get("param_names", {}), "model.param_names", r.string_list),
        op_bytes=r.string_map(model.get("op_bytes", {}), "model.op_bytes", lambda v, q: _read_op_bytes(r, v, q)),
        constraints=_read_constraints(r, top.get("constraints", {})),
        costs=_read_costs(r, top.get("costs", {})),
        pipeline=read_pipeline(r, top.get("pipeline", {})),
        batch=read_batch(r, top.get("batch", {})),
        probe=read_probe(r, top.get("probe", {})),
        fallbacks=read_fallbacks(r, top.get("fallbacks", [])),
        precision=read_precision(r, top.get("precision", {})),
        request=_read_request(r, top.get("request", {})),
        training_state=read_training_state(r, top.get("training_state", {})),
        splits=read_splits(r, top.get("splits", {})),
        source=source,
    )


# --------------------------------------------------------------------------------------------
# Reading: typed access to decoded JSON; errors name the file and the field path
# --------------------------------------------------------------------------------------------


def _read_constraints(r: FieldReader, value: Any) -> dict[str, Any]:
    c = r.keys(value, "constraints", (), ("pins", "memory_caps", "streaming", "align_modules"))
    out: dict[str, Any] = {}
    if "pins" in c:
        out["pins"] = r.string_map(c["pins"], "constraints.pins", r.string)
    if "memory_caps" in c:
        out["memory_caps"] = r.string_map(c["memory_caps"], "constraints.memory_caps", r.count)
    if "streaming" in c:
        out["streaming"] = r.boolean(c["streaming"], "constraints.streaming")
    if "align_modules" in c:
        out["align_modules"] = r.string_list(c["align_modules"], "constraints.align_modules")
    return out


def _read_request(r: FieldReader, value: Any) -> dict[str, Any]:
    """The options the plan was asked with: every field known and valid (:class:`~partitioner.options.PlanOptions`)."""
    from partitioner.options import PlanOptions

    request = dict(r.mapping(value, "request"))
    try:
        PlanOptions.from_record(request)
    except HetpartError as err:
        r.fail("request", str(err))
    return request


def _read_costs(r: FieldReader, value: Any) -> dict[str, Any]:
    """``costs``: the cost model that priced the plan (absent in older plans: the analytic one)."""
    c = r.mapping(value, "costs")
    if not c:
        return {}
    c = r.keys(c, "costs", ("model",), ("source", "measured", "busy", "fell_back", "unsupported"))
    out: dict[str, Any] = {"model": r.string(c["model"], "costs.model")}
    if "source" in c:
        out["source"] = r.string(c["source"], "costs.source")
    if "measured" in c:
        out["measured"] = r.string_map(c["measured"], "costs.measured", r.count)
    if "busy" in c:
        out["busy"] = r.string_map(c["busy"], "costs.busy", r.count)
    if "fell_back" in c:
        out["fell_back"] = r.string_map(c["fell_back"], "costs.fell_back", r.string_list)
    if "unsupported" in c:
        out["unsupported"] = r.string_map(c["unsupported"], "costs.unsupported",
                                          lambda v, q: r.string_map(v, q, r.string))
    return out


def _read_edges(r: FieldReader, value: Any) -> dict[str, Any]:
    """``model.edges``: ``[producer, consumer]`` or ``[producer, consumer, bytes]`` each (all alike),
    as the ``edges`` and ``edge_bytes`` fields."""
    edges, sizes = [], []
    for i, item in enumerate(r.array(value, "model.edges")):
        path = f"model.edges[{i}]"
        entry = r.array(item, path)
        if len(entry) not in (2, 3):
            r.fail(path, f"expected [producer, consumer] or [producer, consumer, bytes], got {_show(item)}")
        edges.append((r.string(entry[0], f"{path}[0]"), r.string(entry[1], f"{path}[1]")))
        if len(entry) == 3:
            sizes.append(r.count(entry[2], f"{path}[2]"))
        if len(sizes) not in (0, len(edges)):
            r.fail(path, f"{_show(item)}: every edge gives its bytes ([producer, consumer, bytes]) or none does")
    return {"edges": tuple(edges), "edge_bytes": tuple(sizes)}


def _read_op_bytes(r: FieldReader, value: Any, path: str) -> tuple[int, int]:
    pair = r.array(value, path)
    if len(pair) != 2:
        r.fail(path, f"expected [output bytes, parameter bytes], got {_show(value)}")
    return r.count(pair[0], f"{path}[0]"), r.count(pair[1], f"{path}[1]")


def _read_input(r: FieldReader, value: Any, path: str) -> InputSpec:
    item = r.mapping(value, path)
    if "value" in item:
        r.keys(item, path, ("value",))
        v = item["value"]
        if v is not None and (not isinstance(v, (bool, int, float)) or
                              (isinstance(v, float) and not math.isfinite(v))):
            r.expected(_field(path, "value"), "null, true, false or a number", v)
        kind = "none" if v is None else "bool" if isinstance(v, bool) else type(v).__name__
        return InputSpec(kind, value=v)
    item = r.keys(value, path, ("shape", "dtype"), ("dynamic",))
    shape = tuple(r.count(v, f"{path}.shape[{i}]") for i, v in enumerate(r.array(item["shape"], f"{path}.shape")))
    dtype = r.string(item["dtype"], f"{path}.dtype")
    if dtype not in _TENSOR_DTYPES:
        r.fail(_field(path, "dtype"), f"{_show(dtype)} is not a tensor dtype; expected one of "
                                      f"{', '.join(_TENSOR_DTYPES)}")
    dynamic = {}
    for key, dim in r.mapping(item.get("dynamic", {}), _field(path, "dynamic")).items():
        q = _key(_field(path, "dynamic"), key)
        if not key.isdigit() or int(key) >= len(shape):
            r.fail(q, f"expected a dimension of the shape (0 to {len(shape) - 1})")
        d = r.keys(dim, q, ("name", "min", "max"))
        lo, hi = r.count(d["min"], _field(q, "min")), d["max"]
        if hi is not None and (r.count(hi, _field(q, "max")) < max(lo, 1)):
            r.fail(_field(q, "max"), f"{hi} is below min {lo}")
        dynamic[int(key)] = (r.string(d["name"], _field(q, "name")), lo, hi)
    return InputSpec("tensor", shape, dtype, dynamic=dynamic)


def _check_version(r: FieldReader, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        r.expected("format_version", f"an integer (this hetpart reads {FORMAT_VERSION})", value)
    if value != FORMAT_VERSION:
        newer = "upgrade hetpart, or " if value > FORMAT_VERSION else ""
        r.fail("format_version", f"the file is a format_version {value} plan, and this hetpart "
                                 f"reads format_version {FORMAT_VERSION}; {newer}{_REPLAN}")


def _read_devices(r: FieldReader, value: Any) -> DeviceSet:
    r.mapping(value, "devices")
    try:   # ProfileError messages read "<source>: devices.cpu.memory: ...": the plan's own path
        return DeviceSet.from_dict(value, r.source)
    except ProfileError as err:
        raise PlanFormatError(str(err)) from None


def _read_transfer(r: FieldReader, value: Any, path: str) -> TransferInfo:
    t = r.keys(value, path, _TRANSFER_KEYS)
    return TransferInfo(
        tensor=r.string(t["tensor"], f"{path}.tensor"),
        src=r.string(t["from"], f"{path}.from"),
        dst=r.string(t["to"], f"{path}.to"),
        bytes=r.count(t["bytes"], f"{path}.bytes"),
        seconds=r.number(t["seconds"], f"{path}.seconds"),
        kind=r.string(t["kind"], f"{path}.kind"),
    )


def _read_solver(r: FieldReader, value: Any, path: str = "solver") -> SolverInfo:
    optional = _SOLVER_OPTIONAL if path == "solver" else tuple(k for k in _SOLVER_OPTIONAL if k != "ilp")
    s = r.keys(value, path, _SOLVER_KEYS, optional)
    status = r.string(s["status"], f"{path}.status")
    if status not in _STATUSES:
        r.fail(f"{path}.status", f"unknown status {_show(status)}; a plan's status is one of "
                                 f"{', '.join(_STATUSES[:-1])}")
    nodes = s.get("nodes")
    return SolverInfo(
        name=r.string(s["name"], f"{path}.name"),
        status=status,
        objective=r.number_or_null(s["objective"], f"{path}.objective"),
        bound=r.number_or_null(s["bound"], f"{path}.bound"),
        gap=r.number_or_null(s["gap"], f"{path}.gap"),
        seconds=r.number(s["seconds"], f"{path}.seconds"),
        requested_gap=r.number_or_null(s.get("requested_gap"), f"{path}.requested_gap"),
        nodes=r.count(nodes, f"{path}.nodes") if nodes is not None else None,
        note=r.string(s.get("note", ""), f"{path}.note"),
        ilp=_read_solver(r, s["ilp"], f"{path}.ilp") if s.get("ilp") is not None else None,
    )


def _read_baseline(r: FieldReader, value: Any, path: str) -> BaselineInfo:
    b = r.keys(value, path, _BASELINE_KEYS)
    return BaselineInfo(r.number_or_null(b["total_s"], f"{path}.total_s"),
                        r.boolean(b["feasible"], f"{path}.feasible"),
                        r.string(b["note"], f"{path}.note"))


def read_memory(r: FieldReader, value: Any) -> dict[str, dict[str, int]]:
    def entry(v: Any, path: str) -> dict[str, int]:
        m = r.keys(v, path, _MEMORY_KEYS)
        return {k: r.count(m[k], _field(path, k)) for k in _MEMORY_KEYS}
    return r.string_map(value, "memory", entry)


def read_predicted(r: FieldReader, value: Any) -> dict[str, Any]:
    p = r.keys(value, "predicted", _PREDICTED_REQUIRED, _PREDICTED_OPTIONAL)
    out: dict[str, Any] = {}
    for key in (*_PREDICTED_REQUIRED, *_PREDICTED_OPTIONAL):
        if key not in p:
            continue
        path = _field("predicted", key)
        if key == "per_op_device_s":  # op -> device -> seconds (null where the device cannot run it)
            out[key] = r.string_map(p[key], path, lambda v, q: r.string_map(v, q, r.number_or_null))
            continue
        out[key] = (r.string_map(p[key], path, r.number_or_null) if key in _PREDICTED_MAPS
                    else r.number_or_null(p[key], path))
    return out


# --------------------------------------------------------------------------------------------
# References between the parts of a plan
# --------------------------------------------------------------------------------------------


def check_references(plan: Any, r: FieldReader) -> None:
    """Every op named is placed, every device named is in the set, enums are known values."""
    _check_choice(r, plan.objective, "objective", _OBJECTIVES)
    _check_choice(r, plan.stream_mode, "stream_mode", _STREAM_MODES)
    _check_choice(r, plan.optimizer, "optimizer", _OPTIMIZERS)
    if plan.op_count != len(plan.placement):
        r.fail("model.op_count", f"{plan.op_count}, but placement places {len(plan.placement)} ops; "
                                 f"the two must agree")
    device_ok = _membership(r, set(plan.devices.names()),
                            f"is not in the plan's devices ({', '.join(plan.devices.names())})", "device")
    op_ok = _membership(r, plan.placement, "is not an op of the plan (not a key of placement)", "op")
    for op, device in plan.placement.items():
        device_ok(device, _key("placement", op))
    for op, device in plan.weights.items():
        op_ok(op, _key("weights", op))
        device_ok(device, _key("weights", op))
    for op in plan.modules:
        op_ok(op, _key("model.modules", op))
    for i, op in enumerate(plan.param_ops):
        if op not in plan.modules:
            r.fail(f"model.param_ops[{i}]", f"op {op!r} has no module path in model.modules")
    _check_unique(r, plan.param_ops, "model.param_ops")
    for i, op in enumerate(plan.schedule):
        op_ok(op, f"schedule[{i}]")
    _check_unique(r, plan.schedule, "schedule")
    for i, t in enumerate(plan.transfers):
        _check_transfer(r, t, f"transfers[{i}]", device_ok)
    for device in plan.memory:
        device_ok(device, _key("memory", device))
    for device in plan.predicted["per_device_s"]:
        device_ok(device, _key("predicted.per_device_s", device))
    for op in plan.predicted.get("per_op_s", {}):
        op_ok(op, _key("predicted.per_op_s", op))
    r.number(plan.solver.seconds, "solver.seconds")
    from partitioner.plan.consistency import check_sections  # after the references: it relies on them

    check_sections(plan, r)


def _check_choice(r: FieldReader, value: Any, path: str, choices: Sequence[str]) -> None:
    if value not in choices:
        r.fail(path, f"{_show(value)} is not one of {', '.join(choices)}")


def _membership(r: FieldReader, known: Container[str], rule: str,
                what: str) -> Callable[[str, str], None]:
    """A check that fails with ``path: <what> 'x' <rule>`` for names not in ``known``."""
    def check(name: str, path: str) -> None:
        if name not in known:
            r.fail(path, f"{what} {name!r} {rule}")
    return check


def _check_unique(r: FieldReader, names: Sequence[str], path: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            r.fail(f"{path}[{i}]", f"{name!r} appears twice")
        seen.add(name)


def _check_transfer(r: FieldReader, t: TransferInfo, path: str, device_ok: Callable[[str, str], None]) -> None:
    device_ok(t.src, f"{path}.from")
    device_ok(t.dst, f"{path}.to")
    _check_choice(r, t.kind, f"{path}.kind", _TRANSFER_KINDS)
    r.count(t.bytes, f"{path}.bytes")
    r.number(t.seconds, f"{path}.seconds")
