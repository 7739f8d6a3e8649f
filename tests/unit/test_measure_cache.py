"""The measurement cache trusts nothing it reads and loses nothing it measured: entries out of range
are dropped and measured again, a linked cache is written through its link, and every entry says how
busy the machine was, so that a busy machine's times are measured again once it is quiet, or
flagged in the plan, never silently reused."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import models
from cost_models.machine_load import LoadMeter
from cost_models.measure import MeasureOptions, measure_ops
from cost_models.measure_cache import MAX_SAMPLE_S, MeasurementCache
from cost_models.profiled import ProfiledCosts
from cost_models.profiler import profile_graph
from cost_models.profiles import load_profile
from cost_models.signature import environment
from partitioner import Plan, from_module, partition
from tests.unit.test_measure import BUSY, FAST, QUIET


@pytest.fixture(scope="module")
def mlp():  # noqa: ANN201
    module, inputs = models.get("mlp", "tiny")
    return from_module(module, inputs), inputs


def entries(path: Path) -> dict:
    return json.loads(path.read_text())["entries"]


# -- what the file may hold -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0.0, 3600.0, math.inf, math.nan, -1e-6])
def test_an_entry_out_of_range_is_dropped_with_a_log_line_and_measured_again(
        mlp, tmp_path: Path, bad: float, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    graph, inputs = mlp
    path = tmp_path / "m.json"
    measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache.load(path), meter=QUIET)
    data = json.loads(path.read_text())
    forward = sorted(k for k in data["entries"] if "|forward|" in k)
    poisoned, kept = forward[0], forward[1]
    data["entries"][poisoned]["samples"] = [bad] * 5
    path.write_text(json.dumps(data))          # json writes inf and nan as Infinity and NaN, and reads them back
    with caplog.at_level(logging.WARNING, logger="cost_models.measure_cache"):
        cache = MeasurementCache.load(path)
    assert "1 untrusted measurement cache entry dropped, to be measured again" in caplog.text
    assert poisoned in caplog.text
    assert cache.get(environment("cpu"), "forward", poisoned.split("|", 4)[4]) is None
    assert cache.get(environment("cpu"), "forward", kept.split("|", 4)[4]) is not None
    again = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=cache, meter=QUIET)
    assert again.passes == FAST.repeats                # measured again, not answered by the bad entry
    assert all(0 < t.forward_s < 1.0 for t in again.ops.values())
    assert all(0 < s < 1.0 for s in entries(path)[poisoned]["samples"])   # the file no longer holds it


def test_a_backward_of_zero_is_a_time_and_a_sample_over_the_bound_is_not(tmp_path: Path) -> None:
    env = environment("cpu")
    path = tmp_path / "m.json"
    cache = MeasurementCache(path)
    cache.put(env, "backward", "aten.view.default(f32[2])", [0.0, 0.0, 0.0])   # no autograd node: no backward
    cache.put(env, "forward", "aten.mm.default(f32[2,2])", [MAX_SAMPLE_S * 2])
    cache.save()
    loaded = MeasurementCache.load(path)
    assert loaded.get(env, "backward", "aten.view.default(f32[2])").samples == (0.0, 0.0, 0.0)
    assert loaded.get(env, "forward", "aten.mm.default(f32[2,2])") is None


# -- writing it -----------------------------------------------------------------------------


def test_a_linked_cache_is_written_through_its_link_and_keeps_every_entry(mlp, tmp_path: Path) -> None:  # noqa: ANN001
    graph, inputs = mlp
    shared = tmp_path / "shared"
    shared.mkdir()
    target, link = shared / "measurements.json", tmp_path / "measurements.json"
    first = MeasurementCache(target)
    first.put(environment("cpu"), "forward", "an.op.measured.before(f32[1])", [1e-6, 1e-6, 1e-6])
    first.save()
    link.symlink_to(target)
    measured = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache.load(link),
                           meter=QUIET)
    assert measured.passes == FAST.repeats and all(t.forward_s > 0 for t in measured.ops.values())
    assert link.is_symlink() and os.readlink(link) == str(target)      # still a link, to the same file
    on_disk = entries(target)
    assert any("an.op.measured.before" in k for k in on_disk)           # what was there is kept
    assert len(on_disk) == 1 + len({t.signature for t in measured.ops.values()})
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_cache_that_cannot_be_written_loses_no_measurement(mlp, tmp_path: Path, caplog) -> None:  # noqa: ANN001
    graph, inputs = mlp
    (tmp_path / "file").write_text("a file, not a folder")
    cache = MeasurementCache(tmp_path / "file" / "measurements.json")   # its folder cannot exist
    with caplog.at_level(logging.WARNING, logger="cost_models.measure"):
        measured = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=cache, meter=QUIET)
    assert all(t.forward_s > 0 for t in measured.ops.values())
    assert "the measurements are used but not kept" in caplog.text


# -- how busy the machine was -----------------------------------------------------------------


def test_an_entry_measured_while_busy_says_so_and_is_measured_again_when_quiet(
        mlp, tmp_path: Path) -> None:  # noqa: ANN001
    graph, inputs = mlp
    path = tmp_path / "m.json"
    busy = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache.load(path),
                       meter=BUSY)
    assert busy.busy == set(busy.ops)
    counts = {k: len(e["samples"]) for k, e in entries(path).items()}
    assert all(e["busy"] and e["load"] == pytest.approx(1.8) for e in entries(path).values() if e["samples"])
    quiet = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache.load(path),
                        meter=QUIET)
    assert quiet.passes == FAST.repeats and quiet.cached == 0 and not quiet.busy     # measured again
    for key, e in entries(path).items():
        assert not e["busy"] and e["load"] == 0
        assert len(e["samples"]) == counts[key]        # the busy samples replaced, not kept beside the quiet ones
    after = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache.load(path),
                        meter=BUSY)
    assert after.passes == 0 and not after.busy                 # quiet entries are reused, busy or not


def test_a_busy_entry_reused_while_still_busy_is_flagged_in_the_plan(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    module, inputs = models.get("mlp", "tiny")
    graph = from_module(module, inputs, name="mlp:tiny")
    devices = load_profile("cpu-gpu-npu")
    path = tmp_path / "m.json"
    profile_graph(graph, inputs, devices, bind={"npu:0": "cpu"}, options=FAST, cache=MeasurementCache.load(path),
                  meter=BUSY)
    with caplog.at_level(logging.WARNING, logger="cost_models.measure"):
        again = profile_graph(graph, inputs, devices, bind={"npu:0": "cpu"}, options=FAST,
                              cache=MeasurementCache.load(path), meter=BUSY)
    assert again.passes == 0                                      # reused while the machine is still busy ...
    assert set(again.table.busy["cpu"]) == set(graph.ops)         # ... and flagged
    assert "measured while other processes shared the CPUs" in caplog.text
    table = again.table.save(tmp_path / "costs.json")
    plan = partition(graph, None, devices, costs=str(table))
    assert plan.costs["busy"] == plan.costs["measured"] == {"cpu": len(graph.ops), "npu:0": len(graph.ops)}
    n = 2 * len(graph.ops)
    assert f"{n} of {n} ops measured while the machine was busy" in plan.summary()
    saved = plan.save(tmp_path / "plan.json")
    assert Plan.load(saved).costs["busy"] == plan.costs["busy"]
    quiet = profile_graph(graph, inputs, devices, bind={"npu:0": "cpu"}, options=FAST,
                          cache=MeasurementCache.load(path), meter=QUIET)
    assert not quiet.table.busy
    assert "busy" not in partition(graph, None, devices, costs=ProfiledCosts(quiet.table)).costs


def _burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_the_meter_counts_other_processes_and_not_this_one() -> None:
    meter = LoadMeter()
    started = time.thread_time()
    while time.thread_time() - started < 0.3:   # this process's own work ...
        pass
    own = meter.reading()
    assert own.own_s >= 0.25                     # ... is counted as its own, not as other processes'
    burners = _burners(len(os.sched_getaffinity(0)))
    try:
        before = [_cpu_s(p.pid) for p in burners]
        meter.restart()
        time.sleep(0.5)
        reading = meter.reading()
        burned = sum(_cpu_s(p.pid) for p in burners) - sum(before)
        assert reading.others_s >= burned - reading.resolution_s   # every CPU second of the burners is counted
        assert reading.busy and "other processes used" in reading.describe()
    finally:
        for p in burners:
            p.kill()
            p.wait()


def test_two_profiles_saving_the_same_cache_keep_each_others_entries(tmp_path: Path) -> None:
    path, env = tmp_path / "m.json", environment("cpu")
    one, other = MeasurementCache.load(path), MeasurementCache.load(path)   # two processes, started together
    one.put(env, "forward", "aten.relu.default(f32[4])", [1e-6, 2e-6, 3e-6])
    other.put(env, "forward", "aten.mm.default(f32[4,4])", [4e-6, 5e-6, 6e-6])
    one.save()
    other.save()
    merged = MeasurementCache.load(path)
    assert merged.get(env, "forward", "aten.relu.default(f32[4])").samples == (1e-6, 2e-6, 3e-6)
    assert merged.get(env, "forward", "aten.mm.default(f32[4,4])").samples == (4e-6, 5e-6, 6e-6)
