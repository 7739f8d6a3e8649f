"""Calibration: the fit recovers a known device from its own predictions, says when a fit is poor,
and ``hetpart calibrate`` / ``hetpart profile`` write files the planner reads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cost_models.analytic import op_time, weight_rows
from cost_models.copies import CopyTime
from cost_models.fit import fit_device, fit_link
from cost_models.microbench import FirstTouch, Row, suites
from cost_models.profiles import Device, DeviceKind, load_profile
from partitioner import from_module
from partitioner.cli import main

TRUE = Device("cpu", DeviceKind.CPU, 2**34, {"float32": 2e11, "bfloat16": 4e11}, 40e9, 2e-6,
              efficiency={"matmul": 0.8, "conv": 0.5, "attention": 0.4, "elementwise": 0.05, "norm": 0.3,
                          "softmax": 0.2, "reduction": 0.5, "pool": 0.2},
              mem_efficiency={"elementwise": 0.9, "norm": 0.6, "gather": 0.5, "data_movement": 1.0},
              fixed_latency={"view": 1.5e-6}, cache_size=8 * 2**20, cache_bandwidth=200e9,  # what the sweep resolves
              alloc_threshold=32 * 2**20, first_touch_bandwidth=5e9)
TOUCH = FirstTouch(32 * 2**20, 5e9, 0.02, 0.001, 2**26)


@pytest.fixture(scope="module")
def captured() -> list[tuple[str, object, tuple[int, ...]]]:
    """Every op of the micro-benchmark suites as captured (no measuring)."""
    out = []
    for suite in suites(quick=True):
        module, inputs = suite.build()
        graph = from_module(module, inputs, name=suite.name)
        out += [(suite.name, op, graph.tensors[op.outputs[0]].shape) for op in graph]
    return out


def _rows(captured, scale=lambda row: 1.0) -> list[Row]:  # noqa: ANN001
    rows = [Row(suite, op, tuple(shape), op_time(op, TRUE).seconds) for suite, op, shape in captured]
    return [dataclasses.replace(r, seconds=r.seconds * scale(r)) for r in rows]


def test_the_fit_recovers_a_device_from_its_own_predictions(captured) -> None:  # noqa: ANN001
    fit = fit_device("cpu", DeviceKind.CPU, 2**34, _rows(captured), first_touch=TOUCH)
    d = fit.device
    assert not fit.poor and fit.median_error < 0.05 and fit.worst.error < 0.25, fit.notes[0]
    assert d.launch_overhead == pytest.approx(2e-6, rel=0.01)
    assert d.fixed("view") == pytest.approx(1.5e-6, rel=0.01)
    assert d.peak("float32") == pytest.approx(2e11 * 0.8, rel=0.05)      # the best matmul rate
    assert d.alloc_threshold == TOUCH.threshold and d.first_touch_bandwidth == TOUCH.bandwidth
    assert "fit good" in fit.notes[0] and any("residuals" in n for n in fit.notes)


def test_the_fit_recovers_how_a_matmuls_rate_depends_on_its_rows(captured) -> None:  # noqa: ANN001
    """Rows priced with matmul_half_rows = 32 (the quick suite's Linears have 64 and 256 rows per
    weight) give back 32; a device without it (the test above) gives back 0."""
    true = dataclasses.replace(TRUE, matmul_half_rows=32.0)
    rows = [Row(suite, op, tuple(shape), op_time(op, true).seconds) for suite, op, shape in captured]
    fit = fit_device("cpu", DeviceKind.CPU, 2**34, rows, first_touch=TOUCH)
    assert fit.device.matmul_half_rows == 32.0 and not fit.poor, fit.notes[0]
    assert "half their efficiency at 32 rows" in fit.notes[1]
    linears = [r for r in rows if r.op.op_class.value == "matmul" and r.op.param_bytes]
    assert {weight_rows(r.op) for r in linears} == {64.0, 256.0}  # float32 and bfloat16 weights
    for r in linears:  # the fitted device prices them as the true one
        assert op_time(r.op, fit.device).seconds == pytest.approx(r.seconds, rel=0.15)  # the grids' steps
    plain = fit_device("cpu", DeviceKind.CPU, 2**34, _rows(captured), first_touch=TOUCH)
    assert plain.device.matmul_half_rows == 0.0


def test_a_poor_fit_says_so(captured) -> None:  # noqa: ANN001
    noisy = _rows(captured, scale=lambda r: 4.0 if r.op.op_class.value in ("matmul", "conv", "norm") and
                  r.op.dtype == "float32" and r.shape[0] % 2 == 0 else 0.3)
    fit = fit_device("cpu", DeviceKind.CPU, 2**34, noisy, first_touch=TOUCH)
    assert fit.poor and fit.notes[0].startswith("cpu") and "POOR FIT" in fit.notes[0] and "re-run" in fit.notes[0]


def test_a_fit_poor_in_one_row_names_its_class_not_a_busy_machine(captured) -> None:  # noqa: ANN001
    """A good median with one pooling row a hundred times faster than its class (an under-predicted
    row is off by less than 100%): the verdict is poor and says which class, not a busy machine."""
    pools = [i for i, (_, op, _) in enumerate(captured) if op.op_class.value == "pool"]
    one = pools[0]
    rows = _rows(captured)
    rows[one] = dataclasses.replace(rows[one], seconds=rows[one].seconds / 100)
    fit = fit_device("cpu", DeviceKind.CPU, 2**34, rows, first_touch=TOUCH)
    assert fit.poor and fit.median_error < 0.25, fit.notes[0]
    assert "the median is good: the pool row past the limit" in fit.notes[0] and "probably busy" not in fit.notes[0]


def test_a_link_fit_reads_latency_and_both_bandwidths() -> None:
    copies = [CopyTime(a, b, pinned, n, 15e-6 + n / (50e9 if pinned else 10e9))
              for a, b in (("cpu", "cuda:0"), ("cuda:0", "cpu")) for pinned in (True, False)
              for n in (4096, 2**20, 2**24, 2**28)]
    fit = fit_link("cpu", "cuda:0", copies)
    assert fit.link.latency == pytest.approx(15e-6, rel=0.01)
    assert fit.link.bandwidth == pytest.approx(50e9, rel=0.02)
    assert fit.link.pageable_bandwidth == pytest.approx(10e9, rel=0.02)
    assert not fit.poor


def test_cli_calibrate_writes_a_profile_with_residuals_and_its_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "my-host.toml"
    code = main(["calibrate", "--devices", "detect", "--quick", "--repeats", "2", "--strict", "-o", str(out)])
    text = out.read_text()
    profile = load_profile(str(out))
    assert profile.name == "my-host" and profile.device("cpu").launch_overhead > 0
    assert "# cpu: residuals" in text and "measured" in text and "predicted" in text
    poor = "POOR FIT" in text                                      # on a busy machine the fit may be poor:
    assert code == (1 if poor else 0)                              # then it says so (--strict: exit 1)
    assert ("poor" in capsys.readouterr().err) == poor
    assert main(["calibrate", "--quick", "-o", str(out)]) == 2    # never over an existing file without --force


def test_cli_profile_writes_costs_that_plan_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETPART_CACHE", str(tmp_path / "cache.json"))
    costs = tmp_path / "costs.json"
    argv = ["profile", "mlp:tiny", "--devices", "cpu-gpu-npu", "--bind", "npu:0=cpu", "--repeats", "2", "-o", str(costs)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cpu (for cpu, npu:0): 5 ops measured" in out and "not measured" in out and "cuda:0" in out
    assert "cache: 0 measurements" in out
    assert main([*argv, "--force"]) == 0
    assert re.search(r"cache: [1-9]\d* measurements", capsys.readouterr().out)   # the second run: from the cache
    assert main(["plan", "mlp:tiny", "--devices", "cpu-gpu-npu", "--costs", str(costs), "--solver", "single:cpu"]) == 0
    assert "costs      profiled (" in capsys.readouterr().out
    assert main(["profile", "mlp:tiny", "--devices", "cpu", "--bind", "gpu=cpu"]) == 2
    assert "has no device 'gpu'" in capsys.readouterr().err


def test_views_cost_their_call_and_large_outputs_their_first_touch() -> None:
    from cost_models.analytic import kernel_time
    from partitioner.ir import OpClass

    assert kernel_time(OpClass.VIEW, "float32", 0, 0, TRUE).seconds == 1.5e-6
    small = kernel_time(OpClass.DATA_MOVEMENT, "float32", 0, 2 * 2**24, TRUE, fresh=2**24)      # 16 MiB out
    large = kernel_time(OpClass.DATA_MOVEMENT, "float32", 0, 2 * 2**26, TRUE, fresh=2**26)     # 64 MiB out
    assert small.seconds == pytest.approx(2e-6 + 2 * 2**24 / 40e9)                     # below the threshold
    assert large.seconds == pytest.approx(2e-6 + 2 * 2**26 / 40e9 + 2**26 / 5e9)      # fresh pages: faulted in
    with pytest.raises(Exception, match="go together"):
        dataclasses.replace(TRUE, first_touch_bandwidth=0.0)


def test_the_fit_recovers_a_grouped_convolutions_backward_rate(captured) -> None:  # noqa: ANN001
    """Depthwise convolutions whose backward runs at 4 GFLOP/s give back 4 GFLOP/s (and their
    predictions in the notes); ones whose backward is as fast as their class leave the field 0."""
    from cost_models.fit import fit_grouped_backward
    from cost_models.microbench import GROUPED_CONVS, BackwardRow, _Grouped, _r
    from cost_models.training import backward_time

    fit = fit_device("cpu", DeviceKind.CPU, 2**34, _rows(captured), first_touch=TOUCH)
    module = _Grouped(GROUPED_CONVS)
    graph = from_module(module, tuple(_r(n, c, h, h) for n, c, h, _ in GROUPED_CONVS))
    convs = [op for op in graph.topological_order() if op.op_class.value == "conv"]
    assert [op.groups for op in convs] == [c for _, c, _, _ in GROUPED_CONVS]
    slow = [BackwardRow(op, 2 * op.flops / 4e9 + fit.device.launch_overhead) for op in convs]
    fitted = fit_grouped_backward(fit, slow)
    assert fitted.device.grouped_backward_flops == pytest.approx(4e9, rel=0.01)
    assert any("grouped convolutions' backward: 4 GFLOP/s" in n for n in fitted.notes)
    for r in slow:
        assert backward_time(r.op, fitted.device).seconds == pytest.approx(r.backward_s, rel=0.01)
    fast = [BackwardRow(op, backward_time(op, fit.device).seconds) for op in convs]
    assert fit_grouped_backward(fit, fast).device.grouped_backward_flops == 0.0
