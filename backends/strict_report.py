"""A strict-devices run beside its plan: copies per link and bytes per device against the plan's.

In: a plan, the copies one step made (:class:`~backends.strict_devices.Copy`, from the
:class:`~backends.strict_devices.StrictDevices` mode or recorded by a backend itself) and the bytes
resident on each logical device. Out: a :class:`DeviceReport`: one row per link (copies and bytes
made, beside the plan's transfers), one row per device (resident bytes beside the plan's parameter
bytes), every transfer only one side has, and the error that stopped the run if one did.

How copies become the plan's transfers (:func:`observed_transfers`): a streamed fetch of an op's
parameters is that op's ``weights`` transfer, another copy of a parameter a ``param`` transfer,
anything else an ``activation`` transfer, each keyed (tensor, from, to, kind) like
``plan.transfers``. An empty tensor moves no bytes and is no transfer (the plan omits it too).
Resident bytes are compared with the parameter bytes the plan puts on each device (each op's own,
where its weights live); the plan's memory figure, which adds activations and stream buffers, is
shown beside them. A training plan with a ``training_state`` section adds one row per parameter:
where the plan keeps its weight, gradient and optimizer state, beside what the run showed
(:mod:`backends.strict_training`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from backends.compare import _table
from backends.strict_devices import Copy
from cost_models.units import format_bytes

__all__ = ["DeviceReport", "DeviceRow", "LinkRow", "Observed", "ParamRow", "compare_with_plan", "observed_transfers",
           "planned_parameters", "planned_transfers", "training_table"]


# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinkRow:
    """Copies over one (source, destination) pair of logical devices in one step."""

    src: str
    dst: str
    copies: int          # transfers the program made (a streamed op's weights count once)
    bytes: int
    plan_copies: int     # transfers the plan records
    plan_bytes: int
    kind: str = ""       # "saved": saved activations copied to the host in forward (autograd's bytes, not
                         # the plan's count of the held ops' outputs: only whether they cross is compared)

    @property
    def ok(self) -> bool:
        if self.kind == "saved":
            return (self.copies > 0) == (self.plan_copies > 0)
        return (self.copies, self.bytes) == (self.plan_copies, self.plan_bytes)


@dataclasses.dataclass(frozen=True)
class DeviceRow:
    """What one logical device holds between steps."""

    device: str
    resident: int        # bytes of parameters and buffers living there
    plan_params: int     # the plan's parameter bytes there (its owners' residence)
    plan_used: int       # the plan's memory figure there (parameters, buffers, activations)

    @property
    def ok(self) -> bool:
        return self.resident == self.plan_params


@dataclasses.dataclass(frozen=True)
class Observed:
    """What a run showed of one parameter (None: not seen)."""

    weights: str | None = None    # logical device of the weight
    gradient: str | None = None   # "sparse" | "dense" (None: no gradient yet)
    state: str | None = None      # logical device of its optimizer state


@dataclasses.dataclass(frozen=True)
class ParamRow:
    """One parameter: the plan's devices and update, and what the run showed."""

    name: str
    op: str
    compute: str
    weights: str
    state: str            # where its optimizer state lives (and its gradient goes, unless ``step`` differs)
    update: str           # "dense" | "sparse"
    seen: Observed = Observed()
    step: str = ""        # where its step runs and its gradient goes ("": ``state``)

    @property
    def ok(self) -> bool:
        return ((self.seen.weights in (None, self.weights)) and (self.seen.gradient in (None, self.update))
                and (self.seen.state in (None, self.state)))


