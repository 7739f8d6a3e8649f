"""The benches' load verdict counts the work of other processes only: a bench busy measuring on
every core of an otherwise idle machine is not "LOADED" by its own threads (a load average counts
them)."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from cost_models.machine_load import LoadMeter

ROOT = Path(__file__).resolve().parents[2]


def _fidelity():  # noqa: ANN202 - the bench module
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("fidelity", ROOT / "bench" / "fidelity.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("fidelity", module)   # its dataclasses look their module up there
        spec.loader.exec_module(sys.modules["fidelity"])
        return sys.modules["fidelity"]
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _burn(cpu_s: float, started: float) -> None:
    """Matmuls until this process has used ``cpu_s`` CPU seconds since ``started`` (at most 10 s of wall time)."""
    a = torch.randn(256, 256)
    end = time.perf_counter() + 10
    while time.process_time() - started < cpu_s and time.perf_counter() < end:
        a @ a


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_the_verdict_leaves_out_the_benchs_own_threads() -> None:
    fidelity = _fidelity()
    meter = LoadMeter()
    threads = [threading.Thread(target=_burn, args=(1.0, time.process_time())) for _ in range(len(meter.cpus))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    own = meter.reading()
    note = fidelity.load_note(meter)
    found = re.search(r"other processes used ([\d.]+) of (\d+) CPUs over ([\d.]+) s \(this process not counted\)", note)
    assert found, note
    others, cpus = float(found.group(1)), int(found.group(2))
    assert own.own_s > 0.8                                     # the bench itself was busy ...
    assert others <= cpus - own.own_s / own.wall_s + 0.25      # ... and none of that is in the verdict
