"""The torch.compile backend under strict devices: compiled graphs run on logical devices that differ.

In: a model compiled with :attr:`StrictCompile.backend` (``torch.compile(model, backend=run.backend,
options={..., "device_map": run.device_map})``). Out: its outputs, computed under
:class:`~backends.strict_devices.StrictDevices`: every tensor tagged with the logical device it
lives on, and the first op that reads a tensor from another logical device, or runs away from its
planned device, raises :class:`~partitioner.errors.DeviceMismatch`; :attr:`StrictDevices.copies`
lists the copies between logical devices the step made.

How: :attr:`StrictCompile.device_map` binds each logical device to its own CPU tag
(``{"cpu": "cpu:1", "cuda:0": "cpu:2"}``), so the backend inserts its copies of inputs and model
state as it does on a real GPU. :attr:`StrictCompile.backend` is a
:class:`~backends.compile.HetpartBackend` that hands the mode each graph it emits with the plan's
op on each line of its fx code (:func:`backends.torch.strict.fx_sites`); op names are prefixed by
the graph's number (``g1/linear``), since graphs of one model (a graph break) reuse names. The mode
lets dynamo compile and run its cached graphs while it is active (``ignore_compile_internals``),
so compiling and calling inside ``with run:`` both work. Backward runs outside the mode, as for
:mod:`backends.torch.strict`.

Example:
    >>> run = StrictCompile(["cpu", "cuda:0"], host="cpu")
    >>> compiled = torch.compile(model, backend=run.backend,                      # doctest: +SKIP
    ...                          options={"devices": "h200-host", "device_map": run.device_map})
    >>> with run:                                                                 # doctest: +SKIP
    ...     out = compiled(x)
    >>> run.mode.device_of(out)                                                   # doctest: +SKIP
    'cpu'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from backends.compile.backend import HetpartBackend
from backends.strict_devices import StrictDevices
from backends.torch.strict import fx_sites
from partitioner.errors import HetpartError

__all__ = ["CompiledStrictDevices", "OptionsFor", "StrictCompile"]

#: ``(dynamo's graph, its example inputs, CompileOptions) -> CompileOptions``
OptionsFor = Callable[[torch.fx.GraphModule, Sequence[Any], Any], Any]


class CompiledStrictDevices(StrictDevices):
    """:class:`StrictDevices` that dynamo compiles and runs graphs under (its frames are not skipped)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class _Watching(HetpartBackend):
    """A HetpartBackend that shows the strict mode every graph it emits."""

    def __init__(self, mode: StrictDevices, options_for: OptionsFor | None) -> None:
        super().__init__()
        self._mode = mode
        self._options_for = options_for
        self.graphs: list[torch.fx.GraphModule] = []

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Any) -> Any:
        if self._options_for is not None:
            options = self._options_for(gm, example_inputs, options)
        compiled = super().compile_graph(gm, example_inputs, options)
        if not isinstance(compiled, torch.fx.GraphModule):
            raise HetpartError("strict devices watch graphs of static shapes: compile with dynamic=False "
                               "(a dynamic graph is placed per shape on its first call)")
        number = len(self.graphs)
        plan = self.records[-1].plan
        sites = fx_sites(compiled, plan)
        self._mode.watch(type(compiled).forward.__code__,
                         {n: s._replace(op=f"g{number}/{s.op}" if s.op else None) for n, s in sites.items()})
        self._mode.planned.update({f"g{number}/{op}": d for op, d in plan.placement.items()})
        self.graphs.append(compiled)
        return compiled


class StrictCompile:
    """Compiled graphs of one model checked under strict devices (see the module docstring).

    Parameters:
        devices: the plan's logical devices (the profile's names).
        host: the logical device the caller's tensors (inputs, the model's state) live on.
        options_for: ``(graph, example inputs, options) -> options`` for each graph before it is
            planned (caps sized to the graph, say); None keeps the options given.
    """

    def __init__(self, devices: Sequence[str], host: str, options_for: OptionsFor | None = None) -> None:
        self.mode = CompiledStrictDevices(devices, host)
        self.device_map: dict[str, str] = dict(self.mode.binding)
        self.backend = _Watching(self.mode, options_for)

    @property
    def graphs(self) -> list[torch.fx.GraphModule]:
        """The graphs emitted so far, in compile order."""
        return self.backend.graphs

    def __enter__(self) -> StrictCompile:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
