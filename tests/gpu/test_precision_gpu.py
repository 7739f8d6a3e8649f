"""Precision plans on a real GPU (marker ``gpu``; skipped without CUDA).

* a bfloat16 plan of ``gpt:small`` emitted on ``cuda:0`` passes ``check_plan`` within the bfloat16
  tolerance, for inference and a training step;
* the seed case (``emb-transformer:base``) planned in bfloat16 on the GPU runs faster than its
  float32 plan (median of timed forwards, printed beside the plans' predictions), and its weights
  on the GPU take the bytes the plan says (half of float32's);
* ``gpt:small`` with int8 / int4 weights under a cuda:0 cap streams some linears packed: their
  packed tensors sit in pinned host memory and the outputs equal the unplaced packing.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

import models
from backends.strict_report import planned_parameters
from backends.torch.check import check_plan
from partitioner import partition

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16 = {"cuda:0": "bf16", "cpu": "bf16"}


@pytest.mark.parametrize("training", [False, True])
def test_a_bf16_plan_on_the_gpu_is_within_tolerance(training: bool) -> None:
    module, inputs = models.get("gpt", "small")
    plan = partition(module, inputs, "h200-host", precision=BF16, pins={"*": "cuda:0"}, training=training)
    report = check_plan(plan, module, inputs, training=training, repeat=3)
    assert report.passed, report.to_text()


def _median_forward(module: torch.nn.Module, inputs: tuple, repeat: int = 20) -> float:
    with torch.no_grad():
        module(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            module(*inputs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_the_seed_case_in_bf16_is_faster_than_fp32_on_the_gpu() -> None:
    module, inputs = models.get("emb-transformer", "base")
    measured, predicted = {}, {}
    for name, precision in (("fp32", None), ("bf16", BF16)):
        plan = partition(module, inputs, "h200-host", precision=precision, pins={"*": "cuda:0"}, streaming=False)
        emitted = plan.emit(module)
        resident = sum(p.numel() * p.element_size() for p in emitted.parameters() if p.is_cuda)
        resident += sum(b.numel() * b.element_size() for b in emitted.buffers() if b.is_cuda)
        assert resident == pytest.approx(planned_parameters(plan)["cuda:0"], rel=0.01)
        measured[name] = _median_forward(emitted, inputs)
        predicted[name] = plan.predicted["total_s"]
        del emitted
        torch.cuda.empty_cache()
    print(f"\nseed case on {torch.cuda.get_device_name()}: fp32 {measured['fp32'] * 1e3:.2f} ms "
          f"(predicted {predicted['fp32'] * 1e3:.2f}), bf16 {measured['bf16'] * 1e3:.2f} ms "
          f"(predicted {predicted['bf16'] * 1e3:.2f})")
    assert measured["bf16"] < measured["fp32"]


@pytest.mark.parametrize(("weight", "cap"), [("int8", "4MB"), ("int4", "2MB")])
def test_packed_weights_streamed_to_the_gpu_are_pinned_and_equal_the_unplaced_packing(weight: str, cap: str) -> None:
    """``gpt:small`` with packed weights and a cuda:0 cap below them: the linears that stream keep
    their packed tensors (packed in the GPU's layout) in pinned host memory, fetched each call, and
    the outputs equal the same packing run unplaced."""
    pytest.importorskip("torchao")
    if weight == "int4" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("int4 weight-only kernels need sm_80")
    module, inputs = models.get("gpt", "small")
    plan = partition(module, inputs, "h200-host", memory={"cuda:0": cap}, precision={"weights": weight})
    streamed = plan.precision.get("streamed", {})
    assert streamed, plan.summary()
    report = check_plan(plan, module, inputs, repeat=3)
    assert report.passed and report.packed is not None, report.to_text()
    emitted = plan.emit(module)
    fetched = emitted._hetpart_streamer.order
    packed = [name for name in fetched if f"_{weight}_" in name]
    assert len(packed) >= 2 * len(streamed)  # values and scales of each streamed linear
    for name in packed:
        tensor = emitted.get_buffer(name)
        assert tensor.device.type == "cpu" and tensor.is_pinned(), name
    with torch.no_grad():
        out = emitted(*inputs)  # inputs start on the host, as planned
    assert torch.isfinite(out).all()
