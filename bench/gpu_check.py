"""The GPU check: hetpart's emitted plans measured on a machine with an H200 (and on any CPU).

One script, under 5 minutes on the lent H200 machine, that first runs the GPU tests
(``pytest -m gpu tests/gpu``: the weight streamer on a real side stream, pinned host memory,
parameters on their planned devices, the seed case within its memory, detection; skipped without
CUDA) and prints their outcome, then prints one table of measurements and the targets with
whether each is met. Without CUDA it still runs: every device is bound to
the CPU, the model shrinks to ``small`` (unless ``--size base`` is forced) and the first line
says so; targets that need a GPU print ``n/a (no GPU)``.

Cases, on ``emb-transformer`` (at ``base``: a 1,048,576 x 1024 fp32 embedding, 8 blocks, batch
4 x 512 — the calibration scenario) unless said otherwise:

(a) ``all-GPU``: the model on ``cuda:0``, no cap — the reference for outputs and times;
(b) ``ILP[cap]``: ``partition(model, inputs, "h200-host", memory={"cuda:0": cap}, no_split=...)``
    then ``plan.emit(model)``, under two caps: "embedding + half the layers" (4,496,539,680 bytes
    at base) and "half the embedding" (2 GiB at base);
(c) ``greedy[cap]``: the ``greedy`` baseline's placement (accelerate's fill costed with
    ``dispatch_model``'s semantics, ``stream_mode`` sync) made a Plan and emitted the same way;
(d) ``accelerate[cap]``: accelerate's own ``infer_auto_device_map`` + ``dispatch_model``
    (``main_device=0``: modules mapped to the CPU execute on the GPU, as in the calibration run);
    only where ``import accelerate`` works — carry its wheels to the GPU machine and
    ``pip install --no-index --find-links WHEELS accelerate`` first;
(e) ``all-CPU``: the model on the host;
(g) ``compile[emb+half]``: the model as the user holds it (on the host) under
    ``torch.compile(model, backend=HetpartBackend(), options={"devices": "h200-host", "memory":
    {"cuda:0": cap}})``: the backend's own plan of dynamo's graph (predicted), its forward after
    warm-up against all-GPU, the plan's prediction and ``ILP[emb+half]`` (resident weights copied to
    the GPU once, streamed ones prefetched from pinned host copies); forward only;
(f) ``two-branch``: a ``makespan`` plan with the two branches pinned to different devices (the
    better of the two orientations by predicted makespan); the emitted module (overlapped) against
    the two branches each run alone and one after the other (sequential);
(g) ``onnx``: the model exported to ONNX, placed under the "embedding + half the layers" cap and run
    as onnxruntime parts, the GPU's on the CUDA provider where onnxruntime has it, against one
    whole-model CPU session and the plan's prediction (``bench/gpu_check_onnx.py``; ``--skip-onnx``).
(h) cost fidelity (``bench/gpu_fidelity.py``): ``hetpart calibrate`` of this host, the seed case
    profiled in place, planned under the "embedding + half the layers" cap with the calibrated
    profile and with the profiled model, and the ILP plan and every baseline emitted and measured:
    predicted against measured for each (``--skip-fidelity`` leaves it out, ``--fidelity-only``
    runs it alone).
(i) live state (``bench/gpu_live.py``): a blocker tensor takes all but 3 GiB of the GPU's free
    memory, ``hetpart plan --devices detect --fallbacks 0.5,0.25`` plans the seed case in a subprocess
    within what is left, and the plan runs here (probe, cap, predicted and peak memory, time,
    difference); a second blocker then makes the live module switch to a fallback (``--skip-live``).
(j) training under the cap (``bench/gpu_training.py``): the seed case's SGD step planned for the
    emb+half cap and run through ``plan.emit_optimizer`` (row-sparse embedding update, optimizer
    state where the plan puts it), beside all-GPU torch SGD and the calibration's 467 ms / 40.8 ms
    (``--skip-training``).
(k) generation (``bench/gpu_generation.py``): the Llama-3-8B shape at a 16 GB cap, the joint
    generation plan and the llama.cpp ``--fit`` pair through ``emit_generate``, prefill and decode
    tokens/s measured beside predicted (a small Llama on a CPU run; ``--skip-generation``).

For each: the plan's predicted time (the h200-host profile's prediction, also on CPU runs), the
forward time (wall time with ``torch.cuda.synchronize``, median of ``--repeat`` runs after
warm-up; slow cases get fewer runs, at least 5, to stay within the time budget), a training
step (forward, loss = sum of outputs, backward, SGD step) where it makes sense, the peak GPU
memory of the forward runs (``torch.cuda.max_memory_allocated``, resident weights included),
the largest output difference from (a), and the calibration measurement beside it.

    python bench/gpu_check.py [--size small|base] [--repeat 20] [--skip-accelerate] [--skip-tests] [--skip-onnx]
        [--skip-fidelity | --fidelity-only] [--skip-live] [--skip-training] [--skip-generation]

The exit status is 1 when a GPU test failed (the measurements still run), else 0.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import inspect
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import models
from cost_models.calibration import load_calibration
from cost_models.units import format_bytes, format_seconds
from backends.compile import HetpartBackend
from partitioner import Outcome, Plan, partition_outcome

ROOT = Path(__file__).resolve().parent.parent
MODEL = "emb-transformer"
TESTS_TIMEOUT_S = 300
CASE_BUDGET_S = 8.0  # a slow measurement gets fewer runs (at least MIN_REPEAT, at most --repeat) to fit this
MIN_REPEAT = 5
WARMUP = 2
#: GPU memory a plan may use above its cap: activations of batch 4 x 512 (8 MiB per d_model
#: tensor, 32 MiB per feed-forward tensor; SDPA keeps no score matrix), LOOKAHEAD + 1 streamed
#: block buffers (3 x 48 MiB) and allocator rounding. The calibration's prefetch run peaked
#: 152 MB above its 4.50 GB parameter cap.
ACTIVATION_RESERVE = 512 * 2**20
NO_GPU = "n/a (no GPU)"


# --------------------------------------------------------------------------------------------
# Environment and measuring
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Env:
    """Where this run executes and how much it measures."""

    cuda: bool                         # a CUDA device is present
    size: str                          # zoo size of the models
    repeat: int                        # timed runs per measurement (before the time budget)
    binding: dict[str, str] | None     # plan device -> present device (None: as planned)

    @property
    def gpu(self) -> torch.device:
        """The device standing in for ``cuda:0``."""
        return torch.device("cuda:0" if self.cuda else "cpu")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def timed(fn: Callable[[], Any], env: Env) -> float:
    """Median wall seconds of ``fn`` after warm-up; fewer runs (and one warm-up) when one run is slow."""
    one = float("inf")
    for _ in range(WARMUP):
        start = time.perf_counter()
        fn()
        env.sync()
        one = min(one, time.perf_counter() - start)
        if one > CASE_BUDGET_S / 8:  # slow: one warm-up run is enough
            break
    n = min(env.repeat, max(MIN_REPEAT, int(CASE_BUDGET_S / max(one, 1e-9))))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        env.sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclasses.dataclass(frozen=True)
class Forward:
    """One module's forward measurement."""

    seconds: float
    output: torch.Tensor      # on the host
    peak_bytes: int | None    # None without CUDA


