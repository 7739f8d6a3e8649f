"""The dynamo backend: every graph ``torch.compile`` hands over is captured, planned and placed.

In: dynamo's ``GraphModule`` and example inputs, and the ``options`` of
``torch.compile(model, backend="hetpart", options={...})``. Out: the compiled callable: the graph
rewritten by :func:`backends.compile.emit.emit_graph` to run its plan.

Per graph: :func:`partitioner.from_graph_module` captures it as an OpGraph (module paths those of
the model compiled, :mod:`backends.compile.graphs`), the pins that match it are kept
(:func:`~backends.compile.graphs.graph_pins`), the plan comes from
the cache (:mod:`backends.compile.cache`) or from :func:`partitioner.partition_outcome`, the
plan's logical devices are bound (``device_map``) and the graph is emitted. One INFO line per graph
goes to the ``hetpart`` logger (ops, devices used, predicted time, gap, cache hit or solve
seconds), the plan summary at DEBUG, and an INFO line naming any op the cost model has no class
for (costed by the documented fallback, ``OpClass.OTHER``: memory-bound, bytes moved over
bandwidth plus launch overhead).

A graph with dynamic shapes (``dynamic=True``, or dynamo's automatic dynamic shapes after a second
shape) is served by :class:`ShapeDispatch`: each new shape gets its own plan (cached, so a shape
seen before costs a dictionary look-up), planned on its first call.

Errors a user can cause (:class:`~partitioner.errors.HetpartError`: an unknown or ill-typed option,
a bad profile or cap, memory caps no placement fits, a device not present and not bound) reach the user from inside
``torch.compile`` as themselves, with dynamo's frames cut from the traceback (:func:`surfaced`).

Example:
    >>> compiled = torch.compile(model, backend=hetpart, options={"devices": "cpu"})  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from backends.binding import bind_devices
from backends.compile.cache import PlanCache, cache_key
from backends.compile.emit import emit_graph
from backends.compile.graphs import graph_name, graph_pins, graph_span, model_of, module_paths, qualified, under
from backends.compile.options import CompileOptions, parse_options
from cost_models.profiles import DeviceSet
from cost_models.units import format_seconds
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.frontends.fx import from_graph_module
from partitioner.ir import OpClass, OpGraph
from partitioner.plan import Plan
from partitioner.planner import partition_outcome

log = logging.getLogger("hetpart.compile")


@dataclasses.dataclass
class GraphRecord:
    """What happened to one graph (one shape of it): where its plan came from and how long each step took."""

    name: str                # the graph's name: the model's class, dynamo's compile id, its first and last module
    ops: int                 # ops in the captured graph
    key: str                 # plan cache key
    plan_from: str           # "solved" | "memory" | "disk" | "given"
    capture_s: float         # from_graph_module
    solve_s: float           # partition (0 for a cached plan)
    emit_s: float            # binding and emitting the placed graph
    plan: Plan
    path: str | None = None  # the plan file in plan_dir
    pins: dict[str, str] = dataclasses.field(default_factory=dict)  # the pins that matched this graph


class HetpartBackend:
    """A torch.compile backend with its own plan cache (see the module docstring).

    ``hetpart`` (the instance torch.compile finds by name) is the one most users need; a new
    instance starts with an empty cache. ``plans`` are used for the graphs they were made for
    (matched by fingerprint) instead of solving, and any other graph is an error.

    Example:
        >>> backend = HetpartBackend()
        >>> compiled = torch.compile(model, backend=backend, options={"devices": "cpu"})  # doctest: +SKIP
        >>> backend.solves                                                               # doctest: +SKIP
        1
    """

    __name__ = "hetpart"  # dynamo names a backend by __name__

    def __init__(self, plans: Sequence[Plan] = ()) -> None:
        self.cache = PlanCache()
        self.records: list[GraphRecord] = []
        self._given = tuple(plans)

    @property
    def solves(self) -> int:
        """How many plans this backend solved (cache misses)."""
        return sum(r.plan_from == "solved" for r in self.records)

    def clear(self) -> None:
        """Forget cached plans and records. ``torch._dynamo.reset()`` leaves them: a plan is keyed
        by what it was made for (graph, shapes, options), which a reset does not change."""
        self.cache.clear()
        self.records.clear()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
        """Compile one graph (torch.compile calls this; ``mode`` has no meaning here)."""
        try:
            if mode is not None:
                raise HetpartError(f"torch.compile(mode={mode!r}) is for inductor; backend 'hetpart' "
                                   f"takes options={{...}} instead (devices, memory, objective, ...)")
            return self.compile_graph(gm, example_inputs, parse_options(options))
        except HetpartError as err:
            raise surfaced(err, inspect.currentframe()) from None

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                      options: CompileOptions) -> Callable[..., Any]:
        """The compiled callable for ``gm`` (planned now, or per shape for a dynamic graph)."""
        profile = options.profile()
        grad = torch.is_grad_enabled()
        training = options.training if options.training is not None else grad and any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs)
        model = model_of()
        root, prefix = qualified(model)
        name = graph_name(gm, root)
        make = functools.partial(self._placed, gm, options, profile, training, name, prefix, module_paths(root), grad)
        positions = _dynamic_positions(gm)
        if positions:
            log.info("hetpart: graph %s has dynamic shapes: each new shape gets its own plan on its first call",
                     name)
            return ShapeDispatch(make, positions)
        return make(tuple(example_inputs))

    # -- one graph at one shape ------------------------------------------------------------------

    def _placed(self, gm: torch.fx.GraphModule, options: CompileOptions, profile: DeviceSet, training: bool,
                name: str, prefix: str, modules: set[str] | None, grad: bool, args: tuple) -> torch.fx.GraphModule:
        start = time.perf_counter()
        graph = under(from_graph_module(gm, args, name=name), prefix)
        captured = time.perf_counter()
        pins = graph_pins(graph, options.pins, modules)
        key = cache_key(graph, options.key(profile, training, pins))
        plan, source, path = self._plan(graph, key, options, profile, training, pins)
        solved = time.perf_counter()
        span = graph_span(graph)
        with torch.set_grad_enabled(grad):  # where gradients can flow decides how state is copied
            compiled = emit_graph(gm, args, plan, bind_devices(plan, options.device_map))
        record = GraphRecord(f"{name} ({span})" if span else name, len(graph), key, source, captured - start,
                             solved - captured if source == "solved" else 0.0, time.perf_counter() - solved,
                             plan, str(path) if path else None, pins)
        self.records.append(record)
        _log_graph(record, graph)
        return compiled

    def _plan(self, graph: OpGraph, key: str, options: CompileOptions, profile: DeviceSet,
              training: bool, pins: dict[str, str]) -> tuple[Plan, str, Any]:
        if self._given:
            return self._given_plan(graph, profile), "given", None
        planning = dict(options.planning(training), pins=pins or None)
        plan, source = self.cache.get(key, graph, profile, planning, options.plan_dir)
        if plan is not None:
            path = self.cache.path(key, options.plan_dir) if options.plan_dir else None
            return plan, source, path
        plan = partition_outcome(graph, None, profile, model_name=graph.name, **planning).plan
        return plan, "solved", self.cache.put(key, plan, options.plan_dir)

    def _given_plan(self, graph: OpGraph, profile: DeviceSet) -> Plan:
        found = graph.fingerprint()
        for plan in self._given:
            if plan.fingerprint == found:
                plan.check_devices(profile)
                return plan
        made = ", ".join(f"{p.model_name!r} ({p.fingerprint})" for p in self._given)
        raise PlanMismatch(
            f"torch.compile handed over graph {graph.name!r} ({len(graph)} ops, fingerprint {found}) but the "
            f"plans given were made for {made}; plans for a compiled model come from backend='hetpart' itself "
            f"(options plan_dir=...); a graph break or another input shape gives another graph"
        )


class ShapeDispatch:
    """The compiled callable of a graph with dynamic shapes: one placed graph per concrete shape.

    ``positions`` are the arguments whose value or shape is symbolic (dynamo lifts each symbolic
    size to an integer argument); their concrete values key the placed graphs.
    """

    def __init__(self, make: Callable[[tuple], Callable[..., Any]], positions: tuple[int, ...]) -> None:
        self._make = make
        self._positions = positions
        self._by_shape: dict[tuple, Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple(_concrete(args[i]) for i in self._positions)
        placed = self._by_shape.get(key)
        if placed is None:
            placed = self._by_shape[key] = self._make(args)
        return placed(*args)

    def __len__(self) -> int:
        return len(self._by_shape)


def surfaced(err: HetpartError, frame: types.FrameType | None) -> HetpartError:
    """``err`` as an exception dynamo lets through unwrapped, its traceback starting at ``frame``.

    dynamo wraps what a backend raises in ``BackendCompilerFailed`` unless it derives from its
    ``ShortenTraceback``; then it re-raises it with dynamo's own frames removed. The result is an
    instance of ``type(err)`` too (``except InfeasiblePlacement`` works) with the same message.
    """
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # an older torch: dynamo wraps the error, whose message is still ours
        return err
    out = _readable(type(err), ShortenTraceback)(*err.args, first_useful_frame=frame)
    out.__dict__.update(err.__dict__)  # any fields the error carries (and its __notes__)
    return out


@functools.cache
def _readable(cls: type[HetpartError], shorten: type) -> type:
    def __init__(self: BaseException, *args: Any, first_useful_frame: types.FrameType | None) -> None:
        # not ShortenTraceback.__init__: it passes keywords on to the builtin base, and errors that
        # are also a ValueError or KeyError (ProfileError, UnitError, UnknownModel) take none
        BaseException.__init__(self, *args)
        self.first_useful_frame = first_useful_frame

    return type(cls.__name__, (cls, shorten), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                               "__init__": __init__})


# --------------------------------------------------------------------------------------------


def _dynamic_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    out = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt) or (
                isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape)):
            out.append(i)
    return tuple(out)


def _concrete(value: Any) -> Any:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else value


def _log_graph(record: GraphRecord, graph: OpGraph) -> None:
    plan = record.plan
    counts: dict[str, int] = {}
    for device in plan.placement.values():
        counts[device] = counts.get(device, 0) + 1
    devices = ", ".join(f"{d} {n} ops" for d, n in sorted(counts.items()))
    gap = plan.solver.gap
    how = (f"solved in {record.solve_s:.2f} s" if record.plan_from == "solved"
           else f"plan cache hit ({record.plan_from})")
    where = f"; plan {record.path}" if record.path else ""
    log.info("hetpart: graph %s: %d ops on %s; predicted %s per call, gap %s; %s%s", record.name, record.ops,
             devices, format_seconds(float(plan.predicted["total_s"])),
             "n/a" if gap is None else f"{gap:.2%}", how, where)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("hetpart: graph %s plan:\n%s", record.name, plan.summary())
    unknown = [op for op in graph.ops.values() if op.op_class is OpClass.OTHER]
    if unknown:
        shown = ", ".join(f"{op.name} ({'/'.join(op.aten_ops) or op.kind})" for op in unknown[:8])
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        log.info("hetpart: graph %s: %d ops the cost model has no class for, costed as memory-bound "
                 "(bytes moved / bandwidth + launch overhead): %s%s", record.name, len(unknown), shown, more)


__all__ = ["GraphRecord", "HetpartBackend", "ShapeDispatch", "graph_name", "surfaced"]
