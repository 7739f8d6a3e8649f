"""Split rows on a many-GPU host: a GPT-3-like layer stack on ``8xh100-nvlink`` at one sample's latency.

In: nothing (the stack is built on the meta device). Out: a table (``python bench/plan_quality.py
--split`` prints it after the single-host rows): predicted time of one sample through the stack and
memory per device, for

* **whole ops**: hetpart's ILP without splits (every op on one GPU or another);
* **pipeline stages only**: hetpart's pipeline plan in 8 stages, one micro-batch (one sample goes
  through the stages one after another, so its latency is the sum of theirs plus the hand-offs);
* **megatron tp=8**: Megatron-LM's uniform tensor-parallel degree 8 as hetpart prices it
  (:mod:`partitioner.solvers.megatron`): every op on ``cuda:0``, every linear split evenly over the
  eight GPUs, the attention and MLP projections as column/row pairs with no rejoin between them;
* **hetpart splits**: the ILP with splits offered over 2, 4 and 8 GPUs (``splits={"degrees": ...}``),
  warm-started from the Megatron baseline, so never slower than it.

The stack: GPT-3 175B's layer width (hidden 12,288, 96 heads, feed-forward 49,152) for ``layers``
pre-norm blocks (:class:`models.blocks.Block`), a 2,048-token sample, bfloat16. Figures are the cost
model's predictions (datasheet figures for the H100, ``cost_models/profiles/8xh100-nvlink.toml``),
not measurements.
"""

from __future__ import annotations

import torch
from torch import nn

from cost_models.units import format_bytes, format_seconds
from models.blocks import Block
from partitioner import from_module, partition_outcome

#: GPT-3 175B's layer (Brown et al. 2020, table 2.1): d_model, heads, feed-forward width, context.
GPT3_WIDTH = {"d_model": 12288, "n_heads": 96, "d_ff": 4 * 12288, "tokens": 2048}


class LayerStack(nn.Module):
    """``layers`` causal pre-norm blocks over hidden states ``(batch, tokens, d_model)``."""

    def __init__(self, layers: int, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, is_causal=True) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def gpt3_stack(layers: int = 2) -> tuple[nn.Module, tuple]:
    """The GPT-3-like stack on the meta device in bfloat16 and one 2,048-token sample's hidden states."""
    w = GPT3_WIDTH
    with torch.device("meta"):
        module = LayerStack(layers, w["d_model"], w["n_heads"], w["d_ff"]).to(torch.bfloat16)
    return module, (torch.zeros(1, w["tokens"], w["d_model"], dtype=torch.bfloat16, device="meta"),)


def _memory_cell(memory) -> str:  # noqa: ANN001
    """Memory per device, equal GPUs folded: ``cuda:0 3.1 GiB, cuda:1-7 2.8 GiB each``."""
    used = [(d, m) for d, m in memory.items() if m]
    if not used:
        return "-"
    parts, i = [], 0
    while i < len(used):
        j = i
        while j + 1 < len(used) and used[j + 1][1] == used[i][1]:
            j += 1
        name = used[i][0] if i == j else f"{used[i][0]}-{used[j][0].rsplit(':', 1)[-1]}"
        parts.append(f"{name} {format_bytes(used[i][1])}" + (" each" if j > i else ""))
        i = j + 1
    return ", ".join(parts)


def stack_rows(time_limit: float, layers: int = 2, degrees: tuple[int, ...] = (2, 4, 8)) -> list[list[str]]:
    """The rows of the table (see the module docstring): label, time, vs whole, splits, memory, status."""
    module, inputs = gpt3_stack(layers)
    graph = from_module(module, inputs, name="gpt3-stack")
    profile = "8xh100-nvlink"
    whole = partition_outcome(graph, devices=profile, objective="latency", time_limit=time_limit)
    pipeline = partition_outcome(graph, devices=profile, objective="throughput", stages=8, micro_batches=1,
                                 schedule="gpipe", time_limit=time_limit)
    split = partition_outcome(graph, devices=profile, objective="latency", time_limit=time_limit,
                              splits={"axes": ["cols", "rows"], "degrees": list(degrees)})
    base = whole.evaluation.total_s
    rows = []
    megatron = split.baselines.get("megatron")
    cases = [("whole ops", whole.evaluation, {}, _status(whole.plan)),
             ("pipeline stages only (8, 1 micro-batch)", pipeline.evaluation, {}, _status(pipeline.plan))]
    if megatron is not None:
        cases.append(("megatron tp=8", megatron[1], megatron[0].placement.split, "heuristic"))
    cases.append(("hetpart splits", split.evaluation, split.solution.placement.split, _status(split.plan)))
    for label, ev, splits, status in cases:
        degree = sorted({len(sp.devices) for sp in splits.values()})
        rows.append([f"GPT-3 layer x{layers}, 2,048 tokens, bf16, latency", label,
                     ("" if ev.feasible else "* ") + format_seconds(ev.total_s), f"{base / ev.total_s:.2f}x",
                     f"{len(splits)} ({'/'.join(map(str, degree))}-way)" if splits else "0",
                     _memory_cell(ev.memory), status])
    return rows


def _status(plan) -> str:  # noqa: ANN001
    gap = plan.solver.gap
    return f"{plan.solver.status} (gap {gap:.2%})" if gap is not None else plan.solver.status
