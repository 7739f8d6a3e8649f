"""Which inputs a torch.compile graph updates in place (BatchNorm's running statistics in training).

In: dynamo's ``GraphModule`` and its example inputs. Out: the names of the placeholders some op
writes to. The graph runs once on fake tensors (no real compute) while a dispatch mode reads each
aten call's schema: an argument marked as written (``Tensor(a!)``) that shares storage with an
input marks that input. Version counters cannot tell, and neither can every schema:
``native_batch_norm`` updates its running statistics in training without declaring them written
(:data:`UNDECLARED_WRITES` lists such ops).

The emitter needs this because a copy of an input on another device receives the update instead
of the input: such copies are written back at the end of the graph and never kept across calls.

Example:
    >>> mutated_inputs(gm, example_inputs)     # doctest: +SKIP
    {'l_self_modules_bn_buffers_running_mean_', 'l_self_modules_bn_buffers_running_var_', ...}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode


#: aten ops that write arguments their schema does not mark: name -> (argument indices, index of the
#: ``training`` flag that must be true)
UNDECLARED_WRITES: dict[str, tuple[tuple[int, ...], int]] = {
    "native_batch_norm": ((3, 4), 5),
    "cudnn_batch_norm": ((3, 4), 5),
    "miopen_batch_norm": ((3, 4), 5),
}


class _Writes(TorchDispatchMode):
    """Records the storages that aten calls write to."""

    def __init__(self) -> None:
        super().__init__()
        self.written: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        for i, arg in enumerate(getattr(schema, "arguments", ())):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    self.written.add(_storage(tensor))
        undeclared = UNDECLARED_WRITES.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
        if undeclared is not None and len(args) > undeclared[1] and args[undeclared[1]]:
            self.written.update(_storage(args[i]) for i in undeclared[0] if isinstance(args[i], torch.Tensor))
        return func(*args, **kwargs)


def _storage(tensor: torch.Tensor) -> int:
    return id(tensor.untyped_storage()) if tensor.is_meta else tensor.untyped_storage()._cdata


def mutated_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> set[str]:
    """The placeholders of ``gm`` that some op of it writes to (see the module docstring)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v for v in example_inputs]
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    storages = {_storage(f): name for name, f in zip(names, fakes) if isinstance(f, torch.Tensor)}
    writes = _Writes()
    with mode, writes:
        torch.fx.Interpreter(gm).run(*fakes)
    return {storages[s] for s in writes.written if s in storages}


__all__ = ["mutated_inputs"]
