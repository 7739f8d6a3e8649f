"""transformers architectures × hetpart's entry points: pass, mismatch or error (a correctness table).

Each architecture of :mod:`tests.e2e.architectures` (small configs, random weights, nothing
downloaded) is run through three entry points, each under caps that split it over the two devices
of ``h200-host`` (cpu, cuda:0), devices bound to distinct CPU tags where the entry point allows:

* **API**: ``partition(model, inputs)`` then ``check_plan`` (``plan.emit``, strict devices: every
  op reads its tensors on its planned device), inference and training (loss and every gradient);
* **compile**: ``torch.compile(model, backend="hetpart")`` under strict devices with a pin by
  module path, inference and training (outputs, gradients, one SGD step, buffers) against eager;
* **ONNX**: ``torch.onnx.export(..., dynamo=False)``, ``partition`` of the file, then
  ``plan.emit_onnx``'s parts checked against one whole-model onnxruntime session
  (:func:`backends.onnx_parts.check_parts`).

A cell is ``pass``, ``mismatch`` (ran, outputs or gradients differ) or ``error: <first line>``.
Not a timing bench: run it on a busy machine as well as an idle one.

Usage:
    PYTHONPATH=. python bench/architectures.py [NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from backends.compile.strict import StrictCompile
from backends.onnx_parts import check_parts
from backends.torch.check import check_plan
from partitioner import partition, partition_outcome
from tests.e2e.architectures import ARCHES, SplitCaps, tensors

PROFILE = "h200-host"
DEVICES = ("cpu", "cuda:0")
TOL = {"rtol": 1e-4, "atol": 1e-5}


class Mismatch(Exception):
    """The entry point ran and its results differ from the reference."""


class Positional(torch.nn.Module):
    """The model called with positional tensors, returning its output tensors (for export)."""

    def __init__(self, model: torch.nn.Module, keys: list[str]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(tensors(self.model(**dict(zip(self.keys, args)))))


def _caps(model: Any, inputs: Any, training: bool = False) -> dict[str, int]:
    single = partition_outcome(model, inputs, PROFILE, solver="single:cpu", training=training, optimizer="sgd")
    used = single.plan.memory["cpu"]["used"]
    cap = max(int(used * 0.85), max(single.problem.work_mem.values()) + 4096)
    return {"cpu": cap, "cuda:0": cap}


def _split(plan: Any) -> None:
    if set(plan.placement.values()) != set(DEVICES):
        raise Mismatch(f"the caps did not split the plan ({sorted(set(plan.placement.values()))})")


def api(name: str) -> None:
    model, kwargs = ARCHES[name].build()
    wrapped, inputs = Positional(model, list(kwargs)), tuple(kwargs.values())
    for training in (False, True):
        plan = partition(wrapped, inputs, PROFILE, memory=_caps(wrapped, inputs, training), training=training,
                         optimizer="sgd")
        _split(plan)
        report = check_plan(plan, wrapped, inputs, training=training, repeat=1, strict_devices=True)
        if not report.passed:
            differ = [e.name for e in report.failures()[:3]] or ["strict devices: " + _device_differences(report)]
            raise Mismatch(f"{'training' if training else 'inference'}: " + "; ".join(differ))


def _device_differences(report: Any) -> str:
    """The lines of the strict-devices report that differ from the plan (resident bytes, copies)."""
    lines = [line.split() for line in report.to_text().splitlines() if line.rstrip().endswith("DIFFERS")]
    return ", ".join(" ".join(words[:3]) for words in lines) or "see hetpart check --strict-devices"


def compile_(name: str) -> None:
    arch = ARCHES[name]
    for training in (False, True):
        torch._dynamo.reset()
        model, kwargs = arch.build()
        model.train(training)
        reference = copy.deepcopy(model)
        run = StrictCompile(DEVICES, host="cpu", options_for=SplitCaps())
        compiled = torch.compile(model, backend=run.backend, options={
            "devices": PROFILE, "device_map": run.device_map, "pins": dict([arch.pin]), "optimizer": "sgd",
            "training": training})
        with torch.set_grad_enabled(training):
            with run:
                got = tensors(compiled(**kwargs))
            expected = tensors(reference(**kwargs))
        what = "training" if training else "inference"
        _same(got, expected, f"{what} outputs")
        if not any(set(r.plan.placement.values()) == set(DEVICES) for r in run.backend.records):
            raise Mismatch(f"{what}: no graph was split")
        if training:
            sum(g.float().sum() for g in got).backward()
            sum(e.float().sum() for e in expected).backward()
            pairs = list(zip(model.parameters(), reference.parameters(), strict=True))
            _same([p.grad for p, q in pairs if q.grad is not None], [q.grad for _, q in pairs if q.grad is not None],
                  "gradients")
            torch.optim.SGD(model.parameters(), lr=0.1).step()
            torch.optim.SGD(reference.parameters(), lr=0.1).step()
            _same(list(model.parameters()), list(reference.parameters()), "parameters after one step")
            _same(list(model.buffers()), list(reference.buffers()), "buffers")


def onnx_(name: str) -> None:
    model, kwargs = ARCHES[name].build()
    wrapped, inputs = Positional(model, list(kwargs)), tuple(kwargs.values())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.onnx"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # a failed export prints its IR
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapped, inputs, str(path), input_names=list(kwargs), dynamo=False)
        plan = partition(str(path), None, PROFILE, memory=_caps(str(path), None))
        _split(plan)
        plan.emit_onnx(Path(tmp) / "parts", str(path))
        feeds = {k: v.numpy() for k, v in kwargs.items()}
        report = check_parts(plan, str(path), feeds, {"cuda:0": "cpu"}, repeat=1)
        if not report.passed:
            raise Mismatch("; ".join(e.name for e in report.failures()[:3]))


def _same(got: list, expected: list, what: str) -> None:
    if len(got) != len(expected):
        raise Mismatch(f"{what}: {len(got)} tensors, eager has {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g is None or not torch.allclose(g.float(), e.float(), **TOL):
            raise Mismatch(f"{what}: tensor {i} differs")


ENTRY_POINTS: dict[str, Callable[[str], None]] = {"API": api, "compile": compile_, "ONNX": onnx_}


def cell(entry: Callable[[str], None], name: str) -> str:
    """``pass``, ``mismatch: ...`` or ``error: <first line>`` for one architecture and entry point."""
    try:
        entry(name)
    except Mismatch as err:
        return f"mismatch: {err}"
    except Exception as err:  # noqa: BLE001 - the table reports every failure, whatever raised it
        first = (str(err).strip().splitlines() or [""])[0]
        return f"error: {type(err).__name__}: {first[:160]}"
    return "pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"architectures (default: all of {', '.join(ARCHES)})")
    args = parser.parse_args(argv)
    names = args.names or list(ARCHES)
    unknown = [n for n in names if n not in ARCHES]
    if unknown:
        parser.error(f"unknown architecture {', '.join(unknown)}; known: {', '.join(ARCHES)}")
    print("| architecture | " + " | ".join(ENTRY_POINTS) + " |")
    print("|---" * (len(ENTRY_POINTS) + 1) + "|")
    failed = 0
    for name in names:
        cells = [cell(entry, name) for entry in ENTRY_POINTS.values()]
        failed += sum(c != "pass" for c in cells)
        print(f"| {name} | " + " | ".join(c.replace("|", "/") for c in cells) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
