"""The plan's optional ``precision`` section: the dtype each op computes in.

In: a problem planned with ``precision`` and its placement (:func:`precision_record`), or the
section of a plan file (:func:`read_precision`, checked field by field; :func:`check_precision`,
checked against the plan's placement and devices). Out: the section as plain values. Plans
without the section (every plan made without ``precision``) compute every op as traced.

The section::

    precision  {"setting": "auto" | {device: dtype, "weights": ..., ...},  # what partition(precision=...) was given
                "ops": {op: "bfloat16" | "float16"},          # ops computing in 16 bits (the rest: as traced)
                "weights": {op: "int8" | "int4" | "float8"},  # linears holding their weight packed (optional)
                "weight_bytes": {op: bytes},                  # ... their parameter bytes so held (with weights)
                "streamed": {op: bytes},                      # ... those streamed packed from host memory: bytes
                                                              #     crossing the link per step (with weights)
                "casts": count,                               # tensors cast at a dtype boundary (predicted)
                "error": {"measured": {output: e, "all": e},  # packed weights of a model planned with its values:
                          "measured_by": how,                 #   the relative output error against float, measured
                                                              #   (its kernels on the host, or dequantized weights);
                          "max_error": e,                     # with an accuracy budget (partitioner.error_budget):
                          "estimated": e,                     #   the solver's estimate (root sum of squares)
                          "ops": {op: e}}}                    #   each packed op's own measured error

A linear listed in ``weights`` holds its weight packed (with its scales) on its device and runs a
weight-only kernel on bfloat16 activations (cast in, and back to float32 unless ``ops`` lists it).
One also listed in ``streamed`` (and in the plan's ``weights``, the streamed ops) keeps its packed
tensors in host memory, packed once when loaded, and fetches them to its device every step: its
link carries the packed bytes, its device holds a reused buffer of that size.

An op listed computes in that dtype: its float32 inputs (activations and weights) are cast to it,
and what it produces is held in it until an op computing in another dtype reads it (cast there),
or it leaves the model (cast back to float32). Training keeps float32 master weights: the
parameters stay float32 and their casts are part of the graph, so gradients land in float32.

The section is checked against what else the plan says: a copy of a 16-bit tensor carries half its
traced bytes, so a copy that does while the section does not list its producer (the section cut,
or an op deleted from it) is refused when the file is read; with a fixed per-device setting the
captured graph decides which ops compute in 16 bits, so ``emit`` and ``check`` refuse a section
that lists other ops (:func:`graph_differences`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cost_models.units import format_bytes
from cost_models.precision import (
    DTYPES, FLOAT32, LOW, SETTING_KEYS, WEIGHT_DTYPES, activations, device_dtypes, device_weight_dtypes,
    itemsize_factor, weights,
)

if TYPE_CHECKING:
    from partitioner.plan.fields import FieldReader
    from partitioner.solvers.problem import Placement, Problem

__all__ = ["precision_record", "read_precision", "check_precision", "graph_differences", "precision_lines",
           "refuse_precision", "PRECISION_KEYS"]

PRECISION_KEYS = ("setting", "ops", "weights", "weight_bytes", "streamed", "casts", "error")


def precision_record(problem: Problem, placement: Placement) -> dict[str, Any]:
    """The ``precision`` section of the plan of ``placement`` (empty: planned without precision).

    Example:
        >>> precision_record(problem, solution.placement)["ops"]["linear"]   # doctest: +SKIP
        'bfloat16'
    """
    from partitioner.solvers.problem import cast_load, node_dtypes

    if problem.precision is None:
        return {}
    dtype = node_dtypes(problem, placement)
    ops, packed, held, streamed = {}, {}, {}, {}
    for n in problem.nodes:
        streams = placement.streamed.get(n, placement.device[n]) != placement.device[n]
        for op in problem.members[n]:
            a = problem.op_dtype(op, dtype[n])
            if activations(a) != FLOAT32:
                ops[op] = activations(a)
            if weights(a):
                packed[op] = weights(a)
                held[op] = problem.op_param_bytes(problem.original.ops[op], a)
                if streams:
                    streamed[op] = problem.stream_passes * held[op]
    casts = cast_load(problem, placement, dtype)
    setting = problem.precision.setting
    out = {"setting": setting if isinstance(setting, str) else dict(setting),
           "ops": {op: ops[op] for op in problem.original.ops if op in ops}}
    if problem.precision.packs:
        out["weights"] = {op: packed[op] for op in problem.original.ops if op in packed}
        out["weight_bytes"] = {op: held[op] for op in out["weights"]}
        out["streamed"] = {op: streamed[op] for op in out["weights"] if op in streamed}
    out["casts"] = sum(1 for s in casts.values() if s > 0)
    return out


def read_precision(r: FieldReader, value: Any) -> dict[str, Any]:
    """``precision``: the section as written (see the module docstring); ``{}`` when absent."""
    if value == {}:
        return {}
    c = r.keys(r.mapping(value, "precision"), "precision", ("setting", "ops"),
               ("weights", "weight_bytes", "streamed", "casts", "error"))
    setting = c["setting"]
    if isinstance(setting, str):
        if setting != "auto":
            r.fail("precision.setting", f"{setting!r} is neither \"auto\" nor a mapping of device to dtype")
    else:
        setting = _read_setting(r, setting)
    out: dict[str, Any] = {"setting": setting,
                           "ops": r.string_map(c["ops"], "precision.ops", lambda v, p: _dtype(r, v, p, LOW))}
    if "weights" in c:
        out["weights"] = r.string_map(c["weights"], "precision.weights",
                                      lambda v, p: _dtype(r, v, p, WEIGHT_DTYPES))
    if "weight_bytes" in c:
        out["weight_bytes"] = r.string_map(c["weight_bytes"], "precision.weight_bytes", lambda v, p: r.count(v, p))
        if set(out["weight_bytes"]) != set(out.get("weights", {})):
            r.fail("precision.weight_bytes", "names other ops than precision.weights; re-plan rather than editing "
                                             "the file")
    if "streamed" in c:
        out["streamed"] = r.string_map(c["streamed"], "precision.streamed", lambda v, p: r.count(v, p))
        if not set(out["streamed"]) <= set(out.get("weights", {})):
            r.fail("precision.streamed", "names ops that precision.weights does not pack; re-plan rather than "
                                         "editing the file")
    if "casts" in c:
        out["casts"] = r.count(c["casts"], "precision.casts")
    if "error" in c:
        out["error"] = _read_error(r, c["error"], set(out.get("weights", {})))
    return out


def _read_error(r: FieldReader, value: Any, packed: set[str]) -> dict[str, Any]:
    """``precision.error``: the measured error, and with a budget the budget, the solver's estimate
    and each packed op's own error."""
    c = r.keys(r.mapping(value, "precision.error"), "precision.error", ("measured", "measured_by"),
               ("max_error", "estimated", "ops"))
    out: dict[str, Any] = {
        "measured": r.string_map(c["measured"], "precision.error.measured", lambda v, p: _error(r, v, p)),
        "measured_by": r.string(c["measured_by"], "precision.error.measured_by")}
    if "all" not in out["measured"]:
        r.fail("precision.error.measured", "has no 'all' entry (the outputs taken together)")
    budget = ("max_error", "estimated", "ops")
    if any(k in c for k in budget) and not all(k in c for k in budget):
        r.fail("precision.error", "a budget records max_error, estimated and ops together; re-plan rather than "
                                  "editing the file")
    if "max_error" not in c:
        return out
    out["max_error"] = _error(r, c["max_error"], "precision.error.max_error", positive=True)
    out["estimated"] = _error(r, c["estimated"], "precision.error.estimated")
    out["ops"] = r.string_map(c["ops"], "precision.error.ops", lambda v, p: _error(r, v, p))
    if set(out["ops"]) != packed:
        r.fail("precision.error.ops", "names other ops than precision.weights; re-plan rather than editing the file")
    if out["measured"]["all"] > out["max_error"]:
        r.fail("precision.error", f"the measured error {out['measured']['all']:.3g} is over max_error "
                                  f"{out['max_error']:.3g}: a plan keeps its budget; re-plan rather than editing the file")
    return out


