"""Strict devices: run a plan on logical devices that really differ, on a CPU-only machine.

In: the plan's logical devices (``cpu``, ``cuda:0``, ``npu:0``), its host, and where it places
each op; then the run of a placed program. Out: a :class:`StrictDevices` dispatch mode that fails
on the first op whose inputs sit on different logical devices, or on a logical device other than
the op's planned one (:class:`~partitioner.errors.DeviceMismatch`, naming the op, the tensor and
both devices), and that records every copy between logical devices and tells the bytes resident
on each; :func:`backends.strict_report.compare_with_plan` puts them beside the plan's transfers
and parameter bytes.

How logical devices are told apart while every tensor is on the CPU
--------------------------------------------------------------------

Each logical device is *bound* to its own CPU tag, ``torch.device("cpu", i)``
(:func:`strict_binding`: ``{"cpu": "cpu:1", "cuda:0": "cpu:2", "npu:0": "cpu:3"}``). A backend
builds its program with that binding in place of ``{"cuda:0": "cpu"}``. Tensors keep no device
index on the CPU, but every call that names a device reaches the dispatcher with it: a
``.to(DEVICE)`` between two tags is a real ``aten._to_copy(device=cpu:i)`` (where a copy between
two devices bound to plain ``"cpu"`` would return its input and never be seen), and a factory
(``arange``, ``zeros``) carries its ``device=cpu:i``. The mode keeps a side table from each
tensor's storage to the logical device it lives on: tensors made inside the mode take the device
of their inputs, of their ``device=`` argument, or of the copy's destination; tensors made
outside (inputs, untouched weights) live on the host. A view shares its base's storage and so its
device; physically nothing changes, so a run outside the mode (backward, timing) is unaffected.
A 0-dim tensor on the host may meet tensors of any device, as torch allows for CPU scalars.

Knowing which op of the plan is running: a backend registers the code of its generated program
with :meth:`StrictDevices.watch` (code object, line number -> :class:`Site`: the plan op the line
runs, or the plan's name of the tensor it copies); at each dispatched call the mode finds the
innermost frame running watched code and reads the site of its line. Lines without an op of the
plan (copies, streamed-weight fetches) are transfers; a copy is recorded under the name its site
gives (else the name of what it copies). A backend names inputs and parameters with
:meth:`StrictDevices.name`; outputs of an op carry the op's name in errors. A plain ``cpu`` that
an op's own call names (``arange(device="cpu")``) is the host; inside another call (a kernel
allocating with its input's options) it names nothing, and the tensor is the op's.

The torch backend feeds it in :mod:`backends.torch.strict`: ``plan.emit(model, binding)`` with the
strict binding, the emitted module's ``forward`` watched through its fx code (``module.code``; a
file from ``emit_source`` through the generator's line map), parameters named by their qualified
names. Any backend whose program runs torch ops in this process (``torch.compile`` graphs,
pipeline stages on CPU ranks) can do the same; one that runs elsewhere (onnxruntime sessions) can
call :meth:`StrictDevices.record_copy` and :meth:`StrictDevices.check_reads` itself where it moves
tensors and runs parts.

Example:
    >>> mode = StrictDevices(["cpu", "cuda:0"], host="cpu")
    >>> mode.binding
    {'cpu': 'cpu:1', 'cuda:0': 'cpu:2'}
    >>> with mode:
    ...     x = torch.ones(3)                      # made on the host
    ...     y = x.to(mode.binding["cuda:0"])       # a copy cpu -> cuda:0
    ...     z = y * 2                              # on cuda:0
    >>> [(c.src, c.dst, c.bytes) for c in mode.copies]
    [('cpu', 'cuda:0', 12)]
    >>> mode.device_of(z)
    'cuda:0'
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from types import CodeType
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from partitioner.errors import DeviceMismatch

__all__ = ["Copy", "Site", "StrictDevices", "schema_name", "strict_binding"]

_COPY_OPS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten.copy.default})


def strict_binding(devices: Sequence[str]) -> dict[str, str]:
    """Each logical device bound to its own CPU tag (``cpu:1``, ``cpu:2``, ... in the given order).

    Example:
        >>> strict_binding(["cpu", "cuda:0", "npu:0"])
        {'cpu': 'cpu:1', 'cuda:0': 'cpu:2', 'npu:0': 'cpu:3'}
    """
    return {d: f"cpu:{i}" for i, d in enumerate(devices, start=1)}


@dataclasses.dataclass(frozen=True)
class Copy:
    """One copy between two logical devices, as the program made it."""

    tensor: str        # the plan's name of what was copied (tensor, parameter)
    src: str           # logical device it left
    dst: str           # logical device it reached
    bytes: int
    op: str | None     # the plan op whose line made it (None: a transfer line of its own)
    kind: str = ""     # "weights": a streamed fetch; "" : an activation, or a parameter's copy


class Site(NamedTuple):
    """What one line of a watched program does, in the plan's words."""

    op: str | None = None      # the plan op the line runs (None: the line is a transfer)
    tensor: str | None = None  # the plan's name of the tensor the line copies, if it copies one
    call: str | None = None    # the schema name of the line's own call ("aten::arange"): a plain
                               # ``cpu`` it names is the host; inside other calls it is the op's device
    kind: str = ""             # "weights" when the line fetches streamed weights


