"""Plan quality: the ILP against every baseline on the zoo, with bounds, gap and solve time.

For each zoo model (``small``) × profile (``h200-host``, ``cpu-gpu-npu``, ``2xh200-host``) × memory
cap (none; tight = the accelerators capped at 40% of the model's parameter bytes) × objective, it
prints the ILP's predicted time, each baseline's (``*`` marks a baseline that does not fit), the
physical lower bound, the ILP's gap and its solve seconds, then the seed case (emb-transformer
``base`` under the measured caps). The last lines say whether the ILP was ≤ every feasible baseline
everywhere and its speed-up over ``greedy`` on the capped seed case (target ≥ 10×).

ONNX rows (``--onnx-models``): zoo models exported with ``torch.onnx.export`` (and the light
ResNet-50 / DenseNet-121 the onnx wheel ships) imported with ``from_onnx``, on every built-in profile
(``--onnx-profiles``) under the same two caps, latency objective, with the baselines ONNX users get today: ``ort-fallback``
(onnxruntime's provider order) and ``openvino-pipeline`` (OpenVINO HETERO's split by weight bytes).

Cluster rows (``--part clusters``): pipeline stages on clusters whose hosts differ, hetpart's
(DP or ILP) against the splits users get today, all costed with the same pipeline semantics:
PiPPy's ``split_into_equal_size``, DeepSpeed's ``partition_method="parameters"`` and a FLOP-balanced
split that assumes identical devices (``partitioner/solvers/pipeline_baselines.py``), predicted. The
cases: GPT-2 (``gpt:base``, batch 8) for training and inference on one H200 host plus one A100 host
(100 Gb/s), and ``emb-transformer:base`` on ``2x-h200-host`` with each GPU capped at 3 GiB, below
its 4 GiB embedding, where a host CPU has to take the embedding.

Measured rows (``--part measured``): ``mlp:small`` training in 2 and 4 stages, planned on the local
profile (``cost_models/local_cluster.py``: one rank's share of this machine's CPU per stage, the gloo
loopback link measured by ``cost_models/loopback.py``) and run with every rank a local gloo process
(``torchrun --standalone``, one thread each): the median time per step (slowest rank, after one
warm-up step) against the plan's prediction, with the ``4x-cpu-host`` (datacenter) prediction beside
it, the same step formula on the stages timed alone, and the runtime's floor (a near-empty ``mlp:tiny``
pipeline); then each stage's predicted forward and forward+backward time per micro-batch against its
module timed alone at one thread and its actions timed during the run.

    python bench/plan_quality.py [--models gpt,bert] [--objectives latency] [--time-limit 20]
                                 [--onnx-models gpt,resnet50 | --onnx-models ''] [--onnx-profiles cpu-gpu-npu]
                                 [--skip-seed]
    python bench/plan_quality.py --part clusters,measured --steps 5      # the pipeline rows only
    python bench/plan_quality.py --precision                            # the precision table only
    python bench/plan_quality.py --training                             # training under a cap (training_plans.py)
    python bench/plan_quality.py --split                                # split vs whole: LM head, Mixtral
    python bench/plan_quality.py --split --split-cases Mixtral          # the Mixtral rows only

Split rows (``--split``): issue 34's LM-head case, a Llama shape (hidden 4,096, one decoder layer,
a 128,256 x 4,096 LM head: 2.1 GB in float32, untied) on ``h200-host`` with ``cuda:0`` capped at
2 GB, a 512-token prompt, inference, latency and throughput; and HeteGen's setting, the same shape
with two layers and one token (a decode-shaped step, the model three times the GPU's 2 GB). Each is
planned with every op whole, by the ``hetegen`` baseline (every linear split by columns between
cuda:0 and the CPU at the share where both branches end together), with ``splits=True``
(linears split by columns or rows over cpu and cuda:0, chosen by the ILP) and with time splits
(``splits="time"``: a linear computed on cuda:0 from row chunks of its weight streamed from the
host, alone and beside the two-device splits): predicted time, the head's placement and time, and
memory per device (predictions of the cost model, not measurements). Issue 34's Mixtral case: the
Mixtral-8x7B shape cut to 4 layers in bfloat16 (``torch.export`` captures a layer's experts as two
``aten._grouped_mm`` ops, ``transformers.grouped_mm_fallback`` in float32, reading the fused
``gate_up_proj`` ``[8, 28672, 4096]`` (1.9 GB) and ``down_proj`` through ``aten.transpose`` views) with
``cuda:0`` at 4 GB, for one token and a 512-token prefill: whole ops against time splits, where an
experts op may compute on cuda:0 from groups of its experts streamed from the host
(``partitioner/solvers/expert_streaming.py``), and experts splits, its experts divided between cuda:0
and the CPU (``partitioner/solvers/expert_devices.py``). ``--split-cases Mixtral`` runs those rows alone.
Then the many-GPU case (``bench/split_stacks.py``, ``--split-cases GPT-3``): a GPT-3-like layer stack
(GPT-3 175B's width, two layers, 2,048 tokens, bfloat16) on ``8xh100-nvlink`` at one sample's latency:
whole ops, pipeline stages only, Megatron's uniform tensor-parallel degree 8 (``megatron``) and
hetpart's splits, each with memory per device.

Precision rows (``--precision``): the seed case (emb-transformer ``base``, GPU capped to the
embedding plus half the layers) and ``gpt:small`` on ``h200-host`` and ``cpu-gpu-npu`` (whose NPU
runs only 16-bit), inference and training, planned all-float32 and with ``precision="auto"``:
predicted time and memory per device side by side, and how many ops the auto plan computes in 16
bits where (predictions of the cost model, not measurements).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this repository, when run as a script

import models  # noqa: E402
from cost_models.calibration import measured_anchors  # noqa: E402
from cost_models.profiles import builtin_profiles  # noqa: E402
from cost_models.units import format_seconds  # noqa: E402
from partitioner import from_module, load_profile, partition_outcome  # noqa: E402
from partitioner.errors import HetpartError, InfeasiblePlacement  # noqa: E402
from partitioner.solvers.pipeline_baselines import PIPELINE_BASELINES  # noqa: E402

PROFILES = ("h200-host", "cpu-gpu-npu", "2xh200-host")
OBJECTIVES = ("latency", "throughput", "makespan")
BASELINES = ("greedy", "sequential-fill", "heft", "single:cpu", "single:cuda:0")
ONNX_BASELINES = ("ort-fallback", "openvino-pipeline", *BASELINES)
LIGHT = ("resnet50", "densenet121")


def tight_caps(profile_name: str, param_bytes: int) -> dict[str, int]:
    """Cap every accelerator at 40% of the model's parameters: no single device holds it all."""
    profile = load_profile(profile_name)
    return {d.name: max(1, int(0.4 * param_bytes)) for d in profile.devices if d.kind.value != "cpu"}


