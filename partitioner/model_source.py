"""Resolve a MODEL argument to a module and example inputs.

In: ``"gpt"``, ``"gpt:small"`` (a zoo name and size) or ``"path/to/file.py:factory"`` (a Python
file and a function in it returning ``(module, example_inputs)``). Out: a :class:`LoadedModel`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from partitioner.errors import UnknownModel


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model ready to capture: its display name, the module and its example inputs."""

    name: str
    module: torch.nn.Module
    example_inputs: tuple
    no_split: tuple[str, ...] = ()  # module classes a device-map fill keeps whole (zoo models declare them)


def load_model(spec: str, *, device: str | None = None) -> LoadedModel:
    """Build the model named by ``spec``; zoo models are built on ``device`` (``"meta"``: shapes
    only, which is all planning needs). A user's factory builds where it likes.

    Example:
        >>> load_model("mlp:tiny").name
        'mlp:tiny'
    """
    path, sep, factory = spec.rpartition(":")
    if sep and (path.endswith(".py") or "/" in path):
        return _from_file(Path(path), factory, spec)
    if spec.endswith(".py"):
        raise UnknownModel(f"{spec!r} names a file but no factory: write it as {spec}:FUNCTION")
    import models

    name, _, size = spec.partition(":")
    size = size or "tiny"
    module, inputs = models.get(name, size, device=device)
    return LoadedModel(f"{name}:{size}", module, tuple(inputs), tuple(models.entry(name).no_split_classes))


def import_file(path: Path, spec: str) -> ModuleType:
    """Import a user's Python file (a model factory, a loss) as a module of its own.

    Raises:
        UnknownModel: the file does not exist or cannot be imported; names ``spec``.
    """
    if not path.is_file():
        raise UnknownModel(f"file {str(path)!r} (from {spec!r}) does not exist")
    module_name = f"_hetpart_user_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UnknownModel(f"cannot import {str(path)!r} as a Python file")
    mod = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = mod
    try:
        loader_spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(module_name, None)
    return mod


def _from_file(path: Path, factory: str, spec: str) -> LoadedModel:
    if not path.is_file():
        raise UnknownModel(f"model file {str(path)!r} (from {spec!r}) does not exist")
    mod = import_file(path, spec)
    fn = getattr(mod, factory, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_"))
        raise UnknownModel(
            f"{str(path)!r} has no function {factory!r}; its functions are: {', '.join(names) or 'none'}"
        )
    result: Any = fn()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise UnknownModel(
            f"{spec!r} must return (module, example_inputs); it returned {type(result).__name__}"
        )
    module, inputs = result
    inputs = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return LoadedModel(f"{path.stem}:{factory}", module, inputs)
