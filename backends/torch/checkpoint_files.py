"""The tensors a checkpoint holds, found from headers alone, and their bytes read on request.

In: a model folder (or one weights file). Out: :class:`WeightFiles`, every stored tensor by key as
a :class:`StoredTensor` (its file, dtype, shape and where its bytes lie), read without touching
any tensor's data, and :meth:`WeightFiles.read_into` to copy one tensor's bytes into memory the
caller owns.

Where the weights are, in this order: a file given as MODEL; ``model.safetensors.index.json``
(its ``weight_map`` names the shard of each key); ``model.safetensors``;
``pytorch_model.bin.index.json``; ``pytorch_model.bin``. A safetensors file is an 8-byte
little-endian header length, a JSON header (``{key: {"dtype", "shape", "data_offsets": [begin,
end]}}``, offsets relative to the end of the header), then the bytes. Its header is checked
before anything is read: the length fits the file, the JSON parses, every dtype is known, every
tensor's byte count equals its shape times its element size, and every tensor ends within the
file (a truncated shard is named with its first tensor past the end). An index naming a shard
that is not there, or a key its shard does not hold, is named with the index.

Reading: a safetensors tensor is read with ``pread`` on the shard, straight into the destination's
memory (no memory map: pages of a mapped file stay resident in the process until the file is
closed, so mapping a shard would hold the whole shard while it is loaded). A ``torch.save`` state
dict is opened with ``torch.load(weights_only=True, mmap=True)``: its tensors stay in the file until
copied (the mapped pages are file-backed, which the kernel may drop at any time).

Example:
    >>> files = weight_files(Path("tiny-llama"))                  # doctest: +SKIP
    >>> files.tensors["model.embed_tokens.weight"].shape
    (256, 64)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from partitioner.errors import CheckpointError

__all__ = ["SAFETENSORS_DTYPES", "StoredTensor", "WeightFiles", "weight_files"]

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS = "model.safetensors"
TORCH_INDEX = "pytorch_model.bin.index.json"
TORCH_FILE = "pytorch_model.bin"
#: The largest safetensors header read (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000
MAX_INDEX_BYTES = 2**27

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
    **{name: getattr(torch, attr) for name, attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
                                                      ("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"))
       if hasattr(torch, attr)},
}


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checkpoint: where it is and what it is."""

    key: str
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int | None     # absolute byte offset in a safetensors file; None: a torch.save file
    nbytes: int

    def where(self) -> str:
        """``key 'x.weight' in model-00002-of-00003.safetensors``, for messages."""
        return f"key {self.key!r} in {self.file.name}"


