"""How close is an emitted tensor to the original's? Dtype-aware tolerances and the check report.

Every backend's check (the torch module, the onnxruntime parts, ...) compares what the placed
program computed with the original through :func:`compare` and reports a :class:`CheckReport`:
the largest absolute and relative error of every output (in training also of the loss and of every
parameter's gradient), the median wall time of both, and whether every tensor is within its
tolerance.

Tolerances depend on the dtype (:data:`TOLERANCES`); a value passes when every element obeys
``|emitted - original| <= atol + rtol * |original|`` (``torch.allclose``'s rule):

============ ======== ======== =========================================================
dtype        rtol     atol     why
============ ======== ======== =========================================================
float64      1e-7     1e-9     a few units in the last place of 2**-52
float32      1e-4     1e-5     ~1000 ulps (2**-23): other kernels and reduction orders
float16      2e-3     1e-3     ~2 ulps of 2**-10, and one rounding of each side's result
bfloat16     1.6e-2   1e-2     ~2 ulps of 2**-7 (torch.testing uses the same rtol)
integer/bool 0        0        exact: indices, masks and counts must agree
============ ======== ======== =========================================================

A plan that computes ops in 16 bits (its ``precision`` section) produces float32 outputs, losses and
gradients through 16-bit arithmetic: each of them is held to the tolerance of the lowest dtype the
plan computes in (``computed_in``: bfloat16 1.6e-2/1e-2, float16 2e-3/1e-3, rows above), and the
report names that dtype beside the tensor's (``float32 via bfloat16``). A 16-bit op rounds its
inputs and result to 8 (bfloat16) or 11 (float16) significant bits, so its error is a few units
of 2**-8 or 2**-11 of its values; float32 softmax statistics, norms and reductions (the accuracy
policy of :mod:`cost_models.precision`) keep it from growing along the model.

A 16-bit forward also moves values across the kinks of the model (a ReLU's 0, a max's tie): an
element near one is rounded to the other side, and every gradient behind it changes by its whole
contribution. That is what 16 bits do, not an error of the plan: torch.autocast, run on the
original in the same dtype, moves the same elements (an MLP's first-layer gradient in bfloat16:
39% max, 10% norm-wise from float32). So a tensor of a 16-bit plan outside the elementwise rule
passes when its norm-wise error ``||emitted - original|| / ||original||`` is at most twice
torch.autocast's plus the dtype's rtol (``noise``, reported as ``l2 <ours> vs autocast <theirs>``);
a gradient not unscaled, a micro-batch dropped or a cast to the wrong place is still many times
off.

The loss and the gradients are sums over many elements, so an element that nearly cancels to 0
keeps the absolute error of its large summands: for them ``atol`` is scaled by the tensor's
largest reference magnitude (``atol * max(1, max|original|)``). The *relative error* printed is
norm-wise, ``max|emitted - original| / max|original|``, which stays meaningful where single
elements are near zero.

Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from cost_models.units import format_seconds

if TYPE_CHECKING:
    from backends.strict_report import DeviceReport

__all__ = ["Tolerance", "TOLERANCES", "EXACT", "AUTOCAST_FACTOR", "tolerance_for", "TensorError", "CheckReport",
           "MISSING", "compare", "interleaved_medians"]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|a - b| <= atol + rtol * |b|`` elementwise (see the module docstring for the values)."""

    rtol: float  # relative to the original's element
    atol: float  # absolute floor


#: Tolerance per dtype; integer and bool dtypes (absent here) must match exactly.
TOLERANCES: Mapping[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-7, 1e-9),
    torch.float32: Tolerance(1e-4, 1e-5),
    torch.float16: Tolerance(2e-3, 1e-3),
    torch.bfloat16: Tolerance(1.6e-2, 1e-2),
}


EXACT = Tolerance(0.0, 0.0)


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The tolerance of ``dtype``: :data:`TOLERANCES`, exact for integer and bool tensors.

    Example:
        >>> tolerance_for(torch.float32)
        Tolerance(rtol=0.0001, atol=1e-05)
        >>> tolerance_for(torch.int64)
        Tolerance(rtol=0.0, atol=0.0)
    """
    if dtype.is_complex:
        dtype = dtype.to_real()
    return TOLERANCES.get(dtype, EXACT if not dtype.is_floating_point else TOLERANCES[torch.float32])


@dataclasses.dataclass(frozen=True)
class TensorError:
    """How far one emitted tensor is from the original's.

    Example:
        >>> e = compare("output", torch.ones(3), torch.ones(3))
        >>> (e.max_abs, e.passed)
        (0.0, True)
    """

    name: str                 # "output", "output[1]", "loss", or a parameter name
    dtype: str                # the original's dtype, e.g. "float32"
    shape: tuple[int, ...]    # the original's shape
    max_abs: float            # max |emitted - original|
    max_rel: float            # max_abs / max |original| (0 when both are 0, inf when only it is 0)
    tolerance: Tolerance      # the tolerance it was held to
    passed: bool              # every element within the tolerance
    note: str = ""            # why it failed without numbers: shapes differ, gradient missing, ...
    computed_in: str = ""     # the 16-bit dtype a float32 tensor was computed through ("": its own)
    l2_rel: float | None = None  # ||emitted - original|| / ||original||, where judged against autocast's
    l2_autocast: float | None = None  # the same for torch.autocast on the original (16-bit plans)

    def row(self) -> list[str]:
        """The cells of this tensor's line in :meth:`CheckReport.to_text`."""
        shape = "×".join(map(str, self.shape)) or "scalar"
        tol = "exact" if self.tolerance == EXACT else f"{self.tolerance.rtol:.0e}/{self.tolerance.atol:.0e}"
        verdict = "ok" if self.passed else "FAIL" + (f" ({self.note})" if self.note else "")
        if self.l2_rel is not None:
            verdict += f" (l2 {self.l2_rel:.3g} vs autocast {self.l2_autocast:.3g})"
        dtype = f"{self.dtype} via {self.computed_in}" if self.computed_in else self.dtype
        return [self.name, dtype, shape, f"{self.max_abs:.3g}", f"{self.max_rel:.3g}", tol, verdict]


