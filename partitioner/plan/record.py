"""The plan record: a placement of one graph on one device set, with what it is predicted to cost.

In: what a solve produced (the graph's fingerprint and module paths, the DeviceSet, where each
op runs, transfers, memory, predicted times, solver status, baselines), built by hand or by
:meth:`Plan.from_solution`; or a plan file on disk (:meth:`Plan.load`).
Out: a frozen :class:`Plan`; its JSON (:meth:`Plan.to_json`, :meth:`Plan.save`); the checks a
user of the plan needs (:meth:`Plan.check_graph`, :meth:`Plan.check_devices`) and an
accelerate-style ``device_map`` (:meth:`Plan.to_device_map`).

The file format is described in :mod:`partitioner.plan`.

This module holds :class:`Plan` (its fields, JSON writing, checks against a graph or a device set
and the views users call); reading and validating files is :mod:`partitioner.plan.reader`, the
module-level view :mod:`partitioner.plan.device_map`, the text summary
:mod:`partitioner.plan.summary`, and building from a solve :mod:`partitioner.plan.from_solve`.
Running a plan is a backend's job (:mod:`backends`): :meth:`Plan.emit`, :meth:`Plan.emit_optimizer` and
:meth:`Plan.emit_source` delegate to :mod:`backends.torch`, :meth:`Plan.emit_onnx` to :mod:`backends.onnx_parts`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cost_models.profiles import DeviceSet
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.files import read_text, refuse_overwrite, write_atomic
from partitioner.plan.batch import check_batch
from partitioner.plan.implied import check_against_graph
from partitioner.plan.live import FallbackPlan, check_fallbacks
from partitioner.plan.pipeline import check_pipeline
from partitioner.plan.precision import check_precision, graph_differences
from partitioner.plan.fields import FieldReader, parse_json
from partitioner.plan.training_state import check_training_state
from partitioner.plan.splits import check_splits, check_splits_against_graph
from partitioner.plan.reader import check_references, plan_fields, read_memory, read_predicted
from partitioner.plan.values import (
    _REPLAN, FORMAT_VERSION, BaselineInfo, InputSpec, SolverInfo, TransferInfo, _freeze, _plain,
    _transfer_dict, input_spec,
)

if TYPE_CHECKING:  # the solver package is imported only by from_solution, when called
    from partitioner.ir import OpGraph
    from partitioner.solvers.problem import Evaluation, Problem, Solution

__all__ = ["MAX_PLAN_BYTES", "Plan"]

#: The largest plan file read (a 100,000-op plan is about 100 MB).
MAX_PLAN_BYTES = 2**30


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
    inputs: tuple[InputSpec, ...] = ()         # each positional input as passed when planning, for re-capture
    capture: str = "export"                    # how the model was captured ("export" | "symbolic_trace" | "onnx")
    edges: tuple[tuple[str, str], ...] = ()    # (producer op, consumer op) of every graph edge, for drawing
    edge_bytes: tuple[int, ...] = ()           # bytes each edge carries, in the order of edges (() : not recorded)
    param_names: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # op -> its parameters
    op_bytes: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # op -> (output, parameter) bytes
    constraints: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # pins, caps, streaming, alignment
    costs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the cost model that priced it ({}: analytic)
    pipeline: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # stages, ranks, schedule (plan/pipeline.py)
    batch: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # micro-batch, accumulation (plan/batch.py)
    probe: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # memory read by --devices detect (plan/live.py)
    fallbacks: tuple[FallbackPlan, ...] = ()   # plans for less free memory, solved ahead of time (plan/live.py)
    precision: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # op -> 16-bit dtype (plan/precision.py)
    request: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the options as asked (partitioner/options.py)
    training_state: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # per parameter (plan/training_state.py)
    splits: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # op -> axis, devices, fractions (plan/splits.py)
    source: str = dataclasses.field(default="<plan>", compare=False, repr=False)

    def __post_init__(self) -> None:
        reader = FieldReader(self.source)
        for name in ("objective", "stream_mode", "optimizer"):
            value = getattr(self, name)
            object.__setattr__(self, name, value.value if isinstance(value, enum.Enum) else value)
        for name in ("modules", "placement", "weights", "baselines"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        for name in ("param_ops", "schedule", "transfers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "inputs", tuple(input_spec(v) for v in self.inputs))
        object.__setattr__(self, "edges", tuple((u, v) for u, v in self.edges))
        object.__setattr__(self, "edge_bytes", tuple(self.edge_bytes))
        object.__setattr__(self, "op_bytes", MappingProxyType({op: tuple(b) for op, b in self.op_bytes.items()}))
        object.__setattr__(self, "constraints", _freeze(dict(self.constraints)))
        object.__setattr__(self, "costs", _freeze(dict(self.costs)))
        object.__setattr__(self, "pipeline", _freeze(dict(self.pipeline)))
        object.__setattr__(self, "batch", _freeze(dict(self.batch)))
        object.__setattr__(self, "probe", _freeze(dict(self.probe)))
        object.__setattr__(self, "fallbacks", tuple(self.fallbacks))
        object.__setattr__(self, "precision", _freeze(dict(self.precision)))
        object.__setattr__(self, "request", _freeze(dict(self.request)))
        object.__setattr__(self, "training_state", _freeze(dict(self.training_state)))
        object.__setattr__(self, "splits", _freeze(dict(self.splits)))
        object.__setattr__(self, "param_names",
                           MappingProxyType({op: tuple(names) for op, names in self.param_names.items()}))
        unknown = [e for e in self.edges if e[0] not in self.placement or e[1] not in self.placement]
        if unknown:
            reader.fail("model.edges", f"edge {unknown[0]} names an op that is not in placement")
        if self.edge_bytes and len(self.edge_bytes) != len(self.edges):
            reader.fail("model.edges", f"{len(self.edge_bytes)} of the {len(self.edges)} edges give their bytes; "
                                       f"every edge [producer, consumer, bytes] or none does")
        object.__setattr__(self, "memory", _freeze(read_memory(reader, self.memory)))
        object.__setattr__(self, "predicted", _freeze(read_predicted(reader, self.predicted)))
        check_pipeline(self, reader)  # before the transfers are checked against its stages
        check_batch(self, reader)
        check_precision(self, reader)
        check_references(self, reader)
        check_fallbacks(self, reader)
        check_training_state(self, reader)
        check_splits(self, reader)

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
                      "inputs": [spec.to_dict() for spec in self.inputs],
                      "edges": [[*e, b] for e, b in zip(self.edges, self.edge_bytes)] if self.edge_bytes
                      else [list(e) for e in self.edges],
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
            "solver": self.solver.to_dict(),
            "baselines": {name: dataclasses.asdict(b) for name, b in self.baselines.items()},
        }
        if self.constraints:
            out["constraints"] = _plain(self.constraints)
        if self.costs:
            out["costs"] = _plain(self.costs)
        if self.pipeline:
            out["pipeline"] = _plain(self.pipeline)
        if self.batch:
            out["batch"] = _plain(self.batch)
        if self.probe:
            out["probe"] = _plain(self.probe)
        if self.fallbacks:
            out["fallbacks"] = [f.to_dict() for f in self.fallbacks]
        if self.precision:
            out["precision"] = _plain(self.precision)
        if self.request:
            out["request"] = _plain(self.request)
        if self.training_state:
            out["training_state"] = _plain(self.training_state)
        if self.splits:
            out["splits"] = _plain(self.splits)
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
        refuse_overwrite([path], force=force, forcing="force=True")  # a Python caller's keyword, not the CLI flag
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
            text = read_text(path, what="plan file", max_bytes=MAX_PLAN_BYTES)
        except FileNotFoundError:
            raise HetpartError(f"{path}: no such plan file; make one with `hetpart plan MODEL ...`") from None
        except OSError as err:
            raise HetpartError(f"{path}: cannot read the plan file: {err.strerror or err}") from None
        return cls.from_json(text, str(path))

    @classmethod
    def from_json(cls, text: str, source: str = "<text>") -> Plan:
        """Parse plan JSON; syntax errors give the line, a cut-off file is named as such.

        Example:
            >>> Plan.from_json(plan.to_json()) == plan        # doctest: +SKIP
            True
        """
        return cls.from_dict(parse_json(text, source), source)

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> Plan:
        """Build a plan from the decoded JSON, checking the version, keys and every field's type.

        Example:
            >>> Plan.from_dict(plan.to_dict()) == plan        # doctest: +SKIP
            True
        """
        return cls(**plan_fields(d, source))

    # -- checks against what the plan is used with --------------------------------------------

    def check_graph(self, graph: OpGraph) -> None:
        """Raise PlanMismatch unless ``graph`` is the graph this plan was made for, and the plan's
        memory and transfers are what its placement needs on it
        (:func:`partitioner.plan.implied.check_against_graph`).

        Example:
            >>> plan.check_graph(from_module(model, inputs))  # doctest: +SKIP
        """
        found = graph.fingerprint()
        if found == self.fingerprint:
            self._check_ops(graph)
            check_splits_against_graph(self, graph)  # each split op takes its split on this graph
            check_against_graph(self, graph)  # the memory and copies its placement needs on this graph
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

    def _check_ops(self, graph: OpGraph) -> None:
        """The fingerprint is a string anyone can copy: the ops, their edges and the ops owning
        parameters must be the graph's too."""
        lines = _op_difference(self.placement, graph.ops)
        if not lines:
            edges = set(graph.dag.edges)
            if self.edges and set(self.edges) != edges:
                odd = sorted(set(self.edges) ^ edges)[:3]
                lines.append(f"  edges differ: {', '.join(f'{u} -> {v}' for u, v in odd)}")
            owning = [op.name for op in graph.topological_order() if op.owned_params]
            if set(self.param_ops) != set(owning):
                odd = sorted(set(self.param_ops) ^ set(owning))[:3]
                lines.append(f"  ops owning parameters differ: {', '.join(odd)}")
            lines += graph_differences(self, graph)
        if lines:
            raise PlanMismatch("\n".join([
                f"{self.source} carries the fingerprint of model {graph.name!r} ({self.fingerprint}), but "
                f"not its ops (the plan file was edited or copied from another plan):", *lines,
                f"the plan cannot be run on this model; {_REPLAN}"]))

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

    # -- views --------------------------------------------------------------------------------

    def to_device_map(self) -> dict[str, str]:
        """An accelerate-style ``{"module.path": device}`` of where each module's weights live.

        Only ops owning parameters count; a streamed op's weights live on its ``weights``
        device. The map is minimal: a module whose parameter-owning ops share a device is
        mapped whole, otherwise its children are visited. One device gives ``{"": device}``
        (see :mod:`partitioner.plan.device_map`).

        Raises:
            PlanMismatch: a module's own ops disagree (the plan is not module-aligned).
            HetpartError: the plan splits ops over devices, which a device_map cannot say.

        Example:
            >>> plan.to_device_map()                          # doctest: +SKIP
            {'emb': 'cpu', 'layers.0': 'cuda:0', 'layers.1': 'cpu', 'head': 'cuda:0'}
        """
        from partitioner.plan.device_map import module_device_map
        from partitioner.plan.splits import refuse_splits

        refuse_splits(self, "an accelerate device_map (one device per module)")

        return module_device_map(self)

    # -- running it --------------------------------------------------------------------------

    def emit(self, model: Any, device_map: Mapping[str, str] | None = None, *, example_inputs: Any = None) -> Any:
        """An ``nn.Module`` that runs this placement (see :mod:`backends.torch.module`).

        ``device_map`` binds the plan's devices to present ones, e.g. ``{"cuda:0": "cpu"}``.

        Example:
            >>> emitted = plan.emit(model, {"cuda:0": "cpu"})   # doctest: +SKIP
        """
        from backends.torch import BACKEND

        return BACKEND.build(self, model, device_map, example_inputs=example_inputs)

    def emit_optimizer(self, emitted: Any, params: Any = None, **hyper: Any) -> Any:
        """The training step's optimizer over ``emitted = plan.emit(model, ...)``: a
        ``torch.optim.Optimizer`` keeping each parameter's state where this plan puts it, its
        host steps run beside backward (see :mod:`backends.torch.optim`). (Not ``plan.optimizer``:
        that field names the optimizer the plan priced.)

        ``hyper`` are the torch class's hyperparameters (``lr=1e-3``); ``params`` optional
        param groups of ``emitted``.

        Example:
            >>> opt = plan.emit_optimizer(emitted, lr=1e-3)   # doctest: +SKIP
        """
        from backends.torch import placed_optimizer

        return placed_optimizer(self, emitted, params, **hyper)

    def emit_source(
        self,
        path: str | os.PathLike[str],
        model: Any,
        device_map: Mapping[str, str] | None = None,
        *,
        example_inputs: Any = None,
        force: bool = False,
        training: bool = False,
    ) -> Path:
        """Write one readable Python file that runs this placement, like :meth:`emit` does.

        The file defines ``PartitionedModel`` (the model's parameter names, explicit
        ``.to(device)`` transfers, one commented part per device run) and ``build(weights)``, which
        loads the weights from the original model or a state-dict file; see
        :mod:`backends.torch.source`. With ``training`` (a training plan) it also defines
        ``build_optimizer(module, **hyper)``, the plan's placed optimizer (:meth:`emit_optimizer`).
        It is written atomically and never over an existing file unless ``force``.

        Raises:
            HetpartError: ``path`` exists and ``force`` is false, or a device is not bound.
            PlanMismatch: the model is not the one the plan was made for.

        Example:
            >>> plan.emit_source("placed.py", model, {"cuda:0": "cpu"})   # doctest: +SKIP
            PosixPath('placed.py')
        """
        from backends.torch.source import emit_source

        return emit_source(self, model, path, device_map, example_inputs=example_inputs, force=force,
                           training=training)

    def emit_onnx(
        self,
        directory: str | os.PathLike[str],
        model: Any,
        *,
        input_shapes: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> Path:
        """Write this plan for an ONNX model as one ONNX model per part plus ``manifest.json``.

        ``model`` is the ``.onnx`` path (or ``ModelProto``) the plan was made for; each part runs in
        an onnxruntime session with its device's provider (:mod:`backends.onnx_parts`; open the
        folder with ``backends.onnx_parts.load_parts(directory, device_map)`` or
        ``hetpart run DIR``). The folder appears whole or not at all; an existing one is replaced
        only with ``force``.

        Raises:
            HetpartError: ``directory`` exists and ``force`` is false.
            PlanMismatch: the model is not the one the plan was made for.

        Example:
            >>> plan.emit_onnx("parts", "model.onnx")        # doctest: +SKIP
            PosixPath('parts')
        """
        from backends.onnx_parts import emit_onnx

        return emit_onnx(self, model, directory, input_shapes=input_shapes, force=force)

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
        from partitioner.plan.summary import summary_text

        return summary_text(self)

    # -- from a solve -------------------------------------------------------------------------

    @classmethod
    def from_solution(
        cls,
        problem: Problem,
        solution: Solution,
        evaluation: Evaluation | None = None,
        **kwargs: Any,
    ) -> Plan:
        """The plan of ``solution``: nodes of a coarsened problem are expanded to their ops.

        ``evaluation`` defaults to ``evaluate(problem, solution.placement)``; keyword arguments
        (``baselines``: names to their evaluations or ready BaselineInfo values; ``lower_bound``:
        the cheap physical bound printed beside the solver's own; ``model_name``, ``capture``,
        ``constraints``; the cost model is the problem's) are those of :func:`partitioner.plan.from_solve.fields_from_solution`.

        Example:
            >>> plan = Plan.from_solution(problem, ilp.solve(problem))   # doctest: +SKIP
        """
        from partitioner.plan.from_solve import fields_from_solution

        return cls(**fields_from_solution(problem, solution, evaluation, **kwargs))


def _op_difference(placed: Mapping[str, str], ops: Mapping[str, Any], shown: int = 5) -> list[str]:
    """Lines naming a few ops only one side has."""
    lines = []
    for label, names in (("ops only in the plan", [o for o in placed if o not in ops]),
                         ("ops only in the graph", [o for o in ops if o not in placed])):
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            lines.append(f"  {label}: {', '.join(names[:shown])}{more}")
    differ = [o for o in placed if o not in ops] + [o for o in ops if o not in placed]
    if differ and all(o.rsplit("_", 1)[0] in _LAYOUT_COPIES or o in _LAYOUT_COPIES for o in differ):
        lines.append("  the ops that differ only copy a tensor into another memory layout: a capture on the meta device "
                     "lays some outputs out unlike a real device (transformers' sdpa attention on meta); plan the model "
                     "built on the device type it runs on, or from its model folder (read hollow, laid out as on the CPU)")
    return lines


#: op names of layout-only copies, whose presence depends on the strides a device gives its outputs
_LAYOUT_COPIES = ("contiguous", "clone")
