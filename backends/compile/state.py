"""Model state that a torch.compile graph receives as arguments, on the devices the plan names.

dynamo lifts a module's parameters and buffers to graph inputs, so they arrive with every call,
wherever the caller keeps them. In: such a tensor, its placeholder name and the device an op of
the plan reads it on. Out: the tensor on that device, without copying it again on every call:

* :class:`StateCopies` keeps one copy per (tensor, device) and makes a new one only when the
  tensor changed: another tensor object, other storage, or a bumped version counter (every
  in-place update torch records: optimizer steps, ``load_state_dict``, ``p.add_`` under
  ``no_grad``). An update through ``p.data`` bypasses the counter; the backend uses copies only
  where no gradient can flow (compiled under ``no_grad``, or a tensor that does not require
  grad), which is where such updates do not happen in training loops.
* :class:`ArgumentStreamer` is :class:`~backends.torch.streaming.WeightStreamer` for weights the
  plan streams: the host copy is a pinned :class:`StateCopies` copy of the argument, prefetched to
  the computing device on a side stream exactly as in ``plan.emit``.

Example:
    >>> copies = StateCopies()
    >>> w = torch.ones(2)
    >>> copies.get(w, "w", "cpu") is copies.get(w, "w", "cpu")
    True
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from backends.torch.streaming import WeightStreamer

PINNED = "pinned"  # StateCopies.get(..., device=PINNED): a page-locked host copy (for streaming to a GPU)


class StateCopies:
    """One copy of each state tensor per device, refreshed when the tensor changes."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[Any, int, int, torch.Tensor]] = {}

    def get(self, tensor: torch.Tensor, name: str, device: str) -> torch.Tensor:
        """``tensor`` on ``device`` (``"cuda:0"``, or :data:`PINNED` for pinned host memory)."""
        key = (name, device)
        held = self._held.get(key)
        if held is not None and held[0]() is tensor and held[1] == tensor._version \
                and held[2] == tensor.data_ptr():
            return held[3]
        source = tensor.detach()
        if device == PINNED:
            copy = source.cpu().pin_memory() if torch.cuda.is_available() else source.cpu().clone()
        else:
            copy = source.to(device, copy=True)
        self._held[key] = (weakref.ref(tensor), tensor._version, tensor.data_ptr(), copy)
        return copy

    def __len__(self) -> int:
        return len(self._held)

    def held(self) -> dict[tuple[str, str], torch.Tensor]:
        """(name, device) -> the copy kept there, for every copy made so far."""
        return {key: entry[3] for key, entry in self._held.items()}

    def __deepcopy__(self, memo: dict) -> StateCopies:  # a copied module starts with no copies
        return StateCopies()


class ArgumentStreamer(WeightStreamer):
    """Streams weights that arrive as call arguments (see the module docstring).

    The compiled graph calls :meth:`bind` with every streamed weight before its first op, then
    ``get(name, device)`` where each is used; :meth:`bind` replaces the host copies so the
    prefetch of later weights reads this call's values.
    """

    def __init__(self, streamed: list[tuple[str, str]], copies: StateCopies) -> None:
        self._copies = copies
        self._host_copies: dict[str, torch.Tensor] = {}
        self._pin = any(torch.device(d).type == "cuda" for _, d in streamed)
        super().__init__(torch.nn.Module(), streamed)

    def _pin_hosts(self) -> None:
        """Nothing to pin up front: :meth:`bind` makes pinned copies of the arguments."""

    def _host(self, target: str) -> torch.Tensor:
        return self._host_copies[target]

    def bind(self, *weights: torch.Tensor) -> None:
        """This call's streamed weights, in the order given at construction."""
        for target, tensor in zip(self.order, weights):
            self._host_copies[target] = self._copies.get(tensor, target, PINNED) if self._pin else tensor

    def __deepcopy__(self, memo: dict) -> ArgumentStreamer:
        return ArgumentStreamer(list(self.devices.items()), StateCopies())


__all__ = ["PINNED", "ArgumentStreamer", "StateCopies"]
