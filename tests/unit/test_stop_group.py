"""stop_group: a torchrun-like process in its own session whose child runs in another, both
ignoring SIGTERM and SIGINT, is gone a moment after the grace period (SIGKILL to both groups).
Real processes (plain Python, no torch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.pipeline.launch import stop_group

STUBBORN = ("import signal, subprocess, sys, time\n"
            "for s in (signal.SIGTERM, signal.SIGINT):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "if sys.argv[1] == 'parent':\n"
            "    child = subprocess.Popen([sys.executable, '-c', sys.argv[2], 'child', ''], start_new_session=True)\n"
            "    print(child.pid, flush=True)\n"
            "else:\n"
            "    print('up', flush=True)\n"
            "time.sleep(120)\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_group_that_ignores_the_signal_is_killed_after_the_grace_period():
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, "parent", STUBBORN], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    try:
        assert proc.stdout.readline().strip() == "up"            # the child runs, in a session of its own
        start = time.monotonic()
        assert stop_group(proc, signal.SIGTERM, grace_s=0.5) == 1
        took = time.monotonic() - start
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(proc.pid) and not _alive(child)
        assert 0.5 <= took < 5
    finally:
        for pid in (proc.pid, child):                              # the processes this test started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
