"""Does the emitted training step train as eager training does? N optimizer steps, side by side.

In: a training plan, the model it was made for (real weights), its example inputs, a binding of
the plan's devices, the number of steps and the optimizer's hyperparameters. Out: a
:class:`TrainingCheckReport`: after each step, the loss of both and every parameter of the
emitted module (trained by the plan's :class:`~backends.torch.optim.PlacedOptimizer`) against the
original's (trained eagerly by torch's own optimizer, :mod:`backends.torch.optim.reference`),
each through :func:`backends.compare.compare`; where each parameter's optimizer state was found;
and the bytes the optimizer copied per link in the last step beside what the plan's
``training_state`` implies (a dense gradient out and the weight back for every offloaded
parameter; a row-sparse gradient's bytes depend on the rows a batch touches, so they are shown
without a planned figure). The verdict needs every step's loss and parameters within tolerance
(and, under strict devices, every forward's devices and copies as planned).

The loss is fixed: the sum over floating outputs of their mean (a mean keeps SGD's steps small
at any output size). A plan with a ``batch`` section runs its micro-batches, all but the last
inside ``opt.accumulating()``, the loss of each scaled by ``1 / steps``; the original runs the
whole batch.

With ``strict_devices`` each logical device is bound to its own CPU tag and every forward of the
emitted module runs under :class:`~backends.torch.strict.StrictRun`; after an optimizer step the
weights must still be where the plan keeps them (the step writes masters back in place), so the
next forward's check covers the step too. Nothing here prints.

Example:
    >>> report = check_training_steps(plan, model, inputs, {"cuda:0": "cpu:1"}, steps=3, lr=1e-3)   # doctest: +SKIP
    >>> report.passed                                                                             # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.compare import TensorError, _table, compare
from backends.strict_report import DeviceReport
from backends.torch.optim.placed import PlacedOptimizer, StateRow
from backends.torch.optim.reference import reference_optimizers
from backends.torch.strict import StrictRun
from cost_models.training import parse_optimizer
from cost_models.units import format_bytes
from partitioner.errors import DeviceMismatch, HetpartError
from partitioner.plan.training_state import param_states

__all__ = ["StepRow", "TrainingCheckReport", "check_training_steps", "training_loss"]


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One optimizer step of both: the loss before it, and the parameters after it."""

    step: int
    loss: TensorError                 # the loss of the step (before it), emitted vs eager
    params: tuple[TensorError, ...]   # every trained parameter after it
    loss_emitted: float
    loss_eager: float

    @property
    def passed(self) -> bool:
        return self.loss.passed and all(p.passed for p in self.params)

    @property
    def worst(self) -> TensorError:
        """The parameter furthest from eager (a failing one first)."""
        return max(self.params, key=lambda e: (not e.passed, e.max_rel))


@dataclasses.dataclass(frozen=True)
class CopyRow:
    """The optimizer's copies over one link in one step, beside the plan's."""

    what: str            # "gradient" | "weights"
    src: str
    dst: str
    bytes: int
    plan_bytes: int | None   # None: not predicted (row-sparse gradients)

    @property
    def ok(self) -> bool:
        return self.plan_bytes is None or self.bytes == self.plan_bytes


