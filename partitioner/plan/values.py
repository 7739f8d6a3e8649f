"""The value types of a plan (solver, transfer, baseline records), its format constants and error.

In: numbers and names from a solve or from a decoded plan file. Out: frozen records whose optional
numbers are finite or ``None``; the constants that say what a ``format_version`` 1 file holds (see
:mod:`partitioner.plan` for the layout of the file).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cost_models.training import Optimizer
from partitioner.errors import HetpartError

#: The plan format this hetpart writes and reads.
FORMAT_VERSION = 1

#: The top-level keys of a plan file, in the order they are written.
TOP_LEVEL_KEYS: tuple[str, ...] = (
    "format_version", "model", "devices", "objective", "training", "optimizer", "placement",
    "weights", "stream_mode", "schedule", "transfers", "memory", "predicted", "solver", "baselines",
)
_MODEL_KEYS = ("name", "fingerprint", "op_count", "modules", "param_ops")
_TRANSFER_KEYS = ("tensor", "from", "to", "bytes", "seconds", "kind")
_SOLVER_KEYS = ("name", "status", "objective", "bound", "gap", "seconds")
_SOLVER_OPTIONAL = ("requested_gap", "nodes", "note", "ilp")  # written when set
_STATUSES = ("optimal", "within gap", "time limit", "heuristic", "infeasible", "feasible")  # "feasible": older plans
_BASELINE_KEYS = ("total_s", "feasible", "note")
_MEMORY_KEYS = ("used", "capacity")
_PREDICTED_REQUIRED = ("total_s", "per_device_s", "per_link_s")
_PREDICTED_OPTIONAL = ("critical_path_s", "lower_bound_s", "per_op_s", "per_op_device_s")
_PREDICTED_MAPS = ("per_device_s", "per_link_s", "per_op_s")  # the rest are numbers or null

_OBJECTIVES = ("latency", "throughput", "makespan")  # partitioner.solvers.problem.Objective
_STREAM_MODES = ("prefetch", "sync")                 # partitioner.solvers.problem.StreamMode
_TRANSFER_KINDS = ("activation", "weights", "param", "gradient", "update", "state", "split", "saved")
_OPTIMIZERS = tuple(o.value for o in Optimizer)
_REPLAN = "re-plan: hetpart plan MODEL ..."


class PlanFormatError(HetpartError, ValueError):
    """A plan file or dict that is not a valid plan: names the file, the field path and the rule."""


@dataclasses.dataclass(frozen=True)
class SolverInfo:
    """Which solver's placement the plan carries and what is proven about it.

    ``name`` is the solver whose placement the plan holds (``"ilp:highs"``, or a baseline such as
    ``"heft+local-search"`` when it beat the ILP's incumbent; the ILP's own result is then kept in
    ``ilp``). ``status`` is "optimal" (proven gap about 0), "within gap" (proven within
    ``requested_gap``), "time limit" (stopped further away), "heuristic" (nothing proven) or
    "infeasible"; plans written before these words may say "feasible" for "time limit".
    ``bound`` is the ILP's proven lower bound over every placement of the problem it solved:
    with ``nodes`` set, the graph was coarsened to that many groups and the bound covers the
    placements that keep each group on one device.

    Example:
        >>> SolverInfo("ilp", "optimal", 0.0123, 0.0121, float("nan"), 2.5).gap is None
        True
    """

    name: str                 # solver whose placement the plan holds: "ilp:highs", "heft", "single:cuda:0", ...
    status: str               # "optimal" | "within gap" | "time limit" | "heuristic" | "infeasible"
    objective: float | None   # the placement's predicted objective, seconds
    bound: float | None       # a proven lower bound on the objective (None: nothing proven)
    gap: float | None         # (objective - bound) / objective, None when unknown
    seconds: float            # wall time of the solve
    requested_gap: float | None = None  # the relative gap the solver was asked to reach
    nodes: int | None = None            # coarse groups the ILP placed (None: every op on its own)
    note: str = ""                      # what the solver said (a time-out, a fallback)
    ilp: SolverInfo | None = None       # the ILP's own result, when the plan carries another placement

    def __post_init__(self) -> None:
        for name in ("objective", "bound", "gap", "requested_gap"):
            object.__setattr__(self, name, _finite_or_none(getattr(self, name)))
        object.__setattr__(self, "seconds", float(self.seconds))

    def to_dict(self) -> dict[str, Any]:
        """The ``solver`` object of a plan file: the required keys, then the optional ones set."""
        out: dict[str, Any] = {f: getattr(self, f) for f in _SOLVER_KEYS}
        if self.requested_gap is not None:
            out["requested_gap"] = self.requested_gap
        if self.nodes is not None:
            out["nodes"] = self.nodes
        if self.note:
            out["note"] = self.note
        if self.ilp is not None:
            out["ilp"] = self.ilp.to_dict()
        return out


@dataclasses.dataclass(frozen=True)
class TransferInfo:
    """One copy per step; written as ``{"tensor", "from", "to", "bytes", "seconds", "kind"}``.

    Example:
        >>> TransferInfo("relu", "cuda:0", "cpu", 4096, 2e-5).kind
        'activation'
    """

    tensor: str               # tensor name, or the op whose weights stream (kind "weights")
    src: str                  # device it leaves
    dst: str                  # device it reaches
    bytes: int
    seconds: float
    kind: str = "activation"  # "activation" | "weights" | "param"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bytes", int(self.bytes))
        object.__setattr__(self, "seconds", float(self.seconds))


@dataclasses.dataclass(frozen=True)
class BaselineInfo:
    """A baseline placement's predicted time, for comparison.

    Example:
        >>> BaselineInfo(float("inf"), False, "cuda:0 over capacity").total_s is None
        True
    """

    total_s: float | None     # predicted objective; None when it cannot run at all
    feasible: bool            # whether it fits in memory and respects the limits
    note: str = ""            # why it is infeasible, or how it was made

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_s", _finite_or_none(self.total_s))


#: The kinds of model input a plan records; anything else is passed to ``emit(example_inputs=...)``.
INPUT_KINDS = ("tensor", "none", "bool", "int", "float")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One positional input of the model as the user passed it when planning.

    A tensor is written ``{"shape", "dtype"}`` (plus ``"dynamic": {"0": {"name": "batch",
    "min": 0, "max": null}}`` for the dimensions declared dynamic); ``None`` and plain numbers
    are written ``{"value": ...}``.

    Example:
        >>> InputSpec("tensor", (2, 16), "int64", dynamic={0: ("batch", 0, None)}).dynamic_names()
        {0: 'batch'}
    """

    kind: str                                  # one of INPUT_KINDS
    shape: tuple[int, ...] = ()                # tensors: the example's shape (what was costed)
    dtype: str = ""                            # tensors: "float32", "int64", ...
    value: bool | int | float | None = None    # "none", "bool", "int", "float": the value itself
    dynamic: Mapping[int, tuple[str, int, int | None]] = dataclasses.field(
        default_factory=dict)                  # dim -> (name, min, max or None): sizes the plan runs

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dynamic", MappingProxyType(
            {int(d): (str(n), int(lo), None if hi is None else int(hi)) for d, (n, lo, hi) in self.dynamic.items()}))

    # Plans before inputs had kinds held (shape, dtype) pairs; an InputSpec still reads as one.
    def __iter__(self) -> Any:
        return iter((self.shape, self.dtype))

    def __getitem__(self, index: int) -> Any:
        return (self.shape, self.dtype)[index]

    def __len__(self) -> int:
        return 2

    def dynamic_names(self) -> dict[int, str]:
        """Dimension → name of the dimensions declared dynamic."""
        return {d: name for d, (name, _, _) in self.dynamic.items()}

    def describe(self) -> str:
        """``int64[batch=2, 16]``, ``None``, ``3``: what the plan was made for, for messages."""
        if self.kind != "tensor":
            return repr(self.value)
        dims = [f"{self.dynamic[i][0]}={s}" if i in self.dynamic else str(s) for i, s in enumerate(self.shape)]
        return f"{self.dtype}[{', '.join(dims)}]"

    def to_dict(self) -> dict[str, Any]:
        if self.kind != "tensor":
            return {"value": self.value}
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.dynamic:
            out["dynamic"] = {str(d): {"name": n, "min": lo, "max": hi} for d, (n, lo, hi) in self.dynamic.items()}
        return out


def input_spec(value: Any) -> InputSpec:
    """An :class:`InputSpec` from one, or from a ``(shape, dtype)`` pair (plans before inputs had kinds)."""
    if isinstance(value, InputSpec):
        return value
    shape, dtype = value
    return InputSpec("tensor", tuple(shape), str(dtype))


def _finite_or_none(value: float | None) -> float | None:
    """``None`` for None, inf and nan; otherwise the value as a float."""
    return float(value) if value is not None and math.isfinite(value) else None


def _freeze(value: Any) -> Any:
    """Read-only nested mappings (dict -> MappingProxyType)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _plain(value: Any) -> Any:
    """JSON-ready values: mappings -> dict, tuples -> list, non-finite floats -> None."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _transfer_dict(t: TransferInfo) -> dict[str, Any]:
    return {"tensor": t.tensor, "from": t.src, "to": t.dst, "bytes": t.bytes,
            "seconds": t.seconds, "kind": t.kind}
