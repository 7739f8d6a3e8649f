"""The generation-offload profiles: desktop-4090 (a 24 GB consumer GPU desktop) and t4-flexgen
(FlexGen's T4 machine): they load, carry their sourced figures, cite a source for every number,
and price a matmul and a copy the way their TOML says."""

from __future__ import annotations

import tomllib

import pytest

from cost_models.analytic import kernel_time, transfer_time
from cost_models.precision import resolve_precision
from cost_models.profiles import (
    DeviceSet, builtin_profile_path, builtin_profiles, load_profile, load_profile_text,
)
from cost_models.units import parse_bandwidth, parse_bytes
from partitioner.ir import OpClass

NEW = ("desktop-4090", "t4-flexgen")
GiB = 2**30


def test_listed_and_loaded_by_name():
    assert set(NEW) <= set(builtin_profiles())
    for name in NEW:
        ds = load_profile(name)
        assert ds.name == name and ds.source == f"builtin:{name}"
        assert ds.names() == ("cpu", "cuda:0")
        assert ds.host_device().name == "cpu"


@pytest.mark.parametrize("name", NEW)
def test_valid_throughout_and_round_trips(name):
    ds = load_profile(name)
    for device in ds:
        for op_class in OpClass:
            assert 0 < device.eff(op_class) <= 1 and 0 < device.mem_eff(op_class) <= 1
            for dtype in ("float32", "bfloat16", "float16"):
                assert 0 < device.eff(op_class, dtype) <= 1
    assert ds.route("cpu", "cuda:0") == (ds.link("cpu", "cuda:0"),)
    assert load_profile_text(ds.to_toml(), "again.toml") == ds
    assert DeviceSet.from_dict(ds.to_dict()) == ds


def test_desktop_4090_figures():
    ds = load_profile("desktop-4090")
    cpu, gpu = ds.device("cpu"), ds.device("cuda:0")
    assert gpu.memory == 24 * GiB
    assert gpu.peak("bfloat16") == gpu.peak("float16") == 165.2e12     # dense, not the 2:4 sparse 330
    assert gpu.peak("float32") == 82.6e12 and gpu.mem_bandwidth == 1008e9
    assert cpu.memory == 128 * GiB
    assert cpu.peak("float32") == 16 * 4.5e9 * 32 and cpu.peak("bfloat16") == 2 * cpu.peak("float32")
    assert 60e9 <= cpu.mem_bandwidth <= 70e9 < 89.6e9                   # achievable, below theoretical
    link = ds.link("cpu", "cuda:0")
    assert (link.bandwidth, link.pageable_bandwidth) == (25e9, 9e9)
    assert link.bandwidth < 31.5e9 and link.pageable_bandwidth < link.bandwidth


def test_t4_flexgen_figures():
    ds = load_profile("t4-flexgen")
    cpu, gpu = ds.device("cpu"), ds.device("cuda:0")
    assert gpu.memory == 15 * GiB                                      # 16 GB with ECC's 1/16 reserved
    assert gpu.peak_flops.keys() == {"float32", "float16"}
    assert (gpu.peak("float16"), gpu.peak("float32"), gpu.mem_bandwidth) == (65e12, 8.1e12, 320e9)
    # FlexGen's effective prefill rates, as fractions of the datasheet peak
    assert gpu.peak("float16") * gpu.eff("matmul", "float16") == pytest.approx(21.24e12, rel=0.02)
    assert gpu.peak("float16") * gpu.eff("attention", "float16") == pytest.approx(9.97e12, rel=0.03)
    assert cpu.peak("float32") * cpu.eff("attention", "float16") == pytest.approx(0.0123e12, rel=0.01)
    assert cpu.memory == 208 * GiB
    assert ds.link("cpu", "cuda:0").bandwidth == 12.89 * GiB             # FlexGen's GB is 1 << 30