@dataclasses.dataclass(frozen=True)
class TrainingCheckReport:
    """The outcome of :func:`check_training_steps`; :meth:`to_text` is what ``hetpart check --steps`` prints."""

    model_name: str
    binding: Mapping[str, str]
    optimizer: str                         # the plan's optimizer
    eager: str                             # the torch classes eager training used
    hyper: Mapping[str, Any]               # the hyperparameters given
    steps: tuple[StepRow, ...]
    states: tuple[StateRow, ...]
    copies: tuple[CopyRow, ...]
    devices: DeviceReport | None = None    # strict devices: the last forward's copies and bytes

    @property
    def passed(self) -> bool:
        states_ok = all(_agrees(r) for r in self.states)
        return (all(s.passed for s in self.steps) and states_ok and all(c.ok for c in self.copies)
                and (self.devices is None or self.devices.passed))

    def to_text(self) -> str:
        bound = ", ".join(k if k == v else f"{k}->{v}" for k, v in self.binding.items())
        given = ", ".join(f"{k}={v!r}" for k, v in self.hyper.items()) or "torch's defaults"
        lines = [f"check {self.model_name}: {len(self.steps)} training steps, the emitted plan with its placed "
                 f"{self.optimizer} optimizer vs eager {self.eager} ({given}); loss = sum of output means; "
                 f"devices {bound}"]
        rows = [["step", "loss (emitted)", "loss (eager)", "loss err", "params ok", "worst parameter", "max abs",
                 "max rel", ""]]
        for s in self.steps:
            w = s.worst
            ok = sum(p.passed for p in s.params)
            rows.append([str(s.step), f"{s.loss_emitted:.6g}", f"{s.loss_eager:.6g}", f"{s.loss.max_abs:.3g}",
                         f"{ok}/{len(s.params)}", w.name, f"{w.max_abs:.3g}", f"{w.max_rel:.3g}",
                         "ok" if s.passed else "FAIL"])
        lines += _table(rows, indent="  ")
        lines.append("  optimizer state (where its tensors were found):")
        rows = [["weights on", "state on", "update", "params", "state bytes", "found on", "bound to", ""]]
        for key, group in _grouped(self.states).items():
            weights, state, update = key
            found = sorted({r.found_on for r in group if r.found_on})
            ok = all(_agrees(r) for r in group)
            rows.append([weights, state, update, str(len(group)), format_bytes(sum(r.state_bytes for r in group)),
                         ", ".join(found) or "-", group[0].expected_on, "ok" if ok else "DIFFERS"])
        lines += _table(rows, indent="    ")
        lines.append("  optimizer copies in the last step:")
        rows = [["what", "link", "bytes", "plan bytes", ""]]
        rows += [[c.what, f"{c.src}->{c.dst}", f"{c.bytes:,}", "row-sparse" if c.plan_bytes is None
                  else f"{c.plan_bytes:,}", "ok" if c.ok else "DIFFERS"] for c in self.copies]
        if len(rows) == 1:
            rows.append(["(none)", "-", "0", "0", "ok"])
        lines += _table(rows, indent="    ")
        if self.devices is not None:
            lines.append(self.devices.to_text())
        bad = [s.step for s in self.steps if not s.passed]
        if self.passed:
            lines.append(f"passed: loss and every parameter within tolerance after each of {len(self.steps)} steps; "
                         f"optimizer state and copies where the plan puts them")
        else:
            why = []
            if bad:
                why.append(f"steps {', '.join(map(str, bad))} differ from eager training")
            if not all(_agrees(r) for r in self.states):
                why.append("optimizer state found off its planned device")
            if not all(c.ok for c in self.copies):
                why.append("optimizer copies differ from the plan's")
            if self.devices is not None and not self.devices.passed:
                why.append("devices differ from the plan (strict devices)")
            lines.append("FAILED: " + "; ".join(why))
        return "\n".join(lines)


def _agrees(row: StateRow) -> bool:
    """The state tensors are on the physical device the state's logical device is bound to (a CPU
    tag names no index a tensor keeps: any CPU tensor agrees with it)."""
    if not row.found_on:
        return True
    expected = torch.device(row.expected_on)
    for found in row.found_on.split(", "):
        dev = torch.device(found)
        if dev.type != expected.type or (dev.type != "cpu" and dev.index != (expected.index or 0)):
            return False
    return True


def _grouped(rows: tuple[StateRow, ...]) -> dict[tuple[str, str, str], list[StateRow]]:
    out: dict[tuple[str, str, str], list[StateRow]] = {}
    for r in rows:
        out.setdefault((r.weights, r.state, r.update), []).append(r)
    return out


