"""Argument helpers shared by the ``hetpart`` subcommands: KEY=VALUE pairs, bindings, progress, writes."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from partitioner.errors import HetpartError, PlanMismatch


def add_bind(sub: argparse.ArgumentParser) -> None:
    """``--bind LOGICAL=PHYSICAL`` (repeatable)."""
    sub.add_argument("--bind", action="append", default=[], metavar="LOGICAL=PHYSICAL",
                     help="run a plan device on a present one, e.g. cuda:0=cpu (repeatable)")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


@contextlib.contextmanager
def naming_the_model(plan, model_name: str) -> Iterator[None]:  # noqa: ANN001 - a Plan
    """A PlanMismatch says first which model was given and which one the plan was made for."""
    try:
        yield
    except PlanMismatch as exc:
        made_for = "" if plan.model_name == model_name else f" (it was made for {plan.model_name!r})"
        raise PlanMismatch(f"the plan {plan.source} does not fit model {model_name!r} as captured now{made_for}:"
                           f"\n{exc}") from None


def one_line_summary(plan, binding: dict[str, str]) -> str:  # noqa: ANN001 - a Plan
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


def pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; a malformed one is an error naming the flag and an example."""
    out = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key or not value:
            raise HetpartError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} {example}")
        out[key] = value
    return out


def print_progress(report) -> None:  # noqa: ANN001 - a solvers.ilp.Progress
    from cost_models.units import format_seconds

    def show(value: float | None) -> str:
        return format_seconds(value) if value is not None else "-"

    gap = f"{report.gap:.2%}" if report.gap is not None else "-"
    print(f"  solving {report.seconds:5.1f} s: best {show(report.incumbent)}, bound {show(report.bound)}, gap {gap}",
          file=sys.stderr)


def progress_bar(stream=None):  # noqa: ANN001, ANN201 - a text stream; returns a measure.ProgressFn
    """A ``progress(done, total, what)`` that draws ``what [######......] 3/7`` on ``stream``
    (stderr): redrawn in place on a terminal, one line per finished phase otherwise."""
    out = stream or sys.stderr
    tty = out.isatty()

    def show(done: int, total: int, what: str) -> None:
        width = 24
        filled = int(width * done / max(total, 1))
        line = f"  {what:<24} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if tty:
            print("\r" + line, end="\n" if done >= total else "", file=out, flush=True)
        elif done >= total:
            print(line, file=out, flush=True)

    return show


def write_text(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` atomically; refuse to replace an existing file unless ``force``."""
    if path.exists() and not force:
        raise HetpartError(f"{path} exists: pass --force to overwrite it")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