def measure_forward(module: nn.Module, inputs: tuple, env: Env) -> Forward:
    """Forward time, output and peak GPU memory (resident weights included) of ``module``."""
    env.sync()
    if env.cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        output = module(*inputs)
        seconds = timed(lambda: module(*inputs), env)
    peak = torch.cuda.max_memory_allocated() if env.cuda else None
    return Forward(seconds, output.detach().float().cpu(), peak)


def measure_train_step(module: nn.Module, inputs: tuple, env: Env) -> float:
    """One SGD training step (loss = sum of outputs): median seconds. Changes the module's weights."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6)

    def step() -> None:
        module(*inputs).float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = timed(step, env)
    opt.zero_grad(set_to_none=True)
    return seconds


def release(env: Env) -> None:
    """Give back the memory of the case just measured."""
    gc.collect()
    if env.cuda:
        torch.cuda.empty_cache()


def clone(model: nn.Module, name: str, size: str, device: torch.device) -> nn.Module:
    """A copy of ``model`` built directly on ``device`` (no second host copy on the way)."""
    empty, _ = models.get(name, size, device="meta")
    empty = empty.to_empty(device=device)
    empty.load_state_dict(model.state_dict())
    return empty.eval()


# --------------------------------------------------------------------------------------------
# Rows of the table
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One measured case."""

    case: str
    placement: str = ""
    predicted_s: float | None = None
    fwd_s: float | None = None
    train_s: float | None = None
    peak_bytes: int | None = None
    err: float | None = None
    calibration: str = ""
    note: str = ""

    def cells(self) -> list[str]:
        def sec(value: float | None) -> str:
            return "-" if value is None else format_seconds(value)

        return [self.case, self.placement, sec(self.predicted_s), sec(self.fwd_s), sec(self.train_s),
                "-" if self.peak_bytes is None else format_bytes(self.peak_bytes),
                "-" if self.err is None else f"{self.err:.1g}", self.calibration, self.note]


