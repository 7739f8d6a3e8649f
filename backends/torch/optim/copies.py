"""The copies a placed optimizer makes: each gradient to its state's device, each updated master back
(and, counted here, streamed optimizer states in and out: :mod:`.streamed_state`).

In: the physical devices the plan's logical ones are bound to. Out: :class:`StateCopies`, whose
:meth:`~StateCopies.gradient` copies a gradient as backward produces it to the device holding the
parameter's optimizer state (float32 there), and :meth:`~StateCopies.weight` copies an updated
float32 master into the weight; every copy is counted per logical link (:attr:`StateCopies.moved`).

On CUDA a gradient leaves the GPU on a side stream (``non_blocking`` into pinned host memory,
from torch's caching host allocator): the side stream waits for the compute stream that produced
the gradient, an event marks the copy's end (the CPU step waits on it), and ``record_stream`` keeps
the gradient's device memory alive until the copy ran, so the parameter's ``.grad`` can be freed at
once. A row-sparse gradient (indices and rows) is copied whole on the side stream. Masters go
back the same way on a second side stream, which first waits for the compute stream (backward may
still read the weights), and :meth:`~StateCopies.weights_ready` makes the compute stream wait for
every copy, so the next forward reads the new weights. On a CPU binding both are plain copies
(``copy=True``: a real copy even between two logical devices bound to one CPU).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["StateCopies"]


class StateCopies:
    """Gradient and weight copies between logical devices, counted (see the module docstring)."""

    def __init__(self, physical: Mapping[str, torch.device]) -> None:
        self.physical = dict(physical)
        self.moved: dict[tuple[str, str, str], int] = {}   # (what, src, dst) -> bytes since reset()
        self._lock = threading.Lock()
        self._d2h: dict[torch.device, Any] = {}
        self._h2d: dict[torch.device, Any] = {}

    def reset(self) -> dict[tuple[str, str, str], int]:
        """The bytes counted since the last reset, and a fresh count."""
        with self._lock:
            moved, self.moved = self.moved, {}
        return moved

    def count(self, what: str, src: str, dst: str, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s bytes as a copy of ``what`` from logical ``src`` to ``dst``."""
        if src == dst:  # a copy within one device's memory (a delayed update's host master): no link
            return
        n = _nbytes(tensor)
        with self._lock:
            key = (what, src, dst)
            self.moved[key] = self.moved.get(key, 0) + n

    def gradient(self, grad: torch.Tensor, src: str, dst: str) -> tuple[torch.Tensor, Any]:
        """``grad`` (on logical ``src``) as a float32 copy on logical ``dst``, and the CUDA event
        the copy completes at (None: complete on return)."""
        target = self.physical[dst]
        self.count("gradient", src, dst, grad)
        if grad.device.type != "cuda" or target.type != "cpu":
            return grad.to(target, dtype=torch.float32, copy=True), None
        stream = self._stream(self._d2h, grad.device)
        stream.wait_stream(torch.cuda.current_stream(grad.device))
        with torch.cuda.stream(stream):
            if grad.is_sparse:
                host = grad.to(target, dtype=torch.float32, copy=True)
            else:  # cast on the GPU (a 16-bit gradient), then one asynchronous copy into pinned memory
                source = grad if grad.dtype == torch.float32 else grad.float()
                host = torch.empty(grad.shape, dtype=torch.float32, device=target, pin_memory=True)
                host.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        grad.record_stream(stream)
        return host, event

    def weight(self, param: torch.Tensor, master: torch.Tensor, src: str, dst: str) -> None:
        """Copy ``master`` (on logical ``src``) into ``param`` (on logical ``dst``), in place."""
        self.count("weights", src, dst, param)
        target = param.detach()
        if param.device.type != "cuda":
            target.copy_(master)
            return
        stream = self._stream(self._h2d, param.device)
        stream.wait_stream(torch.cuda.current_stream(param.device))
        with torch.cuda.stream(stream):
            target.copy_(master, non_blocking=master.is_pinned())

    def weights_ready(self) -> None:
        """The compute streams wait for every master copied back (a no-op without CUDA)."""
        for device, stream in self._h2d.items():
            torch.cuda.current_stream(device).wait_stream(stream)

    @staticmethod
    def _stream(streams: dict[torch.device, Any], device: torch.device) -> Any:
        if device not in streams:
            streams[device] = torch.cuda.Stream(device)
        return streams[device]


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.is_sparse:
        values, indices = tensor._values(), tensor._indices()
        return values.numel() * values.element_size() + indices.numel() * indices.element_size()
    return tensor.numel() * tensor.element_size()