def _error(r: FieldReader, value: Any, path: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf") \
            or positive and value == 0:
        r.fail(path, f"{value!r} is not a relative error (a finite number {'above' if positive else 'at least'} 0)")
    return float(value)


def _read_setting(r: FieldReader, setting: Any) -> dict[str, Any]:
    """A mapping setting: devices to dtypes, and the keys ``activations``, ``weights``, ``max_error``, ``keep``."""
    raw = r.mapping(setting, "precision.setting")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"precision.setting[{key!r}]"
        if key == "activations":
            if value != "auto":
                r.fail(path, f"{value!r}: only \"auto\" is recorded here")
            out[key] = value
        elif key == "weights":
            if isinstance(value, str):
                out[key] = value if value == "auto" else _dtype(r, value, path, WEIGHT_DTYPES)
            else:
                out[key] = r.string_map(value, path, lambda v, p: _dtype(r, v, p, WEIGHT_DTYPES))
        elif key == "max_error":
            out[key] = _error(r, value, path, positive=True)
        elif key == "keep":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                r.fail(path, f"{value!r} is not a list of module paths or op names")
            out[key] = list(value)
        else:
            out[key] = _dtype(r, value, path, DTYPES)
    return out


def _dtype(r: FieldReader, value: Any, path: str, allowed: tuple[str, ...]) -> str:
    name = r.string(value, path)
    if name not in allowed:
        r.fail(path, f"{name!r} is not a dtype a plan computes in here; use one of {', '.join(allowed)} "
                     f"(re-plan with partition(precision=...) rather than editing the file)")
    return name


def check_precision(plan: Any, r: FieldReader) -> None:
    """Every op of the section is an op of the plan, on a device whose profile runs its dtype,
    every device named by the setting is a device of the plan, and every copy carries its tensor
    in the dtype the section gives its producer (:func:`_check_copy_bytes`)."""
    _check_copy_bytes(plan, r)
    section = plan.precision
    if not section:
        return
    names = set(plan.devices.names())
    setting = section["setting"]
    if isinstance(setting, Mapping):
        for device in setting:
            if device not in names and device not in SETTING_KEYS:
                r.fail(f"precision.setting[{device!r}]", f"{device!r} is not a device of the plan "
                                                         f"({', '.join(sorted(names))})")
    for op, nbytes in section.get("streamed", {}).items():
        path = f"precision.streamed[{op!r}]"
        if op not in plan.weights:
            r.fail(path, f"{op} streams its packed weight, but the plan's weights (the streamed ops) do not list it; "
                         f"re-plan rather than editing the file")
        if nbytes != (2 if plan.training else 1) * section["weight_bytes"][op]:
            r.fail(path, f"{nbytes:,} bytes per step, but {op} holds {section['weight_bytes'][op]:,} packed "
                         f"(precision.weight_bytes); re-plan rather than editing the file")
    for key, runs, says in (("ops", device_dtypes, "computes in {a} on {d}, whose profile runs only {runs}"),
                            ("weights", device_weight_dtypes,
                             "packs its weight in {a} on {d}, which has no {a} weight-only kernel (it runs {runs})")):
        for op, dtype in section.get(key, {}).items():
            path = f"precision.{key}[{op!r}]"
            if op not in plan.placement:
                r.fail(path, "names an op that is not in placement")
            device = plan.devices.device(plan.placement[op])
            if dtype not in runs(device):
                r.fail(path, f"{op} " + says.format(a=dtype, d=device.name,
                                                    runs=", ".join(runs(device)) or "none of them"))


def precision_lines(plan: Any) -> list[str]:
    """The summary's precision line: the setting, and how many ops compute in each 16-bit dtype where."""
    section = plan.precision
    if not section:
        return []
    counts: dict[tuple[str, str], int] = {}
    for op, dtype in section["ops"].items():
        key = (dtype, plan.placement[op])
        counts[key] = counts.get(key, 0) + 1
    setting = section["setting"]
    shown = setting if isinstance(setting, str) else ", ".join(f"{d}={a}" for d, a in setting.items()) or "fp32"
    where = ", ".join(f"{n} in {a} on {d}" for (a, d), n in sorted(counts.items())) or "every op in float32"
    casts = f"; {section['casts']} casting" if "casts" in section else ""
    lines = [f"  precision  {shown}: {where}{casts}"]
    if "weights" in section:
        packed: dict[tuple[str, str], int] = {}
        for op, w in section["weights"].items():
            packed[(w, plan.placement[op])] = packed.get((w, plan.placement[op]), 0) + 1
        held = ", ".join(f"{n} in {w} on {d}" for (w, d), n in sorted(packed.items())) or "none packed"
        error = section.get("error")
        said = ("hetpart check reports the output error against the float model" if not error else
                f"measured error {error['measured']['all']:.3g} against the float model" if "max_error" not in error
                else f"measured error {error['measured']['all']:.3g} of max_error {error['max_error']:g}")
        lines.append(f"  weights    {held} ({said})")
        if section.get("streamed"):
            routes: dict[tuple[str, str], list[int]] = {}
            for op, nbytes in section["streamed"].items():
                routes.setdefault((plan.weights[op], plan.placement[op]), []).append(nbytes)
            lines.append("  streamed packed: " + ", ".join(
                f"{len(b)} linears {src} -> {dst}, {format_bytes(sum(b))} per step"
                for (src, dst), b in sorted(routes.items())))
    return lines


def refuse_precision(plan: Any, backend: str) -> None:
    """Raise when ``plan`` computes ops in 16 bits: ``backend`` runs every op as traced.

    Raises:
        HetpartError: the plan has a precision section with 16-bit ops; names the backend and the fix.
    """
    from partitioner.errors import HetpartError

    if plan.precision and plan.precision.get("weights"):
        count = len(plan.precision["weights"])
        raise HetpartError(f"{plan.source} packs the weights of {count} linears (precision.weights), but {backend} runs "
                           f"every op as traced: run it with plan.emit(model) (CLI: hetpart check / hetpart run), "
                           f"or re-plan without weights in --precision")
    if plan.precision and plan.precision.get("ops"):
        count = len(plan.precision["ops"])
        raise HetpartError(f"{plan.source} computes {count} ops in 16 bits (its precision section), but {backend} runs "
                           f"every op as traced: run it with plan.emit(model) (CLI: hetpart check / hetpart run), "
                           f"or re-plan without --precision")


def _check_copy_bytes(plan: Any, r: FieldReader) -> None:
    """A copy of an op's output carries its traced bytes (``model.op_bytes``), or, where the section
    lists the op in a 16-bit dtype, that dtype's share of them. A copy of fewer bytes whose producer
    the section does not list (the section, or one of its ops, deleted or edited) is refused: the
    plan was made with casts that the file no longer says."""
    ops = plan.precision.get("ops", {}) if plan.precision else {}
    for i, t in enumerate(plan.transfers):
        traced = plan.op_bytes.get(t.tensor, (None,))[0] if t.kind == "activation" else None
        if not traced or t.bytes == traced or t.tensor in ops:
            continue
        if t.bytes == int(traced * itemsize_factor("bfloat16")):
            r.fail(f"transfers[{i}]", f"copies {t.tensor!r} in {t.bytes} bytes, a 16-bit share of its "
                                      f"{traced} traced bytes, but precision.ops does not list {t.tensor!r}: "
                                      f"the precision section was cut or edited; re-plan with "
                                      f"partition(precision=...) rather than editing the file")


def graph_differences(plan: Any, graph: Any) -> list[str]:
    """Where a fixed per-device setting and the captured graph say other ops compute in 16 bits than
    the section lists: with ``{"cuda:0": "bf16"}`` every op on ``cuda:0`` that the accuracy policy
    lets compute in 16 bits (:func:`~cost_models.precision.op_precision` "flexible") and that does
    not stream its weights is listed in bfloat16, and no other op is. (An ``auto`` section is the
    solver's choice: only its copies check it, in :func:`check_precision`.)"""
    from cost_models.precision import op_precision

    setting = plan.precision.get("setting") if plan.precision else None
    if not isinstance(setting, Mapping) or setting.get("activations") == "auto":
        return []
    listed = plan.precision["ops"]
    lines = []
    for name, op in graph.ops.items():
        want = setting.get(plan.placement.get(name))
        if want is None:
            continue
        flexible = op_precision(op, graph.tensors, graph.params) == "flexible"
        expected = want if want != FLOAT32 and flexible else None
        if listed.get(name) != expected:
            lines.append(f"  precision.ops[{name!r}]: {listed.get(name) or 'float32'} where the setting "
                         f"{plan.placement[name]}={want} computes it in {expected or 'float32'}")
    return lines[:3]
