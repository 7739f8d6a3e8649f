"""Training-state sections made by hand, for plans the planner does not yet give one.

``with_training_state(plan, model, offload=..., sparse=...)`` returns ``plan`` with a
``training_state`` section (:mod:`partitioner.plan.training_state`): every trainable parameter of
``model`` where its op computes, except those whose names match an ``offload`` pattern
(``fnmatch``), whose gradient, optimizer state and step go to the host when their op computes
elsewhere; names matching a ``sparse`` pattern update row-sparse. The plan's own checks
(``check_training_state``) validate the result.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from typing import Any

import torch


def with_training_state(plan: Any, model: torch.nn.Module, *, offload: Sequence[str] = (),
                        sparse: Sequence[str] = (), delayed_update: bool = False) -> Any:
    optimizer = plan.optimizer
    host = plan.devices.host_device().name
    tensors = dict(model.named_parameters(remove_duplicate=False))
    seen: set[int] = set()
    params = {}
    for op, names in plan.param_names.items():
        compute = plan.placement[op]
        weights = plan.weights.get(op, compute)
        for name in names:
            p = tensors.get(name)
            if p is None or not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            off = any(fnmatch.fnmatchcase(name, pat) for pat in offload) and weights != host
            row_sparse = any(fnmatch.fnmatchcase(name, pat) for pat in sparse)
            params[name] = {"op": op, "compute": compute, "weights": weights, "state": host if off else weights,
                            "update": "sparse" if row_sparse else "dense",
                            "exact": not (row_sparse and optimizer == "sparse-adam") and not delayed_update}
    section = {"optimizer": optimizer, "delayed_update": delayed_update, "params": params, "recompute": []}
    return dataclasses.replace(plan, training_state=section)