@dataclasses.dataclass(frozen=True)
class CheckReport:
    """The outcome of :func:`check_plan`; :meth:`to_text` is what ``hetpart check`` prints."""

    model_name: str
    binding: Mapping[str, str]       # logical device -> the physical device it ran on
    training: bool                   # loss and gradients compared too
    repeat: int                      # timed runs of each module
    outputs: tuple[TensorError, ...]
    loss: TensorError | None         # training only: the sum of the outputs
    grads: tuple[TensorError, ...]   # training only: one per parameter, original names
    original_s: float                # median wall time of the original model (forward, + backward in training)
    emitted_s: float                 # the same for the emitted module
    passed: bool                     # every tensor within its tolerance (and devices as planned)
    devices: DeviceReport | None = None  # strict devices: copies per link, bytes per device vs the plan
    emitted: str = "emitted plan"    # what ran the plan, as the report names it
    loss_name: str = "sum of outputs"  # how the training loss is made, as the report names it
    packed: PackedErrors | None = None  # packed weights: the error against the float model (the outputs
                                        # above compare with the same packing run on the host alone)

    def failures(self) -> list[TensorError]:
        """The tensors outside their tolerance."""
        return [e for e in self.tensors() if not e.passed]

    def tensors(self) -> list[TensorError]:
        """Every compared tensor: outputs, then the loss, then the gradients."""
        return [*self.outputs, *([self.loss] if self.loss else []), *self.grads]

    def to_text(self) -> str:
        """A table of the errors, the times and the verdict, for people.

        Example:
            >>> print(report.to_text())                       # doctest: +SKIP
            check gpt:tiny: emitted plan vs the original, inference; devices cpu, cuda:0->cpu
            ...
        """
        bound = ", ".join(k if k == v else f"{k}->{v}" for k, v in self.binding.items())
        mode = f"training (loss = {self.loss_name}; gradients)" if self.training else "inference"
        lines = [f"check {self.model_name}: {self.emitted} vs the original, {mode}; devices {bound}"]
        header = ["tensor", "dtype", "shape", "max abs", "max rel", "rtol/atol", ""]
        lines += _table([header] + [e.row() for e in self.tensors()], indent="  ")
        ratio = self.emitted_s / self.original_s if self.original_s > 0 else float("nan")
        what = "forward + backward" if self.training else "forward"
        lines.append(f"  time ({what}, median of {self.repeat}): original {format_seconds(self.original_s)}, "
                     f"emitted {format_seconds(self.emitted_s)} ({ratio:.2f}x)")
        if self.devices is not None:
            lines.append(self.devices.to_text())
        if self.packed is not None:
            lines.append(self.packed.to_text())
        bad = self.failures()
        devices_ok = self.devices is None or self.devices.passed
        if self.passed:
            lines.append("passed: every tensor within its tolerance"
                         + ("; copies and resident bytes as the plan says" if self.devices is not None else ""))
        elif bad:
            lines.append(f"FAILED: {len(bad)} of {len(self.tensors())} tensors outside their tolerance "
                         f"({', '.join(e.name for e in bad[:5])}{', ...' if len(bad) > 5 else ''})"
                         + ("" if devices_ok else "; devices differ from the plan"))
        else:
            lines.append("FAILED: " + ("devices differ from the plan (strict devices)" if not devices_ok else
                                       "the check did not pass"))
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PackedErrors:
    """A plan with packed weights against the float model: per output its relative L2 error
    ``||emitted - float|| / ||float||``, and the same error of the whole-model reference (the
    plan's packing applied to every listed linear, on the host alone, no placement)."""

    weights: Mapping[str, int]       # packed dtype -> linears packed in it
    placed: Mapping[str, float]      # output -> the emitted module's relative error against float
    reference: Mapping[str, float]   # output -> the unplaced reference's relative error against float
    budget: float | None = None      # the plan's precision max_error (measured on its example inputs), if any

    @property
    def worst(self) -> float:
        return max(self.placed.values(), default=0.0)

    def to_text(self) -> str:
        held = ", ".join(f"{n} linears in {w}" for w, n in sorted(self.weights.items()))
        rows = ", ".join(f"{name} {e:.2e} (reference {self.reference.get(name, float('nan')):.2e})"
                         for name, e in self.placed.items())
        budget = "" if self.budget is None else (
            f"; the plan's max_error {self.budget:g} is " + ("kept on these inputs" if self.worst <= self.budget
                                                             else "exceeded on these inputs (it was planned on "
                                                                  "its example inputs)"))
        return (f"  packed weights ({held}): outputs compared with the same packing run unplaced on the host; "
                f"relative error against the float model: {rows}{budget}")


