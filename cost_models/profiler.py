"""Profiling a captured model on this machine: every op on every present device, and the copies.

In: an :class:`~partitioner.ir.OpGraph` captured from a model with real weights, the real example
inputs, a :class:`~cost_models.profiles.DeviceSet` (its logical devices) and optionally a binding
of logical devices to physical ones present here (``{"npu:0": "cpu"}``). Out: a
:class:`Profile`: the :class:`~cost_models.cost_table.CostTable` (what ``hetpart profile`` writes)
and how the run went (interrupted, answers from the cache, stale cache entries skipped).

Each physical device is measured once by :func:`cost_models.measure.measure_ops`, however many
logical devices are bound to it; a logical device that is not present and not bound is not
measured (the profiled model prices it analytically and says so). Copies are measured for the
distinct sizes a plan can cut or stream (at most :data:`~cost_models.copies.MAX_SIZES` per pair,
interpolated between) for every pair of distinct logical devices.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Mapping

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from cost_models.copies import measure_copies, representative_sizes
from cost_models.cost_table import CostTable
from cost_models.machine_load import Meter
from cost_models.measure import MeasureOptions, ProgressFn, measure_ops
from cost_models.measure_cache import MeasurementCache
from cost_models.profiles import DeviceSet
from partitioner.errors import HetpartError
from partitioner.ir import OpGraph

__all__ = ["Profile", "profile_graph", "physical_binding", "runnable"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profiling run: the table and how it went."""

    table: CostTable
    interrupted: bool = False   # stopped by KeyboardInterrupt: the table (and the cache) hold what was measured
    cached: int = 0             # op measurements (kind, signature, device) answered by the cache alone
    stale: int = 0              # lookups that found only entries of another torch version or thread count
    passes: int = 0             # timed passes over the graph


def physical_binding(devices: DeviceSet, bind: Mapping[str, str] | None = None) -> dict[str, str]:
    """Logical device -> physical device to measure it on: ``bind`` first, else the device itself
    when it is present here (``cpu`` always is); devices neither bound nor present are left out.

    Raises:
        HetpartError: ``bind`` names a device the profile does not have, or a physical device
            that is not present.

    Example:
        >>> physical_binding(load_profile("cpu-gpu-npu"), {"npu:0": "cpu"})   # doctest: +SKIP
        {'cpu': 'cpu', 'npu:0': 'cpu'}
    """
    from backends.binding import present

    bind = dict(bind or {})
    unknown = [d for d in bind if d not in devices.names()]
    if unknown:
        raise HetpartError(f"--bind {unknown[0]}=...: the profile {devices.name!r} has no device {unknown[0]!r}; "
                           f"its devices are {', '.join(devices.names())}")
    out = {}
    for name in devices.names():
        physical = bind.get(name, name)
        if present(physical):
            out[name] = str(torch.device(physical))
        elif name in bind:
            raise HetpartError(f"--bind {name}={physical}: {physical} is not present on this machine "
                               f"(CUDA available: {torch.cuda.is_available()}); bind it to cpu")
    return out


def runnable(graph: OpGraph, args: tuple) -> torch.fx.GraphModule:
    """The GraphModule to run ``graph`` with (``ExportedProgram.module()`` or the traced module).

    Raises:
        HetpartError: the graph keeps no runnable module, or its weights or inputs are on the meta
            device (profiling runs the ops: build the model with real weights).
    """
    source = graph.source
    if isinstance(source, torch.export.ExportedProgram):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            gm = source.module()
    elif isinstance(source, torch.fx.GraphModule):
        gm = source
    else:
        raise HetpartError(f"graph {graph.name!r} keeps no runnable module ({type(source).__name__}); capture it "
                           f"from an nn.Module to profile it")
    tensors = [*gm.parameters(), *gm.buffers(), *(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))]
    if any(t.is_meta for t in tensors):
        raise HetpartError(f"model {graph.name!r} has its weights or inputs on the meta device: measuring runs its ops, "
                           f"so build it with real weights (not device='meta'), or plan with costs='analytic'")
    return gm


