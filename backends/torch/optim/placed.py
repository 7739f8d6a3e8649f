"""The placed optimizer: a ``torch.optim.Optimizer`` whose state lives, and whose step runs, where the plan says.

In: an emitted module, one :class:`~partitioner.plan.training_state.ParamState` per trainable
parameter (where its weight lives, where its gradient goes, its optimizer state lives and its step
runs, dense or row-sparse), the binding of logical devices to physical ones, the plan's optimizer
name and its hyperparameters. Out: :class:`PlacedOptimizer`.

How a step runs:

* **resident** parameters (state where the weight lives): torch's own optimizer class, one per
  (device, class), over the parameters themselves, stepped in :meth:`~PlacedOptimizer.step`;
* **offloaded** parameters (state on the host, weight on an accelerator): a float32 master copy on
  the state device, with its own torch optimizer. A post-accumulate-grad hook copies the gradient
  there as backward produces it (:mod:`.copies`: a side stream and an event on CUDA), frees the
  device gradient, and hands the parameter's step to a worker thread, so the CPU steps run beside
  the rest of backward; :meth:`~PlacedOptimizer.step` waits for them and copies the updated
  masters into the weights (the next forward reads them);
* **host-stepped** parameters whose weight lives on the host but is read elsewhere (streamed
  weights): the gradient arrives on the host already; the hook hands the step to the worker too;
* **streamed-state** parameters (state on the host, step on the weight's device): the hook steps
  them where the weight is, the state brought in for the step and sent back
  (:mod:`.streamed_state`: a side stream on CUDA), beside the rest of backward;
  :meth:`~PlacedOptimizer.step` makes the compute stream wait for them.

The optimizer is a real ``torch.optim.Optimizer``: ``param_groups`` are over the emitted module's
parameters (LR schedulers change them; each inner step reads its group's current values),
``state`` holds each parameter's state (the inner optimizers' own dicts, on their devices) keyed
as torch keys it, so ``state_dict()`` is torch's format (by parameter index) and
``load_state_dict()`` puts each tensor back on its state's device. A weight changed outside the
optimizer (``module.load_state_dict``) refreshes its master before the next step (the weight's
version counter says so).

Gradient accumulation: backward passes run inside ``with opt.accumulating():`` only add their
gradients (into the master's on the state device for offloaded parameters); the backward after
the block (or :meth:`~PlacedOptimizer.step` itself) starts the steps. A second gradient for a
parameter whose step has begun, before ``step()``, is an error, and so is ``zero_grad()`` then
(the step cannot be taken back). Gradient clipping over all gradients, or a ``GradScaler`` that
skips steps, needs every gradient before any step: not supported with offloaded parameters.

A one-step delayed update (``delayed_update`` in the plan, ZeRO-Offload's DPU, opted into when
planning): every parameter stepped on the host keeps a master there; the host step of iteration
t's gradients runs beside iteration t+1's forward and backward, and ``step()`` of iteration t puts
into those weights the masters as iteration t-1's step left them. So the forward of iteration t+1
reads weights updated with the gradients up to t-1 (the first step() leaves them as they are); the
other parameters step at once. It changes the training (the plan says ``exact: false``).

Example:
    >>> opt = plan.emit_optimizer(emitted, lr=1e-3)              # doctest: +SKIP
    >>> loss = emitted(*inputs).sum(); loss.backward()      # doctest: +SKIP
    >>> opt.step(); opt.zero_grad()                         # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from backends.torch.optim.copies import StateCopies
from backends.torch.optim.kinds import OptimizerKind, optimizer_kind
from backends.torch.optim.streamed_state import StreamedState
from partitioner.errors import HetpartError
from partitioner.plan.training_state import ParamState

__all__ = ["PlacedOptimizer", "StateRow", "StepTiming"]

_CURRENT_ATTR = "_hetpart_placed_optimizer"  # the module's newest placed optimizer (_Newest)


class _Newest:
    """A weak reference to a module's newest placed optimizer; a copied or unpickled module has none."""

    def __init__(self, optimizer: Any = None) -> None:
        self._ref = weakref.ref(optimizer) if optimizer is not None else None

    def get(self) -> Any:
        return self._ref() if self._ref is not None else None

    def __deepcopy__(self, memo: dict) -> _Newest:
        return _Newest()

    def __reduce__(self) -> tuple:
        return (_Newest, ())


