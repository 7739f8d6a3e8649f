"""A module that follows the devices' free memory: the plan that fits runs, chosen before each call.

In: a plan carrying fallback plans (``partition(..., fallbacks=[0.75, 0.5])``), the model, a
binding of logical devices, and a probe: a callable returning ``{logical device: bytes available
to this module}``. Out: a :class:`LiveModule` whose ``forward``

1. asks the probe for the memory available now (a device it does not report is not limited);
2. takes the primary plan if it fits, else the first fallback that fits
   (:func:`~partitioner.plan.live.plan_that_fits`: a plan fits where each device's predicted
   ``memory.used`` is at most what is available there); with none fitting it raises
   :class:`~partitioner.errors.NoPlanFits` before any op runs;
3. on a change of plan, logs the switch once (``logging.WARNING``) and builds that plan's module
   from the graph captured at construction (:func:`~backends.torch.module.place_module`: the
   weights copied to the devices of the new plan, carrying over the current values; the old
   plan's module is dropped, freeing its device memory). Nothing is solved or captured here;
4. runs it.

The default probe (:class:`DeviceProbe`) reads each logical device bound to a CUDA device (NVML,
else ``torch.cuda.mem_get_info``) and adds the bytes the running plan's own weights hold there,
since a switch frees them. Logical devices bound to the CPU are not limited. Replace it for tests:
``emit_live(plan, model, probe=lambda: {"cuda:0": 2**20})`` or ``module.probe = fn``.
Inference plans only: a training loop's optimizer holds one plan's parameters.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from backends.binding import bind_devices
from backends.torch.module import (
    PlannedInputs, _input_names, _match_persistence, capture_for, place_module, unlifted_module,
)
from cost_models.live_memory import CudaReader
from cost_models.units import format_bytes
from partitioner.errors import HetpartError
from partitioner.ir import NOT_A_TENSOR
from partitioner.plan.live import plan_labels, plan_needs, plan_that_fits

__all__ = ["DeviceProbe", "LiveModule", "emit_live"]

log = logging.getLogger(__name__)

Probe = Callable[[], Mapping[str, int]]


class LiveModule(torch.nn.Module):
    """Runs the plan that fits the memory available at each call (see the module docstring).

    Attributes:
        probe: the callable asked before each call; assign another to replace it.
        active: index of the plan running (0 primary, ``1 + i`` fallback ``i``), None before the first call.
        labels: ``("primary", "fallback 0.75", ...)``.
        switches: how many times the plan changed.
    """

    def __init__(self, plan: Any, model: torch.nn.Module, device_map: Mapping[str, str] | None = None, *,
                 probe: Probe | None = None, example_inputs: Any = None) -> None:
        super().__init__()
        if plan.training:
            raise HetpartError(f"{plan.source} plans a training step: switching plans runs inference plans only "
                               f"(a training loop's optimizer holds one plan's parameters); emit it with plan.emit")
        plans = (plan, *(f.plan for f in plan.fallbacks))
        binding: dict[str, str] = {}
        for p in plans:  # a fallback may use devices the primary does not
            binding.update(bind_devices(p, device_map))
        graph = capture_for(plan, model, example_inputs)  # once: fallbacks are plans of the same graph
        template = unlifted_module(graph)
        _match_persistence(template, model)
        # plain attributes, not submodules: the template stays on the host and out of state_dict
        object.__setattr__(self, "_template", template)
        object.__setattr__(self, "_tensors", {n for n, t in graph.tensors.items() if t.dtype != NOT_A_TENSOR})
        object.__setattr__(self, "plan", plan)
        self.plans = plans
        self.labels = plan_labels(plan)
        self.binding = binding
        self.needs = tuple(plan_needs(p) for p in plans)
        self.probe: Probe = probe if probe is not None else DeviceProbe(self)
        self.active: int | None = None
        self.switches = 0
        self.placed: torch.fx.GraphModule | None = None
        if plan.inputs:
            self.register_forward_pre_hook(PlannedInputs(plan.inputs, _input_names(model)), prepend=True)

    def choose(self) -> int:
        """The index of the plan that fits the memory the probe reports now (raises NoPlanFits)."""
        available = self.probe()
        if not isinstance(available, Mapping):
            raise HetpartError(f"the memory probe returned {type(available).__name__}; it must return "
                               f"{{device: bytes available}}, e.g. {{'cuda:0': 2**30}}")
        index = plan_that_fits(self.plan, available)
        if index != self.active:
            self._switch(index, available)
        return index

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.choose()
        return self.placed(*args, **kwargs)

    def _switch(self, index: int, available: Mapping[str, int]) -> None:
        previous, old = self.active, self.placed
        if old is not None:  # carry the current weights over, then free the old plan's device memory
            self._template.load_state_dict(old.state_dict())
            self.placed, self.active = None, None  # a failed build below leaves no half-switched module
            del old
        why = ", ".join(f"{d}: {format_bytes(free)} available, {self.labels[index]} needs "
                        f"{format_bytes(self.needs[index].get(d, 0))}" for d, free in available.items())
        if previous is not None:
            self.switches += 1
            log.warning("%s: switching from the %s plan to the %s plan (%s)", self.plan.model_name,
                        self.labels[previous], self.labels[index], why)
        elif index != 0:
            log.warning("%s: starting on the %s plan (%s)", self.plan.model_name, self.labels[index], why)
        with warnings.catch_warnings():  # torch 2.13 warns about its own pytree specs when they are copied
            warnings.simplefilter("ignore", FutureWarning)
            fresh = copy.deepcopy(self._template)
        self.placed = place_module(fresh, self.plans[index], self.binding, tensors=self._tensors)
        self.active = index


class DeviceProbe:
    """The default probe: bytes available to the module on each logical device bound to a CUDA device.

    available(d) = free now on d's CUDA device (NVML, else torch.cuda.mem_get_info)
                   + bytes of the running plan's parameters and buffers on that device

    Logical devices bound to one CUDA device each see all of its free memory (the plans' needs
    there are not added up). ``devices`` (default None: every logical device bound to a CUDA
    device) names the logical devices read, each with the physical device its tensors sit on and
    the CUDA index read for it; with ``reader``, a stand-in of the CUDA memory API, it runs the
    probe on a CPU emulation of a GPU (``tests/unit/test_fallback_memory.py``).
    """

    def __init__(self, live: LiveModule) -> None:
        self.live = live
        self.reader: CudaReader | None = None
        # logical device -> (the physical device its tensors sit on, the CUDA index read for it);
        # None: every logical device bound to a CUDA device (a CPU emulation sets its own)
        self.devices: dict[str, tuple[torch.device, int]] | None = None

    def read(self) -> dict[str, tuple[torch.device, int]]:
        """The logical devices this probe reads: each with its physical device and CUDA index."""
        if self.devices is not None:
            return dict(self.devices)
        out = {}
        for logical, physical in self.live.binding.items():
            match = re.fullmatch(r"cuda(?::(\d+))?", physical)
            if match is not None:
                out[logical] = (torch.device(physical), int(match.group(1) or 0))
        return out

    def __call__(self) -> dict[str, int]:
        out = {}
        for logical, (physical, index) in self.read().items():
            if self.reader is None:
                self.reader = CudaReader()
            reading = self.reader.read(logical, index)
            if reading is not None:
                out[logical] = reading.free + self.resident(physical)
        return out

    def resident(self, device: torch.device) -> int:
        """Bytes of the running plan's parameters and buffers on ``device`` (0 before the first call)."""
        placed = self.live.placed
        if placed is None:
            return 0
        tensors = {id(t): t for t in (*placed.parameters(), *placed.buffers())}
        return sum(t.numel() * t.element_size() for t in tensors.values()
                   if t.device.type == device.type and (t.device.index or 0) == (device.index or 0))


def emit_live(plan: Any, model: torch.nn.Module, device_map: Mapping[str, str] | None = None, *,
              probe: Probe | None = None, example_inputs: Any = None) -> LiveModule:
    """A :class:`LiveModule` for ``plan`` and its fallbacks.

    Raises:
        PlanMismatch: the model is not the one the plan was made for.
        HetpartError: a device of a plan is not present and not bound elsewhere; a training plan.

    Example:
        >>> live = emit_live(plan, model, {"cuda:0": "cpu"}, probe=lambda: {"cuda:0": 2**30})   # doctest: +SKIP
        >>> out = live(*inputs); live.labels[live.active]                                           # doctest: +SKIP
        'primary'
    """
    return LiveModule(plan, model, device_map, probe=probe, example_inputs=example_inputs)
