"""The plan's optional ``training_state`` section: where each parameter's weight, gradient and
optimizer state live, where its step runs, and how it is updated.

In: a training problem and its placement (:func:`training_state_record`), or the section of a plan
file (:func:`read_training_state`, checked field by field; :func:`check_training_state`, checked
against the plan's placement, parameters and devices). Out: the section as plain values, and
:func:`param_states`, one :class:`ParamState` per trainable parameter, which the emitted optimizer
and module read. Inference plans, and training plans written before the section existed, have no
section: every parameter then lives, and is stepped, where its op computes.

The section::

    training_state {"optimizer": "adam" | "adamw" | "sgd" | "sgd-momentum" | "adagrad" | "sparse-adam",
                    "delayed_update": false,       # true: the step of iteration t runs beside t+1 (opted in)
                    "params": {name: {"op": op,             # the op that owns it
                                      "compute": device,    # where the op computes (reads the weight)
                                      "weights": device,    # where the weight lives in forward and backward:
                                                            # the compute device (resident) or the host (streamed)
                                      "state": device,      # where its optimizer state lives between steps
                                      "step": device,       # where its gradient goes and its step runs (a float32
                                                            # master copy there when it is not "weights"); absent:
                                                            # "state". The host "state" with the computing
                                                            # accelerator's "step": the state is streamed there for
                                                            # the step and back
                                      "update": "dense" | "sparse",  # sparse: row-sparse gradient and step
                                      "exact": true}},      # the update equals the optimizer's dense update
                    "recompute": [op, ...],        # ops whose saved activations backward recomputes
                    "saved_on_host": {op: bytes},  # ops whose saved activations the host holds: copied out in
                                                   # forward, back in backward (absent: none)
                    "step": {"per_device_s": {device: s},   # optimizer-step time on each device
                             "hidden_s": s,                 # of it, what runs beside backward
                             "exposed_s": s,                # and what the step waits for after backward
                             "streamed_s": s,               # streamed states: their copies in and out and
                                                            # their steps, in all (absent: none)
                             "streamed_after_s": s}}        # latency: how long their chain runs past backward

``weights`` differs from ``compute`` only for a streamed parameter (the plan's ``weights``
mapping names its op too); ``step`` is ``weights`` or the host CPU; ``state`` is ``step``, or the
host where ``step`` is the weight's accelerator (a streamed state); ``update`` is ``sparse`` only
for a parameter read by one gather (embedding) op, and ``exact`` is false only for
``sparse-adam`` (``torch.optim.SparseAdam``'s lazy moments) or a delayed update. An op is in
``recompute`` or ``saved_on_host``, not both, and an op in ``saved_on_host`` computes on an
accelerator.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partitioner.plan.fields import FieldReader
    from partitioner.solvers.problem import Evaluation, Placement, Problem

__all__ = ["OPTIMIZERS", "ParamState", "TRAINING_STATE_KEYS", "check_training_state", "param_states",
           "read_training_state", "training_state_lines", "training_state_record"]

TRAINING_STATE_KEYS = ("optimizer", "delayed_update", "params", "recompute", "saved_on_host", "step")
PARAM_KEYS = ("op", "compute", "weights", "state", "step", "update", "exact")
#: optimizer names a training plan may carry (cost_models.training.Optimizer)
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adagrad", "sparse-adam")
UPDATES = ("dense", "sparse")
#: what a sparse-adam plan says when no parameter can update row-sparse
NO_TABLE = ("sparse-adam: no embedding table here updates row-sparse (no trainable gather owns its table alone), so "
            "every parameter steps with dense Adam")


@dataclasses.dataclass(frozen=True)
class ParamState:
    """Where one trainable parameter lives and is stepped (see the module docstring)."""

    name: str
    op: str
    compute: str
    weights: str
    state: str
    update: str = "dense"
    exact: bool = True
    step: str = ""            # where the step runs; "" (plans without the key): ``state``

    def __post_init__(self) -> None:
        if not self.step:
            object.__setattr__(self, "step", self.state)

    @property
    def streamed(self) -> bool:
        """The weight lives on another device than the one reading it (copied in both passes)."""
        return self.weights != self.compute

    @property
    def offloaded(self) -> bool:
        """Gradient, optimizer state and step live away from the weight (a master copy there)."""
        return self.step != self.weights

    @property
    def streamed_state(self) -> bool:
        """The optimizer state lives on the host and comes to the step's device for the step, and back."""
        return self.state != self.step

    @property
    def sparse(self) -> bool:
        return self.update == "sparse"