def baseline_cells(plan, total: float, baselines: tuple[str, ...]) -> tuple[list[str], bool]:  # noqa: ANN001
    """Each baseline's predicted time (``*``: does not fit, ``-``: not listed), and whether ``total``
    is at most every baseline that fits."""
    cells, never_worse = [], True
    for name in baselines:
        b = plan.baselines.get(name)
        if b is None or b.total_s is None:
            cells.append("-")
            continue
        cells.append(format_seconds(b.total_s) + ("" if b.feasible else "*"))
        never_worse &= not b.feasible or total <= b.total_s * (1 + 1e-9)
    return cells, never_worse


def row(label: str, out, seconds: float, baselines: tuple[str, ...] = BASELINES) -> tuple[list[str], bool]:  # noqa: ANN001
    plan = out.plan
    total = plan.predicted["total_s"]
    shown, never_worse = baseline_cells(plan, total, baselines)
    cells = [label, format_seconds(total), *shown]
    gap = plan.solver.gap
    cells += [format_seconds(plan.predicted["lower_bound_s"]), "-" if gap is None else f"{gap:.2%}",
              f"{seconds:.2f}", plan.solver.status]
    return cells, never_worse


def print_table(rows: list[list[str]], baselines: tuple[str, ...] = BASELINES) -> None:
    header = ["model / profile / cap / objective", "ILP", *baselines, "lower bd", "gap", "solve s", "status"]
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def h200_a100() -> object:
    """One h200-host and one a100-host on a 100 Gb/s network, flattened to a DeviceSet."""
    from cost_models.cluster import cluster_from_dict

    return cluster_from_dict({"name": "h200+a100", "hosts": [{"profile": "h200-host"}, {"profile": "a100-host"}],
                              "network": {"bandwidth": "12.5GB/s", "latency": "10us"}}).flatten()


def cluster_cases() -> list[tuple[str, str, object, dict]]:
    """(label, model, devices, partition options) of the cluster rows."""
    gpu_caps = {"host0/cuda:0": "3GiB", "host1/cuda:0": "3GiB"}
    return [
        ("gpt:base x8 / h200+a100 / training", "gpt:base", h200_a100(), dict(training=True, micro_batches=8, batch=8)),
        ("gpt:base x8 / h200+a100 / inference", "gpt:base", h200_a100(), dict(micro_batches=8, batch=8)),
        ("emb-transformer:base / 2x-h200-host, GPUs 3 GiB / inference", "emb-transformer:base", "2x-h200-host",
         dict(memory=gpu_caps, micro_batches=4)),
        ("emb-transformer:base / 2x-h200-host, GPUs 3 GiB / training", "emb-transformer:base", "2x-h200-host",
         dict(memory=gpu_caps, micro_batches=4, training=True)),
    ]


