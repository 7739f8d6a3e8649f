"""The cost-model seam: what :class:`~partitioner.solvers.problem.Problem` asks about time.

In: an :class:`~partitioner.ir.Op` and a :class:`~cost_models.profiles.Device` (or a byte count
and two devices). Out: :class:`~cost_models.estimate.Estimate` values, and whether a device can
run an op at all.

:class:`CostModel` is the one interface every solver, baseline and ``evaluate`` reads through the
problem; its own methods are the analytic model (:mod:`cost_models.analytic`,
:mod:`cost_models.training`), so :data:`ANALYTIC` is the default and a measured model
(:class:`cost_models.profiled.ProfiledCosts`) overrides only what it measured. :meth:`record`
says which model priced a plan; the plan file keeps it (``costs``) and the summary and report
show it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cost_models.analytic import ITEMSIZE, kernel_time, op_time, transfer_time
from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceSet
from cost_models.training import Optimizer, optimizer_step_time, training_op_time
from cost_models.precision import KERNEL_ACTIVATIONS, LOW, activations, cast_bytes, itemsize_factor, weights
from partitioner.ir import Op, OpClass

__all__ = ["ANALYTIC", "CostModel"]


class CostModel:
    """Op, copy and optimizer-step times; this base class is the analytic (roofline) model.

    Example:
        >>> from cost_models.profiles import load_profile
        >>> ANALYTIC.name, ANALYTIC.unsupported(op, load_profile("cpu").device("cpu"))  # doctest: +SKIP
        ('analytic', None)
    """

    name = "analytic"

    def op_time(self, op: Op, device: Device) -> Estimate:
        """Forward time of ``op`` on ``device``."""
        return op_time(op, device)

    def training_op_time(self, op: Op, device: Device) -> Estimate:
        """Forward plus backward time of ``op`` on ``device``."""
        return training_op_time(op, device)

    def op_time_in(self, op: Op, device: Device, dtype: str, *, training: bool = False,
                   weight_bytes: int = 0) -> Estimate:
        """Time of ``op`` on ``device`` computing in ``dtype`` (forward, or forward + backward).

        In a 16-bit dtype the op moves half its bytes at the device's rate for that dtype; in
        training it also casts its float32 master weights on every call (:meth:`cast_time`). A
        choice with packed weights (``"float32+int8"``) is :meth:`packed_op_time`, its weight
        taking ``weight_bytes`` packed."""
        timed = self.training_op_time if training else self.op_time
        if dtype == op.dtype:
            return timed(op, device)
        if weights(dtype):
            return self.packed_op_time(op, device, dtype, weight_bytes=weight_bytes)
        f = itemsize_factor(dtype)
        low = dataclasses.replace(op, dtype=dtype, bytes_read=int(op.bytes_read * f),
                                  bytes_written=int(op.bytes_written * f), param_bytes=int(op.param_bytes * f))
        seconds = timed(low, device)
        if training and op.trainable_param_bytes:
            seconds = seconds + self.cast_time(op.trainable_param_bytes, device)
        return seconds

    def packed_op_time(self, op: Op, device: Device, choice: str, *, weight_bytes: int) -> Estimate:
        """Time of a linear whose weight is packed (``choice`` ``"<activations>+<weights>"``) on ``device``:
        the weight-only kernel at the device's ``weight_only`` rate for that weight dtype, reading
        bfloat16 activations (at the streaming rate, caches included) and the ``weight_bytes`` of the
        packed weight (at the memory's rate: a step reads each weight once, from DRAM; the roofline),
        and the unpacking of its weight values once per call where the profile says (``weight_unpack``:
        the CPU kernels' fixed cost, 0.5 ms for a 4096x8192 weight on the 2-core test machine),
        plus the casts of its input and output from and to float32 when the node computes in
        float32. Its rate does not depend on the rows (torch's CPU kernels: 185-188 GFLOP/s at 1 to
        512 rows on the 2-core test machine)."""
        w = weights(choice)
        rate = device.weight_only.get(w)
        if not rate:
            return Estimate(float("inf"))
        activation = max(op.bytes_read - op.param_bytes, 0) + op.bytes_written
        traced32 = op.dtype == "float32"  # (a model traced in 16 bits reads them as they are)
        moved = activation * (itemsize_factor(KERNEL_ACTIVATIONS) if traced32 else 1.0)
        nbytes = moved + weight_bytes
        eff = device.mem_eff("matmul", KERNEL_ACTIVATIONS)
        reading = moved / (device.stream_bandwidth(moved) * eff) + weight_bytes / (device.mem_bandwidth * eff)
        unpack = device.weight_unpack.get(w)
        values = op.param_bytes / ITEMSIZE.get(op.dtype, 4)  # the weight values (and the bias's)
        seconds = max(op.flops / rate + (values / unpack if unpack else 0.0), reading) + device.launch_overhead \
            + device.fixed("matmul", KERNEL_ACTIVATIONS)
        estimate = Estimate(seconds, float(op.flops), float(nbytes))
        if traced32 and activations(choice) not in LOW:  # cast in and out around the kernel
            estimate = estimate + self.cast_time(activation, device)
        return estimate

    def cast_time(self, nbytes_fp32: int, device: Device) -> Estimate:
        """Time to cast a tensor of ``nbytes_fp32`` float32 bytes to or from a 16-bit dtype on ``device``."""
        if nbytes_fp32 <= 0:
            return Estimate()
        return kernel_time(OpClass.ELEMENTWISE, "float32", 0, cast_bytes(nbytes_fp32), device)

    def transfer_time(self, nbytes: float, src: str, dst: str, devices: DeviceSet, *, pinned: bool = True) -> Estimate:
        """Time to copy ``nbytes`` from ``src`` to ``dst`` (``pinned``: from page-locked host memory)."""
        return transfer_time(nbytes, src, dst, devices, pinned=pinned)

    def optimizer_step_time(self, trainable_bytes: int, device: Device, optimizer: Optimizer | str) -> Estimate:
        """Time of one optimizer step over ``trainable_bytes`` of parameters held on ``device``."""
        return optimizer_step_time(trainable_bytes, device, optimizer)

    def unsupported(self, op: Op, device: Device) -> str | None:
        """Why ``device`` cannot run ``op`` beyond what its profile says, or None (the analytic
        model knows only the profile's ``supported_ops``, which the problem checks itself)."""
        return None

    def record(self) -> dict[str, Any]:
        """What a plan records about the model that priced it (the plan's ``costs`` field)."""
        return {"model": self.name}


#: The default cost model: the roofline of :mod:`cost_models.analytic`.
ANALYTIC = CostModel()