_NOWHERE = Site()


class StrictDevices(TorchDispatchMode):
    """A dispatch mode that tags every tensor with its logical device (see the module docstring).

    Parameters:
        devices: the plan's logical devices; each is bound to ``cpu:i`` (:attr:`binding`).
        host: the logical device graph inputs start on (the plan's host CPU).
        planned: op name -> logical device the plan places it on.
    """

    def __init__(self, devices: Sequence[str], host: str, planned: Mapping[str, str] | None = None) -> None:
        super().__init__()
        if host not in devices:
            raise DeviceMismatch(f"the host {host!r} is not one of the devices {', '.join(devices)}")
        self.binding = strict_binding(devices)
        self.host = host
        self.planned = dict(planned or {})
        self.copies: list[Copy] = []
        self._logical = {torch.device(tag): d for d, tag in self.binding.items()}
        self._storages: dict[int, tuple[StorageWeakRef, str]] = {}   # storage -> (weak ref, logical device)
        self._names: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # tensor -> the plan's name
        self._sites: dict[CodeType, Mapping[int, Site]] = {}

    # -- what a backend tells the mode ------------------------------------------------------------

    def watch(self, code: CodeType, sites: Mapping[int, Site]) -> None:
        """Calls made while ``code`` runs line ``n`` belong to ``sites[n]`` (lines not listed: no op)."""
        self._sites[code] = dict(sites)

    def place(self, tensor: torch.Tensor, device: str, name: str | None = None) -> None:
        """Say that ``tensor`` (made outside the mode) lives on logical ``device``, optionally named."""
        if device not in self.binding:
            raise DeviceMismatch(f"{device!r} is not a logical device here ({', '.join(self.binding)})")
        ref = StorageWeakRef(tensor.untyped_storage())
        self._storages[ref.cdata] = (ref, device)
        if name is not None:
            self._names[tensor] = name

    def name(self, tensor: torch.Tensor, name: str) -> None:
        """Call ``tensor`` by the plan's ``name`` in errors and copies."""
        self._names[tensor] = name

    def reset(self) -> None:
        """Forget the copies recorded so far (a new step begins)."""
        self.copies = []

    # -- what the mode knows ------------------------------------------------------------------

    def logical(self, device: torch.device | str) -> str:
        """The logical device a physical one stands for (plain ``cpu``: the host)."""
        dev = torch.device(device)
        found = self._logical.get(dev)
        if found is not None:
            return found
        if dev.type == "cpu" and dev.index is None:
            return self.host
        tags = ", ".join(f"{d}={t}" for d, t in self.binding.items())
        raise DeviceMismatch(f"device {dev} is not bound to a logical device of the plan (strict binding: {tags}); "
                             f"build the program with the strict binding")

    def device_of(self, tensor: torch.Tensor) -> str:
        """The logical device ``tensor`` lives on (the host for tensors the mode has not seen)."""
        try:
            ref = StorageWeakRef(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):  # no storage (sparse, nested): where it was made
            return self.host
        entry = self._storages.get(ref.cdata)
        if entry is None or entry[0].expired():
            return self.host
        return entry[1]

    def name_of(self, tensor: torch.Tensor) -> str:
        """The plan's name of ``tensor`` where known, else a description."""
        return self._names.get(tensor) or f"a {'×'.join(map(str, tensor.shape)) or 'scalar'} tensor"

    def resident(self, named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int]:
        """Bytes each logical device holds of the given tensors (a storage shared by several counted once)."""
        largest: dict[int, tuple[str, int]] = {}
        for _, tensor in named:
            ref = StorageWeakRef(tensor.untyped_storage())
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes >= largest.get(ref.cdata, ("", -1))[1]:
                largest[ref.cdata] = (self.device_of(tensor), nbytes)
        out = {d: 0 for d in self.binding}
        for device, nbytes in largest.values():
            out[device] += nbytes
        return out

    # -- checks a backend can call directly -----------------------------------------------------

    def check_reads(self, op: str, what: str, reads: Sequence[tuple[str, str]], planned: str | None) -> str | None:
        """The device ``op`` runs on given the ``(tensor name, device)`` pairs it reads.

        Raises:
            DeviceMismatch: a read is not on ``planned``, or two reads sit on different devices.
        """
        for name, device in reads:
            if planned is not None and device != planned:
                raise DeviceMismatch(f"op {op} ({what}) is planned on {planned} but reads {name} on {device}: "
                                     f"the program is missing a copy of {name} from {device} to {planned}")
        for name, device in reads[1:]:
            if device != reads[0][1]:
                raise DeviceMismatch(f"op {op} ({what}) reads {reads[0][0]} on {reads[0][1]} and {name} on "
                                     f"{device}: one of them must be copied first")
        return reads[0][1] if reads else None

    def record_copy(self, tensor: str, src: str, dst: str, nbytes: int, op: str | None = None,
                    kind: str = "") -> None:
        """Count one copy from ``src`` to ``dst``: nothing when they are the same device or it moves
        no bytes (the plan has no transfer for an empty tensor)."""
        if src != dst and nbytes > 0:
            self.copies.append(Copy(tensor, src, dst, int(nbytes), op, kind))

    # -- the mode -------------------------------------------------------------------------------

    def _site(self) -> Site:
        frame = sys._getframe(2)
        while frame is not None:
            sites = self._sites.get(frame.f_code)
            if sites is not None:
                return sites.get(frame.f_lineno, _NOWHERE)
            frame = frame.f_back
        return _NOWHERE

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        site = self._site()
        planned = self.planned.get(site.op) if site.op is not None else None
        what = str(func).removesuffix(".default")
        if func in _COPY_OPS:
            out, device = self._copy(func, args, kwargs, site, planned, what)
        else:
            out, device = self._compute(func, args, kwargs, site, planned, what)
        self._tag(out, device, site, args, kwargs)
        return out

    def _named_device(self, func: Any, device: Any, site: Site) -> str | None:
        """The logical device a call's ``device=`` names: a tag; plain ``cpu`` written on the line
        itself is the host; plain ``cpu`` inside another call (a kernel's ``input.options()``) names
        nothing."""
        if device is None:
            return None
        dev = torch.device(device)
        if dev.index is not None or func._schema.name == site.call or site.op is None:
            return self.logical(dev)
        return None

    def _compute(self, func: Any, args: tuple, kwargs: dict, site: Site, planned: str | None,
                 what: str) -> tuple[Any, str]:
        reads = [(self.name_of(t), self.device_of(t)) for t in _tensors(args, kwargs)
                 if not (t.dim() == 0 and self.device_of(t) == self.host)]
        device = self.check_reads(site.op or what, what, reads, planned)
        named = self._named_device(func, kwargs.get("device"), site)
        own_call = site.op is None or func._schema.name == site.call
        if named is not None:
            device = named
        elif device is None:  # made from nothing: where torch puts it (inside an op's kernel: the op's device)
            device = self.host if own_call or planned is None else planned
        out = func(*args, **kwargs)
        if planned is not None and device != planned:
            leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            if device != self.host or any(t.dim() > 0 for t in leaves):  # a host scalar may go anywhere
                raise DeviceMismatch(f"op {site.op} ({what}) is planned on {planned} but creates a tensor on {device}: "
                                     f"its device= must be {planned}'s")
        return out, device

    def _copy(self, func: Any, args: tuple, kwargs: dict, site: Site, planned: str | None,
              what: str) -> tuple[Any, str]:
        """A copy between devices: check its destination, run it, count it."""
        if func is torch.ops.aten._to_copy.default:
            source = args[0]
            src = self.device_of(source)
            dst = self.logical(kwargs["device"]) if kwargs.get("device") is not None else src
        else:  # copy_(self, src) / copy(self, src): the data of src lands on self's device
            source = args[1]
            src, dst = self.device_of(source), self.device_of(args[0])
        name = site.tensor or self.name_of(source)
        if planned is not None and dst != planned:
            raise DeviceMismatch(f"op {site.op} ({what}) is planned on {planned} but copies {name} to {dst}")
        out = func(*args, **kwargs)
        self.record_copy(name, src, dst, source.numel() * source.element_size(), site.op, site.kind)
        return out, dst

    def _tag(self, out: Any, device: str, site: Site, args: tuple, kwargs: dict) -> None:
        inputs = _tensors(args, kwargs)
        for leaf in pytree.tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            if not any(leaf is t for t in inputs):  # an in-place result keeps its storage's device
                ref = StorageWeakRef(leaf.untyped_storage())
                self._storages[ref.cdata] = (ref, device)
            if site.op is not None:
                self._names[leaf] = site.op
            elif site.tensor is not None:
                self._names[leaf] = site.tensor
            elif leaf not in self._names and inputs and inputs[0] in self._names:
                self._names[leaf] = self._names[inputs[0]]  # a view or copy is still what it was


def schema_name(target: Any) -> str | None:
    """The schema name of an operator (``"aten::arange"``) for :attr:`Site.call`; None for other callables."""
    schema = getattr(target, "_schema", None)
    return schema.name if schema is not None else None


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