def cluster_rows(time_limit: float) -> None:
    """hetpart's pipeline stages against the splits users get today, predicted (see the docstring)."""
    rows = []
    for label, spec, devices, options in cluster_cases():
        name, _, size = spec.partition(":")
        module, inputs = models.get(name, size, device="meta")
        batch = options.pop("batch", None)
        if batch:
            inputs = tuple(torch.cat([x] * (batch // x.shape[0])) for x in inputs)
        start = time.perf_counter()
        out = partition_outcome(module, inputs, devices, objective="throughput", align_modules=("Block",),
                                time_limit=time_limit, model_name=spec, **options)
        seconds = time.perf_counter() - start
        plan = out.plan
        total = plan.predicted["total_s"]
        cells = [label, format_seconds(total)]
        feasible = []
        for base in PIPELINE_BASELINES:
            b = plan.baselines[base]
            cells.append(format_seconds(b.total_s) + ("" if b.feasible else "*"))
            if b.feasible:
                feasible.append(b.total_s)
        cells.append(f"{min(feasible) / total:.2f}x" if feasible else "none fits")
        cells.append(" > ".join(s["device"] for s in plan.pipeline["stages"]))
        cells += [f"{plan.solver.name} {plan.solver.status}", f"{seconds:.1f}"]
        rows.append(cells)
    header = ["case", "hetpart", *PIPELINE_BASELINES, "vs best", "hetpart's stages", "solver", "plan s"]
    _print(header, rows)
    print("(predicted step times; * = the split does not fit the devices' memory; vs best = the best fitting "
          "baseline's time / hetpart's)")


def measured_rows(steps: int) -> None:
    """mlp:small training in 2 and 4 local gloo ranks: measured time per step against the prediction
    on the local profile (this machine's CPU shared by the ranks, the measured loopback link), with
    the datacenter profile's (``4x-cpu-host``) prediction beside it; the same step formula on the
    stages timed alone, and the runtime's floor (``mlp:tiny`` in the same stages); then each stage's
    predicted compute per micro-batch against its module timed alone here."""
    from cost_models.local_cluster import local_cluster
    from cost_models.loopback import measure_loopback
    from partitioner import partition

    module, inputs = models.get("mlp", "small")
    tiny, tiny_inputs = models.get("mlp", "tiny")
    link = measure_loopback()
    M = 4
    options = dict(objective="throughput", training=True, micro_batches=M, schedule="gpipe")
    rows, stage_rows, notes = [], [], []
    for stages in (2, 4):
        local = local_cluster(stages, threads_per_rank=1, network=link)
        notes.append(local.hosts[0].profile.notes)
        cluster = local.flatten()
        plan = partition(module, inputs, cluster, stages=stages, model_name="mlp:small", **options)
        datacenter = partition(module, inputs, "4x-cpu-host", stages=stages, model_name="mlp:small", **options)
        measured, records = measured_step(plan, "mlp:small", steps)
        floor, _ = measured_step(partition(tiny, tiny_inputs, cluster, stages=stages, model_name="mlp:tiny",
                                           **options), "mlp:tiny", steps)
        section = plan.pipeline
        predicted = section["step_s"]
        slicing = cluster_slicing(stages)
        alone = [tuple(slicing * t for t in times) for times in stage_times(plan, module, inputs, M)]
        for st, (fwd, total, opt), record in zip(section["stages"], alone, records):
            in_fwd = statistics.median(record["forward_s"][1:]) / M
            in_run = statistics.median(f + b for f, b in zip(record["forward_s"][1:], record["backward_s"][1:])) / M
            stage_rows.append([f"{stages} ranks / stage {st['index']} ({st['ops']} ops)",
                               format_seconds(st["forward_s"]), format_seconds(fwd), format_seconds(in_fwd),
                               format_seconds(st["compute_s"]), format_seconds(total), format_seconds(in_run),
                               f"{in_run / st['compute_s']:.2f}x", format_seconds(st["optimizer_s"]),
                               format_seconds(opt)])
        parts = [t for _, t, _ in alone] + [st["send_s"] for st in section["stages"][:-1]]
        from_parts = (M - 1) * max(parts) + sum(parts) + max(o for _, _, o in alone)
        same = [st["ops"] for st in datacenter.pipeline["stages"]] == [st["ops"] for st in section["stages"]]
        rows.append([f"mlp:small / {stages} local ranks / gpipe, {M} micro-batches / training",
                     format_seconds(predicted), format_seconds(section["bubble_s"]),
                     format_seconds(sum(st["send_s"] for st in section["stages"])),
                     format_seconds(section["optimizer_s"]), format_seconds(measured),
                     f"{measured / predicted:.2f}x", format_seconds(from_parts), format_seconds(floor),
                     f"{measured / (from_parts + floor):.2f}x",
                     format_seconds(datacenter.pipeline["step_s"]) + ("" if same else " (other split)"),
                     f"{measured / datacenter.pipeline['step_s']:.1f}x"])
    for lines in notes:
        for line in lines:
            print(f"# {line}")
    _print(["run (local gloo ranks, local profile)", "predicted", "of it: bubble", "sends/mb", "optimizer",
            f"measured (median of {steps})", "measured / predicted", "formula on parts alone", "runtime floor",
            "measured / (parts + floor)", "4x-cpu-host predicted", "measured / 4x-cpu"], rows)
    print("(predicted = (M - 1) x bottleneck + stage and boundary times + optimizer, on the local profile: this "
          "machine's CPU measured at 1 thread, shared by the ranks, and the gloo loopback link measured above; "
          "formula on parts alone = the same formula with each stage's forward+backward and optimizer step timed "
          "alone below instead of predicted, and the predicted sends; runtime floor = the measured step of mlp:tiny "
          "in the same stages and micro-batches, compute next to nothing: what torch.distributed.pipelining and "
          "gloo cost per step, which the formula does not price; 4x-cpu-host = the datacenter cluster profile, four "
          "16-core servers on 10 GbE)")
    print()
    _print(["stage (one micro-batch)", "fwd predicted", "fwd alone", "fwd in run", "fwd+bwd predicted",
            "fwd+bwd alone", "fwd+bwd in run", "in run / predicted", "optimizer predicted", "optimizer alone"],
           stage_rows)
    print("(alone = the stage's module timed by itself in this process at 1 thread, median of 10, times the "
          "time-slicing factor when the ranks outnumber the cores: x2 for 4 ranks on 2 cores; in run = the rank's "
          "forward and backward actions during the run (backends/pipeline/runtime.py records them: compute and the "
          "schedule's work around it, no waits for a peer), per micro-batch, median over the timed steps)")


def measured_step(plan, spec: str, steps: int) -> tuple[float, list[dict]]:  # noqa: ANN001
    """Run ``plan`` on local gloo ranks for one warm-up step and ``steps`` more: the median step of
    the slowest rank, and every rank's record (``backends.pipeline.runtime``)."""
    from backends.pipeline.check import read_results
    from backends.pipeline.launch import rank_arguments, run_local
    from backends.pipeline.runtime import RunOptions

    world = plan.pipeline["world_size"]
    with tempfile.TemporaryDirectory(prefix="hetpart-bench-") as folder:
        path = Path(folder) / "plan.json"
        plan.save(path)
        options = RunOptions(training=True, steps=steps + 1, results=folder, timeout_s=120)
        run = run_local(plan, rank_arguments(path, spec, options), timeout_s=600)
        if run.returncode != 0:
            raise SystemExit(f"the {world}-rank run of {spec} failed:\n{run.output[-2000:]}")
        records = read_results(folder, world)
        return max(statistics.median(r["step_s"][1:]) for r in records), records


def cluster_slicing(ranks: int, threads: int = 1) -> float:
    """How much longer each op of a rank takes when ``ranks`` ranks of ``threads`` threads share this
    machine's cores (1 when they do not outnumber them): what ``local_cluster`` scales by."""
    from cost_models.local_cluster import _usable_cores

    cores = _usable_cores()
    return min(threads, cores) / min(threads, cores / ranks)


def stage_times(plan, module: torch.nn.Module, inputs: tuple, micro_batches: int,  # noqa: ANN001
                repeat: int = 10) -> list[tuple[float, float, float]]:
    """Each stage's module (``backends.pipeline.stages``) on one micro-batch at 1 thread, alone:
    median seconds of its forward, of its forward and backward (a gradient of ones), and of the
    plan's optimizer step over its parameters (the ranks' optimizer, ``backends.pipeline.runtime``)."""
    from backends.pipeline.runtime import _optimizer
    from backends.pipeline.stages import StageGraphs
    from partitioner.micro_batches import micro_batch_inputs

    args = micro_batch_inputs(tuple(inputs), micro_batches)
    graphs = StageGraphs(plan, module, args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = []
    try:
        for s in range(graphs.num_stages):
            stage = graphs.module(s, torch.device("cpu"))
            args = tuple(a.detach().requires_grad_(s > 0 and a.is_floating_point()) for a in args)

            def fwd(stage=stage, args=args):  # noqa: ANN001, ANN202
                return stage(*args)

            def fwd_bwd(stage=stage, args=args):  # noqa: ANN001, ANN202
                result = fwd(stage, args)
                leaves = result if isinstance(result, tuple) else (result,)
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
                return result

            with torch.no_grad():
                forward = _median_s(fwd, repeat)
            total = _median_s(fwd_bwd, repeat)
            optimizer = _optimizer(plan.optimizer, stage)
            step = _median_s(optimizer.step, repeat) if optimizer is not None else 0.0
            out.append((forward, total, step))
            result = fwd()
            args = result if isinstance(result, tuple) else (result,)
    finally:
        torch.set_num_threads(threads)
    return out


def _median_s(fn, repeat: int) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _print(header: list[str], rows: list[list[str]]) -> None:
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.names()))
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--size", default="small")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--onnx-models", default=",".join([*models.names(), *LIGHT]),
                        help=f"ONNX rows: zoo names and/or {', '.join(LIGHT)} ('' for none)")
    parser.add_argument("--onnx-profiles", default=",".join(builtin_profiles()), help="profiles of the ONNX rows")
    parser.add_argument("--skip-seed", action="store_true", help="leave out the seed case rows")
    parser.add_argument("--part", default="zoo,clusters,measured", help="which tables: zoo (with the ONNX and seed rows), clusters, measured")
    parser.add_argument("--steps", type=int, default=10, help="measured rows: timed steps per run")
    parser.add_argument("--precision", action="store_true", help="only the precision table: auto vs all-fp32")
    parser.add_argument("--split", action="store_true", help="only the split table: split vs whole (issue 34)")
    parser.add_argument("--split-cases", default="",
                        help="split table: only the cases whose label contains one of these comma-separated words "
                             "(e.g. Mixtral)")
    parser.add_argument("--training", action="store_true",
                        help="only the training table: memory-capped training beside the offload baselines "
                             "(bench/training_plans.py)")
    args = parser.parse_args()
    if args.split:
        split_rows(args.time_limit, [w for w in args.split_cases.split(",") if w])
        return 0
    if args.precision:
        precision_rows(args.time_limit)
        weight_rows(args.time_limit)
        from error_budget import budget_rows  # bench/ is the script's folder

        budget_rows(args.time_limit)
        return 0
    if args.training:
        from training_plans import CASES, training_rows  # bench/ is the script's folder

        return 0 if training_rows(list(CASES), max(args.time_limit, 60.0)) else 1
    parts = set(args.part.split(","))
    if "clusters" in parts:
        cluster_rows(args.time_limit)
        print()
    if "measured" in parts:
        measured_rows(args.steps)
        print()
    if "zoo" not in parts:
        return 0
    rows: list[list[str]] = []
    all_ok = True
    for name in [n for n in args.models.split(",") if n]:
        module, inputs = models.get(name, args.size)
        graph = from_module(module, inputs, name=f"{name}:{args.size}")
        no_split = models.entry(name).no_split_classes
        for profile in args.profiles.split(","):
            for cap_name, caps in (("none", None), ("tight", tight_caps(profile, graph.total_param_bytes()))):
                for objective in args.objectives.split(","):
                    label = f"{name} / {profile} / {cap_name} / {objective}"
                    start = time.perf_counter()
                    try:
                        out = partition_outcome(graph, devices=profile, memory=caps, objective=objective,
                                                time_limit=args.time_limit, no_split=no_split)
                    except InfeasiblePlacement as exc:
                        rows.append([label, "infeasible", *["-"] * (len(BASELINES) + 4)])
                        print(f"# {label}: {exc}")
                        continue
                    cells, ok = row(label, out, time.perf_counter() - start)
                    rows.append(cells)
                    all_ok &= ok
    if rows:
        print_table(rows)
        print("(* = the baseline does not fit the caps; its time is shown for comparison)")
    onnx_names = [n for n in args.onnx_models.split(",") if n]
    if onnx_names:
        onnx_rows, ok = onnx_table(onnx_names, args.size, args.onnx_profiles.split(","), args.time_limit)
        all_ok &= ok
        print("\nONNX models (torch.onnx.export of the zoo; the onnx wheel's light models), latency:")
        print_table(onnx_rows, ONNX_BASELINES)
        print("(* = the baseline does not fit the caps; its time is shown for comparison)")
    if args.skip_seed:
        print(f"\nILP <= every feasible baseline everywhere: {'yes' if all_ok else 'NO'}")
        return 0 if all_ok else 1
    print()
    anchors = measured_anchors()
    module, inputs = models.get("emb-transformer", "base", device="meta")
    graph = from_module(module, inputs, name="emb-transformer:base")
    seed_rows = []
    speedups = []
    for cap_name, cap in (("emb+half layers", anchors["cap_half_layers"]), ("2 GiB", anchors["cap_below_embedding"])):
        start = time.perf_counter()
        out = partition_outcome(graph, devices="h200-host", memory={"cuda:0": int(cap)},
                                no_split=models.entry("emb-transformer").no_split_classes)
        cells, ok = row(f"seed case / h200-host / {cap_name} / latency", out, time.perf_counter() - start)
        seed_rows.append(cells)
        all_ok &= ok
        speedups.append(out.plan.baselines["greedy"].total_s / out.plan.predicted["total_s"])
    print_table(seed_rows)
    print()
    print(f"ILP <= every feasible baseline everywhere: {'yes' if all_ok else 'NO'}")
    print(f"speed-up over greedy on the capped seed case: {speedups[0]:.1f}x (emb+half layers), "
          f"{speedups[1]:.1f}x (2 GiB); target >= 10x: {'met' if max(speedups) >= 10 else 'MISSED'}")
    return 0 if all_ok else 1


def precision_rows(time_limit: float) -> None:
    """The precision table (see the module docstring): all-float32 vs ``precision="auto"``."""
    from cost_models.units import format_bytes

    cap = int(measured_anchors()["cap_half_layers"])
    cases = [("seed case (GPU emb+half layers)", "emb-transformer", "base", {"cuda:0": cap}),
             ("gpt:small", "gpt", "small", None)]
    header = ["case", "profile", "mode", "fp32 time", "auto time", "speed-up", "fp32 memory per device",
              "auto memory per device", "16-bit ops (auto)"]
    rows = []
    for label, name, size, caps in cases:
        module, inputs = models.get(name, size, device="meta")
        graph = from_module(module, inputs, name=f"{name}:{size}")
        no_split = models.entry(name).no_split_classes
        for profile in ("h200-host", "cpu-gpu-npu"):
            for training in (False, True):
                plans = {}
                for precision in (None, "auto"):
                    try:
                        plans[precision] = partition_outcome(graph, devices=profile, memory=caps, training=training,
                                                             precision=precision, time_limit=time_limit,
                                                             no_split=no_split).plan
                    except InfeasiblePlacement as exc:
                        print(f"# {label} / {profile} / {precision}: {exc}")
                if len(plans) < 2:
                    continue
                fp32, auto = plans[None], plans["auto"]

                def memory(plan) -> str:  # noqa: ANN001
                    return ", ".join(f"{d} {format_bytes(m['used'])}" for d, m in plan.memory.items() if m["used"])

                where: dict[str, int] = {}
                for op, dtype in auto.precision.get("ops", {}).items():
                    key = f"{dtype} on {auto.placement[op]}"
                    where[key] = where.get(key, 0) + 1
                rows.append([label, profile, "training" if training else "inference",
                             format_seconds(fp32.predicted["total_s"]), format_seconds(auto.predicted["total_s"]),
                             f"{fp32.predicted['total_s'] / auto.predicted['total_s']:.2f}x", memory(fp32),
                             memory(auto), f"{sum(where.values())}/{auto.op_count}: "
                             + (", ".join(f"{n} {k}" for k, n in sorted(where.items())) or "none")])
    _print(header, rows)
    print("(predicted by the cost model; auto keeps softmax, norms, reductions and losses in float32)")


def _llama_head(layers: int = 1, tokens: int = 512) -> tuple[torch.nn.Module, tuple]:
    """A Llama shape in float32 on the meta device: hidden 4,096, ``layers`` decoder layers, an untied
    128,256 x 4,096 LM head (2.1 GB), and a prompt of ``tokens``."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      use_cache=False, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        module = transformers.LlamaForCausalLM(config).eval()
    return module, (torch.zeros(1, tokens, dtype=torch.long, device="meta"),)


def _mixtral_bf16(tokens: int) -> tuple[torch.nn.Module, tuple]:
    """The Mixtral-8x7B shape cut to 4 layers in bfloat16 on the meta device (its experts captured as
    ``aten._grouped_mm`` over transposed fused weights, ``gate_up_proj`` [8, 28672, 4096]: 1.9 GB), and
    ``tokens`` tokens."""
    module, _ = _mixtral_4_layers()
    return module.to(torch.bfloat16), (torch.zeros(1, tokens, dtype=torch.long, device="meta"),)


#: The Mixtral rows' split settings: time splits (by expert for the experts ops), experts divided between
#: devices, and both beside the linears' two-device splits.
MIXTRAL_SPLITS = (("time split", "time"), ("experts split", "experts"), ("experts + time", "experts,time"),
                  ("splits + time", "cols,rows,experts,time"))

#: The split table's cases: label, model builder, cap on cuda:0, objectives, time-split settings (label, axes),
#: the ops shown (``lm_head``: the LM head; ``experts``: every fused experts op).
SPLIT_CASES = (
    ("Llama LM head, fp32, cuda:0 2 GB, 512 tokens", lambda: _llama_head(), "2GB", ("latency", "throughput"),
     (("time split", "time"), ("splits + time", "cols,rows,time")), "lm_head"),
    # time and two-device splits offered together there: the multilevel solver runs HiGHS level by level, each to its
    # limit (minutes in all), so that row is left out
    ("HeteGen's setting: Llama shape, 2 layers, fp32, cuda:0 2 GB, 1 token", lambda: _llama_head(2, 1), "2GB",
     ("latency",), (("time split", "time"),), "lm_head"),
    # issue 34's Mixtral case: one token (a decode-shaped step reads 2 of 8 experts, the CPU's share) and a prefill
    ("Mixtral-8x7B shape, 4 layers, bf16, cuda:0 4 GB, 1 token", lambda: _mixtral_bf16(1), "4GB", ("latency",),
     MIXTRAL_SPLITS, "experts"),
    ("Mixtral-8x7B shape, 4 layers, bf16, cuda:0 4 GB, 512 tokens", lambda: _mixtral_bf16(512), "4GB", ("latency",),
     MIXTRAL_SPLITS, "experts"),
)


def split_rows(time_limit: float, only: list[str] | None = None) -> None:
    """The split table (see the module docstring): every op whole, HeteGen's rule, ``splits=True`` and
    time splits; ``only``: the cases whose label contains one of these words."""
    from cost_models.units import format_bytes
    from partitioner.solvers.expert_streaming import is_experts_op

    header = ["case", "plan", "time", "vs whole", "shown ops: where", "their time", "splits", "memory per device",
              "status"]
    rows = []
    for case, build, cap, objectives, in_time, shown in SPLIT_CASES:
        if only and not any(word in case for word in only):
            continue
        module, inputs = build()
        graph = from_module(module, inputs, name=case)
        ops = [op.name for op in graph.ops.values()
               if (op.module_path == "lm_head" if shown == "lm_head" else is_experts_op(op))]
        for objective in objectives:
            whole = partition_outcome(graph, devices="h200-host", memory={"cuda:0": cap}, objective=objective,
                                      time_limit=time_limit)
            split = partition_outcome(graph, devices="h200-host", memory={"cuda:0": cap}, splits=True,
                                      objective=objective, time_limit=time_limit)
            timed = {label: partition_outcome(graph, devices="h200-host", memory={"cuda:0": cap}, splits=axes,
                                              objective=objective, time_limit=time_limit)
                     for label, axes in in_time}
            base = whole.plan.predicted["total_s"]
            hetegen_sol, hetegen_ev = split.baselines["hetegen"]
            for label, out, placement, ev, plan in (
                    ("whole ops", whole, whole.solution.placement, whole.evaluation, whole.plan),
                    ("hetegen", split, hetegen_sol.placement, hetegen_ev, None),
                    ("splits", split, split.solution.placement, split.evaluation, split.plan),
                    *((lbl, o, o.solution.placement, o.evaluation, o.plan) for lbl, o in timed.items())):
                where, seconds = _shown_cell(out.problem, placement, ops)
                fits = "" if ev.feasible else "* "
                status = ("heuristic" if plan is None else f"{plan.solver.status} (gap {plan.solver.gap:.2%})"
                          if plan.solver.gap is not None else plan.solver.status)
                rows.append([f"{case}, {objective}", label, fits + format_seconds(ev.total_s),
                             f"{base / ev.total_s:.2f}x", where, format_seconds(seconds),
                             str(len(placement.split)),
                             ", ".join(f"{d} {format_bytes(m)}" for d, m in ev.memory.items()), status])
    if rows:
        _print(header, rows)
        print("(predicted on h200-host by the analytic cost model; * = over a device's memory. Shown ops: the LM head "
              "(128,256 x 4,096), or the fused experts ops (two a layer: gate_up_proj [8, 28672, 4096] and down_proj). "
              "A split op's time: latency, its input copy plus the longer of its home shard and its other shard with "
              "the copy back; throughput, its longer shard. hetegen: every linear split by columns between cuda:0 and "
              "the CPU at the share where both branches end together, shards resident. time split: a linear computed "
              "on cuda:0 from row chunks of its weight streamed from the host (partitioner/solvers/chunked_streaming.py), "
              "an experts op from groups of its experts (partitioner/solvers/expert_streaming.py, priced with uniform "
              "routing, every expert copied); its time: the first chunk's copy, then the slower of the copies and the "
              "computes, then the last compute. experts split: an experts op's experts divided between cuda:0 and the "
              "CPU, the routed rows copied over and the outputs summed back (partitioner/solvers/expert_devices.py))")
    if not only or any(word in "GPT-3 8xh100" for word in only):
        from split_stacks import stack_rows  # bench/split_stacks.py, beside this file

        _print(["case", "plan", "time", "vs whole", "splits", "memory per device", "status"], stack_rows(time_limit))
        print("(predicted on 8xh100-nvlink by the analytic cost model from datasheet figures; one sample's latency. "
              "pipeline stages only: hetpart's pipeline plan in 8 stages, one micro-batch; megatron tp=8: every linear "
              "split evenly over the 8 GPUs, attention (by heads) and MLP column/row pairs not rejoined, every other op "
              "on cuda:0 (partitioner/solvers/megatron.py); hetpart splits: the ILP offered splits over 2, 4 and 8 GPUs, "
              "warm-started from megatron. Copies of one split on distinct NVLink pairs overlap (the profile's 450 GB/s "
              "per pair, a stated simplification); the same model prices both)")


def _shown_cell(problem, placement, ops: list[str]) -> tuple[str, float]:  # noqa: ANN001
    """Where the shown ops run (in words) and the time they add, under ``placement``."""
    nodes = list(dict.fromkeys(n for n in problem.nodes for op in ops if op in problem.members[n]))
    words: dict[str, int] = {}
    seconds = 0.0
    for node in nodes:
        sp = placement.split.get(node)
        device = placement.device.get(node, "?")
        if sp is not None and sp.axis == "time":
            by = " by expert" if getattr(sp, "by", None) == "expert" else ""
            word = f"time{by}: {sp.chunks} chunks {sp.devices[1]}->{sp.devices[0]}"
        elif sp is not None:
            word = f"{sp.axis} " + " + ".join(f"{d} {f:g}" for d, f in zip(sp.devices, sp.fractions))
        else:
            streamed = placement.streamed.get(node)
            word = f"whole on {device}" + (f", streamed from {streamed}" if streamed and streamed != device else "")
        seconds += problem.split_cost(node, sp) if sp is not None else problem.compute[node].get(device, 0.0)
        words[word] = words.get(word, 0) + 1
    where = "; ".join(w if len(nodes) == 1 else f"{n}x {w}" for w, n in words.items())
    return where, seconds


def _llama_8b(tokens: int = 1) -> tuple[torch.nn.Module, tuple]:
    """The Llama-3-8B shape (transformers config, bfloat16 on the meta device) and ``tokens`` tokens:
    one is a decode-shaped step that reads every weight once (no cache: the bytes a decode step
    moves), a few hundred a prefill, where the GPU's compute pays for streaming weights to it."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      use_cache=False)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        module = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return module, (torch.zeros(1, tokens, dtype=torch.long, device="meta"),)


def _mixtral_4_layers() -> tuple[torch.nn.Module, tuple]:
    """The Mixtral-8x7B shape cut to 4 layers (transformers config, float32 on the meta device: its
    weights are what a plan in bf16 casts once, when loaded) and one token."""
    import transformers

    config = transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                                        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                        num_experts_per_tok=2, vocab_size=32000, use_cache=False)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        module = transformers.MixtralForCausalLM(config).eval()
    return module, (torch.zeros(1, 1, dtype=torch.long, device="meta"),)


