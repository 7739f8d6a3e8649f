"""Argument helpers shared by the ``hetpart`` subcommands: KEY=VALUE pairs, bindings, progress, writes."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from partitioner.errors import HetpartError, PlanMismatch


def add_bind(sub: argparse.ArgumentParser) -> None:
    """``--bind LOGICAL=PHYSICAL`` (repeatable)."""
    sub.add_argument("--bind", action="append", default=[], metavar="LOGICAL=PHYSICAL",
                     help="run a plan device on a present one, e.g. cuda:0=cpu (repeatable)")


def add_caps_and_pins(sub: argparse.ArgumentParser) -> None:
    """``--memory DEVICE=SIZE`` and ``--pin GLOB=DEVICE`` (each repeatable), as plan and fit take them."""
    sub.add_argument("--memory", action="append", default=[], metavar="DEVICE=SIZE",
                     help="cap a device below its profile, e.g. cuda:0=2GB (repeatable)")
    sub.add_argument("--pin", dest="pins", action="append", default=[], metavar="GLOB=DEVICE",
                     help="pin ops by name or module-path glob, e.g. 'emb*=cpu' (repeatable)")


def dynamic_names(text: str | None) -> tuple[str, ...] | None:
    """``--dynamic batch,seq`` as names; an empty value is an error."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise HetpartError(f"--dynamic {text!r}: expected comma-separated names, e.g. --dynamic batch,seq")
    return names


def _link_budget(items: list[str]) -> dict[str, int] | None:
    from cost_models.units import parse_bytes

    budget = {link: parse_bytes(size) for link, size in pairs(items, "--link-budget", "'cpu<->cuda:0=1GB'").items()}
    return budget or None


def add_folder_flags(sub: argparse.ArgumentParser) -> None:
    """``--dtype`` and ``--trust-remote-code``: how a model folder is built (plan, emit, check)."""
    sub.add_argument("--dtype", dest="folder_dtype", metavar="DTYPE", default=None,
                     help="a model folder: build, plan and load it in this dtype, e.g. bf16 (default: config.json's)")
    sub.add_argument("--trust-remote-code", action="store_true",
                     help="a model folder whose config.json names its own code (auto_map): run that code to build it")


def at_plan_inputs(loaded: Any, plan: Any, declared: list[str]) -> Any:
    """A model folder's LoadedModel with the inputs the plan was made for (unless ``--input-shape`` declared them)."""
    if loaded.folder is None or declared:
        return loaded
    import dataclasses

    folder = loaded.folder.for_plan(plan)
    return dataclasses.replace(loaded, folder=folder, example_inputs=folder.example_inputs())


def device_map_file(path: str | None) -> dict[str, Any] | None:
    """``--device-map map.json``: an accelerate device_map (module path -> GPU index or device), read from JSON."""
    if path is None:
        return None
    import json

    from partitioner.files import read_text

    try:
        data = json.loads(read_text(path, what="device_map file", max_bytes=2**24))
    except FileNotFoundError:
        raise HetpartError(f"--device-map {path}: no such file") from None
    except json.JSONDecodeError as err:
        raise HetpartError(f"--device-map {path}: not JSON ({err.msg} at line {err.lineno}); write the map as "
                           f'{{"model.embed_tokens": "cpu", "model.layers.0": 0}}') from None
    if not isinstance(data, dict):
        raise HetpartError(f"--device-map {path}: holds a JSON {type(data).__name__}, not an object of module "
                           f"path -> device")
    return data


#: The flags of ``hetpart plan`` and ``hetpart fit`` that set an option of the request
#: (:class:`partitioner.options.PlanOptions`): each flag's ``dest`` is its field's name, and this
#: table converts the flags whose parsed text is not the value itself.
FLAG_VALUES = {
    "memory": lambda items: pairs(items, "--memory", "cuda:0=2GB"),
    "pins": lambda items: pairs(items, "--pin", "'emb*=cpu'"),
    "coarsen": lambda text: {"on": True, "off": False}.get(text, text),
    "dynamic_shapes": dynamic_names,
    "link_budget": _link_budget,
    "device_map_pins": device_map_file,
}


def flag_options(args: argparse.Namespace, fields: Iterable[str] | None = None) -> dict[str, Any]:
    """The options the parsed flags set (every option whose ``dest`` the subcommand has, or those in ``fields``)."""
    from partitioner.options import FIELDS

    names = [n for n in (fields if fields is not None else FIELDS) if hasattr(args, n)]
    return {name: FLAG_VALUES.get(name, lambda v: v)(getattr(args, name)) for name in names}


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

    from partitioner.terminal import one_line

    parts = []
    for device, ops in plan.per_device_ops().items():
        if ops:
            bound = f" (bound to {one_line(binding[device])})" if binding.get(device, device) != device else ""
            parts.append(f"{one_line(device)} {len(ops)}{bound}")
    total = plan.predicted["total_s"]
    predicted = format_seconds(total) if total is not None else "n/a"
    streamed = f", {len(plan.weights)} streamed ({plan.stream_mode})" if plan.weights else ""
    return (f"{one_line(plan.model_name)}, {plan.op_count} ops: {', '.join(parts)}{streamed}; "
            f"predicted {predicted} per step on {one_line(plan.devices.name)}")


