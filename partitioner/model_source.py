"""Resolve a MODEL argument to a module and example inputs.

In: ``"gpt"``, ``"gpt:small"`` (a zoo name and size), ``"path/to/file.py:factory"`` (a Python
file and a function in it returning ``(module, example_inputs)``), ``"path/to/model.onnx"`` (an
ONNX model, imported by :func:`~partitioner.frontends.onnx.from_onnx`; symbolic input dimensions are
bound from ``input_shapes``) or ``"./folder"`` (a Hugging Face model folder, or a state-dict file
beside its ``config.json``: built hollow, no weight read, :mod:`partitioner.frontends.hf_folder`;
``input_shapes`` declares its inputs). Out: a :class:`LoadedModel`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from partitioner.errors import UnknownModel


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A model ready to capture: its display name, the module and its example inputs.

    For an ONNX model, ``module`` is the ``.onnx`` path, ``example_inputs`` is empty and
    ``input_shapes`` binds its symbolic dimensions (``partition`` and ``from_onnx`` take both).
    """

    name: str
    module: torch.nn.Module | Path
    example_inputs: tuple
    no_split: tuple[str, ...] = ()  # module classes a device-map fill keeps whole (zoo models declare them)
    input_shapes: Mapping[str, tuple[int, ...]] | None = None  # ONNX models: shapes of symbolic inputs
    folder: Any = None  # a model folder (FolderModel): ``module`` is its hollow model; emit and check load from it

    @property
    def is_onnx(self) -> bool:
        """Whether this is an ONNX model (``module`` is its path)."""
        return isinstance(self.module, Path)


def load_model(spec: str, *, device: str | None = None,
               input_shapes: Mapping[str, tuple[int, ...]] | None = None, dtype: str | None = None,
               trust_remote_code: bool = False) -> LoadedModel:
    """Build the model named by ``spec``; zoo models are built on ``device`` (``"meta"``: shapes
    only, which is all planning needs). A user's factory builds where it likes. A ``.onnx`` path is
    checked to exist; it is read when it is imported. A model folder is opened hollow whatever
    ``device`` says (``dtype`` and ``trust_remote_code`` as :func:`~partitioner.frontends.hf_folder.open_folder`
    takes them); its example inputs are on the host.

    Example:
        >>> load_model("mlp:tiny").name
        'mlp:tiny'
    """
    if spec.lower().endswith(".onnx"):
        path = Path(spec)
        if not path.is_file():
            raise UnknownModel(f"ONNX model {spec!r} does not exist; give the path of a .onnx file")
        return LoadedModel(path.stem, path, (), input_shapes=dict(input_shapes) if input_shapes else None)
    from partitioner.frontends.hf_folder import is_model_folder, open_folder

    if is_model_folder(spec):
        folder = open_folder(spec, dtype=dtype, trust_remote_code=trust_remote_code, input_shapes=input_shapes)
        return LoadedModel(folder.name, folder.module, folder.example_inputs(), folder=folder)
    if input_shapes:
        raise UnknownModel(f"--input-shape binds the inputs of ONNX models and model folders; {spec!r} is neither")
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
    # The module stays registered, as an import leaves it: its factory, its classes and pickling
    # look themselves up in sys.modules.
    sys.modules[module_name] = mod
    try:
        loader_spec.loader.exec_module(mod)
    except SyntaxError as err:
        sys.modules.pop(module_name, None)
        raise UnknownModel(f"{str(path)!r} line {err.lineno}: syntax error: {err.msg}; fix the file") from err
    except Exception as err:  # any error of the user's module at import: say where, keep the cause
        sys.modules.pop(module_name, None)
        raise UnknownModel(f"importing {str(path)!r} failed: {_raised(err, path)}; fix the file "
                           f"(--debug shows the traceback)") from err
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
    try:
        result: Any = fn()
    except Exception as err:  # the user's factory: its error, named, instead of a traceback
        raise UnknownModel(f"the factory {spec!r} raised {_raised(err, path)}; fix the factory "
                           f"(--debug shows the traceback)") from err
    _check_result(result, spec)
    module, inputs = result
    inputs = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return LoadedModel(f"{path.stem}:{factory}", module, inputs)


def _raised(err: BaseException, path: Path) -> str:
    """``ValueError: bad size (model.py line 12)``: the error and the deepest line of the user's file."""
    line = ""
    for frame in traceback.extract_tb(err.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = f" ({path.name} line {frame.lineno})"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}{line}".rstrip()


def _check_result(result: Any, spec: str) -> None:
    """A factory returns ``(nn.Module, example_inputs)``; anything else is named precisely."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        return
    if isinstance(result, torch.nn.Module):
        got = "a module without example inputs"
    elif isinstance(result, tuple):
        kinds = ", ".join(type(x).__name__ for x in result[:4]) + (", ..." if len(result) > 4 else "")
        got = (f"a tuple of {len(result)} ({kinds})" if len(result) != 2
               else f"a pair whose first item is a {type(result[0]).__name__}, not an nn.Module")
    else:
        got = f"a {type(result).__name__}"
    raise UnknownModel(f"{spec!r} must return (module, example_inputs), e.g. return Model(), "
                       f"(torch.randn(2, 16),); it returned {got}")