def training_state_record(problem: Problem, placement: Placement, evaluation: Evaluation) -> dict[str, Any]:
    """The ``training_state`` section of the plan of ``placement`` (empty: not a training plan)."""
    from partitioner.solvers.problem import node_dtypes
    from partitioner.solvers.train_state import step_split, streamed_trips

    if not problem.options.training or problem.options.pipeline is not None:
        return {}
    graph = problem.original
    params: dict[str, dict[str, Any]] = {}
    for n in problem.nodes:
        compute = placement.device[n]
        weights = placement.residence(n)
        step = placement.state_device(n)
        state = placement.state_home(n, problem.host)
        for op_name in problem.members[n]:
            op = graph.ops[op_name]
            sparse = op_name in problem.sparse_ops
            for pname in op.owned_params:
                param = graph.params[pname]
                if not param.trainable:
                    continue
                params[pname] = {"op": op_name, "compute": compute, "weights": weights, "state": state, "step": step,
                                 "update": "sparse" if sparse else "dense",
                                 "exact": not (sparse and not problem.sparse_exact) and not problem.options.delayed_update}
    recompute = [op for n in problem.nodes if n in placement.recompute for op in problem.members[n]]
    dtype = node_dtypes(problem, placement)
    saved_on_host = {op: b for n in problem.nodes if n in placement.saved_on_host
                     for op, b in zip(problem.saved_ops[n], problem.saved_parts_at[n][dtype[n]])}
    per_device, hidden, exposed = step_split(problem, placement, evaluation.critical_path_s, evaluation.total_s)
    step = {"per_device_s": per_device, "hidden_s": hidden, "exposed_s": exposed}
    if placement.streamed_state:
        trips, after = streamed_trips(problem, placement, evaluation.critical_path_s, node_dtypes(problem, placement))
        step["streamed_s"] = trips
        if problem.options.objective.value == "latency":  # the chain beside backward is latency's semantics
            step["streamed_after_s"] = after
    out = {"optimizer": problem.options.optimizer.value, "delayed_update": problem.options.delayed_update,
           "params": params, "recompute": recompute, "step": step}
    if saved_on_host:
        out["saved_on_host"] = saved_on_host
    return out


def read_training_state(r: FieldReader, value: Any) -> dict[str, Any]:
    """``training_state``: the section as written (see the module docstring); ``{}`` when absent."""
    if value == {}:
        return {}
    c = r.keys(r.mapping(value, "training_state"), "training_state", ("optimizer", "params"),
               ("delayed_update", "recompute", "saved_on_host", "step"))
    optimizer = r.string(c["optimizer"], "training_state.optimizer")
    if optimizer not in OPTIMIZERS:
        r.fail("training_state.optimizer", f"{optimizer!r} is not an optimizer hetpart plans; "
                                           f"use one of {', '.join(OPTIMIZERS)}")
    out: dict[str, Any] = {"optimizer": optimizer,
                           "delayed_update": r.boolean(c.get("delayed_update", False), "training_state.delayed_update"),
                           "params": r.string_map(c["params"], "training_state.params", lambda v, p: _param(r, v, p)),
                           "recompute": list(r.string_list(c.get("recompute", []), "training_state.recompute"))}
    if "saved_on_host" in c:
        out["saved_on_host"] = r.string_map(c["saved_on_host"], "training_state.saved_on_host",
                                            lambda v, p: _bytes(r, v, p))
    if "step" in c:
        s = r.keys(r.mapping(c["step"], "training_state.step"), "training_state.step",
                   ("per_device_s", "hidden_s", "exposed_s"), ("streamed_s", "streamed_after_s"))
        out["step"] = {"per_device_s": r.string_map(s["per_device_s"], "training_state.step.per_device_s", r.number),
                       "hidden_s": r.number(s["hidden_s"], "training_state.step.hidden_s"),
                       "exposed_s": r.number(s["exposed_s"], "training_state.step.exposed_s")}
        for key in ("streamed_s", "streamed_after_s"):
            if key in s:
                out["step"][key] = r.number(s[key], f"training_state.step.{key}")
    return out