@dataclasses.dataclass
class _Early:
    """One parameter stepped on the host by the worker as its gradient arrives."""

    name: str
    param: torch.nn.Parameter
    master: torch.Tensor | None      # float32 copy on the state device (None: the param lives there)
    place: ParamState
    inner: torch.optim.Optimizer
    group: int                       # index of its outer param group
    version: int = -1                # the weight's version when the master last matched it
    started: bool = False            # its step was handed to the worker since the last step()
    held: bool = False               # a gradient was accumulated (not stepped) since the last step()
    jobs: list[concurrent.futures.Future] = dataclasses.field(default_factory=list)
    pending: list[concurrent.futures.Future] = dataclasses.field(default_factory=list)  # delayed: last iteration's
    results: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # delayed: iteration -> master after it

    @property
    def target(self) -> torch.Tensor:
        """The tensor the inner optimizer steps."""
        return self.param if self.master is None else self.master


@dataclasses.dataclass
class _Resident:
    """Parameters of one device and torch class, stepped in step() over the parameters themselves."""

    device: str
    inner: torch.optim.Optimizer
    groups: list[int]                # outer group index of each inner group
    sparse: bool


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Where one step's host work went (wall-clock seconds, measured in the run)."""

    host_busy_s: float     # the worker's time in host steps (and gradient accumulation)
    host_hidden_s: float   # of it, what ran before step() was called (beside backward)
    step_call_s: float     # step() itself: resident steps, waiting for the host, copying weights back


@dataclasses.dataclass(frozen=True)
class StateRow:
    """Where one parameter's weight, gradient and optimizer state live, as found on the tensors."""

    name: str
    weights: str          # logical device of the weight
    state: str            # logical device of the optimizer state between steps (and of gradient and step,
                          # unless the state is streamed to the weight's device for its step)
    update: str           # "dense" | "sparse"
    state_bytes: int      # bytes of its optimizer state tensors (and master copy)
    found_on: str         # the physical device the state tensors are on ("" : no state yet)
    expected_on: str      # the physical device the plan's state device is bound to


class PlacedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` keeping each parameter's state on its planned device (see the module docstring).

    Parameters:
        module: the emitted module whose parameters it trains.
        places: parameter name (any of a tied tensor's names) -> where it lives and is stepped.
        binding: logical device -> physical device (``{"cpu": "cpu", "cuda:0": "cuda:0"}``).
        optimizer: the plan's optimizer (``"adam"``, ``"sgd"``, ...; :mod:`.kinds`).
        params: parameters or param groups of ``module`` (default: all its trainable parameters).
        delayed_update: the plan's one-step delayed update of the host-stepped parameters (see the
            module docstring).
        **hyper: hyperparameters of the torch class (``lr=1e-3``, ``betas=(0.9, 0.95)``).

    Raises:
        HetpartError: a parameter not of ``module``, one without a planned place, a hyperparameter
            the plan did not price, an unknown optimizer.
    """

    def __init__(self, module: torch.nn.Module, places: Mapping[str, ParamState], binding: Mapping[str, str],
                 optimizer: str, params: Iterable[Any] | None = None, *, delayed_update: bool = False,
                 **hyper: Any) -> None:
        self.delayed = bool(delayed_update)
        self._iteration = 0
        self._ready = False
        self._names = _names_by_tensor(module)
        self._places = self._places_by_tensor(module, places)
        sparse = any(p.sparse for p in self._places.values())
        self.kind: OptimizerKind = optimizer_kind(optimizer, hyper, sparse=sparse)
        self.physical = {d: torch.device(p) for d, p in binding.items()}
        self.copies = StateCopies(self.physical)
        self.last_copies: dict[tuple[str, str, str], int] = {}
        self.last_timing = StepTiming(0.0, 0.0, 0.0)
        self._spans: list[tuple[float, float]] = []   # (start, end) of each worker job since the last step()
        self._early: dict[int, _Early] = {}
        self._resident: dict[tuple[str, type, bool], _Resident] = {}
        self._streamed: dict[int, StreamedState] = {}
        self._state_streams: dict[torch.device, Any] = {}  # CUDA: the side stream of streamed states per device
        self._where: dict[int, tuple[torch.optim.Optimizer, torch.Tensor]] = {}  # id(param) -> inner, target
        self._hooks: list[Any] = []
        self._accumulating = False
        self._superseded = False
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        super().__init__(list(module.parameters()) if params is None else params, dict(self.kind.defaults))
        self._ready = True
        previous = getattr(module, _CURRENT_ATTR, _Newest()).get()
        if previous is not None:  # one optimizer's hooks per module: the newest one trains it
            previous._supersede()
        object.__setattr__(module, _CURRENT_ATTR, _Newest(self))
        for index in range(len(self.param_groups)):
            self._place_group(index)
        self._link_state()

    def _supersede(self) -> None:
        """A newer placed optimizer over the same module takes its hooks."""
        self._wait()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._superseded = bool(self._early)

    # -- building ---------------------------------------------------------------------------

    def _places_by_tensor(self, module: torch.nn.Module, places: Mapping[str, ParamState]) -> dict[int, ParamState]:
        out = {}
        for key, names in self._names.items():
            found = [places[n] for n in names if n in places]
            if found:
                out[key] = found[0]
        return out

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; the new group's parameters get their planned places."""
        for p in param_group["params"] if isinstance(param_group["params"], (list, tuple)) else [param_group["params"]]:
            if isinstance(p, torch.Tensor) and id(p) not in self._names:
                raise HetpartError("a parameter given to the placed optimizer is not one of the emitted module's: "
                                   "pass emitted.parameters() (the plan places only those)")
        super().add_param_group(param_group)
        if self._ready:
            self._place_group(len(self.param_groups) - 1)

    def _place_group(self, index: int) -> None:
        group = self.param_groups[index]
        for p in group["params"]:
            if not p.requires_grad:
                continue
            place = self._places.get(id(p))
            if place is None:
                raise HetpartError(f"parameter {self._names[id(p)][0]!r} has no place in the plan's training state: "
                                   f"emit the module from the plan the optimizer is built for")
            if any(d not in self.physical for d in (place.state, place.step, place.weights)):
                raise HetpartError(f"parameter {place.name!r} lives on {place.weights} with its state on "
                                   f"{place.state} (stepped on {place.step}), and the binding names only "
                                   f"{', '.join(self.physical)}")
            cls = self.kind.torch_class(place.sparse)
            host_step = self.physical[place.step].type == "cpu" and (place.offloaded or place.streamed)
            if place.streamed_state:
                self._add_streamed(p, place, cls, index)
            elif host_step:
                self._add_early(p, place, cls, index)
            else:
                self._add_resident(p, place, cls, index)

    def _add_early(self, p: torch.nn.Parameter, place: ParamState, cls: type, index: int) -> None:
        master = None
        if place.offloaded or self.delayed:  # delayed: the weight keeps last iteration's values meanwhile
            device = self.physical[place.step]
            pinned = p.device.type == "cuda"
            master = torch.empty(p.shape, dtype=torch.float32, device=device, pin_memory=pinned)
            with torch.no_grad():
                master.copy_(p.detach())
        target = p if master is None else master
        inner = cls([target], **self.kind.hyperparameters(cls, self.param_groups[index]))
        slot = _Early(self._names[id(p)][0], p, master, place, inner, index, version=p._version)
        self._early[id(p)] = slot
        self._where[id(p)] = (inner, target)
        self._hooks.append(p.register_post_accumulate_grad_hook(lambda param, s=slot: self._arrived(s)))

    def _add_resident(self, p: torch.nn.Parameter, place: ParamState, cls: type, index: int) -> None:
        key = (place.step, cls, place.sparse)
        hyper = self.kind.hyperparameters(cls, self.param_groups[index])
        resident = self._resident.get(key)
        if resident is None:
            resident = self._resident[key] = _Resident(place.step, cls([{"params": [p], **hyper}]), [index],
                                                       place.sparse)
        elif resident.groups[-1] == index:
            resident.inner.param_groups[-1]["params"].append(p)
        else:
            resident.inner.add_param_group({"params": [p], **hyper})
            resident.groups.append(index)
        self._where[id(p)] = (resident.inner, p)

    def _add_streamed(self, p: torch.nn.Parameter, place: ParamState, cls: type, index: int) -> None:
        if self.delayed or place.sparse:
            raise HetpartError(f"parameter {place.name!r}: a streamed optimizer state steps densely and at once, "
                               f"not {'delayed' if self.delayed else 'row-sparse'}; re-plan")
        inner = cls([p], **self.kind.hyperparameters(cls, self.param_groups[index]))
        slot = StreamedState(self._names[id(p)][0], p, place, inner, index, self.physical[place.state])
        self._streamed[id(p)] = slot
        self._where[id(p)] = (inner, p)
        self._hooks.append(p.register_post_accumulate_grad_hook(lambda param, s=slot: self._state_arrived(s)))

    def _state_arrived(self, slot: StreamedState) -> None:
        """The post-accumulate-grad hook of a streamed state: step it now, on the weight's device."""
        if slot.started:
            raise HetpartError(f"a second gradient for {slot.name!r} arrived before step(): its step began when the "
                               f"first one did; call step() after each backward, or run the backward passes to "
                               f"accumulate inside `with opt.accumulating():`")
        if self._accumulating:
            slot.held = True
            return
        self._stream_step(slot)

    def _stream_step(self, slot: StreamedState) -> None:
        slot.started, slot.held = True, False
        run = lambda inner, groups: self._step_inner(inner, groups, planned_sparse=False)  # noqa: E731
        with torch.no_grad():
            slot.step(dict(self.param_groups[slot.group]), run, self.copies, self._state_streams)

    # -- backward -----------------------------------------------------------------------------

    def _arrived(self, slot: _Early) -> None:
        """The post-accumulate-grad hook: the gradient of ``slot`` is complete for this backward."""
        p = slot.param
        if slot.started:
            raise HetpartError(f"a second gradient for {slot.name!r} arrived before step(): its step began when the "
                               f"first one did; call step() after each backward, or run the backward passes to "
                               f"accumulate inside `with opt.accumulating():`")
        if slot.master is not None:
            if p._version != slot.version:  # the weight changed outside the optimizer: refresh the master
                with torch.no_grad():
                    slot.master.copy_(p.detach())
                slot.version = p._version
            grad, event = self.copies.gradient(p.grad, slot.place.weights, slot.place.step)
            p.grad = None  # the device gradient is freed as soon as its copy ran
        else:
            grad, event = None, None
        step = not self._accumulating
        hyper = dict(self.param_groups[slot.group]) if step else None
        slot.started, slot.held = step, not step
        slot.jobs.append(self._submit(self._host_job, slot, grad, event, hyper, self._iteration))

    def _host_job(self, slot: _Early, grad: torch.Tensor | None, event: Any, hyper: dict | None,
                  iteration: int = 0) -> None:
        """On the worker: add the arrived gradient into the master's, then step when asked (delayed:
        keep what the step left, for the step() of the next iteration, and clear the master's
        gradient here, since zero_grad() no longer waits for the worker)."""
        if event is not None:
            event.synchronize()
        start = time.perf_counter()
        target = slot.target
        if grad is not None:
            target.grad = grad if target.grad is None else target.grad + grad
        if hyper is not None:
            self._step_inner(slot.inner, [hyper], planned_sparse=slot.place.sparse)
            if self.delayed:
                slot.results[iteration] = target.detach().clone()
                target.grad = None
        with self._lock:
            self._spans.append((start, time.perf_counter()))

    def _submit(self, fn: Any, *args: Any) -> concurrent.futures.Future:
        with self._lock:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetpart-step")
            return self._worker.submit(fn, *args)

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[PlacedOptimizer]:
        """Backward passes inside the block only add their gradients; none starts a step.

        Example:
            >>> for chunk in micro_batches[:-1]:            # doctest: +SKIP
            ...     with opt.accumulating():
            ...         emitted(*chunk).sum().backward()
            >>> emitted(*micro_batches[-1]).sum().backward()  # the steps start here
            >>> opt.step(); opt.zero_grad()
        """
        previous, self._accumulating = self._accumulating, True
        try:
            yield self
        finally:
            self._accumulating = previous

    # -- the step -------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step the resident parameters, wait for the host steps begun in backward (starting the
        ones whose gradients were only accumulated), copy the updated masters into the weights."""
        if self._superseded:
            raise HetpartError("a newer placed optimizer was built over this module and took over its gradient "
                               "hooks; step that one (build one optimizer per emitted module)")
        called = time.perf_counter()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for slot in self._early.values():  # gradients only accumulated: their steps start now
            if not slot.started and (slot.held or (slot.target.grad is not None and not self.delayed)):
                slot.started = True
                slot.jobs.append(self._submit(self._host_job, slot, None, None, dict(self.param_groups[slot.group]),
                                              self._iteration))
        for slot in self._streamed.values():  # gradients only accumulated (or no hook ran): their steps now
            if not slot.started and (slot.held or slot.param.grad is not None):
                self._stream_step(slot)
        for resident in self._resident.values():
            self._step_inner(resident.inner, [self.param_groups[i] for i in resident.groups],
                             planned_sparse=resident.sparse)
        for slot in self._streamed.values():
            slot.ready()
            slot.started = slot.held = False
        if self.delayed:
            self._delayed_weights()
        else:
            self._wait()
            for slot in self._early.values():
                if slot.started and slot.master is not None:
                    self.copies.weight(slot.param, slot.master, slot.place.step, slot.place.weights)
                    slot.version = slot.param._version
                slot.started = slot.held = False
        self._iteration += 1
        self.copies.weights_ready()
        self.last_copies = self.copies.reset()
        with self._lock:
            spans, self._spans = self._spans, []
        self.last_timing = StepTiming(sum(e - s for s, e in spans), sum(max(0.0, min(e, called) - s) for s, e in spans),
                                      time.perf_counter() - called)
        self._link_state()
        return loss

    def _delayed_weights(self) -> None:
        """The delayed update's step(): wait for the previous iteration's host steps only, put what
        they left into the weights; this iteration's keep running beside the next one."""
        previous = self._iteration - 1
        failure = None
        for slot in self._early.values():
            for job in slot.pending:
                try:
                    job.result()
                except Exception as exc:  # noqa: BLE001 - re-raised below, after every job ended
                    failure = failure or exc
            slot.pending, slot.jobs = slot.jobs, []
            result = slot.results.pop(previous, None)
            if result is not None:
                self.copies.weight(slot.param, result, slot.place.step, slot.place.weights)
                slot.version = slot.param._version
            slot.started = slot.held = False
        if failure is not None:
            raise failure

    @property
    def host_stepped(self) -> tuple[str, ...]:
        """Names of the parameters whose steps run on the host worker (a delayed update delays these)."""
        return tuple(slot.name for slot in self._early.values())

    def synchronize(self) -> None:
        """Wait for every host step and put the newest masters into the weights (a delayed update's
        last step, at the end of training); without a delayed update the weights are current already."""
        self._wait()
        for slot in self._early.values():
            if slot.results:
                newest = slot.results[max(slot.results)]
                self.copies.weight(slot.param, newest, slot.place.step, slot.place.weights)
                slot.version = slot.param._version
                slot.results.clear()
        self.copies.weights_ready()

    def _step_inner(self, inner: torch.optim.Optimizer, groups: list[Mapping[str, Any]], *,
                    planned_sparse: bool) -> None:
        """One torch step of ``inner`` with its groups' hyperparameters as the outer groups have them now."""
        cls = type(inner)
        for inner_group, outer in zip(inner.param_groups, groups):
            inner_group.update(self.kind.hyperparameters(cls, outer))
            for p in inner_group["params"]:
                if p.grad is not None:
                    p.grad = _fit_gradient(p.grad, cls, planned_sparse)
        inner.step()

    def _wait(self) -> None:
        """Wait for every job handed to the worker; re-raise the first failure."""
        failure = None
        for slot in self._early.values():
            jobs, slot.jobs, slot.pending = [*slot.pending, *slot.jobs], [], []
            for job in jobs:
                try:
                    job.result()
                except Exception as exc:  # noqa: BLE001 - re-raised below, after every job ended
                    failure = failure or exc
        for streamed in self._streamed.values():
            streamed.wait()
        if failure is not None:
            raise failure

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's ``zero_grad``, also for the masters' gradients on the state devices.

        Raises:
            HetpartError: steps began in backward and ``step()`` was not called yet.
        """
        begun = [s.name for s in [*self._early.values(), *self._streamed.values()] if s.started]
        if begun:
            raise HetpartError(f"zero_grad() before step(): the steps of {len(begun)} parameters ({begun[0]!r}, ...) "
                               f"began as their gradients arrived and cannot be taken back; call step() first, or "
                               f"run the backward inside `with opt.accumulating():`")
        if not self.delayed:  # a delayed update's host steps run on beside the next iteration
            self._wait()
        super().zero_grad(set_to_none=set_to_none)
        for slot in self._early.values():
            slot.held = False
            if slot.master is not None and slot.master.grad is not None and not self.delayed:
                if set_to_none:
                    slot.master.grad = None
                else:
                    slot.master.grad.zero_()

    # -- state ----------------------------------------------------------------------------------

    def _link_state(self) -> None:
        """``self.state[param]`` is the inner optimizer's own state dict of it (not a copy)."""
        state: defaultdict = defaultdict(dict)
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) in self._where:
                    inner, target = self._where[id(p)]
                    if inner.state.get(target):
                        state[p] = inner.state[target]
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """torch's format: ``{"state": {index: {...}}, "param_groups": [...]}``; tensors on their state devices."""
        self._wait()
        self._link_state()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of torch's format (this optimizer's, or torch's own class's over the
        same parameters); each state tensor goes to its parameter's state device, copied (a live
        optimizer's state dict is never aliased)."""
        self._wait()
        state_dict = copy.deepcopy(state_dict)
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, groups)):
            raise HetpartError("the state dict's param groups do not match this optimizer's (their number or sizes "
                               "differ): load one saved from an optimizer over the same parameters")
        by_index: dict[Any, torch.Tensor] = {}
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
            by_index.update(zip(saved["params"], group["params"]))
        wanted: dict[int, dict[Any, Any]] = defaultdict(dict)  # id(inner) -> {target id: state}
        inners: dict[int, torch.optim.Optimizer] = {}
        for index, value in state_dict["state"].items():
            p = by_index[index]
            if id(p) not in self._where:
                raise HetpartError(f"the state dict holds state for parameter {index}, which this optimizer does not "
                                   f"step (it does not require a gradient)")
            inner, target = self._where[id(p)]
            inners[id(inner)] = inner
            wanted[id(inner)][id(target)] = value
        for slot in self._early.values():
            inners[id(slot.inner)] = slot.inner
        for resident in self._resident.values():
            inners[id(resident.inner)] = resident.inner
        for streamed in self._streamed.values():
            inners[id(streamed.inner)] = streamed.inner
        for key, inner in inners.items():
            template = inner.state_dict()
            targets = [q for g in inner.param_groups for q in g["params"]]
            template["state"] = {i: wanted[key][id(q)] for i, q in enumerate(targets) if id(q) in wanted[key]}
            inner.load_state_dict(template)
        for streamed in self._streamed.values():  # torch put the state beside the weight: back to the host
            streamed.home()
        self._link_state()

    # -- where things are -----------------------------------------------------------------------

    def placement(self) -> list[StateRow]:
        """One row per trained parameter: its weight's and state's logical devices, and where its
        state tensors (and master copy) were found."""
        self._wait()
        rows = []
        for group in self.param_groups:
            for p in group["params"]:
                place = self._places.get(id(p))
                if place is None or not p.requires_grad:
                    continue
                inner, target = self._where[id(p)]
                tensors = [v for v in inner.state.get(target, {}).values()
                           if isinstance(v, torch.Tensor) and v.dim() > 0]
                if target is not p:
                    tensors.append(target)
                found = sorted({str(t.device) for t in tensors})
                rows.append(StateRow(place.name, place.weights, place.state, place.update,
                                     sum(t.numel() * t.element_size() for t in tensors), ", ".join(found),
                                     str(self.physical[place.state])))
        return rows

    def __repr__(self) -> str:
        early = sum(s.master is not None for s in self._early.values())
        return (f"PlacedOptimizer({self.kind.name}: {len(self._where)} parameters, {early} with state offloaded, "
                f"{len(self._streamed)} with state streamed)")


def _names_by_tensor(module: torch.nn.Module) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _fit_gradient(grad: torch.Tensor, cls: type, planned_sparse: bool) -> torch.Tensor:
    """The gradient in the layout its step takes: ``SparseAdam`` a row-sparse one (a dense gradient
    keeps the rows with any non-zero entry: eager's sparse embedding gradient but for a touched row
    whose gradient is exactly zero); a parameter the plan updates densely a dense one; SGD and
    Adagrad on a row-sparse parameter either (both steps are exact)."""
    if cls is torch.optim.SparseAdam:
        return grad if grad.is_sparse else grad.to_sparse(sparse_dim=1)
    if not planned_sparse and grad.is_sparse:
        return grad.to_dense()
    return grad
