"""Solve time and gap against graph size, with HiGHS and with CBC.

Graphs: every zoo model at every size (``base`` built on the meta device), a 1,000-op model graph
(GPT-2 XL's depth: 48 blocks, captured with torch.export), and synthetic layered DAGs of 100,
1,000 and 10,000 ops on 2-4 devices with tight memory caps. Each is solved with the latency
objective at a 1% gap (automatic coarsening above the partitioner's threshold) and the table
prints ops, nodes after coarsening, devices, solver, seconds, status and gap.

Targets on a 2-core machine: the 1,000-op model graph to <= 1% gap in <= 5 s; 10,000 ops in
<= 60 s with coarsening, the gap reported.

    python bench/solve_scaling.py [--quick] [--solvers highs,cbc] [--time-limit 40]
"""

from __future__ import annotations

import argparse
import time

import torch

import models
from models.gpt import GPT, GPTConfig
from models.synthetic import random_dag, random_profile
from partitioner import from_module, partition_outcome
from partitioner.ir import OpGraph


def gpt_1000_ops() -> OpGraph:
    """GPT-2 XL's depth (48 blocks) at a small width, on the meta device: about 1,000 ops."""
    cfg = GPTConfig(vocab=50257, d_model=1600, n_layers=48, n_heads=25, d_ff=6400, max_seq=1024, batch=1, seq=1024)
    with torch.device("meta"):
        model = GPT(cfg).eval()
        ids = torch.zeros(cfg.batch, cfg.seq, dtype=torch.int64)
    return from_module(model, (ids,), name="gpt-48-layers")


def cases(quick: bool) -> list[tuple[str, OpGraph, object, dict | None]]:
    """(label, graph, profile, caps)."""
    out: list[tuple[str, OpGraph, object, dict | None]] = []
    sizes = ("tiny", "small") if quick else ("tiny", "small", "base")
    for name in models.names():
        for size in sizes:
            module, inputs = models.get(name, size, device="meta" if size == "base" else None)
            graph = from_module(module, inputs, name=f"{name}:{size}")
            cap = {"cuda:0": max(1, graph.total_param_bytes() // 3)}
            out.append((f"{name}:{size}", graph, "h200-host", cap))
    big = gpt_1000_ops()
    out.append(("gpt 48 blocks (model graph)", big, "2xh200-host",
                {"cuda:0": big.total_param_bytes() // 3, "cuda:1": big.total_param_bytes() // 3}))
    for n_ops in (100, 1000) if quick else (100, 1000, 10_000):
        for n_devices in (2, 3, 4):
            graph = random_dag(n_ops, n_ops, layers=max(1, n_ops // 20))
            profile = random_profile(n_ops + n_devices, n_devices)
            share = max(1, graph.total_param_bytes() // n_devices)  # no accelerator holds every weight
            caps = {d.name: min(share, d.memory) for d in profile.devices if d.name != "cpu"}
            out.append((f"layered DAG {n_ops} ops", graph, profile, caps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip base sizes and the 10,000-op graphs")
    parser.add_argument("--solvers", default="highs,cbc")
    parser.add_argument("--time-limit", type=float, default=40.0,
                        help="ILP seconds per solve (capture, coarsening and baselines come on top)")
    args = parser.parse_args()
    header = ["graph", "ops", "nodes", "devices", "solver", "seconds", "status", "gap", "predicted"]
    rows = []
    for label, graph, profile, caps in cases(args.quick):
        for solver in args.solvers.split(","):
            start = time.perf_counter()
            try:
                out = partition_outcome(graph, devices=profile, memory=caps, solver=solver,
                                        time_limit=args.time_limit, gap=0.01)
            except Exception as exc:  # a failed case is a row of the table, not the end of the run
                rows.append([label, str(len(graph)), "-", "-", solver, f"{time.perf_counter() - start:.2f}",
                             type(exc).__name__, "-", str(exc).splitlines()[0][:60]])
                continue
            seconds = time.perf_counter() - start
            plan = out.plan
            gap = plan.solver.gap
            rows.append([
                label, str(len(graph)), str(len(out.problem.nodes)), str(len(out.problem.device_names)), solver,
                f"{seconds:.2f}", plan.solver.status, "-" if gap is None else f"{gap:.2%}",
                f"{plan.predicted['total_s'] * 1e3:.3f} ms",
            ])
            print("  ".join(rows[-1]), flush=True)
    print()
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
