"""Case (j) of ``bench/gpu_check.py``: the seed case trained under its cap through the placed optimizer.

``emb-transformer`` (``base`` on a GPU: the 4 GiB embedding) is planned for training with SGD on
``h200-host`` with ``cuda:0`` capped at the demo's cap (the embedding and half the layers:
4,496,539,680 bytes at ``base``), emitted, and trained with ``plan.emit_optimizer`` (the embedding's row-sparse update
where the plan chose it, optimizer state where it placed it). Beside it: the same model all on the
GPU with ``torch.optim.SGD`` (which fits only without the cap), and the calibration's two
measured steps (467 ms with the embedding and its dense SGD update on the CPU, 40.8 ms all on the
GPU). Each step: forward, loss = sum of outputs' means, backward, ``step()``, ``zero_grad()``;
the median of timed steps after warm-up, with ``torch.cuda.synchronize``.

On a machine without CUDA the case runs at ``small`` with ``cuda:0`` bound to the CPU: it checks
that the path works, its times mean nothing.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch

import models
from cost_models.calibration import load_calibration
from cost_models.units import format_bytes, format_seconds
from partitioner import partition

def _loss(out: object) -> torch.Tensor:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(o.float().mean() for o in outs if isinstance(o, torch.Tensor))


def _timed_steps(module: torch.nn.Module, opt: torch.optim.Optimizer, inputs: tuple, sync: Callable[[], None],
                 repeat: int) -> float:
    def step() -> None:
        _loss(module(*inputs)).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    sync()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def run_training(size: str, cuda: bool, cap_of: Callable[[torch.nn.Module], int], repeat: int = 10) -> list[str]:
    """The case's lines (see the module docstring); ``cap_of(model)`` is the cap (the demo's at base)."""
    model, inputs = models.get("emb-transformer", size)
    cap = cap_of(model)
    plan = partition(model, inputs, "h200-host", memory={"cuda:0": cap}, training=True, optimizer="sgd",
                     time_limit=30)
    binding = None if cuda else {"cuda:0": "cpu"}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gpu = torch.device("cuda:0" if cuda else "cpu")
    emitted = plan.emit(copy.deepcopy(model).train(), binding)
    opt = plan.emit_optimizer(emitted, lr=1e-3)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    placed = _timed_steps(emitted, opt, inputs, sync, repeat)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    del emitted, opt
    lines = [f"(j) training under the cap: emb-transformer:{size}, SGD, cuda:0 capped at {format_bytes(cap)}; "
             f"predicted {format_seconds(plan.predicted['total_s'])} (all-GPU "
             f"{format_seconds(plan.baselines['single:cuda:0'].total_s)}, not fitting)"]
    sparse = [n for n, ps in plan.training_state["params"].items() if ps["update"] == "sparse"]
    lines.append(f"    plan: embedding on {plan.placement.get('embedding')}, row-sparse updates: {', '.join(sparse) or 'none'}")
    lines.append(f"    placed optimizer step  {format_seconds(placed)}"
                 + (f", peak GPU {format_bytes(peak)}" if peak is not None else ""))
    try:
        reference = copy.deepcopy(model).to(gpu).train()
        eager = torch.optim.SGD(reference.parameters(), lr=1e-3)
        all_gpu = _timed_steps(reference, eager, tuple(t.to(gpu) for t in inputs), sync, repeat)
        lines.append(f"    all-GPU torch SGD step {format_seconds(all_gpu)} (no cap)")
        del reference, eager
    except torch.OutOfMemoryError as exc:
        lines.append(f"    all-GPU torch SGD step: out of memory ({str(exc).splitlines()[0][:80]})")
    scenario = {row["plan"]: row for row in load_calibration()["scenario"]}
    lines.append(f"    calibration: embedding + its dense SGD on the CPU "
                 f"{format_seconds(scenario['emb_cpu_rest_gpu']['train_step_s'])}, all-GPU "
                 f"{format_seconds(scenario['all_gpu']['train_step_s'])}")
    if not cuda:
        lines.append("    (no CUDA: cuda:0 bound to the CPU, times mean nothing)")
    return lines