def _bytes(r: FieldReader, value: Any, path: str) -> int:
    n = r.number(value, path)
    if n != int(n) or n <= 0:
        r.fail(path, f"{value!r} is not a positive whole number of bytes")
    return int(n)


def _param(r: FieldReader, value: Any, path: str) -> dict[str, Any]:
    c = r.keys(r.mapping(value, path), path, ("op", "compute", "weights", "state"), ("step", "update", "exact"))
    out = {k: r.string(c[k], f"{path}.{k}") for k in ("op", "compute", "weights", "state")}
    out["step"] = r.string(c.get("step", out["state"]), f"{path}.step")
    update = r.string(c.get("update", "dense"), f"{path}.update")
    if update not in UPDATES:
        r.fail(f"{path}.update", f"{update!r} is neither 'dense' nor 'sparse'")
    out["update"] = update
    out["exact"] = r.boolean(c.get("exact", True), f"{path}.exact")
    return out


def check_training_state(plan: Any, r: FieldReader) -> None:
    """The section agrees with the rest of the plan: a training plan of the same optimizer; every
    parameter is one its op owns; ``compute`` is where the plan places the op; ``weights`` is the
    compute device, or the device the plan's ``weights`` mapping streams the op from; ``step`` is
    ``weights`` or the host; ``state`` is ``step``, or the host where ``step`` is the accelerator
    holding the weight (a streamed state, dense and exact); a sparse update belongs to a gather op; recomputed ops are ops;
    ops holding saved activations on the host are ops on an accelerator, not recomputed."""
    section = plan.training_state
    if not section:
        return
    if not plan.training:
        r.fail("training_state", "an inference plan has no training state; re-plan with training=True")
    if section["optimizer"] != plan.optimizer:
        r.fail("training_state.optimizer", f"says {section['optimizer']!r} but the plan was made for "
                                           f"{plan.optimizer!r}")
    names = set(plan.devices.names())
    host = plan.devices.host_device().name
    for pname, ps in section["params"].items():
        path = f"training_state.params[{pname!r}]"
        op = ps["op"]
        if op not in plan.placement:
            r.fail(f"{path}.op", f"names {op!r}, which is not an op of the plan")
        if plan.param_names and pname not in plan.param_names.get(op, ()):
            r.fail(f"{path}.op", f"{op!r} does not own {pname!r} (it owns {', '.join(plan.param_names.get(op, ())) or 'nothing'})")
        for key in ("compute", "weights", "state", "step"):
            if ps[key] not in names:
                r.fail(f"{path}.{key}", f"{ps[key]!r} is not a device of the plan ({', '.join(sorted(names))})")
        if ps["compute"] != plan.placement[op]:
            r.fail(f"{path}.compute", f"says {ps['compute']} but the plan computes {op} on {plan.placement[op]}")
        expected = plan.weights.get(op, plan.placement[op])
        if ps["weights"] != expected:
            r.fail(f"{path}.weights", f"says {ps['weights']} but the plan keeps {op}'s weights on {expected}")
        if ps["step"] not in (ps["weights"], host):
            r.fail(f"{path}.step", f"{ps['step']} is neither where the weight lives ({ps['weights']}) nor the "
                                   f"host ({host}); re-plan rather than editing the file")
        if ps["state"] != ps["step"]:
            if ps["state"] != host or ps["step"] == host:
                r.fail(f"{path}.state", f"{ps['state']} differs from where the step runs ({ps['step']}): only a state "
                                        f"held on the host ({host}) may be streamed to the weight's accelerator for "
                                        f"its step; re-plan rather than editing the file")
            if ps["update"] == "sparse" or section.get("delayed_update"):
                r.fail(f"{path}.state", f"a streamed state steps densely and at once; this one is "
                                        f"{'sparse' if ps['update'] == 'sparse' else 'delayed'}: re-plan")
    for i, op in enumerate(section["recompute"]):
        if op not in plan.placement:
            r.fail(f"training_state.recompute[{i}]", f"names {op!r}, which is not an op of the plan")
    again = set(section["recompute"])
    for op in section.get("saved_on_host", {}):
        path = f"training_state.saved_on_host[{op!r}]"
        if op not in plan.placement:
            r.fail(path, f"names {op!r}, which is not an op of the plan")
        if op in again:
            r.fail(path, f"{op!r} is also in training_state.recompute: an op either recomputes its activations "
                         f"or holds them on the host; re-plan rather than editing the file")
        if plan.placement[op] == host:
            r.fail(path, f"{op!r} computes on the host ({host}), where its activations already are; re-plan "
                         f"rather than editing the file")


