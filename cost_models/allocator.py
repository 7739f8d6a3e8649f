"""The host allocator: keep freed memory, so that a training loop reuses its pages every step.

Why: PyTorch's CPU tensors come from glibc's ``malloc``. glibc gives the free top of its heap back
to the OS once it exceeds the trim threshold (by default twice its dynamic mmap threshold, at most
64 MiB). A training step frees its gradients at ``zero_grad()`` (``set_to_none=True``, torch's
default) and its activations after the backward; when they sit at the top of the heap, the pages go
back to the OS and the next step page-faults every one of them in again while writing it. Whether
they sit at the top depends on what else the process allocated, so the same loop lands in one state
or the other from one run (or one thousand steps) to the next: measured here, the backward of
``dlrm:small`` (eight embedding tables of 5 MB, each gradient zero-filled per step) took 8 ms in one
state and 15.6-17.9 ms in the other, alternating between rounds of the same emitted module, and a
profile taken in the slow state priced the training step 50 % above a run in the fast one.

:func:`keep_freed_memory` fixes the state: ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` (the dynamic
threshold's ceiling, pinned: setting any threshold turns the dynamic one off) and
``mallopt(M_TRIM_THRESHOLD, 1 GiB)``, so up to 1 GiB of freed heap stays mapped and is reused
without faults. Blocks of 32 MiB and more are still ``mmap``-ed and fresh on every call (the first
touch the analytic model prices, :mod:`cost_models.analytic`). The profiler applies it before it
measures (:mod:`cost_models.measure`), so measured times are those of a loop in the fast state; a
user's training loop gets the same state by calling it once (``partitioner.keep_freed_memory()``)
or by setting ``MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432`` before Python
starts. Settings the user made in those environment variables are left alone. It is a glibc
feature: elsewhere (macOS, musl) it does nothing and says why.

Example:
    >>> state = keep_freed_memory()
    >>> state.applied or bool(state.reason)
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import sys

__all__ = ["AllocatorState", "keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

MMAP_THRESHOLD = 32 * 2**20   # glibc's ceiling for its dynamic mmap threshold (64-bit)
TRIM_THRESHOLD = 2**30        # freed heap kept mapped before glibc returns it to the OS
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


@dataclasses.dataclass(frozen=True)
class AllocatorState:
    """Whether freed memory is kept, and if not, why."""

    applied: bool
    reason: str = ""

    def describe(self) -> str:
        """One line for a bench header or a report."""
        if self.applied:
            return (f"glibc keeps freed memory (trim threshold {TRIM_THRESHOLD // 2**20} MiB, "
                    f"mmap threshold {MMAP_THRESHOLD // 2**20} MiB)")
        return f"allocator left as it was: {self.reason}"


_state: AllocatorState | None = None


def keep_freed_memory() -> AllocatorState:
    """Make glibc keep freed heap memory mapped (see the module docstring); once per process."""
    global _state
    if _state is None:
        _state = _apply()
    return _state


def _apply() -> AllocatorState:
    if not sys.platform.startswith("linux"):
        return AllocatorState(False, f"glibc's mallopt is a Linux feature, this is {sys.platform}")
    user = [name for name in _ENV if name in os.environ]
    if user:
        return AllocatorState(False, f"the environment sets {', '.join(user)}: the user's setting is kept")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as err:
        return AllocatorState(False, f"no glibc mallopt here ({err})")
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return AllocatorState(False, "mallopt refused the thresholds")
    return AllocatorState(True)
