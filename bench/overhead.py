"""Run-time overhead of the emitted module (against the same placement written by hand, and eager),
and of ONNX parts (chained onnxruntime sessions against one session of the whole model).

For each zoo model (``small``) a two-device plan is made on ``h200-host``: the first part (the
embeddings; the first layer or the stem where there is no embedding) pinned to ``cpu``, every
other module with parameters pinned to ``cuda:0``. The plan is emitted bound to the CPU
(``{"cuda:0": "cpu"}``), so all three contenders run the same arithmetic on the same device:

* ``eager``   the original model;
* ``hand``    the placement written by hand, the seed's ``HybridModel`` style: a plain
              ``nn.Module`` holding the original submodules on their devices and calling them
              with explicit ``.to(device)`` between the parts;
* ``emitted`` ``plan.emit(model, {"cuda:0": "cpu"})``.

Each holds its own copy of the weights (the emitted module copies them; the hand-written one is
built on a deep copy), so none finds its weights left in the cache by the one timed before it.
Each is warmed up, then timed ``--repeat`` times (default 50) interleaved, the order rotating
each round (eager, hand, emitted; hand, emitted, eager; ...), in one process, under
``torch.inference_mode()``, with torch's thread count as the environment set it. The table
prints the medians, ``emitted / hand`` and ``emitted / eager``, the largest output difference
from eager, and whether the target (the emitted module at most 3% slower than the hand-written
one) is met.

A second table measures the torch.compile backend on a single-device plan (the ``cpu`` profile), so
any difference from eager is the backend's own cost: per call after warm-up, ``eager``, dynamo
with its ``eager`` backend (dynamo's guards and frame handling alone) and
``backend="hetpart"``, interleaved as above under ``torch.no_grad()`` (target: hetpart at most 5%
slower than eager); and the first call split into ``dynamo`` (tracing and guards: the first call's
wall time less the three hetpart steps and one eager call), ``capture`` (``from_graph_module``),
``solve`` (the plan) and ``emit`` (the placed graph), from a fresh ``torch._dynamo.reset()``.

ONNX rows: each model as ONNX — ``convnet`` (zoo, ResNet-style), ``resnet50`` (the light
ResNet-50 the onnx wheel ships: IR version 3, weights made by ConstantOfShape), ``densenet``
(DenseNet-style, built in ``models/onnx_models.py``), ``densenet121`` (light), ``gpt`` and ``bert``
(zoo, transformers) — is planned twice, then run with every part on the CPU provider:

* ``2 parts``: ``h200-host``, the ops before a pipeline cut pinned to ``cpu``, the rest to
  ``cuda:0``; the cut lies within 20-50% of the ops (topological order), where the fewest bytes
  cross, as a pipeline cut is placed (OpenVINO's split by weights takes the fewest crossing
  elements near its target too). A cut inside a DenseNet dense block costs more than its copy on
  the CPU provider: onnxruntime's NCHWc layout pass starts only from convolutions, so a ``Concat``
  that reads a part's input, and every ``Concat`` and ``BatchNormalization`` after it in the block,
  stays in plain NCHW with reorders around it (``densenet:small`` cut after a quarter of its ops,
  inside its first block: 1.09-1.10x). Such cuts carry the most bytes too, so this rule avoids them;
* ``ILP``: ``cpu-gpu-npu``, both accelerators capped at 40% of the weights, the ILP's placement.

Both the parts and one whole-model session (same session options) are warmed up, then timed
``--repeat`` times interleaved, order alternating; the table prints the medians, their ratio and the
largest output difference. Target: parts at most 5% slower than the whole model.

    python bench/overhead.py [--models mlp,gpt] [--onnx-models resnet50,gpt] [--size small] [--repeat 50]
                             [--warmup 5] [--compile-only]    # --models '' / --onnx-models '': none of those
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

import models
from backends.compile import HetpartBackend
from cost_models.units import format_seconds
from partitioner import partition

MODELS = ("mlp", "gpt", "convnet", "emb-transformer")
TARGET = 1.03  # emitted / hand
COMPILE_TARGET = 1.05  # hetpart-compiled / eager, single-device plan
ONNX_MODELS = ("convnet", "resnet50", "densenet", "densenet121", "gpt", "bert")
ONNX_TARGET = 1.05  # parts / whole


# --------------------------------------------------------------------------------------------
# The placements, written by hand (part A on device a, part B on device b)
# --------------------------------------------------------------------------------------------


class HandMLP(nn.Module):
    """``layers.0`` (+ its ReLU) on ``a``; the rest of the stack on ``b``."""

    def __init__(self, model: nn.Module, a: torch.device, b: torch.device) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.first = model.layers[:2].to(a)
        self.rest = model.layers[2:].to(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x.to(self.a))
        return self.rest(x.to(self.b))


class HandGPT(nn.Module):
    """Both embeddings on ``a``; blocks, final LayerNorm and head on ``b``.

    The head's weight is the token embedding's: on two real devices a hand-written version would
    copy it across per call (as the plan does); bound to one device it stays shared.
    """

    def __init__(self, model: nn.Module, a: torch.device, b: torch.device) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.tok_emb, self.pos_emb = model.tok_emb.to(a), model.pos_emb.to(a)
        self.register_buffer("position_ids", model.position_ids.to(a), persistent=False)
        self.blocks, self.ln_f, self.lm_head = model.blocks.to(b), model.ln_f.to(b), model.lm_head.to(b)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        input_ids = input_ids.to(self.a)
        positions = self.position_ids.narrow(1, 0, input_ids.size(1))
        x = (self.tok_emb(input_ids) + self.pos_emb(positions)).to(self.b)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class HandConvNet(nn.Module):
    """The stem on ``a``; the stages, pooling and classifier on ``b``."""

    def __init__(self, model: nn.Module, a: torch.device, b: torch.device) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.stem = model.stem.to(a)
        self.stages, self.pool, self.fc = model.stages.to(b), model.pool.to(b), model.fc.to(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x.to(self.a)).to(self.b)
        for stage in self.stages:
            x = stage(x)
        return self.fc(torch.flatten(self.pool(x), 1))


class HandEmbTransformer(nn.Module):
    """The embedding table on ``a``; the blocks and the head on ``b``."""

    def __init__(self, model: nn.Module, a: torch.device, b: torch.device) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.emb = model.emb.to(a)
        self.layers, self.head = model.layers.to(b), model.head.to(b)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids.to(self.a)).to(self.b)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


#: model -> (its hand-written placement, the module paths of part A: pinned to cpu)
HAND: dict[str, tuple[type[nn.Module], tuple[str, ...]]] = {
    "mlp": (HandMLP, ("layers.0",)),
    "gpt": (HandGPT, ("tok_emb", "pos_emb")),
    "convnet": (HandConvNet, ("stem",)),
    "emb-transformer": (HandEmbTransformer, ("emb",)),
}


def two_device_pins(model: nn.Module, part_a: Sequence[str]) -> dict[str, str]:
    """Every module with parameters of its own: ``cpu`` under a path of ``part_a``, else ``cuda:0``."""
    def in_a(path: str) -> bool:
        return any(path == p or path.startswith(p + ".") for p in part_a)

    return {path: "cpu" if in_a(path) else "cuda:0"
            for path, module in model.named_modules()
            if path and any(True for _ in module.parameters(recurse=False))}


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def interleaved_medians(fns: Sequence[Callable[[], object]], repeat: int, warmup: int) -> list[float]:
    """Median wall seconds of each function, timed ABC BCA CAB ... after ``warmup`` runs of each."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for rep in range(repeat):
        for k in range(n):  # rotate the order each round: no function always follows the same one
            i = (rep + k) % n
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def measure(name: str, size: str, repeat: int, warmup: int) -> list[str]:
    """One table row: the plan, the three medians, the ratios, the largest output difference."""
    model, inputs = models.get(name, size)
    hand_cls, part_a = HAND[name]
    plan = partition(model, inputs, "h200-host", pins=two_device_pins(model, part_a), time_limit=30,
                     no_split=models.entry(name).no_split_classes)
    used = {d: len(ops) for d, ops in plan.per_device_ops().items() if ops}
    emitted = plan.emit(model, {"cuda:0": "cpu"}, example_inputs=inputs)
    cpu = torch.device("cpu")
    hand = hand_cls(copy.deepcopy(model), cpu, cpu)  # its own weights, like the emitted module's copy
    with torch.inference_mode():
        want = model(*inputs)
        err = max((hand(*inputs) - want).abs().max().item(), (emitted(*inputs) - want).abs().max().item())
        eager_s, hand_s, emitted_s = interleaved_medians(
            [lambda: model(*inputs), lambda: hand(*inputs), lambda: emitted(*inputs)], repeat, warmup)
    ratio = emitted_s / hand_s
    placement = ", ".join(f"{d} {n}" for d, n in used.items())
    return [f"{name}:{size}", placement, format_seconds(eager_s), format_seconds(hand_s),
            format_seconds(emitted_s), f"{ratio:.3f}", f"{emitted_s / eager_s:.3f}", f"{err:.1g}",
            "yes" if ratio <= TARGET else "NO"]


