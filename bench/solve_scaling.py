"""Seconds to a 1% gap on real models' graphs and on large random DAGs, and what ``time_limit=5`` gives.

Rows (graphs are captured before the clock starts; everything after capture is timed):

* real graphs at their ``base`` size, built on the meta device: the zoo's encoder-decoders
  (``t5`` = t5-small, ``bart`` = bart-base), the MoE decoder (``moe``, Qwen2-MoE's layer shape),
  the branchy CNN (``convnext`` = convnext_atto), ``gpt`` (GPT-2 small) and ``bert``
  (bert-base), each on ``cpu-gpu-npu`` and ``2xh200-host`` with every GPU capped at 40% of the
  model's weights;
* GPT-2 XL's depth (48 blocks, about 1,000 ops) on ``2xh200-host``, GPUs capped at a third;
* layered random DAGs of 1,000 and 3,000 ops on 4 devices (``random_profile``), each accelerator
  capped at a quarter of the weights.

Each row is solved twice with the latency objective and a 1% gap: with ``--time-limit`` (default
60 s) to see how long a 1% gap takes, and with ``time_limit=5`` to see that the limit holds end
to end. Columns: ops, nodes the ILP placed (after automatic coarsening), seconds and status and
gap of the first run, the plan's predicted time, the memory-aware lower bound and the ratio of
the two, then seconds, status and gap of the 5-second run.

Targets on a 2-core machine: every real-graph row at <= 1% gap in <= 5 s; the 1,000-op 4-device
DAG at <= 1% gap in <= 60 s; every 5-second run back within 6 s.

With ``--seeds K`` the run to a 1% gap is repeated under HiGHS seeds 0..K-1 (``highs.SEED``): the
first columns stay seed 0's, and two more give the seconds of each seed and how many reached 1%.
A branch and bound's time can depend on its seed more than on a change under test: judge a change
by all seeds, not by seed 0 alone.

    python bench/solve_scaling.py [--quick] [--solver highs|cbc] [--time-limit 60] [--only NAME] [--seeds K]
"""

from __future__ import annotations

import argparse
import time

import torch

import models
from cost_models.profiles import DeviceSet, load_profile
from models.gpt import GPT, GPTConfig
from models.synthetic import random_dag, random_profile
from partitioner import from_module, partition_outcome
from partitioner.ir import OpGraph
from partitioner.solvers import highs

REAL = ("t5", "bart", "moe", "convnext", "gpt", "bert")
PROFILES = ("cpu-gpu-npu", "2xh200-host")
GPU_SHARE = 0.4


def gpt_1000_ops() -> OpGraph:
    """GPT-2 XL's depth (48 blocks) at a small width, on the meta device: about 1,000 ops."""
    cfg = GPTConfig(vocab=50257, d_model=1600, n_layers=48, n_heads=25, d_ff=6400, max_seq=1024, batch=1, seq=1024)
    with torch.device("meta"):
        model = GPT(cfg).eval()
        ids = torch.zeros(cfg.batch, cfg.seq, dtype=torch.int64)
    return from_module(model, (ids,), name="gpt-48-layers")


def gpu_caps(graph: OpGraph, profile: DeviceSet, share: float) -> dict[str, int]:
    """Every GPU capped at ``share`` of the model's weights."""
    cap = max(1, int(share * graph.total_param_bytes()))
    return {d.name: min(cap, d.memory) for d in profile.devices if d.name.startswith("cuda")}


def cases(quick: bool, only: str | None) -> list[tuple[str, OpGraph, DeviceSet, dict[str, int]]]:
    """(label, graph, profile, caps), graphs captured here, before any clock starts."""
    out = []
    size = "small" if quick else "base"
    for name in REAL[:4] if quick else REAL:
        if only and only not in name:
            continue
        module, inputs = models.get(name, size, device="meta")
        graph = from_module(module, inputs, name=f"{name}:{size}")
        for profile_name in PROFILES:
            profile = load_profile(profile_name)
            out.append((f"{name}:{size} {profile_name}", graph, profile, gpu_caps(graph, profile, GPU_SHARE)))
    if not quick and (not only or "48" in only):
        big = gpt_1000_ops()
        profile = load_profile("2xh200-host")
        out.append(("gpt 48 blocks 2xh200-host", big, profile, gpu_caps(big, profile, 1 / 3)))
    for n_ops in (1000,) if quick else (1000, 3000):
        if only and only not in "dag":
            continue
        graph = random_dag(n_ops, n_ops, layers=max(1, n_ops // 20))
        profile = random_profile(n_ops + 4, 4)
        share = max(1, graph.total_param_bytes() // 4)
        caps = {d.name: min(share, d.memory) for d in profile.devices if d.name != "cpu"}
        out.append((f"layered DAG {n_ops} ops, 4 devices", graph, profile, caps))
    return out


def run(graph: OpGraph, profile: DeviceSet, caps: dict[str, int], solver: str, time_limit: float) -> tuple:
    """(seconds, outcome) of one partition, everything after capture timed."""
    started = time.perf_counter()
    out = partition_outcome(graph, devices=profile, memory=caps, solver=solver, time_limit=time_limit, gap=0.01)
    return time.perf_counter() - started, out


def _gap(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and the 1,000-op DAG only (a smoke run)")
    parser.add_argument("--solver", default="highs", help="highs or cbc")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for the run to a 1%% gap")
    parser.add_argument("--short-limit", type=float, default=5.0, help="seconds for the time-limited run")
    parser.add_argument("--only", default=None, help="only rows whose label contains this text")
    parser.add_argument("--seeds", type=int, default=1, help="repeat the run to 1%% under HiGHS seeds 0..K-1")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    header = ["graph", "ops", "nodes", "seconds", "status", "gap", "predicted", "lower bound", "ratio",
              f"tl={args.short_limit:g} s", "status", "gap"]
    if args.seeds > 1:
        header += [f"s by seed 0-{args.seeds - 1}", "at 1%"]
    rows = []
    for label, graph, profile, caps in cases(args.quick, args.only):
        highs.SEED = 0
        seconds, out = run(graph, profile, caps, args.solver, args.time_limit)
        short, limited = run(graph, profile, caps, args.solver, args.short_limit)
        by_seed = [(seconds, out)]
        for seed in range(1, args.seeds):
            highs.SEED = seed
            by_seed.append(run(graph, profile, caps, args.solver, args.time_limit))
        highs.SEED = 0
        plan = out.plan
        predicted, lower = plan.predicted["total_s"], plan.predicted.get("lower_bound_s")
        rows.append([
            label, str(len(graph)), str(len(out.problem.nodes)), f"{seconds:.2f}", plan.solver.status,
            _gap(plan.solver.gap), f"{predicted * 1e3:.3f} ms", f"{lower * 1e3:.3f} ms" if lower else "-",
            f"{predicted / lower:.2f}" if lower else "-",
            f"{short:.2f}", limited.plan.solver.status, _gap(limited.plan.solver.gap),
        ])
        if args.seeds > 1:
            reached = sum(o.plan.solver.gap is not None and o.plan.solver.gap <= 0.01 + 1e-9 for _, o in by_seed)
            rows[-1] += ["/".join(f"{s:.1f}" for s, _ in by_seed), f"{reached}/{len(by_seed)}"]
        print("  ".join(rows[-1]), flush=True)
    print()
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
