"""The analytic cost model: roofline by hand, transfers, training accounting, and the calibration bound."""

from __future__ import annotations

import statistics

import pytest

from cost_models.analytic import kernel_time, op_time, transfer_time
from cost_models.calibration import calibration_rows
from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceKind, DeviceSet, Link, load_profile
from cost_models.training import (
    Optimizer,
    backward_time,
    optimizer_step_time,
    parameter_memory,
    parse_optimizer,
    training_op_time,
)
from partitioner.ir import Op, OpClass


def _device(**overrides: object) -> Device:
    fields: dict = dict(
        name="cuda:0", kind=DeviceKind.GPU, memory="80GB", peak_flops={"float32": 1e12, "bfloat16": 4e12},
        mem_bandwidth="1TB/s", launch_overhead="10us",
        efficiency={"matmul": 0.5}, mem_efficiency={"elementwise": 0.8}, fixed_latency={"matmul": "5us"},
    )
    fields.update(overrides)
    return Device(**fields)


def _op(op_class: OpClass, flops: int, read: int, written: int, *, dtype: str = "float32",
        param_bytes: int = 0, trainable: int = 0) -> Op:
    return Op(
        name="op", kind="aten.x", op_class=op_class, index=0, module_path="", module_type="M", dtype=dtype,
        inputs=(), outputs=("op",), params=(), owned_params=(), flops=flops, bytes_read=read, bytes_written=written,
        param_bytes=param_bytes, trainable_param_bytes=trainable,
    )


def test_estimates_add_and_sum() -> None:
    total = sum([Estimate(1.0, 2.0, 3.0), Estimate(0.5, 1.0, 1.0)], Estimate())
    assert total == Estimate(1.5, 3.0, 4.0)
    assert sum([Estimate(1.0), Estimate(2.0)]) == Estimate(3.0)
    assert Estimate(2.0, 4.0, 6.0).scaled(0.5) == Estimate(1.0, 2.0, 3.0)


def test_compute_bound_op_by_hand() -> None:
    # 1e9 FLOPs at 1e12 · 0.5 = 2 ms; 1 MB at 1 TB/s · default efficiency is far less
    t = op_time(_op(OpClass.MATMUL, 10**9, 10**6, 0), _device()).seconds
    assert t == pytest.approx(2e-3 + 10e-6 + 5e-6)


def test_memory_bound_op_by_hand() -> None:
    # 8e8 bytes at 1e12 · 0.8 = 1 ms; the FLOPs at the default elementwise efficiency take less
    t = op_time(_op(OpClass.ELEMENTWISE, 10**6, 4 * 10**8, 4 * 10**8), _device()).seconds
    assert t == pytest.approx(1e-3 + 10e-6)


def test_dtype_changes_the_peak() -> None:
    fp32 = op_time(_op(OpClass.MATMUL, 10**10, 0, 0), _device()).seconds
    bf16 = op_time(_op(OpClass.MATMUL, 10**10, 0, 0, dtype="bfloat16"), _device()).seconds
    assert fp32 - 15e-6 == pytest.approx(4 * (bf16 - 15e-6))


def test_cache_resident_traffic_streams_at_cache_bandwidth() -> None:
    cached = _device(cache_size="10MB", cache_bandwidth="4TB/s")
    small = _op(OpClass.ELEMENTWISE, 0, 4 * 10**6, 4 * 10**6)
    large = _op(OpClass.ELEMENTWISE, 0, 4 * 10**8, 4 * 10**8)
    assert op_time(small, cached).seconds == pytest.approx(8e6 / (4e12 * 0.8) + 10e-6)
    assert op_time(large, cached).seconds == pytest.approx(op_time(large, _device()).seconds)


def test_views_are_free() -> None:
    assert op_time(_op(OpClass.VIEW, 0, 0, 0), _device()) == Estimate()
    assert kernel_time(OpClass.VIEW, "float32", 10, 10, _device()) == Estimate()


def _three_devices() -> DeviceSet:
    cpu = Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 1e12}, "30GB/s", "2us")
    gpu = _device()
    npu = Device("npu:0", DeviceKind.NPU, "16GiB", {"float32": 1e13}, "800GB/s", "20us")
    links = (
        Link(("cpu", "cuda:0"), "50GB/s", "10us", pageable_bandwidth="10GB/s"),
        Link(("cpu", "npu:0"), "10GB/s", "30us"),
    )
    return DeviceSet("three", (cpu, gpu, npu), links)


