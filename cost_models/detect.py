"""Build a device profile of the machine this runs on.

In: nothing (the OS, torch, and NVML when ``pynvml`` is importable).
Out: a :class:`~cost_models.profiles.DeviceSet` named ``"local"`` with a ``cpu`` device, one
``cuda:N`` device per visible CUDA GPU and a PCIe link from each GPU to ``cpu``; it
serialises with ``to_toml()`` and loads back.

With ``measure=True`` short micro-benchmarks (well under half a second on the CPU) replace
the documented defaults: an fp32 matmul for FLOP/s, a tensor copy for memory bandwidth and a
1-element add for the per-op overhead; on GPUs also a bf16 matmul and a pinned host-to-device
copy. Everything beyond ``os`` is optional: no torch, no CUDA or no NVML only means defaults.
Provenance (where each figure came from, and the free GPU memory at detection time) is kept
in ``DeviceSet.notes``, which ``to_toml`` writes as comments.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from cost_models.profiles import Device, DeviceKind, DeviceSet, Link
from cost_models.units import format_bytes, format_flops, format_rate, format_seconds

__all__ = ["detect_local", "CPU_DEFAULTS", "PCIE_DEFAULTS", "KNOWN_GPUS"]

log = logging.getLogger(__name__)

#: Per-core CPU figures used when nothing is measured: ~60 GFLOP/s fp32 per core on large
#: matmuls (AVX2/AVX-512 FMA at ~3 GHz, about what the 16-core host of h200-host reaches),
#: ~2 GB/s of streaming bandwidth per core with at least 5 GB/s and at most 40 GB/s in all
#: (a few memory channels are shared by all cores), and ~2 us per eager op.
CPU_DEFAULTS: dict[str, float] = {
    "flops_per_core": 60e9,
    "bandwidth_per_core": 2e9,
    "min_bandwidth": 5e9,
    "max_bandwidth": 40e9,
    "launch_overhead": 2e-6,
}

#: A GPU's link to the host when neither NVML nor a measurement says otherwise: PCIe 4.0 x16,
#: of which pinned copies reach ~25 GB/s and pageable ones ~9 GB/s, ~17 us per small copy
#: (the latency measured on the H200 host of h200-host).
PCIE_DEFAULTS: dict[str, float] = {"bandwidth": 25e9, "pageable_bandwidth": 9e9, "latency": 17e-6}
# usable GB/s per lane of a PCIe link by generation (raw rate after encoding, times ~0.8)
_PCIE_LANE_GBPS = {3: 0.985 * 0.8, 4: 1.969 * 0.8, 5: 3.938 * 0.8, 6: 7.563 * 0.8}

#: Datasheet figures (fp32 FLOP/s, bf16 dense FLOP/s, memory bandwidth in bytes/s) of common
#: GPUs, matched by substring of the device name, used when the GPU is not measured.
KNOWN_GPUS: dict[str, tuple[float, float, float]] = {
    "H200": (67e12, 989e12, 4.8e12),
    "H100": (67e12, 989e12, 3.35e12),
    "A100": (19.5e12, 312e12, 2.0e12),
    "L40S": (91.6e12, 362e12, 0.864e12),
    "L4": (30.3e12, 121e12, 0.3e12),
    "A10": (31.2e12, 125e12, 0.6e12),
    "V100": (15.7e12, 15.7e12, 0.9e12),   # no bf16 tensor cores: bf16 runs at fp32 speed
    "T4": (8.1e12, 8.1e12, 0.32e12),
}
_UNKNOWN_GPU = (10e12, 40e12, 0.5e12)
_GPU_LAUNCH_OVERHEAD = 8e-6


def detect_local(*, measure: bool = True) -> DeviceSet:
    """A profile of this machine: ``cpu`` plus ``cuda:N`` for each visible CUDA GPU.

    Example:
        >>> ds = detect_local(measure=False)
        >>> ds.names()[0], ds.device("cpu").kind.value
        ('cpu', 'cpu')
    """
    notes = [f"detected on {platform.node() or 'this machine'} ({platform.machine()}, "
             f"{platform.system()}) at {time.strftime('%Y-%m-%d %H:%M:%S')}, measure={measure}"]
    torch = _import_torch()
    devices = [_detect_cpu(torch, measure, notes)]
    links: list[Link] = []
    if torch is not None and _cuda_available(torch):
        nvml = _nvml()
        for index in range(torch.cuda.device_count()):
            gpu, link = _detect_gpu(torch, nvml, index, measure, notes)
            devices.append(gpu)
            links.append(link)
    return DeviceSet("local", tuple(devices), tuple(links), source="detected:local",
                     notes=tuple(notes))


# ----------------------------------------------------------------------------- CPU

def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_total() -> int:
    """Physical memory in bytes: /proc/meminfo MemTotal, else sysconf, else 8 GiB."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024   # the value is in kiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        log.warning("cannot read the memory size; assuming 8 GiB")
        return 8 * 2**30