HEADER = ["case", "placement", "predicted", "forward", "train step", "peak GPU", "max|err|", "calibration", "note"]


def print_table(rows: Sequence[Row]) -> None:
    table = [HEADER] + [r.cells() for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def placement_text(plan: Plan, binding: dict[str, str] | None) -> str:
    """``cpu 3 / cuda:0 158 ops, 25 streamed`` (``cuda:0->cpu`` where bound elsewhere)."""
    parts = []
    for device, ops in plan.per_device_ops().items():
        if ops:
            bound = (binding or {}).get(device, device)
            parts.append(f"{device if bound == device else f'{device}->{bound}'} {len(ops)}")
    streamed = f", {len(plan.weights)} streamed ({plan.stream_mode})" if plan.weights else ""
    return " / ".join(parts) + f" ops{streamed}"


def guarded(case: str, fn: Callable[[], Row]) -> Row:
    """Run one case; a failure becomes a row that says why (the other cases still run)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        return failed_row(case, exc)


# --------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------


def caps(model: nn.Module) -> dict[str, int]:
    """The calibration's two caps on cuda:0, for any size of the model.

    ``emb+half``: the embedding, half the blocks and half the head (4,496,539,680 B at base);
    ``half-emb``: half the embedding (2 GiB at base).
    """
    def nbytes(m: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    emb, layer, head = nbytes(model.emb), nbytes(model.layers[0]), nbytes(model.head)
    return {"emb+half": emb + len(model.layers) // 2 * layer + head // 2, "half-emb": emb // 2}


def run_plan(case: str, plan: Plan, model: nn.Module, inputs: tuple, env: Env, ref: torch.Tensor,
             calibration: str = "") -> Row:
    """Emit ``plan`` for ``model``, measure forward and a training step."""
    emitted = plan.emit(model, env.binding, example_inputs=inputs)
    fwd = measure_forward(emitted, inputs, env)
    train = measure_train_step(emitted, inputs, env)
    return Row(case, placement_text(plan, env.binding), plan.predicted["total_s"], fwd.seconds, train,
               fwd.peak_bytes, (fwd.output - ref).abs().max().item(), calibration)


def run_compiled(case: str, model: nn.Module, inputs: tuple, cap: int, env: Env, ref: torch.Tensor) -> Row:
    """``model`` (on the host) under ``torch.compile(backend=hetpart)`` capped at ``cap``: forward only."""
    backend = HetpartBackend()
    compiled = torch.compile(model, backend=backend, options={
        "devices": "h200-host", "memory": {"cuda:0": cap}, "device_map": env.binding or {}, "time_limit": 30})
    fwd = measure_forward(compiled, inputs, env)
    plans = [r.plan for r in backend.records]
    solve = sum(r.solve_s for r in backend.records)
    note = f"{len(plans)} graph(s), solved in {solve:.1f} s"
    return Row(case, " + ".join(placement_text(p, env.binding) for p in plans),
               sum(p.predicted["total_s"] for p in plans), fwd.seconds, None, fwd.peak_bytes,
               (fwd.output - ref).abs().max().item(), note=note)


def run_eager(case: str, module: nn.Module, inputs: tuple, env: Env, ref: torch.Tensor | None,
              predicted: float | None, calibration: str) -> tuple[Row, torch.Tensor]:
    """Measure ``module`` as it is (forward, then a training step)."""
    fwd = measure_forward(module, inputs, env)
    train = measure_train_step(module, inputs, env)
    device = str(next(module.parameters()).device)
    err = None if ref is None else (fwd.output - ref).abs().max().item()
    return Row(case, f"all on {device}", predicted, fwd.seconds, train, fwd.peak_bytes, err, calibration), fwd.output


def accelerate_status(env: Env, skip: bool) -> str:
    """Why case (d) does not run ("" when it does)."""
    if skip:
        return "skipped (--skip-accelerate)"
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return "skipped: accelerate is not installed (carry its wheels to the GPU machine)"
    if not env.cuda:
        return f"skipped: {NO_GPU}"
    return ""


def run_accelerate(case: str, model: nn.Module, inputs: tuple, cap: int, env: Env, ref: torch.Tensor,
                   predicted: float | None, calibration: str) -> Row:
    """accelerate's ``infer_auto_device_map`` + ``dispatch_model`` on a host copy of the model."""
    from accelerate import dispatch_model, infer_auto_device_map

    host = clone(model, MODEL, env.size, torch.device("cpu"))
    device_map = infer_auto_device_map(host, max_memory={0: cap, "cpu": "200GiB"}, no_split_module_classes=["Block"])
    kwargs: dict[str, Any] = {"main_device": 0}
    if "force_hooks" in inspect.signature(dispatch_model).parameters:
        kwargs["force_hooks"] = True  # an all-"cpu" map still executes on the GPU, streaming everything
    dispatched = dispatch_model(host, device_map, **kwargs)
    fwd = measure_forward(dispatched, tuple(t.to(env.gpu) for t in inputs), env)
    on_gpu = [name for name, d in device_map.items() if d not in ("cpu", "disk")]
    return Row(case, f"on GPU: {', '.join(on_gpu) or 'nothing'} (rest streamed)", predicted, fwd.seconds, None,
               fwd.peak_bytes, (fwd.output - ref).abs().max().item(), calibration,
               "training: n/a (offload hooks are for inference)")


def plan_outcome(meta: nn.Module, inputs: tuple, cap: int) -> Outcome:
    return partition_outcome(meta, inputs, "h200-host", memory={"cuda:0": cap},
                             no_split=models.entry(MODEL).no_split_classes, time_limit=60)


def greedy_plan(outcome: Outcome) -> Plan:
    solution, evaluation = outcome.baselines["greedy"]
    return Plan.from_solution(outcome.problem, solution, evaluation)


def two_branch_plan(env: Env) -> Plan:
    """The makespan plan with the branches pinned apart, the better of the two orientations."""
    meta, inputs = models.get("two-branch", env.size, device="meta")
    plans = [partition_outcome(meta, inputs, "h200-host", objective="makespan", time_limit=60,
                               pins={"branch_a*": a, "branch_b*": b}).plan
             for a, b in (("cuda:0", "cpu"), ("cpu", "cuda:0"))]
    return min(plans, key=lambda p: p.predicted["total_s"])


def run_two_branch(env: Env) -> tuple[list[Row], dict[str, float]]:
    """(f): each branch alone on its device, both one after the other, and the emitted plan."""
    plan = two_branch_plan(env)
    model, inputs = models.get("two-branch", env.size)
    (x,) = inputs
    homes = {name: branch_device(plan, name) for name in ("branch_a", "branch_b")}
    dev = {name: torch.device((env.binding or {}).get(home, home)) for name, home in homes.items()}
    branches = {name: copy.deepcopy(getattr(model, name)).to(dev[name]) for name in dev}
    alone = {name: timed_inference(lambda n=name: branches[n](x.to(dev[n])), env) for name in branches}
    order = sorted(branches, key=lambda n: dev[n].type != "cpu")  # the CPU branch first: nothing overlaps

    def sequential() -> None:
        for name in order:
            branches[name](x.to(dev[name]))
            env.sync()

    seq_s = timed_inference(sequential, env)
    emitted = plan.emit(model, env.binding, example_inputs=inputs)
    fwd = measure_forward(emitted, inputs, env)
    with torch.inference_mode():
        err = (fwd.output - model(*inputs)).abs().max().item()
    per_device = plan.predicted["per_device_s"]
    rows = [Row(f"two-branch {name} alone", f"on {homes[name]}", per_device.get(homes[name]), alone[name])
            for name in branches]
    rows.append(Row("two-branch sequential", "CPU branch, then GPU branch", None, seq_s))
    rows.append(Row("two-branch emitted", placement_text(plan, env.binding), plan.predicted["total_s"], fwd.seconds,
                    None, fwd.peak_bytes, err, "", "overlapped (makespan plan)"))
    return rows, {"max_branch": max(alone.values()), "emitted": fwd.seconds, "sequential": seq_s}


def branch_device(plan: Plan, branch: str) -> str:
    """The one device computing every op of ``branch`` (its ops are pinned together)."""
    devices = {plan.placement[op] for op, path in plan.modules.items()
               if path == branch or path.startswith(branch + ".")}
    if len(devices) != 1:
        raise ValueError(f"{branch} runs on {sorted(devices) or 'no device'}; its pins should keep it on one")
    return devices.pop()


def timed_inference(fn: Callable[[], Any], env: Env) -> float:
    with torch.inference_mode():
        return timed(fn, env)


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """One line of the targets: what, the measurement, the goal, and the verdict."""

    what: str
    measured: str
    goal: str
    verdict: str       # "yes", "NO", "1.04x calibration", "n/a (no GPU)", "not measured"

    def line(self) -> str:
        return f"  {self.what:<48} {self.measured:<10} {self.goal:<42} {self.verdict}"


def judged(what: str, measured: float | None, goal: str, met: bool | None, env: Env, shown: str = "") -> Target:
    """A pass/fail target; needs a GPU and a measurement."""
    shown = shown or ("-" if measured is None else format_seconds(measured))
    if not env.cuda:
        return Target(what, shown, goal, NO_GPU)
    return Target(what, shown, goal, "not measured" if met is None else "yes" if met else "NO")


def beside(what: str, measured: float | None, reference: float, env: Env) -> Target:
    """A calibration number printed beside the measurement, with their ratio (not pass/fail)."""
    shown = "-" if measured is None else format_seconds(measured)
    goal = f"calibration {format_seconds(reference)}"
    if not env.cuda:
        return Target(what, shown, goal, NO_GPU)
    return Target(what, shown, goal, "not measured" if measured is None else f"{measured / reference:.2f}x calibration")


def calibration_numbers() -> dict[str, float]:
    acc = {row["case"]: row["fwd_s"] for row in load_calibration("accelerate-h200.json")["rows"]}
    scenario = {row["plan"]: row for row in load_calibration()["scenario"]}
    return {
        "all_gpu": acc["all_gpu_uncapped"],
        "accelerate[emb+half]": acc["accelerate[emb+half_layers]"],
        "accelerate[half-emb]": acc["accelerate[below_emb]"],
        "prefetch": load_calibration("prefetch-h200.json")["prefetched_s"],
        "all_gpu_train": scenario["all_gpu"]["train_step_s"],
        "all_cpu": scenario["all_cpu"]["fwd_s"],
        "all_cpu_train": scenario["all_cpu"]["train_step_s"],
    }


def targets(rows: dict[str, Row], cap: dict[str, int], tb: dict[str, float], calib: dict[str, float],
            env: Env) -> list[Target]:
    """The brief's targets judged on this run, and the calibration numbers beside their cases."""
    def fwd(case: str) -> float | None:
        row = rows.get(case)
        return row.fwd_s if row else None

    gpu, cap1, cap2 = fwd("all-GPU"), fwd("ILP[emb+half]"), fwd("ILP[half-emb]")
    out = [beside("all-GPU forward", gpu, calib["all_gpu"], env),
           beside("accelerate[emb+half] forward", fwd("accelerate[emb+half]"), calib["accelerate[emb+half]"], env),
           beside("accelerate[half-emb] forward", fwd("accelerate[half-emb]"), calib["accelerate[half-emb]"], env),
           beside("ILP[emb+half] vs hand-written prefetch", cap1, calib["prefetch"], env),
           judged("ILP[emb+half] within 1.10x of all-GPU", cap1,
                  "<= 1.10x all-GPU" + (f" = {format_seconds(1.10 * gpu)}" if gpu else ""),
                  None if cap1 is None or gpu is None else cap1 <= 1.10 * gpu, env)]
    compiled = rows.get("compile[emb+half]")
    if compiled is not None and compiled.fwd_s is not None:
        out.append(judged("compile[emb+half] within 1.10x of ILP[emb+half]", compiled.fwd_s,
                          "<= 1.10x ILP[emb+half]" + (f" = {format_seconds(1.10 * cap1)}" if cap1 else ""),
                          None if cap1 is None else compiled.fwd_s <= 1.10 * cap1, env))
        predicted = compiled.predicted_s
        out.append(Target("compile[emb+half] vs its prediction", format_seconds(compiled.fwd_s),
                          "-" if predicted is None else f"predicted {format_seconds(predicted)}",
                          NO_GPU if not env.cuda or not predicted else f"{compiled.fwd_s / predicted:.2f}x predicted"))
        if gpu:
            out.append(Target("compile[emb+half] vs all-GPU", format_seconds(compiled.fwd_s),
                              f"all-GPU {format_seconds(gpu)}",
                              NO_GPU if not env.cuda else f"{compiled.fwd_s / gpu:.2f}x all-GPU"))
    for key, ilp_s, speedup in (("emb+half", cap1, 4.0), ("half-emb", cap2, 25.0)):
        measured = fwd(f"accelerate[{key}]")
        acc_s = measured or calib[f"accelerate[{key}]"]
        source = "measured" if measured else "calibration"
        out.append(judged(f"ILP[{key}] >= {speedup:g}x faster than accelerate", ilp_s,
                          f"<= {format_seconds(acc_s / speedup)} ({source} {format_seconds(acc_s)} / {speedup:g})",
                          None if ilp_s is None else ilp_s * speedup <= acc_s, env))
    for key in cap:
        row = rows.get(f"ILP[{key}]")
        peak = row.peak_bytes if row else None
        out.append(judged(f"ILP[{key}] peak GPU memory", None,
                          f"<= cap {format_bytes(cap[key])} + reserve {format_bytes(ACTIVATION_RESERVE)}",
                          None if peak is None else peak <= cap[key] + ACTIVATION_RESERVE, env,
                          shown="-" if peak is None else format_bytes(peak)))
    if tb:
        out.append(judged("two-branch overlapped within 10% of max(branch)", tb["emitted"],
                          f"<= 1.10x {format_seconds(tb['max_branch'])} "
                          f"(sequential {format_seconds(tb['sequential'])})",
                          tb["emitted"] <= 1.10 * tb["max_branch"], env))
    return out


# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=models.SIZES, help="model size (default: base with CUDA, small without)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (fewer when slow)")
    parser.add_argument("--skip-accelerate", action="store_true", help="do not run accelerate's dispatch_model")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the GPU tests first")
    parser.add_argument("--skip-onnx", action="store_true", help="leave out the ONNX case (g)")
    parser.add_argument("--skip-fidelity", action="store_true", help="leave out case (h), the cost fidelity")
    parser.add_argument("--fidelity-only", action="store_true", help="run case (h) alone")
    parser.add_argument("--skip-live", action="store_true", help="leave out case (i), the live device state")
    parser.add_argument("--skip-training", action="store_true",
                        help="leave out case (j), the seed case trained under its cap by the placed optimizer")
    parser.add_argument("--skip-generation", action="store_true",
                        help="leave out case (k), generation through the emitted prefill and decode loop")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    size = args.size or ("base" if cuda else "small")
    env = Env(cuda, size, max(1, args.repeat), None if cuda else {"cuda:0": "cpu"})
    started = time.perf_counter()
    print(first_line(env, forced=args.size is not None))
    if args.fidelity_only:
        fidelity(env)
        print(f"done in {time.perf_counter() - started:.0f} s")
        return 0
    tests_passed, tests_line = (True, "gpu tests: skipped (--skip-tests)") if args.skip_tests else run_gpu_tests()
    print(tests_line, flush=True)
    calib = calibration_numbers()
    rows, cap = emb_transformer_cases(env, calib, args.skip_accelerate)
    try:
        tb_rows, tb = run_two_branch(env)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        tb_rows, tb = [failed_row("two-branch", exc)], {}
    onnx = [] if args.skip_onnx else onnx_case(env, cap["emb+half"])
    print_table([*rows.values(), *tb_rows, *onnx])
    print("targets:")
    for target in targets(rows, cap, tb, calib, env):
        print(target.line())
    print(tests_line)
    if not args.skip_training:
        training_case(env)
    if not args.skip_generation:
        generation_case(env)
    if not args.skip_live:
        live_state(env)
    if not args.skip_fidelity:
        fidelity(env)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0 if tests_passed else 1


def run_gpu_tests() -> tuple[bool, str]:
    """``pytest -m gpu tests/gpu`` in a subprocess, before any measurement; its output is printed.

    Returns whether it passed (every test passed or was skipped) and its summary line.
    """
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
               str(ROOT / "tests" / "gpu")]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"gpu tests: FAILED (still running after {TESTS_TIMEOUT_S} s)"
    output = (done.stdout + done.stderr).rstrip()
    print(output)
    summary = output.splitlines()[-1] if output else "no output"
    return done.returncode == 0, f"gpu tests ({' '.join(command[2:5])}): {'passed' if done.returncode == 0 else 'FAILED'}: {summary}"


