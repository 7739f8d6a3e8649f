"""Splits over three or more devices (partitioner/solvers/splits.py): shard sizes, the degrees
option and its CLI text, what is offered on an 8-GPU host, the path priced by hand (copies on
distinct links overlap, copies sharing one wait), and how evaluate charges each device and link."""

from __future__ import annotations

import collections

import pytest
import torch

from cost_models.profiles import load_profile_text
from partitioner import from_module, load_profile
from partitioner.errors import HetpartError
from partitioner.solvers.problem import Objective, Options, Placement, Problem, evaluate
from partitioner.solvers.splits import Split, SplitOptions, even_shares, resolve_splits, shard_sizes

#: cpu and two like GPUs, each linked to the cpu only: a copy between the GPUs crosses both links.
NO_PEER_LINK = """
[devices.cpu]
kind = "cpu"
memory = "64GiB"
peak_flops = { float32 = 1e12 }
mem_bandwidth = "40GB/s"
launch_overhead = "2us"
""" + "".join(f"""
[devices."cuda:{i}"]
kind = "gpu"
memory = "16GiB"
peak_flops = {{ float32 = 5e13 }}
mem_bandwidth = "2000GB/s"
launch_overhead = "10us"

[[links]]
between = ["cpu", "cuda:{i}"]
bandwidth = "25GB/s"
latency = "10us"
""" for i in range(2))


def _problem(profile, objective: Objective = Objective.LATENCY, **splits: object) -> Problem:
    """One 64 -> 256 linear with a bias on a [32, 64] input."""
    torch.manual_seed(0)
    graph = from_module(torch.nn.Linear(64, 256).eval(), (torch.randn(32, 64),))
    return Problem(graph, profile, Options(objective=objective, streaming=False, splits=SplitOptions(**splits)))


def test_shard_sizes_over_n_devices_sum_to_the_length_and_keep_one_each() -> None:
    assert shard_sizes(8, (1 / 3, 1 / 3, 1 / 3)) == (3, 2, 3)
    assert shard_sizes(12, even_shares(4)) == (3, 3, 3, 3)
    assert shard_sizes(3, (0.98, 0.01, 0.01)) == (1, 1, 1)
    assert shard_sizes(10, (0.75, 0.25)) == (8, 2)  # two devices: home's share rounded, as before
    for n in (3, 5, 8):
        sizes = shard_sizes(37, even_shares(n))
        assert sum(sizes) == 37 and min(sizes) >= 1 and len(sizes) == n
    with pytest.raises(HetpartError, match="a dimension of 2 cannot be split over 3 devices"):
        shard_sizes(2, even_shares(3))


def test_degrees_from_the_mapping_and_the_cli_text_and_bad_ones_refused_by_name() -> None:
    assert resolve_splits("cols,rows@2/4/8").degrees == (2, 4, 8)
    assert resolve_splits("cols:0.5@8") == SplitOptions(fractions=(0.5,), axes=("cols",), degrees=(8,))
    assert resolve_splits("time:8/16@2").chunks == (8, 16)
    assert resolve_splits({"degrees": [2, 3]}).degrees == (2, 3)
    assert SplitOptions().degrees == (2, 4, 8)
    with pytest.raises(HetpartError, match=r"split degrees \[1\]: each is a whole number of devices .*at least 2"):
        resolve_splits("cols@1")
    with pytest.raises(HetpartError, match=r"degrees \(after '@'\) are whole numbers .*cols,rows@2/4/8"):
        resolve_splits("cols@eight")
    with pytest.raises(HetpartError, match="split degrees"):
        SplitOptions(degrees=(2.5,))


def test_a_split_names_distinct_devices_one_fraction_each() -> None:
    with pytest.raises(HetpartError, match="two or more distinct devices, one fraction each"):
        Split("cols", ("cuda:0", "cuda:0"), (0.5, 0.5))
    with pytest.raises(HetpartError, match="one fraction each"):
        Split("cols", ("cpu", "cuda:0", "cuda:1"), (0.5, 0.5))
    assert Split("rows", ("cuda:0", "cuda:1", "cpu"), (0.4, 0.4, 0.2)).label == "rows[cuda:0=0.4,cuda:1=0.4,cpu=0.2]"


def test_an_8_gpu_host_is_offered_one_group_per_degree_and_home_and_pairs_as_before() -> None:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    graph = from_module(mlp, (torch.randn(64, 256),))
    devices = load_profile("8xh100-nvlink")
    p = Problem(graph, devices, Options(streaming=False, splits=SplitOptions()))
    pairs = Problem(graph, devices, Options(streaming=False, splits=SplitOptions(degrees=(2,))))
    for n, choices in p.split_choices.items():
        wide = [s for s in choices if len(s.devices) > 2]
        assert [s for s in choices if len(s.devices) == 2] == list(pairs.split_choices[n])
        assert len(wide) <= 40, len(wide)
        pairs_of = collections.defaultdict(set)
        for s in choices:
            if len(s.devices) == 2:
                pairs_of[s.home].add(s.devices[1])
        # each GPU pairs with the CPU and the next GPU only; the CPU with every GPU
        assert all(len(v) == 2 for h, v in pairs_of.items() if h != "cpu") and len(pairs_of["cpu"]) == 8
        by = collections.Counter(len(s.devices) for s in wide)
        assert set(by) == {4, 8}
    choices = next(iter(p.split_choices.values()))
    group = next(s for s in choices if s.home == "cuda:6" and len(s.devices) == 4 and s.axis == "cols")
    assert group.devices == ("cuda:6", "cuda:7", "cuda:0", "cuda:1") and group.fractions == (0.25,) * 4
    megatron = [s for s in choices if len(s.devices) == 8 and s.home.startswith("cuda")]
    assert len(megatron) == 16 and all(set(s.devices) == {f"cuda:{i}" for i in range(8)} for s in megatron)
    for profile in ("h200-host", "2xh200-host"):  # fewer devices than 4: the defaults offer pairs only
        ours = Problem(graph, load_profile(profile), Options(streaming=False, splits=SplitOptions()))
        theirs = Problem(graph, load_profile(profile), Options(streaming=False, splits=SplitOptions(degrees=(2,))))
        assert ours.split_choices == theirs.split_choices


