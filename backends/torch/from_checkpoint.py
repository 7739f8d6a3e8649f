"""A plan emitted from a model folder: the captured graph placed, each weight read from disk into its home.

In: a :class:`~partitioner.plan.Plan`, a model folder (a path, or a
:class:`~partitioner.frontends.hf_folder.FolderModel`) and a binding of the plan's logical devices
(``{"cuda:0": "cpu"}``). Out: the same ``nn.Module`` :func:`~backends.torch.module.emit_module`
builds from a live model, without the model ever being in memory:

* the model is built hollow from ``config.json`` (:mod:`partitioner.frontends.hf_folder`) and
  captured as the plan was (fingerprint checked), so the graph holds no weight;
* the checkpoint's headers are read and every key matched with the model's tensors
  (:mod:`backends.torch.checkpoint_keys`): missing, unexpected, misshapen or mistyped keys fail
  here, before anything is allocated;
* each parameter and persistent buffer is allocated once in its home (the device of the op that
  owns it; pinned host memory for a weight the plan streams to a CUDA device, when CUDA is present;
  the host for a tensor no op reads) and filled from its shard (:mod:`backends.torch.checkpoint_load`);
  tied weights are one tensor, read once; values the constructor computes (rotary ``inv_freq``)
  and constants the capture made are moved to their homes as ``emit_module`` moves them;
* then transfers, issue order, streamed weights and factory devices as for any emitted module.

Host memory: the tensors the plan keeps on the host plus one staging buffer. The module is
returned only when every tensor is loaded: an error leaves nothing half-loaded in use.
:data:`LOAD_STATS_ATTR` on the module holds the load's :class:`~backends.torch.checkpoint_load.LoadStats`.

Example:
    >>> emitted = emit_from_checkpoint(plan, "tiny-llama", {"cuda:0": "cpu"})   # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from backends.binding import bind_devices
from backends.torch.attributes import attribute, rebind_tensor
from backends.torch.checkpoint_files import WeightFiles, weight_files
from backends.torch.checkpoint_keys import Wanted, plan_keys
from backends.torch.checkpoint_load import LoadStats, fill
from backends.torch.module import PlannedInputs, _input_names, _match_persistence, capture_for, example_inputs_for, \
    place_module, unlifted_module
from backends.torch.precision import apply_precision
from partitioner.frontends.hf_folder import FolderModel, open_folder
from partitioner.ir import NOT_A_TENSOR

log = logging.getLogger(__name__)

__all__ = ["LOAD_STATS_ATTR", "emit_from_checkpoint", "open_planned"]

LOAD_STATS_ATTR = "_hetpart_load_stats"


def open_planned(plan: Any, model: Any) -> FolderModel:
    """The folder opened as the plan was made: in the dtype its request recorded (default: the config's)."""
    if isinstance(model, FolderModel):
        return model
    dtype = (plan.request or {}).get("folder_dtype")
    return open_folder(model, dtype=dtype)


def emit_from_checkpoint(plan: Any, model: Any, device_map: Mapping[str, str] | None = None, *,
                         example_inputs: Any = None) -> torch.fx.GraphModule:
    """Build the module that runs ``plan`` with its weights read from a model folder (see the module docstring).

    Parameters:
        plan: the Plan, made from the folder (or from the same model).
        model: the folder, a weights file beside a config.json, or a FolderModel.
        device_map: logical device -> physical device, e.g. ``{"cuda:0": "cpu"}``.
        example_inputs: inputs to re-capture with (default: zeros of the plan's recorded shapes).

    Raises:
        CheckpointError: the folder or a key of it is bad (named with its file).
        PlanMismatch: the folder's model is not the one the plan was made for.

    Example:
        >>> emitted = emit_from_checkpoint(plan, "tiny-llama", {"cuda:0": "cpu"})   # doctest: +SKIP
    """
    folder = open_planned(plan, model)
    binding = bind_devices(plan, device_map)
    files = weight_files(folder.folder, folder.weights)
    inputs = example_inputs if example_inputs is not None else example_inputs_for(plan)
    with _disable_current_modes():  # capturing the hollow model is no part of the program a checking mode watches
        graph = capture_for(plan, folder.module, inputs)
        gm = unlifted_module(graph, weights_to_load=True)
    _match_persistence(gm, folder.module)
    tensors = {name for name, t in graph.tensors.items() if t.dtype != NOT_A_TENSOR}
    state = _CheckpointState(plan, folder, files)
    gm = place_module(gm, plan, binding, tensors=tensors, move_state=state.move)
    apply_precision(gm, plan)
    if plan.inputs:
        gm.register_forward_pre_hook(PlannedInputs(plan.inputs, _input_names(folder.module)), prepend=True)
    setattr(gm, LOAD_STATS_ATTR, state.stats)
    return gm


class _CheckpointState:
    """``place_module``'s state mover for a checkpoint: every tensor allocated in its home and filled."""

    def __init__(self, plan: Any, folder: FolderModel, files: WeightFiles) -> None:
        self.plan, self.folder, self.files = plan, folder, files
        self.stats = LoadStats()

    def move(self, gm: torch.fx.GraphModule, home: Mapping[str, str], physical: Mapping[str, torch.device],
             streamed: list[tuple[str, str]]) -> None:
        host = physical[self.plan.devices.host_device().name]
        groups = _tensor_groups(gm, home)
        saved = set(gm.state_dict(keep_vars=True))
        wanted = [Wanted(tuple(names), tuple(value.shape), value.dtype)
                  for names, value in groups if any(n in saved for n in names)]
        constants = {n for names, _ in groups if not any(m in saved for m in names) for n in names}
        keys = plan_keys(self.folder.module, wanted, self.files, cast=self.folder.dtype_given, ignored=constants)
        to_cuda = {t for t, d in streamed if physical[d].type == "cuda"} if torch.cuda.is_available() else set()
        made: dict[str, torch.Tensor] = {}
        destinations: dict[str, torch.Tensor] = {}
        for names, value in groups:  # everything is checked and allocated before the first read
            device = next((physical[home[n]] for n in names if n in home), host)
            if any(n in saved for n in names):
                pinned = device.type == "cpu" and any(n in to_cuda for n in names)
                data = torch.empty(value.shape, dtype=value.dtype, device=device, pin_memory=pinned)
                destinations[names[0]] = data
            else:  # what the constructor or the capture made (rotary inv_freq, a tensor literal): moved
                data = value.detach().to(device)
            made[names[0]] = data
        self.stats = fill(destinations, keys, self.files)
        for names, value in groups:
            data = made[names[0]]
            new = torch.nn.Parameter(data, requires_grad=value.requires_grad) \
                if isinstance(value, torch.nn.Parameter) else data
            for name in names:
                owner, _, attr = name.rpartition(".")
                rebind_tensor(gm.get_submodule(owner) if owner else gm, attr, new)


def _tensor_groups(gm: torch.fx.GraphModule, home: Mapping[str, str]) -> list[tuple[list[str], torch.Tensor]]:
    """Every tensor attribute of ``gm`` (parameters, buffers, constants the graph reads) with all its
    names, tied names together, in state-dict order."""
    names = [n for n, _ in gm.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in gm.named_buffers(remove_duplicate=False)]
    names += [str(node.target) for node in gm.graph.nodes if node.op == "get_attr"]
    names += list(home)
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name in dict.fromkeys(names):
        try:
            value = attribute(gm, name)
        except AttributeError:
            continue
        if not isinstance(value, torch.Tensor):
            continue
        groups.setdefault(id(value), ([], value))[0].append(name)
    return list(groups.values())
