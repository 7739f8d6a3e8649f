"""Device profiles: built-ins, TOML round trips, routes, memory caps, validation, detection."""

from __future__ import annotations

import copy
import pickle
import types

import pytest

from cost_models import detect
from cost_models.detect import detect_local
from cost_models.profiles import (
    DEFAULT_EFFICIENCY, DEFAULT_MEM_EFFICIENCY, Device, DeviceKind, DeviceSet, Link,
    builtin_profile_path, builtin_profiles, load_profile, load_profile_text,
)
from partitioner.errors import ProfileError, UnitError
from partitioner.ir import OpClass

BUILTINS = {
    "cpu": ("cpu",),
    "h200-host": ("cpu", "cuda:0"),
    "a100-host": ("cpu", "cuda:0"),
    "cpu-gpu-npu": ("cpu", "cuda:0", "npu:0"),
    "2xh200-host": ("cpu", "cuda:0", "cuda:1"),
}

GOOD = """\
name = "tiny"

[devices.cpu]
kind = "cpu"
memory = "64GiB"
peak_flops = { float32 = 1.5e12, bfloat16 = "2 TFLOPS" }
mem_bandwidth = "20GB/s"
launch_overhead = "2us"

[devices."cuda:0"]
kind = "gpu"
memory = "141GB"
peak_flops = { float32 = 51e12, bfloat16 = 790e12 }
mem_bandwidth = "4.1TB/s"
launch_overhead = "8us"
efficiency = { matmul = 0.9, "conv.bfloat16" = 0.15 }
mem_efficiency = { norm = 0.6 }
fixed_latency = { matmul = "17us" }

[[links]]
between = ["cpu", "cuda:0"]
bandwidth = "55GB/s"
pageable_bandwidth = "9GB/s"
latency = "17us"
kind = "pcie"
"""


