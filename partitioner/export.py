"""Plan exports for other tools: an accelerate ``device_map`` JSON, a CSV of ops.

In: a :class:`~partitioner.plan.Plan`. Out: text in the chosen format, or a file written atomically
(an existing file is kept unless ``force``).

- ``device-map``: ``{"module.path": device}`` for ``dispatch_model`` /
  ``from_pretrained(device_map=...)``; only module-aligned plans have one (plan with
  ``--align-modules`` to make sure), otherwise the error names the split module.
- ``csv``: one row per op: op, module, device, weights (where its weights live), predicted seconds.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from partitioner.errors import HetpartError
from partitioner.plan import Plan
from partitioner.files import refuse_overwrite, write_atomic

FORMATS = ("json", "device-map", "csv")


def device_map_json(plan: Plan) -> str:
    """The plan's accelerate-style device map as JSON."""
    return json.dumps(plan.to_device_map(), indent=1) + "\n"


def csv_text(plan: Plan) -> str:
    """op, module, device, weights, predicted_s — in the plan's schedule order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["op", "module", "device", "weights", "predicted_s"])
    per_op = plan.predicted.get("per_op_s", {})
    for op in plan.schedule or tuple(plan.placement):
        device = plan.placement[op]
        seconds = per_op.get(op)
        writer.writerow([op, plan.modules.get(op, ""), device, plan.weights.get(op, device),
                         "" if seconds is None else f"{seconds:.9g}"])
    return out.getvalue()


def write_export(plan: Plan, path: str | Path, fmt: str = "json", *, force: bool = False) -> Path:
    """Write ``plan`` to ``path`` in format ``fmt`` (``json``, ``device-map`` or ``csv``)."""
    if fmt not in FORMATS:
        raise HetpartError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    target = Path(path)
    if fmt == "json":
        return plan.save(target, force=force)
    text = device_map_json(plan) if fmt == "device-map" else csv_text(plan)
    refuse_overwrite([target], force=force)
    return write_atomic(target, text.encode())
