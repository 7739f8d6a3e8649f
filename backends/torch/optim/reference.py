"""The eager side of a training check: the same torch optimizer over the original model.

In: an eager model, the plan's optimizer (:class:`~backends.torch.optim.kinds.OptimizerKind`) and
the hyperparameters. Out: the torch optimizers that train it as the user would without hetpart
(:func:`reference_optimizers`): one of the plan's torch class over every trainable parameter; for
``sparse-adam`` torch's recipe, ``torch.optim.SparseAdam`` over the weights of embeddings made
with ``sparse=True`` and ``torch.optim.Adam`` over the rest.

Example:
    >>> model = torch.nn.Linear(2, 1)
    >>> [type(o).__name__ for o in reference_optimizers(model, optimizer_kind("sgd", {"lr": 0.1}))]
    ['SGD']
"""

from __future__ import annotations

import torch

from backends.torch.optim.kinds import OptimizerKind, optimizer_kind  # noqa: F401 - the doctest's

__all__ = ["reference_optimizers", "sparse_embedding_weights"]


def sparse_embedding_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weights of ``model``'s embeddings that make row-sparse gradients (``sparse=True``)."""
    out: list[torch.nn.Parameter] = []
    for module in model.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            if module.weight.requires_grad and all(module.weight is not p for p in out):
                out.append(module.weight)
    return out


def reference_optimizers(model: torch.nn.Module, kind: OptimizerKind) -> list[torch.optim.Optimizer]:
    """torch's optimizers training ``model`` as the plan's optimizer would (see the module docstring)."""
    params = [p for p in model.parameters() if p.requires_grad]
    hyper = kind.hyperparameters(kind.dense, kind.defaults)
    if kind.name != "sparse-adam":
        return [kind.dense(params, **hyper)]
    sparse = sparse_embedding_weights(model)
    dense = [p for p in params if all(p is not q for q in sparse)]
    sparse_cls = kind.torch_class(True)
    out: list[torch.optim.Optimizer] = []
    if sparse:
        out.append(sparse_cls(sparse, **kind.hyperparameters(sparse_cls, kind.defaults)))
    if dense:
        out.append(kind.dense(dense, **hyper))
    return out