#: weight-dtype rows: the precision settings compared (None: as traced)
WEIGHT_SETTINGS = (("float32 / as traced", None), ("bf16", "bf16"), ("int8", {"weights": "int8"}),
                   ("int4", {"weights": "int4"}), ("auto + weights auto", {"activations": "auto", "weights": "auto"}))


def weight_rows(time_limit: float) -> None:
    """Weight-dtype rows (``--precision``): the seed case, ``gpt:small``, the Llama-3-8B shape at
    16, 6 and 3 GB caps on ``h200-host`` for one token and for a 512-token prefill (below its int8
    and int4 bytes: a prefill streams packed weights to the GPU, a decode step reads them on the
    CPU) and at 24 GB on ``desktop-4090``, and the Mixtral-8x7B shape cut to 4 layers at 4 GB on ``h200-host``,
    planned as traced, in bf16, with int8 and int4 packed weights and with both chosen by the solver:
    predicted time, memory per device and the weights streamed from host memory per step (the cost
    model's predictions; the profiles' weight-only rates are estimates except the CPU measured by
    ``hetpart calibrate``)."""
    from cost_models.units import format_bytes

    cap = int(measured_anchors()["cap_half_layers"])
    cases = [("seed case (GPU emb+half layers)", lambda: models.get("emb-transformer", "base", device="meta"),
              "h200-host", {"cuda:0": cap}),
             ("gpt:small", lambda: models.get("gpt", "small", device="meta"), "h200-host", None),
             ("Llama-3-8B, 1 token, 16 GB", _llama_8b, "h200-host", {"cuda:0": "16GB"}),
             ("Llama-3-8B, 1 token, 6 GB", _llama_8b, "h200-host", {"cuda:0": "6GB"}),
             ("Llama-3-8B, 1 token, 3 GB", _llama_8b, "h200-host", {"cuda:0": "3GB"}),
             ("Llama-3-8B, 512-token prefill, 6 GB", lambda: _llama_8b(512), "h200-host", {"cuda:0": "6GB"}),
             ("Llama-3-8B, 512-token prefill, 3 GB", lambda: _llama_8b(512), "h200-host", {"cuda:0": "3GB"}),
             ("Llama-3-8B, 1 token, 24 GB", _llama_8b, "desktop-4090", {"cuda:0": "24GB"}),
             ("Mixtral-8x7B 4 layers, 1 token, 4 GB", _mixtral_4_layers, "h200-host", {"cuda:0": "4GB"})]
    header = ["case", "profile", "setting", "time", "vs traced", "memory per device", "packed linears",
              "streamed weights per step"]
    rows = []
    for label, build, profile, caps in cases:
        module, inputs = build()
        graph = from_module(module, inputs, name=label)
        traced = None
        for name, setting in WEIGHT_SETTINGS:
            if setting == "bf16":
                setting = {d: "bf16" for d in load_profile(profile).names()}
            try:
                plan = partition_outcome(graph, devices=profile, memory=caps, precision=setting,
                                         time_limit=time_limit).plan
            except (InfeasiblePlacement, HetpartError) as exc:
                rows.append([label, profile, name, "-", "-", f"({str(exc).splitlines()[0][:60]})", "", ""])
                continue
            total = plan.predicted["total_s"]
            traced = traced or total
            packed: dict[str, int] = {}
            for op, w in (plan.precision or {}).get("weights", {}).items():
                key = f"{w} on {plan.placement[op]}"
                packed[key] = packed.get(key, 0) + 1
            rows.append([label, profile, name, format_seconds(total), f"{traced / total:.2f}x",
                         ", ".join(f"{d} {format_bytes(m['used'])}" for d, m in plan.memory.items() if m["used"]),
                         ", ".join(f"{n} {k}" for k, n in sorted(packed.items())) or "-", _streamed_cell(plan)])
    _print(header, rows)
    print("(predicted; weights packed per output row (int8, fp8) or per group of 128 (int4), bfloat16 activations "
          "in the kernels; 'auto' is the fastest plan with no accuracy budget; streamed weights cross the host link "
          "every step in the form their device computes with: packed linears as packed bytes)")


