"""One pass of a captured graph with every op timed where it sits, and its backward timed per op.

In: a ``torch.fx.GraphModule``, its real arguments, the device they are on, and the ops that already
failed there. Out (:class:`TimedPass`): each call node's output, the seconds its call took (plus the
release of its output after its last use: freeing a large tensor gives its pages back to the OS,
part of what producing it costs), its signature, and in training the autograd nodes its forward
created, so that :func:`backward_timing` can time each op's share of the backward with pre/post hooks
(a parameter's gradient accumulation belongs to the op owning the parameter).

CPU ops are timed with ``perf_counter`` around the call alone; CUDA ops with events on the stream,
read after one synchronisation at the end. An op that raises is recorded with the reason (the first
line of the error) and stood in for by its output computed on the CPU, or zeros of the shape the
capture recorded; where neither is possible the pass stops (:class:`PassStopped`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_leaves, tree_map

from cost_models.signature import node_signature

__all__ = ["Clock", "TimedPass", "PassStopped", "backward_timing", "CALLS"]

log = logging.getLogger(__name__)

CALLS = ("call_function", "call_method", "call_module")


class Clock:
    """Marks and elapsed seconds: host time on the CPU, CUDA events on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class TimedPass(torch.fx.Interpreter):
    """Runs the graph once, timing every call node; in training, claims autograd nodes per op."""

    def __init__(self, gm: torch.fx.GraphModule, clock: Clock, device: torch.device,
                 failed: dict[str, str], *, training: bool) -> None:
        super().__init__(gm, garbage_collect_values=False)   # values are freed (and timed) by run_node
        self.clock, self.device, self.failed, self.training = clock, device, failed, training
        self.last_uses = _last_uses(gm.graph)
        self.marks: dict[str, tuple[Any, Any]] = {}
        self.frees: dict[str, list[tuple[Any, Any]]] = {}
        self.signatures: dict[str, str] = {}
        self.owner: dict[int, str] = {}           # id(autograd node) -> op name
        self.keep: list[Any] = []                 # autograd nodes kept alive while their ids are keys

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op not in CALLS:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        module = self.fetch_attr(n.target) if n.op == "call_module" else None
        self.signatures[n.name] = node_signature(n.target, args, kwargs, module)
        call = getattr(self, n.op)
        if n.name in self.failed:
            return self._substitute(n, call, args, kwargs)
        start = self.clock.mark()
        try:
            result = call(n.target, args, kwargs)
        except Exception as err:  # noqa: BLE001 - any failure of the op on this device is the finding
            self.failed[n.name] = _reason(err)
            log.info("op %s failed on %s: %s", n.name, self.device, self.failed[n.name])
            return self._substitute(n, call, args, kwargs)
        self.marks[n.name] = (start, self.clock.mark())
        if self.training:
            self._claim(n.name, result)
        del args, kwargs
        self._free_inputs(n)
        return result

    def _free_inputs(self, n: torch.fx.Node) -> None:
        """Drop the values ``n`` used last, timing each release: freeing a large tensor returns its
        pages to the OS, part of what producing it costs (charged to the op that produced it)."""
        for used in self.last_uses.get(n, ()):
            value = self.env.pop(used, None)
            if used.op not in CALLS:
                continue
            start = self.clock.mark()
            del value
            self.frees.setdefault(used.name, []).append((start, self.clock.mark()))

    def _claim(self, op: str, result: Any) -> None:
        stack = [t.grad_fn for t in tree_leaves(result) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if fn is None or id(fn) in self.owner:
                continue
            self.owner[id(fn)] = op
            self.keep.append(fn)
            stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)

    def _substitute(self, n: torch.fx.Node, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """The failed op's output from the CPU, or zeros of the shape the capture recorded."""
        if self.device.type != "cpu":
            to_cpu = lambda v: v.cpu() if isinstance(v, torch.Tensor) else v  # noqa: E731
            try:
                out = call(n.target, tree_map(to_cpu, args), tree_map(to_cpu, kwargs))
                return tree_map(lambda v: v.to(self.device) if isinstance(v, torch.Tensor) else v, out)
            except Exception:  # noqa: BLE001 - fall through to the recorded shape
                pass
        val = n.meta.get("val")
        if val is None:
            raise PassStopped(n.name)
        return tree_map(lambda v: torch.zeros(v.shape, dtype=v.dtype, device=self.device)
                        if isinstance(v, torch.Tensor) else v, val)

    def forward_seconds(self) -> dict[str, float]:
        """Each op's call, plus the release of its output when the pass dropped it."""
        self.clock.sync()
        out = {op: self.clock.seconds(a, b) for op, (a, b) in self.marks.items()}
        for op, spans in self.frees.items():
            if op in out:
                out[op] += sum(self.clock.seconds(a, b) for a, b in spans)
        return out


def _last_uses(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Node -> the values whose last use it is (as ``torch.fx.Interpreter`` computes them)."""
    seen: set[torch.fx.Node] = set()
    out: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in reversed(graph.nodes):
        for used in node.all_input_nodes:
            if used not in seen:
                seen.add(used)
                out.setdefault(node, []).append(used)
    return out


class PassStopped(Exception):
    """An op failed and its output cannot be stood in for: the rest of the pass is not measured."""


def _reason(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:240]


@contextlib.contextmanager
def backward_timing(p: TimedPass) -> Iterator[dict[str, float]]:
    """Per-op backward seconds of the next backward through ``p``'s autograd nodes."""
    marks: list[tuple[str, Any, Any]] = []
    starts: dict[int, Any] = {}
    handles = []
    for fn in p.keep:
        key, op = id(fn), p.owner[id(fn)]

        def pre(*_: Any, key: int = key) -> None:
            starts[key] = p.clock.mark()

        def post(*_: Any, key: int = key, op: str = op) -> None:
            marks.append((op, starts.pop(key), p.clock.mark()))

        handles.append(fn.register_prehook(pre))
        handles.append(fn.register_hook(post))
    out: dict[str, float] = {}
    try:
        yield out
    finally:
        for h in handles:
            h.remove()
    p.clock.sync()
    for op, a, b in marks:
        out[op] = out.get(op, 0.0) + p.clock.seconds(a, b)
