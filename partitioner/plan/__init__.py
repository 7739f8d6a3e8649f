"""Plans: a placement of one graph on one device set, saved as versioned JSON and read back checked.

The file (``format_version`` 1) holds these top-level keys, in this order::

    format_version  1
    model           {"name", "fingerprint", "op_count", "modules": {op: module path},
                     "param_ops": [ops that own parameters or buffers],
                     optional "capture": "export" | "symbolic_trace" | "onnx" (imported ONNX),
                     optional "inputs": [{"shape", "dtype", optional "dynamic"} or {"value"}, ...]:
                     each positional input as passed (None and numbers by value), to
                     re-capture the model and check calls,
                     optional "edges": [[producer op, consumer op, bytes], ...]: the graph's edges
                     and the bytes each carries (older plans: [producer op, consumer op]), to draw
                     the graph and check the transfers against the placement,
                     optional "param_names": {op: [parameters it owns]} for device maps,
                     optional "op_bytes": {op: [output bytes, parameter bytes]}}
    devices         DeviceSet.to_dict(): the whole profile the plan was made for (caps applied)
    objective       "latency" | "throughput" | "makespan"
    training        true for a training step, false for inference
    optimizer       "sgd" | "sgd-momentum" | "adam" (costed in training only)
    placement       {op: device that computes it}, every op of the graph
    weights         {op: device holding its streamed weights}, streamed ops only
    stream_mode     "prefetch" | "sync"
    schedule        [op, ...] the issue order
    transfers       [{"tensor", "from", "to", "bytes", "seconds", "kind"}, ...] per step
    memory          {device: {"used": bytes, "capacity": bytes}}
    predicted       {"total_s", "per_device_s": {device: s}, "per_link_s": {label: s},
                     optional "critical_path_s", "lower_bound_s", "per_op_s": {op: s},
                     "per_op_device_s": {op: {device: s}}}
    solver          {"name", "status", "objective", "bound", "gap", "seconds"}
    baselines       {name: {"total_s", "feasible", "note"}}
    constraints     optional {"pins", "memory_caps", "streaming", "align_modules"}
    costs           optional {"model": "analytic" | "profiled", "source": costs file,
                     "measured": {device: ops measured}, "busy": {device: of those, ops measured while
                     the machine was busy}, "fell_back": {device: [ops priced analytically]},
                     "unsupported": {op: {device: why it failed when measured}}}; absent = analytic
    pipeline        optional {"micro_batches", "schedule", "world_size", "stages": [...], ...}:
                    pipeline stages, their ranks and hosts (see partitioner.plan.pipeline)
    batch           optional {"global_batch", "micro_batch", "accumulation_steps", "step_s", "dim"}:
                    a plan costed at one micro-batch, accumulated to the global batch (partitioner.plan.batch)
    probe           optional: the live memory read for ``--devices detect`` (see partitioner.plan.live)
    fallbacks       optional [{"fraction", "plan"}, ...]: plans for less accelerator memory (plan.live)
    precision       optional {"setting", "ops": {op: "bfloat16" | "float16"}, "casts"}: ops computing
                    in 16 bits (see partitioner.plan.precision)
    training_state  optional {"optimizer", "delayed_update", "params": {name: {"op", "compute", "weights",
                    "state", "update", "exact"}}, "recompute", "saved_on_host", "step"}: where each
                    parameter's weight, gradient and optimizer state live and how it is updated, which
                    ops recompute or hold their saved activations on the host (partitioner.plan.training_state)

A plan never holds a number that is not finite: where a value may be unknown (a bound, a gap,
an infeasible baseline's time, a predicted time) inf and nan become ``None``, written ``null``;
elsewhere (transfer and solver seconds) they are an error. Every problem with a file or dict
is a :class:`PlanFormatError` naming the file and the field path (``solver.gap``,
``placement["linear_3"]``).

Modules: ``record`` (the :class:`Plan` record), ``values`` (its value types and format
constants), ``reader`` (reading and validating files), ``consistency`` (the sections agree
with each other), ``implied`` (the memory and transfers the placement implies, from the plan alone
and on the model's graph), ``device_map`` (the accelerate-style module view), ``summary`` (the text for
people), ``from_solve`` (a plan from a solver's solution), ``pipeline`` (the optional pipeline section),
``batch`` (the optional batch section), ``live`` (the optional probe and fallbacks sections),
``precision`` (the optional precision section), ``training_state`` (the optional training-state section).
"""

from partitioner.plan.record import Plan
from partitioner.plan.values import (
    FORMAT_VERSION,
    TOP_LEVEL_KEYS,
    BaselineInfo,
    PlanFormatError,
    SolverInfo,
    TransferInfo,
)

__all__ = ["FORMAT_VERSION", "TOP_LEVEL_KEYS", "PlanFormatError", "SolverInfo", "TransferInfo",
           "BaselineInfo", "Plan"]
