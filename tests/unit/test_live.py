"""Live device state: the memory probe (NVML, torch, the profile, each fallback said), the caps of
``--devices detect``, fallback plans in the plan file, which plan fits, ``hetpart watch`` and bad input.

NVML and CUDA are absent here: their answers come from stand-ins of ``pynvml`` (put in
``sys.modules``) and of ``torch.cuda`` (passed to :class:`CudaReader`); the code under test, the
fallback order and the notes, is the real one.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

import models
from cost_models.live_memory import CudaReader, DeviceReading, detect_devices, parse_margin, profile_for, read_devices
from cost_models.profiles import DeviceSet, load_profile
from partitioner import Plan, partition
from partitioner.cli import main
from partitioner.errors import HetpartError, NoPlanFits, ProfileError
from partitioner.plan import PlanFormatError
from partitioner.plan.live import plan_that_fits

GiB = 2**30
CAP = 26_000_000  # cuda:0 cap of the primary plan: mlp:small (24.5 MiB) just fits on the GPU
FRACTIONS = (0.6, 0.3)


# -- stand-ins for NVML and a CUDA torch ------------------------------------------------------------

def fake_pynvml(free: int, total: int, util: float = 37.0, fail_memory: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)

    def memory(handle: object) -> types.SimpleNamespace:
        if fail_memory:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return types.SimpleNamespace(free=free, total=total, used=total - free)

    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=util, memory=10)
    return nv


def fake_cuda_torch(free: int, total: int) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                 mem_get_info=lambda index: (free, total))
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


# -- the probe's fallbacks ----------------------------------------------------------------------------

def test_nvml_answers_first_with_used_memory_and_utilisation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(free=30 * GiB, total=141 * GiB))
    readings, notes = read_devices(load_profile("h200-host"))
    (r,) = readings
    assert (r.device, r.source, r.free, r.total, r.used, r.utilization) == \
        ("cuda:0", "nvml", 30 * GiB, 141 * GiB, 111 * GiB, 37.0)
    assert notes == ()


def test_nvml_missing_falls_back_to_torch_and_says_so(no_nvml: None) -> None:
    reader = CudaReader(torch_module=lambda: fake_cuda_torch(free=20 * GiB, total=141 * GiB))
    readings, notes = read_devices(load_profile("h200-host"), reader=reader)
    assert (readings[0].source, readings[0].free, readings[0].used) == ("torch", 20 * GiB, None)
    assert any(n.startswith("NVML missing") and "used torch.cuda.mem_get_info" in n for n in notes), notes


def test_nvml_failing_on_a_device_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(1, 2, fail_memory=True))
    reader = CudaReader(torch_module=lambda: fake_cuda_torch(free=5 * GiB, total=141 * GiB))
    readings, notes = read_devices(load_profile("h200-host"), reader=reader)
    assert readings[0].source == "torch"
    assert any("NVML failed (NVML_ERROR_GPU_IS_LOST)" in n for n in notes), notes


def test_no_nvml_and_no_cuda_uses_the_profile_and_says_both(no_nvml: None) -> None:
    profile = load_profile("cpu-gpu-npu")
    readings, notes = read_devices(profile)  # the real torch of this machine: no CUDA
    assert [(r.device, r.source, r.free) for r in readings] == \
        [(d, "profile", profile.device(d).memory) for d in ("cuda:0", "npu:0")]
    text = "\n".join(notes)
    assert "NVML missing" in text and "cuda:0: no CUDA: used the profile's capacity" in text
    assert "npu:0: not a CUDA device: used the profile's capacity" in text


# -- detect: caps and the record ---------------------------------------------------------------------

def test_detect_caps_each_accelerator_at_free_minus_margin() -> None:
    reading = (DeviceReading("cuda:0", "nvml", free=40 * GiB, total=100 * GiB, used=60 * GiB, utilization=90.0),)
    share = detect_devices("h200-host", margin=0.05, readings=reading)
    assert share.device("cuda:0").memory == 40 * GiB - 5 * GiB
    fixed = detect_devices("h200-host", margin="2GiB", readings=reading)
    assert fixed.device("cuda:0").memory == 38 * GiB
    assert fixed.device("cpu") == load_profile("h200-host").device("cpu")  # the CPU is never capped
    record = fixed.probe.to_dict()
    assert record["margin"] == {"bytes": 2 * GiB} and record["base"] == "builtin:h200-host"
    assert record["devices"]["cuda:0"] == {"source": "nvml", "free": 40 * GiB, "total": 100 * GiB,
                                           "used": 60 * GiB, "utilization": 90.0, "cap": 38 * GiB}


def test_detect_here_falls_back_to_the_profile_and_keeps_the_margin(no_nvml: None) -> None:
    profile = DeviceSet.detect("h200-host")
    memory = load_profile("h200-host").device("cuda:0").memory
    assert profile.device("cuda:0").memory == memory - int(0.05 * memory)
    assert profile.probe.readings[0].source == "profile"
    assert any("no CUDA: used the profile's capacity" in n for n in profile.probe.notes)
    assert profile_for("detect").probe is not None  # this machine's own profile as the base


def test_a_device_with_nothing_left_after_the_margin_is_an_error() -> None:
    reading = (DeviceReading("cuda:0", "torch", free=GiB, total=100 * GiB),)
    with pytest.raises(ProfileError, match=r"cuda:0: 1.00 GiB free now \(torch\), nothing left after the margin"):
        detect_devices("h200-host", margin=0.05, readings=reading)


@pytest.mark.parametrize("bad", ["detect:nosuch", "detect:"])
def test_unknown_base_profile_is_named(bad: str) -> None:
    with pytest.raises(ProfileError, match="detect:"):
        profile_for(bad)
    with pytest.raises(ProfileError, match="base profile"):
        partition(*models.get("mlp", "tiny"), bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.5, "lots", "-5%", True])
def test_bad_margin_is_refused(bad: object) -> None:
    with pytest.raises(ProfileError, match="margin"):
        parse_margin(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [[1.5], [0], [0.0], [-0.25], [1], [0.5, 0.5], "0.5", [True], [float("nan")]])
def test_fallback_fractions_outside_the_open_interval_are_refused(bad: object) -> None:
    module, inputs = models.get("mlp", "tiny")
    with pytest.raises(HetpartError, match="fallback"):
        partition(module, inputs, "h200-host", fallbacks=bad)


def test_cli_refuses_bad_fallbacks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "mlp:tiny", "--fallbacks", "0.5,1.2"])
    assert exc.value.code == 2
    assert "fallback fraction 1.2 is outside (0, 1)" in capsys.readouterr().err


# -- fallback plans: solved, recorded, read back -----------------------------------------------------

@pytest.fixture(scope="module")
def live_plan() -> Plan:
    module, inputs = models.get("mlp", "small", device="meta")
    return partition(module, inputs, "detect:h200-host", memory={"cuda:0": CAP}, fallbacks=FRACTIONS, time_limit=20)


def test_fallback_plans_place_differently_within_their_caps(live_plan: Plan) -> None:
    plans = [live_plan, *(f.plan for f in live_plan.fallbacks)]
    assert [f.fraction for f in live_plan.fallbacks] == list(FRACTIONS)
    for fraction, fallback in zip(FRACTIONS, plans[1:]):
        assert fallback.memory["cuda:0"]["capacity"] == int(fraction * CAP)
        assert fallback.memory["cuda:0"]["used"] <= int(fraction * CAP)
        assert fallback.fingerprint == live_plan.fingerprint and fallback.inputs == live_plan.inputs
    layouts = {(tuple(sorted(p.placement.items())), tuple(sorted(p.weights.items()))) for p in plans}
    assert len(layouts) == 3  # three different placements, not three copies
    used = [p.memory["cuda:0"]["used"] for p in plans]
    assert used == sorted(used, reverse=True) and used[0] > used[1] > used[2]


def test_the_plan_records_the_probe_and_round_trips(live_plan: Plan, tmp_path: Path) -> None:
    assert live_plan.probe["devices"]["cuda:0"]["source"] in ("nvml", "torch", "profile")
    assert live_plan.probe["margin"] == {"fraction": 0.05}
    path = live_plan.save(tmp_path / "plan.json")
    again = Plan.load(path)
    assert again == live_plan and again.fallbacks[1].plan == live_plan.fallbacks[1].plan
    assert dict(again.probe["devices"]["cuda:0"]) == dict(live_plan.probe["devices"]["cuda:0"])
    summary = live_plan.summary()
    assert "free memory read at" in summary and "fallback 0.6:" in summary and "fallback 0.3:" in summary
    older = live_plan.to_dict()
    del older["probe"], older["fallbacks"]
    assert Plan.from_dict(older).fallbacks == ()  # plans made before these sections still load


def test_forged_sections_are_refused(live_plan: Plan) -> None:
    d = live_plan.to_dict()
    d["fallbacks"][0]["plan"]["model"]["fingerprint"] = "0" * 16
    with pytest.raises(PlanFormatError, match=r"fallbacks\[0\]\.plan"):
        Plan.from_dict(d)
    d = live_plan.to_dict()
    d["fallbacks"][0]["fraction"] = 1.5
    with pytest.raises(PlanFormatError, match=r"fallbacks\[0\]\.fraction"):
        Plan.from_dict(d)
    d = live_plan.to_dict()
    d["probe"]["devices"]["cuda:0"]["source"] = "guess"
    with pytest.raises(PlanFormatError, match="probe.devices.cuda:0.source"):
        Plan.from_dict(d)


def test_plan_that_fits_takes_the_primary_else_the_first_fallback(live_plan: Plan) -> None:
    needs = [p.memory["cuda:0"]["used"] for p in (live_plan, *(f.plan for f in live_plan.fallbacks))]
    assert plan_that_fits(live_plan, {"cuda:0": needs[0]}) == 0
    assert plan_that_fits(live_plan, {"cuda:0": needs[0] - 1}) == 1
    assert plan_that_fits(live_plan, {"cuda:0": needs[2]}) == 2
    assert plan_that_fits(live_plan, {}) == 0  # a device not reported is not limited
    with pytest.raises(NoPlanFits) as exc:
        plan_that_fits(live_plan, {"cuda:0": needs[2] - 1})
    from cost_models.units import format_bytes

    assert f"cuda:0: {format_bytes(needs[2] - 1)} available, the plans need at least {format_bytes(needs[2])}" \
        in str(exc.value)
    with pytest.raises(HetpartError, match="not devices of the plan"):
        plan_that_fits(live_plan, {"cuda:7": 1})


# -- the command line --------------------------------------------------------------------------------

def test_plan_detect_then_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str], no_nvml: None) -> None:
    path = tmp_path / "plan.json"
    code = main(["plan", "mlp:small", "--devices", "detect:h200-host", "--detect-margin", "10%",
                 "--memory", f"cuda:0={CAP}", "--fallbacks", "0.6,0.3", "-o", str(path), "--time-limit", "20"])
    _, err = capsys.readouterr()
    assert code == 0 and "no CUDA: used the profile's capacity" in err
    saved = json.loads(path.read_text())
    assert saved["probe"]["margin"] == {"fraction": 0.1} and len(saved["fallbacks"]) == 2

    assert main(["watch", str(path)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.strip().startswith("device"))
    assert "primary needs" in header and "fallback 0.6 needs" in header and "fallback 0.3 needs" in header
    row = next(line for line in out.splitlines() if line.strip().startswith("cuda:0"))
    assert " profile " in row
    assert "would run now: primary" in out and "note: NVML missing" in out
    assert "planned on memory read at" in out and "(margin 10%)" in out

    assert main(["watch", str(path), "--interval", "0.01", "--count", "2"]) == 0
    assert capsys.readouterr().out.count("would run now:") == 2


def test_watch_with_nvml_shows_utilisation_and_which_plan_fits(tmp_path: Path, live_plan: Plan,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = live_plan.save(tmp_path / "plan.json")
    fallback = live_plan.fallbacks[0].plan.memory["cuda:0"]["used"]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(free=fallback, total=141 * GiB, util=83))
    assert main(["watch", str(path)]) == 0
    out = capsys.readouterr().out
    assert "would run now: fallback 0.6" in out and "83%" in out and " nvml " in out
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(free=1000, total=141 * GiB))
    assert main(["watch", str(path)]) == 1
    assert "would run now: none; no plan fits" in capsys.readouterr().out
    assert main(["watch", str(path), "--once", "--count", "2"]) == 2
    assert "--once prints once" in capsys.readouterr().err


def test_a_fallback_level_with_no_placement_names_the_fraction() -> None:
    module, inputs = models.get("mlp", "small", device="meta")
    with pytest.raises(HetpartError, match=r"fallback plan at 0.1 of the primary plan's accelerator memory"):
        partition(module, inputs, "h200-host", memory={"cuda:0": CAP}, pins={"*": "cuda:0"}, fallbacks=[0.1],
                  time_limit=20)


def test_pipeline_plans_take_no_fallbacks() -> None:
    with pytest.raises(HetpartError, match="not made for pipeline plans"):
        partition(*models.get("mlp", "tiny"), "4x-cpu-host", objective="throughput", fallbacks=[0.5])


def test_devices_shows_a_detected_profile_with_its_probe(capsys: pytest.CaptureFixture[str], no_nvml: None) -> None:
    assert main(["devices", "detect:cpu-gpu-npu"]) == 0
    out = capsys.readouterr().out
    assert "margin 5% of each device" in out and "npu:0: not a CUDA device" in out
    memory = load_profile("cpu-gpu-npu").device("cuda:0").memory
    from cost_models.units import format_bytes

    assert f"memory {format_bytes(memory - int(0.05 * memory))}" in out