def training_loss(result: Any) -> torch.Tensor:
    """The check's loss: the sum over floating outputs of their mean, on the host."""
    parts = [t.float().mean().cpu() for t in pytree.tree_leaves(result)
             if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not parts:
        raise HetpartError("the model returns no floating-point output to make a loss from")
    return torch.stack(parts).sum()


def check_training_steps(plan: Any, model: torch.nn.Module, example_inputs: Any,
                         device_map: Mapping[str, str] | None = None, *, steps: int = 3,
                         strict_devices: bool = False, **hyper: Any) -> TrainingCheckReport:
    """Train the emitted module and the original side by side for ``steps`` steps (see the module docstring).

    Parameters:
        plan: a training plan.
        model: the model it was made for (deep-copied twice; the caller's is not trained).
        example_inputs: a tensor or a tuple of positional arguments.
        device_map: binds the plan's logical devices, e.g. ``{"cuda:0": "cpu:1"}``.
        steps: optimizer steps.
        strict_devices: each logical device on its own CPU tag; forwards checked op by op.
        **hyper: the optimizer's hyperparameters (``lr=1e-3``).

    Raises:
        HetpartError: an inference plan, ``steps`` below 1, hyperparameters the plan did not
            price, a ``device_map`` with ``strict_devices``.
    """
    if not plan.training:
        raise HetpartError(f"{plan.source} is an inference plan: --steps trains it; re-plan with --training")
    if steps < 1:
        raise HetpartError(f"steps must be at least 1, got {steps}")
    strict = StrictRun(plan) if strict_devices else None
    if strict is not None:
        if device_map:
            raise HetpartError("--strict-devices binds every device of the plan to its own CPU tag itself: drop --bind")
        device_map = strict.device_map
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    reference = copy.deepcopy(model).train()
    source = copy.deepcopy(model).train()
    micro = _micro_batches(plan, args)
    if strict is not None:
        with strict:
            emitted = strict.watch(plan.emit(source, device_map, example_inputs=micro[0]))
    else:
        emitted = plan.emit(source, device_map, example_inputs=micro[0])
    opt: PlacedOptimizer = plan.emit_optimizer(emitted, **hyper)
    # a delayed update (opted in): eager steps a shadow; the reference's host-stepped weights lag one step
    shadow = copy.deepcopy(reference) if opt.delayed else reference
    eager = reference_optimizers(shadow, opt.kind)
    lagging = set(opt.host_stepped) if opt.delayed else set()
    rows, devices = [], None
    for step in range(1, steps + 1):
        for o in eager:
            o.zero_grad()
        reference.zero_grad()
        ref_loss = training_loss(reference(*args))
        ref_loss.backward()
        _step_reference(reference, shadow, eager, lagging)
        opt.zero_grad()
        try:
            loss = _emitted_step(emitted, opt, micro, strict)
        except DeviceMismatch as exc:  # raised in a forward, before its backward started any step
            devices = strict.report(error=str(exc))
            strict = None  # the verdict is given; the numbers are still compared
            opt.zero_grad()
            loss = _emitted_step(emitted, opt, micro, None)
        if strict is not None:
            devices = strict.report()
        opt.step()
        trained = dict(emitted.named_parameters())
        params = tuple(compare(name, trained.get(name), p) for name, p in reference.named_parameters()
                       if p.requires_grad)
        rows.append(StepRow(step, compare("loss", loss.detach(), ref_loss.detach(), summed=True), params,
                            float(loss.detach()), float(ref_loss.detach())))
    return TrainingCheckReport(plan.model_name, {k: str(v) for k, v in opt.physical.items()},
                               opt.kind.name, " + ".join(type(o).__name__ for o in eager), dict(hyper), tuple(rows),
                               tuple(opt.placement()), _copy_rows(plan, emitted, opt), devices)


def _step_reference(reference: torch.nn.Module, shadow: torch.nn.Module, eager: list[torch.optim.Optimizer],
                    lagging: set[str]) -> None:
    """Eager's step; with a shadow (a delayed update), the shadow steps on the reference's gradients
    and the reference takes its weights, the ``lagging`` ones as they were before this step."""
    if shadow is reference:
        for o in eager:
            o.step()
        return
    params, shadows = dict(reference.named_parameters()), dict(shadow.named_parameters())
    for name, p in params.items():
        shadows[name].grad = p.grad
    before = {name: shadows[name].detach().clone() for name in lagging if name in shadows}
    for o in eager:
        o.step()
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(before.get(name, shadows[name]))


def _micro_batches(plan: Any, args: tuple) -> list[tuple]:
    if not plan.batch:
        return [args]
    from partitioner.micro_batches import split_micro_batches

    return list(split_micro_batches(args, plan.batch["accumulation_steps"]))


def _emitted_step(emitted: torch.nn.Module, opt: PlacedOptimizer, micro: list[tuple],
                  strict: StrictRun | None) -> torch.Tensor:
    """Forward and backward of every micro-batch (all but the last accumulating); the batch's loss."""
    total = torch.zeros(())
    for i, chunk in enumerate(micro):
        hold = opt.accumulating() if i + 1 < len(micro) else contextlib.nullcontext()
        with hold:
            if strict is not None:
                with strict:
                    out = strict.step(emitted, *chunk)
            else:
                out = emitted(*chunk)
            loss = training_loss(out) / len(micro)
            loss.backward()
        total = total + loss.detach()
    return total


def _copy_rows(plan: Any, emitted: torch.nn.Module, opt: PlacedOptimizer) -> tuple[CopyRow, ...]:
    """The last step's optimizer copies per link beside the plan's: each offloaded parameter's
    dense gradient out and its weight back; each streamed state in and back (the optimizer's
    state copies of the parameter's bytes each way)."""
    tensors = dict(emitted.named_parameters(remove_duplicate=False))
    expected: dict[tuple[str, str, str], int | None] = {}
    copies = parse_optimizer(plan.optimizer).state_copies
    for name, place in param_states(plan).items():
        p = tensors.get(name)
        if p is None or not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        if place.streamed_state:
            for key in (("state", place.state, place.step), ("state", place.step, place.state)):
                expected[key] = expected.get(key, 0) + copies * nbytes
            continue
        if not place.offloaded:
            continue
        grad_key = ("gradient", place.weights, place.state)
        if place.sparse:
            expected[grad_key] = None
        elif expected.get(grad_key, 0) is not None:
            expected[grad_key] = expected.get(grad_key, 0) + nbytes
        back = ("weights", place.state, place.weights)
        expected[back] = expected.get(back, 0) + nbytes
    rows = []
    for key in sorted(set(expected) | set(opt.last_copies)):
        rows.append(CopyRow(*key, opt.last_copies.get(key, 0), expected.get(key, 0)))
    return tuple(rows)
