"""The torch.compile backend: ``torch.compile(model, backend="hetpart")`` places every graph it is handed.

After ``pip install hetpart`` the name ``"hetpart"`` is found through the ``torch_dynamo_backends``
entry point, with no import; :data:`hetpart` is the same callable for ``backend=hetpart``::

    compiled = torch.compile(model, backend="hetpart", options={
        "devices": "h200-host", "memory": {"cuda:0": "4GB"}, "objective": "latency",
        "pins": {"emb*": "cpu"}, "device_map": {}, "training": None, "time_limit": 10, "plan_dir": "plans/"})

The options are the fields of :class:`CompileOptions` (one comment each); an unknown one is an
error that lists them.

Design notes
------------

* **Per graph.** Each graph dynamo hands over (a graph break gives several) is captured with
  :func:`partitioner.from_graph_module`, planned with :func:`partitioner.partition_outcome`,
  bound (``device_map``) and emitted by :func:`backends.compile.emit.emit_graph`, which reuses the
  torch backend's placement pass (:func:`backends.torch.module.place_module`).
* **Training.** The compiled callable runs under eager autograd: dynamo calls it with gradients
  on, and each op's backward runs on the device its forward ran on, so the plan's placement holds
  for both passes (the training plan costs both, and holds gradients and optimizer state with the
  parameters). Gradients of a parameter used on another device flow back through its ``.to``, so
  ``loss.backward()`` fills the caller's ``p.grad`` and an optimizer over ``model.parameters()``
  steps the original parameters. ``training=None`` (the default) plans for training when the
  graph is compiled with grad mode on and a parameter that requires grad (dynamo guards on both,
  so ``torch.no_grad()`` inference compiles its own graph with its own inference plan).
* **Model state.** dynamo passes parameters and buffers as arguments on every call. The backend
  never moves the caller's tensors; one read on another device is copied once and kept where no
  gradient flows to it, streamed with prefetch where the plan streams it, and copied on each call
  (differentiably) in training (:mod:`backends.compile.state`). State the graph updates in place
  (BatchNorm's running statistics) is never kept: a copy on another device is written back to the
  caller's buffer at the end of each call (:mod:`backends.compile.mutation`).
* **Pins** are the model's module paths (``model.named_modules()``), as for ``partition``: dynamo's
  own names (``L['self'].h[0]``, ``L['args'][0].model`` under transformers' decorators) are read as
  the model's, and a graph break inside a submodule keeps the paths of the model that was compiled
  (:mod:`backends.compile.graphs`). Each pin applies to the graphs whose ops it matches; one that
  matches no op of a graph and no module of the model is refused on the first graph; one naming a
  module this graph does not run is logged (INFO). Op names are per graph under torch.compile.
* **Plan cache.** Plans are cached per graph, keyed by the graph's fingerprint, the shapes and
  dtypes of its inputs and parameters, and every option that changes a plan (all but
  ``device_map`` and ``plan_dir``; ``time_limit`` included, the pins the graph matched)
  (:mod:`backends.compile.cache`): recompiling the same graph does not solve again. With
  ``plan_dir`` the plans are saved there and later processes reuse them; a file that does not load
  or verify, was made for another graph or device set, or records other options (objective,
  training, optimizer, streaming, pins, solver, gap, module paths) is solved again with a warning
  naming it and why, never used. Saved plans are ordinary plan files (``hetpart report``,
  ``hetpart explain``).
* **New shapes get their own plan.** A static graph recompiled for a new shape (a guard failure) is
  a new graph with a new key; a dynamic graph (``dynamic=True``, or dynamo's automatic dynamic
  shapes after a second shape) is planned per concrete shape on its first call at that shape
  (:class:`~backends.compile.backend.ShapeDispatch`). A plan is never reused for another shape:
  memory caps are checked for the shapes planned, and the best placement depends on the batch
  size. A shape seen before costs one dictionary look-up.
* **Logging.** ``logging.getLogger("hetpart")``: one INFO line per graph and shape, the graph named by
  the model's class, dynamo's compile id and its first and last module
  (``GPTNeoForCausalLM [0/0] (transformer.wte … lm_head)``; ops, devices used,
  predicted time per call, gap, cache hit or solve seconds, plan file), the plan summary at DEBUG,
  and an INFO line naming ops the cost model has no class for (costed as memory-bound: bytes over
  bandwidth plus launch overhead). ``HetpartBackend.records`` keeps the same per graph.
* **Errors** (an unknown or ill-typed option, named; a bad profile or cap; memory caps no placement
  fits; a device not present and not bound) reach the user from inside ``torch.compile`` as the
  hetpart error itself (``ProfileError``, ``UnitError``, ...), its sentence intact, dynamo's frames
  cut. Every option is checked before anything is captured.

Modules:

===========  ===================================================================================
module       what it does
===========  ===================================================================================
``backend``  :class:`HetpartBackend` (the dynamo backend, its records), ``ShapeDispatch``
``options``  :class:`CompileOptions` and :func:`parse_options`
``cache``    :class:`PlanCache`: plans by graph, shapes and options, in memory and in ``plan_dir``
``graphs``   the model behind a graph (its module paths under a break), graph names, pins per graph
``emit``     :func:`emit_graph`: dynamo's graph rewritten to run a plan
``state``    parameters and buffers on the devices the plan names: kept copies, streaming
``mutation``  the inputs a graph updates in place (written back when placed elsewhere)
``strict``   :class:`StrictCompile`: compiled graphs run under strict devices (logical devices that differ)
===========  ===================================================================================

Example:
    >>> import torch, models
    >>> model, inputs = models.get("mlp", "tiny")
    >>> compiled = torch.compile(model, backend=hetpart, options={"devices": "cpu"})
    >>> torch.testing.assert_close(compiled(*inputs), model(*inputs))
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from backends.binding import bind_devices
from backends.compare import CheckReport
from backends.compile.backend import GraphRecord, HetpartBackend, ShapeDispatch, surfaced
from backends.compile.cache import PlanCache, cache_key
from backends.compile.emit import emit_graph
from backends.compile.options import CompileOptions, parse_options
from backends.torch import BACKEND as TORCH
from backends.torch.check import check_plan
from partitioner.ir import OpGraph

#: The backend ``torch.compile(model, backend="hetpart")`` finds through the entry point.
hetpart = HetpartBackend()


class CompileBackend:
    """The execution-target interface (:mod:`backends.interface`) for models under torch.compile."""

    name = "compile"
    runs = ("a model under torch.compile: each graph dynamo hands over is planned (or its cached plan "
            "reused) and runs as a placed torch.fx graph")

    def unsupported(self, graph: OpGraph) -> dict[str, str]:
        """The ops the emitted graph cannot run: those of a graph torch did not capture."""
        return TORCH.unsupported(graph)

    def bind(self, plan: Any, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
        return bind_devices(plan, device_map)

    def build(self, plan: Any, model: Any, device_map: Mapping[str, str] | None = None, **options: Any) -> Any:
        """``model`` compiled with ``plan`` for the graph it was made for (a plan from ``plan_dir``);
        a graph without a plan is a :class:`~partitioner.errors.PlanMismatch` on the first call.
        ``options``: further :class:`CompileOptions` (``devices`` is the plan's device set)."""
        given = dict(options, devices=plan.devices, device_map=dict(device_map or {}))
        return torch.compile(model, backend=HetpartBackend(plans=(plan,)), options=given)

    def check(self, plan: Any, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              training: bool = False, repeat: int = 5) -> CheckReport:
        """:func:`~backends.torch.check.check_plan` with a compiled copy of ``model`` in place of the
        emitted module (parameter names and gradients compare one to one)."""
        def build(reference: torch.nn.Module) -> torch.nn.Module:
            compiled = copy.deepcopy(reference)
            compiled.compile(backend=HetpartBackend(plans=(plan,)),
                             options={"devices": plan.devices, "device_map": dict(device_map or {}),
                                      "training": training})
            return compiled

        return check_plan(plan, model, inputs, device_map, training=training, repeat=repeat, build=build)


BACKEND = CompileBackend()

__all__ = [
    "BACKEND", "CompileBackend", "CompileOptions", "GraphRecord", "HetpartBackend", "PlanCache", "ShapeDispatch",
    "cache_key", "emit_graph", "hetpart", "parse_options", "surfaced",
]