def measure_compile(name: str, size: str, repeat: int, warmup: int) -> tuple[list[str], list[str]]:
    """Two rows: per-call times (eager, dynamo's eager backend, hetpart) and the first call's split."""
    model, inputs = models.get(name, size)
    backend = HetpartBackend()
    with torch.no_grad():
        start = time.perf_counter()
        model(*inputs)
        eager_once = time.perf_counter() - start
        torch._dynamo.reset()
        hetpart = torch.compile(model, backend=backend, options={"devices": "cpu"})
        start = time.perf_counter()
        got = hetpart(*inputs)
        first = time.perf_counter() - start
        dynamo_only = torch.compile(copy.deepcopy(model), backend="eager")
        dynamo_only(*inputs)
        err = max((a - b).abs().max().item() for a, b in zip(_leaves(got), _leaves(model(*inputs))))
        eager_s, dynamo_s, hetpart_s = interleaved_medians(
            [lambda: model(*inputs), lambda: dynamo_only(*inputs), lambda: hetpart(*inputs)], repeat, warmup)
    steps = backend.records
    capture, solve, emit = (sum(getattr(r, f) for r in steps) for f in ("capture_s", "solve_s", "emit_s"))
    dynamo = first - capture - solve - emit - eager_once
    ratio = hetpart_s / eager_s
    per_call = [f"{name}:{size}", f"{len(steps)} x {steps[0].ops} ops", format_seconds(eager_s),
                format_seconds(dynamo_s), format_seconds(hetpart_s), f"{ratio:.3f}", f"{hetpart_s / dynamo_s:.3f}",
                f"{err:.1g}", "yes" if ratio <= COMPILE_TARGET else "NO"]
    first_call = [f"{name}:{size}", format_seconds(first), format_seconds(dynamo), format_seconds(capture),
                  format_seconds(solve), format_seconds(emit)]
    return per_call, first_call


