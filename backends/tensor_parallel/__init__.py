"""Tensor-parallel ranks: a plan's split linears on ``torch.distributed.tensor``, one rank per device.

A plan with splits (``partition(..., splits=True)``; its ``splits`` section,
:mod:`partitioner.plan.splits`) runs in one process through ``plan.emit`` (shards and copies,
:mod:`backends.torch.splits`) or here, as one process per device of its splits: a ``DeviceMesh``
over the ranks, each split linear sharded by ``parallelize_module`` with ``ColwiseParallel``
(``cols``) or ``RowwiseParallel`` (``rows``), every other op replicated, run whole on every rank
(as Megatron-LM runs the layers it does not split). Nothing here re-implements the runtime: the
mesh, the ``DTensor`` shards and their collectives are torch's.

Modules:

============  ===================================================================================
module        what it does
============  ===================================================================================
``layout``    :func:`layout_of`: each split op as the model's ``nn.Linear`` and its style; the
              mesh's devices; what cannot run exactly (uneven fractions, shared weights) refused
``heads``     :func:`set_head_counts`: an attention region's module computing with the rank's heads
              (its ``n_heads`` set per rank; ``-1`` views need nothing; other counts to ``shard_shapes``)
``shard_shapes``  :func:`~backends.tensor_parallel.shard_shapes.shard_capture_error`: whether the
              module's code computes with a rank's heads from the tensors' shapes (HF's
              ``repeat_kv``): a ``meta`` copy holding the rank's shards captures, or is refused
``runtime``   :func:`run_rank`: one rank: the launch checked against the mesh, process group,
              ``parallelize_module``, one step, gradients gathered (``full_tensor``)
``grid``      :func:`run_grid_rank`: a plan with pipeline stages as stages x 2 ranks on a 2-D mesh
              (``pp`` x ``tp``): each stage's split linears sharded over its two ranks
``__main__``  ``python -m backends.tensor_parallel plan.json``: the program torchrun starts
``launch``    :func:`run_ranks`: every rank here under ``torchrun --standalone``
              (``hetpart launch PLAN --run`` for a plan with splits)
``check``     :func:`check_ranks`: every rank's outputs, loss and gathered gradients against the
              single-process model (for a grid, the pipeline's, with the same micro-batching)
============  ===================================================================================

Example:
    >>> from backends.tensor_parallel import RunOptions, check_ranks
    >>> report = check_ranks(plan, model, inputs, model_spec="gpt:small",
    ...                      options=RunOptions(training=True, device_map={"cuda:0": "cpu"}))   # doctest: +SKIP
    >>> report.passed                                                                           # doctest: +SKIP
    True
"""

from __future__ import annotations

from backends.tensor_parallel.check import check_ranks, check_results, reference_step
from backends.tensor_parallel.grid import grid_of, run_grid_rank
from backends.tensor_parallel.heads import HeadCount, set_head_counts
from backends.tensor_parallel.launch import rank_arguments, run_ranks, world_size_of
from backends.tensor_parallel.layout import Layout, SplitLinear, dtensor_sizes, layout_of, mesh_devices
from backends.tensor_parallel.runtime import RunOptions, rank_environment, run_rank

__all__ = ["HeadCount", "Layout", "RunOptions", "SplitLinear", "check_ranks", "check_results", "dtensor_sizes",
           "grid_of", "layout_of", "mesh_devices", "rank_arguments", "rank_environment", "reference_step", "run_grid_rank",
           "run_rank", "run_ranks", "set_head_counts", "world_size_of"]
