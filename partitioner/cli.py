"""The ``hetpart`` command line.

Subcommands: ``devices`` (built-in and detected device profiles), ``inspect`` (a model's ops and
their predicted cost on each device), ``plan`` (place a model's ops, write the plan file), ``emit``
(write a plan as a runnable Python file) and ``check`` (run the emitted plan beside the original
model and compare outputs, gradients and time; exit 1 when they differ). Errors from hetpart print
as one message and exit 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from partitioner.errors import HetpartError, PlanMismatch

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hetpart`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except HetpartError as exc:
        if args.debug:
            raise
        print(f"hetpart: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hetpart: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head and friends
        sys.stderr.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show full tracebacks and debug logging")
    parser = argparse.ArgumentParser(
        prog="hetpart",
        description="Place the operators of a neural network on CPUs, GPUs and accelerators.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    dev = sub.add_parser("devices", parents=[common], help="list built-in device profiles or detect this machine")
    dev.add_argument("profile", nargs="?", help="show one profile (built-in name or path to a TOML file)")
    dev.add_argument("--detect", action="store_true", help="build a profile of this machine")
    dev.add_argument("--no-measure", action="store_true", help="with --detect: skip the quick micro-benchmarks")
    dev.add_argument("--write", metavar="FILE", help="with --detect or PROFILE: write the profile as TOML")
    dev.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    dev.set_defaults(func=_cmd_devices)

    ins = sub.add_parser("inspect", parents=[common], help="show a model's ops and their cost on each device")
    ins.add_argument("model", help="zoo name (gpt, gpt:small) or path/to/file.py:factory")
    ins.add_argument("--devices", default="h200-host", metavar="PROFILE", help="built-in profile or TOML file")
    ins.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    ins.add_argument("--training", action="store_true", help="cost a training step (forward + backward)")
    ins.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam"])
    ins.add_argument("--top", type=int, default=15, metavar="N", help="show the N most expensive ops (0: all)")
    ins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ins.set_defaults(func=_cmd_inspect)

    pl = sub.add_parser("plan", parents=[common], help="place a model's ops on the devices of a profile")
    pl.add_argument("model", help="zoo name (gpt, gpt:small) or path/to/file.py:factory")
    pl.add_argument("--devices", default="h200-host", metavar="PROFILE", help="built-in profile or TOML file")
    pl.add_argument("--objective", default="latency", choices=["latency", "throughput", "makespan"])
    pl.add_argument("--memory", action="append", default=[], metavar="DEVICE=SIZE",
                    help="cap a device below its profile, e.g. cuda:0=2GB (repeatable)")
    pl.add_argument("--pin", action="append", default=[], metavar="GLOB=DEVICE",
                    help="pin ops by name or module-path glob, e.g. 'emb*=cpu' (repeatable)")
    pl.add_argument("--training", action="store_true", help="plan a training step")
    pl.add_argument("--optimizer", default="adam", choices=["sgd", "sgd-momentum", "adam"])
    pl.add_argument("--solver", default="auto",
                    help="auto, highs, cbc, or a baseline: greedy, sequential-fill, heft, single:DEVICE")
    pl.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="ILP time limit in seconds")
    pl.add_argument("--gap", type=float, default=0.01, help="relative optimality gap to stop at")
    pl.add_argument("--no-streaming", action="store_true", help="keep every weight where its op computes")
    pl.add_argument("--coarsen", default="auto", choices=["auto", "on", "off"])
    pl.add_argument("--capture", default="export", choices=["export", "symbolic_trace"])
    pl.add_argument("--align-modules", action="append", default=[], metavar="CLASS",
                    help="keep every instance of a module class on one device, e.g. Block (repeatable)")
    pl.add_argument("-o", "--output", metavar="FILE", help="write the plan (see --format)")
    pl.add_argument("--format", default="json", choices=["json", "device-map", "csv"],
                    help="json: the plan file; device-map: accelerate's device_map; csv: op, module, device, seconds")
    pl.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    pl.set_defaults(func=_cmd_plan)

    rp = sub.add_parser("report", parents=[common], help="draw a plan as a self-contained HTML page (or PNGs)")
    rp.add_argument("plan", metavar="PLAN.json")
    rp.add_argument("-o", "--output", metavar="FILE", help="report.html, or a folder for --format png")
    rp.add_argument("--format", default="html", choices=["html", "png"])
    rp.add_argument("--model", help="check the plan belongs to this model first (zoo name or file.py:factory)")
    rp.add_argument("--force", action="store_true", help="overwrite existing files")
    rp.set_defaults(func=_cmd_report)

    ex = sub.add_parser("explain", parents=[common], help="why an op or module sits where it does")
    ex.add_argument("plan", metavar="PLAN.json")
    ex.add_argument("target", metavar="OP_OR_MODULE", help="an op name, a module path, or a glob")
    ex.set_defaults(func=_cmd_explain)

    dm = sub.add_parser("demo", parents=[common],
                        help="the seed case end to end: plan, emit, check, report (writes hetpart-demo/)")
    dm.add_argument("-o", "--output", default="hetpart-demo", metavar="DIR")
    dm.add_argument("--size", default="base", choices=["tiny", "small", "base"],
                    help="emb-transformer size (base: the calibration model, 4 GiB embedding)")
    dm.add_argument("--force", action="store_true", help="overwrite the demo's files if they exist")
    dm.set_defaults(func=_cmd_demo)

    em = sub.add_parser("emit", parents=[common], help="write a plan as a runnable Python file")
    em.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small) or file.py:factory")
    em.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    em.add_argument("-o", "--output", required=True, metavar="FILE.py", help="the Python file to write")
    _add_bind(em)
    em.add_argument("--force", action="store_true", help="overwrite FILE.py if it exists")
    em.set_defaults(func=_cmd_emit)

    ck = sub.add_parser("check", parents=[common],
                        help="run a plan's emitted module beside the original; compare outputs and time")
    ck.add_argument("model", help="the model the plan was made for: zoo name (gpt, gpt:small) or file.py:factory")
    ck.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan file from `hetpart plan`")
    _add_bind(ck)
    ck.add_argument("--training", action="store_true",
                    help="also compare the loss (sum of outputs) and every parameter's gradient")
    ck.add_argument("--repeat", type=_positive_int, default=5, metavar="N", help="timed runs of each (median)")
    ck.set_defaults(func=_cmd_check)
    return parser


def _add_bind(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--bind", action="append", default=[], metavar="LOGICAL=PHYSICAL",
                     help="run a plan device on a present one, e.g. cuda:0=cpu (repeatable)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


# --------------------------------------------------------------------------------------------


def _cmd_devices(args: argparse.Namespace) -> int:
    from cost_models.detect import detect_local
    from cost_models.profiles import builtin_profiles, load_profile

    if args.detect:
        profile = detect_local(measure=not args.no_measure)
    elif args.profile:
        profile = load_profile(args.profile)
    else:
        print("built-in profiles (hetpart devices NAME shows one; --detect profiles this machine):")
        for name in builtin_profiles():
            ds = load_profile(name)
            print(f"  {name:<14} {', '.join(ds.names())}")
        return 0
    if args.write:
        _write_text(Path(args.write), profile.to_toml(), force=args.force)
        print(f"wrote {args.write}")
    print(_describe_profile(profile))
    return 0


def _describe_profile(profile) -> str:  # noqa: ANN001 - a DeviceSet
    from cost_models.units import format_bytes, format_rate, format_seconds

    lines = [f"profile {profile.name}  ({profile.source})", "devices:"]
    for d in profile.devices:
        peaks = ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in sorted(d.peak_flops.items()))
        ops = "all ops" if d.supported_ops is None else "only " + ", ".join(d.supported_ops)
        lines.append(
            f"  {d.name:<8} {d.kind.value:<4} memory {format_bytes(d.memory)}, {format_rate(d.mem_bandwidth)}, "
            f"{peaks}, launch {format_seconds(d.launch_overhead)}; {ops}"
        )
    lines.append("links:")
    for link in profile.links:
        pageable = f", pageable {format_rate(link.pageable_bandwidth)}" if link.pageable_bandwidth else ""
        lines.append(
            f"  {link.between[0]} <-> {link.between[1]}: {format_rate(link.bandwidth)}{pageable}, "
            f"latency {format_seconds(link.latency)}"
        )
    return "\n".join(lines)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from cost_models.profiles import load_profile
    from partitioner.frontends.fx import from_module
    from partitioner.inspect import inspect_graph
    from partitioner.model_source import load_model

    profile = load_profile(args.devices)
    loaded = load_model(args.model, device="meta")  # zoo models: shapes only, no memory for weights
    graph = from_module(loaded.module, loaded.example_inputs, capture=args.capture, name=loaded.name)
    report = inspect_graph(graph, profile, training=args.training, optimizer=args.optimizer, model_name=loaded.name)
    if args.json:
        print(json.dumps(report.to_dict(top=args.top), indent=2))
    else:
        print(report.to_text(top=args.top))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from partitioner.model_source import load_model
    from partitioner.planner import partition

    if args.output and Path(args.output).exists() and not args.force:
        raise HetpartError(f"{args.output} exists: pass --force to overwrite it")
    if args.format != "json" and not args.output:
        raise HetpartError(f"--format {args.format} writes a file: give it with -o FILE")
    loaded = load_model(args.model, device="meta")  # zoo models: shapes only, no memory for weights
    memory = _pairs(args.memory, "--memory", "cuda:0=2GB")
    pins = _pairs(args.pin, "--pin", "'emb*=cpu'")
    print(f"capturing {loaded.name} ({args.capture}) ...", file=sys.stderr)
    plan = partition(
        loaded.module, loaded.example_inputs, args.devices,
        objective=args.objective, memory=memory, training=args.training, optimizer=args.optimizer,
        pins=pins, solver=args.solver, time_limit=args.time_limit, gap=args.gap,
        streaming=not args.no_streaming, coarsen={"on": True, "off": False}.get(args.coarsen, "auto"),
        no_split=loaded.no_split, capture=args.capture, model_name=loaded.name, progress=_print_progress,
        align_modules=args.align_modules,
    )
    print(plan.summary())
    if args.output:
        from partitioner.export import write_export

        write_export(plan, args.output, args.format, force=args.force)
        print(f"wrote {args.output} ({args.format})")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from partitioner.plan import Plan
    from partitioner.report import write_pngs, write_report

    plan = Plan.load(args.plan)
    if args.model:
        from backends.torch.module import capture_for
        from partitioner.model_source import load_model

        loaded = load_model(args.model, device="meta")
        capture_for(plan, loaded.module, loaded.example_inputs)  # raises PlanMismatch with both fingerprints
    if args.format == "png":
        folder = Path(args.output or "report-png")
        for path in write_pngs(plan, folder, force=args.force):
            print(f"wrote {path}")
        return 0
    path = write_report(plan, args.output or "report.html", force=args.force)
    print(f"wrote {path}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from partitioner.explain import explain
    from partitioner.plan import Plan

    print(explain(Plan.load(args.plan), args.target).to_text())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from partitioner.demo import run_demo

    started = __import__("time").perf_counter()

    def progress(message: str) -> None:
        print(f"[{__import__('time').perf_counter() - started:5.1f} s] {message}", file=sys.stderr, flush=True)

    result = run_demo(args.output, size=args.size, force=args.force, progress=progress)
    print()
    print(f"emb-transformer:{args.size} on h200-host, cuda:0 capped below embedding + layers:")
    print(result.table)
    print()
    print(result.check.to_text())
    print()
    for label, path in (("plan", result.plan_path), ("partitioned module", result.source_path),
                        ("report", result.report_path)):
        print(f"{label:<19} {path}")
    print(f"done in {result.seconds:.1f} s")
    return 0 if result.check.passed else 1


def _cmd_emit(args: argparse.Namespace) -> int:
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    output = Path(args.output)
    if output.exists() and not args.force:
        raise HetpartError(f"{output} exists: pass --force to overwrite it")
    plan = Plan.load(args.plan)
    binding = _pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model)  # real weights: the file is written for this model
    with _naming_the_model(plan, loaded.name):
        plan.emit_source(output, loaded.module, binding or None, example_inputs=loaded.example_inputs,
                         force=args.force)
    print(f"wrote {output}")
    print(_one_line_summary(plan, binding))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from backends.torch.check import check_plan
    from partitioner.model_source import load_model
    from partitioner.plan import Plan

    plan = Plan.load(args.plan)
    binding = _pairs(args.bind, "--bind", "cuda:0=cpu")
    loaded = load_model(args.model)  # real weights: both modules run
    with _naming_the_model(plan, loaded.name):
        report = check_plan(plan, loaded.module, loaded.example_inputs, binding or None,
                            training=args.training, repeat=args.repeat)
    print(report.to_text())
    return 0 if report.passed else 1


@contextlib.contextmanager
def _naming_the_model(plan, model_name: str) -> Iterator[None]:  # noqa: ANN001 - a Plan
    """A PlanMismatch says first which model was given and which one the plan was made for."""
    try:
        yield
    except PlanMismatch as exc:
        made_for = "" if plan.model_name == model_name else f" (it was made for {plan.model_name!r})"
        raise PlanMismatch(f"the plan {plan.source} does not fit model {model_name!r} as captured now{made_for}:"
                           f"\n{exc}") from None


def _one_line_summary(plan, binding: dict[str, str]) -> str:  # noqa: ANN001 - a Plan
    """``gpt:tiny, 46 ops: cpu 26, cuda:0 20 (bound to cpu); predicted 273 µs per step on h200-host``."""
    from cost_models.units import format_seconds

    parts = []
    for device, ops in plan.per_device_ops().items():
        if ops:
            bound = f" (bound to {binding[device]})" if binding.get(device, device) != device else ""
            parts.append(f"{device} {len(ops)}{bound}")
    total = plan.predicted["total_s"]
    predicted = format_seconds(total) if total is not None else "n/a"
    streamed = f", {len(plan.weights)} streamed ({plan.stream_mode})" if plan.weights else ""
    return (f"{plan.model_name}, {plan.op_count} ops: {', '.join(parts)}{streamed}; "
            f"predicted {predicted} per step on {plan.devices.name}")


def _pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key or not value:
            raise HetpartError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} {example}")
        out[key] = value
    return out


def _print_progress(report) -> None:  # noqa: ANN001 - a solvers.ilp.Progress
    from cost_models.units import format_seconds

    def show(value: float | None) -> str:
        return format_seconds(value) if value is not None else "-"

    gap = f"{report.gap:.2%}" if report.gap is not None else "-"
    print(f"  solving {report.seconds:5.1f} s: best {show(report.incumbent)}, bound {show(report.bound)}, gap {gap}",
          file=sys.stderr)


def _write_text(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` atomically; refuse to replace an existing file unless ``force``."""
    if path.exists() and not force:
        raise HetpartError(f"{path} exists: pass --force to overwrite it")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
