"""The nodes a split op is rewritten into: shard calls on their devices and the split's copies.

In: a private GraphModule, the split op's node and its plan entry. Out: :class:`Pieces`, which
inserts each new node before the op's node with the metadata the placing and strict-devices passes
read (``meta["hetpart_device"]``: where its value lives; ``meta["hetpart_split"]``: the site it runs,
shard ``i``'s ``"<op>.shard<i>"`` or one of the split's copies) and records the logical device each
runs on (``placed``; a copy runs where its input lives). Used by :mod:`backends.torch.split_tables`
and :mod:`backends.torch.split_batches`. Also the names every split's rewrite shares
(:func:`shard_site`, :func:`device_word`) and :func:`replace_with_pieces`, which registers a cut
tensor's pieces on their devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

__all__ = ["SPLIT_ATTR", "Pieces", "device_word", "joined_pieces", "replace_with_pieces", "shard_site"]

#: module attribute: original tensor name -> (axis dim, or None for whole copies, (shard names...))
SPLIT_ATTR = "_hetpart_splits"


def shard_site(op: str, index: int) -> str:
    """The strict-devices name of shard ``index`` of split op ``op``."""
    return f"{op}.shard{index}"


def device_word(device: str) -> str:
    """``device`` as a word for node and attribute names (``cuda:0`` -> ``cuda_0``)."""
    return "".join(c if c.isalnum() else "_" for c in str(device))


def joined_pieces(gm: torch.fx.GraphModule) -> dict[str, tuple[int | None, tuple[str, ...]]]:
    """Start a rewrite that cuts ``gm``'s tensors into pieces: remember the original's ``state_dict``
    key order (once: the first rewrite sees the original) and return a copy of the pieces already
    joined (:data:`SPLIT_ATTR`), for the rewrite to add to and store back."""
    if not hasattr(gm, "_hetpart_state_order"):  # the original's key order, which state_dict keeps
        gm._hetpart_state_order = list(gm.state_dict(keep_vars=True))
    return dict(getattr(gm, SPLIT_ATTR, {}))


def replace_with_pieces(gm: torch.fx.GraphModule, target: str, tensor: torch.Tensor, pieces: list[torch.Tensor],
                        devices: tuple[torch.device, ...], word: str, dim: int | None, joined: dict) -> tuple[str, ...]:
    """Register each of ``pieces`` (cut from ``tensor``, a parameter or buffer at ``target``) on its
    device beside it as ``<name>_<word><i>`` (a parameter when ``tensor`` is one, with its
    ``requires_grad``), remove ``tensor``, and record in ``joined`` the dim they join along and their
    names (:data:`SPLIT_ATTR`). Returns the new attributes' names."""
    owner, _, name = target.rpartition(".")
    module = gm.get_submodule(owner) if owner else gm
    names = []
    for i, (piece, device) in enumerate(zip(pieces, devices)):
        local = f"{name}_{word}{i}"
        value = piece.detach().to(device).clone()
        if isinstance(tensor, torch.nn.Parameter):
            module.register_parameter(local, torch.nn.Parameter(value, requires_grad=tensor.requires_grad))
        else:
            module.register_buffer(local, value)
        names.append(f"{owner}.{local}" if owner else local)
    delattr(module, name)
    joined[target] = (dim, tuple(names))
    return tuple(names)


class Pieces:
    """New nodes for split op ``node`` (see the module docstring).

    Example:
        >>> pieces = Pieces(gm, node, physical)                          # doctest: +SKIP
        >>> part = pieces.call(torch.ops.aten.gelu.default, (x,), 1, "cpu")  # doctest: +SKIP
    """

    def __init__(self, gm: torch.fx.GraphModule, node: torch.fx.Node, physical: Mapping[str, torch.device]) -> None:
        self.graph, self.node, self.physical = gm.graph, node, physical
        self.op = node.name
        self.placed: dict[str, str] = {}

    def _make(self, kind: str, target: Any, args: tuple, kwargs: dict, runs_on: str, lives_on: str, site: dict,
              name: str) -> torch.fx.Node:
        with self.graph.inserting_before(self.node):
            n = self.graph.create_node(kind, target, args, kwargs, name=name)
        n.meta["hetpart_device"] = lives_on
        n.meta["hetpart_split"] = site
        self.placed[n.name] = runs_on
        return n

    def call(self, target: Any, args: tuple, shard: int, device: str, kwargs: dict | None = None,
             name: str | None = None) -> torch.fx.Node:
        """``target(*args, **kwargs)`` as part of shard ``shard``, on ``device``."""
        return self._make("call_function", target, args, kwargs or {}, device, device,
                          {"op": shard_site(self.op, shard)}, name or f"{self.op}_s{shard}")

    def copy(self, value: torch.fx.Node, src: str, dst: str, part: int | None = None) -> torch.fx.Node:
        """``value.to(dst)``: one of the split's copies (``part``: one of several of the same
        transfer, each input of a batch split)."""
        tensor = self.op if part is None else f"{self.op}.part{part}"
        return self._make("call_method", "to", (value, self.physical[dst]), {}, src, dst,
                          {"tensor": tensor, "kind": "split"}, f"{self.op}_to_{device_word(dst)}")

    def attr(self, target: str, device: str) -> torch.fx.Node:
        """A ``get_attr`` of ``target``, a tensor made on ``device``."""
        with self.graph.inserting_before(self.node):
            n = self.graph.get_attr(target)
        n.meta["hetpart_device"] = device
        return n