def pairs(items: list[str], flag: str, example: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; a malformed one is an error naming the flag and an example."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.rpartition("=")
        if not sep or not key or not value:
            raise HetpartError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} {example}")
        if key in out and out[key] != value:
            raise HetpartError(f"{flag} {key!r} is given twice ({key}={out[key]} and {key}={value}): "
                               f"give each {key!r} once")
        out[key] = value
    return out


def print_progress(report) -> None:  # noqa: ANN001 - a solvers.ilp.Progress
    from cost_models.units import format_seconds

    def show(value: float | None) -> str:
        return format_seconds(value) if value is not None else "-"

    gap = f"{report.gap:.2%}" if report.gap is not None else "-"
    print(f"  solving {report.seconds:5.1f} s: best {show(report.incumbent)}, bound {show(report.bound)}, gap {gap}",
          file=sys.stderr)


def fallback_fractions(text: str) -> tuple[float, ...]:
    """``--fallbacks 0.75,0.5``: fractions in (0, 1), checked by :func:`partitioner.plan.live.check_fractions`."""
    from partitioner.plan.live import check_fractions

    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated fractions, e.g. 0.75,0.5") from None
    try:
        return check_fractions(values)
    except HetpartError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def output_path(text: str, flag: str, *, force: bool) -> Path:
    """The path a command will write, checked before the work starts (see
    :func:`partitioner.files.check_output`): an empty path, a missing or read-only folder, a path
    under a regular file, a target that is not a regular file, or an existing one without
    ``--force`` fail at once."""
    from partitioner.files import check_output

    return check_output(text, force=force, flag=flag)


def add_input_shape(sub: argparse.ArgumentParser) -> None:
    """``--input-shape NAME=AxBxC`` (repeatable): static shapes for an ONNX model's symbolic inputs."""
    sub.add_argument("--input-shape", action="append", default=[], metavar="NAME=AxBxC",
                     help="ONNX models: the shape of an input with symbolic dimensions, e.g. input=1x3x224x224; "
                          "model folders: the shape of a forward input, e.g. input_ids=1x512 (default 1x128) "
                          "(repeatable)")


def input_shapes(items: list[str]) -> dict[str, tuple[int, ...]] | None:
    """``--input-shape`` flags as ``{name: shape}``; an error names the flag and shows the form."""
    if not items:
        return None
    out = {}
    for name, text in pairs(items, "--input-shape", "input=1x3x224x224").items():
        dims = text.lower().split("x") if text.lower() not in ("scalar", "") else []
        if not all(d.strip().isdigit() for d in dims):
            raise HetpartError(f"--input-shape {name}={text}: expected dimensions joined by x, e.g. "
                               f"--input-shape {name}=1x3x224x224")
        out[name] = tuple(int(d) for d in dims)
    return out


def add_inputs(sub: argparse.ArgumentParser) -> None:
    """``--input NAME=FILE.npy`` (repeatable): an input of an ONNX model as a numpy file."""
    sub.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input of the model as a .npy file (repeatable)")


def read_inputs(items: list[str]) -> dict[str, object]:
    """``--input`` flags as ``{name: numpy array}``; an unreadable file is an error naming it.

    Each file must be a regular file (a FIFO would block, ``/dev/zero`` read until memory runs out)
    no larger than this machine's memory (:func:`partitioner.files.open_input`)."""
    import numpy as np

    from partitioner.files import open_input

    out: dict[str, object] = {}
    for name, file in pairs(items, "--input", "x=x.npy").items():
        try:
            with open_input(file, what=f"--input {name} array (.npy)", max_bytes=_memory_bytes()) as f:
                out[name] = np.load(f, allow_pickle=False)
        except FileNotFoundError:
            raise HetpartError(f"--input {name}={file}: no such file") from None
        except HetpartError as err:
            raise HetpartError(f"--input {name}={file}: {err}") from None
        except (OSError, ValueError, EOFError) as err:
            raise HetpartError(f"--input {name}={file}: not a numpy .npy file ({err}); save it with "
                               f"numpy.save") from None
    return out


def _memory_bytes() -> int:
    """This machine's memory: no array of a file larger than it can be loaded."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 40


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
