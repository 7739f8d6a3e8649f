"""The plan's optional ``batch`` section: micro-batch, accumulation steps, time per global step.

In: the numbers :func:`partitioner.batching.fit_batch` found (:func:`batch_record`), or the
section of a plan file (:func:`read_batch`, checked field by field; :func:`check_batch`, checked
against the rest of the plan). Out: the section as plain values, and its summary lines. Plans
without the section (every plan made before batch sizing existed, and every plan not made by it)
stay valid: the section is optional.

The section::

    batch  {"global_batch": G, "micro_batch": m, "accumulation_steps": G // m,
            "step_s": seconds per global step (predicted), "dim": 0}

A plan with the section is costed at one micro-batch (its ``inputs`` have ``m`` rows along
dimension ``dim``, the batch dimension); a global step runs ``accumulation_steps`` micro-batches
forward and backward, summing gradients, and one optimizer step
(:mod:`backends.torch.training`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partitioner.plan.fields import FieldReader

__all__ = ["BATCH_KEYS", "batch_record", "read_batch", "check_batch", "summary_lines"]

BATCH_KEYS = ("global_batch", "micro_batch", "accumulation_steps", "step_s", "dim")


def batch_record(global_batch: int, micro_batch: int, step_s: float | None) -> dict[str, Any]:
    """The ``batch`` section of a plan costed at ``micro_batch`` rows of a ``global_batch``.

    Example:
        >>> batch_record(64, 16, 0.5)["accumulation_steps"]
        4
    """
    return {"global_batch": global_batch, "micro_batch": micro_batch,
            "accumulation_steps": global_batch // micro_batch, "step_s": step_s, "dim": 0}


def read_batch(r: FieldReader, value: Any) -> dict[str, Any]:
    """The ``batch`` section of a decoded plan file, every field's type checked (``{}`` when absent)."""
    b = r.mapping(value, "batch")
    if not b:
        return {}
    b = r.keys(b, "batch", BATCH_KEYS)
    out: dict[str, Any] = {k: r.count(b[k], f"batch.{k}") for k in ("global_batch", "micro_batch",
                                                                      "accumulation_steps", "dim")}
    out["step_s"] = r.number_or_null(b["step_s"], "batch.step_s")
    return out


def check_batch(plan: Any, r: FieldReader) -> None:
    """The section agrees with itself and with the plan: ``micro_batch x accumulation_steps =
    global_batch``, a training plan, and inputs of ``micro_batch`` rows."""
    b = plan.batch
    if not b:
        return
    if b["micro_batch"] < 1 or b["dim"] != 0:
        r.fail("batch", f"micro_batch must be at least 1 and dim 0, got {b['micro_batch']} and {b['dim']}")
    if b["accumulation_steps"] < 1:
        r.fail("batch.accumulation_steps", f"{b['accumulation_steps']}: a global step accumulates at least one "
                                           f"micro-batch; re-plan: hetpart fit MODEL ... --global-batch G")
    if b["micro_batch"] * b["accumulation_steps"] != b["global_batch"]:
        r.fail("batch", f"micro_batch {b['micro_batch']} x accumulation_steps {b['accumulation_steps']} is not "
                        f"global_batch {b['global_batch']}; the three must agree")
    if not plan.training:
        r.fail("batch", "a batch section accumulates gradients: the plan must be a training plan")
    rows = [spec.shape[0] for spec in plan.inputs if getattr(spec, "shape", None)]
    if rows and rows[0] != b["micro_batch"]:
        r.fail("batch.micro_batch", f"{b['micro_batch']}, but the plan's inputs have {rows[0]} rows: a batch "
                                    f"plan is costed at one micro-batch")


def summary_lines(plan: Any) -> list[str]:
    """``  batch      global 64 = 4 x micro-batch 16 (gradient accumulation), 2.1 ms per global step``."""
    from cost_models.units import format_seconds

    b = plan.batch
    if not b:
        return []
    per = f", {format_seconds(b['step_s'])} per global step" if b.get("step_s") is not None else ""
    return [f"  batch      global {b['global_batch']} = {b['accumulation_steps']} x micro-batch "
            f"{b['micro_batch']}{' (gradient accumulation)' if b['accumulation_steps'] > 1 else ''}{per}"]