def param_states(plan: Any) -> dict[str, ParamState]:
    """One :class:`ParamState` per trainable parameter of a training plan; ``{}`` for a plan
    without the section (each parameter is then stepped where its op computes)."""
    section = plan.training_state
    if not section:
        return {}
    return {name: ParamState(name, **{k: ps[k] for k in PARAM_KEYS}) for name, ps in section["params"].items()}


def training_state_lines(plan: Any) -> list[str]:
    """The summary's lines: where optimizer state lives, what updates sparsely, what is recomputed,
    and how much of the step hides behind backward."""
    section = plan.training_state
    if not section:
        return []
    states = param_states(plan)
    where: dict[str, int] = {}
    for ps in states.values():
        kind = "streamed" if ps.streamed else ("offloaded" if ps.offloaded else "resident")
        key = (f"resident (state on {ps.state}, streamed to {ps.step} for the step)" if ps.streamed_state
               else f"{kind} (state on {ps.state})")
        where[key] = where.get(key, 0) + 1
    sparse = sum(ps.sparse for ps in states.values())
    lines = [f"  training   {section['optimizer']}: " + ", ".join(f"{n} params {k}" for k, n in sorted(where.items()))
             + (f"; {sparse} with row-sparse updates" if sparse else "")
             + ("; delayed update (step t beside t+1)" if section.get("delayed_update") else "")]
    if section["optimizer"] == "sparse-adam" and not sparse:
        lines.append(f"  note       {NO_TABLE}")
    step = section.get("step")
    if step:
        total = sum(step["per_device_s"].values())
        lines.append(f"  step       optimizer {total * 1e3:.3g} ms in all, {step['hidden_s'] * 1e3:.3g} ms beside "
                     f"backward, {step['exposed_s'] * 1e3:.3g} ms after it")
        if "streamed_s" in step:
            streamed = sum(ps.streamed_state for ps in states.values())
            after = (f", {step['streamed_after_s'] * 1e3:.3g} ms of it after backward"
                     if "streamed_after_s" in step else "")
            lines.append(f"  streamed   {streamed} params' state to and from the host for their steps: "
                         f"{step['streamed_s'] * 1e3:.3g} ms of copies and steps{after}")
    if section["recompute"]:
        lines.append(f"  recompute  {len(section['recompute'])} ops recompute their activations in backward")
    held = section.get("saved_on_host", {})
    if held:
        lines.append(f"  host-saved {len(held)} ops hold {sum(held.values()) / 2**20:.4g} MiB of saved activations on "
                     f"the host (copied out in forward, back in backward)")
    return lines