def test_t4_has_no_bfloat16_rate():
    """A dtype not in peak_flops is priced at the float32 peak with the class's plain efficiency,
    and precision="auto" offers only the 16-bit dtypes a device lists as faster."""
    ds = load_profile("t4-flexgen")
    gpu = ds.device("cuda:0")
    assert gpu.peak("bfloat16") == gpu.peak("float32") == 8.1e12
    assert gpu.eff("matmul", "bfloat16") == gpu.eff("matmul") != gpu.eff("matmul", "float16")
    auto = resolve_precision("auto", ds)
    assert auto.dtypes["cuda:0"] == ("float32", "float16")
    assert auto.dtypes["cpu"] == ("float32",)
    assert resolve_precision("auto", load_profile("desktop-4090")).dtypes["cpu"] == ("float32", "bfloat16")


def _uncited_numbers(text: str, window: int = 6) -> list[str]:
    """The ``key = value`` lines with a numeric value (a number, a number with a unit, or an inline
    table of them) that have no ``#`` comment line among the ``window`` lines above them."""
    lines = text.splitlines()
    uncited = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "[")) or "=" not in stripped:
            continue
        (value,) = tomllib.loads(stripped).values()
        values = value.values() if isinstance(value, dict) else [value]
        numeric = any(isinstance(v, (int, float)) and not isinstance(v, bool)
                      or isinstance(v, str) and v[:1].isdigit() for v in values)
        if numeric and not any(prev.strip().startswith("#") for prev in lines[max(0, i - window):i]):
            uncited.append(f"line {i + 1}: {stripped}")
    return uncited


def test_source_check_finds_an_uncited_number():
    text = '# a source\na = 1\nkind = "gpu"\nb = "2GB"\nc = "x"\nd = 3\ne = 4\nf = { x = 7 }\n'
    assert _uncited_numbers(text) == ["line 8: f = { x = 7 }"]    # 7 lines below the comment


@pytest.mark.parametrize("name", NEW)
def test_every_number_cites_a_source(name):
    text = builtin_profile_path(name).read_text()
    numeric = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", "[")) and "=" in ln]
    assert len(numeric) > 30                      # the check below has lines to look at
    assert _uncited_numbers(text) == []


@pytest.mark.parametrize("name, dtype", [("desktop-4090", "bfloat16"), ("t4-flexgen", "float16")])
def test_gpu_beats_cpu_on_a_large_matmul(name, dtype):
    ds = load_profile(name)
    n = 4096
    flops, nbytes = 2 * n**3, 3 * n * n * 2
    gpu = kernel_time(OpClass.MATMUL, dtype, flops, nbytes, ds.device("cuda:0")).seconds
    cpu = kernel_time(OpClass.MATMUL, dtype, flops, nbytes, ds.device("cpu")).seconds
    assert gpu * 10 < cpu
    if name == "desktop-4090":   # compute-bound: 2·4096³ FLOP at 0.95 of 165.2 TFLOP/s, plus call costs
        assert gpu == pytest.approx(flops / (165.2e12 * 0.95) + 8e-6 + 17e-6)


@pytest.mark.parametrize("name", NEW)
def test_link_is_what_the_toml_says(name):
    raw = tomllib.loads(builtin_profile_path(name).read_text())["links"][0]
    ds = load_profile(name)
    link = ds.link("cuda:0", "cpu")
    assert link.bandwidth == parse_bandwidth(raw["bandwidth"])
    assert link.pageable_bandwidth == parse_bandwidth(raw["pageable_bandwidth"])
    nbytes = parse_bytes("1GiB")
    pinned = transfer_time(nbytes, "cpu", "cuda:0", ds).seconds
    assert pinned == pytest.approx(link.latency + nbytes / parse_bandwidth(raw["bandwidth"]))
    pageable = transfer_time(nbytes, "cpu", "cuda:0", ds, pinned=False).seconds
    assert pageable == pytest.approx(link.latency + nbytes / parse_bandwidth(raw["pageable_bandwidth"]))
