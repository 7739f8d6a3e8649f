"""Micro-benchmarks for calibration: small graphs of single ops, measured on one device.

In: a device present on this machine (``"cpu"``, ``"cuda:0"``), a size scale, and the measurement
options. Out: :class:`Row` values — each op of each suite as hetpart captures it (its class, FLOPs
and bytes from the front end) beside its measured time — that :mod:`cost_models.fit` fits a
profile to.

The suites cover every op class the analytic model prices: matmuls of several shapes (fp32, and
bf16 where the device runs it), convolutions with batch norm and pooling, attention (causal and
not), a size sweep of a copy from a few KiB to well past any cache (it finds the cache tier and
the DRAM bandwidth), compute-heavy elementwise ops (GELU, SiLU, exp), norms,
softmax, reductions, gathers from a small and a large table, data movement (cat, contiguous
copies), views and one-element ops (the per-op overhead). Each suite is one module captured with
``torch.export`` and measured in place by :func:`cost_models.measure.measure_ops` — the way a whole
model's ops run: fresh outputs, inputs left in cache by the op before, called through the same
aten entry points as an emitted module. :func:`first_touch` measures what filling freshly
allocated memory costs against reused memory, and finds the size above which every allocation is
fresh.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from cost_models.measure import MeasureOptions, ProgressFn, measure_ops
from cost_models.measure_cache import MeasurementCache
from partitioner.ir import Op, OpClass

__all__ = ["Row", "Suite", "suites", "run_suites", "FirstTouch", "first_touch", "BackwardRow", "grouped_backward",
           "GROUPED_CONVS"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured op: what hetpart captures for it and how long it took."""

    suite: str
    op: Op
    shape: tuple[int, ...]      # its first output's shape
    seconds: float

    @property
    def label(self) -> str:
        """``aten.linear.default 512x1024 float32``."""
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{self.op.kind} {shape} {self.op.dtype}"


@dataclasses.dataclass(frozen=True)
class Suite:
    """A module whose forward runs independent ops on its inputs, and those inputs."""

    name: str
    build: Callable[[], tuple[nn.Module, tuple]]   # made on the CPU, moved by the runner


