"""Code generation as source: a plan becomes one readable Python file that runs its placement.

In: a :class:`~partitioner.plan.Plan`, the model it was made for, and a binding of the plan's
logical devices to real ones (as for :func:`~backends.torch.module.emit_module`).
Out: the text of a Python module (:func:`source_text`) or that file written atomically
(:func:`emit_source`). The file holds

* a header comment with the plan's metadata (model, fingerprint, profile, objective, prediction,
  binding), one ``DEVICE_*`` constant per logical device (edit it to re-bind), a few helpers;
* ``class PartitionedModel(torch.nn.Module)``: ``__init__`` re-creates the model's parameter and
  buffer tree under the same qualified names (empty tensors on their devices; tied tensors
  registered once and aliased), so ``load_state_dict(model.state_dict())`` fills it; ``forward``
  is the captured aten graph in the plan's issue order, one commented part per device run, with
  an explicit ``.to(DEVICE_...)`` wherever a value crosses logical devices and streamed weights
  fetched through hetpart's :class:`~backends.torch.streaming.WeightStreamer`;
* ``def build(weights) -> PartitionedModel``: the module with the model's weights loaded from the
  original model, its state_dict, a ``torch.save``'d state-dict file, or a model folder (each
  weight read from its shard into the tensor ``__init__`` made on its device:
  :func:`backends.torch.checkpoint_load.load_folder_into`) (``load_weights``);
  ``PartitionedModel()`` alone has empty parameters;
* written with ``training=True`` (a training plan): ``def build_optimizer(module, **hyper)``, the
  plan's placed optimizer over the module (:mod:`.optimizer`).

It behaves as ``plan.emit(model, device_map)``: same parameter homes, streamed weights, issue
order and factory devices, and for a training plan the same row-sparse gathers, streamed weights
fetched again in backward (hetpart's ``TrainingStreamer``) and recomputed runs (nested functions
called through ``torch.utils.checkpoint``, :mod:`.recompute`); transfers are written per *logical* device pair, so a copy between
two devices bound to one physical device is a no-op rather than absent.

Safety: nothing the model or the plan file supplies (module and parameter names, node names, the
model name, device names) is pasted into code. Identifiers are generated or pass a strict
``[A-Za-z_][A-Za-z0-9_]*`` filter with a uniqueness suffix; names appear only as ``ascii()``
string literals, and in comments only when they are plain (``[A-Za-z0-9_.:/+-]``) or else as an
``ascii()`` literal, so no newline can end a comment. The file is generated from the exported
program's *lifted* graph, never from ``ExportedProgram.module()``, whose fx-generated code
embeds attribute names between quotes unescaped.

The generator has three parts: :mod:`.layout` (where every parameter, buffer and constant lives,
in the plan's logical devices), :mod:`.forward` (the forward, printed part by part from the
lifted graph) and :mod:`.template` (names, literals and the text of the file around them), and
:mod:`.optimizer` writes the training step's optimizer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.fx

from backends.binding import bind_devices
from backends.strict_devices import Site
from backends.torch.module import capture_for
from backends.torch.source.forward import ForwardPrinter
from backends.torch.source.layout import plan_layout, tensor_placeholders
from backends.torch.sparse_grads import mark_sparse_gradients
from backends.torch.source.optimizer import optimizer_source
from backends.torch.source.template import Names, render
from partitioner.errors import HetpartError, VerificationError
from partitioner.files import refuse_overwrite, write_atomic

__all__ = ["emit_source", "op_lines", "source_text"]


log = logging.getLogger(__name__)


def emit_source(
    plan: Any,
    model: torch.nn.Module,
    path: str | os.PathLike[str],
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
    force: bool = False,
    training: bool = False,
) -> Path:
    """Write the Python file that runs ``plan`` (see the module docstring); returns its path.

    Raises:
        HetpartError: ``path`` exists and ``force`` is false, or it cannot be written; a device is
            not present and not bound; the plan was not captured with torch.export.
        PlanMismatch: the model is not the one the plan was made for.
        UnsupportedOp: the graph holds a call the file cannot spell (a higher-order op).

    Example:
        >>> emit_source(plan, model, "placed.py", {"cuda:0": "cpu"})   # doctest: +SKIP
        PosixPath('placed.py')
    """
    path = Path(path)
    refuse_overwrite([path], force=force)
    text = source_text(plan, model, device_map, example_inputs=example_inputs, training=training)
    write_atomic(path, text.encode("utf-8"))
    log.info("wrote %s (%d lines)", path, text.count("\n"))
    return path


def source_text(
    plan: Any,
    model: torch.nn.Module,
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
    training: bool = False,
) -> str:
    """The text of the file :func:`emit_source` writes, checked to compile (``training``: with
    ``build_optimizer``, the plan's placed optimizer, :mod:`.optimizer`).

    Example:
        >>> "class PartitionedModel" in source_text(plan, model, {"cuda:0": "cpu"})   # doctest: +SKIP
        True
    """
    return _generate(plan, model, device_map, example_inputs, training)[0]


def op_lines(
    plan: Any,
    model: torch.nn.Module,
    device_map: Mapping[str, str] | None = None,
    *,
    example_inputs: Any = None,
) -> dict[int, Site]:
    """What each line of the forward of the file :func:`emit_source` writes does, by line number:
    the plan op it runs, or the tensor it copies (for :class:`backends.torch.strict.StrictRun`).

    Example:
        >>> run.watch(generated, op_lines(plan, model, run.device_map))   # doctest: +SKIP
    """
    return _generate(plan, model, device_map, example_inputs)[1]


def _generate(plan: Any, model: torch.nn.Module, device_map: Mapping[str, str] | None,
              example_inputs: Any, training: bool = False) -> tuple[str, dict[int, Site]]:
    from partitioner.plan.precision import refuse_precision

    refuse_precision(plan, "emit_source (the generated file)")
    from partitioner.frontends.hf_folder import is_model_folder

    from_folder = is_model_folder(model)
    if from_folder:  # a model folder: its hollow model is captured; build("./folder") loads it
        from backends.torch.from_checkpoint import open_planned

        model = open_planned(plan, model).module
    if plan.capture != "export":
        raise HetpartError(f"emit_source needs a plan captured with torch.export, not {plan.capture!r}: "
                           f"re-plan with capture='export' (CLI: --capture export)")
    binding = bind_devices(plan, device_map)
    program = capture_for(plan, model, example_inputs).source  # a fresh capture: its graph is ours to change
    mark_sparse_gradients(plan, {n.name: n for n in program.graph_module.graph.nodes}, _readers(program, model))
    names = Names()
    layout = plan_layout(plan, model, program, binding, names)
    optimizer = optimizer_source(plan, layout) if training else None
    text, sites = render(plan, layout, ForwardPrinter(plan, program, layout, names).lines(), optimizer,
                         from_folder=from_folder)
    try:
        compile(text, "<hetpart source>", "exec", dont_inherit=True)
    except SyntaxError as err:  # a generator bug, never the user's: say where
        raise VerificationError(f"generated source does not compile at line {err.lineno}: {err.msg}") from err
    return text, sites


def _readers(program: Any, model: torch.nn.Module) -> dict[str, list[torch.fx.Node]]:
    """Each lifted tensor's name → every op reading it under any of its names (tied weights)."""
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    groups: dict[int, list[str]] = {}
    placeholders = tensor_placeholders(program)
    for target in placeholders:
        groups.setdefault(id(named.get(target, placeholders[target])), []).append(target)
    out: dict[str, list[torch.fx.Node]] = {}
    for targets in groups.values():
        readers = list(dict.fromkeys(u for t in targets for u in placeholders[t].users if u.op != "output"))
        out.update({t: readers for t in targets})
    return out