MISSING = object()  # a gradient the emitted module did not produce (or has no parameter for)


#: A 16-bit plan's tensor outside the elementwise rule passes within this many times torch.autocast's
#: norm-wise error (plus the dtype's rtol); see the module docstring.
AUTOCAST_FACTOR = 2.0


def compare(name: str, emitted: Any, original: torch.Tensor | None, *, summed: bool = False,
            computed_in: torch.dtype | None = None, noise: torch.Tensor | None = None) -> TensorError:
    """The error of ``emitted`` against ``original`` (``summed``: a reduction, atol scaled by its size;
    ``computed_in``: the 16-bit dtype a floating tensor was computed through, whose tolerance applies;
    ``noise``: the same tensor from torch.autocast in that dtype, which bounds the norm-wise error of
    elements that crossed a kink).

    Example:
        >>> compare("x", torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.00001])).passed
        True
    """
    if original is None:  # a gradient the original did not produce: the emitted one must be absent too
        ok = emitted is None or emitted is MISSING
        return TensorError(name, "-", (), 0.0, 0.0, EXACT, ok, "" if ok else "only the emitted module has a gradient")
    tol = tolerance_for(original.dtype)
    via = ""
    if computed_in is not None and original.is_floating_point() and tolerance_for(computed_in).rtol > tol.rtol:
        tol, via = tolerance_for(computed_in), str(computed_in).removeprefix("torch.")
    dtype, shape = str(original.dtype).removeprefix("torch."), tuple(original.shape)
    failed = _structural_mismatch(emitted, original)
    if failed:
        return TensorError(name, dtype, shape, float("inf"), float("inf"), tol, False, failed, via)
    work = torch.complex128 if original.is_complex() else torch.float64
    a, b = emitted.detach().to("cpu", work), original.detach().to("cpu", work)
    diff = (a - b).abs()
    scale = b.abs().max().item() if b.numel() else 0.0
    max_abs = diff.max().item() if diff.numel() else 0.0
    max_rel = max_abs / scale if scale else (0.0 if max_abs == 0 else float("inf"))
    if tol == EXACT:
        passed = torch.equal(emitted.detach().cpu(), original.detach().cpu())
    else:
        atol = tol.atol * max(1.0, scale) if summed else tol.atol
        passed = bool(torch.all(diff <= atol + tol.rtol * b.abs()).item())  # NaN compares False: a failure
    note = "NaN" if not passed and diff.isnan().any().item() else ""
    l2 = l2_autocast = None
    if not passed and not note and via and isinstance(noise, torch.Tensor) and noise.shape == original.shape:
        norm = b.norm().item()
        if norm > 0:
            l2 = (a - b).norm().item() / norm
            l2_autocast = (noise.detach().to("cpu", work) - b).norm().item() / norm
            passed = l2 <= AUTOCAST_FACTOR * l2_autocast + tol.rtol  # NaN compares False: a failure
    return TensorError(name, dtype, shape, max_abs, max_rel, tol, passed, note, via, l2, l2_autocast)


def interleaved_medians(fns: Sequence[Callable[[], Any]], repeat: int,
                        sync: Callable[[], None] = lambda: None) -> list[float]:
    """Median wall time of each function, run ABAB... ``repeat`` times after one warm-up each;
    ``sync`` waits for asynchronous devices after each run.

    Example:
        >>> a, b = interleaved_medians([lambda: sum(range(100)), lambda: sum(range(1000))], 3)
        >>> a < b
        True
    """
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    sync()
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            sync()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _structural_mismatch(emitted: Any, original: torch.Tensor) -> str:
    """Why ``emitted`` cannot be compared with ``original`` at all ("" when it can)."""
    if emitted is MISSING:
        return "the emitted module has no such gradient"
    if emitted is None:
        return "missing in the emitted module"
    if not isinstance(emitted, torch.Tensor):
        return f"emitted a {type(emitted).__name__}"
    if tuple(emitted.shape) != tuple(original.shape):
        return f"shape {tuple(emitted.shape)}"
    if emitted.dtype != original.dtype:
        return f"dtype {str(emitted.dtype).removeprefix('torch.')}"
    return ""


def _table(rows: list[list[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
