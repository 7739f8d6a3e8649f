"""Does the torch module emitted for a plan compute what the model computes?

In: a :class:`~partitioner.plan.Plan`, the model it was made for (with real weights), the inputs
to run both on, and a binding of the plan's logical devices to present ones
(``{"cuda:0": "cpu"}`` checks any plan on a CPU-only machine).
Out: a :class:`~backends.compare.CheckReport`: every output (in training also the loss, the sum
of the outputs, and every parameter's gradient) compared with :func:`~backends.compare.compare`
under its dtype's tolerance, and the median wall time of the original and of the emitted module.
The verdict needs every one of them: outputs, loss and gradients. A plan computing in 16 bits is
held to its 16-bit dtype's tolerance (:func:`computed_in`; :mod:`backends.compare`), or, where an
element crossed a kink (a ReLU's 0), to twice the norm-wise error torch.autocast makes on the
original in that dtype; float16 training unscales the gradients of the module's loss scaler before
comparing them.

A plan with a ``batch`` section (:mod:`partitioner.batching`) is checked at its global batch: the
original runs the whole batch at once, the emitted module runs the plan's micro-batches one after
another, its gradients accumulated (:mod:`backends.torch.training`) and its outputs concatenated;
inputs of another batch are rescaled along dimension 0 first.

With ``strict_devices`` the plan's logical devices are each bound to their own CPU tag and the
emitted module's forward runs under :class:`~backends.torch.strict.StrictRun`: the first op that
reads a tensor from another logical device fails the check, and the report adds the copies per
link and the bytes resident per device beside the plan's (:class:`~backends.strict_devices.DeviceReport`).
This is how a plan for a machine one does not have is checked device by device.

While the comparison runs, TF32 is switched off for CUDA matmuls and convolutions (and restored
afterwards), so float32 on a GPU is held to float32 tolerances. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.binding import bind_devices
from backends.compare import MISSING, CheckReport, PackedErrors, compare, interleaved_medians
from backends.strict_training import observe_params, param_rows
from backends.torch.precision import SCALER_ATTR
from backends.torch.strict import StrictRun
from partitioner.errors import DeviceMismatch, HetpartError, PlanMismatch

__all__ = ["check_plan"]


def check_plan(
    plan: Any,
    model: torch.nn.Module,
    example_inputs: Any,
    device_map: Mapping[str, str] | None = None,
    training: bool = False,
    repeat: int = 5,
    strict_devices: bool = False,
    build: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    weights: Any = None,
) -> CheckReport:
    """Run ``model`` and ``plan.emit(model, device_map)`` on the same inputs and compare them.

    Parameters:
        plan: the Plan.
        model: the model it was made for, with real weights. Inference runs it as given (its mode
            is not changed); training works on a deep copy put in train mode before emitting
            (export captures the mode), so the caller's model gets no gradients.
        example_inputs: a tensor or a tuple of positional arguments, on the host or anywhere.
        device_map: binds the plan's logical devices to present ones, e.g. ``{"cuda:0": "cpu"}``.
        training: compare the loss (sum of the outputs) and every parameter's gradient too.
        repeat: timed runs of each module, interleaved, after one warm-up run each.
        strict_devices: bind each logical device to its own CPU tag (no ``device_map`` then) and
            check the emitted module's devices op by op (see the module docstring).
        build: makes the module to compare from the reference (default: ``plan.emit``); another
            backend passes its own (``backends.compile`` compiles a copy with torch.compile).
        weights: a model folder (path or FolderModel) to emit from instead of the reference:
            the plan's module is then loaded from disk by the plan, and compared with ``model``.

    Raises:
        PlanMismatch: the model is not the one the plan was made for (in training: not as
            captured in train mode).
        HetpartError: a device of the plan is not present and not bound to one that is; a
            ``device_map`` or a ``build`` given with ``strict_devices``.

    Example:
        >>> report = check_plan(plan, model, inputs, {"cuda:0": "cpu"})   # doctest: +SKIP
        >>> report.passed                                                   # doctest: +SKIP
        True
    """
    if repeat < 1:
        raise HetpartError(f"repeat must be at least 1, got {repeat}")
    strict = StrictRun(plan) if strict_devices else None
    if strict is not None:
        if device_map:
            raise HetpartError("--strict-devices binds every device of the plan to its own CPU tag itself: "
                               "drop --bind (device_map)")
        if build is not None:
            raise HetpartError("strict devices check the module plan.emit builds; a build hook cannot be checked")
        device_map = strict.device_map
    binding = bind_devices(plan, device_map)
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    args, micro = _batch_inputs(plan, args)
    reference = copy.deepcopy(model).train() if training else model
    if strict is not None:
        with strict:  # building under the mode tags every parameter where the emitter put it
            emitted = strict.watch(_emit(plan, reference if weights is None else weights, device_map, micro, training))
    else:
        emitted = build(reference) if build is not None else \
            _emit(plan, reference if weights is None else weights, device_map, micro, training)
    sync = _synchronizer([*binding.values(), *(str(p.device) for p in model.parameters())])
    with _strict_float32():
        run = _training_step if training else _inference
        run_emitted = _accumulated(plan.batch["accumulation_steps"], run) if plan.batch else run
        ref_outs, ref_grads = run(reference, args)
        devices = None
        if strict is None:
            emit_outs, emit_grads = run_emitted(emitted, args)
        else:
            try:
                emit_outs, emit_grads = run_emitted(emitted, args, call=lambda m, a: _strict_forward(strict, m, a))
                devices = strict.report()
                if training and plan.training_state:  # where each weight, gradient and state lives
                    seen = observe_params(strict.mode, emitted, plan)
                    devices = dataclasses.replace(devices, training=tuple(param_rows(plan, seen)))
            except DeviceMismatch as exc:  # the verdict; the numbers are still compared
                devices = strict.report(error=str(exc))
                emit_outs, emit_grads = run_emitted(emitted, args)
        via = computed_in(plan)
        packed = _packed_errors(plan, reference, device_map, micro, args, ref_outs, emit_outs) \
            if plan.precision and plan.precision.get("weights") and not training else None
        if packed is not None:  # held to the same packing unplaced (bfloat16 kernels), not to autocast's noise
            packed, ref_outs = packed
            via = torch.bfloat16
        ac_outs, ac_grads = _autocast_reference(reference, args, via, run) \
            if via is not None and packed is None else ({}, {})
        outputs = tuple(compare(name, emit_outs.get(name), ref, computed_in=via, noise=ac_outs.get(name))
                        for name, ref in ref_outs.items())
        loss = grads = None
        if training:
            ac_loss = _loss(list(ac_outs.values())) if ac_outs else None
            loss = compare("loss", _loss(list(emit_outs.values())), _loss(list(ref_outs.values())), summed=True,
                           computed_in=via, noise=ac_loss)
            grads = tuple(compare(name, emit_grads.get(name, MISSING), ref, summed=True, computed_in=via,
                                  noise=ac_grads.get(name))
                          for name, ref in ref_grads.items() if ref is not None or emit_grads.get(name) is not None)
        original_s, emitted_s = interleaved_medians(
            [lambda: run(reference, args, keep=False), lambda: run_emitted(emitted, args, keep=False)], repeat, sync)
    errors = [*outputs, *([loss] if loss else []), *(grads or ())]
    return CheckReport(
        model_name=plan.model_name, binding=dict(binding), training=training, repeat=repeat,
        outputs=outputs, loss=loss, grads=grads or (), original_s=original_s, emitted_s=emitted_s,
        passed=all(e.passed for e in errors) and (devices is None or devices.passed), devices=devices,
        packed=packed,
    )


def _packed_errors(plan: Any, reference: torch.nn.Module, device_map: Mapping[str, str] | None, micro: tuple,
                   args: tuple, float_outs: Mapping[str, torch.Tensor],
                   emit_outs: Mapping[str, torch.Tensor]) -> tuple[PackedErrors, dict[str, torch.Tensor]]:
    """The whole-model reference of a plan with packed weights (the same linears packed the same
    way, every device bound to the host: no placement) and its outputs, and the relative error of
    the emitted module and of that reference against the float model."""
    unplaced = _emit(plan, reference, {d: "cpu" for d in plan.devices.names()}, micro, False)
    ref_outs, _ = _inference(unplaced, args)
    counts: dict[str, int] = {}
    for w in plan.precision["weights"].values():
        counts[w] = counts.get(w, 0) + 1
    budget = plan.precision.get("error", {}).get("max_error")
    errors = PackedErrors(counts, {n: _relative(emit_outs.get(n), f) for n, f in float_outs.items()},
                          {n: _relative(ref_outs.get(n), f) for n, f in float_outs.items()}, budget)
    return errors, ref_outs


def _relative(value: Any, original: torch.Tensor | None) -> float:
    """``||value - original|| / ||original||`` in float32 (inf where either is missing)."""
    if not isinstance(value, torch.Tensor) or not isinstance(original, torch.Tensor):
        return float("inf")
    a, b = value.detach().float().cpu(), original.detach().float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _batch_inputs(plan: Any, args: tuple) -> tuple[tuple, tuple]:
    """The inputs of the whole check and of one emitted call. A plan with a ``batch`` section is
    checked at its global batch (inputs of another batch are rescaled along dimension 0 by
    :func:`partitioner.batching.inputs_at_batch`); its module is emitted at one micro-batch."""
    if not plan.batch:
        return args, args
    from partitioner.batching import inputs_at_batch
    from partitioner.micro_batches import batch_size, micro_batch_inputs

    if batch_size(args) != plan.batch["global_batch"]:
        args = inputs_at_batch(args, plan.batch["global_batch"])
    return args, micro_batch_inputs(args, plan.batch["accumulation_steps"])


def _accumulated(steps: int, whole: Callable[..., tuple[dict, dict]]) -> Callable[..., tuple[dict, dict]]:
    """``whole`` (a training step or inference) run over ``steps`` micro-batches: the gradients
    accumulated (:func:`backends.torch.training.accumulate_gradients`; the check's loss is a sum,
    so not scaled) and the outputs concatenated along dimension 0."""
    from backends.torch.training import accumulate_gradients, concat_outputs
    from partitioner.micro_batches import split_micro_batches

    def run(module: torch.nn.Module, args: tuple, *, keep: bool = True, call: Forward = _call) -> tuple[dict, dict]:
        params = dict(module.named_parameters())
        if whole is _inference:
            with torch.no_grad():
                outs = tuple(call(module, chunk) for chunk in split_micro_batches(args, steps))
            return (_outputs(concat_outputs(outs)) if keep else {}), {}
        for p in params.values():
            p.grad = None
        step = accumulate_gradients(module, args, steps, lambda out, _: _loss(list(_outputs(out).values())),
                                    reduction="sum", keep_outputs=keep, forward=call)
        if not keep:
            return {}, {}
        outs = {k: v.detach() for k, v in _outputs(concat_outputs(step.outputs)).items()}
        return outs, {name: _dense(p.grad) for name, p in params.items() if p.requires_grad}

    return run


MAX_SKIPPED_STEPS = 40  # float16 training: overflowing steps skipped before the gradients are compared anyway


def computed_in(plan: Any) -> torch.dtype | None:
    """The 16-bit dtype whose tolerance a precision plan's results are held to: the loosest it
    computes in (bfloat16 before float16); None for a plan computing as traced."""
    dtypes = set(plan.precision.get("ops", {}).values()) if plan.precision else set()
    for name in ("bfloat16", "float16"):
        if name in dtypes:
            return getattr(torch, name)
    return None


def _autocast_reference(reference: torch.nn.Module, args: tuple, dtype: torch.dtype,
                        run: Callable[..., tuple[dict, dict]]) -> tuple[dict, dict]:
    """The original's outputs and gradients under torch.autocast in ``dtype`` (on a copy, on the
    device of its parameters): how far 16 bits alone move them from float32
    (:func:`backends.compare.compare`'s ``noise``). Empty where autocast cannot run there."""
    module = copy.deepcopy(reference)
    device = next((p.device.type for p in module.parameters()), "cpu")
    try:
        with torch.autocast(device, dtype=dtype):
            outs, grads = run(module, args)
    except RuntimeError:  # autocast without this dtype on this device: the elementwise rule alone
        return {}, {}
    return ({k: v.float() for k, v in outs.items()},
            {k: v.float() for k, v in grads.items() if isinstance(v, torch.Tensor)})


def _strict_forward(strict: StrictRun, module: torch.nn.Module, args: tuple) -> Any:
    """One forward under strict devices (backward, if any, runs outside: see backends.torch.strict)."""
    with strict:
        return strict.step(module, *args)


def _emit(plan: Any, reference: Any, device_map: Mapping[str, str] | None, args: tuple,
          training: bool) -> torch.nn.Module:
    """``plan.emit`` of the reference (in train mode for a training check: export captures the mode)."""
    try:
        return plan.emit(reference, device_map, example_inputs=args)
    except PlanMismatch as exc:
        if not training:
            raise
        raise PlanMismatch(f"{exc}\nnote: a training check captures the model in train mode; batch norm and "
                           "dropout capture other ops then, so the plan must come from the model in train mode"
                           ) from None


def _outputs(result: Any) -> dict[str, torch.Tensor]:
    """The tensors of a module's result, named ``output`` (one) or ``output[i]`` (several)."""
    leaves = [x for x in pytree.tree_leaves(result) if isinstance(x, torch.Tensor)]
    if len(leaves) == 1:
        return {"output": leaves[0]}
    return {f"output[{i}]": t for i, t in enumerate(leaves)}


def _loss(outputs: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """The sum of every floating-point output, on the host."""
    parts = [o.float().sum().cpu() for o in outputs if o is not None and o.is_floating_point()]
    return torch.stack(parts).sum() if parts else torch.zeros(())


Forward = Callable[[torch.nn.Module, tuple], Any]


def _call(module: torch.nn.Module, args: tuple) -> Any:
    return module(*args)


def _inference(module: torch.nn.Module, args: tuple, *, keep: bool = True, call: Forward = _call) -> tuple[dict, dict]:
    with torch.no_grad():
        result = call(module, args)
    return (_outputs(result) if keep else {}), {}


def _training_step(module: torch.nn.Module, args: tuple, *, keep: bool = True,
                   call: Forward = _call) -> tuple[dict, dict]:
    """Forward, loss = sum of outputs, backward; the outputs and ``{param name: grad}``."""
    params = dict(module.named_parameters())
    for p in params.values():
        p.grad = None
    scaler = getattr(module, SCALER_ATTR, None)
    for _ in range(MAX_SKIPPED_STEPS):
        outs = _outputs(call(module, args))
        loss = _loss(list(outs.values()))
        if scaler is None:
            loss.backward()
            break
        # float16 training: dynamic loss scaling; a step whose gradients overflow is skipped (the
        # scale backs off) and taken again, as GradScaler would on the next batch
        scaler.scale_loss(loss).backward()
        finite = scaler.unscale(params.values())
        scaler.update(finite)
        if finite:
            break
        for p in params.values():
            p.grad = None
    if not keep:
        return {}, {}
    grads = {name: _dense(p.grad) for name, p in params.items() if p.requires_grad}
    return {k: v.detach() for k, v in outs.items()}, grads


def _dense(grad: torch.Tensor | None) -> torch.Tensor | None:
    """A row-sparse gradient (an embedding the plan updates sparsely) as the dense one it equals."""
    return grad.to_dense() if grad is not None and grad.layout is not torch.strided else grad


def _synchronizer(devices: Sequence[str]) -> Callable[[], None]:
    """A function that waits for the CUDA devices among ``devices`` (a no-op without them)."""
    cuda = sorted({torch.device(d) for d in devices if torch.device(d).type == "cuda"}, key=str)
    if not cuda:
        return lambda: None

    def sync() -> None:
        for dev in cuda:
            torch.cuda.synchronize(dev)

    return sync


@contextlib.contextmanager
def _strict_float32() -> Iterator[None]:
    """TF32 off for CUDA matmuls and cuDNN convolutions inside the block; restored afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
