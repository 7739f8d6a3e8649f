"""Runs of onnxruntime sessions that Ctrl-C stops.

In: a call that runs sessions with an ``onnxruntime.RunOptions`` (``session.run(..., options)``).
Out: its result, or ``KeyboardInterrupt`` soon after Ctrl-C, the running kernel stopped.

Python handles a signal only between bytecodes of the main thread, and a ``session.run`` that never
returns (a ``Loop`` with a trip count of 2^62) never gives it one: Ctrl-C would wait for the run.
So :class:`Interruptible` runs the call on a worker thread while the main thread waits, where a
signal reaches it; on ``KeyboardInterrupt`` it sets the run's ``RunOptions.terminate`` (onnxruntime
checks it before every node, in subgraphs too), waits up to :data:`GRACE` seconds for the worker to
stop and raises the interrupt. A call from another thread (which receives no signal) runs where it is.

Example:
    >>> run = Interruptible()
    >>> outputs = run(lambda options: session.run(None, feeds, options))   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import onnxruntime as ort

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds a terminated run may take to stop before the interrupt is raised anyway
GRACE = 5.0
#: the longest the main thread sleeps between looks at pending signals (one sent to another thread)
POLL = 0.25


class Interruptible:
    """Runs calls on one worker thread of its own, started at the first call (see the module docstring).

    Example:
        >>> Interruptible()(lambda options: options.terminate)
        False
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] | None = None
        self._pid = 0  # the process the worker runs in (a forked child starts its own)

    def __call__(self, call: Callable[[ort.RunOptions], T]) -> T:
        """``call(options)`` with fresh run options; ``KeyboardInterrupt`` terminates it.

        Raises:
            KeyboardInterrupt: Ctrl-C (SIGINT) while it ran; the run was told to stop.
        """
        options = ort.RunOptions()
        options.log_severity_level = 4  # a failed run raises its error (one line): onnxruntime need not print it too
        if threading.current_thread() is not threading.main_thread():
            return call(options)
        future: Future[T] = Future()
        self._worker().put((lambda: call(options), future))
        try:
            while True:
                try:
                    return future.result(timeout=POLL)
                except TimeoutError:
                    continue
        except KeyboardInterrupt:
            options.terminate = True
            try:
                future.exception(timeout=GRACE)  # its error (onnxruntime's "terminate flag") is not the news
            except TimeoutError:
                log.warning("the interrupted run did not stop within %.0f s; leaving it behind", GRACE)
            raise

    def _worker(self) -> queue.SimpleQueue:
        if self._jobs is None or self._pid != os.getpid():
            self._jobs, self._pid = queue.SimpleQueue(), os.getpid()
            threading.Thread(target=_serve, args=(self._jobs,), name="hetpart-onnx-run", daemon=True).start()
            weakref.finalize(self, self._jobs.put, None)  # the worker ends with its owner
        return self._jobs


def _serve(jobs: queue.SimpleQueue) -> None:
    """The worker: run each job, hand back its result or exception, until ``None``."""
    while (job := jobs.get()) is not None:
        call, future = job
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the waiting thread, which raises it
                future.set_exception(exc)
        del job, call, future


__all__ = ["GRACE", "Interruptible"]
