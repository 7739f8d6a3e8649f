"""``hetpart run``: run a folder of ONNX parts (from ``hetpart emit model.onnx``) on numpy inputs.

Each part runs in its own onnxruntime session with its device's provider (``--bind cuda:0=cpu``
runs a device's parts on the CPU provider). Prints every output's dtype, shape and range; with
``-o DIR`` also writes them as ``.npy`` files (the folder appears whole, never over an existing one
without ``--force``, and ``--force`` replaces only a folder of such outputs). Ctrl-C stops a running
part (exit status 130).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from partitioner.cli.args import add_bind, add_inputs, pairs, read_inputs
from partitioner.errors import HetpartError
from partitioner.files import FolderKind

#: a folder ``-o`` writes: ``<index>_<name>.npy`` files, nothing else (what ``--force`` may replace)
OUTPUTS = FolderKind(what="outputs of `hetpart run`", example="outputs",
                     owns=lambda name: re.fullmatch(r"[0-9]+_[A-Za-z0-9._-]*\.npy", name) is not None)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the subcommand to ``hetpart``'s parser."""
    rn = sub.add_parser("run", parents=[common], help="run a folder of ONNX parts on numpy inputs")
    rn.add_argument("parts", metavar="DIR", help="a folder written by `hetpart emit MODEL.onnx --plan PLAN -o DIR`")
    add_inputs(rn)
    rn.add_argument("--random", action="store_true",
                    help="feed seeded random values of the recorded shapes to the inputs not given with --input")
    add_bind(rn)
    rn.add_argument("-o", "--output", metavar="DIR", help="write each output as DIR/<index>_<name>.npy")
    rn.add_argument("--force", action="store_true", help="replace DIR if it exists and holds only outputs")
    rn.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from backends.onnx_parts import example_feeds, load_parts
    from partitioner.files import check_folder

    out_dir = Path(args.output) if args.output else None
    if out_dir is not None:
        check_folder(out_dir, force=args.force, kind=OUTPUTS)
    parts = load_parts(args.parts, pairs(args.bind, "--bind", "cuda:0=cpu") or None)
    feeds = read_inputs(args.input)
    declared = {name: (dtype, shape) for name, dtype, shape in parts.manifest.inputs}
    unknown = [n for n in feeds if n not in declared]
    if unknown:
        raise HetpartError(f"--input {unknown[0]}: the parts have no such input; their inputs are "
                           f"{', '.join(declared)}")
    missing = [(n, dtype, shape) for n, (dtype, shape) in declared.items() if n not in feeds]
    if missing and not args.random:
        name, dtype, shape = missing[0]
        raise HetpartError(f"input {name!r} ({dtype}, shape {'x'.join(map(str, shape)) or 'scalar'}) is not given: "
                           f"pass --input {name}=FILE.npy, or --random for seeded random values")
    feeds.update(example_feeds(missing))
    for name, value in feeds.items():
        dtype, shape = declared[name]
        if tuple(np.shape(value)) != tuple(shape):
            raise HetpartError(f"--input {name}: shape {np.shape(value)}, but the parts were made for {tuple(shape)}; "
                               "plan and emit the model again for other shapes")
    start = time.perf_counter()
    outputs = parts.run(feeds)
    seconds = time.perf_counter() - start
    bound = ", ".join(f"{d}->{p}" for d, p in parts.binding().items())
    print(f"ran {len(parts.manifest.parts)} parts of {parts.manifest.name} in {seconds * 1e3:.1f} ms ({bound})")
    for name, value in outputs.items():
        print("  " + _describe(name, value))
    if out_dir is not None:
        _write(outputs, out_dir, args.force)
        print(f"wrote {len(outputs)} outputs to {out_dir}")
    return 0


def _describe(name: str, value: object) -> str:
    import numpy as np

    shown = _printable(name)
    if not isinstance(value, np.ndarray):
        return f"{shown}: {type(value).__name__}"
    shape = "x".join(map(str, value.shape)) or "scalar"
    if value.size and np.issubdtype(value.dtype, np.number):
        return f"{shown}: {value.dtype} {shape}, min {value.min():.4g}, max {value.max():.4g}, mean {value.mean():.4g}"
    return f"{shown}: {value.dtype} {shape}"


def _printable(name: str) -> str:
    """A model's tensor name for a terminal: control characters stripped."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", name)


def _write(outputs: dict[str, object], folder: Path, force: bool) -> None:
    """Every output as ``<index>_<name>.npy`` (the name made file-safe), in a folder made whole or not at all."""
    import numpy as np

    from partitioner.files import write_folder

    def fill(tmp: Path) -> None:
        for i, (name, value) in enumerate(outputs.items()):
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]
            np.save(tmp / f"{i}_{safe}.npy", np.asarray(value), allow_pickle=False)

    write_folder(folder, fill, force=force, kind=OUTPUTS)