class _Ops(nn.Module):
    """``forward(*xs)`` applies ``fns[i]`` to its inputs; every result is an output."""

    def __init__(self, fns: list[Callable[..., torch.Tensor]], arity: list[int], params: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.fns, self.arity = fns, arity
        for name, value in params.items():
            self.register_parameter(name, nn.Parameter(value, requires_grad=False))

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, i = [], 0
        for fn, n in zip(self.fns, self.arity):
            out.append(fn(self, *xs[i:i + n]))
            i += n
        return tuple(out)


def _suite(name: str, items: list[tuple[Callable[..., torch.Tensor], tuple]], params: dict | None = None) -> Suite:
    def build() -> tuple[nn.Module, tuple]:
        fns = [fn for fn, _ in items]
        inputs = tuple(x for _, xs in items for x in xs)
        return _Ops(fns, [len(xs) for _, xs in items], dict(params or {})), inputs
    return Suite(name, build)


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def suites(kind: str = "cpu", *, quick: bool = False, bf16: bool = True) -> list[Suite]:
    """The micro-benchmark suites for a device of ``kind`` (``"cpu"`` or ``"gpu"``: larger shapes).

    ``quick`` keeps one or two shapes per class (for tests); ``bf16`` adds bf16 matmuls.

    Example:
        >>> [s.name for s in suites(quick=True)][:3]
        ['matmul', 'conv', 'attention']
    """
    g = 4 if kind == "gpu" else 1     # linear dimension scale
    e = 16 if kind == "gpu" else 1    # element-count scale
    torch.manual_seed(0)
    # rows (batch) of 64 twice: a matmul's rate depends on its rows per weight (fit: matmul_half_rows)
    matmuls = [(64, 512, 512), (64, 2048, 2048), (512, 1024, 1024), (1024, 1024, 4096)] if not quick \
        else [(64, 256, 256), (256, 512, 512)]
    mm_items: list = []
    mm_params: dict[str, torch.Tensor] = {}
    dtypes = [torch.float32] + ([torch.bfloat16] if bf16 else [])
    for dtype in dtypes:
        for i, (m, k, n) in enumerate(matmuls if dtype is torch.float32 else matmuls[-2:]):
            key = f"w_{str(dtype)[6:]}_{i}"
            mm_params[key] = _r(n * g, k * g, dtype=dtype) * 0.02
            mm_items.append((lambda s, x, key=key: F.linear(x, getattr(s, key)), (_r(m * g, k * g, dtype=dtype),)))
    mm_items.append((lambda s, a, b: torch.bmm(a, b), (_r(16, 256 * g, 64), _r(16, 64, 256 * g))))
    mm_items.append((lambda s, a, b: torch.mm(a, b), (_r(16, 64), _r(64, 64))))     # a call, nearly no work
    out = [_suite("matmul", mm_items, mm_params)]

    # a ResNet's stages: a 7x7 stem, then 3x3 convolutions from wide-and-shallow to narrow-and-deep
    convs = [(8, 64, 56, 64, 3, 1), (8, 3, 112, 64, 7, 2)] + ([] if quick else [
        (8, 128, 28, 128, 3, 1), (8, 256, 14, 256, 3, 1), (8, 512, 7, 512, 3, 1)])
    conv_items: list = []
    conv_params: dict[str, torch.Tensor] = {}
    for i, (n, c, h, o, k, s) in enumerate(convs):
        conv_params[f"c{i}"] = _r(o, c, k, k) * 0.05
        conv_items.append((lambda m, x, i=i, s=s, k=k: F.conv2d(x, getattr(m, f"c{i}"), stride=s, padding=k // 2),
                           (_r(n * g, c, h, h),)))
    conv_params["tiny"] = _r(8, 4, 3, 3)
    conv_items.append((lambda m, x: F.conv2d(x, m.tiny, padding=1), (_r(1, 4, 8, 8),)))
    conv_params["bn_w"], conv_params["bn_b"] = torch.ones(64), torch.zeros(64)
    conv_params["bn_m"], conv_params["bn_v"] = torch.zeros(64), torch.ones(64)
    conv_items += [
        (lambda m, x: F.batch_norm(x, m.bn_m, m.bn_v, m.bn_w, m.bn_b, training=False), (_r(8 * g, 64, 56, 56),)),
        (lambda m, x: F.max_pool2d(x, 3, 2, 1), (_r(8 * g, 64, 112, 112),)),
        (lambda m, x: F.avg_pool2d(x, 2), (_r(8 * g, 128, 56, 56),)),
        (lambda m, x: F.adaptive_avg_pool1d(x, 4), (_r(16 * g, 128, 256),)),
        (lambda m, x: F.adaptive_avg_pool2d(x, 1), (_r(8 * g, 256, 28, 28),)),
    ]
    out.append(_suite("conv", conv_items, conv_params))

    att = [(1, 2, 16, 16), (4, 8, 256, 64)] + ([] if quick else [(2, 16, 512, 64)])
    att_items: list = []
    for b, h, t, d in att:
        for causal in (False, True):
            att_items.append((lambda m, q, k, v, causal=causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                              (_r(b * g, h, t, d), _r(b * g, h, t, d), _r(b * g, h, t, d))))
    out.append(_suite("attention", att_items))

    sweep = [2**12, 2**16, 2**18, 2**20, 2**22, 2**23, 2**24] if not quick else [2**12, 2**18, 2**22]
    copies = [(lambda m, x: x.clone(), (_r(n * e),)) for n in sweep]   # no arithmetic: bandwidth alone
    out.append(_suite("stream", copies))

    big, mid = (2**24 if not quick else 2**22) * e, 2**20 * e
    pointwise = [(lambda m, x: F.gelu(x), (_r(big),)), (lambda m, x: F.silu(x), (_r(big),)),
                 (lambda m, x: torch.exp(x), (_r(mid),)), (lambda m, x: F.gelu(x), (_r(mid),)),
                 (lambda m, x: torch.relu(x), (_r(big),)), (lambda m, a, b: a * b, (_r(mid), _r(mid)))]
    out.append(_suite("pointwise", pointwise))

    rows = [256, 4096 * e] if not quick else [256, 1024]
    norm_params = {"ln_w": torch.ones(1024), "ln_b": torch.zeros(1024)}
    red: list = []
    for r in rows:
        red += [(lambda m, x: F.layer_norm(x, (1024,), m.ln_w, m.ln_b), (_r(r, 1024),)),
                (lambda m, x: torch.softmax(x, -1), (_r(r, 1024),)),
                (lambda m, x: x.sum(-1), (_r(r, 1024),)),
                (lambda m, x: x.amax(-1), (_r(r, 1024),))]
    out.append(_suite("reduce", red, norm_params))

    tables = {"small_table": _r(4096, 256), "big_table": _r(65536 if not quick else 16384, 256)}
    ids = torch.randint(0, 4096, (8192 * e,))
    gather = [(lambda m, i: F.embedding(i, m.small_table), (ids,)),
              (lambda m, i: F.embedding(i, m.big_table), (ids,)),
              (lambda m, x, i: torch.index_select(x, 0, i), (_r(4096, 256), ids))]
    out.append(_suite("gather", gather, tables))

    move = [(lambda m, a, b: torch.cat([a, b], 0), (_r(mid), _r(mid))),
            (lambda m, x: x.transpose(0, 1).contiguous(), (_r(2048, 2048 * e),)),
            (lambda m, x: x.clone(), (_r(mid),))]
    out.append(_suite("move", move))

    views = [(lambda m, x: x.transpose(0, 1), (_r(64, 64),)),
             (lambda m, x: x.view(16, 256), (_r(64, 64),)),
             (lambda m, x: x.unflatten(-1, (8, 8)), (_r(64, 64),)),
             (lambda m, x: x.permute(1, 0, 2), (_r(8, 8, 64),)),
             (lambda m, x: x[:, :32], (_r(64, 64),)),
             (lambda m, x: x.unsqueeze(0), (_r(64, 64),))]
    tiny = [(lambda m, a, b: a + b, (_r(1), _r(1))), (lambda m, a, b: a * b, (_r(1), _r(1))),
            (lambda m, x: torch.relu(x), (_r(1),)), (lambda m, x: torch.neg(x), (_r(1),))]
    out.append(_suite("overhead", views + tiny))
    return out


def run_suites(
    device: str,
    suite_list: list[Suite],
    *,
    options: MeasureOptions = MeasureOptions(),
    cache: MeasurementCache | None = None,
    progress: ProgressFn | None = None,
) -> list[Row]:
    """Capture each suite and measure it on ``device``: one :class:`Row` per captured op.

    Example:
        >>> rows = run_suites("cpu", suites(quick=True)[-1:])      # doctest: +SKIP
        >>> rows[0].op.op_class.value, rows[0].seconds > 0
        ('view', True)
    """
    from partitioner.frontends.fx import from_module

    cache = cache if cache is not None else MeasurementCache()
    rows: list[Row] = []
    for suite in suite_list:
        module, inputs = suite.build()
        graph = from_module(module, inputs, name=suite.name)
        measured = measure_ops(graph.source.module(), inputs, device, options=options, cache=cache, progress=progress)
        for op in graph.topological_order():
            times = measured.ops.get(op.name)
            if times is None or times.forward_s is None or op.name in measured.unsupported:
                continue
            shape = graph.tensors[op.outputs[0]].shape if op.outputs else ()
            rows.append(Row(suite.name, op, tuple(shape), times.forward_s))
        if measured.interrupted:
            raise KeyboardInterrupt
    return rows


@dataclasses.dataclass(frozen=True)
class BackwardRow:
    """One op's measured backward (its gradients' share of a training pass)."""

    op: Op
    backward_s: float


# (batch, channels, height and width, kernel): ConvNeXt's 7x7 depthwise convolutions, stage by stage
GROUPED_CONVS = ((2, 96, 56, 7), (2, 192, 28, 7), (2, 384, 14, 7), (2, 768, 7, 7))


class _Grouped(nn.Module):
    """Depthwise convolutions, each on its own input scaled by a weight (so its input needs a gradient)."""

    def __init__(self, shapes: tuple[tuple[int, int, int, int], ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, c, k, padding=k // 2, groups=c) for _, c, _, k in shapes)
        self.scales = nn.Parameter(torch.ones(len(shapes)))

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(conv(x * self.scales[i]) for i, (conv, x) in enumerate(zip(self.convs, xs)))


def grouped_backward(
    device: str,
    *,
    quick: bool = False,
    options: MeasureOptions = MeasureOptions(),
    cache: MeasurementCache | None = None,
    progress: ProgressFn | None = None,
) -> list[BackwardRow]:
    """The measured backward of depthwise convolutions (:data:`GROUPED_CONVS`) on ``device``, from
    which :func:`cost_models.fit.fit_grouped_backward` fits ``Device.grouped_backward_flops``."""
    from partitioner.frontends.fx import from_module

    shapes = GROUPED_CONVS[-2:] if quick else GROUPED_CONVS
    module = _Grouped(shapes)
    inputs = tuple(_r(n, c, h, h) for n, c, h, _ in shapes)
    graph = from_module(module, inputs, name="grouped-conv-backward")
    measured = measure_ops(graph.source.module(), inputs, device, cache=cache, progress=progress,
                           options=dataclasses.replace(options, training=True, optimizer="sgd"))
    rows = []
    for op in graph.topological_order():
        times = measured.ops.get(op.name)
        if op.op_class is OpClass.CONV and op.groups > 1 and times is not None and times.backward_s is not None:
            rows.append(BackwardRow(op, times.backward_s))
    if measured.interrupted:
        raise KeyboardInterrupt
    return rows


@dataclasses.dataclass(frozen=True)
class FirstTouch:
    """What freshly allocated memory costs: the size from which every allocation is fresh, and
    the rate at which its pages are faulted in (bytes/s, beyond writing them)."""

    threshold: int            # bytes: outputs at least this large come fresh from the OS every time
    bandwidth: float          # bytes/s of first touch (0: not measured / no fresh allocations)
    fresh_s: float            # allocating, filling and freeing a buffer of ``size`` bytes
    reused_s: float           # filling the same buffer again
    size: int


def first_touch(device: str = "cpu", sizes: tuple[int, ...] = (2**20, 2**22, 2**23, 2**24, 3 * 2**23, 2**25, 2**26),
                repeats: int = 7) -> FirstTouch | None:
    """Measure first-touch costs on the host (``None`` for other devices, whose allocators cache).

    The threshold is the smallest of ``sizes`` whose every allocation page-faults (counted with
    ``getrusage``, which load on the machine does not change); the rate compares allocating,
    filling and freeing a buffer of the largest size (what a model's fresh output costs over its
    life: the faults, and returning the pages) with filling one that is reused.

    Example:
        >>> ft = first_touch()                                  # doctest: +SKIP
        >>> ft.threshold, round(ft.bandwidth / 1e9, 1)     # glibc: every block of 32 MiB is mmapped
        (33554432, 5.7)
    """
    if torch.device(device).type != "cpu":
        return None
    page = resource.getpagesize()
    threshold = 0
    for size in sizes:
        torch.empty(size // 4).fill_(1.0)            # the first allocation of a size may grow the heap
        faults = []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            torch.empty(size // 4).fill_(1.0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        if min(faults) >= 0.9 * size / page:
            threshold = size
            break
    size = sizes[-1]
    keep = torch.empty(size // 4)
    fresh, reused = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.empty(size // 4).fill_(1.0)        # allocated, faulted in, written, and given back
        fresh.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        keep.fill_(1.0)
        reused.append(time.perf_counter() - t0)
    fresh_s, reused_s = statistics.median(fresh), statistics.median(reused)
    extra = fresh_s - reused_s
    bandwidth = size / extra if threshold and extra > 0 else 0.0
    return FirstTouch(threshold, bandwidth, fresh_s, reused_s, size)


def classes(rows: list[Row]) -> dict[OpClass, list[Row]]:
    """Rows grouped by op class, in class order."""
    out: dict[OpClass, list[Row]] = {}
    for row in rows:
        out.setdefault(row.op.op_class, []).append(row)
    return {c: out[c] for c in OpClass if c in out}
