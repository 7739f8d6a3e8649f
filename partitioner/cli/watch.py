"""``hetpart watch``: the devices' live memory against what a plan and its fallbacks need.

For each accelerator of the plan's profile, read now as ``--devices detect`` reads it (NVML, else
``torch.cuda.mem_get_info``, else the profile's capacity, each fallback said): the source, free and
used memory, total, utilisation (NVML only); beside it the bytes each plan needs there (the
primary and every fallback) and which plan would run now (the first that fits the free memory).
Memory a running model already holds counts as used here. Exit status 0 when a plan fits, 1 when
none does.
"""

from __future__ import annotations

import argparse
import time

from partitioner.cli.args import positive_int
from partitioner.errors import HetpartError, NoPlanFits


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    wa = sub.add_parser("watch", parents=[common], help="print the devices' free memory against a plan's needs")
    wa.add_argument("plan", help="plan file (hetpart plan ... -o plan.json, with --fallbacks for fallback plans)")
    wa.add_argument("--once", action="store_true", help="print once and exit (the default without --interval)")
    wa.add_argument("--interval", type=float, metavar="S", help="print again every S seconds")
    wa.add_argument("--count", type=positive_int, metavar="N", help="with --interval: stop after N prints (default: "
                                                                    "until interrupted)")
    wa.set_defaults(func=_cmd_watch)


def _cmd_watch(args: argparse.Namespace) -> int:
    from partitioner.plan import Plan

    if args.interval is not None and not (args.interval > 0 and args.interval < 86400):
        raise HetpartError(f"--interval {args.interval:g}: expected seconds above 0 and below a day, e.g. --interval 2")
    if args.once and (args.interval is not None or args.count is not None):
        raise HetpartError("--once prints once: drop --interval and --count, or drop --once")
    plan = Plan.load(args.plan)
    count = 1 if args.interval is None else args.count
    printed, status = 0, 0
    while True:
        text, status = watch_text(plan)
        print(text, flush=True)
        printed += 1
        if count is not None and printed >= count:
            return status
        time.sleep(args.interval)
        print()


def watch_text(plan) -> tuple[str, int]:  # noqa: ANN001 - a Plan
    """The table for ``plan`` now, and 0 if a plan fits (1 if none does)."""
    from cost_models.live_memory import read_devices
    from cost_models.units import format_bytes
    from partitioner.plan.live import plan_labels, plan_needs, plan_that_fits

    readings, notes = read_devices(plan.devices)
    labels = plan_labels(plan)
    needs = [plan_needs(p) for p in (plan, *(f.plan for f in plan.fallbacks))]

    def size(n: int | None) -> str:
        return "-" if n is None else format_bytes(n)

    head = ["device", "source", "free", "used", "total", "util", *(f"{label} needs" for label in labels)]
    rows = [[r.device, r.source, size(r.free), size(r.used), size(r.total),
             "-" if r.utilization is None else f"{r.utilization:.0f}%",
             *(size(n.get(r.device, 0)) for n in needs)] for r in readings]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    lines = [f"plan {plan.model_name!r} on {plan.devices.name} ({plan.source}), read at "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {len(labels)} plan(s)"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (head, *rows)]
    if not readings:
        lines.append("  (the plan's profile has no accelerators: nothing is limited)")
    try:
        index = plan_that_fits(plan, {r.device: r.free for r in readings})
        lines.append(f"would run now: {labels[index]}")
        status = 0
    except NoPlanFits as err:
        lines.append(f"would run now: none; {err}")
        status = 1
    lines += [f"note: {note}" for note in notes]
    if plan.probe:
        lines.append(f"planned on memory read at {plan.probe['taken_at']} (margin "
                     f"{_margin(plan.probe['margin'])}): " +
                     ", ".join(f"{d} cap {format_bytes(v['cap'])} ({v['source']})"
                               for d, v in plan.probe["devices"].items()))
    return "\n".join(lines), status


def _margin(margin) -> str:  # noqa: ANN001 - the probe's margin mapping
    from cost_models.units import format_bytes

    return f"{margin['fraction']:.0%}" if "fraction" in margin else format_bytes(margin["bytes"])
