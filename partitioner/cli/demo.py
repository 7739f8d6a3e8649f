"""``hetpart demo``: the seed case end to end (plan, emit, check, report) in one folder."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    dm = sub.add_parser("demo", parents=[common],
                        help="the seed case end to end: plan, emit, check, report (writes hetpart-demo/)")
    dm.add_argument("-o", "--output", default="hetpart-demo", metavar="DIR")
    dm.add_argument("--size", default="base", choices=["tiny", "small", "base"],
                    help="emb-transformer size (base: the calibration model, 4 GiB embedding)")
    dm.add_argument("--force", action="store_true", help="overwrite the demo's files if they exist")
    dm.set_defaults(func=_cmd_demo)


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
