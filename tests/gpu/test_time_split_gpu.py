"""Time-split linears on a real GPU: the weight's chunks in pinned host memory, streamed to CUDA.

Skipped without CUDA (marker ``gpu``). A 4,096 -> 32,768 head (512 MiB in float32) computed on
``cuda:0`` from 16 chunks of 32 MiB held on the host: the GPU never holds the whole weight (its
peak stays below the chunk buffers, the input and the outputs the price counts), the host chunks are
pinned (the streamer's side-stream copies need it), and the outputs equal the original's.
"""

from __future__ import annotations

import pytest
import torch

from partitioner import Plan, from_module, load_profile
from partitioner.solvers.chunked_streaming import TimeSplit
from partitioner.solvers.problem import Options, Placement, Problem, Solution, Status, evaluate
from partitioner.solvers.splits import SplitOptions

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_time_split_head_streams_its_chunks_to_the_gpu() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(4096), torch.nn.Linear(4096, 32768)).eval()
    inputs = (torch.randn(16, 4096),)
    graph = from_module(model, inputs)
    problem = Problem(graph, load_profile("h200-host"), Options(splits=SplitOptions(axes=("time",), chunks=(16,))))
    node = next(iter(problem.split_choices))
    sp = TimeSplit("time", ("cuda:0", "cpu"), 16)
    placement = Placement({n: "cuda:0" for n in problem.nodes}, split={node: sp})
    ev = evaluate(problem, placement)
    plan = Plan.from_solution(problem, Solution("by hand", placement, Status.HEURISTIC), ev)
    emitted = plan.emit(model)
    chunks = [p for n, p in emitted.named_parameters() if "weight_chunk" in n]
    assert len(chunks) == 16 and all(not p.is_cuda and p.is_pinned() for p in chunks)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = emitted(*inputs)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= ev.memory["cuda:0"]  # chunk buffers, not 512 MiB
    assert torch.cuda.max_memory_allocated() < 512 * 2**20
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), model(*inputs), rtol=1e-4, atol=1e-4)