@dataclasses.dataclass
class WeightFiles:
    """Every tensor of a checkpoint by key (see the module docstring)."""

    folder: Path
    index: Path | None                     # the index file naming the shards, if any
    files: tuple[Path, ...]
    tensors: dict[str, StoredTensor]
    _loaded: dict[Path, Mapping[str, torch.Tensor]] = dataclasses.field(default_factory=dict, repr=False)
    _fds: dict[Path, int] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def source(self) -> str:
        """What the tensors were listed from: the index, or the one file."""
        return str(self.index or (self.files[0] if len(self.files) == 1 else self.folder))

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def read_into(self, stored: StoredTensor, out: torch.Tensor, start: int = 0) -> None:
        """Copy bytes ``start..start + out.numel()`` of ``stored`` into ``out`` (uint8, 1-D, host).

        Raises:
            CheckpointError: the file ended early or could not be read (it changed since its header was read).
        """
        length = out.numel()
        if stored.offset is None:
            raise CheckpointError(f"{stored.where()} is in a torch.save file: read it with tensor()")
        fd = self._fd(stored.file)
        view = memoryview(out.numpy()).cast("B")
        done = 0
        while done < length:
            try:
                got = os.preadv(fd, [view[done:]], stored.offset + start + done)
            except OSError as err:
                raise CheckpointError(f"cannot read {stored.where()}: {err.strerror or err}") from None
            if got == 0:
                raise CheckpointError(f"{stored.file} ended while reading {stored.where()} (byte "
                                      f"{stored.offset + start + done:,} of it): the file is truncated; "
                                      f"write it again")
            done += got

    def tensor(self, stored: StoredTensor) -> torch.Tensor:
        """A ``torch.save`` file's tensor, memory-mapped (its bytes are read when it is copied)."""
        return self._torch_file(stored.file)[stored.key]

    def close(self) -> None:
        """Close the shards opened for reading and drop the mapped torch.save files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._loaded.clear()

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as err:
                raise CheckpointError(f"cannot open {path}: {err.strerror or err}") from None
            self._fds[path] = fd
        return fd

    def _torch_file(self, path: Path) -> Mapping[str, torch.Tensor]:
        state = self._loaded.get(path)
        if state is None:
            state = self._loaded[path] = _torch_state(path)
        return state


def weight_files(folder: Path, weights: Path | None = None) -> WeightFiles:
    """The tensors of the checkpoint in ``folder`` (or of the file ``weights``), from headers.

    Raises:
        CheckpointError: no weights found, an index naming a missing shard or a key its shard
            lacks, a truncated or corrupted file; the message names the file and the key.

    Example:
        >>> len(weight_files(Path("tiny-llama")).tensors)           # doctest: +SKIP
        20
    """
    if weights is not None:
        return WeightFiles(folder, None, (weights,), _file_tensors(weights))
    for index_name in (SAFETENSORS_INDEX, TORCH_INDEX):
        index = folder / index_name
        if index.is_file():
            return _indexed(folder, index)
    for name in (SAFETENSORS, TORCH_FILE):
        path = folder / name
        if path.is_file():
            return WeightFiles(folder, None, (path,), _file_tensors(path))
    raise CheckpointError(f"{folder} holds no weights: expected {SAFETENSORS}, shards listed in {SAFETENSORS_INDEX}, "
                          f"or {TORCH_FILE} (model.save_pretrained(folder) writes them)")


def _indexed(folder: Path, index: Path) -> WeightFiles:
    from partitioner.frontends.hf_folder import read_json_file

    data = read_json_file(index, "weights index", MAX_INDEX_BYTES, "write it again with model.save_pretrained")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index} has no 'weight_map' of key -> shard file: write it again with "
                              f"model.save_pretrained")
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        shards.setdefault(shard, []).append(key)
    tensors: dict[str, StoredTensor] = {}
    files = []
    for shard, keys in shards.items():
        path = (folder / shard)
        if Path(shard).is_absolute() or ".." in Path(shard).parts or "/" in shard or "\\" in shard:
            raise CheckpointError(f"{index} names shard {shard!r} (for key {keys[0]!r}) outside {folder}: "
                                  f"shards lie beside the index")
        if not path.is_file():
            more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
            raise CheckpointError(f"{index} names shard {shard!r} for key {keys[0]!r}{more}, and {folder} has no "
                                  f"such file: copy the shard there, or write the folder again")
        held = _file_tensors(path)
        for key in keys:
            if key not in held:
                raise CheckpointError(f"{index} says key {key!r} is in {shard}, which does not hold it: "
                                      f"the index and its shards do not match; write the folder again")
            tensors[key] = held[key]
        files.append(path)
    return WeightFiles(folder, index, tuple(files), tensors)


def _file_tensors(path: Path) -> dict[str, StoredTensor]:
    if path.suffix.lower() == ".safetensors":
        return _safetensors_header(path)
    return {key: StoredTensor(key, path, t.dtype, tuple(t.shape), None, t.numel() * t.element_size())
            for key, t in _torch_state(path).items()}


def _safetensors_header(path: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file declares, every one checked to lie within the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path} is {size} bytes, too short for a safetensors header (8 bytes of "
                                      f"length, then JSON): the file is truncated or not safetensors")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise CheckpointError(f"{path}: the safetensors header says it is {length:,} bytes, but the file "
                                      f"has {size - 8:,} after the length: the header is corrupted or the file "
                                      f"truncated; write it again")
            text = f.read(length)
    except OSError as err:
        raise CheckpointError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: the safetensors header is not JSON ({err}): the file is corrupted; "
                              f"write it again") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object")
    base = 8 + length
    out: dict[str, StoredTensor] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        out[key] = _entry(path, key, entry, base, size)
    return out


def _entry(path: Path, key: str, entry: Any, base: int, size: int) -> StoredTensor:
    where = f"{path}: key {key!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: its header entry is not an object of dtype, shape and data_offsets")
    dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
    if dtype is None:
        raise CheckpointError(f"{where}: dtype {entry.get('dtype')!r} is not one this torch reads "
                              f"({', '.join(SAFETENSORS_DTYPES)})")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape {shape!r} is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[0] > offsets[1]):
        raise CheckpointError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if offsets[1] - offsets[0] != nbytes:
        raise CheckpointError(f"{where}: {offsets[1] - offsets[0]:,} bytes stored for a {entry['dtype']} tensor of "
                              f"shape {tuple(shape)}, which takes {nbytes:,}: the header is corrupted")
    if base + offsets[1] > size:
        raise CheckpointError(f"{where} needs bytes up to {base + offsets[1]:,}, and the file has {size:,}: "
                              f"the file is truncated; copy or write it again")
    return StoredTensor(key, path, dtype, tuple(shape), base + offsets[0], nbytes)


def _torch_state(path: Path) -> Mapping[str, torch.Tensor]:
    """A ``torch.save`` state dict, memory-mapped and unpickled with ``weights_only=True``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises pickle, zip and runtime errors here; named with the file
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path} cannot be read as a torch.save state dict ({first}); save it with "
                              f"torch.save(model.state_dict(), path) (hetpart loads tensors only, "
                              f"weights_only=True)") from None
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                 for k, v in state.items()):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of name -> tensor: save "
                              f"model.state_dict()")
    return state