def test_a_three_way_path_overlaps_copies_on_distinct_links() -> None:
    p = _problem(load_profile("2xh200-host"), degrees=(3,), axes=("cols",), proportional=False)
    (node,) = p.split_choices
    sp = next(s for s in p.split_choices[node] if s.home == "cpu")
    assert sp.devices == ("cpu", "cuda:0", "cuda:1") and sp.fractions == even_shares(3)
    price = p.split_price[(node, sp)]
    x, y = 32 * 64 * 4, 32 * 256 * 4
    sizes = shard_sizes(256, sp.fractions)
    assert sizes == (85, 86, 85)  # cuts at round(256 / 3) and round(512 / 3)
    backs = [y * k // 256 for k in sizes[1:]]  # each shard's output columns
    ins = [p.transfer_s(x, "cpu", d) for d in ("cuda:0", "cuda:1")]  # the whole input to each
    outs = [p.transfer_s(b, d, "cpu") for b, d in zip(backs, ("cuda:0", "cuda:1"))]
    assert [c[:3] for c in price.copies] == [("cpu", "cuda:0", x), ("cpu", "cuda:1", x),
                                             ("cuda:0", "cpu", backs[0]), ("cuda:1", "cpu", backs[1])]
    t = price.shard_s
    sent = max(ins)  # cpu<->cuda:0 and cpu<->cuda:1: two links, the copies overlap
    want = max(sent + t[0], ins[0] + t[1] + outs[0], ins[1] + t[2] + outs[1])
    assert price.latency_s == pytest.approx(want, rel=1e-12)


def test_copies_sharing_a_link_wait_for_each_other_in_device_order() -> None:
    p = _problem(load_profile_text(NO_PEER_LINK, "no-peer-link"), degrees=(3,), axes=("rows",), proportional=False)
    (node,) = p.split_choices
    sp = next(s for s in p.split_choices[node] if s.home == "cuda:0")
    assert sp.devices == ("cuda:0", "cuda:1", "cpu")  # its like peer first, then the next device
    assert set(p.hops("cuda:0", "cuda:1")) >= set(p.hops("cuda:0", "cpu"))  # cuda:0 -> cuda:1 crosses cpu's link
    price = p.split_price[(node, sp)]
    (a, b), (c, d) = [(s[2], s[3]) for s in price.copies[:2]], [(s[2], s[3]) for s in price.copies[2:]]
    t = price.shard_s
    to_peer, to_cpu = a[1], b[1]
    arrived = (to_peer, to_peer + to_cpu)  # the copy to cpu waits for the one to cuda:1 on cuda:0<->cpu
    back_peer = max(arrived[0] + t[1], arrived[1]) + c[1]  # cuda:0<->cpu is free once the copy to cpu is done
    back_cpu = max(arrived[1] + t[2], back_peer) + d[1]  # and its copy back for cuda:1's on the shared link
    want = max(arrived[1] + t[0], back_peer, back_cpu)
    assert price.latency_s == pytest.approx(want, rel=1e-12)
    assert shard_sizes(64, sp.fractions) == (21, 22, 21)
    assert (a[0], b[0]) == (32 * 4 * 22, 32 * 4 * 21)  # each its slice of the input's 64 columns


def test_evaluate_charges_each_shard_to_its_device_and_each_copy_to_its_links() -> None:
    profile = load_profile_text(NO_PEER_LINK, "no-peer-link")
    p = _problem(profile, Objective.THROUGHPUT, degrees=(3,), axes=("cols",), proportional=False)
    (node,) = p.split_choices
    sp = next(s for s in p.split_choices[node] if s.home == "cuda:0")
    price = p.split_price[(node, sp)]
    device = {n: "cuda:0" for n in p.nodes}
    ev = evaluate(p, Placement(device, split={node: sp}))
    assert ev.feasible, ev.violations
    for d, seconds in zip(sp.devices, price.shard_s):
        assert ev.per_device_s[d] >= seconds
    assert ev.per_device_s["cuda:1"] == pytest.approx(price.shard_s[1])
    assert ev.memory["cuda:1"] == price.param_bytes[1] + price.work_bytes[1]
    assert ev.memory["cpu"] >= price.param_bytes[2] + price.work_bytes[2]
    split = sorted((t.src, t.dst, t.bytes) for t in ev.transfers if t.kind == "split")
    assert split == sorted((s, d, b) for s, d, b, _ in price.copies)
    shared = [lbl for lbl in p.hops("cuda:0", "cpu")]
    load = sum(p.hop_s(b, s, d, shared[0]) for s, d, b, _ in price.copies if shared[0] in p.hops(s, d))
    assert ev.per_link_s[shared[0]] >= load > 0
