"""The torch backend: a plan runs as an ``nn.Module``, or as one readable Python file.

Modules:

====================  ==============================================================================
module                what it does
====================  ==============================================================================
``module``            :func:`emit_module`: the captured graph with explicit transfers, weights on their
                      devices, the plan's issue order and streamed weights (``Plan.emit``);
                      ``place_module``: the same steps on a graph captured elsewhere (``backends.compile``)
``from_checkpoint``   ``emit_from_checkpoint``: the same module from a model folder, each weight read from
                      its shard straight into its home (``checkpoint_files``, ``checkpoint_keys``,
                      ``checkpoint_load``: headers, key matching, bounded loading; ``Plan.emit("./folder")``)
``source``            :func:`emit_source`: the same placement as one readable Python file
                      (``Plan.emit_source``); a generator in three parts (layout, forward, template)
``streaming``         :class:`WeightStreamer`: host-resident weights copied to the computing device per
                      call, prefetched on a CUDA side stream
``precision``         :func:`apply_precision`: casts where the plan computes in 16 bits, float32 master
                      weights in training, :class:`LossScaler` for float16 training
``sparse_grads``      a training plan's row-sparse tables: their gathers called with ``sparse=True``
``train_streaming``   streamed weights in training: fetched again in backward, not kept
``recompute``         the ops a training plan recomputes, under ``torch.utils.checkpoint`` per run
``optim``             :func:`placed_optimizer`: the training step's ``torch.optim.Optimizer``, each
                      parameter's state and step on its planned device, host steps beside backward
                      (``Plan.emit_optimizer``)
``training_check``    ``check_training_steps``: N optimizer steps of the emitted module beside eager
``check``             :func:`check_plan`: the emitted module beside the original, outputs and gradients
``strict``            :class:`StrictRun`: an emitted module (or generated file) under strict devices
``live``              :func:`emit_live`: a plan with its fallback plans; before each call the one that
                      fits the memory free now runs (a probe reads it; switches are logged)
====================  ==============================================================================

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
        """:func:`emit_module` (``options``: ``example_inputs``); from a model folder,
        :func:`~backends.torch.from_checkpoint.emit_from_checkpoint` (each weight read into its home)."""
        from partitioner.frontends.hf_folder import is_model_folder

        if is_model_folder(model):
            from backends.torch.from_checkpoint import emit_from_checkpoint

            return emit_from_checkpoint(plan, model, device_map, **options)
        return emit_module(plan, model, device_map, **options)

    def check(self, plan: Any, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> CheckReport:
        """:func:`check_plan` (``options``: ``training``, ``repeat``, ``strict_devices``)."""
        return check_plan(plan, model, inputs, device_map, **options)


BACKEND = TorchBackend()

__all__ = ["BACKEND", "StrictRun", "TorchBackend", "WeightStreamer", "LiveModule", "PlacedOptimizer", "check_plan",
           "emit_live", "emit_module", "emit_source", "placed_optimizer", "source_text"]
