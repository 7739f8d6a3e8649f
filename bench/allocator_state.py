"""A CPU training step with glibc's default allocator against one keeping freed memory.

Each model's emitted module (a single-CPU training plan, SGD) runs ``--rounds`` rounds of
``--repeat`` steps in a fresh process per allocator state; the table prints each round's median step.
With the default allocator a step's gradients are given back to the OS in some rounds and not
others (when they sit at the top of glibc's heap), and the next step faults them in again; with
:func:`cost_models.allocator.keep_freed_memory` every round runs in the reusing state, which is the
state ``hetpart profile`` measures in. Run it alone: other processes make torch's threads stall.

    python bench/allocator_state.py [--models dlrm,convnext] [--size small] [--rounds 3] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path[:0] = [{root!r}, {bench!r}]
if {keep}:
    from cost_models.allocator import keep_freed_memory
    state = keep_freed_memory()
    assert state.applied, state.reason
import models
from fidelity import step_fn, step_seconds
from partitioner import from_module, partition
module, inputs = models.get({name!r}, {size!r})
graph = from_module(module, inputs, name={name!r})
plan = partition(graph, None, "cpu", solver="single:cpu", training=True, optimizer="sgd")
emitted = plan.emit(module, example_inputs=inputs)
step = step_fn(emitted, inputs, training=True, optimizer="sgd")
print(json.dumps([step_seconds([step], repeat={repeat})[0] for _ in range({rounds})]))
"""


def rounds(name: str, size: str, keep: bool, n_rounds: int, repeat: int) -> list[float]:
    """Median step seconds of each round, in a fresh interpreter."""
    code = _CHILD.format(root=str(ROOT), bench=str(ROOT / "bench"), keep=keep, name=name, size=size,
                         repeat=repeat, rounds=n_rounds)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="dlrm,convnext,gpt")
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    table = [["model", "allocator", *(f"round {k + 1}" for k in range(args.rounds)), "spread"]]
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for keep in (False, True):
            got = rounds(name, args.size, keep, args.rounds, args.repeat)
            table.append([f"{name}:{args.size}", "keeps freed memory" if keep else "default",
                          *(f"{s * 1e3:.1f} ms" for s in got), f"{max(got) / min(got):.2f}x"])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    print(f"\neach cell: the median of {args.repeat} training steps (SGD) of the emitted single-CPU module, "
          f"one process per model and allocator state; spread: slowest round / fastest round")


if __name__ == "__main__":
    main()
