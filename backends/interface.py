"""The interface every execution target implements (see :mod:`backends`).

A backend is stateless: each call takes the plan and what it needs, and returns a new value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from backends.compare import CheckReport
    from partitioner.ir import OpGraph
    from partitioner.plan import Plan


@runtime_checkable
class Backend(Protocol):
    """An execution target: binds a plan's devices, builds the runnable thing, checks it."""

    name: str   # "torch", ...
    runs: str   # one sentence: what it runs

    def unsupported(self, graph: OpGraph) -> dict[str, str]:
        """The ops of ``graph`` this backend cannot run, each with the reason ({}: it runs them all)."""
        ...

    def bind(self, plan: Plan, device_map: Mapping[str, str] | None = None) -> dict[str, str]:
        """Logical device -> present physical device, for every device the plan uses."""
        ...

    def build(self, plan: Plan, model: Any, device_map: Mapping[str, str] | None = None, **options: Any) -> Any:
        """The runnable form of ``plan`` for ``model`` (a module, sessions, stages, ...)."""
        ...

    def check(self, plan: Plan, model: Any, inputs: Any, device_map: Mapping[str, str] | None = None,
              **options: Any) -> CheckReport:
        """Run the built plan beside the original on ``inputs`` and compare (see :mod:`backends.compare`)."""
        ...
