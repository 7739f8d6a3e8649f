"""Loading a checkpoint tensor by tensor into memory already placed: each one read once, straight into its home.

In: the stored tensors (:class:`~backends.torch.checkpoint_files.WeightFiles`), a
:class:`~backends.torch.checkpoint_keys.KeyPlan` saying which key fills which tensor, and the
destination of each tensor (already allocated where it lives: a device, the host, or pinned host
memory for a streamed weight). Out: the destinations filled, and a :class:`LoadStats`.

How a tensor travels:

* to host memory, same dtype: ``pread`` from the shard straight into the destination's bytes, no
  copy in between;
* to a device, or cast to another dtype: through one staging buffer of at most
  :data:`STAGING_BYTES` (pinned when CUDA is present), in chunks of whole elements, each chunk
  copied into its slice of the destination (``copy_`` casts);
* a ``torch.save`` state dict (memory-mapped): ``copy_`` from the mapped tensor;
* a converted group (fused experts): its stored tensors read into host memory, converted by
  transformers' ops, copied into the destinations, then dropped.

Host memory while loading is therefore what the plan keeps on the host plus the staging buffer
(plus, for a model with converted weights, one converted group at a time): never the whole model.
Tied weights are one destination and are read once. Every key, shape and dtype has been checked
before the first byte is read (:func:`~backends.torch.checkpoint_keys.plan_keys`); an error while
reading (a file that shrank since) raises before the loaded module is handed to anyone.

:func:`load_folder_into` fills a module's own tensors in place (the generated file's
``build("./folder")``): the same path, destinations being the module's tensors.

Example:
    >>> stats = fill(destinations, plan, files)                    # doctest: +SKIP
    >>> stats.bytes_read
    1048576
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from backends.torch.checkpoint_files import StoredTensor, WeightFiles, weight_files
from backends.torch.checkpoint_keys import KeyPlan, Wanted, plan_keys
from partitioner.errors import CheckpointError

log = logging.getLogger(__name__)

__all__ = ["STAGING_BYTES", "LoadStats", "fill", "load_folder_into", "wanted_of"]

#: The staging buffer through which a tensor bound for a device (or cast) travels, in bytes.
STAGING_BYTES = 64 << 20


@dataclasses.dataclass
class LoadStats:
    """What one load did."""

    tensors: int = 0
    bytes_read: int = 0
    staged_bytes: int = 0        # bytes that went through the staging buffer
    staging_bytes: int = 0       # the staging buffer's size (0: none was needed)
    converted_peak: int = 0      # the largest converted group held on the host at once
    seconds: float = 0.0


class _Staging:
    """One reusable host buffer (pinned where CUDA is), made when first needed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buffer: torch.Tensor | None = None

    def get(self) -> torch.Tensor:
        if self.buffer is None:
            pin = torch.cuda.is_available()
            self.buffer = torch.empty(self.size, dtype=torch.uint8, pin_memory=pin)
        return self.buffer


def fill(destinations: Mapping[str, torch.Tensor], plan: KeyPlan, files: WeightFiles, *,
         staging_bytes: int = STAGING_BYTES) -> LoadStats:
    """Fill each destination (by the first name of its tensor group) from the checkpoint.

    Reads shard by shard in file order. Raises :class:`CheckpointError` when a file cannot be read.
    """
    began = time.perf_counter()
    stats = LoadStats()
    staging = _Staging(staging_bytes)
    order = sorted(plan.direct.items(), key=lambda kv: (str(kv[1].file), kv[1].offset or 0))
    try:
        with torch.no_grad():
            for name, stored in order:
                _read(files, stored, destinations[name], staging, stats)
            for group in plan.converted:
                held = 0

                def read(stored: StoredTensor) -> torch.Tensor:
                    nonlocal held
                    out = torch.empty(stored.shape, dtype=stored.dtype)
                    _read(files, stored, out, staging, stats)
                    held += stored.nbytes
                    return out

                for name, value in group.make(read).items():
                    destinations[name].copy_(value)
                    stats.tensors += 1
                stats.converted_peak = max(stats.converted_peak, held)
    finally:
        files.close()
    stats.staging_bytes = staging.size if staging.buffer is not None else 0
    stats.seconds = time.perf_counter() - began
    log.info("loaded %d tensors (%d bytes, %d through staging) in %.2f s", stats.tensors, stats.bytes_read,
             stats.staged_bytes, stats.seconds)
    return stats


def _read(files: WeightFiles, stored: StoredTensor, dest: torch.Tensor, staging: _Staging, stats: LoadStats) -> None:
    """One stored tensor into ``dest`` (see the module docstring for the paths)."""
    stats.tensors += 1
    stats.bytes_read += stored.nbytes
    if stored.offset is None:  # a memory-mapped torch.save tensor
        dest.copy_(files.tensor(stored))
        return
    if stored.nbytes == 0:
        return
    flat = dest.reshape(-1)
    if dest.device.type == "cpu" and dest.dtype == stored.dtype and dest.is_contiguous():
        files.read_into(stored, flat.view(torch.uint8))
        return
    buffer = staging.get()
    item = torch.empty((), dtype=stored.dtype).element_size()
    step = max(item, staging.size // item * item)
    for start in range(0, stored.nbytes, step):
        length = min(step, stored.nbytes - start)
        chunk = buffer[:length]
        files.read_into(stored, chunk, start)
        first = start // item
        flat[first:first + length // item].copy_(chunk.view(stored.dtype))
        stats.staged_bytes += length


def wanted_of(module: torch.nn.Module, names: Mapping[str, torch.Tensor] | None = None) -> list[Wanted]:
    """The tensors of ``module``'s state dict as :class:`Wanted` groups (tied names together, in
    state-dict order); ``names`` (name -> tensor) replaces the module's own listing."""
    items = names.items() if names is not None else module.state_dict(keep_vars=True).items()
    groups: dict[int, list[str]] = {}
    first: dict[int, torch.Tensor] = {}
    for name, tensor in items:
        groups.setdefault(id(tensor), []).append(name)
        first.setdefault(id(tensor), tensor)
    return [Wanted(tuple(ns), tuple(first[k].shape), first[k].dtype) for k, ns in groups.items()]


def load_folder_into(module: torch.nn.Module, folder: str | Path, *, dtype: Any = None,
                     trust_remote_code: bool = False) -> LoadStats:
    """Fill ``module``'s parameters and persistent buffers, in place and on their own devices,
    from the model folder (or weights file) ``folder``: the generated file's ``build("./folder")``.
    ``module`` has the model's names (a generated ``PartitionedModel``); its tensors keep their
    devices. Every key is checked before anything is read.

    Raises:
        CheckpointError: the folder cannot be read, or a key is missing, unexpected, or of another
            shape or dtype (named with its shard).

    Example:
        >>> load_folder_into(PartitionedModel(), "tiny-llama")     # doctest: +SKIP
    """
    from partitioner.frontends.hf_folder import open_folder

    opened = open_folder(folder, dtype=dtype, trust_remote_code=trust_remote_code)
    files = weight_files(opened.folder, opened.weights)
    wanted = wanted_of(module)
    plan = plan_keys(opened.module, wanted, files, cast=dtype is not None)
    state = module.state_dict(keep_vars=True)
    for w in wanted:
        if state[w.names[0]].is_meta:
            raise CheckpointError(f"{type(module).__name__} holds {w.names[0]!r} on the meta device: load into a "
                                  f"module whose tensors are allocated")
    return fill({w.names[0]: state[w.names[0]].data for w in wanted}, plan, files)
