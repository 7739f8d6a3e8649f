"""Streamed weights in training: fetched to the computing device in forward and again in backward.

In: an emitted module of a training plan whose ``weights`` mapping streams some ops' weights
from the host (:mod:`backends.torch.module`, or a file of :mod:`backends.torch.source`). Out: its
:class:`TrainingStreamer` (a :class:`~backends.torch.streaming.WeightStreamer`) and the module
hooks of :func:`install_refetch`, so that

* forward fetches each streamed weight as inference does (on CUDA: a side stream a few weights
  ahead), through :class:`Fetch`, an autograd function whose backward copies the gradient back to
  the host weight as it is (dense, or row-sparse for a sparse embedding table: torch's own
  ``.to`` backward refuses a sparse gradient);
* the fetched copy is **not kept** between the passes: while the module's forward runs, a
  saved-tensor hook replaces every tensor autograd would save that lies in a fetched copy (the
  weight of a linear, a view of it) by a token naming the weight and the view, and backward's
  unpack fetches the host weight again (once per weight while backward holds the copy) and takes
  the same view. So a streamed weight occupies the computing device only while an op reads it,
  in each pass, which is how the plan counts it (``streamed in both passes``).

Where the refetch happens in backward: on the current stream, as the op needing it runs (no
backward prefetch yet). On CUDA the host copy is pinned; the copy is ordered before the
gradient's blocking device-to-host copy on the same stream, so a step updating the host weight
after its gradient arrived never races the refetch.

Measured (tests/e2e/test_training_state_emit.py): after forward no fetched copy is alive (weak
references to them are dead); without the hooks autograd keeps every fetched weight a later op
saved until backward.

Ops the plan recomputes run under ``torch.utils.checkpoint``, whose own saved-tensor hooks are
innermost there: their fetched weights are fetched again by the recomputation itself.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from backends.torch.streaming import WeightStreamer

__all__ = ["Fetch", "TrainingStreamer", "install_refetch"]


class Fetch(torch.autograd.Function):
    """``host`` copied to ``device``; backward copies the gradient back to ``host``'s device,
    keeping its layout (a sparse gradient stays sparse)."""

    @staticmethod
    def forward(ctx: Any, host: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        ctx.source = host.device
        return host.to(device, non_blocking=non_blocking)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.to(ctx.source), None, None


class _Saved(NamedTuple):
    """What a saved-tensor hook keeps of a view of a fetched weight: enough to fetch it again."""

    target: str
    device: torch.device
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class TrainingStreamer(WeightStreamer):
    """A :class:`~backends.torch.streaming.WeightStreamer` for training (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, streamed: list[tuple[str, str]]) -> None:
        super().__init__(module, streamed)
        self._fetched: dict[int, tuple[StorageWeakRef, str]] = {}   # storage -> (weak ref, target), this pass
        self._again: dict[tuple[str, torch.device], weakref.ref] = {}  # backward's copies while alive
        self._hooks: list[Any] = []
        self.refetches = 0   # weights fetched again in backward (counted for the tests)

    def _copy(self, host: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        return Fetch.apply(host, device, non_blocking)

    def get(self, target: str, device: str) -> torch.Tensor:
        tensor = super().get(target, device)
        if self._hooks:
            ref = StorageWeakRef(tensor.untyped_storage())
            self._fetched[ref.cdata] = (ref, target)
        return tensor

    # -- the saved-tensor hooks ------------------------------------------------------------

    def begin(self) -> None:
        """Forward begins: pack saved views of fetched weights as tokens until :meth:`end`."""
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._hooks.append(hooks)

    def end(self) -> None:
        """Forward ended (or raised)."""
        if self._hooks:
            self._hooks.pop().__exit__(None, None, None)
        if not self._hooks:
            self._fetched.clear()

    def _pack(self, tensor: torch.Tensor) -> Any:
        if not self._fetched or tensor.layout is not torch.strided:
            return tensor
        entry = self._fetched.get(StorageWeakRef(tensor.untyped_storage()).cdata)
        if entry is None or entry[0].expired():
            return tensor
        return _Saved(entry[1], tensor.device, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())

    def _unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        key = (saved.target, saved.device)
        alive = self._again.get(key)
        copy = alive() if alive is not None else None
        if copy is None:
            copy = self._host(saved.target).detach().to(saved.device, non_blocking=True)
            self._again[key] = weakref.ref(copy)
            self.refetches += 1
        return copy.as_strided(saved.size, saved.stride, saved.offset)


def _begin(module: torch.nn.Module, args: Any) -> None:
    from backends.torch.streaming import STREAMER_ATTR

    streamer = getattr(module, STREAMER_ATTR, None)
    if isinstance(streamer, TrainingStreamer):
        streamer.begin()


def _end(module: torch.nn.Module, args: Any, output: Any) -> None:
    from backends.torch.streaming import STREAMER_ATTR

    streamer = getattr(module, STREAMER_ATTR, None)
    if isinstance(streamer, TrainingStreamer):
        streamer.end()


def install_refetch(module: torch.nn.Module) -> torch.nn.Module:
    """Hook ``module``'s forward so its :class:`TrainingStreamer` packs fetched weights as tokens
    while it runs (the hooks find the streamer at call time, so a deep copy keeps working).

    Example:
        >>> install_refetch(emitted)   # doctest: +SKIP
    """
    module.register_forward_pre_hook(_begin)
    module.register_forward_hook(_end, always_call=True)
    return module
