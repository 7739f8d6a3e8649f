"""Measured op times (``data/h200-host-calibration.json``) as captured ops, for fitting and checking.

In: the calibration file measured on an H200 and its 16-core host (a copy of
``shared/calibration/h200-host.json``). Out: one :class:`CalibrationRow` per measured op: the
measurement and the :class:`~partitioner.ir.Op` hetpart's front end captures from the same op
at the same shape, built on the meta device (no memory, no compute). Comparing the captured op's
FLOPs and bytes with the measured ones checks the front end; costing it checks the cost model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from functools import cache
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F

from partitioner.ir import Op, OpClass

CALIBRATION_FILE = "h200-host-calibration.json"


@dataclasses.dataclass(frozen=True)
class CalibrationRow:
    """One measured op: what was measured and the op hetpart captures for it."""

    op: str                 # the measured op family: linear, conv2d, gelu, add, layer_norm, ...
    shape: str              # the measured shape string, e.g. "2048x768x3072"
    dtype: str
    flops: float            # FLOPs the measurement counted
    bytes: float            # bytes the measurement counted
    gpu_s: float | None
    cpu_s: float | None
    captured: Op            # the op hetpart captures for it

    @property
    def label(self) -> str:
        return f"{self.op} {self.shape} {self.dtype}"


@cache
def load_calibration(name: str = CALIBRATION_FILE) -> dict[str, Any]:
    """The calibration JSON shipped in ``cost_models/data``."""
    return json.loads(resources.files("cost_models").joinpath("data", name).read_text())


def calibration_rows() -> tuple[CalibrationRow, ...]:
    """Every op row of the calibration file with its captured op (built on the meta device)."""
    rows = []
    for raw in load_calibration()["ops"]:
        module, inputs = _one_op_model(raw["op"], raw["shape"], getattr(torch, raw["dtype"]))
        rows.append(
            CalibrationRow(
                op=raw["op"],
                shape=raw["shape"],
                dtype=raw["dtype"],
                flops=float(raw["flops"]),
                bytes=float(raw["bytes"]),
                gpu_s=raw.get("gpu_s"),
                cpu_s=raw.get("cpu_s"),
                captured=_capture_single_op(module, inputs),
            )
        )
    return tuple(rows)


def _capture_single_op(module: torch.nn.Module, inputs: tuple) -> Op:
    from partitioner.frontends.fx import from_module

    graph = from_module(module, inputs, capture="export")
    costly = [op for op in graph.topological_order() if op.op_class is not OpClass.VIEW]
    if len(costly) != 1:
        raise ValueError(f"expected one non-view op, captured {[op.name for op in costly]}")
    return costly[0]


class _Binary(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def _dims(pattern: str, shape: str) -> list[int]:
    match = re.fullmatch(pattern, shape)
    if match is None:
        raise ValueError(f"calibration shape {shape!r} does not match {pattern!r}")
    return [int(g) for g in match.groups()]


def _one_op_model(op: str, shape: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple]:
    """A module doing exactly the measured op, on the meta device, and its inputs.

    Shapes: linear ``MxKxN`` (no bias, as measured), conv2d ``n{N}c{C}h{H}o{O}k{K}s{S}`` ("same"
    padding, no bias), pointwise / norm / softmax ``RxC``, embedding ``V{V}D{D}T{T}``, sdpa
    ``b{B}h{H}t{T}d{D}``, tiny_add ``1``.
    """
    with torch.device("meta"):
        if op == "linear":
            m, k, n = _dims(r"(\d+)x(\d+)x(\d+)", shape)
            return torch.nn.Linear(k, n, bias=False).to(dtype), (torch.empty(m, k, dtype=dtype),)
        if op == "conv2d":
            n, c, h, o, k, s = _dims(r"n(\d+)c(\d+)h(\d+)o(\d+)k(\d+)s(\d+)", shape)
            conv = torch.nn.Conv2d(c, o, k, stride=s, padding=k // 2, bias=False).to(dtype)
            return conv, (torch.empty(n, c, h, h, dtype=dtype),)
        if op == "embedding":
            v, d, t = _dims(r"V(\d+)D(\d+)T(\d+)", shape)
            return torch.nn.Embedding(v, d).to(dtype), (torch.zeros(t, dtype=torch.int64),)
        if op == "sdpa":
            b, h, t, d = _dims(r"b(\d+)h(\d+)t(\d+)d(\d+)", shape)
            return _Attention(), tuple(torch.empty(b, h, t, d, dtype=dtype) for _ in range(3))
        if op in ("add", "tiny_add"):
            dims = [int(x) for x in shape.split("x")]
            return _Binary(), (torch.empty(*dims, dtype=dtype), torch.empty(*dims, dtype=dtype))
        rows, cols = _dims(r"(\d+)x(\d+)", shape)
        x = torch.empty(rows, cols, dtype=dtype)
        if op == "gelu":
            return torch.nn.GELU(), (x,)
        if op == "layer_norm":
            return torch.nn.LayerNorm(cols, elementwise_affine=False).to(dtype), (x,)
        if op == "softmax":
            return torch.nn.Softmax(dim=-1), (x,)
    raise ValueError(f"calibration op {op!r} is not known: add it to cost_models/calibration.py")


def measured_anchors() -> dict[str, float]:
    """The whole-model measurements of the ``emb-transformer`` seed case (forward, seconds, bytes).

    From ``data/accelerate-h200.json`` (accelerate 1.15 on the same H200 machine) and
    ``data/prefetch-h200.json`` (a hand-written prefetching placement):

    ``all_gpu_s``; ``cap_half_layers`` (a GPU cap of the embedding and half the layers) with
    ``accelerate_half_s`` and ``emb_cpu_half_s``; ``cap_below_embedding`` (2 GiB) with
    ``accelerate_2gib_s`` and ``emb_cpu_2gib_s``; ``prefetch_cap``, ``prefetched_s`` and
    ``prefetch_all_gpu_s`` (the embedding and two layers resident, six layers prefetched).
    """
    rows = {row["case"]: row for row in load_calibration("accelerate-h200.json")["rows"]}
    prefetch = load_calibration("prefetch-h200.json")
    return {
        "all_gpu_s": rows["all_gpu_uncapped"]["fwd_s"],
        "cap_half_layers": rows["accelerate[emb+half_layers]"]["cap_bytes"],
        "accelerate_half_s": rows["accelerate[emb+half_layers]"]["fwd_s"],
        "emb_cpu_half_s": rows["hand_emb_cpu_layers_gpu[emb+half_layers]"]["fwd_s"],
        "cap_below_embedding": rows["accelerate[below_emb]"]["cap_bytes"],
        "accelerate_2gib_s": rows["accelerate[below_emb]"]["fwd_s"],
        "emb_cpu_2gib_s": rows["hand_emb_cpu_layers_gpu[below_emb]"]["fwd_s"],
        "prefetch_cap": prefetch["cap_bytes"],
        "prefetched_s": prefetch["prefetched_s"],
        "prefetch_all_gpu_s": prefetch["all_gpu_s"],
    }