def _write(tmp_path, text, name="bad.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _load_error(tmp_path, text, name="bad.toml") -> str:
    path = _write(tmp_path, text, name)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert name in str(err.value)          # every message names the file
    return str(err.value)


# ----------------------------------------------------------------------------- built-ins

def test_builtin_profiles_listed():
    assert set(BUILTINS) <= set(builtin_profiles())
    for name in BUILTINS:
        assert builtin_profile_path(name).is_file()
        assert builtin_profile_path(name).read_text().startswith("#")   # provenance comment


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_loads_with_fixed_names(name):
    ds = load_profile(name)
    assert ds.name == name
    assert ds.names() == BUILTINS[name]
    assert ds.source == f"builtin:{name}"
    assert ds.host_device().name == "cpu"
    for device in ds:
        assert device.memory > 0 and device.mem_bandwidth > 0 and device.peak("float32") > 0
        for op_class in OpClass:
            assert 0 < device.eff(op_class) <= 1 and 0 < device.mem_eff(op_class) <= 1
            assert device.fixed(op_class) >= 0
    for a in ds.names():                     # every pair of devices can exchange tensors
        for b in ds.names():
            ds.route(a, b)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_round_trips(name):
    ds = load_profile(name)
    again = load_profile_text(ds.to_toml(), "again.toml")
    assert again == ds
    assert again.to_toml().split("\n", 1)[1] == ds.to_toml().split("\n", 1)[1]
    assert DeviceSet.from_dict(ds.to_dict()) == ds
    assert pickle.loads(pickle.dumps(ds)) == ds
    assert copy.deepcopy(ds) == ds
    assert hash(again) == hash(ds)


def test_h200_figures():
    ds = load_profile("h200-host")
    gpu, cpu = ds.device("cuda:0"), ds.device("cpu")
    assert gpu.memory == 150109880320
    assert gpu.peak("float32") == 51e12 and gpu.peak("bfloat16") == 790e12
    assert gpu.peak("float64") == 51e12                      # unlisted dtype: float32 peak
    assert gpu.mem_bandwidth == 4.1e12
    link = ds.link("cuda:0", "cpu")
    assert (link.bandwidth, link.pageable_bandwidth, link.latency) == (55e9, 9e9, 17e-6)
    assert 1.0e12 <= cpu.peak("float32") <= 1.6e12 and 3e12 <= cpu.peak("bfloat16") <= 5.5e12
    assert gpu.eff("conv", "bfloat16") < gpu.eff("conv", "float32") == gpu.eff("conv")


# ----------------------------------------------------------------------------- lookups

def test_device_defaults_and_dtype_specific_efficiency():
    ds = load_profile_text(GOOD, "good.toml")
    gpu = ds.device("cuda:0")
    assert ds.name == "tiny" and ds.device("cpu").peak_flops["bfloat16"] == 2e12
    assert gpu.eff(OpClass.MATMUL) == gpu.eff("matmul") == 0.9
    assert gpu.eff("conv") == DEFAULT_EFFICIENCY[DeviceKind.GPU]["conv"]
    assert gpu.eff("conv", "bfloat16") == 0.15
    assert gpu.eff("conv", "torch.bfloat16") == 0.15
    assert gpu.eff("conv", "float16") == DEFAULT_EFFICIENCY[DeviceKind.GPU]["conv"]
    assert gpu.mem_eff("norm") == 0.6
    assert gpu.mem_eff("softmax") == DEFAULT_MEM_EFFICIENCY[DeviceKind.GPU]["softmax"]
    assert gpu.fixed("matmul") == 17e-6 and gpu.fixed("norm") == 0.0
    with pytest.raises(ProfileError, match="not an op class"):
        gpu.eff("matmull")


def test_default_tables_cover_every_class():
    for table in (*DEFAULT_EFFICIENCY.values(), *DEFAULT_MEM_EFFICIENCY.values()):
        assert set(table) == {c.value for c in OpClass}
    assert set(DEFAULT_EFFICIENCY) == set(DeviceKind)


def test_device_is_immutable_and_accepts_units():
    d = Device("cpu", "cpu", "8GiB", {"float32": "1 TFLOPS"}, "10GB/s", "2us",
               efficiency={"matmul": 0.5})
    assert d.kind is DeviceKind.CPU and d.memory == 8 * 2**30 and d.peak() == 1e12
    with pytest.raises(TypeError):
        d.efficiency["matmul"] = 1.0
    with pytest.raises(AttributeError):
        d.memory = 1
    assert hash(d) == hash(Device("cpu", "cpu", 1, 1e9, 1e9, 0))
    with pytest.raises(ProfileError, match="zero memory"):
        Device("cpu", "cpu", 0, 1e9, 1e9, 0)


def test_npu_supports():
    npu = load_profile("cpu-gpu-npu").device("npu:0")
    assert npu.kind is DeviceKind.NPU
    assert npu.supports("aten.linear", "matmul")
    assert npu.supports("aten.convolution", OpClass.CONV)
    assert npu.supports("aten.view", "view")
    assert not npu.supports("aten.embedding", "gather")
    assert not npu.supports("aten.sum", "reduction")
    assert not npu.supports("aten.nonzero", "other")
    assert load_profile("cpu-gpu-npu").device("cuda:0").supports("aten.embedding", "gather")


def test_supports_globs():
    d = Device("cpu", "cpu", 1, 1e9, 1e9, 0, supported_ops=("matmul", "aten.embedding*", "Gemm"))
    assert d.supports("aten.embedding_bag", "gather")
    assert d.supports("Gemm", "matmul") and d.supports("aten.mm", "matmul")
    assert not d.supports("aten.index_select", "gather")


# ----------------------------------------------------------------------------- routes, caps

def test_routes():
    ds = load_profile("cpu-gpu-npu")
    assert ds.route("cpu", "cpu") == ()
    assert [l.label for l in ds.route("cpu", "cuda:0")] == ["cpu<->cuda:0"]
    assert ds.route("cuda:0", "cpu") == ds.route("cpu", "cuda:0")
    assert [l.label for l in ds.route("npu:0", "cuda:0")] == ["cpu<->npu:0", "cpu<->cuda:0"]
    assert [l.label for l in ds.route("cuda:0", "npu:0")] == ["cpu<->cuda:0", "cpu<->npu:0"]
    two = load_profile("2xh200-host")
    (link,) = two.route("cuda:0", "cuda:1")
    assert link.kind == "nvlink" and link.bandwidth == 450e9
    with pytest.raises(ProfileError, match="no device 'cuda:7'.*cpu, cuda:0, cuda:1"):
        two.route("cuda:0", "cuda:7")


def test_a_device_without_a_route_to_its_host_is_refused_when_the_profile_is_made():
    with pytest.raises(ProfileError, match=r"device 'cuda:0' has no link to its host CPU 'cpu'.*between = \["
                                           r"\"cpu\", \"cuda:0\"\]"):
        DeviceSet("x", (Device("cpu", "cpu", 1, 1e9, 1e9, 0), Device("cuda:0", "gpu", 1, 1e9, 1e9, 0)))


def test_route_across_hosts():
    def cpu(name, host):
        return Device(name, "cpu", 1, 1e9, 1e9, 0, host=host)
    gpu = Device("cuda:0@b", "gpu", 1, 1e9, 1e9, 0, host="b")
    ds = DeviceSet("two-hosts", (cpu("cpu", "a"), cpu("cpu@b", "b"), gpu),
                   (Link(("cpu", "cpu@b"), 1e9, 1e-5, kind="network"),
                    Link(("cpu@b", "cuda:0@b"), 1e10, 1e-5)))
    assert [l.label for l in ds.route("cpu", "cuda:0@b")] == ["cpu<->cpu@b", "cpu@b<->cuda:0@b"]
    assert ds.host_device("b").name == "cpu@b"
    with pytest.raises(ProfileError, match="no host 'c'"):
        ds.host_device("c")


def test_with_memory():
    ds = load_profile("h200-host")
    capped = ds.with_memory({"cuda:0": "8GiB", "cpu": 2**34})
    assert capped.device("cuda:0").memory == 8 * 2**30 and capped.device("cpu").memory == 2**34
    assert ds.device("cuda:0").memory == 150109880320                # the original is unchanged
    assert capped.device("cuda:0").peak_flops == ds.device("cuda:0").peak_flops
    assert capped.with_memory({}) == capped
    with pytest.raises(ProfileError, match=r"'cuda:1'.*cpu, cuda:0"):
        ds.with_memory({"cuda:1": "8GiB"})
    with pytest.raises(ProfileError, match="can only lower"):
        ds.with_memory({"cuda:0": "200GB"})
    with pytest.raises(ProfileError, match="not positive"):
        ds.with_memory({"cuda:0": 0})
    with pytest.raises(UnitError):
        ds.with_memory({"cuda:0": "-1GB"})


# ----------------------------------------------------------------------------- validation

def _replace(old, new):
    assert old in GOOD
    return GOOD.replace(old, new)


def test_missing_field(tmp_path):
    msg = _load_error(tmp_path, _replace('mem_bandwidth = "4.1TB/s"\n', ""))
    assert 'devices."cuda:0".mem_bandwidth' in msg and "missing" in msg and "e.g." in msg


def test_missing_link_field(tmp_path):
    msg = _load_error(tmp_path, _replace('latency = "17us"\n', ""))
    assert "links[0].latency" in msg and "missing" in msg


def test_bad_unit(tmp_path):
    path = _write(tmp_path, _replace('memory = "141GB"', 'memory = "141 gigs"'))
    with pytest.raises(UnitError) as err:
        load_profile(str(path))
    assert "bad.toml" in str(err.value) and 'devices."cuda:0".memory' in str(err.value)
    assert "'141 gigs'" in str(err.value)


def test_zero_memory(tmp_path):
    msg = _load_error(tmp_path, _replace('memory = "141GB"', 'memory = "0GB"'))
    assert 'device cuda:0 has zero memory: give its capacity, e.g. memory = "80GB"' in msg


def test_unknown_field(tmp_path):
    msg = _load_error(tmp_path, _replace('launch_overhead = "8us"', 'launch_overhed = "8us"'))
    assert 'devices."cuda:0".launch_overhed' in msg and "unknown field" in msg
    assert "launch_overhead" in msg and "supported_ops" in msg     # lists the allowed fields


def test_unknown_top_level_field(tmp_path):
    msg = _load_error(tmp_path, "[device.cpu]\nkind = 'cpu'\n")
    assert "device" in msg and "unknown field" in msg


def test_unknown_kind(tmp_path):
    msg = _load_error(tmp_path, _replace('kind = "gpu"', 'kind = "tpu"'))
    assert 'devices."cuda:0".kind' in msg and "'tpu'" in msg and "'npu'" in msg


def test_bad_efficiency_key(tmp_path):
    msg = _load_error(tmp_path, _replace("matmul = 0.9", "matmull = 0.9"))
    assert 'devices."cuda:0".efficiency.matmull' in msg and "not an op class" in msg
    assert "attention" in msg and "data_movement" in msg            # lists the valid ones
    msg = _load_error(tmp_path, _replace('"conv.bfloat16"', '"conv.bf16"'))
    assert "not a dtype name" in msg


def test_efficiency_out_of_range(tmp_path):
    msg = _load_error(tmp_path, _replace("matmul = 0.9", "matmul = 1.5"))
    assert 'devices."cuda:0".efficiency.matmul' in msg and "(0, 1]" in msg
    _load_error(tmp_path, _replace("matmul = 0.9", "matmul = 0"))


def test_nested_efficiency_tables(tmp_path):
    ds = load_profile_text(_replace('"conv.bfloat16" = 0.15', "conv = { bfloat16 = 0.2 }"), "n.toml")
    assert ds.device("cuda:0").eff("conv", "bfloat16") == 0.2


def test_bad_supported_ops(tmp_path):
    msg = _load_error(tmp_path, _replace('fixed_latency = { matmul = "17us" }',
                                         'supported_ops = ["matmul", "convv"]'))
    assert "supported_ops[1]" in msg and "'convv'" in msg


def test_unknown_link_device(tmp_path):
    msg = _load_error(tmp_path, _replace('between = ["cpu", "cuda:0"]', 'between = ["cpu", "cuda:1"]'))
    assert "links[0].between" in msg and "'cuda:1'" in msg and "cpu, cuda:0" in msg


def test_duplicate_link(tmp_path):
    text = GOOD + '\n[[links]]\nbetween = ["cuda:0", "cpu"]\nbandwidth = "1GB/s"\nlatency = "1us"\n'
    msg = _load_error(tmp_path, text)
    assert "links[1]" in msg and "duplicate link" in msg


def test_no_cpu_device(tmp_path):
    text = GOOD.replace("[devices.cpu]", '[devices."cpu:0"]').replace('"cpu", "cuda:0"',
                                                                      '"cpu:0", "cuda:0"')
    msg = _load_error(tmp_path, text)
    assert "no cpu device" in msg and 'named "cpu"' in msg
    msg = _load_error(tmp_path, GOOD.replace('kind = "gpu"', 'kind = "cpu"'))
    assert "host 'host0' has 2 cpu devices" in msg


def test_toml_syntax_error(tmp_path):
    msg = _load_error(tmp_path, 'name = "x"\n\n[devices.cpu\nkind = "cpu"\n')
    assert "TOML syntax error" in msg and "line 3" in msg


def test_unknown_profile_name():
    with pytest.raises(ProfileError) as err:
        load_profile("h300-host")
    msg = str(err.value)
    assert "h200-host" in msg and "2xh200-host" in msg and "path to a TOML file" in msg


def test_load_from_path_names_set_after_file(tmp_path):
    path = _write(tmp_path, GOOD.replace('name = "tiny"\n', ""), "my-box.toml")
    ds = load_profile(path)
    assert ds.name == "my-box" and ds.source == str(path)


# ----------------------------------------------------------------------------- detection

@pytest.mark.parametrize("measure", [False, True])
def test_detect_local_round_trips(measure):
    ds = detect_local(measure=measure)
    cpu = ds.device("cpu")
    assert ds.names()[0] == "cpu" and cpu.kind is DeviceKind.CPU
    assert cpu.memory > 2**28 and cpu.peak() > 1e9 and cpu.mem_bandwidth > 1e8
    assert 0 < cpu.launch_overhead < 1e-3
    text = ds.to_toml()
    assert text.startswith("# device profile 'local'") and "# cpu:" in text   # notes as comments
    assert load_profile_text(text, "local.toml") == ds


class _FakeCuda:
    """Enough of torch.cuda for the no-measure GPU path of detect_local."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 2

    @staticmethod
    def get_device_properties(i):
        return types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, major=9, minor=0)

    @staticmethod
    def mem_get_info(i):
        return (100 * 2**30, 150109880320)


class _FakeNvml:
    NVML_CLOCK_MEM = 2

    @staticmethod
    def nvmlDeviceGetHandleByIndex(i):
        return i

    @staticmethod
    def nvmlDeviceGetMemoryBusWidth(h):
        return 6144

    @staticmethod
    def nvmlDeviceGetMaxClockInfo(h, clock):
        return 3201

    @staticmethod
    def nvmlDeviceGetMaxPcieLinkGeneration(h):
        return 5

    @staticmethod
    def nvmlDeviceGetMaxPcieLinkWidth(h):
        return 16


def test_detect_gpus_without_cuda(monkeypatch):
    monkeypatch.setattr(detect, "_import_torch", lambda: types.SimpleNamespace(cuda=_FakeCuda))
    monkeypatch.setattr(detect, "_nvml", lambda: _FakeNvml)
    ds = detect_local(measure=False)
    assert ds.names() == ("cpu", "cuda:0", "cuda:1")
    gpu = ds.device("cuda:1")
    assert gpu.kind is DeviceKind.GPU and gpu.memory == 150109880320
    assert gpu.peak("bfloat16") == 989e12                         # datasheet table
    assert gpu.mem_bandwidth == pytest.approx(6144 / 8 * 3201e6 * 2)  # from NVML
    assert ds.link("cpu", "cuda:1").bandwidth == pytest.approx(3.938 * 0.8 * 16e9)
    assert "100.00 GiB free" in "\n".join(ds.notes)
    assert load_profile_text(ds.to_toml(), "local.toml") == ds


def test_matmul_half_rows_is_read_written_and_checked(tmp_path):
    """A matmul with few rows per weight is priced slower on a device that says so, and the
    field survives a round trip; a negative or non-numeric value is refused with an example."""
    from cost_models.analytic import kernel_time

    text = _replace('memory = "141GB"', 'memory = "141GB"\nmatmul_half_rows = 32')
    gpu = load_profile_text(text, "rows.toml").device("cuda:0")
    assert gpu.matmul_half_rows == 32.0 and gpu.rows_factor(32) == 0.5 and gpu.rows_factor(float("inf")) == 1.0
    again = load_profile_text(load_profile_text(text, "rows.toml").to_toml(), "again.toml").device("cuda:0")
    assert again.matmul_half_rows == 32.0
    few = kernel_time(OpClass.MATMUL, "float32", 1e12, 0, gpu, rows=32).seconds
    many = kernel_time(OpClass.MATMUL, "float32", 1e12, 0, gpu).seconds
    assert few > 1.9 * (many - gpu.launch_overhead)
    for bad in ("-1", '"many"', "true"):
        msg = _load_error(tmp_path, _replace('memory = "141GB"', f'memory = "141GB"\nmatmul_half_rows = {bad}'))
        assert "matmul_half_rows" in msg and "e.g. matmul_half_rows = 35" in msg


def test_grouped_backward_flops_is_read_written_and_checked(tmp_path):
    """A grouped convolution's backward runs at the device's grouped rate where that is slower;
    an ungrouped one, or a device without the field, keeps its class's rate; the field survives a
    round trip; a negative, zero-but-not-0 or non-numeric value is refused with an example."""
    import dataclasses

    from cost_models.training import backward_time
    from partitioner.ir import Op

    text = _replace('memory = "141GB"', 'memory = "141GB"\ngrouped_backward_flops = 4e9')
    gpu = load_profile_text(text, "grouped.toml").device("cuda:0")
    assert gpu.grouped_backward_flops == 4e9
    again = load_profile_text(load_profile_text(text, "grouped.toml").to_toml(), "again.toml").device("cuda:0")
    assert again.grouped_backward_flops == 4e9
    conv = Op("dw", "aten.conv2d.default", OpClass.CONV, 0, "", "", "float32", (), (), (), (),
              flops=10**9, bytes_read=10**6, bytes_written=10**6, param_bytes=0, trainable_param_bytes=0, groups=96)
    assert backward_time(conv, gpu).seconds == pytest.approx(2 * 1e9 / 4e9 + gpu.launch_overhead)
    dense = dataclasses.replace(conv, groups=1)
    plain = dataclasses.replace(gpu, grouped_backward_flops=0.0)
    assert backward_time(dense, gpu).seconds == backward_time(dense, plain).seconds
    assert backward_time(conv, plain).seconds == backward_time(dense, plain).seconds < 0.01
    for bad in ("-1", '"fast"', "true", "1e-3"):
        msg = _load_error(tmp_path, _replace('memory = "141GB"', f'memory = "141GB"\ngrouped_backward_flops = {bad}'))
        assert "grouped_backward_flops" in msg and "e.g. grouped_backward_flops = 3.9e9" in msg
