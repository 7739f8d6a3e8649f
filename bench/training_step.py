"""The emitted training step on this CPU, measured, beside the plan's predicted device times.

A model is planned for training on two logical devices that are both this machine's CPU (``cpu``
and its twin ``npu:0``, from a calibrated profile or the named profile's CPU; or ``--profile
h200-host``, whose ``cuda:0`` is bound to a CPU tag of its own, so predictions are the H200's), its
blocks pinned to the second device, part of its optimizer state offloaded to the host. The emitted
module is trained by the plan's placed optimizer (:mod:`backends.torch.optim`) and the original by
torch's, in interleaved runs (forward, backward, step, zero_grad each); the table gives

* the median step of each, and the plan's predicted step (``predicted.total_s``);
* per logical device the plan's predicted busy time (forward, backward and its optimizer step);
* the optimizer: the host's measured step time (the worker's busy time), how much of it ran before
  ``step()`` was called (beside backward) and how long ``step()`` took, beside the plan's
  ``training_state.step`` figures where the plan has them;
* the bytes the optimizer copied per link in a step.

Both logical devices run on this one CPU, so the measured step is to be read beside the *sum* of the
devices' predicted busy times (a row of its own): the prediction assumes they run side by side.

The accelerator is capped (``--cap``, a share of what the uncapped plan uses there) so that the ILP
moves optimizer state to the host; the plan's ``training_state`` section says where.
Timings mean something only when nothing else runs: the load average is printed at both ends.

    python bench/training_step.py                                 # gpt:small, adam, 7 runs
    python bench/training_step.py --model gpt:tiny --repeat 3     # a smoke run (seconds)
    python bench/training_step.py --model emb-transformer:small --optimizer sgd --cap 0.5
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import fnmatch
import statistics
import time

import torch

import models
from backends.torch.training_check import training_loss
from cost_models.profiles import DeviceKind, DeviceSet, Link, load_profile
from cost_models.units import format_bytes, format_seconds
from fidelity import load_note
from partitioner import partition


def twin_profile(base: DeviceSet) -> DeviceSet:
    """``cpu`` and ``npu:0``, both ``base``'s CPU; a copy between them is a copy in this CPU's memory."""
    cpu = base.device("cpu")
    twin = dataclasses.replace(cpu, name="npu:0", kind=DeviceKind.NPU)
    link = Link(("cpu", "npu:0"), cpu.mem_bandwidth, 1e-6, None, "same cpu")
    return DeviceSet("two-logical-cpus", (cpu, twin), (link,), source=f"{base.source} + npu:0 twin")


def _step(module: torch.nn.Module, opt: torch.optim.Optimizer, inputs: tuple) -> None:
    training_loss(module(*inputs)).backward()
    opt.step()
    opt.zero_grad()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt:small", help="zoo model and size (default gpt:small)")
    parser.add_argument("--optimizer", default="adam", help="the plan's optimizer (default adam)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--profile", default="twin",
                        help="'twin' (this CPU as cpu and npu:0; default) or a profile name (its cuda:0 bound to a "
                             "CPU tag of its own)")
    parser.add_argument("--calibrated", metavar="FILE.toml", help="the twin's CPU from this calibrated profile "
                                                                   "(default: h200-host's CPU, uncalibrated)")
    parser.add_argument("--cap", type=float, default=0.6,
                        help="cap the accelerator at this share of what the uncapped plan uses there, so that the "
                             "plan must move optimizer state to the host (default 0.6; 1 for no cap)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each, interleaved (median)")
    parser.add_argument("--costs", default="analytic",
                        help="analytic (the profile's roofline) or profiled (every op and the optimizer step measured "
                             "here first, through the binding)")
    args = parser.parse_args()

    print(f"training step on this CPU: torch {torch.__version__}, {torch.get_num_threads()} threads; {load_note()}")
    name, _, size = args.model.partition(":")
    model, inputs = models.get(name, size or "small")
    model.train()
    if args.profile == "twin":
        profile = twin_profile(load_profile(args.calibrated or "h200-host"))
        accelerator, binding = "npu:0", {"npu:0": "cpu:1"}
    else:
        profile = load_profile(args.profile)
        accelerator, binding = "cuda:0", {"cuda:0": "cpu:1"}
    modules = [n for n, _ in model.named_modules() if n]
    pins = {p: accelerator for p in ("blocks.*", "layers.*", "tok_emb*", "emb*", "transformer.h.*")
            if any(fnmatch.fnmatchcase(n, p) for n in modules)}  # the blocks and embeddings the zoo names
    plan = partition(model, inputs, profile, training=True, optimizer=args.optimizer, pins=pins,
                     costs=args.costs)
    if args.cap < 1:
        cap = int(args.cap * plan.memory[accelerator]["used"])
        plan = partition(model, inputs, profile, training=True, optimizer=args.optimizer, pins=pins,
                         memory={accelerator: cap}, costs=args.costs)
        print(f"{accelerator} capped at {format_bytes(cap)} ({args.cap:.0%} of what the uncapped plan uses there)")
    emitted = plan.emit(copy.deepcopy(model).train(), binding)
    opt = plan.emit_optimizer(emitted, lr=args.lr)
    reference = copy.deepcopy(model).train()
    eager_cls = opt.kind.dense
    eager = eager_cls(reference.parameters(),
                      **opt.kind.hyperparameters(eager_cls, {**opt.kind.defaults, "lr": args.lr}))

    runs: dict[str, list[float]] = {"eager": [], "emitted": []}
    timings = []
    for module, o in ((reference, eager), (emitted, opt)):
        _step(module, o, inputs)  # warm-up
    for _ in range(args.repeat):
        for label, module, o in (("eager", reference, eager), ("emitted", emitted, opt)):
            start = time.perf_counter()
            _step(module, o, inputs)
            runs[label].append(time.perf_counter() - start)
        timings.append(opt.last_timing)

    offloaded = sum(r.state != r.weights for r in opt.placement())
    print(f"{args.model}, {plan.optimizer}: {len(plan.placement)} ops on {', '.join(profile.names())} "
          f"({profile.name}); binding {binding}; {offloaded} of {len(opt.placement())} parameters' state on the host")
    measured = statistics.median(runs["emitted"])
    rows = [["", "predicted", "measured"],
            ["eager step (torch optimizer)", "-", format_seconds(statistics.median(runs["eager"]))],
            ["emitted step (placed optimizer)", format_seconds(plan.predicted["total_s"]), format_seconds(measured)]]
    for device, busy in plan.predicted.get("per_device_s", {}).items():
        rows.append([f"  {device} busy (forward, backward, step)", format_seconds(busy), "-"])
    step = plan.training_state.get("step") or {}
    host = plan.devices.host_device().name
    busy_sum = sum(plan.predicted.get("per_device_s", {}).values())
    rows.append(["  sum of the devices' busy times", format_seconds(busy_sum), format_seconds(measured)])
    predicted_host = step.get("per_device_s", {}).get(host)
    rows.append([f"  optimizer on {host} (worker busy)", format_seconds(predicted_host) if predicted_host is not None
                 else "-", format_seconds(statistics.median(t.host_busy_s for t in timings))])
    rows.append(["  of it beside backward", format_seconds(step["hidden_s"]) if step else "-",
                 format_seconds(statistics.median(t.host_hidden_s for t in timings))])
    rows.append(["  step() after backward", format_seconds(step["exposed_s"]) if step else "-",
                 format_seconds(statistics.median(t.step_call_s for t in timings))])
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    for (what, src, dst), nbytes in sorted(opt.last_copies.items()):
        print(f"  copied per step: {what} {src}->{dst} {format_bytes(nbytes)}")
    print(f"over the run: {load_note()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
