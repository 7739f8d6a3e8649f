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

from cost_models.analytic import kernel_time, op_time, transfer_time
from cost_models.estimate import Estimate
from cost_models.profiles import Device, DeviceSet
from cost_models.training import Optimizer, optimizer_step_time, training_op_time
from cost_models.precision import cast_bytes, itemsize_factor
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

    def op_time_in(self, op: Op, device: Device, dtype: str, *, training: bool = False) -> Estimate:
        """Time of ``op`` on ``device`` computing in ``dtype`` (forward, or forward + backward).

        In a 16-bit dtype the op moves half its bytes at the device's rate for that dtype; in
        training it also casts its float32 master weights on every call (:meth:`cast_time`)."""
        timed = self.training_op_time if training else self.op_time
        if dtype == op.dtype:
            return timed(op, device)
        f = itemsize_factor(dtype)
        low = dataclasses.replace(op, dtype=dtype, bytes_read=int(op.bytes_read * f),
                                  bytes_written=int(op.bytes_written * f), param_bytes=int(op.param_bytes * f))
        seconds = timed(low, device)
        if training and op.trainable_param_bytes:
            seconds = seconds + self.cast_time(op.trainable_param_bytes, device)
        return seconds

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
