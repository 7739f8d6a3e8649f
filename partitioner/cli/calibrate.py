"""``hetpart calibrate``: fit a device profile of this machine to micro-benchmarks run on it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from partitioner.cli.args import add_bind, pairs, positive_int, progress_bar


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    ca = sub.add_parser("calibrate", parents=[common],
                        help="fit a profile of this machine (peaks, efficiencies, caches, links) to micro-benchmarks")
    ca.add_argument("--devices", default="detect", metavar="detect|PROFILE",
                    help="detect: this machine's CPU and GPUs; or a profile whose devices are present or bound")
    add_bind(ca)
    ca.add_argument("-o", "--output", metavar="FILE.toml", help="write the profile (else print it)")
    ca.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    ca.add_argument("--name", help="the profile's name (default: the file name)")
    ca.add_argument("--quick", action="store_true", help="fewer shapes (a rough profile in seconds)")
    ca.add_argument("--repeats", type=positive_int, default=7, metavar="N", help="timed passes at most (median)")
    ca.add_argument("--threads", type=positive_int, metavar="N", help="torch intra-op threads while measuring")
    ca.add_argument("--strict", action="store_true", help="exit 1 when the fit is poor (the file is written anyway)")
    ca.set_defaults(func=_cmd_calibrate)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from cost_models.calibrate import calibrate
    from cost_models.measure import MeasureOptions
    from partitioner.files import refuse_overwrite, write_atomic

    output = Path(args.output) if args.output else None
    if output is not None:
        refuse_overwrite([output], force=args.force)
    name = args.name or (output.stem if output else "calibrated")
    options = MeasureOptions(repeats=args.repeats, min_repeats=min(3, args.repeats), threads=args.threads)
    print(f"calibrating {args.devices} (micro-benchmarks{', quick' if args.quick else ''}) ...", file=sys.stderr)
    cal = calibrate(args.devices, name=name, bind=pairs(args.bind, "--bind", "npu:0=cpu") or None, quick=args.quick,
                    options=options, progress=progress_bar())
    for line in cal.verdicts():
        print(line)
    text = cal.profile.to_toml()
    if output is None:
        print(text)
    else:
        write_atomic(output, text.encode("utf-8"))
        print(f"wrote {output} (residuals are comments in it; use it: hetpart plan MODEL --devices {output})")
    if cal.poor:
        print("hetpart: warning: the fit is poor (see POOR FIT above): the profile's predictions will be off; "
              "re-run `hetpart calibrate` when nothing else runs on this machine", file=sys.stderr)
        return 1 if args.strict else 0
    return 0