def test_transfer_time_on_a_direct_link() -> None:
    ds = _three_devices()
    assert transfer_time(5 * 10**9, "cpu", "cuda:0", ds).seconds == pytest.approx(10e-6 + 0.1)
    assert transfer_time(5 * 10**9, "cpu", "cuda:0", ds, pinned=False).seconds == pytest.approx(10e-6 + 0.5)
    assert transfer_time(10**6, "cuda:0", "cuda:0", ds) == Estimate()


def test_transfer_without_a_direct_link_goes_through_the_host() -> None:
    ds = _three_devices()
    t = transfer_time(10**9, "cuda:0", "npu:0", ds)
    assert t.seconds == pytest.approx((10e-6 + 1e9 / 50e9) + (30e-6 + 1e9 / 10e9))
    assert t.bytes == 1e9


def test_training_memory_per_optimizer() -> None:
    op = _op(OpClass.MATMUL, 0, 0, 0, param_bytes=1000, trainable=800)
    assert parameter_memory(op, "adam", training=False) == 1000
    assert parameter_memory(op, "sgd", training=True) == 200 + 800 * 2
    assert parameter_memory(op, "sgd-momentum", training=True) == 200 + 800 * 3
    assert parameter_memory(op, Optimizer.ADAM, training=True) == 200 + 800 * 4
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        parse_optimizer("lamb")


def test_optimizer_step_streams_its_passes_through_memory() -> None:
    gpu = _device()  # elementwise streams at 0.8 TB/s
    assert optimizer_step_time(10**9, gpu, "adam").seconds == pytest.approx(7e9 / 0.8e12 + 10e-6)
    assert optimizer_step_time(10**9, gpu, "sgd").seconds == pytest.approx(3e9 / 0.8e12 + 10e-6)
    assert optimizer_step_time(0, gpu, "sgd") == Estimate()


def test_backward_is_twice_forward_and_embeddings_write_a_dense_gradient() -> None:
    gpu = _device()
    mm = _op(OpClass.MATMUL, 10**10, 0, 0)
    fwd = op_time(mm, gpu).seconds - 15e-6
    assert backward_time(mm, gpu).seconds - 15e-6 == pytest.approx(2 * fwd)
    assert training_op_time(mm, gpu).seconds == pytest.approx(op_time(mm, gpu).seconds + backward_time(mm, gpu).seconds)
    emb = _op(OpClass.GATHER, 0, 1000, 1000, param_bytes=10**9, trainable=10**9)
    dense = kernel_time(OpClass.ELEMENTWISE, "float32", 0, 10**9, gpu).seconds
    assert backward_time(emb, gpu).seconds == pytest.approx(kernel_time(OpClass.GATHER, "float32", 0, 4000, gpu).seconds + dense)


# -- the analytic model against the H200 calibration (bench/cost_fidelity.py prints the table) --------


def test_h200_host_predicts_the_calibration_rows() -> None:
    profile = load_profile("h200-host")
    cpu, gpu = profile.device("cpu"), profile.device("cuda:0")
    rows = calibration_rows()
    assert len(rows) == 45
    gpu_errors, cpu_errors = [], []
    for row in rows:
        # the front end counts what the measurement counted
        assert row.captured.bytes_read + row.captured.bytes_written == row.bytes, row.label
        if row.op in ("linear", "conv2d", "sdpa"):
            assert row.captured.flops == pytest.approx(row.flops, rel=0.03), row.label
        cpu_pred, gpu_pred = op_time(row.captured, cpu).seconds, op_time(row.captured, gpu).seconds
        if row.gpu_s and row.gpu_s > 50e-6:
            gpu_errors.append(abs(gpu_pred - row.gpu_s) / row.gpu_s)
        if row.cpu_s and row.cpu_s > 1e-3:
            cpu_errors.append(abs(cpu_pred - row.cpu_s) / row.cpu_s)
        if row.cpu_s and row.gpu_s:
            assert (cpu_pred > gpu_pred) == (row.cpu_s > row.gpu_s), f"CPU/GPU order wrong for {row.label}"
    assert len(gpu_errors) >= 25 and len(cpu_errors) >= 25
    assert statistics.median(gpu_errors) <= 0.25
    assert statistics.median(cpu_errors) <= 0.25
