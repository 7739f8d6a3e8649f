"""The ``hetpart`` command line.

Subcommands: ``devices`` (built-in and detected device profiles) and ``inspect`` (a model's ops and
their predicted cost on each device). Errors from hetpart print as one message and exit 2;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from partitioner.errors import HetpartError

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
    return parser


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
    loaded = load_model(args.model)
    graph = from_module(loaded.module, loaded.example_inputs, capture=args.capture, name=loaded.name)
    report = inspect_graph(graph, profile, training=args.training, optimizer=args.optimizer, model_name=loaded.name)
    if args.json:
        print(json.dumps(report.to_dict(top=args.top), indent=2))
    else:
        print(report.to_text(top=args.top))
    return 0


def _write_text(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` atomically; refuse to replace an existing file unless ``force``."""
    if path.exists() and not force:
        raise HetpartError(f"{path} exists: pass --force to overwrite it")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