def training_table(rows: Sequence[ParamRow], seen: bool = True) -> list[str]:
    """The rows as a table (nothing for no rows); the run's columns when ``seen``."""
    if not rows:
        return []
    header = ["parameter", "op", "computes on", "weight on", "gradient to", "state on", "update"]
    if seen:
        header += ["weight seen", "gradient seen", "state seen", ""]
    table = [header]
    for r in rows:
        cells = [r.name, r.op, r.compute, r.weights, r.step or r.state, r.state, r.update]
        if seen:
            cells += [r.seen.weights or "-", r.seen.gradient or "-", r.seen.state or "-", "ok" if r.ok else "DIFFERS"]
        table.append(cells)
    return _table(table, indent="  ")


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    """A strict-devices run beside its plan: copies per link, bytes per device, differences."""

    binding: Mapping[str, str]              # logical device -> its CPU tag
    links: tuple[LinkRow, ...]
    devices: tuple[DeviceRow, ...]
    differences: tuple[str, ...]            # transfers only the run or only the plan has
    error: str = ""                         # the DeviceMismatch that stopped the run
    training: tuple[ParamRow, ...] = ()     # a training plan's state per parameter, beside the run's

    @property
    def passed(self) -> bool:
        return not self.error and not self.differences and all(r.ok for r in (*self.links, *self.devices,
                                                                                  *self.training))

    def to_text(self) -> str:
        """The tables ``hetpart check --strict-devices`` prints."""
        tags = ", ".join(f"{d}->{t}" for d, t in self.binding.items())
        lines = [f"strict devices: every logical device on its own CPU tag ({tags})"]
        if self.error:
            return "\n".join([*lines, f"  FAILED: {self.error}"])
        rows = [["link", "copies", "bytes", "plan copies", "plan bytes", ""]]
        rows += [[f"{r.src}->{r.dst}" + (" (saved activations)" if r.kind == "saved" else ""), str(r.copies), f"{r.bytes:,}", str(r.plan_copies), f"{r.plan_bytes:,}",
                  "ok" if r.ok else "DIFFERS"] for r in self.links]
        if len(rows) == 1:
            rows.append(["(none)", "0", "0", "0", "0", "ok"])
        lines += _table(rows, indent="  ")
        rows = [["device", "resident bytes", "plan parameter bytes", "plan memory (with activations)", ""]]
        rows += [[r.device, f"{r.resident:,}", f"{r.plan_params:,}", format_bytes(r.plan_used),
                  "ok" if r.ok else "DIFFERS"] for r in self.devices]
        lines += _table(rows, indent="  ")
        lines += training_table(self.training)
        lines += [f"  differs: {d}" for d in self.differences[:10]]
        if len(self.differences) > 10:
            lines.append(f"  ... and {len(self.differences) - 10} more")
        return "\n".join(lines)


TransferKey = tuple[str, str, str, str]   # (tensor, src, dst, kind)
#: the tensor name of the one row per link of saved activations copied to the host
SAVED = "saved activations"


def planned_transfers(plan: Any) -> dict[TransferKey, int]:
    """The plan's transfers per step that the module's forward makes, keyed (tensor, src, dst, kind),
    with their bytes: gradients out, updated weights back and streamed optimizer state are the
    placed optimizer's (``backends.torch.optim``), and a training plan's streamed weights cross twice per step, in
    forward and again in backward (``backends.torch.train_streaming``), of which strict devices
    watch the forward's; saved activations held on the host are one row per link, copied out in
    forward (their bytes are the plan's count of the held ops' outputs; a run copies what autograd
    saves, so only the row's presence is compared)."""
    passes = 2 if plan.training else 1
    out = {(t.tensor, t.src, t.dst, t.kind): t.bytes // passes if t.kind == "weights" else t.bytes
           for t in plan.transfers if t.src != t.dst and t.kind not in ("gradient", "update", "state", "saved")}
    host = plan.devices.host_device().name
    for t in plan.transfers:  # saved activations: the copies out, in forward (one row per link)
        if t.kind == "saved" and t.dst == host:
            key = (SAVED, t.src, t.dst, "saved")
            out[key] = out.get(key, 0) + t.bytes
    return out


