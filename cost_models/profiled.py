"""The profiled cost model: measured times where present, the analytic model elsewhere.

In: a :class:`~cost_models.cost_table.CostTable` (a costs file from ``hetpart profile``, or a
profile measured now). Out: :class:`ProfiledCosts`, a :class:`~cost_models.costs.CostModel` that
answers from the measurements — an op's forward (inference), its forward under autograd plus its
backward (training), a copy between two devices (interpolated between measured sizes), an
optimizer step (measured seconds per trainable byte) — and from the analytic model for whatever
was not measured (a device not present here, an op that is new, a training plan on an
inference-only profile). :meth:`ProfiledCosts.record` says, per device, how many ops were priced
from measurements, how many of those were measured while the machine was busy, and which fell
back; an op that failed on a device when measured is unsupported there
(:meth:`ProfiledCosts.unsupported` gives the reason and the problem never places it there).

:func:`resolve_costs` turns ``partition(..., costs=...)`` into a model: ``"analytic"``,
``"profiled"`` (measure the model now, through the local measurement cache), a costs file path,
or a :class:`~cost_models.costs.CostModel`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from cost_models.copies import interpolate
from cost_models.cost_table import CostTable
from cost_models.costs import ANALYTIC, CostModel
from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceSet
from cost_models.training import Optimizer, parse_optimizer
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.ir import Op, OpGraph

__all__ = ["ProfiledCosts", "resolve_costs"]

log = logging.getLogger(__name__)


class ProfiledCosts(CostModel):
    """Measured op, copy and optimizer-step times; the analytic model for the rest.

    ``record()`` reports the lookups made so far: build one per plan.

    Example:
        >>> costs = ProfiledCosts(CostTable.load("costs.json"))           # doctest: +SKIP
        >>> partition(model, inputs, "cpu", costs=costs).costs["model"]   # doctest: +SKIP
        'profiled'
    """

    name = "profiled"

    def __init__(self, table: CostTable, *, source: str | None = None) -> None:
        self.table = table
        self.source = source if source is not None else table.source
        self._measured: dict[str, set[str]] = {}
        self._fell_back: dict[str, set[str]] = {}
        self._copies: dict[tuple[str, str, bool], list[tuple[int, float]]] = {}
        for c in table.copies:
            self._copies.setdefault((c.src, c.dst, c.pinned), []).append((c.nbytes, c.seconds))
        for rows in self._copies.values():
            rows.sort()

    # -- ops ------------------------------------------------------------------------------------

    def op_time(self, op: Op, device: Device) -> Estimate:
        return self._priced(op, device, ("forward_s",), ANALYTIC.op_time, work=1)

    def training_op_time(self, op: Op, device: Device) -> Estimate:
        # work as the analytic Estimate counts it: forward plus a backward of twice the forward's
        return self._priced(op, device, ("train_forward_s", "backward_s"), ANALYTIC.training_op_time, work=3)

    def _priced(self, op: Op, device: Device, fields: tuple[str, ...], fallback: Any, *, work: int) -> Estimate:
        physical = self.table.bind.get(device.name)
        values = [self.table.seconds(op.name, physical, f) for f in fields] if physical else [None]
        if any(v is None for v in values):
            self._fell_back.setdefault(device.name, set()).add(op.name)
            return fallback(op, device)
        self._measured.setdefault(device.name, set()).add(op.name)
        return Estimate(sum(values), float(op.flops) * work, float(op.bytes_read + op.bytes_written) * work)

    def unsupported(self, op: Op, device: Device) -> str | None:
        physical = self.table.bind.get(device.name)
        return self.table.unsupported.get(op.name, {}).get(physical) if physical else None

    # -- copies and optimizer steps -------------------------------------------------------------

    def transfer_time(self, nbytes: float, src: str, dst: str, devices: DeviceSet, *, pinned: bool = True) -> Estimate:
        if src == dst or nbytes <= 0:
            return Estimate()
        bind = self.table.bind
        rows = self._copies.get((bind.get(src, ""), bind.get(dst, ""), pinned)) \
            or self._copies.get((bind.get(src, ""), bind.get(dst, ""), True))
        if not rows:
            return ANALYTIC.transfer_time(nbytes, src, dst, devices, pinned=pinned)
        return Estimate(interpolate(rows, nbytes), 0.0, float(nbytes))

    def optimizer_step_time(self, trainable_bytes: int, device: Device, optimizer: Optimizer | str) -> Estimate:
        if trainable_bytes <= 0:
            return Estimate()
        physical = self.table.bind.get(device.name, "")
        rate = self.table.optimizer.get(physical, {}).get(parse_optimizer(optimizer).value)
        if rate is None:
            return ANALYTIC.optimizer_step_time(trainable_bytes, device, optimizer)
        return Estimate(rate * trainable_bytes, 0.0, float(trainable_bytes))

    # -- what the plan records ------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, "source": self.source,
                               "measured": {d: len(ops) for d, ops in sorted(self._measured.items())}}
        busy = {d: len(ops & set(self.table.busy.get(self.table.bind.get(d, ""), ())))
                for d, ops in sorted(self._measured.items())}
        busy = {d: n for d, n in busy.items() if n}
        if busy:
            out["busy"] = busy
        fell_back = {d: tuple(sorted(ops)) for d, ops in sorted(self._fell_back.items()) if ops}
        if fell_back:
            out["fell_back"] = fell_back
        unsupported = {op: {logical: why for logical, phys in self.table.bind.items() if (why := per.get(phys))}
                       for op, per in self.table.unsupported.items()}
        unsupported = {op: v for op, v in unsupported.items() if v}
        if unsupported:
            out["unsupported"] = unsupported
        return out


def resolve_costs(
    spec: str | os.PathLike[str] | CostModel,
    graph: OpGraph,
    devices: DeviceSet,
    example_inputs: Any = None,
    *,
    training: bool = False,
    optimizer: str = "adam",
    bind: Mapping[str, str] | None = None,
) -> CostModel:
    """The cost model ``partition(..., costs=spec)`` asks for.

    ``"analytic"``: the roofline of the profile. ``"profiled"``: measure ``graph`` now on the
    devices of ``devices`` present here (or ``bind``-ed), through the local measurement cache.
    A path: a costs file written by ``hetpart profile`` for this same graph. A CostModel: itself.

    Raises:
        HetpartError: an unknown spec; a profiled model of a model on the meta device.
        PlanMismatch: the costs file was measured on another graph.

    Example:
        >>> resolve_costs("analytic", graph, load_profile("cpu")).name   # doctest: +SKIP
        'analytic'
    """
    if isinstance(spec, CostModel):
        return spec
    text = os.fspath(spec)
    if text == "analytic":
        return ANALYTIC
    if text == "profiled":
        return _profile_now(graph, devices, example_inputs, training=training, optimizer=optimizer, bind=bind)
    if text.endswith(".json") or os.path.exists(text):
        return _from_file(text, graph)
    raise HetpartError(f"costs={text!r}: use 'analytic', 'profiled', or the path of a costs file written by "
                       f"`hetpart profile MODEL -o costs.json`")


def _from_file(path: str, graph: OpGraph) -> ProfiledCosts:
    table = CostTable.load(path)
    if table.fingerprint != graph.fingerprint():
        raise PlanMismatch(
            f"{path} was measured on model {table.model!r} (fingerprint {table.fingerprint}), not on this graph "
            f"{graph.name!r} (fingerprint {graph.fingerprint()}): the model or its input shapes differ; profile "
            f"it again: hetpart profile MODEL -o {path} --force")
    now = (torch.__version__, torch.get_num_threads())
    if (table.torch, table.threads) != now:
        log.warning("%s was measured with torch %s and %d threads; this process runs torch %s with %d threads: "
                    "its times may not hold here", path, table.torch, table.threads, *now)
    return ProfiledCosts(table, source=path)


def _profile_now(graph: OpGraph, devices: DeviceSet, example_inputs: Any, *, training: bool, optimizer: str,
                 bind: Mapping[str, str] | None) -> ProfiledCosts:
    from cost_models.measure import MeasureOptions
    from cost_models.measure_cache import MeasurementCache
    from cost_models.profiler import profile_graph

    if example_inputs is None:
        raise HetpartError("costs='profiled' measures the model's ops: pass the model and its example inputs")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    cache = MeasurementCache.load()
    profile = profile_graph(graph, args, devices, bind=bind, cache=cache,
                            options=MeasureOptions(training=training, optimizer=optimizer))
    if profile.interrupted:
        raise KeyboardInterrupt
    return ProfiledCosts(profile.table, source=f"measured now (cache {cache.path})")