def _leaves(value: object) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else [v for v in value if isinstance(v, torch.Tensor)]


# --------------------------------------------------------------------------------------------
# ONNX: parts on the CPU provider against one session of the whole model
# --------------------------------------------------------------------------------------------


def onnx_model(name: str, size: str, folder: Path) -> Path:
    """The ONNX file of an ONNX row (see the module docstring)."""
    from models.onnx_models import export_densenet, export_zoo, light_model

    if name in ("resnet50", "densenet121"):
        return light_model(name)
    if name == "densenet":
        return export_densenet(size, folder / "densenet.onnx")
    return export_zoo(name, size, folder / f"{name}.onnx")


def pipeline_cut(graph: object, order: Sequence[str], window: tuple[float, float] = (0.2, 0.5)) -> int:
    """Where a 2-part pipeline cut goes: the position within ``window`` (shares of the ops, topological
    order) where the fewest bytes cross, the one nearest a quarter among equals."""
    position = {name: k for k, name in enumerate(order)}
    crossing = [0] * (len(order) + 1)   # bytes made before position k and read at or after it
    for tensor in graph.tensors.values():
        if not tensor.consumers:
            continue
        first = position[tensor.producer] + 1 if tensor.producer is not None else 0
        last = max(position[c] for c in tensor.consumers)
        for k in range(first, last + 1):
            crossing[k] += tensor.nbytes
    low, high = max(1, round(window[0] * len(order))), max(1, round(window[1] * len(order)))
    return min(range(low, high + 1), key=lambda k: (crossing[k], abs(k - len(order) / 4)))


def onnx_plans(path: Path) -> list[tuple[str, object]]:
    """The two plans of an ONNX row: a 2-part split, and the ILP's placement under caps."""
    from partitioner import from_onnx

    graph = from_onnx(path)
    order = [op.name for op in graph.topological_order()]
    cut = pipeline_cut(graph, order)
    pins = {op: "cpu" if k < cut else "cuda:0" for k, op in enumerate(order)}
    cap = int(0.4 * graph.total_param_bytes())
    return [("2 parts", partition(graph, devices="h200-host", pins=pins, time_limit=10)),
            ("ILP", partition(graph, devices="cpu-gpu-npu", memory={"cuda:0": cap, "npu:0": cap}, time_limit=10))]


