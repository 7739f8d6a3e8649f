"""The plan cache of the torch.compile backend: one plan per graph, shapes and options.

In: a captured graph (:class:`~partitioner.ir.OpGraph`), the options' key and device set. Out: the
cached :class:`~partitioner.plan.Plan` for them, or ``None``; :meth:`PlanCache.put` stores a new one.

The key hashes the graph's fingerprint (op names, kinds, output shapes, parameters), the shape
and dtype of every graph input and parameter, the options' key (device set with caps, objective,
training, optimizer, the pins the graph matched, solver, time limit, gap, streaming, coarsening)
and the plan format version. Plans are held in memory for the process and, with a ``plan_dir``,
written there as ``plan-<key>.json`` (atomically, through :meth:`Plan.save`) and read back by later
processes. A file that does not load or verify (any error :meth:`Plan.load` raises: corrupt, cut
off, another format version, sections that disagree), does not match (another graph or device set)
or records other options than those asked for (:func:`disagreements`: a file copied or renamed, or
keyed by an older hetpart) is stale: a warning names it and why, and the caller solves again and
replaces it; such a plan is never used. The files are ordinary plans: ``hetpart report`` and ``hetpart explain``
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.compile.graphs import pin_matches
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

    def get(self, key: str, graph: OpGraph, devices: DeviceSet, planning: Mapping[str, Any],
            plan_dir: str | None) -> tuple[Plan | None, str]:
        """The plan for ``key`` and where it came from (``"memory"``, ``"disk"`` or ``"miss"``).

        ``planning`` holds the keyword arguments of :func:`partitioner.partition_outcome` the plan
        is wanted for; a file in ``plan_dir`` is used only if it loads, verifies (every check of
        :meth:`Plan.load`), was made for ``graph`` and ``devices``, and records the same options
        (:func:`disagreements`); otherwise a warning says why and the caller solves again.
        """
        if key in self._plans:
            return self._plans[key], "memory"
        if plan_dir is None:
            return None, "miss"
        path = self.path(key, plan_dir)
        if not path.exists():
            return None, "miss"
        plan = self._load_valid(path, graph, devices, planning)
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
    def _load_valid(path: Path, graph: OpGraph, devices: DeviceSet, planning: Mapping[str, Any]) -> Plan | None:
        try:
            plan = Plan.load(path)  # any error reading or verifying it is a HetpartError
            plan.check_graph(graph)
            plan.check_devices(devices)
        except HetpartError as err:
            log.warning("hetpart: ignoring the cached plan %s, solving again: %s", path, _first_line(err))
            return None
        wrong = disagreements(plan, graph, planning)
        if wrong:
            log.warning("hetpart: ignoring the cached plan %s, solving again: it was made under other options: %s",
                        path, "; ".join(wrong))
            return None
        return plan


def disagreements(plan: Plan, graph: OpGraph, planning: Mapping[str, Any]) -> list[str]:
    """How ``plan`` differs from a plan made for ``graph`` with ``planning`` (the keyword arguments
    of :func:`partitioner.partition_outcome`), as far as the plan records it: objective, training,
    optimizer, streaming, the ops pinned and where, the solver and its gap, the module paths.
    ``[]``: none found. (``time_limit`` and ``coarsen`` are not recorded: the cache key holds them.)

    Example:
        >>> disagreements(plan, graph, {"objective": "throughput"})   # doctest: +SKIP
        ["objective is 'latency', not 'throughput'"]
    """
    wrong = [f"{name} is {getattr(plan, name)!r}, not {planning[name]!r}"
             for name in ("objective", "training", "optimizer")
             if name in planning and getattr(plan, name) != planning[name]]
    if "streaming" in planning and plan.constraints.get("streaming", True) != planning["streaming"]:
        wrong.append(f"streaming is {plan.constraints.get('streaming')!r}, not {planning['streaming']!r}")
    wrong += _pin_disagreements(plan, graph, dict(planning.get("pins") or {}))
    wrong += _solver_disagreements(plan, planning.get("solver", "auto"), planning.get("gap"))
    modules = {name: op.module_path for name, op in graph.ops.items()}
    if dict(plan.modules) != modules:
        moved = sorted(op for op in modules if plan.modules.get(op) != modules[op])
        wrong.append(f"the module paths of {len(moved)} ops differ (e.g. {moved[0]!r})" if moved
                     else "its module paths differ")
    return wrong


def _pin_disagreements(plan: Plan, graph: OpGraph, pins: Mapping[str, str]) -> list[str]:
    recorded = dict(plan.constraints.get("pins") or {})
    wanted = {op.name: device for pattern, device in pins.items() for op in graph.ops.values()
              if pin_matches(op, pattern)}
    wrong = [f"op {op!r} is pinned to {recorded.get(op)!r}, not {device!r}" for op, device in sorted(wanted.items())
             if recorded.get(op) != device]
    # ops pinned together with a matched op (a coarsened group) are pinned too, to one of the pins' devices
    extra = sorted(op for op, device in recorded.items() if op not in wanted and device not in set(pins.values()))
    wrong += [f"op {op!r} is pinned to {recorded[op]!r} by no pin given" for op in extra[:1]]
    return wrong[:3]


def _solver_disagreements(plan: Plan, solver: str, gap: float | None) -> list[str]:
    ilp = plan.solver.ilp or plan.solver
    if solver in ("highs", "cbc") and ilp.name != f"ilp:{solver}":
        return [f"its solver is {plan.solver.name!r}, not the ILP with {solver}"]
    if solver not in ("auto", "highs", "cbc") and plan.solver.name != solver:
        return [f"its solver is {plan.solver.name!r}, not {solver!r}"]
    if solver == "auto" and not ilp.name.startswith("ilp:") and plan.solver.status == "heuristic":
        # "auto" runs the ILP: its plan has the ILP's result, or says the time ran out first
        return [f"its solver is the baseline {plan.solver.name!r}, not 'auto' (the ILP)"]
    if gap is not None and ilp.requested_gap is not None and ilp.requested_gap != gap:
        return [f"its ILP stopped at gap {ilp.requested_gap!r}, not {gap!r}"]
    return []


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


__all__ = ["PlanCache", "cache_key", "disagreements"]