def _streamed_cell(plan) -> str:  # noqa: ANN001
    """The streamed weights of ``plan``: ops, bytes per step, and how many of them are packed linears."""
    from cost_models.units import format_bytes

    if not plan.weights:
        return "-"
    nbytes = sum(t.bytes for t in plan.transfers if t.kind == "weights")
    packed = (plan.precision or {}).get("streamed", {})
    cell = f"{len(plan.weights)} ops, {format_bytes(nbytes)}"
    return cell + (f" ({len(packed)} packed: {format_bytes(sum(packed.values()))})" if packed else "")


def onnx_table(names: list[str], size: str, profiles: list[str], time_limit: float) -> tuple[list[list[str]], bool]:
    """ILP against every baseline, ONNX ones included, for each ONNX model x profile x cap (latency)."""
    import tempfile
    from pathlib import Path

    from models.onnx_models import export_zoo, light_model
    from partitioner import from_onnx

    rows, all_ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = light_model(name) if name in LIGHT else export_zoo(name, size, Path(tmp) / f"{name}.onnx")
            graph = from_onnx(path, name=name if name in LIGHT else f"{name}:{size}")
            for profile in profiles:
                for cap_name, caps in (("none", None), ("tight", tight_caps(profile, graph.total_param_bytes()))):
                    label = f"{graph.name} (onnx) / {profile} / {cap_name}"
                    start = time.perf_counter()
                    try:
                        out = partition_outcome(graph, devices=profile, memory=caps, time_limit=time_limit)
                    except InfeasiblePlacement as exc:
                        rows.append([label, "infeasible", *["-"] * (len(ONNX_BASELINES) + 4)])
                        print(f"# {label}: {exc}")
                        continue
                    cells, ok = row(label, out, time.perf_counter() - start, ONNX_BASELINES)
                    rows.append(cells)
                    all_ok &= ok
    return rows, all_ok


if __name__ == "__main__":
    raise SystemExit(main())
