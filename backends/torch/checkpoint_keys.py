"""Which checkpoint keys fill which tensors of the model, checked before a byte is read.

In: the model (a transformers model on the meta device, or any module), the tensors to fill
(name -> the shape and dtype the model has, tied names grouped), and the stored tensors of a
checkpoint (:class:`~backends.torch.checkpoint_files.WeightFiles`). Out: a :class:`KeyPlan`: each
tensor group filled from one stored key (``direct``), or from several through a transformers
weight conversion (``converted``: Qwen2-MoE's experts are stored one per module and fused into one
tensor per layer by transformers 5; the conversion ops are transformers' own, looked up with
``get_model_conversion_mapping`` and applied as ``from_pretrained`` applies them).

Checked here, each a :class:`~partitioner.errors.CheckpointError` naming the key and its shard:

* a tensor of the model no key fills (missing; a tied group needs one of its names);
* a key that fills nothing (unexpected), unless the model lists it in ``_keys_to_ignore_on_load_unexpected``;
* a key whose shape differs from its tensor's (converted groups: the shape the conversion makes,
  run on meta tensors);
* a key whose dtype differs, unless a cast was asked (``cast=True``, a dtype given to open the folder).

Example:
    >>> plan = plan_keys(model, wanted, files)                    # doctest: +SKIP
    >>> plan.direct["model.embed_tokens.weight"].where()
    "key 'model.embed_tokens.weight' in model-00001-of-00013.safetensors"
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from backends.torch.checkpoint_files import StoredTensor, WeightFiles
from partitioner.errors import CheckpointError

__all__ = ["Converted", "KeyPlan", "Wanted", "plan_keys"]

SHOWN = 5  # keys named in one message


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A tensor of the model to fill: all its names (tied weights share one), shape and dtype."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Converted:
    """Model tensors made from several stored ones by a transformers conversion."""

    targets: tuple[str, ...]          # model names (first name of each group) it makes
    sources: tuple[StoredTensor, ...]
    make: Callable[[Callable[[StoredTensor], torch.Tensor]], dict[str, torch.Tensor]]  # read -> target tensors


@dataclasses.dataclass(frozen=True)
class KeyPlan:
    """Where each wanted tensor comes from (see the module docstring)."""

    direct: Mapping[str, StoredTensor]   # first name of a wanted group -> its stored tensor
    converted: tuple[Converted, ...]


def plan_keys(model: torch.nn.Module, wanted: Sequence[Wanted], files: WeightFiles, *, cast: bool = False,
              ignored: Collection[str] = ()) -> KeyPlan:
    """Match the checkpoint's keys with the model's tensors (see the module docstring). Keys in
    ``ignored`` (tensors the constructor makes, such as old checkpoints' ``position_ids``) are skipped.

    Raises:
        CheckpointError: a missing, unexpected, misshapen or mistyped key, named with its shard.
    """
    by_name = {n: w for w in wanted for n in w.names}
    renamed, converters = _renamed(model, files, by_name)
    direct: dict[str, StoredTensor] = {}
    groups: dict[str, list[tuple[StoredTensor, str]]] = {}
    unexpected = []
    for key, stored in files.tensors.items():
        target, pattern = renamed.get(key, (key, None))
        if target not in by_name:
            if target not in ignored and key not in ignored and not _ignored(model, "_keys_to_ignore_on_load_unexpected", key):
                unexpected.append(stored)
            continue
        first = by_name[target].names[0]
        if pattern is not None:
            groups.setdefault(first, []).append((stored, pattern))
        elif first not in direct:  # a tied group stored under two names is read once
            direct[first] = stored
    if unexpected:
        raise CheckpointError(
            f"{files.source}: {len(unexpected)} key(s) fill no tensor of {type(model).__name__}: "
            f"{', '.join(s.where() for s in unexpected[:SHOWN])}{', ...' if len(unexpected) > SHOWN else ''}; "
            f"the checkpoint is of another model (or another version of it): check config.json")
    converted = tuple(_converted(model, first, members, converters[members[0][1]], by_name, cast)
                      for first, members in groups.items())
    made = {t for c in converted for t in c.targets}
    missing = [w for w in wanted if w.names[0] not in direct and w.names[0] not in made
               and not all(_ignored(model, "_keys_to_ignore_on_load_missing", n) for n in w.names)]
    if missing:
        names = ", ".join(repr(w.names[0]) for w in missing[:SHOWN]) + (", ..." if len(missing) > SHOWN else "")
        raise CheckpointError(f"{files.source} holds no tensor for {len(missing)} of {type(model).__name__}'s: "
                              f"{names}; the checkpoint is incomplete or of another model: write it again with "
                              f"model.save_pretrained")
    for first, stored in direct.items():
        _check(by_name[first], stored, stored.shape, stored.dtype, cast)
    return KeyPlan(direct, converted)


def _check(want: Wanted, stored: StoredTensor, shape: tuple[int, ...], dtype: torch.dtype, cast: bool) -> None:
    if tuple(shape) != want.shape:
        raise CheckpointError(f"{stored.where()} has shape {tuple(shape)}, and {want.names[0]!r} of the model "
                              f"is {want.shape}: the checkpoint does not match config.json")
    if dtype != want.dtype and not cast:
        have, built = str(dtype).removeprefix("torch."), str(want.dtype).removeprefix("torch.")
        raise CheckpointError(f"{stored.where()} is {have}, and the model is built in {built}: ask for the dtype "
                              f"(--dtype {built}, or dtype= when opening the folder) to cast it while loading, or "
                              f"build the model as stored (--dtype {have})")


def _ignored(model: torch.nn.Module, attr: str, key: str) -> bool:
    patterns = getattr(model, attr, None) or ()
    return any(re.search(p, key) for p in patterns)


# -- transformers' conversions -----------------------------------------------------------------


def _renamed(model: torch.nn.Module, files: WeightFiles,
             by_name: Mapping[str, Wanted]) -> tuple[dict[str, tuple[str, str | None]], dict[str, Any]]:
    """Each stored key -> (model name, converter source pattern or None), as transformers renames
    keys on loading; and the converter of each pattern. Plain modules: every key as it is."""
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # transformers before 5 renames no keys hetpart needs to follow
        return {}, {}
    if not isinstance(model, PreTrainedModel):
        return {}, {}
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    meta_state = {name: True for name in by_name}
    prefix = getattr(model, "base_model_prefix", None)
    out: dict[str, tuple[str, str | None]] = {}
    for key in files.tensors:
        target, pattern = rename_source_key(key, renamings, converters, prefix, meta_state)
        if target not in meta_state and key in meta_state:
            target, pattern = key, None
        out[key] = (target, pattern)
    return out, {p: c for c in converters for p in c.source_patterns}


def _converted(model: torch.nn.Module, first: str, members: list[tuple[StoredTensor, str]], template: Any,
               by_name: Mapping[str, Wanted], cast: bool) -> Converted:
    """The conversion making ``first`` (and any sibling targets) from ``members``, its output
    shapes checked by running it on meta tensors."""
    def make(read: Callable[[StoredTensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        converter = copy.deepcopy(template)
        for stored, pattern in members:
            converter.add_tensor(first, stored.key, pattern, lambda s=stored: read(s))
        made = converter.convert(first, model=model, config=getattr(model, "config", None))
        return {name: (value[0] if isinstance(value, list) else value) for name, value in made.items()}

    where = f"{', '.join(s.where() for s, _ in members[:2])}{', ...' if len(members) > 2 else ''}"
    try:
        with _disable_current_modes():  # meta tensors: no device a checking mode (strict devices) knows
            shapes = make(lambda s: torch.empty(s.shape, dtype=s.dtype, device="meta"))
    except Exception as err:  # transformers' conversion ops: their error, named with the keys
        raise CheckpointError(f"converting {where} into {first!r} failed: {type(err).__name__}: "
                              f"{str(err).strip()[:200]}; the checkpoint does not match config.json") from err
    unknown = [n for n in shapes if n not in by_name]
    if unknown:
        raise CheckpointError(f"converting {where} makes {unknown[0]!r}, which {type(model).__name__} does not have")
    for name, value in shapes.items():
        _check(by_name[name], members[0][0], tuple(value.shape), value.dtype, cast)
    return Converted(tuple(by_name[n].names[0] for n in shapes), tuple(s for s, _ in members), make)
