"""Packed weights in the precision setting, the profiles, the cost model and the plan file: what a
setting offers per device, what a packed linear costs and holds, and every bad input refused by name."""

from __future__ import annotations

import json

import pytest

import models
from cost_models.costs import ANALYTIC
from cost_models.precision import (
    PrecisionError, activations, compose, packed_weight_bytes, parse_precision_text, resolve_precision, weights,
)
from cost_models.profiles import Device, DeviceKind, ProfileError, load_profile
from partitioner import Plan, partition
from partitioner.errors import HetpartError
from partitioner.ir import Op, OpClass


def test_choices_compose_an_activation_dtype_and_a_packed_weight() -> None:
    assert compose("float32", "int8") == "float32+int8" and compose("bfloat16", None) == "bfloat16"
    assert activations("bfloat16+int4") == "bfloat16" and weights("bfloat16+int4") == "int4"
    assert weights("float32") is None


def test_a_fixed_weight_dtype_packs_every_linear_on_devices_with_its_kernel() -> None:
    fixed = resolve_precision({"weights": "int8"}, load_profile("h200-host"))
    assert fixed.weights == {"cpu": ("int8",), "cuda:0": ("int8",)} and not fixed.float_weights
    assert fixed.choices({"flexible"}, "cuda:0", quantizable=True) == ("float32+int8",)
    assert fixed.choices({"flexible"}, "cuda:0") == ("float32",)  # not a linear: as before
    fp8 = resolve_precision({"weights": "fp8"}, load_profile("h200-host"))
    assert fp8.weights == {"cuda:0": ("float8",)}  # the CPU has no fp8 kernel: its linears stay float
    auto = resolve_precision({"activations": "auto", "weights": "auto"}, load_profile("h200-host"))
    assert auto.float_weights and "bfloat16" in auto.choices({"flexible"}, "cuda:0", quantizable=True)
    assert "bfloat16+int4" in auto.choices({"flexible"}, "cuda:0", quantizable=True)
    assert auto.choices({"native"}, "cpu", quantizable=True)[0] == "float32"  # a 16-bit traced linear
    assert parse_precision_text("weights=int4,keep=lm_head;*.down_proj") == {"weights": "int4",
                                                                              "keep": "lm_head;*.down_proj"}
    kept = resolve_precision(parse_precision_text("weights=int4,keep=lm_head;*.down_proj"), load_profile("h200-host"))
    assert kept.keep == ("lm_head", "*.down_proj")
    budget = resolve_precision(parse_precision_text("weights=auto,max_error=0.02"), load_profile("h200-host"))
    assert budget.max_error == budget.estimate_budget == 0.02 and budget.setting["max_error"] == 0.02


def test_bad_settings_name_the_device_the_dtype_and_the_fix() -> None:
    h200 = load_profile("h200-host")
    with pytest.raises(PrecisionError, match="device cpu has no float8 weight-only kernel .*int8, int4"):
        resolve_precision({"weights": {"cpu": "float8"}}, h200)
    with pytest.raises(PrecisionError, match="'npu:9' is not a device"):
        resolve_precision({"weights": {"npu:9": "int8"}}, h200)
    with pytest.raises(PrecisionError, match="max_error=0.02 bounds the error packed weights cost"):
        resolve_precision({"cuda:0": "bf16", "max_error": 0.02}, h200)
    with pytest.raises(PrecisionError, match=r"max_error'\]='2%': give the relative output error"):
        resolve_precision({"weights": "auto", "max_error": "2%"}, h200)
    with pytest.raises(PrecisionError, match="keep bounds packed weights"):
        resolve_precision({"cuda:0": "bf16", "keep": ["lm_head"]}, h200)
    with pytest.raises(PrecisionError, match="no device of profile 't4-flexgen' lists a weight-only kernel"):
        resolve_precision({"weights": "auto"}, load_profile("t4-flexgen"))


def test_profiles_read_and_refuse_weight_only_rates() -> None:
    cpu = Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 1e12}, "30GB/s", "2us",
                 weight_only={"int8": 186e9, "i4": 188e9}, weight_unpack={"int8": 77e9})
    assert dict(cpu.weight_only) == {"int8": 186e9, "int4": 188e9}
    with pytest.raises(ProfileError, match="not a weight dtype"):
        Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 1e12}, "30GB/s", "2us", weight_only={"int3": 1e9})
    with pytest.raises(ProfileError, match="not a FLOP/s rate"):
        Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 1e12}, "30GB/s", "2us", weight_only={"int8": -1})


def test_a_packed_linear_costs_its_kernel_and_reads_its_packed_bytes() -> None:
    """The 2-core test machine: ``_weight_int8pack_mm`` on a 8192x4096 weight at one row takes
    0.85 ms (measured); the model gives its rate, unpacking and reads."""
    cpu = Device("cpu", DeviceKind.CPU, "64GiB", {"float32": 377e9}, "58GB/s", "2us",
                 weight_only={"int8": 186e9}, weight_unpack={"int8": 77e9})
    n, k = 8192, 4096
    op = Op(name="linear", kind="aten.linear.default", op_class=OpClass.MATMUL, index=0, module_path="fc",
            module_type="Linear", dtype="float32", inputs=("x",), outputs=("linear",), params=("fc.weight",),
            owned_params=("fc.weight",), flops=2 * n * k, bytes_read=4 * k + 4 * n * k, bytes_written=4 * n,
            param_bytes=4 * n * k, trainable_param_bytes=4 * n * k)
    packed = packed_weight_bytes(n, k, "int8")
    seconds = ANALYTIC.op_time_in(op, cpu, "bfloat16+int8", weight_bytes=packed).seconds
    assert 0.6e-3 < seconds < 1.1e-3
    dense = ANALYTIC.op_time(op, cpu).seconds
    assert seconds < dense  # a quarter of the bytes
    assert ANALYTIC.op_time_in(op, load_profile("t4-flexgen").device("cpu"), "bfloat16+int8",
                               weight_bytes=packed).seconds == float("inf")  # no kernel there


def test_the_plan_file_records_packed_weights_and_refuses_edits() -> None:
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", precision={"weights": "int8"}, time_limit=20)
    section = plan.precision
    assert section["weights"] and set(section["weight_bytes"]) == set(section["weights"])
    again = Plan.from_json(plan.to_json())
    assert again.precision["weights"] == section["weights"]
    assert "weights" in plan.summary() and "in int8 on" in plan.summary()
    data = json.loads(plan.to_json())
    op = next(iter(data["precision"]["weights"]))
    data["precision"]["weights"][op] = "int3"
    with pytest.raises(HetpartError, match="int3"):
        Plan.from_json(json.dumps(data))
    data["precision"]["weights"][op] = "float8"
    data["placement"][op] = "cpu"
    with pytest.raises(HetpartError):
        Plan.from_json(json.dumps(data))
    del data["precision"]["weight_bytes"][op]
    data["precision"]["weights"][op] = "int8"
    with pytest.raises(HetpartError, match="weight_bytes"):
        Plan.from_json(json.dumps(data))