def _detect_cpu(torch: Any, measure: bool, notes: list[str]) -> Device:
    cores = _cpu_count()
    memory = _memory_total()
    flops = CPU_DEFAULTS["flops_per_core"] * cores
    bandwidth = min(max(CPU_DEFAULTS["bandwidth_per_core"] * cores, CPU_DEFAULTS["min_bandwidth"]),
                    CPU_DEFAULTS["max_bandwidth"])
    launch = CPU_DEFAULTS["launch_overhead"]
    how = "per-core defaults (CPU_DEFAULTS)"
    weight_only: dict[str, float] = {}
    unpack: dict[str, float] = {}
    if measure and torch is not None:
        weight_only, unpack = _cpu_weight_only(torch)
        flops = _best_rate(_cpu_matmul(torch, 1024), 2 * 1024**3, budget=0.1)
        nbytes = 2 * 32 * 2**20                                 # 32 MiB read + 32 MiB written
        bandwidth = _best_rate(_cpu_copy(torch, 32 * 2**20), nbytes, budget=0.06)
        launch = _round3(_cpu_tiny_op(torch))
        how = "measured: 1024^3 fp32 matmul, 32 MiB copy, 1-element add"
    notes.append(f"cpu: {cores} cores, {format_bytes(memory)}; {how}: "
                 f"{format_flops(flops, per_second=True)}, {format_rate(bandwidth)}, "
                 f"{format_seconds(launch)} per op")
    if weight_only:
        notes.append("cpu: weight-only kernels (64 rows, 2048x2048 weight, bfloat16 activations): " + ", ".join(
            f"{w} {format_flops(r, per_second=True)}" + (f", unpacking {unpack[w] / 1e9:.0f}G values/s" if w in unpack
                                                          else "") for w, r in weight_only.items()))
    return Device("cpu", DeviceKind.CPU, memory, {"float32": flops}, bandwidth, launch, weight_only=weight_only,
                  weight_unpack=unpack)


