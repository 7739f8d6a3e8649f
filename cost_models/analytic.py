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
The efficiencies of the built-in profiles are fitted to measurements (``bench/fit_profile.py``);
``hetpart calibrate`` fits a profile of the machine it runs on (:mod:`cost_models.calibrate`).

Two terms price what a whole model pays beyond its kernels on a CPU: a view costs its call
(``fixed_latency.view``: no kernel, no bytes, but 1.5-3 µs of dispatch in eager mode), and an output
of at least ``alloc_threshold`` bytes pays ``bytes / first_touch_bandwidth``: the page faults of its
first write and, when it is freed, giving the pages back.

Design note — why whole-model CPU predictions were wrong, and what changed. The roofline prices
each kernel as if it ran alone in a loop, which is how the calibration rows were measured. A whole
model on a CPU pays more than the sum of such rows:

* first touch: glibc's ``malloc`` serves every block of 32 MiB or more (its mmap threshold's
  ceiling) with ``mmap`` and returns it on ``free``, so such an output is fresh pages on every call
  and each page faults on its first write. On the 2-core test machine a fresh 32 MiB buffer takes
  8,193 page faults and 6.0 ms to fill against 0.4 ms for a reused one (about 5.7 GB/s). A
  transformer block at d_model 1024 and 2,048 tokens allocates two such tensors per call (the
  feed-forward's 4096-wide activations) and its backward more. A kernel timed alone reuses its
  buffer and never sees it; the same block measured whole ran at 375 ms against 275 ms for the sum of
  its ops timed alone (same machine, same minute).
* calls: every eager op, views included, costs 1.5-3 µs of Python and dispatcher time through the
  aten entry points an emitted module calls. The model priced views at zero and a call at the cost
  of a bare ``torch.add`` (0.85 µs), so small models with many ops came out too fast
  (``dlrm:small``: 0.22 ms predicted, 0.43 ms measured).
* compute-bound "memory-bound" ops: on few cores GELU, SiLU and exp are limited by arithmetic, not
  bandwidth (GELU over 8.4 M elements: 8.8 ms, about 1 G elements/s on 2 cores, 6x the bandwidth
  bound). A per-machine elementwise efficiency, fitted from such ops, prices them.
* threading: OpenMP parallel regions stall when another process competes for the cores (the same
  block measured 0.28-1.07 s under load), and a container's CPU quota below torch's thread count
  throttles sustained work while short bursts run at full speed. Rates hold for one thread count on
  a quiet machine: the calibration and the measurement cache record the thread count, and the
  calibration compares a matmul's rate in bursts with its sustained rate and warns
  (:mod:`cost_models.cpu_limits`).
* small batches through a matmul: a CPU's matmul kernel packs the weight and keeps blocks of rows
  in registers, so with few rows per weight the packing and the partial blocks are a larger share
  (a Linear at batch 64 ran at 36-42 GFLOP/s on the 2-core machine, 64 GFLOP/s at 512 rows or more);
  one efficiency per class priced ``mlp`` inference 35-40 % too fast. A matmul's efficiency is
  scaled by ``rows / (rows + matmul_half_rows)`` (:func:`weight_rows`), fitted by the calibration
  (not below ``GEMV_ROWS`` rows: a matrix-vector product streams its weight and packs nothing).
* attention's CPU path: fp32 ``scaled_dot_product_attention`` runs the flash kernel for CPU, which
  reaches 0.6-0.7 of the matmul peak at these shapes; the calibration fits it as its own class.

The calibration file's whole-model row (``emb-transformer:base`` all on the 16-core host: 2.77 s
measured, 0.41 s predicted) is 5.5x the sum of that file's own op rows at the scenario's shapes
(about 0.5 s): the per-op rates are not what is wrong there, but what the whole run paid beyond them.
First touch explains a few percent of it (16 fresh 32 MiB tensors per forward); a CPU quota or
oversubscribed threads on that host would explain the rest (a sustained run throttled to about three
CPUs' worth of the 16 threads' time gives 2.7 s) but could not be measured from here: ``hetpart
calibrate`` and ``bench/gpu_check.py`` print the host's CPU limits and its burst against sustained
rate so that the next run on that host shows which. The profiled model
(:mod:`cost_models.profiled`) measures every op in place in whole passes, so it prices all of the
above as they happen on the machine it runs on.
"""

from __future__ import annotations

from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceSet
from partitioner.ir import Op, OpClass


ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


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
                       fresh=op.bytes_written, rows=weight_rows(op))


def weight_rows(op: Op) -> float:
    """How many rows use each weight of a matmul with weights (``flops / (2 · weight elements)``:
    the batch times the tokens of a Linear); infinite for other ops. Weights are taken to be held
    in the op's dtype, as a traced model holds them (and a 16-bit copy of an op says so).

    Example:
        >>> weight_rows(linear_64x1024x1024)   # doctest: +SKIP
        64.0
    """
    if op.op_class is not OpClass.MATMUL or not op.param_bytes or not op.flops:
        return float("inf")
    elements = op.param_bytes / ITEMSIZE.get(op.dtype, 4)
    return op.flops / (2 * elements)


def kernel_time(
    op_class: OpClass, dtype: str, flops: float, nbytes: float, device: Device, footprint: float = 0.0,
    *, fresh: float = 0.0, rows: float = float("inf"),
) -> Estimate:
    """Roofline time of one kernel of class ``op_class`` doing ``flops`` and moving ``nbytes``.

    ``footprint`` is the memory the kernel touches beyond the bytes it moves (a gather's table);
    the cache bandwidth applies only when both fit in the device's cache. ``fresh`` is the size of
    the output it allocates: at or above the device's ``alloc_threshold`` it pays the first touch.
    ``rows`` (a matmul's rows per weight, :func:`weight_rows`) scales its efficiency by the
    device's :meth:`~cost_models.profiles.Device.rows_factor`.
    A view launches no kernel and moves nothing: it costs the call alone (``fixed_latency.view``).
    """
    key = op_class.value
    if op_class is OpClass.VIEW:
        return Estimate(device.fixed(key, dtype))
    efficiency = device.eff(key, dtype) * (device.rows_factor(rows) if op_class is OpClass.MATMUL else 1.0)
    compute = flops / (device.peak(dtype) * efficiency) if flops else 0.0
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
