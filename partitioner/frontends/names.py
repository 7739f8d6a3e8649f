"""The names torch.fx writes into Python code, and the guard that keeps them from running.

In: a model (or a GraphModule about to be compiled). Out: nothing, or a
:class:`~partitioner.errors.CaptureError` naming the first attribute whose name torch.fx cannot
write safely, and what to do.

torch.fx generates ``forward`` as Python source. Every ``get_attr`` and ``call_module`` target is
written as ``self.a.b`` when a component is an identifier and as ``getattr(self, "a b")`` when it
is not, with the text pasted between the quotes unescaped (``torch.fx.graph._format_target``).
Those targets are the qualified names of the model's submodules, parameters, buffers and plain
tensor attributes (the constants torch.export lifts, which ``ExportedProgram.module()`` sets back
as attributes). So a name holding ``"`` runs as code, and a keyword (``class``, ``lambda``,
``import``) is a SyntaxError. The guard accepts a component only when it is letters, digits and
underscores and not a Python keyword: such a name is written either as ``self.name`` or, when it
starts with a digit (``layers.0``), between quotes where nothing can break out. Node names,
placeholders and method names are made identifiers by fx itself.

Example:
    >>> import torch
    >>> m = torch.nn.Module(); setattr(m, "class", torch.nn.Linear(2, 2))
    >>> check_fx_names(m, "plan.emit")                      # doctest: +SKIP
    Traceback (most recent call last):
    CaptureError: submodule 'class': it is a Python keyword, and torch.fx would write it ...
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable, Iterator

import torch
import torch.fx

from partitioner.errors import CaptureError

__all__ = ["attribute_names", "check_fx_names", "check_graph_targets", "unsafe_component"]

_ATOM = re.compile(r"[A-Za-z0-9_]+")


def unsafe_component(qualified: str) -> str | None:
    """Why torch.fx cannot write a dotted name safely (naming the component), or None if it can.

    Example:
        >>> unsafe_component("layers.0.fc"), unsafe_component("blocks.class.w")
        (None, "its component 'class' is a Python keyword")
    """
    for atom in qualified.split("."):
        where = "it" if atom == qualified else f"its component {_short(atom)}"
        if not _ATOM.fullmatch(atom):
            return f"{where} holds characters other than letters, digits and _"
        if keyword.iskeyword(atom):
            return f"{where} is a Python keyword"
    return None


def _short(name: str, limit: int = 60) -> str:
    """``ascii(name)``, cut to ``limit`` characters."""
    text = ascii(name)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def attribute_names(model: torch.nn.Module) -> Iterator[tuple[str, str]]:
    """``(what, qualified name)`` of every submodule, parameter, buffer and plain tensor attribute.

    Example:
        >>> [n for _, n in attribute_names(torch.nn.Linear(2, 2))]
        ['weight', 'bias']
    """
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        if prefix:
            yield "submodule", prefix
        for name in module._parameters:
            yield "parameter", dot + name
        for name in module._buffers:
            yield "buffer", dot + name
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not name.startswith("__"):
                yield "tensor attribute", dot + name


EMIT_SOURCE_HINT = "or use plan.emit_source / `hetpart emit`, which quote every name"


def check_fx_names(model: torch.nn.Module, action: str, extra: Iterable[tuple[str, str]] = (),
                   hint: str = EMIT_SOURCE_HINT) -> None:
    """Raise unless torch.fx can write every attribute name of ``model`` (and ``extra``) as code.

    ``action`` says what needs the names (``"plan.emit"``, ``"capture='symbolic_trace'"``) in the
    message; ``extra`` adds ``(what, qualified name)`` pairs (the constants a capture lifted);
    ``hint`` is the way out besides renaming.

    Raises:
        CaptureError: the first unsafe name, why, and the ways out.

    Example:
        >>> check_fx_names(torch.nn.Linear(2, 2), "plan.emit")
    """
    for what, qualified in (*attribute_names(model), *extra):
        why = unsafe_component(qualified)
        if why is not None:
            raise CaptureError(
                f"{what} {_short(qualified)}: {why}, and torch.fx would write it into generated code, "
                f"so {action} refuses it; rename the attribute (letters, digits and _, not a keyword), "
                f"{hint}"
            )


def check_graph_targets(gm: torch.fx.GraphModule, action: str) -> None:
    """The last line of defence before ``gm.recompile()``: every attribute target is writable.

    Raises:
        CaptureError: a ``get_attr`` or ``call_module`` target torch.fx cannot write safely.

    Example:
        >>> check_graph_targets(torch.fx.symbolic_trace(torch.nn.Linear(2, 2)), "plan.emit")
    """
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            why = unsafe_component(str(node.target))
            if why is not None:
                raise CaptureError(f"graph attribute {_short(str(node.target))}: {why}; {action} refuses "
                                   f"to generate code for it: rename it, or use plan.emit_source")
        elif node.op == "call_method" and unsafe_component(str(node.target)) is not None:
            raise CaptureError(f"method name {_short(str(node.target))} cannot be written as code; "
                               f"{action} refuses it")
