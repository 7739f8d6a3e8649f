"""hetpart's public API.

Capture a model as an :class:`~partitioner.ir.OpGraph` and cost it on a device profile::

    >>> import models
    >>> from partitioner import from_module
    >>> module, inputs = models.get("mlp")
    >>> graph = from_module(module, inputs)
"""

from partitioner.errors import (
    CaptureError,
    HetpartError,
    InfeasiblePlacement,
    PlanMismatch,
    ProfileError,
    SolverUnavailable,
    UnknownModel,
    UnsupportedOp,
)
from partitioner.frontends.fx import Capture, from_graph_module, from_module
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor

__all__ = [
    "Capture",
    "CaptureError",
    "HetpartError",
    "InfeasiblePlacement",
    "Op",
    "OpClass",
    "OpGraph",
    "Param",
    "PlanMismatch",
    "ProfileError",
    "SolverUnavailable",
    "Tensor",
    "UnknownModel",
    "UnsupportedOp",
    "from_graph_module",
    "from_module",
]