def observed_transfers(plan: Any, copies: Iterable[Copy],
                       packed: Mapping[str, str] | None = None) -> dict[TransferKey, tuple[int, int]]:
    """A run's copies as the plan names transfers, each with (times made, bytes).

    Streamed fetches (``kind="weights"``) of an op's parameters are that op's ``weights``
    transfer (made once when no parameter was fetched twice), another copy of a parameter is a
    ``param`` transfer, the rest are ``activation`` transfers. Copies name parameters by their
    canonical names (the first of tied names in ``plan.param_names``); ``packed`` maps the names
    of a packed weight's tensors to the weight they stand for (each of them a parameter of its op).
    """
    owner = {name: op for op, names in plan.param_names.items() for name in names}
    owner.update({name: owner[weight] for name, weight in (packed or {}).items() if weight in owner})
    members: dict[TransferKey, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    nbytes: dict[TransferKey, int] = collections.defaultdict(int)
    for c in copies:
        op = owner.get(c.tensor)
        if c.kind == "saved":  # whatever autograd saved for the held ops, one row per link
            key = (SAVED, c.src, c.dst, "saved")
            members[key][c.tensor] += 1
            nbytes[key] += c.bytes
            continue
        if c.kind == "split":  # a split op's input out, or its other shard's output back (backends/torch/splits.py);
            # a time-split op's chunk fetches ("<op>.chunk<i>", backends/torch/chunked.py) and a batch split's
            # inputs out ("<op>.part<i>", backends/torch/split_batches.py): one transfer of the op
            op_name, dot, index = c.tensor.rpartition(".chunk")
            if not dot:
                op_name, dot, index = c.tensor.rpartition(".part")
            key = (op_name if dot and index.isdigit() else c.tensor, c.src, c.dst, "split")
        elif op is not None and c.kind == "weights":
            key = (op, c.src, c.dst, "weights")
        elif op is not None:
            key = (c.tensor, c.src, c.dst, "param")
        else:
            key = (c.tensor, c.src, c.dst, "activation")
        members[key][c.tensor] += 1
        nbytes[key] += c.bytes
    return {key: (max(members[key].values()), nbytes[key]) for key in members}


def planned_parameters(plan: Any) -> dict[str, int]:
    """Parameter bytes per device as the plan counts them: each op's own, where its weights live
    (an inference plan stores the weights of an op computing in 16 bits in half the bytes, and a
    packed weight in the bytes ``precision.weight_bytes`` gives)."""
    out = {d: 0 for d in plan.devices.names()}
    low = plan.precision.get("ops", {}) if plan.precision and not plan.training else {}
    packed = plan.precision.get("weight_bytes", {}) if plan.precision and not plan.training else {}
    from partitioner.plan.splits import expert_weight_op
    from partitioner.solvers.expert_streaming import entry_cuts_experts

    # a split of a fused experts op lists its bytes at its op; the view owning the fused weight holds them
    by_view = {expert_weight_op(plan, op, e): op for op, e in plan.splits.items() if entry_cuts_experts(e)}
    for op in plan.param_ops:
        nbytes = plan.op_bytes.get(op, (0, 0))[1]
        if op in by_view:
            entry = plan.splits[by_view[op]]
            for d, b in zip(entry["devices"], entry.get("bytes", (0, nbytes))):
                out[d] += b
            continue
        if op in plan.splits and entry_cuts_experts(plan.splits[op]):
            continue
        if op in packed:  # held packed (precision.weight_bytes)
            nbytes = packed[op]
        elif op in low:  # (streamed too: the host keeps it in its op's dtype)
            nbytes //= 2
        if "bytes" in plan.splits.get(op, {}):  # each shard where it lives (splits[op].bytes)
            for d, b in zip(plan.splits[op]["devices"], plan.splits[op]["bytes"]):
                out[d] += b
            continue
        out[plan.weights.get(op, plan.placement[op])] += nbytes
    return out


def compare_with_plan(plan: Any, binding: Mapping[str, str], copies: Sequence[Copy],
                      resident: Mapping[str, int], error: str = "",
                      packed: Mapping[str, str] | None = None) -> DeviceReport:
    """One step's copies and the resident bytes beside the plan's transfers and parameter bytes.

    Example:
        >>> compare_with_plan(plan, mode.binding, mode.copies, mode.resident(state)).passed   # doctest: +SKIP
        True
    """
    expected = planned_transfers(plan)
    observed = observed_transfers(plan, copies, packed)
    differences = []
    for key in sorted(set(expected) | set(observed)):
        tensor, src, dst, kind = key
        times, nbytes = observed.get(key, (0, 0))
        if key not in expected:
            differences.append(f"{kind} copy of {tensor} {src}->{dst} ({nbytes:,} B) is in the run, not in the plan")
        elif not times:
            differences.append(f"{kind} transfer of {tensor} {src}->{dst} ({expected[key]:,} B) is in the plan, "
                               f"not in the run")
        elif times > 1 and kind != "saved":
            differences.append(f"{kind} transfer of {tensor} {src}->{dst} is made {times} times in one step")
        elif nbytes != expected[key] and kind != "saved":  # autograd saves what backward reads, not the plan's count
            differences.append(f"{kind} transfer of {tensor} {src}->{dst}: {nbytes:,} B in the run, "
                               f"{expected[key]:,} B in the plan")
    links = []
    for src, dst in sorted({(k[1], k[2]) for k in (*expected, *observed) if k[3] != "saved"}):
        ours = [v for k, v in observed.items() if k[1:3] == (src, dst) and k[3] != "saved"]
        theirs = [b for k, b in expected.items() if k[1:3] == (src, dst) and k[3] != "saved"]
        links.append(LinkRow(src, dst, sum(t for t, _ in ours), sum(b for _, b in ours), len(theirs), sum(theirs)))
    for src, dst in sorted({(k[1], k[2]) for k in (*expected, *observed) if k[3] == "saved"}):  # each copy out
        ours = [c.bytes for c in copies if c.kind == "saved" and (c.src, c.dst) == (src, dst)]
        theirs = [t.bytes for t in plan.transfers if t.kind == "saved" and (t.src, t.dst) == (src, dst)]
        links.append(LinkRow(src, dst, len(ours), sum(ours), len(theirs), sum(theirs), "saved"))
    params = planned_parameters(plan)
    devices = tuple(DeviceRow(d, resident.get(d, 0), params.get(d, 0), plan.memory.get(d, {}).get("used", 0))
                    for d in binding)
    return DeviceReport(dict(binding), tuple(links), devices, tuple(differences), error)
