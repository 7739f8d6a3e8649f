"""The CUDA path on a real GPU: streamed weights, parameter homes, the seed case's memory, detection.

Skipped without CUDA (marker ``gpu``; ``pytest -m gpu`` runs only these, ``bench/gpu_check.py``
runs them first). What each test shows:

* streamed weights stay in *pinned* host memory and are copied on a side stream that runs beside
  compute: in a profiler trace every pinned host-to-device copy is on a stream no kernel of the
  forward uses, and at least one copy overlaps a kernel in time;
* the compute stream waits for each copy's event: with the side stream held up by a ~0.1 s sleep
  and the host weights negated between two forwards, the second forward still equals the model
  with negated weights (reading a buffer before its copy lands would give the old weights);
* every parameter lives on the device the plan puts it on, and ``check_plan`` passes on the GPU;
* the seed case (``emb-transformer:base``, cuda:0 capped below embedding + layers) emitted under
  its cap peaks within the cap plus the activation reserve of ``bench/gpu_check.py``, and the
  parameter bytes on the GPU equal the plan's;
* ``detect_local`` measures this GPU: its memory is the device's, its rates are plausible.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import models
from backends.strict_report import planned_parameters
from backends.torch.check import check_plan
from partitioner import partition
from tests.e2e.placements import plan_with_placement
from tests.gpu.tower import Tower

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

WIDTH, DEPTH, BATCH = 4096, 8, 1024      # 64 MiB of fp32 weights per layer, ~69 GFLOP per layer
ACTIVATION_RESERVE = 512 * 2**20          # as bench/gpu_check.py: activations, stream buffers, rounding


@pytest.fixture(scope="module")
def tower() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Tower(WIDTH, DEPTH).eval(), (torch.randn(BATCH, WIDTH) / WIDTH**0.5,)


def streamed_plan(model: nn.Module, inputs: tuple):  # noqa: ANN201 - a Plan
    """Every op on cuda:0; the weights of all but the first two layers streamed from the host."""
    from partitioner import from_module

    ops = [op.name for op in from_module(model, inputs).topological_order()]
    linears = [op for op in ops if op.startswith("linear")]
    return plan_with_placement(model, inputs, {op: "cuda:0" for op in ops}, profile="h200-host",
                               streamed={op: "cpu" for op in linears[2:]})


def _streamed_parameters(plan, module: nn.Module) -> list[torch.Tensor]:  # noqa: ANN001
    return [module.get_parameter(name) for op in plan.weights for name in plan.param_names[op]]


def test_streamed_weights_are_pinned_and_copied_beside_compute(tower, tmp_path: Path) -> None:  # noqa: ANN001
    model, inputs = tower
    plan = streamed_plan(model, inputs)
    assert len(plan.weights) == DEPTH - 2
    emitted = plan.emit(model)
    streamed = _streamed_parameters(plan, emitted)
    assert streamed and all(p.device.type == "cpu" and p.is_pinned() for p in streamed)
    with torch.inference_mode():
        emitted(*inputs)
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            emitted(*inputs)
            torch.cuda.synchronize()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    copies = [e for e in events if "Memcpy HtoD" in e.get("name", "") and "Pinned" in e.get("name", "")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(copies) == len(streamed), [e["name"] for e in copies]
    copy_streams = {e["args"]["stream"] for e in copies}
    kernel_streams = {e["args"]["stream"] for e in kernels}
    assert not copy_streams & kernel_streams, "streamed weights are copied on the compute stream"
    overlapping = [(c, k) for c in copies for k in kernels
                   if c["ts"] < k["ts"] + k["dur"] and k["ts"] < c["ts"] + c["dur"]]
    assert overlapping, "no weight copy ran while a kernel computed"


def test_a_fetched_weight_is_used_only_after_its_copy_lands(tower) -> None:  # noqa: ANN001
    model, inputs = tower
    plan = streamed_plan(model, inputs)
    emitted = plan.emit(model)
    reference = copy.deepcopy(model).cuda()
    x = inputs[0].cuda()
    with torch.no_grad():
        emitted(x)
        torch.cuda.synchronize()
        side = emitted._hetpart_streamer._stream
        assert side is not None and side != torch.cuda.current_stream()
        for name in (n for op in plan.weights for n in plan.param_names[op]):
            emitted.get_parameter(name).mul_(-1)        # pinned host memory, changed in place
            reference.get_parameter(name).mul_(-1)
        assert all(p.is_pinned() for p in _streamed_parameters(plan, emitted))
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)             # ~0.1 s: the next copies start late
        got = emitted(x)
        torch.cuda.synchronize()
        torch.testing.assert_close(got, reference(x), rtol=1e-4, atol=1e-5)


def test_parameters_live_on_their_planned_devices_and_the_check_passes() -> None:
    model, inputs = models.get("gpt", "small")
    plan = partition(model, inputs, "h200-host", pins={"tok_emb": "cpu", "blocks.0*": "cpu"}, streaming=False)
    assert {"cpu", "cuda:0"} <= set(plan.placement.values())
    emitted = plan.emit(model)
    state = dict(emitted.named_parameters(remove_duplicate=False)) | dict(emitted.named_buffers(remove_duplicate=False))
    for op in plan.param_ops:
        planned = torch.device(plan.weights.get(op, plan.placement[op]))
        for name in plan.param_names[op]:
            assert state[name].device.type == planned.type, f"{name} of {op} is on {state[name].device}"
    report = check_plan(plan, model, inputs, repeat=2)
    assert report.passed, report.to_text()


def test_the_seed_case_under_its_cap_stays_within_its_memory() -> None:
    model, inputs = models.get("emb-transformer", "base")
    meta, _ = models.get("emb-transformer", "base", device="meta")

    def nbytes(m: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    cap = nbytes(model.emb) + len(model.layers) // 2 * nbytes(model.layers[0]) + nbytes(model.head) // 2
    plan = partition(meta, inputs, "h200-host", memory={"cuda:0": cap},
                     no_split=models.entry("emb-transformer").no_split_classes, time_limit=60)
    assert plan.weights, "under this cap the plan streams weights"
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    emitted = plan.emit(model, example_inputs=inputs)
    on_gpu = {id(t): t for t in [*emitted.parameters(), *emitted.buffers()] if t.device.type == "cuda"}
    assert sum(t.numel() * t.element_size() for t in on_gpu.values()) == planned_parameters(plan)["cuda:0"]
    with torch.inference_mode():
        out = emitted(*inputs)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    assert peak <= cap + ACTIVATION_RESERVE, f"peak {peak:,} B over cap {cap:,} B + reserve {ACTIVATION_RESERVE:,} B"
    with torch.inference_mode():
        torch.testing.assert_close(out.cpu(), model(*inputs), rtol=1e-3, atol=1e-3)


def test_detection_measures_this_gpu() -> None:
    from cost_models.detect import detect_local

    devices = detect_local(measure=True)
    gpu = devices.device("cuda:0")
    _, total = torch.cuda.mem_get_info(0)
    assert gpu.memory == total
    assert gpu.peak("float32") > 1e12 and gpu.peak("bfloat16") > gpu.peak("float32")
    (link,) = [link for link in devices.links if "cuda:0" in link.between]
    assert link.bandwidth > 5e9
