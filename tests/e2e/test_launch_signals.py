"""``hetpart launch PLAN --run`` stopped by Ctrl-C (SIGINT) or SIGTERM: torchrun runs in a session
of its own and each rank in another, so the signal is forwarded to torchrun and, after a grace
period, whatever is left of torchrun and its ranks is killed; the command exits 130 / 143 with one
line. Real processes: the command, torchrun and two ranks of mlp:tiny on 4x-cpu-host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import models
from partitioner import partition
from tests.e2e.terminal import sigint_as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    """mlp:tiny in 2 stages on 4x-cpu-host (as `hetpart plan mlp:tiny --devices 4x-cpu-host
    --objective throughput --stages 2` makes it)."""
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", stages=2, solver="pipeline-dp",
                     model_name="mlp:tiny")
    path = tmp_path_factory.mktemp("plans") / "mlp-2.json"
    plan.save(path)
    return path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if (f := _stat(int(p.name))) and int(f[1]) == pid]


def _wait_for_ranks(proc: subprocess.Popen, world: int, within: float) -> tuple[int, list[int]]:
    """torchrun (the command's child) and its ``world`` rank processes, once all are up and past
    their start (a second in, so each has imported torch and is running its stage)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        for torchrun in _children(proc.pid):
            ranks = [r for r in _children(torchrun)
                     if b"backends.pipeline" in Path(f"/proc/{r}/cmdline").read_bytes()]
            if len(ranks) == world:
                time.sleep(1.0)
                return torchrun, ranks
        time.sleep(0.1)
    pytest.fail(f"the ranks did not start within {within:g} s")


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_torchrun_and_every_rank(plan_path, signum, status):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "partitioner.cli", "launch", str(plan_path), "--run",
                             "--steps", "100000000", "--timeout", "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_from_a_terminal)
    started: list[int] = []
    try:
        torchrun, ranks = _wait_for_ranks(proc, 2, within=120)
        started = [torchrun, *ranks]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        deadline = time.monotonic() + 5
        while any(map(_alive, started)) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in started if _alive(pid)]
    finally:
        for pid in [proc.pid, *started]:      # the processes this test started, by id
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, f"still running after {signal.Signals(signum).name}: {survivors}"
    assert proc.returncode == status, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == f"hetpart: interrupted by {signal.Signals(signum).name}: stopped torchrun and its 2 ranks", \
        err[-3000:]
    assert "Traceback" not in out + err
