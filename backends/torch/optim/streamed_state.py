"""A parameter whose optimizer state lives on the host and is stepped on the weight's own device.

In: a parameter (its weight, and its gradient, on the device computing it), torch's optimizer over
it, and the plan's place for it (``state`` the host, ``step`` the weight's device: a *streamed
state*, :mod:`partitioner.solvers.train_state`). Out: :class:`StreamedState`, whose
:meth:`~StreamedState.step` brings the state tensors to the weight's device, runs torch's own step
there (the very update eager training makes on that device) and sends the state back, leaving
only host tensors in the inner optimizer's ``state`` between steps.

On CUDA the trip runs on one side stream per device, after the compute stream that produced the
gradient: the state is copied in from pinned host memory (``non_blocking``), stepped, and copied
back into the same pinned tensors; an event marks the end, :meth:`~StreamedState.ready` makes the
compute stream wait for it (the next forward reads the updated weight) and
:meth:`~StreamedState.wait` waits for it on the host (before the state is read). The device copies
and the gradient are kept alive for the side stream by ``record_stream``, so the device holds one
state at a time per stream, as the plan's buffer. On a CPU binding every copy is a real copy
(``copy=True``), made at once. Every copy is counted as ``("state", src, dst)`` bytes on the
placed optimizer's :class:`~backends.torch.optim.copies.StateCopies`.

Only tensors with at least one dimension travel (Adam's moments, Adagrad's sum, SGD's momentum
buffer); a scalar such as Adam's ``step`` count stays where torch keeps it (the host).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from backends.torch.optim.copies import StateCopies
from partitioner.plan.training_state import ParamState

__all__ = ["StreamedState"]


@dataclasses.dataclass
class StreamedState:
    """One parameter with a streamed optimizer state (see the module docstring)."""

    name: str
    param: torch.nn.Parameter
    place: ParamState
    inner: torch.optim.Optimizer
    group: int                       # index of its outer param group
    host: torch.device               # where the state lives between steps
    started: bool = False            # its step was issued since the last step()
    held: bool = False               # a gradient was accumulated (not stepped) since the last step()
    event: Any = None                # CUDA: the end of the last trip

    def __post_init__(self) -> None:
        self.home()

    @property
    def _cuda(self) -> bool:
        return self.param.device.type == "cuda"

    def home(self) -> None:
        """Move every state tensor (with a dimension) to the host: after construction (Adagrad makes
        its state at once) and after ``load_state_dict`` (torch moves it to the parameter's device)."""
        state = self.inner.state.get(self.param)
        if not state:
            return
        for key, value in list(state.items()):
            if _travels(value) and value.device != self.host:
                state[key] = value.to(self.host, copy=True).pin_memory() if self._cuda else value.to(self.host, copy=True)

    def step(self, hyper: Mapping[str, Any], run_step: Any, copies: StateCopies, streams: dict) -> None:
        """Bring the state in, step with ``run_step(inner, [hyper])``, send the state back."""
        p, inner = self.param, self.inner
        src, dst = self.place.state, self.place.step
        if not self._cuda:
            self._bring_in(copies, src, dst, non_blocking=False)
            run_step(inner, [hyper])
            self._back(copies, src, dst, None)
            return
        stream = streams.get(p.device)
        if stream is None:
            stream = streams[p.device] = torch.cuda.Stream(p.device)
        stream.wait_stream(torch.cuda.current_stream(p.device))
        with torch.cuda.stream(stream):
            self._bring_in(copies, src, dst, non_blocking=True)
            run_step(inner, [hyper])
            self._back(copies, src, dst, stream)
            self.event = torch.cuda.Event()
            self.event.record(stream)
        if p.grad is not None:
            p.grad.record_stream(stream)

    def _bring_in(self, copies: StateCopies, src: str, dst: str, *, non_blocking: bool) -> None:
        """Copy the parameter's state tensors from the host to its device (counted as state copies)."""
        p = self.param
        state = self.inner.state.get(p, {})
        for key, value in list(state.items()):
            if _travels(value):
                copies.count("state", src, dst, value)
                state[key] = value.to(p.device, non_blocking=True) if non_blocking else value.to(p.device, copy=True)

    def _back(self, copies: StateCopies, src: str, dst: str, stream: Any) -> None:
        """The stepped state (on the weight's device) back into host tensors."""
        state = self.inner.state[self.param]
        for key, value in list(state.items()):
            if not _travels(value):
                continue
            copies.count("state", dst, src, value)
            if stream is None:
                state[key] = value.to(self.host, copy=True)
                continue
            host = torch.empty(value.shape, dtype=value.dtype, device=self.host, pin_memory=True)
            host.copy_(value, non_blocking=True)
            value.record_stream(stream)
            state[key] = host

    def ready(self) -> None:
        """The compute stream waits for the last trip (the updated weight); a no-op on a CPU binding."""
        if self.event is not None:
            torch.cuda.current_stream(self.param.device).wait_event(self.event)

    def wait(self) -> None:
        """The host waits for the last trip (the state tensors are back)."""
        if self.event is not None:
            self.event.synchronize()


def _travels(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0
