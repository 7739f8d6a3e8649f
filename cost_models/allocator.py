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

:func:`keep_freed_memory` fixes the state: ``mallopt(M_MMAP_MAX, 0)`` (no block is served by its own
``mmap``, which ``free`` would unmap: blocks of 32 MiB and more were fresh pages on every call, and
with freed heap kept they were fresh in some calls and reused in others) and
``mallopt(M_TRIM_THRESHOLD, 1 GiB)``, so up to 1 GiB of freed heap stays mapped and every block,
large or small, is reused without faults once the loop has run a step. A calibration in this state
finds no size that is always fresh, and its profile prices no first touch
(:mod:`cost_models.analytic`), as the loop runs. The profiler applies it before it measures
(:mod:`cost_models.measure`), so measured times are those of a loop in this steady state (the
setting stays for the rest of the process: glibc has no way back to its dynamic thresholds); a user's
training loop gets the same state by calling it once (``partitioner.keep_freed_memory()``) or by
setting ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824`` before Python starts. Settings the
user made in those environment variables (or ``MALLOC_MMAP_THRESHOLD_``) are left alone. It is a
glibc feature: elsewhere (macOS, musl) it does nothing and says why.

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

__all__ = ["AllocatorState", "keep_freed_memory", "TRIM_THRESHOLD"]

TRIM_THRESHOLD = 2**30        # freed heap kept mapped before glibc returns it to the OS
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4   # glibc's mallopt parameters (malloc.h)
_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")


@dataclasses.dataclass(frozen=True)
class AllocatorState:
    """Whether freed memory is kept, and if not, why."""

    applied: bool
    reason: str = ""

    def describe(self) -> str:
        """One line for a bench header or a report."""
        if self.applied:
            return f"glibc keeps freed memory (trim threshold {TRIM_THRESHOLD // 2**20} MiB, no mmap-ed blocks)"
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
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return AllocatorState(False, "mallopt refused the thresholds")
    return AllocatorState(True)
