"""A model's inputs as the user passes them: recorded in the plan, re-made for capture, checked per call.

In: the example inputs given when planning (a tensor or a tuple of positional arguments: tensors,
``None``, plain numbers) and the dimensions declared dynamic. Out:

* :func:`dynamic_dims`: the declaration in one form, ``{dim: name}`` per positional input, from
  any of the forms users write (``("batch", "seq")``, ``["batch", "len=2"]``, ``{"batch": 0}``,
  or one ``{dim: name or torch.export.Dim}`` per input);
* :func:`export_dynamic_shapes`: the ``dynamic_shapes`` argument of ``torch.export.export``
  (``Dim.AUTO`` on each declared dimension, so torch finds the sizes the model allows);
* :func:`input_specs`: one :class:`~partitioner.plan.values.InputSpec` per positional input, with
  the range torch.export proved for each dynamic dimension (a dimension torch had to fix is an
  error naming it);
* :func:`examples`: inputs of the recorded shapes (zeros) to re-capture the model;
* :func:`check_call`: a call of the emitted module against the plan: a shape the plan was not
  made for is an error naming the input, the planned shape and what to do.

Costs are always those of the example sizes; a dynamic dimension only lets the emitted module run
other sizes. The names ``batch`` and ``seq`` stand for dimension 0 and 1 of every tensor input;
``NAME=DIM`` names another dimension.

Example:
    >>> dynamic_dims(("batch", "seq"), (torch.zeros(2, 16, dtype=torch.int64),))
    [{0: 'batch', 1: 'seq'}]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from partitioner.errors import CaptureError, HetpartError
from partitioner.plan.values import InputSpec

__all__ = ["DEFAULT_DIMS", "check_call", "dynamic_dims", "examples", "export_dynamic_shapes", "input_specs"]

#: The dimension each well-known name stands for, in every tensor input that has it.
DEFAULT_DIMS = {"batch": 0, "seq": 1}


def dynamic_dims(declared: Any, args: tuple) -> list[dict[int, str]]:
    """The dynamic dimensions of each positional input, ``{dim: name}`` (empty: all static).

    Raises:
        HetpartError: an unknown name without ``=DIM``, a dimension no tensor input has, a
            declaration for a non-tensor input, or a form that is none of the above.

    Example:
        >>> dynamic_dims({"batch": 0}, (torch.zeros(2, 3), None))
        [{0: 'batch'}, {}]
    """
    out: list[dict[int, str]] = [{} for _ in args]
    if declared is None or declared == () or declared == []:
        return out
    if isinstance(declared, str):
        declared = [d.strip() for d in declared.split(",") if d.strip()]
    if isinstance(declared, Mapping) and all(isinstance(v, int) and not isinstance(v, bool) for v in declared.values()):
        return _by_name({str(k): v for k, v in declared.items()}, args)
    if isinstance(declared, Sequence) and all(isinstance(d, str) for d in declared):
        return _by_name(dict(_named_dim(d) for d in declared), args)
    if isinstance(declared, Sequence) and len(declared) == len(args):
        for i, (spec, value) in enumerate(zip(declared, args)):
            if spec is None:
                continue
            if not isinstance(spec, Mapping):
                raise HetpartError(f"dynamic_shapes[{i}]: expected None or {{dim: name}}, got {spec!r}")
            for dim, name in spec.items():
                out[i][_dim_of(value, dim, i)] = _dim_name(name, i, dim)
        return out
    raise HetpartError(
        f"dynamic_shapes {declared!r}: give names (\"batch\", \"seq\" or NAME=DIM, e.g. ('batch', 'seq')), "
        f"{{name: dim}} (e.g. {{'batch': 0}}), or one {{dim: name}} per positional input")


def _named_dim(text: str) -> tuple[str, int]:
    name, sep, dim = text.partition("=")
    name = name.strip()
    if sep:
        if not dim.strip().isdigit():
            raise HetpartError(f"--dynamic {text!r}: expected NAME=DIM with DIM a whole number, e.g. len=2")
        return name, int(dim)
    if name not in DEFAULT_DIMS:
        raise HetpartError(f"--dynamic {text!r}: {name!r} is not batch or seq; say which dimension it is "
                           f"with NAME=DIM, e.g. {name}=2")
    return name, DEFAULT_DIMS[name]


def _by_name(dims: Mapping[str, int], args: tuple) -> list[dict[int, str]]:
    out: list[dict[int, str]] = [{} for _ in args]
    for name, dim in dims.items():
        if not name.isidentifier():
            raise HetpartError(f"dynamic dimension name {name!r}: use letters, digits and _, e.g. batch")
        hit = False
        for i, value in enumerate(args):
            if isinstance(value, torch.Tensor) and 0 <= dim < value.dim():
                out[i][dim] = name
                hit = True
        if not hit:
            shapes = ", ".join(str(tuple(v.shape)) for v in args if isinstance(v, torch.Tensor)) or "none"
            raise HetpartError(f"dynamic dimension {name!r} is dimension {dim}, which no tensor input has "
                               f"(input shapes: {shapes}); name another one with NAME=DIM")
    return out


def _dim_of(value: Any, dim: Any, i: int) -> int:
    if not isinstance(value, torch.Tensor):
        raise HetpartError(f"dynamic_shapes[{i}]: input {i} is {type(value).__name__}, not a tensor: "
                           f"only tensor dimensions can be dynamic")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < value.dim():
        raise HetpartError(f"dynamic_shapes[{i}]: {dim!r} is not a dimension of input {i}, "
                           f"whose shape is {tuple(value.shape)}")
    return dim


def _dim_name(name: Any, i: int, dim: int) -> str:
    text = getattr(name, "__name__", name)  # a torch.export.Dim carries its name
    if not isinstance(text, str) or not text.isidentifier():
        raise HetpartError(f"dynamic_shapes[{i}][{dim}]: expected a name or a torch.export.Dim, got {name!r}")
    return text


def export_dynamic_shapes(dims: Sequence[Mapping[int, str]]) -> tuple | None:
    """``dynamic_shapes`` for ``torch.export.export``; None when nothing is dynamic.

    Example:
        >>> export_dynamic_shapes([{0: "batch"}, {}])     # doctest: +SKIP
        ({0: Dim.AUTO}, None)
    """
    if not any(dims):
        return None
    auto = torch.export.Dim.AUTO
    return tuple({d: auto for d in sorted(spec)} if spec else None for spec in dims)


def input_specs(args: tuple, dims: Sequence[Mapping[int, str]], program: Any = None) -> tuple[InputSpec, ...]:
    """One :class:`InputSpec` per positional input; ``program`` (the ExportedProgram) gives the
    range of each dynamic dimension. Returns ``()`` when an input is of a kind a plan cannot record
    (a list, a dict, an object): ``emit`` then needs ``example_inputs``.

    Raises:
        CaptureError: torch.export fixed a dimension declared dynamic (the model needs that size).

    Example:
        >>> input_specs((torch.zeros(2, 3), None), [{}, {}])[1].kind
        'none'
    """
    specs = []
    ranges = _ranges(program, args) if program is not None and any(dims) else {}
    for i, value in enumerate(args):
        if value is None or isinstance(value, (bool, int, float)):
            kind = "none" if value is None else "bool" if isinstance(value, bool) else type(value).__name__
            specs.append(InputSpec(kind, value=value))
        elif isinstance(value, torch.Tensor):
            dynamic = {}
            for dim, name in sorted(dims[i].items()):
                if program is not None and (i, dim) not in ranges:
                    raise CaptureError(
                        f"dimension {dim} of input {i} ({name}, size {value.shape[dim]}) cannot vary: "
                        f"torch.export had to fix it while capturing (the model needs that size, or the "
                        f"example size is 0 or 1); leave it out of the dynamic dimensions, or give an "
                        f"example with a size of 2 or more")
                dynamic[dim] = (name, *ranges.get((i, dim), (1, None)))
            specs.append(InputSpec("tensor", tuple(value.shape), str(value.dtype).removeprefix("torch."),
                                   dynamic=dynamic))
        else:
            return ()
    return tuple(specs)


def _ranges(program: Any, args: tuple) -> dict[tuple[int, int], tuple[int, int | None]]:
    """(input, dim) → (min, max or None) of every dimension torch.export left symbolic."""
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph_module.graph.nodes if n.op == "placeholder"}
    tensor_positions = [i for i, v in enumerate(args) if isinstance(v, torch.Tensor)]
    out: dict[tuple[int, int], tuple[int, int | None]] = {}
    leaves = [i for i, v in enumerate(args) if v is not None]  # the user inputs export lists, in order
    for name, i in zip(user, leaves):
        if i not in tensor_positions:
            continue
        val = nodes[name].meta.get("val")
        for dim, size in enumerate(getattr(val, "shape", ())):
            vr = program.range_constraints.get(size.node.expr) if isinstance(size, torch.SymInt) else None
            if vr is not None:  # a symbol with a range: the dimension stayed dynamic (else it was fixed)
                lo = int(vr.lower) if math.isfinite(float(vr.lower)) else 0
                hi = int(vr.upper) if math.isfinite(float(vr.upper)) else None
                out[(i, dim)] = (lo if lo > 2 else 1, hi)  # torch lets sizes 0 and 1 through at run time
    return out


def examples(specs: Sequence[InputSpec]) -> tuple:
    """Inputs of the recorded shapes and dtypes (zeros) and the recorded values: enough to capture.

    Example:
        >>> examples(input_specs((torch.ones(2, 3), None), [{}, {}]))[0].sum().item()
        0.0
    """
    return tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) if s.kind == "tensor" else s.value
                 for s in specs)


def check_call(specs: Sequence[InputSpec], names: Sequence[str], args: tuple) -> None:
    """Raise unless ``args`` are inputs the plan was made for (its static sizes, its dynamic ranges).

    Raises:
        HetpartError: names the input, its shape, the planned shape and what to do.

    Example:
        >>> check_call(input_specs((torch.ones(2, 3),), [{}]), ["x"], (torch.ones(2, 3),))
    """
    if len(args) != len(specs):
        raise HetpartError(f"the emitted module takes {len(specs)} inputs as planned "
                           f"({', '.join(s.describe() for s in specs)}), got {len(args)}")
    for i, (spec, value) in enumerate(zip(specs, args)):
        label = f"input {i}" + (f" ({names[i]})" if i < len(names) else "")
        if spec.kind != "tensor":  # plain values were specialised at capture: another one is not planned
            if isinstance(value, torch.Tensor) or value != spec.value or type(value) is not type(spec.value):
                given = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
                raise HetpartError(f"{label} is {given}, and the plan was made with {spec.value!r} there (the "
                                   f"captured graph has that value built in); re-plan with the input you pass")
            continue
        if not isinstance(value, torch.Tensor):
            raise HetpartError(f"{label} is {type(value).__name__}; the plan was made for a tensor "
                               f"{spec.describe()}")
        shape = tuple(value.shape)
        if len(shape) != len(spec.shape):
            raise HetpartError(f"{label} has shape {shape}, and the plan was made for {spec.describe()}: "
                               f"{len(spec.shape)} dimensions, not {len(shape)}; re-plan with this shape")
        for dim, (size, planned) in enumerate(zip(shape, spec.shape)):
            if dim in spec.dynamic:
                name, lo, hi = spec.dynamic[dim]
                if size < lo or (hi is not None and size > hi):
                    top = f"{hi}" if hi is not None else "any size"
                    raise HetpartError(f"{label} has shape {shape}: dimension {dim} ({name}) is {size}, "
                                       f"outside the sizes the plan runs ({lo} to {top}) for "
                                       f"{spec.describe()}")
            elif size != planned:
                raise HetpartError(
                    f"{label} has shape {shape}, and the plan was made for {spec.describe()}: dimension "
                    f"{dim} is fixed at {planned}; re-plan with that dimension declared dynamic "
                    f"(--dynamic {_suggest_name(dim)}, or partition(..., dynamic_shapes=...)) to run other sizes")


def _suggest_name(dim: int) -> str:
    for name, d in DEFAULT_DIMS.items():
        if d == dim:
            return name
    return f"dim{dim}={dim}"
