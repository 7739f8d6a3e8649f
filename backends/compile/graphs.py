"""What the backend knows of the model behind a graph: its modules, the graph's name, its pins.

In: dynamo's ``GraphModule`` while dynamo is compiling it, and the captured
:class:`~partitioner.ir.OpGraph`. Out: the model compiled (:func:`model_of`, read from the frame
dynamo traces) and, for a graph break inside a submodule, the model that was compiled and the
submodule's name in it (:func:`qualified`, :func:`under`), a name for logs and plans (:func:`graph_name`: ``GPTNeoForCausalLM [0/0]``, and
:func:`graph_span`: ``transformer.wte … lm_head``), and the pins that apply to this graph
(:func:`graph_pins`).

Pins under torch.compile. A graph break cuts a model into several graphs, each planned alone, so a
pin applies to the graphs whose ops it matches (op name or module path, as ``partition``'s pins)
and is left out of the others. A pin that matches no op of a graph and no module of the model is
a typo, refused on the first graph compiled (before anything runs), as ``partition`` refuses it; a
pin naming a module of the model that this graph does not run (another graph's, or a module with
no ops, such as an ``nn.Identity``) is logged at INFO for that graph. When the model cannot be
read from dynamo's frame (a compiled function that takes no module) an unmatched pin is a warning:
it may match another graph.

Example:
    >>> graph_pins(graph, {"layers.0*": "cpu", "head": "cuda:0"}, modules={"", "layers.0", "head"})  # doctest: +SKIP
    {'layers.0*': 'cpu'}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import logging
from collections.abc import Collection, Mapping
from typing import Any

import torch
import torch.fx

from partitioner.errors import HetpartError
from partitioner.ir import Op, OpGraph

log = logging.getLogger("hetpart.compile")


def model_of() -> torch.nn.Module | None:
    """The module whose code dynamo is compiling now (``self`` of the traced forward, the module a
    decorator's wrapper took as ``args[0]``, or the module a compiled function was called with), or
    None: outside a compile, or when the frame holds no module.

    It reads dynamo's current frame, which dynamo does not document; any change there gives None,
    and the backend then names graphs by their code and warns on pins it cannot place.
    """
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        frame_locals = InstructionTranslator.current_tx().f_locals
    except (ImportError, AttributeError):
        return None
    return _module_in(frame_locals)


def qualified(model: torch.nn.Module | None) -> tuple[torch.nn.Module | None, str]:
    """The model a graph belongs to and the qualified name of ``model`` in it.

    A graph break inside a submodule's forward makes dynamo compile that forward as a frame of its
    own, whose module paths start at the submodule (``conv_layers.0``). The model the user compiled
    is running further up the stack (``torch.compile(model)``'s wrapper, or ``model.compile()``'s
    call); when it holds ``model``, the graph is its graph, under ``model``'s name there
    (``wav2vec2.feature_extractor``). Otherwise ``model`` is the model (a function compiled and
    called with it, or a model compiled on its own).

    Example:
        >>> qualified(model.encoder)   # while torch.compile(model) runs   # doctest: +SKIP
        (model, 'encoder')
    """
    if model is None:
        return None, ""
    for root in _compiled_roots():  # innermost first
        if root is model:
            return model, ""
        name = next((n for n, m in root.named_modules(remove_duplicate=False) if m is model), None)
        if name is not None:
            return root, name
    return model, ""


def under(graph: OpGraph, prefix: str) -> OpGraph:
    """``graph`` with ``prefix`` before every module path (``""``: ``graph`` itself)."""
    if not prefix:
        return graph

    def name(path: str) -> str:
        return f"{prefix}.{path}" if path else prefix

    ops = [dataclasses.replace(op, module_path=name(op.module_path)) for op in graph.ops.values()]
    return OpGraph(graph.name, ops, graph.tensors.values(), graph.params.values(), graph.inputs, graph.outputs,
                   source=graph.source, module_types={name(p): t for p, t in graph.module_types.items()})


def _module_in(frame_locals: Mapping[str, Any]) -> torch.nn.Module | None:
    own = frame_locals.get("self")
    if isinstance(own, torch.nn.Module):
        return own
    for value in frame_locals.values():  # a wrapper's *args / **kwargs, or a function's argument
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else (value,)
        found = next((v for v in items if isinstance(v, torch.nn.Module)), None)
        if found is not None:
            return found
    return None


def _compiled_roots() -> list[torch.nn.Module]:
    """The models being run under torch.compile now, innermost first: the model of each
    ``torch.compile(model)`` wrapper on the Python stack, and each ``model.compile()``-ed model."""
    from torch._dynamo.eval_frame import OptimizedModule

    out: list[torch.nn.Module] = []
    frame = inspect.currentframe()
    while frame is not None:
        module = _module_in(frame.f_locals)
        if isinstance(module, OptimizedModule) and isinstance(module._orig_mod, torch.nn.Module):
            out.append(module._orig_mod)
        elif module is not None and getattr(module, "_compiled_call_impl", None) is not None:
            out.append(module)
        frame = frame.f_back
    return out


def graph_name(gm: torch.fx.GraphModule, model: torch.nn.Module | None) -> str:
    """``GPTNeoForCausalLM [0/0]``: the class of the model compiled (or, for a function, the code
    dynamo traced) and dynamo's compile id (frame/recompile: graphs after a break get frames of
    their own)."""
    if model is not None:
        root = type(model).__name__
    else:
        context = torch._guards.TracingContext.try_get()
        codes = getattr(context, "traced_code", None) or []
        root = getattr(codes[0], "co_qualname", codes[0].co_name) if codes else "graph"
    compile_id = getattr(gm, "meta", {}).get("dynamo_compile_id")
    return f"{root} [{compile_id}]" if compile_id is not None else root


def graph_span(graph: OpGraph) -> str:
    """``transformer.wte … lm_head``: the modules of the graph's first and last ops (in order), or
    ``""`` when no op has a module path."""
    paths = [op.module_path for op in graph.topological_order() if op.module_path]
    if not paths:
        return ""
    return paths[0] if paths[0] == paths[-1] else f"{paths[0]} … {paths[-1]}"


def graph_pins(graph: OpGraph, pins: Mapping[str, str], modules: Collection[str] | None) -> dict[str, str]:
    """The pins that apply to ``graph``: those matching an op's name or module path.

    ``modules`` are the module paths of the model compiled (None: unknown).

    Raises:
        HetpartError: a pin that matches no op of the graph and no module of the model.

    Example:
        >>> graph_pins(graph, {"head": "cuda:0"}, modules={"", "head"})  # doctest: +SKIP
        {'head': 'cuda:0'}
    """
    applied = {pattern: device for pattern, device in pins.items() if _matches_an_op(graph, pattern)}
    elsewhere = []
    for pattern in pins:
        if pattern in applied:
            continue
        if modules is None or any(_matches(path, pattern) for path in modules if path):
            elsewhere.append(pattern)
        else:
            shown = ", ".join(sorted({op.module_path for op in graph.ops.values() if op.module_path})[:3])
            raise HetpartError(
                f"pin {pattern!r} matches no module of the model and no op name or module path of graph "
                f"{graph.name!r}; module paths look like {shown or '(none)'}: pin by the model's module "
                f"paths (model.named_modules())")
    if elsewhere and modules is None:
        log.warning("hetpart: graph %s: pins %s match none of its ops (they may match another graph's)",
                    graph.name, ", ".join(map(repr, elsewhere)))
    elif elsewhere:
        log.info("hetpart: graph %s: pins %s name modules of the model that this graph does not run (another "
                 "graph's, or modules without ops); not applied here", graph.name, ", ".join(map(repr, elsewhere)))
    return applied


def pin_matches(op: Op, pattern: str) -> bool:
    """Whether the pin ``pattern`` names ``op``: its name or module path, exactly or as a glob
    (the rule of ``partition``'s pins)."""
    return _matches(op.name, pattern) or bool(op.module_path and _matches(op.module_path, pattern))


def _matches_an_op(graph: OpGraph, pattern: str) -> bool:
    return any(pin_matches(op, pattern) for op in graph.ops.values())


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


def module_paths(model: Any) -> set[str] | None:
    """The qualified names of every module of ``model`` (None for no model)."""
    if not isinstance(model, torch.nn.Module):
        return None
    return {name for name, _ in model.named_modules(remove_duplicate=False)}


__all__ = ["graph_name", "graph_pins", "graph_span", "model_of", "module_paths", "pin_matches", "qualified", "under"]