def training_case(env: Env) -> None:
    """Case (j): the seed case's SGD step under its cap through the placed optimizer (bench/gpu_training.py)."""
    from gpu_training import run_training   # bench/ is on the path when this runs as a script

    try:
        lines = run_training(env.size, env.cuda, lambda model: caps(model)["emb+half"])
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        lines = [f"(j) training FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"]
    for line in lines:
        print(line, flush=True)


def generation_case(env: Env) -> None:
    """Case (k): generation plans through the emitted loop, measured beside predicted (bench/gpu_generation.py)."""
    from gpu_generation import run_generation   # bench/ is on the path when this runs as a script

    try:
        lines = run_generation(small=not env.cuda, repeat=3, time_limit=60.0 if env.cuda else 20.0)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        lines = [f"(k) generation FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"]
    for line in lines:
        print(line, flush=True)


def live_state(env: Env) -> None:
    """Case (i): planned from the GPU's live state with a blocker holding most of it (bench/gpu_live.py)."""
    from gpu_live import run_live   # bench/ is on the path when this runs as a script

    try:
        lines = run_live(env.size, lambda fn: timed(fn, env))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        lines = [f"(i) live state FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"]
    for line in lines:
        print(line, flush=True)


def fidelity(env: Env) -> None:
    """Case (g): predicted against measured with both cost models (bench/gpu_fidelity.py)."""
    from gpu_fidelity import run_fidelity   # bench/ is on the path when this runs as a script

    try:
        lines = run_fidelity(env.size, lambda model: caps(model)["emb+half"], env.binding,
                             lambda fn: timed(fn, env))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        lines = [f"(g) cost fidelity FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"]
    for line in lines:
        print(line)


