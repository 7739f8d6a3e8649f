"""The torch backend: a plan runs as an ``nn.Module``, or as one readable Python file.

Modules:

===================  ==============================================================================
Example:
    >>> from backends.torch import BACKEND
    >>> emitted = BACKEND.build(plan, model, {"cuda:0": "cpu"})   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from backends.binding import bind_devices
from backends.compare import CheckReport
from backends.torch.check import check_plan
from backends.torch.live import LiveModule, emit_live
from backends.torch.module import emit_module
from backends.torch.optim import PlacedOptimizer, placed_optimizer
from backends.torch.source import emit_source, source_text
from backends.torch.streaming import WeightStreamer
from backends.torch.strict import StrictRun
from partitioner.ir import OpGraph


class TorchBackend:
    """The plan as an ``nn.Module`` on the devices it names (see the package docstring)."""

    name = "torch"
    runs = ("the plan as an nn.Module: the captured torch graph with explicit .to(device) transfers, "
            "weights on their devices and streamed weights prefetched (or as one Python file)")

    def unsupported(self, graph: OpGraph) -> dict[str, str]:
        """Every op of a graph torch captured runs here; a graph from another front end does not."""
        source = graph.source
        if source is None or isinstance(source, (torch.fx.GraphModule, torch.export.ExportedProgram)):
            return {}
        return {op: f"the graph was captured as {type(source).__name__}, not by torch" for op in graph.ops}

    def bind(self, plan: Any, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
        return bind_devices(plan, device_map)

    def build(self, plan: Any, model: Any, device_map: Mapping[str, str] | None = None, **options: Any) -> Any:
        """:func:`emit_module` (``options``: ``example_inputs``)."""
        return emit_module(plan, model, device_map, **options)

    def check(self, plan: Any, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> CheckReport:
        """:func:`check_plan` (``options``: ``training``, ``repeat``, ``strict_devices``)."""
        return check_plan(plan, model, inputs, device_map, **options)


BACKEND = TorchBackend()

__all__ = ["BACKEND", "StrictRun", "TorchBackend", "WeightStreamer", "LiveModule", "PlacedOptimizer", "check_plan",
           "emit_live", "emit_module", "emit_source", "placed_optimizer", "source_text"]
