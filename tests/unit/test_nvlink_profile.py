"""The 8-GPU NVLink profile (issue 34): it loads with its datasheet figures, every GPU pair has an
NVLink link and every GPU a PCIe link to the host, every number cites a source, and a model plans
on it (eight interchangeable GPUs: the symmetry rows keep the ILP small)."""

from __future__ import annotations

import models
from cost_models.profiles import builtin_profile_path, builtin_profiles, load_profile
from partitioner import partition
from tests.unit.test_generation_profiles import _uncited_numbers

NAME = "8xh100-nvlink"


def test_it_is_built_in_with_its_datasheet_figures() -> None:
    assert NAME in builtin_profiles()
    ds = load_profile(NAME)
    gpus = [f"cuda:{i}" for i in range(8)]
    assert ds.names() == ("cpu", *gpus)
    for g in gpus:
        d = ds.device(g)
        assert d.memory == 80_000_000_000 and d.peak("bfloat16") == 989.4e12 and d.peak("float32") == 66.9e12
    assert ds.device("cpu").memory == 2 * 10 ** 12
    kinds = {}
    for link in ds.links:
        kinds.setdefault(link.kind, set()).add(frozenset(link.between))
    assert kinds["nvlink"] == {frozenset((a, b)) for a in gpus for b in gpus if a < b}  # all 28 pairs
    assert kinds["pcie"] == {frozenset(("cpu", g)) for g in gpus}
    assert all(link.bandwidth == 450e9 for link in ds.links if link.kind == "nvlink")


def test_every_number_cites_a_source() -> None:
    assert _uncited_numbers(builtin_profile_path(NAME).read_text()) == []


def test_a_model_too_large_for_one_gpu_plans_over_several() -> None:
    import torch

    module, _ = models.get("mlp", "small", device="meta")
    inputs = (torch.zeros(4096, 1024, device="meta"),)  # 8.6 GFLOP a layer: the GPUs are worth the copies
    per_gpu = {f"cuda:{i}": "40MB" for i in range(8)}  # a layer (4 MiB) and its 16 MiB in- and output each
    plan = partition(module, inputs, NAME, memory=per_gpu, streaming=False, time_limit=30)
    used = {d for d in plan.placement.values()}
    assert plan.solver.status in ("optimal", "within gap"), plan.summary()
    assert len(used - {"cpu"}) >= 3, plan.summary()
