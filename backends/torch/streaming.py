"""Streamed weights at run time: host-resident parameters copied to the computing device per call.

In: the emitted module and the streamed attributes in schedule order. Out: a
:class:`WeightStreamer` whose ``get(target, device)`` returns the weight on ``device``. On CUDA the
host copy is pinned and the next ``LOOKAHEAD`` weights are copied on a side stream while the
current op computes, each ordered by an event the compute stream waits on; device memory is the
caching allocator's reused blocks (``record_stream`` keeps a block alive until its consumer ran).
On a CPU binding the same calls make plain copies, so the path is tested everywhere. A packed
weight streams as its several tensors (values and scales), each fetched like a weight
(:meth:`WeightStreamer.replace`).
"""

from __future__ import annotations

from typing import Any

import torch

from partitioner.errors import HetpartError

STREAMER_ATTR = "_hetpart_streamer"  # the emitted module's attribute holding its streamer
LOOKAHEAD = 2  # weights in flight ahead of the one being used: double buffering


class WeightStreamer:
    """Fetches streamed weights for one emitted module (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, streamed: list[tuple[str, str]]) -> None:
        self._module = module
        self.order = [target for target, _ in streamed]
        self.devices = dict(streamed)
        self._index = {t: i for i, t in enumerate(self.order)}
        self._stream: Any = None
        self._pending: dict[int, tuple[torch.Tensor, Any]] = {}
        if any(torch.device(d).type == "cuda" for d in self.devices.values()):
            self._pin_hosts()

    def _pin_hosts(self) -> None:
        """Put the host copies in pinned memory, so copies to a GPU can run on a side stream."""
        for target in self.order:
            tensor = self._host(target)
            if tensor.device.type == "cpu" and not tensor.is_pinned():
                tensor.data = tensor.data.pin_memory()

    def replace(self, target: str, targets: list[str]) -> None:
        """Stream ``targets`` where ``target`` was streamed, in its place in the order and to its
        device: a packed weight's tensors (quantized values, scales) stand for the float weight
        they replace (:mod:`backends.torch.packed`). Their host copies are pinned like the rest.

        Raises:
            HetpartError: ``target`` is not streamed here.
        """
        if target not in self.devices:
            raise HetpartError(f"the streamer fetches no {target!r} (it fetches {', '.join(self.order) or 'nothing'}); "
                               f"the emitted module does not match its plan: emit it again")
        device = self.devices[target]
        i = self.order.index(target)
        self.order[i:i + 1] = list(targets)
        self.devices = {t: device if t in targets else self.devices[t] for t in self.order}
        self._index = {t: i for i, t in enumerate(self.order)}
        self._pending.clear()
        if torch.device(device).type == "cuda":
            self._pin_hosts()

    def __deepcopy__(self, memo: dict) -> WeightStreamer:  # a copied module gets its own streamer
        return type(self)(memo.get(id(self._module), self._module), list(self.devices.items()))

    def _host(self, target: str) -> torch.Tensor:
        owner, _, attr = target.rpartition(".")
        module = self._module.get_submodule(owner) if owner else self._module
        return getattr(module, attr)

    def get(self, target: str, device: str) -> torch.Tensor:
        """The weight ``target`` on ``device`` (fetched ahead of time where the device allows)."""
        dev = torch.device(device)
        if dev.type != "cuda":
            return self._copy(self._host(target), dev, non_blocking=False)
        i = self._index[target]
        if i == 0:
            self._pending.clear()
        if i not in self._pending:
            self._issue(i)
        for j in range(i + 1, min(i + 1 + LOOKAHEAD, len(self.order))):
            if j not in self._pending:
                self._issue(j)
        tensor, event = self._pending.pop(i)
        current = torch.cuda.current_stream(dev)
        current.wait_event(event)
        tensor.record_stream(current)
        return tensor

    def _copy(self, host: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        """The host weight's copy on ``device`` (a training streamer copies through its own
        autograd function, :mod:`backends.torch.train_streaming`)."""
        return host.to(device, non_blocking=non_blocking)

    def _issue(self, i: int) -> None:
        target = self.order[i]
        dev = torch.device(self.devices[target])
        if self._stream is None:
            self._stream = torch.cuda.Stream(dev)
        self._stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self._stream):
            tensor = self._copy(self._host(target), dev, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        self._pending[i] = (tensor, event)
