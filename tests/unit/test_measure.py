"""The measurement runner and its cache: every op timed in place, cached, and bad input handled."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import models
from cost_models.machine_load import LoadReading
from cost_models.measure import MeasureOptions, measure_ops
from cost_models.measure_cache import MeasurementCache
from cost_models.signature import Environment, environment
from partitioner import from_module
from partitioner.errors import HetpartError
from partitioner.ir import OpClass

FAST = MeasureOptions(repeats=2, min_repeats=2, budget_s=2.0)


class FixedLoad:
    """A machine of 2 CPUs on which other processes do ``load`` CPUs' worth of work, however long
    the span: what the measuring code reads, so that a test of the cache does not depend on what
    else runs on the machine (cost_models.machine_load reads the real one)."""

    def __init__(self, load: float) -> None:
        self.load = load
        self.restart()

    def restart(self) -> None:
        self.started = time.perf_counter()

    def reading(self) -> LoadReading:
        wall = max(time.perf_counter() - self.started, 1e-3)
        return LoadReading(self.load * wall, 0.0, wall, 2)


QUIET, BUSY = FixedLoad(0.0), FixedLoad(1.8)


@torch.library.custom_op("hetpart_test::accel_only", mutates_args=())
def accel_only(x: torch.Tensor) -> torch.Tensor:
    """An op with a kernel for accelerators only: it raises on the CPU, as a CUDA-only extension does."""
    if x.device.type == "cpu":
        raise NotImplementedError("accel_only has no CPU kernel")
    return x * 2


@accel_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class AccelOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.ops.hetpart_test.accel_only(self.a(x)))


@pytest.fixture(scope="module")
def mlp():  # noqa: ANN201
    module, inputs = models.get("mlp", "tiny")
    return from_module(module, inputs), inputs


def test_every_op_is_timed_and_a_second_run_comes_from_the_cache(mlp, tmp_path: Path) -> None:  # noqa: ANN001
    graph, inputs = mlp
    cache = MeasurementCache.load(tmp_path / "m.json")
    first = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=cache, meter=QUIET)
    assert first.passes == FAST.repeats and not first.unsupported and first.cached == 0
    for op in graph:
        assert first.ops[op.name].forward_s > 0, op.name
    assert (tmp_path / "m.json").exists()
    again = measure_ops(graph.source.module(), inputs, "cpu", options=FAST,
                        cache=MeasurementCache.load(tmp_path / "m.json"), meter=QUIET)
    assert again.passes == 0                                           # nothing measured a second time
    assert again.cached == len({t.signature for t in first.ops.values()})
    assert {op: t.forward_s for op, t in again.ops.items()} == {op: t.forward_s for op, t in first.ops.items()}


def test_entries_of_another_torch_version_or_thread_count_are_not_used(mlp, tmp_path: Path) -> None:  # noqa: ANN001
    graph, inputs = mlp
    cache = MeasurementCache.load(tmp_path / "m.json")
    measured = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=MeasurementCache())
    here = environment("cpu")
    for env in (Environment(here.device, "1.0.0", here.threads), Environment(here.device, here.torch, here.threads + 7)):
        for t in measured.ops.values():
            cache.put(env, "forward", t.signature, [1000.0] * 5)   # an absurd time nobody should read
    again = measure_ops(graph.source.module(), inputs, "cpu", options=FAST, cache=cache)
    assert again.passes == FAST.repeats and again.cached == 0
    assert again.stale == len({t.signature for t in measured.ops.values()})
    assert all(t.forward_s < 1.0 for t in again.ops.values())


def test_training_passes_time_backward_and_the_optimizer(mlp) -> None:  # noqa: ANN001
    graph, inputs = mlp
    before = {k: v.clone() for k, v in graph.source.module().state_dict().items()}
    measured = measure_ops(graph.source.module(), inputs, "cpu",
                           options=MeasureOptions(repeats=2, min_repeats=2, training=True, optimizer="adam"))
    linears = [op for op in graph if op.op_class is OpClass.MATMUL]
    assert linears and all(measured.ops[op.name].backward_s > 0 for op in linears)
    assert all(measured.ops[op.name].train_forward_s > 0 for op in graph)
    assert measured.optimizer_s_per_byte["adam"] > 0
    after = graph.source.module().state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)       # the optimizer stepped a copy


def test_an_op_failing_on_the_device_is_marked_unsupported_and_the_rest_measured(tmp_path: Path) -> None:
    model, x = AccelOnly(), torch.randn(4, 8)
    graph = from_module(model, (x,))
    measured = measure_ops(graph.source.module(), (x,), "cpu", options=FAST, cache=MeasurementCache(tmp_path / "c.json"))
    assert measured.unsupported == {"accel_only": "NotImplementedError: accel_only has no CPU kernel"}
    assert measured.ops["accel_only"].forward_s is None
    assert measured.ops["linear"].forward_s > 0 and measured.ops["linear_1"].forward_s > 0   # after it too
    cached = json.loads((tmp_path / "c.json").read_text())["entries"]
    assert any(e["unsupported"] for e in cached.values())


def test_an_interrupted_measurement_keeps_what_it_measured(mlp, tmp_path: Path) -> None:  # noqa: ANN001
    graph, inputs = mlp
    calls = []

    def interrupt_after_two_passes(done: int, total: int, what: str) -> None:
        calls.append(what)
        if what.endswith("forward") and done == 2:
            raise KeyboardInterrupt    # what Ctrl-C does at that point

    options = MeasureOptions(repeats=5, min_repeats=3, budget_s=2.0)
    cut = measure_ops(graph.source.module(), inputs, "cpu", options=options,
                      cache=MeasurementCache.load(tmp_path / "m.json"), progress=interrupt_after_two_passes,
                      meter=QUIET)
    assert cut.interrupted and cut.passes == 2
    entries = json.loads((tmp_path / "m.json").read_text())["entries"]
    assert entries and all(len(e["samples"]) >= 2 for e in entries.values())   # both passes kept, on disk
    resumed = measure_ops(graph.source.module(), inputs, "cpu", options=options,
                          cache=MeasurementCache.load(tmp_path / "m.json"), meter=QUIET)
    assert not resumed.interrupted and all(t.forward_s > 0 for t in resumed.ops.values())


def test_a_corrupt_cache_file_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "m.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(HetpartError, match="not a hetpart measurement cache.*delete"):
        MeasurementCache.load(bad)
