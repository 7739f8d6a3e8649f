"""Training-mode costs: backward time, optimizer state, optimizer step, saved activations.

In: an :class:`~partitioner.ir.Op` (and its device) and an :class:`Optimizer`. Out: Estimates and
byte counts that the partitioner adds to the forward costs when it plans a training step.

The accounting (``DESIGN.md``, "training mode"):

- backward ≈ 2× the forward FLOPs and 2× the bytes (gradient w.r.t. inputs and w.r.t. weights);
  a gather (embedding) additionally writes a dense gradient as large as its table, which is
  what makes a multi-GB embedding slow to train wherever it lives; a grouped (depthwise)
  convolution's backward runs at ``Device.grouped_backward_flops`` where that is slower: on a
  CPU its gradient kernels reach a fraction of the forward's rate (ConvNeXt's 7×7 depthwise
  convolutions on the 2-core test machine: a backward 3-20× their forward, about 0.5 ns per
  forward FLOP at every size, where 2× the forward predicted 4-10× too little);
- memory per trainable parameter byte = weight + gradient + optimizer state
  (SGD: 0 extra copies, SGD with momentum: 1, Adagrad: 1, Adam/AdamW/SparseAdam: 2); buffers are
  weights only;
- the optimizer step streams ``passes × trainable bytes`` through the memory of the device that
  holds the optimizer state (SGD reads weight and gradient and writes the weight: 3 passes; momentum
  and Adagrad also read and write their buffer: 5; Adam reads weight, gradient, two moments and
  writes three: 7), at the device's ``update_bandwidth`` where its profile gives one (the CPU's
  is fitted to the calibration's measured training step), else its elementwise rate;
- a *row-sparse* update (:func:`sparse_update`) of a gather's table touches only the rows a batch
  can read (its index count): its gradient is those rows, backward writes no dense gradient, and
  the step moves ``passes × rows × row bytes``. It equals the dense update for SGD without
  momentum and for Adagrad (a zero gradient changes neither the row nor its state); for
  ``sparse-adam`` (``torch.optim.SparseAdam``: untouched rows keep their moments) it is the
  optimizer's own, lazy semantics, asked for by name;
- every non-view op's outputs are saved for backward until the backward pass reaches it.
"""

from __future__ import annotations

import enum

from cost_models.analytic import kernel_time, op_time, weight_rows
from cost_models.estimate import Estimate
from cost_models.profiles import Device
from partitioner.ir import Op, OpClass

BACKWARD_FACTOR = 2.0  # backward FLOPs and bytes per forward FLOP and byte


class Optimizer(str, enum.Enum):
    """Optimizer kinds whose state and step cost are modelled."""

    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAGRAD = "adagrad"
    SPARSE_ADAM = "sparse-adam"

    @property
    def state_copies(self) -> int:
        """Extra copies of each trainable parameter the optimizer keeps."""
        return {Optimizer.SGD: 0, Optimizer.SGD_MOMENTUM: 1, Optimizer.ADAGRAD: 1}.get(self, 2)

    @property
    def step_passes(self) -> int:
        """Passes over the trainable bytes one step makes (reads plus writes)."""
        return {Optimizer.SGD: 3, Optimizer.SGD_MOMENTUM: 5, Optimizer.ADAGRAD: 5}.get(self, 7)

    @property
    def sparse_exact(self) -> bool:
        """A row-sparse step equals the dense one (SGD without momentum, Adagrad)."""
        return self in (Optimizer.SGD, Optimizer.ADAGRAD)

    @property
    def sparse_rows(self) -> bool:
        """Gathers' tables update row-sparse: exactly (``sparse_exact``) or as asked (``sparse-adam``)."""
        return self.sparse_exact or self is Optimizer.SPARSE_ADAM


