"""Training-state sections made by hand, for plans the planner does not yet give one.

``with_training_state(plan, model, offload=..., sparse=...)`` returns ``plan`` re-costed with a
``training_state`` section (:mod:`partitioner.plan.training_state`): every trainable parameter of
``model`` where its op computes, except those whose names match an ``offload`` pattern
(``fnmatch``), whose gradient, optimizer state and step go to the host when their op computes
elsewhere, and those matching a ``stream_state`` pattern, whose optimizer state lives on the host
and is streamed to their op's device for the step; names matching a ``sparse`` pattern update
row-sparse. The plan's own checks
(``check_training_state``) validate the result.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import torch

from tests.e2e.restated import restated


def with_training_state(plan: Any, model: torch.nn.Module, *, offload: Sequence[str] = (),
                        sparse: Sequence[str] = (), delayed_update: bool = False,
                        stream_state: Sequence[str] = ()) -> Any:
    names = [name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    pick = lambda patterns: [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]  # noqa: E731
    exact = False if delayed_update else None
    return restated(plan, model, state_on_host=pick(offload), sparse=pick(sparse), delayed_update=delayed_update,
                    exact=exact, state_streamed=pick(stream_state))
