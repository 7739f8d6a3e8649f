"""``hetpart devices``: list the built-in device profiles, show one, or detect this machine."""

from __future__ import annotations

import argparse

from partitioner.cli.args import output_path
from partitioner.errors import HetpartError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    dev = sub.add_parser("devices", parents=[common], help="list built-in device profiles or detect this machine")
    dev.add_argument("profile", nargs="?", help="show one profile (built-in name or path to a TOML file); detect or "
                                                "detect:PROFILE: capped at the memory free now (see hetpart plan)")
    dev.add_argument("--detect", action="store_true", help="build a profile of this machine")
    dev.add_argument("--no-measure", action="store_true", help="with --detect: skip the quick micro-benchmarks")
    dev.add_argument("--write", metavar="FILE", help="with --detect or PROFILE: write the profile as TOML")
    dev.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    dev.set_defaults(func=_cmd_devices)


def _cmd_devices(args: argparse.Namespace) -> int:
    from cost_models.detect import detect_local
    from cost_models.live_memory import profile_for
    from cost_models.profiles import builtin_profiles, load_profile

    target = output_path(args.write, "--write", force=args.force) if args.write is not None else None
    if args.detect:
        profile = detect_local(measure=not args.no_measure)
    elif args.profile:
        profile = profile_for(args.profile)
    else:
        if target is not None:
            raise HetpartError("--write needs a profile to write: give --detect or a PROFILE")
        print("built-in profiles (hetpart devices NAME shows one; --detect profiles this machine):")
        for name in builtin_profiles():
            ds = load_profile(name)
            print(f"  {name:<14} {', '.join(ds.names())}")
        return 0
    if target is not None:
        from partitioner.files import write_atomic

        write_atomic(target, profile.to_toml().encode("utf-8"))
        print(f"wrote {target}")
    print(describe_profile(profile))
    return 0


def describe_profile(profile) -> str:  # noqa: ANN001 - a DeviceSet
    from cost_models.units import format_bytes, format_rate, format_seconds

    lines = [f"profile {profile.name}  ({profile.source})"]
    if profile.probe is not None:  # detect[:PROFILE]: what was read, and each fallback
        lines += [f"  {line}" for line in profile.notes[-1 - len(profile.probe.notes):]]
    lines.append("devices:")
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