def parse_optimizer(value: Optimizer | str) -> Optimizer:
    """``"adam"`` → ``Optimizer.ADAM``; an unknown name raises ValueError listing the known ones."""
    try:
        return Optimizer(value)
    except ValueError:
        raise ValueError(
            f"unknown optimizer {value!r}: use one of {', '.join(o.value for o in Optimizer)}"
        ) from None


def backward_time(op: Op, device: Device, *, sparse: bool = False) -> Estimate:
    """Predicted backward time of ``op`` on ``device`` (``sparse``: a gather's row-sparse gradient,
    no dense table written)."""
    if op.op_class is OpClass.VIEW:
        return Estimate()
    grad = kernel_time(
        op.op_class,
        op.dtype,
        BACKWARD_FACTOR * op.flops,
        BACKWARD_FACTOR * (op.bytes_read + op.bytes_written),
        device,
        fresh=op.bytes_read,   # the gradients of its inputs and weights are new tensors
        rows=weight_rows(op),  # its two matmuls have the forward's rows (one as their reduction)
    )
    if op.op_class is OpClass.GATHER and op.trainable_param_bytes and not sparse:
        grad = grad + dense_gradient_time(op, device)
    if op.op_class is OpClass.CONV and op.groups > 1 and device.grouped_backward_flops:
        # a grouped (depthwise) convolution's gradients have their own, slower kernels on a CPU
        slow = BACKWARD_FACTOR * op.flops / device.grouped_backward_flops + device.launch_overhead
        if slow > grad.seconds:
            grad = Estimate(slow, grad.flops, grad.bytes)
    return grad


def dense_gradient_time(op: Op, device: Device) -> Estimate:
    """A gather's dense gradient of its whole table: zero-filled, then its rows scattered in."""
    return update_time(op.trainable_param_bytes, device)


def update_time(nbytes: float, device: Device) -> Estimate:
    """Time to stream ``nbytes`` through ``device``'s memory in an optimizer-like update kernel."""
    if device.update_bandwidth:
        return Estimate(nbytes / device.update_bandwidth + device.launch_overhead, 0.0, float(nbytes))
    return kernel_time(OpClass.ELEMENTWISE, "float32", 0, nbytes, device)


def sparse_update(op: Op, table_rows: int, index_elements: int, optimizer: Optimizer | str) -> int | None:
    """Trainable bytes a row-sparse update of ``op``'s table (``table_rows`` rows) touches per step
    (a batch reads ``index_elements`` rows at most), or None where ``op`` is no trainable gather or
    the optimizer updates densely."""
    opt = parse_optimizer(optimizer)
    if op.op_class is not OpClass.GATHER or not op.trainable_param_bytes or not opt.sparse_rows or table_rows <= 0:
        return None
    rows = min(table_rows, max(index_elements, 1))
    return -(-op.trainable_param_bytes * rows // table_rows)


def training_op_time(op: Op, device: Device) -> Estimate:
    """Forward plus backward time of ``op`` on ``device``."""
    return op_time(op, device) + backward_time(op, device)


def parameter_memory(op: Op, optimizer: Optimizer | str, *, training: bool) -> int:
    """Bytes the parameters owned by ``op`` occupy where they live (weights, grads, optimizer state)."""
    if not training:
        return op.param_bytes
    opt = parse_optimizer(optimizer)
    frozen = op.param_bytes - op.trainable_param_bytes
    return frozen + op.trainable_param_bytes * (2 + opt.state_copies)


def optimizer_step_time(trainable_bytes: int, device: Device, optimizer: Optimizer | str) -> Estimate:
    """Time of one optimizer step over ``trainable_bytes`` of parameters held on ``device``."""
    if trainable_bytes <= 0:
        return Estimate()
    opt = parse_optimizer(optimizer)
    return update_time(opt.step_passes * trainable_bytes, device)


def saved_activation_bytes(op: Op, output_bytes: int) -> int:
    """Bytes of ``op``'s outputs kept alive for backward (``output_bytes`` = their total size)."""
    return 0 if op.op_class is OpClass.VIEW else output_bytes