def profile_graph(
    graph: OpGraph,
    args: tuple,
    devices: DeviceSet,
    *,
    bind: Mapping[str, str] | None = None,
    options: MeasureOptions = MeasureOptions(),
    cache: MeasurementCache | None = None,
    progress: ProgressFn | None = None,
    model_name: str | None = None,
    meter: Meter | None = None,
) -> Profile:
    """Measure every op of ``graph`` on each device of ``devices`` present here (or bound), and
    the copies between them (see the module docstring). ``meter`` reads the machine's load while
    measuring (default :class:`~cost_models.machine_load.LoadMeter`); the table lists the ops
    measured while it was busy (:attr:`CostTable.busy <cost_models.cost_table.CostTable.busy>`).

    Example:
        >>> module, inputs = models.get("gpt", "tiny")
        >>> profile = profile_graph(from_module(module, inputs), inputs, load_profile("cpu"))  # doctest: +SKIP
        >>> profile.table.seconds("linear", "cpu", "forward_s")                              # doctest: +SKIP
        4.9e-06
    """
    cache = cache if cache is not None else MeasurementCache()
    binding = physical_binding(devices, bind)
    if not binding:
        raise HetpartError(f"no device of profile {devices.name!r} is present here; bind one, e.g. --bind "
                           f"{devices.names()[-1]}=cpu")
    gm = runnable(graph, args)
    signatures: dict[str, str] = {}
    times: dict[str, dict[str, dict[str, float | None]]] = {}
    unsupported: dict[str, dict[str, str]] = {}
    optimizer: dict[str, dict[str, float]] = {}
    busy: dict[str, set[str]] = {}
    interrupted, passes, cached, stale = False, 0, 0, 0
    for physical in dict.fromkeys(binding.values()):
        measured = measure_ops(gm, args, physical, options=options, cache=cache, progress=progress, meter=meter)
        passes, cached, stale = passes + measured.passes, cached + measured.cached, stale + measured.stale
        busy[physical] = {op for op in measured.busy if op in graph.ops}
        for op, t in measured.ops.items():
            if op not in graph.ops:
                continue   # export's guard module and other nodes that are not ops of the graph
            signatures.setdefault(op, t.signature)
            times.setdefault(op, {})[physical] = {"forward_s": t.forward_s, "train_forward_s": t.train_forward_s,
                                                  "backward_s": t.backward_s}
        for op, why in measured.unsupported.items():
            if op in graph.ops:
                unsupported.setdefault(op, {})[physical] = why
        if measured.optimizer_s_per_byte:
            optimizer[physical] = dict(measured.optimizer_s_per_byte)
        if measured.interrupted:
            interrupted = True
            break
    copies = ()
    if not interrupted:
        try:
            copies = tuple(measure_copies(_cut_sizes(graph), _pairs(binding), cache=cache, progress=progress,
                                          repeats=options.repeats))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            cache.save()
    env_threads = torch.get_num_threads() if options.threads is None else options.threads
    table = CostTable(
        model=model_name or graph.name, fingerprint=graph.fingerprint(), torch=torch.__version__,
        threads=env_threads, bind=binding, signatures=signatures, times=times, unsupported=unsupported,
        optimizer=optimizer, copies=copies, busy=busy,
    )
    return Profile(table, interrupted, cached, stale, passes)


def _cut_sizes(graph: OpGraph) -> list[int]:
    """The sizes a plan may copy: tensors read by some op, and each op's own weights (streamed)."""
    sizes = [t.nbytes for t in graph.tensors.values() if t.consumers and t.nbytes > 0]
    sizes += [op.param_bytes for op in graph.ops.values() if op.param_bytes > 0]
    return representative_sizes(sizes)


def _pairs(binding: Mapping[str, str]) -> list[tuple[str, str]]:
    """Physical (source, destination) of every ordered pair of distinct logical devices."""
    return list(dict.fromkeys((binding[a], binding[b]) for a in binding for b in binding if a != b))