def measure_onnx(name: str, size: str, repeat: int, warmup: int, folder: Path) -> list[list[str]]:
    """Rows for one ONNX model: its parts (all on the CPU provider) against the whole-model session."""
    import numpy as np

    from backends.onnx_parts import build_parts, example_feeds, whole_session

    path = onnx_model(name, size, folder)
    whole = whole_session(path)
    rows = []
    for label, plan in onnx_plans(path):
        parts = build_parts(plan, path, {d: "cpu" for d in plan.devices.names() if d != "cpu"})
        feeds = example_feeds(parts.manifest.inputs)
        want = whole.run(None, feeds)
        got = parts.run(feeds)
        err = max(float(np.abs(got[o] - w).max()) for o, w in zip(parts.output_names, want))
        whole_s, parts_s = interleaved_medians([lambda: whole.run(None, feeds), lambda: parts.run(feeds)],
                                               repeat, warmup)
        used = ", ".join(f"{d} {len(ops)}" for d, ops in plan.per_device_ops().items() if ops)
        ratio = parts_s / whole_s
        rows.append([f"{name}:{size}" if name not in ("resnet50", "densenet121") else name, label,
                     f"{len(parts.manifest.parts)} ({used})", format_seconds(whole_s), format_seconds(parts_s),
                     f"{ratio:.3f}", f"{err:.1g}", "yes" if ratio <= ONNX_TARGET else "NO"])
    return rows


def print_table(rows: list[list[str]], header: list[str] | None = None) -> None:
    header = header or ["model", "plan (ops per device)", "eager", "hand", "emitted", "emit/hand", "emit/eager",
                        "max |err|", f"<= {TARGET - 1:.0%}"]
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--onnx-models", default=",".join(ONNX_MODELS),
                        help=f"ONNX rows, comma-separated, from {', '.join(ONNX_MODELS)} ('' for none)")
    parser.add_argument("--size", default="small", choices=models.SIZES)
    parser.add_argument("--repeat", type=int, default=50, help="timed runs of each module")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs of each module first")
    parser.add_argument("--compile-only", action="store_true", help="only the torch.compile tables")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in HAND]
    if unknown:
        parser.error(f"no hand-written placement for {', '.join(unknown)}; choose from {', '.join(HAND)}")
    onnx_names = [n.strip() for n in args.onnx_models.split(",") if n.strip()]
    if [n for n in onnx_names if n not in ONNX_MODELS]:
        parser.error(f"--onnx-models: choose from {', '.join(ONNX_MODELS)}")
    if not args.compile_only and names:
        print(f"overhead: two-device plans (part A pinned to cpu, the rest to cuda:0) bound to the CPU; "
              f"median of {args.repeat} interleaved runs after {args.warmup} warm-up runs; "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads, inference_mode")
        rows = [measure(name, args.size, args.repeat, args.warmup) for name in names]
        print_table(rows)
        met = sum(r[-1] == "yes" for r in rows)
        print(f"target (emitted at most {TARGET - 1:.0%} slower than hand-written): met on {met} of {len(rows)} "
              f"models\n")
    if names:
        print(f"torch.compile(backend='hetpart') on a single-device plan (cpu profile) vs eager; median of "
              f"{args.repeat} interleaved calls after {args.warmup} warm-up calls, no_grad")
        measured = [measure_compile(name, args.size, args.repeat, args.warmup) for name in names]
        print_table([m[0] for m in measured], ["model", "graphs", "eager", "dynamo eager", "hetpart", "hetpart/eager",
                                               "hetpart/dynamo", "max |err|", f"<= {COMPILE_TARGET - 1:.0%}"])
        met = sum(m[0][-1] == "yes" for m in measured)
        print(f"target (hetpart at most {COMPILE_TARGET - 1:.0%} slower than eager per call): met on {met} of "
              f"{len(measured)} models\n")
        print("first call (compile), from a fresh torch._dynamo.reset(): dynamo = first call - capture - solve - "
              "emit - one eager call")
        print_table([m[1] for m in measured], ["model", "first call", "dynamo", "capture", "solve", "emit"])
    if onnx_names and not args.compile_only:
        import tempfile

        import onnxruntime

        print(f"\nONNX parts, every part on the CPU provider, against one whole-model session; onnxruntime "
              f"{onnxruntime.__version__}; median of {args.repeat} interleaved runs after {args.warmup} warm-up runs")
        with tempfile.TemporaryDirectory() as tmp:
            onnx_rows = [row for name in onnx_names
                         for row in measure_onnx(name, args.size, args.repeat, args.warmup, Path(tmp))]
        print_table(onnx_rows, ["model", "plan", "parts (ops per device)", "whole", "parts", "parts/whole",
                                "max |err|", f"<= {ONNX_TARGET - 1:.0%}"])
        met = sum(r[-1] == "yes" for r in onnx_rows)
        print(f"target (parts at most {ONNX_TARGET - 1:.0%} slower than the whole model): met on {met} of "
              f"{len(onnx_rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
