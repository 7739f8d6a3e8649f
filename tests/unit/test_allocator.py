"""keep_freed_memory: freed gradients stay mapped (no page faults next step); the user's setting wins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cost_models import allocator

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is a Linux feature")

# A step's gradients as glibc sees them: eight blocks (5 MiB, or 64 MiB: glibc mmaps those by
# default) malloc'd, written, freed. Prints the page faults of writing them again in the next
# steps: none while glibc keeps freed memory, one per 4 KiB page when it gave them back to the OS.
_PROBE = textwrap.dedent("""
    import ctypes, importlib.util, resource, sys
    if sys.argv[1] == "keep":   # the module alone, by path (importing cost_models imports torch)
        spec = importlib.util.spec_from_file_location("allocator", {path!r})
        allocator = sys.modules["allocator"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(allocator)
        state = allocator.keep_freed_memory()
        assert state.applied, state.reason
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, faults = int(sys.argv[2]), []
    for step in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(size) for _ in range(8)]
        for b in blocks:
            ctypes.memset(b, 1, size)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        for b in reversed(blocks):
            libc.free(b)
    print(min(faults[2:]))
""")


def _faults_per_step(mode: str, size: int = 5 * 2**20) -> float:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(path=allocator.__file__), mode, str(size)],
                         capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_blocks_are_faulted_in_again_unless_kept():
    # by default glibc returns the 40 MiB to the OS once freed and every step faults it in again
    assert _faults_per_step("default") > 5000
    assert _faults_per_step("keep") < 100
    # 64 MiB blocks are mmap-ed by default (fresh on every call); kept, they come from the heap too
    assert _faults_per_step("default", 64 * 2**20) > 8 * 16384 * 0.9
    assert _faults_per_step("keep", 64 * 2**20) < 100


@glibc
def test_the_users_malloc_setting_is_kept_and_named():
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "131072"}
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('allocator', %r); "
            "m = sys.modules['allocator'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "s = m.keep_freed_memory(); "
            "print(s.applied, '|', s.describe())" % allocator.__file__)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    applied, line = out.stdout.strip().split(" | ")
    assert applied == "False"
    assert "MALLOC_TRIM_THRESHOLD_" in line and "kept" in line


def test_applied_once_per_process_and_described():
    first = allocator.keep_freed_memory()
    assert allocator.keep_freed_memory() is first
    assert first.describe()
    if not first.applied:
        assert first.reason
