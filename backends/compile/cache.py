"""The plan cache of the torch.compile backend: one plan per graph, shapes and options.

In: a captured graph (:class:`~partitioner.ir.OpGraph`), the options' key and device set. Out: the
cached :class:`~partitioner.plan.Plan` for them, or ``None``; :meth:`PlanCache.put` stores a new one.

The key hashes the graph's fingerprint (op names, kinds, output shapes, parameters), the shape
and dtype of every graph input and parameter, the options' key (device set with caps, objective,
training, optimizer, pins, solver, gap, streaming, coarsening) and the plan format version. Plans
are held in memory for the process and, with a ``plan_dir``, written there as ``plan-<key>.json``
(atomically, through :meth:`Plan.save`) and read back by later processes. A file that does not load
(corrupt, another format version) or does not match (another graph, device set, objective or
training mode) is stale: a warning names it and why, and the caller solves again and replaces it;
such a plan is never used. The files are ordinary plans: ``hetpart report`` and ``hetpart explain``
read them.

Example:
    >>> cache = PlanCache()
    >>> cache.get(graph, "0123abcd", profile, plan_dir=None)   # doctest: +SKIP
    (None, 'miss')
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from cost_models.profiles import DeviceSet
from partitioner.errors import HetpartError
from partitioner.ir import NOT_A_TENSOR, OpGraph
from partitioner.plan import Plan
from partitioner.plan.values import FORMAT_VERSION

log = logging.getLogger("hetpart.compile")


def cache_key(graph: OpGraph, options_key: str) -> str:
    """The plan cache key of ``graph`` under options whose key is ``options_key``.

    Example:
        >>> cache_key(graph, opts.key(profile, training=False))   # doctest: +SKIP
        '5c1f0e9a7d3b2e41'
    """
    # tensor inputs only: the sizes dynamo lifts to integer inputs of a dynamic graph are in the
    # shapes already, so a dynamic graph at a shape its static graph had finds that graph's plan
    inputs = [(list(graph.tensors[t].shape), graph.tensors[t].dtype) for t in graph.inputs
              if graph.tensors[t].dtype != NOT_A_TENSOR]
    params = [(p.name, list(p.shape), p.dtype) for p in graph.params.values()]
    text = json.dumps([FORMAT_VERSION, graph.fingerprint(), inputs, params, options_key])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PlanCache:
    """Plans by cache key: this process's, and those saved in a ``plan_dir``."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}

    def clear(self) -> None:
        """Forget this process's plans (files in a ``plan_dir`` stay)."""
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def path(self, key: str, plan_dir: str | Path) -> Path:
        """Where the plan of ``key`` is saved in ``plan_dir``."""
        return Path(plan_dir) / f"plan-{key}.json"

    def get(self, key: str, graph: OpGraph, devices: DeviceSet, expect: dict[str, Any],
            plan_dir: str | None) -> tuple[Plan | None, str]:
        """The plan for ``key`` and where it came from (``"memory"``, ``"disk"`` or ``"miss"``).

        ``expect`` holds plan fields that must match (``objective``, ``training``).
        """
        if key in self._plans:
            return self._plans[key], "memory"
        if plan_dir is None:
            return None, "miss"
        path = self.path(key, plan_dir)
        if not path.exists():
            return None, "miss"
        plan = self._load_valid(path, graph, devices, expect)
        if plan is None:
            return None, "miss"
        self._plans[key] = plan
        return plan, "disk"

    def put(self, key: str, plan: Plan, plan_dir: str | None) -> Path | None:
        """Keep ``plan`` for ``key``; with ``plan_dir``, also save it there (replacing a stale file)."""
        self._plans[key] = plan
        if plan_dir is None:
            return None
        folder = Path(plan_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise HetpartError(f"plan_dir {plan_dir!r}: cannot create the folder ({err.strerror or err}); "
                               f"give a writable folder or leave plan_dir out") from err
        return plan.save(self.path(key, plan_dir), force=True)

    @staticmethod
    def _load_valid(path: Path, graph: OpGraph, devices: DeviceSet, expect: dict[str, Any]) -> Plan | None:
        try:
            plan = Plan.load(path)
            plan.check_graph(graph)
            plan.check_devices(devices)
        except HetpartError as err:
            log.warning("hetpart: ignoring the cached plan %s, solving again: %s", path, _first_line(err))
            return None
        wrong = [f"{field} is {getattr(plan, field)!r}, not {value!r}" for field, value in expect.items()
                 if getattr(plan, field) != value]
        if wrong:
            log.warning("hetpart: ignoring the cached plan %s, solving again: its %s", path, "; ".join(wrong))
            return None
        return plan


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


__all__ = ["PlanCache", "cache_key"]
