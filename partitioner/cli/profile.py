"""``hetpart profile``: measure every op of a model on the devices of this machine; write a costs file."""

from __future__ import annotations

import argparse
import sys

from partitioner.cli.args import add_bind, output_path, pairs, positive_int, progress_bar


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    pr = sub.add_parser("profile", parents=[common],
                        help="measure a model's ops on this machine's devices (cached); write a costs file")
    pr.add_argument("model", help="zoo name (gpt, gpt:small) or path/to/file.py:factory")
    pr.add_argument("--devices", default="detect", metavar="detect|PROFILE",
                    help="detect: this machine's CPU and GPUs; or a profile whose present devices are measured")
    add_bind(pr)
    pr.add_argument("--training", action="store_true", help="also measure backward and the optimizer step")
    pr.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "sparse-adam"])
    pr.add_argument("--repeats", type=positive_int, default=7, metavar="N", help="timed passes at most (median)")
    pr.add_argument("--threads", type=positive_int, metavar="N", help="torch intra-op threads while measuring")
    pr.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    pr.add_argument("--cache", metavar="FILE", help="measurement cache (default $HETPART_CACHE or ~/.cache/hetpart)")
    pr.add_argument("-o", "--output", metavar="COSTS.json", help="write the costs file (plan --costs COSTS.json)")
    pr.add_argument("--force", action="store_true", help="overwrite the costs file if it exists")
    pr.set_defaults(func=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    import torch

    from cost_models.detect import detect_local
    from cost_models.measure import MeasureOptions
    from cost_models.measure_cache import MeasurementCache
    from cost_models.profiler import profile_graph
    from cost_models.profiles import load_profile
    from cost_models.units import format_seconds
    from partitioner.frontends.fx import from_module
    from partitioner.model_source import load_model

    if args.output:
        output_path(args.output, "-o", force=args.force)  # checked before anything is measured
    devices = detect_local(measure=False) if args.devices == "detect" else load_profile(args.devices)
    loaded = load_model(args.model)  # real weights: the ops run
    graph = from_module(loaded.module, loaded.example_inputs, capture=args.capture, name=loaded.name)
    cache = MeasurementCache.load(args.cache)
    threads = args.threads or torch.get_num_threads()
    print(f"profiling {loaded.name} ({args.capture}, {len(graph)} ops) on {devices.name} with torch "
          f"{torch.__version__}, {threads} threads; cache {cache.path}", file=sys.stderr)
    options = MeasureOptions(repeats=args.repeats, min_repeats=min(3, args.repeats), training=args.training,
                             optimizer=args.optimizer, threads=args.threads)
    profile = profile_graph(graph, loaded.example_inputs, devices, bind=pairs(args.bind, "--bind", "npu:0=cpu"),
                            options=options, cache=cache, progress=progress_bar(), model_name=loaded.name)
    table = profile.table
    if profile.interrupted:
        print(f"interrupted: what was measured is kept in {cache.path} ({len(cache)} entries); run the same "
              f"command again to finish (measured ops come from the cache)", file=sys.stderr)
        return 130
    for physical in dict.fromkeys(table.bind.values()):
        logical = ", ".join(d for d, p in table.bind.items() if p == physical)
        times = {op: t[physical] for op, t in table.times.items() if physical in t}
        measured = {op: t["forward_s"] for op, t in times.items() if t.get("forward_s") is not None}
        failed = {op: why[physical] for op, why in table.unsupported.items() if physical in why}
        distinct = len({table.signatures[op] for op in measured})
        line = (f"{physical} (for {logical}): {len(measured)} ops measured ({distinct} distinct), "
                f"forward {format_seconds(sum(measured.values()))} summed")
        if args.training:
            train = [t.get("train_forward_s", 0) + t.get("backward_s", 0) for t in times.values()
                     if t.get("backward_s") is not None]
            line += f", forward + backward {format_seconds(sum(train))}"
        print(line)
        slowest = sorted(measured, key=measured.__getitem__, reverse=True)[:3]
        if slowest:
            print("  slowest: " + ", ".join(f"{op} {format_seconds(measured[op])}" for op in slowest))
        for op, why in failed.items():
            print(f"  unsupported on {physical}: {op}: {why}")
        busy = table.busy.get(physical, ())
        if busy:
            print(f"  {len(busy)} of {len(measured)} ops measured while other processes shared the CPUs: their "
                  f"times may be too high; profile again when the machine is quiet")
    unmeasured = [d for d in devices.names() if d not in table.bind]
    if unmeasured:
        print(f"not measured (not present here; bind with --bind DEVICE=cpu): {', '.join(unmeasured)}")
    if table.copies:
        print(f"copies: {len(table.copies)} measured between {len({(c.src, c.dst) for c in table.copies})} device pairs")
    print(f"cache: {profile.cached} measurements from {cache.path}"
          + (f"; {profile.stale} from another torch version or thread count not used" if profile.stale else ""))
    if args.output:
        table.save(args.output, force=args.force)
        print(f"wrote {args.output} (use it: hetpart plan {loaded.name} --devices {args.devices} --costs {args.output})")
    return 0
