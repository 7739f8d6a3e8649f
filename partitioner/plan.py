"""Plan files: a placement saved as versioned JSON and read back with every field checked.

In: what a solve produced (the graph's fingerprint and module paths, the DeviceSet, where each
op runs, transfers, memory, predicted times, solver status, baselines), built by hand or by
:meth:`Plan.from_solution`; or a plan file on disk (:meth:`Plan.load`).
Out: a frozen :class:`Plan`; its JSON (:meth:`Plan.to_json`, :meth:`Plan.save`); the checks a
user of the plan needs (:meth:`Plan.check_graph`, :meth:`Plan.check_devices`) and an
accelerate-style ``device_map`` (:meth:`Plan.to_device_map`).

The file (``format_version`` 1) holds these top-level keys, in this order::

    format_version  1
    model           {"name", "fingerprint", "op_count", "modules": {op: module path},
                     "param_ops": [ops that own parameters or buffers],
                     optional "capture": "export" | "symbolic_trace",
                     optional "inputs": [{"shape", "dtype"}, ...] to re-capture the model,
                     optional "edges": [[producer op, consumer op], ...] to draw the graph,
                     optional "param_names": {op: [parameters it owns]} for device maps}
    devices         DeviceSet.to_dict(): the whole profile the plan was made for (caps applied)
    objective       "latency" | "throughput" | "makespan"
    training        true for a training step, false for inference
    optimizer       "sgd" | "sgd-momentum" | "adam" (costed in training only)
    placement       {op: device that computes it}, every op of the graph
    weights         {op: device holding its streamed weights}, streamed ops only
    stream_mode     "prefetch" | "sync"
    schedule        [op, ...] the issue order
    transfers       [{"tensor", "from", "to", "bytes", "seconds", "kind"}, ...] per step
    memory          {device: {"used": bytes, "capacity": bytes}}
    predicted       {"total_s", "per_device_s": {device: s}, "per_link_s": {label: s},
                     optional "critical_path_s", "lower_bound_s", "per_op_s": {op: s}}
    solver          {"name", "status", "objective", "bound", "gap", "seconds"}
    baselines       {name: {"total_s", "feasible", "note"}}

A plan never holds a number that is not finite: where a value may be unknown (a bound, a gap,
an infeasible baseline's time, a predicted time) inf and nan become ``None``, written ``null``;
elsewhere (transfer and solver seconds) they are an error. Every problem with a file or dict
is a :class:`PlanFormatError` naming the file and the field path (``solver.gap``,
``placement["linear_3"]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import json
import math
import os
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from cost_models.profiles import DeviceSet
from cost_models.training import Optimizer
from cost_models.units import format_bytes, format_seconds
from partitioner.errors import HetpartError, PlanMismatch, ProfileError
from partitioner.files import refuse_overwrite, write_atomic

if TYPE_CHECKING:  # the solver package is imported only by from_solution, when called
    from partitioner.ir import OpGraph
    from partitioner.solvers.problem import Evaluation, Problem, Solution

__all__ = [
    "FORMAT_VERSION", "TOP_LEVEL_KEYS", "PlanFormatError", "SolverInfo", "TransferInfo",
    "BaselineInfo", "Plan",
]

#: The plan format this hetpart writes and reads.
FORMAT_VERSION = 1

#: The top-level keys of a plan file, in the order they are written.
TOP_LEVEL_KEYS: tuple[str, ...] = (
    "format_version", "model", "devices", "objective", "training", "optimizer", "placement",
    "weights", "stream_mode", "schedule", "transfers", "memory", "predicted", "solver", "baselines",
)
_MODEL_KEYS = ("name", "fingerprint", "op_count", "modules", "param_ops")
_TRANSFER_KEYS = ("tensor", "from", "to", "bytes", "seconds", "kind")
_SOLVER_KEYS = ("name", "status", "objective", "bound", "gap", "seconds")
_BASELINE_KEYS = ("total_s", "feasible", "note")
_MEMORY_KEYS = ("used", "capacity")
_PREDICTED_REQUIRED = ("total_s", "per_device_s", "per_link_s")
_PREDICTED_OPTIONAL = ("critical_path_s", "lower_bound_s", "per_op_s", "per_op_device_s")
_PREDICTED_MAPS = ("per_device_s", "per_link_s", "per_op_s")  # the rest are numbers or null

_OBJECTIVES = ("latency", "throughput", "makespan")  # partitioner.solvers.problem.Objective
_STREAM_MODES = ("prefetch", "sync")                 # partitioner.solvers.problem.StreamMode
_TRANSFER_KINDS = ("activation", "weights", "param")
_OPTIMIZERS = tuple(o.value for o in Optimizer)
_REPLAN = "re-plan: hetpart plan MODEL ..."


class PlanFormatError(HetpartError, ValueError):
    """A plan file or dict that is not a valid plan: names the file, the field path and the rule."""


# --------------------------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SolverInfo:
    """Which solver made the plan and what it proved.

    Example:
        >>> SolverInfo("ilp", "optimal", 0.0123, 0.0121, float("nan"), 2.5).gap is None
        True
    """

    name: str                 # "ilp", "greedy", "heft", "single-device"
    status: str               # "optimal" | "feasible" | "heuristic" | "infeasible"
    objective: float | None   # the placement's predicted objective, seconds
    bound: float | None       # a proven lower bound on the objective (None: heuristic)
    gap: float | None         # (objective - bound) / objective, None when unknown
    seconds: float            # wall time of the solve

    def __post_init__(self) -> None:
        for name in ("objective", "bound", "gap"):
            object.__setattr__(self, name, _finite_or_none(getattr(self, name)))
        object.__setattr__(self, "seconds", float(self.seconds))


@dataclasses.dataclass(frozen=True)
class TransferInfo:
    """One copy per step; written as ``{"tensor", "from", "to", "bytes", "seconds", "kind"}``.

    Example:
        >>> TransferInfo("relu", "cuda:0", "cpu", 4096, 2e-5).kind
        'activation'
    """

    tensor: str               # tensor name, or the op whose weights stream (kind "weights")
    src: str                  # device it leaves
    dst: str                  # device it reaches
    bytes: int
    seconds: float
    kind: str = "activation"  # "activation" | "weights" | "param"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes", int(self.bytes))
        object.__setattr__(self, "seconds", float(self.seconds))


@dataclasses.dataclass(frozen=True)
class BaselineInfo:
    """A baseline placement's predicted time, for comparison.

    Example:
        >>> BaselineInfo(float("inf"), False, "cuda:0 over capacity").total_s is None
        True
    """

    total_s: float | None     # predicted objective; None when it cannot run at all
    feasible: bool            # whether it fits in memory and respects the limits
    note: str = ""            # why it is infeasible, or how it was made

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_s", _finite_or_none(self.total_s))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A placement of one graph on one device set, with what it is predicted to cost.

    The constructor freezes the mappings, turns non-finite optional numbers into ``None`` and
    checks that the parts refer to each other (every op placed on a device of ``devices``,
    ``op_count == len(placement)``, ...); a failure is a :class:`PlanFormatError`.
    ``source`` (the file it came from) is not part of equality.

    Example:
        >>> plan = Plan.load("plan.json")                     # doctest: +SKIP
        >>> plan.check_graph(graph)                           # doctest: +SKIP
        >>> plan.to_device_map()                              # doctest: +SKIP
        {'emb': 'cpu', 'layers': 'cuda:0', 'head': 'cuda:0'}
    """

    model_name: str
    fingerprint: str                           # OpGraph.fingerprint() of the graph planned
    op_count: int
    modules: Mapping[str, str]                 # op name -> module path that issued it
    param_ops: tuple[str, ...]                 # ops that own parameters or buffers
    devices: DeviceSet
    objective: str                             # "latency" | "throughput" | "makespan"
    training: bool
    optimizer: str                             # "sgd" | "sgd-momentum" | "adam"
    placement: Mapping[str, str]               # op name -> device that computes it
    weights: Mapping[str, str]                 # streamed op -> device holding its weights
    stream_mode: str                           # "prefetch" | "sync"
    schedule: tuple[str, ...]                  # issue order of the ops
    transfers: tuple[TransferInfo, ...]
    memory: Mapping[str, Mapping[str, int]]    # device -> {"used": bytes, "capacity": bytes}
    predicted: Mapping[str, Any]               # see the module docstring
    solver: SolverInfo
    baselines: Mapping[str, BaselineInfo]
    inputs: tuple[tuple[tuple[int, ...], str], ...] = ()  # (shape, dtype) of each graph input, for re-capture
    capture: str = "export"                    # how the model was captured ("export" | "symbolic_trace")
    edges: tuple[tuple[str, str], ...] = ()    # (producer op, consumer op) of every graph edge, for drawing
    param_names: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # op -> its parameters
    op_bytes: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # op -> (output, parameter) bytes
    constraints: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # pins, caps, streaming, alignment
    source: str = dataclasses.field(default="<plan>", compare=False, repr=False)

    def __post_init__(self) -> None:
        reader = _Reader(self.source)
        for name in ("objective", "stream_mode", "optimizer"):
            value = getattr(self, name)
            object.__setattr__(self, name, value.value if isinstance(value, enum.Enum) else value)
        for name in ("modules", "placement", "weights", "baselines"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        for name in ("param_ops", "schedule", "transfers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "inputs", tuple((tuple(shape), dtype) for shape, dtype in self.inputs))
        object.__setattr__(self, "edges", tuple((u, v) for u, v in self.edges))
        object.__setattr__(self, "op_bytes", MappingProxyType({op: tuple(b) for op, b in self.op_bytes.items()}))
        object.__setattr__(self, "constraints", _freeze(dict(self.constraints)))
        object.__setattr__(self, "param_names",
                           MappingProxyType({op: tuple(names) for op, names in self.param_names.items()}))
        unknown = [e for e in self.edges if e[0] not in self.placement or e[1] not in self.placement]
        if unknown:
            reader.fail("model.edges", f"edge {unknown[0]} names an op that is not in placement")
        object.__setattr__(self, "memory", _freeze(_read_memory(reader, self.memory)))
        object.__setattr__(self, "predicted", _freeze(_read_predicted(reader, self.predicted)))
        _check_references(self, reader)

    # -- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON values, keys in :data:`TOP_LEVEL_KEYS` order.

        Example:
            >>> list(plan.to_dict())[:3]                      # doctest: +SKIP
            ['format_version', 'model', 'devices']
        """
        out = {
            "format_version": FORMAT_VERSION,
            "model": {"name": self.model_name, "fingerprint": self.fingerprint,
                      "op_count": self.op_count, "modules": self.modules,
                      "param_ops": self.param_ops, "capture": self.capture,
                      "inputs": [{"shape": list(shape), "dtype": dtype} for shape, dtype in self.inputs],
                      "edges": [list(e) for e in self.edges],
                      "param_names": {op: list(names) for op, names in self.param_names.items()},
                      "op_bytes": {op: list(pair) for op, pair in self.op_bytes.items()}},
            "devices": self.devices.to_dict(),
            "objective": self.objective,
            "training": self.training,
            "optimizer": self.optimizer,
            "placement": self.placement,
            "weights": self.weights,
            "stream_mode": self.stream_mode,
            "schedule": self.schedule,
            "transfers": [_transfer_dict(t) for t in self.transfers],
            "memory": self.memory,
            "predicted": self.predicted,
            "solver": {f: getattr(self.solver, f) for f in _SOLVER_KEYS},
            "baselines": {name: dataclasses.asdict(b) for name, b in self.baselines.items()},
        }
        if self.constraints:
            out["constraints"] = _plain(self.constraints)
        return _plain(out)

    def to_json(self) -> str:
        """The plan file's text: JSON, one-space indent, ``null`` for non-finite numbers.

        Example:
            >>> plan.to_json().startswith('{\\n "format_version": 1')   # doctest: +SKIP
            True
        """
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike[str], *, force: bool = False) -> Path:
        """Write the plan to ``path`` atomically: the file is either the old one or the whole plan.

        Raises:
            HetpartError: ``path`` exists and ``force`` is false, or it cannot be written.

        Example:
            >>> plan.save("plan.json", force=True)            # doctest: +SKIP
            PosixPath('plan.json')
        """
        path = Path(path)
        refuse_overwrite([path], force=force)
        return write_atomic(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read and validate a plan file (JSON syntax, format version, schema, references).

        Raises:
            PlanFormatError: the file is not a valid plan; the message names the field.
            HetpartError: the file cannot be read.

        Example:
            >>> Plan.load("plan.json").placement["linear"]    # doctest: +SKIP
            'cuda:0'
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise HetpartError(f"{path}: no such plan file; make one with `hetpart plan MODEL ...`") from None
        except (OSError, UnicodeDecodeError) as err:
            raise HetpartError(f"{path}: cannot read the plan file: {err}") from None
        return cls.from_json(text, str(path))

    @classmethod
    def from_json(cls, text: str, source: str = "<text>") -> Plan:
        """Parse plan JSON; syntax errors give the line, a cut-off file is named as such.

        Example:
            >>> Plan.from_json(plan.to_json()) == plan        # doctest: +SKIP
            True
        """
        return cls.from_dict(_parse_json(text, source), source)

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> Plan:
        """Build a plan from the decoded JSON, checking the version, keys and every field's type.

        Example:
            >>> Plan.from_dict(plan.to_dict()) == plan        # doctest: +SKIP
            True
        """
        r = _Reader(source)
        top = r.mapping(d, "")
        if "format_version" in top:
            _check_version(r, top["format_version"])
        r.keys(top, "", TOP_LEVEL_KEYS, ("constraints",))
        model = r.keys(top["model"], "model", _MODEL_KEYS, ("capture", "inputs", "edges", "param_names", "op_bytes"))
        return cls(
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
            memory=top["memory"],            # checked by the constructor (_read_memory)
            predicted=top["predicted"],      # checked by the constructor (_read_predicted)
            solver=_read_solver(r, top["solver"]),
            baselines=r.string_map(top["baselines"], "baselines", lambda v, p: _read_baseline(r, v, p)),
            inputs=tuple(_read_input(r, v, f"model.inputs[{i}]")
                         for i, v in enumerate(r.array(model.get("inputs", []), "model.inputs"))),
            capture=r.string(model.get("capture", "export"), "model.capture"),
            edges=tuple(_read_edge(r, v, f"model.edges[{i}]")
                        for i, v in enumerate(r.array(model.get("edges", []), "model.edges"))),
            param_names=r.string_map(model.get("param_names", {}), "model.param_names", r.string_list),
            op_bytes=r.string_map(model.get("op_bytes", {}), "model.op_bytes",
                                  lambda v, q: tuple(r.count(x, f"{q}[{i}]") for i, x in enumerate(r.array(v, q)))),
            constraints=_read_constraints(r, top.get("constraints", {})),
            source=source,
        )

    # -- checks against what the plan is used with --------------------------------------------

    def check_graph(self, graph: OpGraph) -> None:
        """Raise PlanMismatch unless ``graph`` is the graph this plan was made for.

        Example:
            >>> plan.check_graph(from_module(model, inputs))  # doctest: +SKIP
        """
        found = graph.fingerprint()
        if found == self.fingerprint:
            return
        lines = [
            f"{self.source} was made for another graph:",
            f"  plan:  model {self.model_name!r}, {self.op_count} ops, fingerprint {self.fingerprint}",
            f"  graph: model {graph.name!r}, {len(graph)} ops, fingerprint {found}",
        ]
        lines += _op_difference(self.placement, graph.ops)
        lines.append("the model, its input shapes or the capture mode changed since the plan was "
                     f"made; {_REPLAN}")
        raise PlanMismatch("\n".join(lines))

    def check_devices(self, devices: DeviceSet) -> None:
        """Raise PlanMismatch unless ``devices`` equals the device set the plan was made for.

        Example:
            >>> plan.check_devices(load_profile("h200-host"))  # doctest: +SKIP
        """
        if devices == self.devices:
            return
        ours, theirs = set(self.devices.names()), set(devices.names())
        what = [f"{label}: {', '.join(sorted(names))}" for label, names in
                (("only in the plan", ours - theirs), ("only in the profile", theirs - ours)) if names]
        what += [f"{name} differs" for name in self.devices.names()
                 if name in theirs and self.devices.device(name) != devices.device(name)]
        if self.devices.links != devices.links:
            what.append("the links differ")
        raise PlanMismatch(f"{self.source} was made for device set {self.devices.name!r}, not "
                           f"{devices.name!r} ({'; '.join(what) or 'names differ'}); {_REPLAN} "
                           f"--devices {devices.source.removeprefix('builtin:')}")

    # -- views --------------------------------------------------------------------------------

    def to_device_map(self) -> dict[str, str]:
        """An accelerate-style ``{"module.path": device}`` of where each module's weights live.

        Only ops owning parameters count; a streamed op's weights live on its ``weights``
        device. The map is minimal: a module whose parameter-owning ops share a device is
        mapped whole, otherwise its children are visited. One device gives ``{"": device}``.

        Raises:
            PlanMismatch: a module's own ops disagree (the plan is not module-aligned).

        Example:
            >>> plan.to_device_map()                          # doctest: +SKIP
            {'emb': 'cpu', 'layers.0': 'cuda:0', 'layers.1': 'cpu', 'head': 'cuda:0'}
        """
        homes: dict[str, dict[str, list[str]]] = {}   # module path -> device -> its ops
        for op in self.param_ops:
            device = self.weights.get(op, self.placement[op])
            homes.setdefault(self.modules[op], {}).setdefault(device, []).append(op)
        if not homes:
            return {"": self._busiest_device()}
        out: dict[str, str] = {}
        _map_module("", homes, self.devices.names(), out, self.param_names)
        # tied names (lm_head.weight sharing tok_emb.weight) go where their storage lives
        for op in self.param_ops:
            device = self.weights.get(op, self.placement[op])
            for tensor in self.param_names.get(op, ()):
                if not any(k == "" or tensor == k or tensor.startswith(k + ".") for k in out):
                    out[tensor] = device
        return out

    # -- running it --------------------------------------------------------------------------

    def emit(self, model: Any, device_map: Mapping[str, str] | None = None, *, example_inputs: Any = None) -> Any:
        """An ``nn.Module`` that runs this placement (see :mod:`partitioner.codegen.torch_module`).

        ``device_map`` binds the plan's devices to present ones, e.g. ``{"cuda:0": "cpu"}``.

        Example:
            >>> emitted = plan.emit(model, {"cuda:0": "cpu"})   # doctest: +SKIP
        """
        from partitioner.codegen.torch_module import emit_module

        return emit_module(self, model, device_map, example_inputs=example_inputs)

    def emit_source(
        self,
        path: str | os.PathLike[str],
        model: Any,
        device_map: Mapping[str, str] | None = None,
        *,
        example_inputs: Any = None,
        force: bool = False,
    ) -> Path:
        """Write one readable Python file that runs this placement, like :meth:`emit` does.

        The file defines ``PartitionedModel`` (the model's parameter names, explicit
        ``.to(device)`` transfers, one commented part per device run) and ``build()``; see
        :mod:`partitioner.codegen.source`. It is written atomically and never over an existing
        file unless ``force``.

        Raises:
            HetpartError: ``path`` exists and ``force`` is false, or a device is not bound.
            PlanMismatch: the model is not the one the plan was made for.

        Example:
            >>> plan.emit_source("placed.py", model, {"cuda:0": "cpu"})   # doctest: +SKIP
            PosixPath('placed.py')
        """
        from partitioner.codegen.source import emit_source

        return emit_source(self, model, path, device_map, example_inputs=example_inputs, force=force)

    def per_device_ops(self) -> dict[str, list[str]]:
        """Ops computed on each device (every device of the set, in profile order).

        Example:
            >>> plan.per_device_ops()["cpu"]                  # doctest: +SKIP
            ['emb']
        """
        out: dict[str, list[str]] = {name: [] for name in self.devices.names()}
        for op, device in self.placement.items():
            out[device].append(op)
        return out

    def summary(self) -> str:
        """A few lines for people: devices with their ops, memory and busy time; solver; baselines.

        Example:
            >>> print(plan.summary())                         # doctest: +SKIP
            plan for 'mlp' (5 ops) on h200-host: latency, inference, predicted 41.0 µs ...
        """
        mode = "training step" if self.training else "inference"
        total = self.predicted["total_s"]
        lines = [f"plan for {self.model_name!r} ({self.op_count} ops) on {self.devices.name}: "
                 f"{self.objective}, {mode}, predicted {_seconds(total)} per step"]
        lower = self.predicted.get("lower_bound_s")
        s = self.solver
        gap = "" if s.gap is None else f", gap {s.gap:.2%}"
        lines.append(f"  solver     {s.name}: {s.status} in {format_seconds(s.seconds)}, bound "
                     f"{_seconds(s.bound)}{gap}; physical lower bound {_seconds(lower)}")
        busy = self.predicted["per_device_s"]
        for device, ops in self.per_device_ops().items():
            mem = self.memory.get(device, {})
            used, cap = mem.get("used", 0), mem.get("capacity", self.devices.device(device).memory)
            lines.append(f"  {device:<10} {len(ops):>5} ops  busy {_seconds(busy.get(device)):>9}  memory "
                         f"{format_bytes(used)} of {format_bytes(cap)} ({used / cap:.0%})")
        for label, seconds in self.predicted.get("per_link_s", {}).items():
            if seconds:
                lines.append(f"  link {label:<16} busy {_seconds(seconds)}")
        kinds: dict[str, list[TransferInfo]] = {}
        for t in self.transfers:
            kinds.setdefault(t.kind, []).append(t)
        for kind, items in kinds.items():
            lines.append(f"  {kind} transfers: {len(items)} per step, {format_bytes(sum(t.bytes for t in items))}, "
                         f"{_seconds(sum(t.seconds for t in items))}")
        if self.weights:
            lines.append(f"  streamed weights: {len(self.weights)} ops ({self.stream_mode})")
        for name, b in self.baselines.items():
            if b.total_s is None:
                lines.append(f"  baseline {name:<18} n/a")
                continue
            speedup = f"  speed-up {b.total_s / total:7.2f}x" if total else ""
            fits = "" if b.feasible else "  (does not fit: " + (b.note or "over a cap") + ")"
            lines.append(f"  baseline {name:<18} {_seconds(b.total_s):>9}{speedup}{fits}")
        return "\n".join(lines)

    def _busiest_device(self) -> str:
        """The device computing the most ops (profile order breaks ties)."""
        counts = {name: len(ops) for name, ops in self.per_device_ops().items()}
        return max(counts, key=counts.__getitem__)

    # -- from a solve -------------------------------------------------------------------------

    @classmethod
    def from_solution(
        cls,
        problem: Problem,
        solution: Solution,
        evaluation: Evaluation | None = None,
        *,
        baselines: Mapping[str, Evaluation | BaselineInfo] | None = None,
        lower_bound: float | None = None,
        model_name: str | None = None,
        capture: str = "export",
        constraints: Mapping[str, Any] | None = None,
    ) -> Plan:
        """The plan of ``solution``: nodes of a coarsened problem are expanded to their ops.

        ``evaluation`` defaults to ``evaluate(problem, solution.placement)``; ``baselines`` maps
        names to their evaluations (or ready BaselineInfo values); ``lower_bound`` is the cheap
        physical bound printed beside the solver's own (default: the solver's bound).

        Example:
            >>> plan = Plan.from_solution(problem, ilp.solve(problem))   # doctest: +SKIP
        """
        from partitioner.solvers.problem import evaluate

        ev = evaluation if evaluation is not None else evaluate(problem, solution.placement)
        graph, placement = problem.original, solution.placement
        device = {op: placement.device[n] for n in problem.nodes for op in problem.members[n]}
        weights = {op: home for n, home in placement.streamed.items() if home != placement.device[n]
                   for op in problem.members[n] if graph.ops[op].owned_params}
        order = placement.order or problem.nodes
        return cls(
            model_name=model_name or graph.name,
            inputs=tuple((graph.tensors[t].shape, graph.tensors[t].dtype) for t in graph.inputs),
            capture=capture,
            edges=tuple((u, v) for u, v in graph.dag.edges),
            param_names={op.name: tuple(n for p in op.owned_params for n in (p, *graph.params[p].aliases))
                         for op in graph.topological_order() if op.owned_params},
            op_bytes={op.name: (sum(graph.tensors[t].nbytes for t in op.outputs), op.param_bytes)
                      for op in graph.topological_order()},
            constraints=dict(constraints or {}),
            fingerprint=graph.fingerprint(),
            op_count=len(graph),
            modules={op.name: op.module_path for op in graph.topological_order()},
            param_ops=tuple(op.name for op in graph.topological_order() if op.owned_params),
            devices=problem.devices,
            objective=problem.options.objective,
            training=problem.options.training,
            optimizer=problem.options.optimizer,
            placement={op.name: device[op.name] for op in graph.topological_order()},
            weights=weights,
            stream_mode=placement.stream_mode,
            schedule=tuple(op for n in order for op in problem.members[n]),
            transfers=tuple(TransferInfo(t.tensor, t.src, t.dst, t.bytes, t.seconds, t.kind)
                            for t in ev.transfers),
            memory={d: {"used": ev.memory[d], "capacity": ev.capacity[d]} for d in ev.memory},
            predicted={"total_s": ev.total_s, "critical_path_s": ev.critical_path_s,
                       "per_device_s": dict(ev.per_device_s), "per_link_s": dict(ev.per_link_s),
                       "lower_bound_s": lower_bound if lower_bound is not None else solution.bound,
                       "per_op_s": _per_op_seconds(problem, device),
                       "per_op_device_s": _per_op_device_seconds(problem)},
            solver=SolverInfo(solution.solver, getattr(solution.status, "value", solution.status),
                              ev.total_s, _bound(ev.total_s, solution.bound), _gap(ev.total_s, solution.bound),
                              solution.seconds),
            baselines={name: b if isinstance(b, BaselineInfo) else
                       BaselineInfo(b.total_s, b.feasible, "; ".join(b.violations[:1]))
                       for name, b in (baselines or {}).items()},
        )


# --------------------------------------------------------------------------------------------
# Reading: typed access to decoded JSON; errors name the file and the field path
# --------------------------------------------------------------------------------------------


def _read_constraints(r: _Reader, value: Any) -> dict[str, Any]:
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


def _read_edge(r: _Reader, value: Any, path: str) -> tuple[str, str]:
    pair = r.array(value, path)
    if len(pair) != 2:
        r.fail(path, f"expected [producer, consumer], got {_show(value)}")
    return r.string(pair[0], f"{path}[0]"), r.string(pair[1], f"{path}[1]")


def _read_input(r: _Reader, value: Any, path: str) -> tuple[tuple[int, ...], str]:
    item = r.keys(value, path, ("shape", "dtype"))
    shape = tuple(r.count(v, f"{path}.shape[{i}]") for i, v in enumerate(r.array(item["shape"], f"{path}.shape")))
    return shape, r.string(item["dtype"], f"{path}.dtype")


def _show(value: Any) -> str:
    """A value as it appears in JSON, shortened: ``"abc"``, ``null``, ``{"a": 1}``."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(path: str, key: str) -> str:
    """The path of a mapping entry: ``placement["linear_3"]``."""
    return f"{path}[{json.dumps(key)}]"


def _field(path: str, name: str) -> str:
    """The path of a fixed field: ``solver.gap`` (``gap`` at the top)."""
    return f"{path}.{name}" if path else name


class _Reader:
    """Checks the type of one decoded JSON value at a time; every error names ``source: path``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> NoReturn:
        raise PlanFormatError(f"{self.source}: {path}: {message}" if path else f"{self.source}: {message}")

    def expected(self, path: str, what: str, value: Any) -> NoReturn:
        self.fail(path or "the file", f"expected {what}, got {_show(value)}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.expected(path, "an object", value)
        return value

    def keys(self, value: Any, path: str, required: Sequence[str],
             optional: Sequence[str] = ()) -> Mapping[str, Any]:
        """``value`` as an object with every required key and no other than the optional ones."""
        value = self.mapping(value, path)
        for key in required:
            if key not in value:
                self.fail(_field(path, key), f"missing; {path or 'a plan'} needs "
                                             f"{', '.join(required)}")
        allowed = (*required, *optional)
        unknown = [k for k in value if k not in allowed]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
            hint = f" (did you mean {json.dumps(close[0])}?)" if close else ""
            where = f"{path}: unknown key" if path else "unknown top-level key"
            self.fail("", f"{where}{'s' * (len(unknown) > 1)} {', '.join(map(_show, unknown))}{hint}; "
                          f"the keys of {path or f'a format_version {FORMAT_VERSION} plan'} are: "
                          f"{', '.join(allowed)}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            self.expected(path, "a string", value)
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.expected(path, "true or false", value)
        return value

    def count(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.expected(path, "a non-negative integer", value)
        return value

    def number(self, value: Any, path: str) -> float:
        """A finite number (non-negative: every number of a plan is a time, size or ratio)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            self.expected(path, "a non-negative number", value)
        return float(value)

    def number_or_null(self, value: Any, path: str) -> float | None:
        """A number, or None for null and for non-finite numbers (unknown)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            self.expected(path, "a number or null", value)
        return _finite_or_none(value)

    def array(self, value: Any, path: str) -> Sequence[Any]:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            self.expected(path, "an array", value)
        return value

    def string_list(self, value: Any, path: str) -> tuple[str, ...]:
        return tuple(self.string(v, f"{path}[{i}]") for i, v in enumerate(self.array(value, path)))

    def string_map(self, value: Any, path: str, item: Callable[[Any, str], Any]) -> dict[str, Any]:
        return {k: item(v, _key(path, k)) for k, v in self.mapping(value, path).items()}


def _parse_json(text: str, source: str) -> Any:
    """Decode ``text``; a syntax error names the line, a file that ends early is called truncated."""
    if not text.strip():
        raise PlanFormatError(f"{source}: the file is empty; {_REPLAN}")

    def reject_constant(token: str) -> NoReturn:
        raise PlanFormatError(f"{source}: {token} is not allowed in a plan; unknown numbers are null")

    try:
        return json.loads(text, parse_constant=reject_constant, object_pairs_hook=_no_duplicates(source))
    except json.JSONDecodeError as err:
        if err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string"):
            last = text.rstrip().count("\n") + 1
            raise PlanFormatError(
                f"{source}: line {last}: the file ends in the middle of the JSON: it is truncated (an "
                f"interrupted copy or write?); restore it or {_REPLAN}") from None
        raise PlanFormatError(f"{source}: line {err.lineno}, column {err.colno}: JSON syntax error: "
                              f"{err.msg}") from None


def _no_duplicates(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise PlanFormatError(f"{source}: the key {json.dumps(key)} appears twice in one object")
            out[key] = value
        return out
    return build


def _check_version(r: _Reader, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        r.expected("format_version", f"an integer (this hetpart reads {FORMAT_VERSION})", value)
    if value != FORMAT_VERSION:
        newer = "upgrade hetpart, or " if value > FORMAT_VERSION else ""
        r.fail("format_version", f"the file is a format_version {value} plan, and this hetpart "
                                 f"reads format_version {FORMAT_VERSION}; {newer}{_REPLAN}")


def _read_devices(r: _Reader, value: Any) -> DeviceSet:
    r.mapping(value, "devices")
    try:   # ProfileError messages read "<source>: devices.cpu.memory: ...": the plan's own path
        return DeviceSet.from_dict(value, r.source)
    except ProfileError as err:
        raise PlanFormatError(str(err)) from None


def _read_transfer(r: _Reader, value: Any, path: str) -> TransferInfo:
    t = r.keys(value, path, _TRANSFER_KEYS)
    return TransferInfo(
        tensor=r.string(t["tensor"], f"{path}.tensor"),
        src=r.string(t["from"], f"{path}.from"),
        dst=r.string(t["to"], f"{path}.to"),
        bytes=r.count(t["bytes"], f"{path}.bytes"),
        seconds=r.number(t["seconds"], f"{path}.seconds"),
        kind=r.string(t["kind"], f"{path}.kind"),
    )


def _read_solver(r: _Reader, value: Any) -> SolverInfo:
    s = r.keys(value, "solver", _SOLVER_KEYS)
    return SolverInfo(
        name=r.string(s["name"], "solver.name"),
        status=r.string(s["status"], "solver.status"),
        objective=r.number_or_null(s["objective"], "solver.objective"),
        bound=r.number_or_null(s["bound"], "solver.bound"),
        gap=r.number_or_null(s["gap"], "solver.gap"),
        seconds=r.number(s["seconds"], "solver.seconds"),
    )


def _read_baseline(r: _Reader, value: Any, path: str) -> BaselineInfo:
    b = r.keys(value, path, _BASELINE_KEYS)
    return BaselineInfo(r.number_or_null(b["total_s"], f"{path}.total_s"),
                        r.boolean(b["feasible"], f"{path}.feasible"),
                        r.string(b["note"], f"{path}.note"))


def _read_memory(r: _Reader, value: Any) -> dict[str, dict[str, int]]:
    def entry(v: Any, path: str) -> dict[str, int]:
        m = r.keys(v, path, _MEMORY_KEYS)
        return {k: r.count(m[k], _field(path, k)) for k in _MEMORY_KEYS}
    return r.string_map(value, "memory", entry)


def _read_predicted(r: _Reader, value: Any) -> dict[str, Any]:
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


def _check_references(plan: Plan, r: _Reader) -> None:
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


def _check_choice(r: _Reader, value: Any, path: str, choices: Sequence[str]) -> None:
    if value not in choices:
        r.fail(path, f"{_show(value)} is not one of {', '.join(choices)}")


def _membership(r: _Reader, known: Container[str], rule: str,
                what: str) -> Callable[[str, str], None]:
    """A check that fails with ``path: <what> 'x' <rule>`` for names not in ``known``."""
    def check(name: str, path: str) -> None:
        if name not in known:
            r.fail(path, f"{what} {name!r} {rule}")
    return check


def _check_unique(r: _Reader, names: Sequence[str], path: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            r.fail(f"{path}[{i}]", f"{name!r} appears twice")
        seen.add(name)


def _check_transfer(r: _Reader, t: TransferInfo, path: str, device_ok: Callable[[str, str], None]) -> None:
    device_ok(t.src, f"{path}.from")
    device_ok(t.dst, f"{path}.to")
    _check_choice(r, t.kind, f"{path}.kind", _TRANSFER_KINDS)
    r.count(t.bytes, f"{path}.bytes")
    r.number(t.seconds, f"{path}.seconds")


def _op_difference(placed: Mapping[str, str], ops: Mapping[str, Any], shown: int = 5) -> list[str]:
    """Lines naming a few ops only one side has."""
    lines = []
    for label, names in (("ops only in the plan", [o for o in placed if o not in ops]),
                         ("ops only in the graph", [o for o in ops if o not in placed])):
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            lines.append(f"  {label}: {', '.join(names[:shown])}{more}")
    return lines


# --------------------------------------------------------------------------------------------
# The module-level view
# --------------------------------------------------------------------------------------------


def _within(path: str, module: str) -> bool:
    """Whether module ``path`` is ``module`` or inside it (every path is inside the root "")."""
    return not module or path == module or path.startswith(module + ".")


def _child(module: str, path: str) -> str:
    """The child of ``module`` on the way to ``path``: ``_child("layers", "layers.3.mlp") == "layers.3"``."""
    rest = path[len(module) + 1:] if module else path
    return _field(module, rest.split(".", 1)[0])


def _map_module(module: str, homes: Mapping[str, Mapping[str, list[str]]],
                device_order: Sequence[str], out: dict[str, str],
                param_names: Mapping[str, tuple[str, ...]] = MappingProxyType({})) -> None:
    """Map ``module`` whole when its parameter-owning ops share a device, else visit its children."""
    paths = [p for p in homes if _within(p, module)]
    devices = [d for d in device_order if any(d in homes[p] for p in paths)]
    if len(devices) == 1:
        out[module] = devices[0]
        return
    name = module or "(the root module)"
    own = homes.get(module, {})
    if len(own) > 1:
        split = _and([d for d in device_order if d in own])
        ops = ", ".join(f"{op} ({d})" for d in device_order for op in own.get(d, ()))
        raise PlanMismatch(f"module {name} is split across {split}: the plan is not module-aligned "
                           f"(its ops: {ops}); re-plan with --align-modules")
    if own and all(op in param_names for ops in own.values() for op in ops):
        # accelerate maps single tensors too: the module's own parameters by name, children below
        device, ops = next(iter(own.items()))
        for op in ops:
            for tensor in param_names[op]:
                out[tensor] = device
    elif own:
        device, ops = next(iter(own.items()))
        raise PlanMismatch(f"module {name} holds parameters of its own ({', '.join(ops)} on {device}) "
                           f"while its submodules are split across {_and(devices)}: a device map "
                           f"cannot express that; re-plan with --align-modules")
    for child in dict.fromkeys(_child(module, p) for p in paths if p != module):
        _map_module(child, homes, device_order, out, param_names)


def _and(names: Sequence[str]) -> str:
    """``cpu and cuda:0``; ``cpu, cuda:0 and cuda:1``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


# --------------------------------------------------------------------------------------------
# Writing and small helpers
# --------------------------------------------------------------------------------------------


def _finite_or_none(value: float | None) -> float | None:
    """``None`` for None, inf and nan; otherwise the value as a float."""
    return float(value) if value is not None and math.isfinite(value) else None


def _freeze(value: Any) -> Any:
    """Read-only nested mappings (dict -> MappingProxyType)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _plain(value: Any) -> Any:
    """JSON-ready values: mappings -> dict, tuples -> list, non-finite floats -> None."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _transfer_dict(t: TransferInfo) -> dict[str, Any]:
    return {"tensor": t.tensor, "from": t.src, "to": t.dst, "bytes": t.bytes,
            "seconds": t.seconds, "kind": t.kind}


def _bound(objective: float, bound: float | None) -> float | None:
    """A solver's bound can exceed the evaluated objective by its tolerance: never report it above."""
    return None if bound is None else min(bound, objective)


def _gap(objective: float | None, bound: float | None) -> float | None:
    """Relative gap ``(objective - bound) / objective``; None when either is unknown."""
    if objective is None or bound is None or not math.isfinite(objective) or not math.isfinite(bound):
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else format_seconds(value)


def _per_op_device_seconds(problem: Problem) -> dict[str, dict[str, float | None]]:
    """Each op's time on every device of the profile (None where the device cannot run it)."""
    from cost_models.analytic import op_time
    from cost_models.training import training_op_time

    cost = training_op_time if problem.options.training else op_time
    out: dict[str, dict[str, float | None]] = {}
    for op in problem.original.topological_order():
        out[op.name] = {
            d.name: cost(op, d).seconds if d.supports(op.kind, op.op_class.value) else None
            for d in problem.devices.devices
        }
    return out


def _per_op_seconds(problem: Problem, device: Mapping[str, str]) -> dict[str, float]:
    """Each op's own time on its device, the cost model's view of the problem's node times."""
    from cost_models.analytic import op_time
    from cost_models.training import training_op_time

    cost = training_op_time if problem.options.training else op_time
    ops = problem.original.ops
    return {op: cost(ops[op], problem.devices.device(d)).seconds for op, d in device.items()}