def emb_transformer_cases(env: Env, calib: dict[str, float],
                          skip_accelerate: bool) -> tuple[dict[str, Row], dict[str, int]]:
    """Cases (a) to (e): one row each, keyed by case name; and the two caps."""
    model, inputs = models.get(MODEL, env.size)
    meta, _ = models.get(MODEL, env.size, device="meta")
    cap = caps(model)
    print(f"model {MODEL}:{env.size}; caps on cuda:0: emb+half {cap['emb+half']:,} B, half-emb {cap['half-emb']:,} B; "
          f"activation reserve {format_bytes(ACTIVATION_RESERVE)}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    outcomes = {key: plan_outcome(meta, inputs, c) for key, c in cap.items()}
    predicted = {name: ev.total_s for name, (_, ev) in outcomes["emb+half"].baselines.items()}
    rows: dict[str, Row] = {}

    gpu_model = clone(model, MODEL, env.size, env.gpu)
    rows["all-GPU"], ref = run_eager("all-GPU", gpu_model, tuple(t.to(env.gpu) for t in inputs), env, None,
                                     predicted["single:cuda:0"], f"{format_seconds(calib['all_gpu'])} "
                                     f"(train {format_seconds(calib['all_gpu_train'])})")
    del gpu_model
    release(env)
    for key, outcome in outcomes.items():
        case = f"ILP[{key}]"
        calibration = f"prefetch {format_seconds(calib['prefetch'])}" if key == "emb+half" else ""
        rows[case] = guarded(case, lambda case=case, plan=outcome.plan, c=calibration: run_plan(
            case, plan, model, inputs, env, ref, c))
        release(env)
    for key, outcome in outcomes.items():
        case = f"greedy[{key}]"
        rows[case] = guarded(case, lambda case=case, o=outcome: run_plan(case, greedy_plan(o), model, inputs, env, ref))
        release(env)
    rows["compile[emb+half]"] = guarded("compile[emb+half]", lambda: run_compiled(
        "compile[emb+half]", model, inputs, cap["emb+half"], env, ref))
    torch._dynamo.reset()
    release(env)
    skip_reason = accelerate_status(env, skip_accelerate)
    for key, c in cap.items():
        case = f"accelerate[{key}]"
        greedy_s, calibration = outcomes[key].plan.baselines["greedy"].total_s, format_seconds(calib[case])
        if skip_reason:
            rows[case] = Row(case, predicted_s=greedy_s, calibration=calibration, note=skip_reason)
            continue
        rows[case] = guarded(case, lambda case=case, c=c, p=greedy_s, cal=calibration: run_accelerate(
            case, model, inputs, c, env, ref, p, cal))
        release(env)
    # last: its training step changes the model's weights
    calibration = f"{format_seconds(calib['all_cpu'])} (train {format_seconds(calib['all_cpu_train'])})"
    rows["all-CPU"], _ = run_eager("all-CPU", model, inputs, env, ref, predicted["single:cpu"], calibration)
    return rows, cap


def onnx_case(env: Env, cap: int) -> list[Row]:
    """Case (g), in its own module; a failure becomes a row that says why."""
    from gpu_check_onnx import onnx_rows

    try:
        return onnx_rows(env, cap, Row, timed)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports every case it can
        return [failed_row("onnx", exc)]


def failed_row(case: str, exc: Exception) -> Row:
    return Row(case, note=f"FAILED: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}")


def first_line(env: Env, *, forced: bool) -> str:
    if env.cuda:
        props = torch.cuda.get_device_properties(0)
        return (f"gpu_check: CUDA present ({props.name}, {format_bytes(props.total_memory)}); "
                f"size {env.size}; plans run as made (cpu + cuda:0)")
    size = f"size {env.size}" + (" (forced)" if forced else " (shrunk from base: no GPU; --size base forces it)")
    return (f"gpu_check: no CUDA: every plan device is bound to the CPU (cuda:0 -> cpu), {size}; "
            f"GPU-only targets print '{NO_GPU}'")


if __name__ == "__main__":
    raise SystemExit(main())
