"""A pipeline plan's stages as ``nn.Module``\\ s, one per rank, cut from the captured graph.

In: a plan with a ``pipeline`` section, the model it was made for and the inputs of one
micro-batch. Out: :class:`StageGraphs`, which builds stage ``s``'s module: the captured graph's
ops placed on stage ``s``'s device, reading the tensors the previous stage sends and returning the
ones the next stage needs (the relay of :mod:`partitioner.solvers.pipeline`):

* stage 0 takes every graph input (the schedule feeds it the micro-batch); a later stage takes, in
  graph order, the values alive across its boundary, and returns the values alive across the next
  one (each made contiguous: ``torch.distributed`` sends contiguous tensors only); the last stage
  returns the model's outputs (one tensor, or a tuple);
* a received tensor passes through :func:`contiguous_grad`, so the gradient sent back is
  contiguous too;
* ``getitem`` of a multi-output op runs on its producer's stage (a tuple cannot be sent);
* parameters keep the model's names (``GraphModule`` copies the ``get_attr`` targets); a
  parameter read on several stages (tied weights) is held by each (see ``runtime.tied_groups``).

Values that are not tensors (Python numbers from dynamic shapes) cannot cross a boundary; such a
plan is refused with the value's name.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from backends.torch.module import capture_for, rebind_factory_devices, unlifted_module
from partitioner.errors import HetpartError, PlanMismatch
from partitioner.frontends.names import check_fx_names

__all__ = ["StageGraphs", "contiguous_grad"]


class _ContiguousGrad(torch.autograd.Function):
    """Identity forward; makes the incoming gradient contiguous (it is sent to another rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return grad.contiguous()


def contiguous_grad(x: torch.Tensor) -> torch.Tensor:
    """``x`` unchanged; in backward its gradient is made contiguous (torch.distributed sends
    contiguous tensors only, and autograd may produce strided gradients)."""
    return _ContiguousGrad.apply(x) if isinstance(x, torch.Tensor) and x.requires_grad else x


class StageGraphs:
    """The captured graph of a pipeline plan, cut into its stages.

    Example:
        >>> graphs = StageGraphs(plan, model, micro_batch)          # doctest: +SKIP
        >>> stage0 = graphs.module(0)
        >>> graphs.num_stages, graphs.attributes(1)
    """

    def __init__(self, plan: Any, model: torch.nn.Module, micro_batch: Sequence[Any]) -> None:
        if not plan.pipeline:
            raise HetpartError(f"{plan.source} has no pipeline section: make a pipeline plan with "
                               f"`hetpart plan MODEL --devices CLUSTER --objective throughput`")
        check_fx_names(model, "the pipeline backend", hint="as its stages are torch.fx modules")
        self.plan = plan
        self.devices = [st["device"] for st in plan.pipeline["stages"]]
        self.num_stages = len(self.devices)
        self.gm = unlifted_module(capture_for(plan, model, tuple(micro_batch)))
        self.nodes = list(self.gm.graph.nodes)
        self.stage = self._assign()
        self.live = [self._alive_after(b) for b in range(self.num_stages - 1)]

    # -- which stage runs what ----------------------------------------------------------------

    def _assign(self) -> dict[torch.fx.Node, int]:
        index = {d: i for i, d in enumerate(self.devices)}
        stage: dict[torch.fx.Node, int] = {}
        for node in self.nodes:
            if node.op == "placeholder":
                stage[node] = 0
            elif node.op.startswith("call"):
                src = node.args[0] if node.target is operator.getitem else None
                if isinstance(src, torch.fx.Node) and src in stage and not isinstance(src.meta.get("val"), torch.Tensor):
                    stage[node] = stage[src]  # an element of a tuple: taken where the tuple is made
                elif node.name in self.plan.placement:
                    stage[node] = index[self.plan.placement[node.name]]
                else:  # not an op of the plan (export's input guards): with its inputs
                    stage[node] = max((stage[a] for a in node.all_input_nodes if a in stage), default=0)
        for node in self.nodes:
            for arg in node.all_input_nodes:
                if node in stage and arg in stage and stage[arg] > stage[node]:
                    raise PlanMismatch(f"{self.plan.source}: {node.name} (stage {stage[node]}) reads {arg.name} "
                                       f"(stage {stage[arg]}): pipeline stages must be contiguous")
        return stage

    def _alive_after(self, boundary: int) -> list[torch.fx.Node]:
        """Values produced at stage <= boundary and read later (outputs: by the last stage)."""
        out_node = self.nodes[-1]
        alive = []
        for node in self.nodes:
            if node not in self.stage or self.stage[node] > boundary:
                continue
            readers = [self.stage.get(u, self.num_stages - 1) if u is not out_node else self.num_stages - 1
                       for u in node.users]
            if any(r > boundary for r in readers):
                val = node.meta.get("val")
                if val is not None and not isinstance(val, torch.Tensor):
                    raise HetpartError(
                        f"{node.name!r} ({type(val).__name__}) crosses from stage {self.stage[node]} to a later "
                        f"stage: pipeline stages exchange tensors only; re-plan with that value's consumers pinned "
                        f"to stage {self.stage[node]}'s device ({self.devices[self.stage[node]]})")
                alive.append(node)
        return alive

    def attributes(self, s: int) -> list[str]:
        """The ``get_attr`` targets (parameter and buffer names) stage ``s`` reads."""
        return sorted({str(a.target) for n in self.nodes if self.stage.get(n) == s and n.op != "placeholder"
                       for a in n.all_input_nodes if a.op == "get_attr"})

    # -- building a stage ---------------------------------------------------------------------

    def module(self, s: int, device: torch.device | str = "cpu") -> torch.fx.GraphModule:
        """Stage ``s`` as a GraphModule with its parameters on ``device`` (a copy: the model and
        the captured graph are not touched)."""
        if not 0 <= s < self.num_stages:
            raise HetpartError(f"stage {s} does not exist: the plan has {self.num_stages} stages")
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        inputs = [n for n in self.nodes if n.op == "placeholder"] if s == 0 else self.live[s - 1]
        for node in inputs:
            env[node] = graph.placeholder(node.name)
            if s > 0:
                env[node] = graph.call_function(contiguous_grad, (env[node],))
        for node in self.nodes:
            if self.stage.get(node) != s or node.op == "placeholder":
                continue
            for arg in node.all_input_nodes:
                if arg.op == "get_attr" and arg not in env:
                    env[arg] = graph.get_attr(arg.target)
            env[node] = graph.node_copy(node, lambda a: env[a])
        if s < self.num_stages - 1:
            graph.output(tuple(graph.call_method("contiguous", (env[n],)) for n in self.live[s]))
        else:
            outs = [a for a in torch.utils._pytree.tree_leaves(self.nodes[-1].args[0]) if isinstance(a, torch.fx.Node)]
            graph.output(env[outs[0]] if len(outs) == 1 else tuple(env[n] for n in outs))
        module = torch.fx.GraphModule(self.gm, graph, class_name=f"Stage{s}")
        module = _copied(module).to(device)
        rebind_factory_devices(module, {n.name: str(device) for n in module.graph.nodes}, {str(device): torch.device(device)})
        module.recompile()
        return module

    def input_count(self, s: int) -> int:
        """How many tensors stage ``s`` receives (stage 0: the graph inputs)."""
        return sum(1 for n in self.nodes if n.op == "placeholder") if s == 0 else len(self.live[s - 1])


def _copied(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Own copies of the parameters and buffers (the stage trains them; the caller's stay as they are)."""
    memo: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                if id(p) not in memo:
                    memo[id(p)] = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                sub._parameters[name] = memo[id(p)]
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = b.detach().clone()
    return module


def parameter_names(model: torch.nn.Module) -> Mapping[str, str]:
    """Every name a parameter of ``model`` is reachable by → its first name (tied weights share one).

    Example:
        >>> parameter_names(gpt)["lm_head.weight"]      # doctest: +SKIP
        'tok_emb.weight'
    """
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out
