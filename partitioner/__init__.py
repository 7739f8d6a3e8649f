"""hetpart's public API: how a plan is made.

Capture a model, place its ops on the devices of a profile, save the plan, and run it::

    >>> import models
    >>> from partitioner import partition, Plan
    >>> module, inputs = models.get("gpt", "tiny")
    >>> plan = partition(module, inputs, "h200-host", memory={"cuda:0": "8MB"})
    >>> emitted = plan.emit(module, {"cuda:0": "cpu"})       # runs here, every device bound to the CPU

The API (everything else is a documented module: ``partitioner.solvers``, ``partitioner.coarsen``,
``partitioner.report``, ``cost_models``, ``backends``):

=========================  ==============================================================
``partition``              model (or OpGraph) + inputs + profile -> a verified :class:`Plan`
``partition_outcome``      the same, with the problem, solution, evaluation and baselines
``Plan``                   the plan record: ``load``/``save``, ``summary``, ``emit``,
                           ``emit_source``, ``to_device_map``, ``check_graph``
``load_profile``           a built-in profile name or a TOML path -> :class:`DeviceSet`
                           (cluster profiles too: hosts and a network, devices ``host1/cuda:0``)
``load_cluster``           a cluster profile -> :class:`~cost_models.cluster.Cluster` (hosts, network)
``plan_generation``        a causal LM + profile -> a :class:`GenerationPlan`: prefill and decode placed
                           together (``prompt_tokens=``, ``new_tokens=``), ``emit_generate`` runs it
``PipelineSpec``           micro-batches, schedule and stage count of a pipeline plan
                           (``partition(..., micro_batches=, schedule=, stages=)``)
``DeviceSet``              devices and links (``cost_models.detect.detect_local()`` profiles this machine)
``calibrate``              this machine's devices -> a profile fitted to micro-benchmarks (residuals, verdict)
``profile_graph``          an OpGraph + real inputs -> its ops measured here (``partition(costs=...)``)
``keep_freed_memory``      glibc keeps freed memory, so a CPU training loop reuses its pages every step
                           (the state profiles are measured in; :mod:`cost_models.allocator`)
``from_module``            capture an ``nn.Module`` (torch.export or symbolic_trace) -> OpGraph
``from_graph_module``      the graph a ``torch.compile`` backend is handed -> OpGraph
``compile_backend``        ``torch.compile(model, backend=compile_backend)``: hetpart as a torch.compile
                           backend, also found by name (``backend="hetpart"``); :mod:`backends.compile`
``from_onnx``              an ONNX model (``.onnx`` path or ``ModelProto``) -> OpGraph; ``partition``
                           takes the path or ``ModelProto`` too, and ``Plan.emit_onnx`` writes its parts
``OpGraph``, ``Op``, ...   the IR (:mod:`partitioner.ir`)
``HetpartError``, ...      the error family (:mod:`partitioner.errors`)
=========================  ==============================================================

Where a plan runs is :mod:`backends` (``backends.torch``: the emitted module and source file;
``backends.onnx_parts``: ONNX parts on onnxruntime execution providers;
``backends.pipeline``: pipeline stages on ``torch.distributed.pipelining``, launched by torchrun).
"""

from cost_models.allocator import keep_freed_memory
from cost_models.calibrate import calibrate
from cost_models.cluster import load_cluster
from cost_models.profiler import profile_graph
from cost_models.profiles import DeviceSet, load_profile
from partitioner.errors import (
    CaptureError,
    HetpartError,
    InfeasiblePlacement,
    OnnxError,
    PipelineRunError,
    PlanMismatch,
    ProfileError,
    SolverUnavailable,
    UnknownModel,
    UnsupportedOp,
)
from partitioner.frontends.fx import Capture, from_graph_module, from_module
from partitioner.ir import Op, OpClass, OpGraph, Param, Tensor
from partitioner.plan import Plan, PlanFormatError
from partitioner.generation_planner import plan_generation
from partitioner.plan.generation import GenerationPlan
from partitioner.planner import Outcome, partition, partition_outcome
from partitioner.solvers.pipeline import PipelineSpec

__all__ = [
    # making a plan
    "partition",
    "partition_outcome",
    "Outcome",
    "Plan",
    "PlanFormatError",
    "PipelineSpec",
    "plan_generation",
    "GenerationPlan",
    # devices and measured costs
    "load_profile",
    "load_cluster",
    "DeviceSet",
    "calibrate",
    "profile_graph",
    "keep_freed_memory",
    # capture and the IR
    "from_module",
    "from_graph_module",
    "from_onnx",
    "Capture",
    "Op",
    "OpClass",
    "OpGraph",
    "Param",
    "Tensor",
    # errors
    "HetpartError",
    "CaptureError",
    "InfeasiblePlacement",
    "OnnxError",
    "PipelineRunError",
    "PlanMismatch",
    "ProfileError",
    "SolverUnavailable",
    "UnknownModel",
    "UnsupportedOp",
    # torch.compile
    "compile_backend",
]


def __getattr__(name: str) -> object:
    """``compile_backend`` lives in ``backends.compile`` (where plans run) and ``from_onnx`` needs
    ``onnx`` (over a second to import): each is imported on first use."""
    if name == "compile_backend":
        from backends.compile import hetpart

        return hetpart
    if name == "from_onnx":
        from partitioner.frontends.onnx import from_onnx

        return from_onnx
    raise AttributeError(f"module 'partitioner' has no attribute {name!r}")
