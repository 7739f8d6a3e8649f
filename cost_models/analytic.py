"""The analytic (roofline) cost model: op time on a device, transfer time on a route.

In: an :class:`~partitioner.ir.Op` and a :class:`~cost_models.profiles.Device` (or a byte count
and two devices of a :class:`~cost_models.profiles.DeviceSet`). Out: an :class:`Estimate`.

Op time (``DESIGN.md``)::

    t = max(flops / (peak[dtype] · efficiency[class]),  bytes / (mem_bandwidth · mem_efficiency[class]))
        + launch_overhead + fixed_latency[class]

``bandwidth`` is the device's cache bandwidth when the op's traffic (and, for a gather, its whole
table) fits in its cache (a profile
may give one; the 16-core host streams 25-50 MB working sets 4-8x faster than DRAM-sized ones),
else its memory bandwidth. Views cost nothing (they launch no kernel and move no bytes). Transfer time is
``latency + bytes / bandwidth`` on every link of the route (through the host when two devices
have no direct link), with the pageable-memory bandwidth when the host side is not pinned.
The efficiencies of the built-in profiles are fitted to measurements (``bench/fit_profile.py``).
"""

from __future__ import annotations

from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceSet
from partitioner.ir import Op, OpClass


def op_time(op: Op, device: Device) -> Estimate:
    """Predicted forward time of ``op`` on ``device``.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> gpu = load_profile("h200-host").device("cuda:0")
        >>> op_time(graph.op("linear"), gpu).seconds   # doctest: +SKIP
        9.1e-05
    """
    # a gather reads rows scattered over its whole table: the cache helps only if the table fits
    footprint = op.param_bytes if op.op_class is OpClass.GATHER else 0
    return kernel_time(op.op_class, op.dtype, op.flops, op.bytes_read + op.bytes_written, device, footprint,
                       fresh=op.bytes_written)


def kernel_time(
    op_class: OpClass, dtype: str, flops: float, nbytes: float, device: Device, footprint: float = 0.0,
    *, fresh: float = 0.0,
) -> Estimate:
    """Roofline time of one kernel of class ``op_class`` doing ``flops`` and moving ``nbytes``.

    ``footprint`` is the memory the kernel touches beyond the bytes it moves (a gather's table);
    the cache bandwidth applies only when both fit in the device's cache. ``fresh`` is the size of
    the output it allocates: at or above the device's ``alloc_threshold`` it pays the first touch.
    A view launches no kernel and moves nothing: it costs the call alone (``fixed_latency.view``).
    """
    key = op_class.value
    if op_class is OpClass.VIEW:
        return Estimate(device.fixed(key, dtype))
    compute = flops / (device.peak(dtype) * device.eff(key, dtype)) if flops else 0.0
    bandwidth = device.stream_bandwidth(max(nbytes, footprint))
    memory = nbytes / (bandwidth * device.mem_eff(key, dtype)) if nbytes else 0.0
    seconds = max(compute, memory) + device.launch_overhead + device.fixed(key, dtype) + device.first_touch(fresh)
    return Estimate(seconds, float(flops), float(nbytes))


def transfer_time(nbytes: float, src: str, dst: str, devices: DeviceSet, *, pinned: bool = True) -> Estimate:
    """Time to move ``nbytes`` from device ``src`` to device ``dst`` (zero on the same device).

    ``pinned=False`` uses each host link's pageable-memory bandwidth: what a plain ``.to(device)``
    of ordinary host tensors gets (accelerate's offload copies, for one).

    Example:
        >>> ds = load_profile("h200-host")
        >>> round(transfer_time(2**30, "cpu", "cuda:0", ds).seconds * 1e3, 1)   # doctest: +SKIP
        19.5
    """
    if src == dst or nbytes <= 0:
        return Estimate()
    seconds = 0.0
    for link in devices.route(src, dst):
        bandwidth = link.bandwidth if pinned else (link.pageable_bandwidth or link.bandwidth)
        seconds += link.latency + nbytes / bandwidth
    return Estimate(seconds, 0.0, float(nbytes))