def _cpu_weight_only(torch: Any, rows: int = 64, n: int = 2048,
                     group: int = 128) -> tuple[dict[str, float], dict[str, float]]:
    """FLOP/s of torch's weight-only int8 and int4 CPU kernels (``_weight_int8pack_mm``,
    ``_weight_int4pack_mm_for_cpu``) on bfloat16 activations at ``rows`` rows, and the weight values
    each unpacks per second (its time at one row beyond that rate); a kernel this torch lacks is
    left out. Random packed values: the kernels' speed does not depend on them."""
    rates: dict[str, float] = {}
    unpack: dict[str, float] = {}
    aten = torch.ops.aten

    def int8() -> Callable[[Any], Any]:
        q8, s8 = torch.randint(-127, 128, (n, n), dtype=torch.int8), torch.rand(n, dtype=torch.bfloat16)
        return lambda x: aten._weight_int8pack_mm(x, q8, s8)

    def int4() -> Callable[[Any], Any]:
        q4 = aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, n), dtype=torch.int32), 1)
        sz = torch.rand(n // group, n, 2, dtype=torch.bfloat16)
        return lambda x: aten._weight_int4pack_mm_for_cpu(x, q4, group, sz)

    many, one = torch.randn(rows, n, dtype=torch.bfloat16), torch.randn(1, n, dtype=torch.bfloat16)
    for name, build in (("int8", int8), ("int4", int4)):
        try:  # a torch without the kernel: the device gets no packed weights of that dtype
            kernel = build()
            rates[name] = _best_rate(lambda: kernel(many), 2 * rows * n * n, budget=0.1)
            single = 1.0 / _best_rate(lambda: kernel(one), 1.0, budget=0.05)  # seconds at one row
        except (AttributeError, RuntimeError, NotImplementedError) as exc:
            log.info("cpu: no %s weight-only kernel in this torch (%s): no %s packed weights here", name, exc, name)
            continue
        fixed = single - 2 * n * n / rates[name]
        if fixed > 0:
            unpack[name] = _round3(n * n / fixed)
    return rates, unpack


def _best_rate(run: Callable[[], Any], work: float, *, budget: float) -> float:
    """``work`` divided by the fastest of repeated runs of ``run`` within ``budget`` seconds."""
    run()                                                       # warm up
    best, start = float("inf"), time.perf_counter()
    for _ in range(20):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget:
            break
    return _round3(work / max(best, 1e-9))


def _round3(x: float) -> float:
    """Three significant digits: a measurement is not more precise than that."""
    return float(f"{x:.3g}")


def _cpu_matmul(torch: Any, n: int) -> Callable[[], Any]:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return lambda: torch.mm(a, b)


def _cpu_copy(torch: Any, nbytes: int) -> Callable[[], Any]:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _cpu_tiny_op(torch: Any) -> float:
    """Seconds per 1-element add: the best of 5 batches of 100 (other load only adds time)."""
    x = torch.ones(1)
    best = float("inf")
    for _ in range(6):                                          # the first batch warms up
        t0 = time.perf_counter()
        for _ in range(100):
            torch.add(x, x)
        best = min(best, (time.perf_counter() - t0) / 100)
    return best


# ----------------------------------------------------------------------------- GPUs

def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        log.info("torch is not importable: the CPU profile uses defaults and no GPU is detected")
        return None
    return torch


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except RuntimeError as err:                                  # a broken driver install
        log.warning("torch.cuda.is_available() failed (%s): no GPUs in the profile", err)
        return False


def _nvml() -> Any:
    """The initialised ``pynvml`` module (package nvidia-ml-py), or None."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - any NVML failure only means "no NVML figures"
        log.debug("NVML not available: %s", err)
        return None
    return pynvml


def _nvml_figures(nvml: Any, index: int) -> dict[str, float]:
    """Memory bandwidth and PCIe link rate from NVML, each only when NVML reports it.

    The NVML index is assumed to match the CUDA index (CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    out: dict[str, float] = {}
    if nvml is None:
        return out
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001
        return out
    try:   # bus width in bits x memory clock (MHz) x 2 transfers per clock (DDR)
        bus = nvml.nvmlDeviceGetMemoryBusWidth(handle)
        clock = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
        if bus and clock:
            out["mem_bandwidth"] = bus / 8 * clock * 1e6 * 2
    except Exception:  # noqa: BLE001
        pass
    try:
        gen = nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        width = nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
        if gen in _PCIE_LANE_GBPS and width:
            out["pcie_bandwidth"] = _PCIE_LANE_GBPS[gen] * width * 1e9
            out["pcie_gen"], out["pcie_width"] = gen, width
    except Exception:  # noqa: BLE001
        pass
    return out


def _detect_gpu(torch: Any, nvml: Any, index: int, measure: bool,
                notes: list[str]) -> tuple[Device, Link]:
    name = f"cuda:{index}"
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    fp32, bf16, bandwidth = next((v for k, v in KNOWN_GPUS.items() if k in props.name),
                                 _UNKNOWN_GPU)
    how = "datasheet table" if any(k in props.name for k in KNOWN_GPUS) else "generic defaults"
    nv = _nvml_figures(nvml, index)
    if "mem_bandwidth" in nv:
        bandwidth, how = nv["mem_bandwidth"], how + ", NVML memory bus"
    link_bw = nv.get("pcie_bandwidth", PCIE_DEFAULTS["bandwidth"])
    if measure:
        fp32, bf16, bandwidth, link_bw = _measure_gpu(torch, index)
        how = "measured: 4096^3 fp32/bf16 matmul, 256 MiB device copy, 64 MiB pinned h2d copy"
    notes.append(f"{name}: {props.name}, {props.multi_processor_count} SMs, compute capability "
                 f"{props.major}.{props.minor}, {format_bytes(total)} total, {format_bytes(free)} "
                 f"free at detection; {how}: fp32 {format_flops(fp32, per_second=True)}, bf16 "
                 f"{format_flops(bf16, per_second=True)}, {format_rate(bandwidth)}; link to cpu "
                 f"{format_rate(link_bw)}"
                 + (f" (PCIe gen {nv['pcie_gen']:.0f} x{nv['pcie_width']:.0f})" if "pcie_gen" in nv
                    else ""))
    gpu = Device(name, DeviceKind.GPU, int(total), {"float32": fp32, "bfloat16": bf16,
                                                    "float16": bf16},
                 bandwidth, _GPU_LAUNCH_OVERHEAD)
    link = Link(("cpu", name), link_bw, PCIE_DEFAULTS["latency"],
                min(PCIE_DEFAULTS["pageable_bandwidth"], link_bw), "pcie")
    return gpu, link


def _measure_gpu(torch: Any, index: int) -> tuple[float, float, float, float]:
    """fp32 and bf16 matmul FLOP/s, device copy bytes/s (read + written), pinned h2d bytes/s."""
    device = torch.device("cuda", index)

    def timed(run: Callable[[], Any], work: float, repeats: int = 5) -> float:
        run()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = float("inf")
        for _ in range(repeats):
            start.record()
            run()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        return _round3(work / max(best, 1e-9))

    def measure() -> tuple[float, float, float, float]:  # its tensors are freed when it returns
        n = 4096
        a32, b32 = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        fp32 = timed(lambda: torch.mm(a32, b32), 2 * n**3)
        a16, b16 = a32.bfloat16(), b32.bfloat16()
        bf16 = timed(lambda: torch.mm(a16, b16), 2 * n**3)
        src = torch.empty(64 * 2**20, device=device)              # 256 MiB of fp32
        dst = torch.empty_like(src)
        bandwidth = timed(lambda: dst.copy_(src), 2 * src.numel() * 4)
        host = torch.empty(16 * 2**20, pin_memory=True)           # 64 MiB
        dev = torch.empty(host.numel(), device=device)
        h2d = timed(lambda: dev.copy_(host, non_blocking=True), host.numel() * 4)
        return fp32, bf16, bandwidth, h2d

    with torch.cuda.device(device):
        fp32, bf16, bandwidth, h2d = measure()
        torch.cuda.empty_cache()
    return fp32, bf16, bandwidth, h2d
