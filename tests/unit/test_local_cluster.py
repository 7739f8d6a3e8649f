"""A cluster of local ranks (cost_models/local_cluster.py) and the gloo loopback link (cost_models/loopback.py)."""

from __future__ import annotations

import math

import pytest

import partitioner  # noqa: F401  (imports the package first: cost_models and partitioner import each other)
from cost_models.cluster import Network
from cost_models.cpu_limits import cpu_limits
from cost_models.detect import detect_local
from cost_models.local_cluster import local_cluster, rank_cpu
from cost_models.loopback import LOOPBACK_DEFAULTS, measure_loopback
from cost_models.profiles import load_profile
from partitioner.errors import HetpartError, ProfileError

LINK = Network(bandwidth=2e9, latency=40e-6)


def _rank(cluster, i=0):
    return cluster.flatten().device(f"host{i}/cpu")


def test_each_rank_gets_its_threads_share_of_the_machine():
    machine = load_profile("cpu").device("cpu")           # 1 TFLOP/s fp32, 30 GB/s, 2 us, 64 GiB: 16 cores
    cluster = local_cluster(2, threads_per_rank=4, host="cpu", cores=16, network=LINK)
    rank = _rank(cluster, 1)
    assert cluster.flatten().names() == ("host0/cpu", "host1/cpu")
    assert rank.peak() == pytest.approx(machine.peak() * 4 / 16)
    assert rank.peak("bfloat16") == pytest.approx(machine.peak("bfloat16") * 4 / 16)
    assert rank.mem_bandwidth == pytest.approx(machine.mem_bandwidth * 4 / 16)
    assert rank.launch_overhead == machine.launch_overhead      # 8 threads on 16 cores: no sharing
    assert rank.memory == machine.memory // 2
    # more threads per rank: more of the machine, in proportion
    assert _rank(local_cluster(2, threads_per_rank=8, host="cpu", cores=16, network=LINK)).peak() == \
        pytest.approx(2 * rank.peak())
    # the same threads on a machine of twice the cores: half its rates each
    assert _rank(local_cluster(2, threads_per_rank=4, host="cpu", cores=32, network=LINK)).peak() == \
        pytest.approx(rank.peak() / 2)


def test_ranks_that_outnumber_the_cores_share_them():
    machine = load_profile("cpu").device("cpu")
    shared = _rank(local_cluster(8, threads_per_rank=4, host="cpu", cores=16, network=LINK))   # 32 threads, 16 cores
    assert shared.peak() == pytest.approx(machine.peak() * 2 / 16)        # 2 cores' worth each
    assert shared.launch_overhead == pytest.approx(2 * machine.launch_overhead)   # time-sliced: each op 2x longer
    assert shared.memory == machine.memory // 8
    one = _rank(local_cluster(4, host="cpu", cores=2, network=LINK))     # 4 one-thread ranks on 2 cores
    assert one.peak() == pytest.approx(machine.peak() * 0.5 / 2)
    assert one.launch_overhead == pytest.approx(2 * machine.launch_overhead)
    # one rank with more threads than cores gets the whole machine, no more
    whole = _rank(local_cluster(1, threads_per_rank=32, host="cpu", cores=16, network=LINK))
    assert whole.peak() == pytest.approx(machine.peak()) and whole.launch_overhead == machine.launch_overhead


def test_rank_cpu_scales_from_the_cores_the_rates_are_for():
    machine = load_profile("cpu").device("cpu")
    measured_at_one = rank_cpu(machine, ranks=2, threads_per_rank=1, cores=2, rated=1)
    assert measured_at_one.peak() == machine.peak()                       # one core each: the rates as measured
    assert rank_cpu(machine, ranks=4, threads_per_rank=1, cores=2, rated=1).peak() == pytest.approx(machine.peak() / 2)


def test_the_network_is_the_link_given_or_the_documented_defaults():
    cluster = local_cluster(3, host="cpu", cores=16, network=LINK)
    link = cluster.flatten().link("host0/cpu", "host2/cpu")
    assert (link.bandwidth, link.latency, link.kind) == (2e9, 40e-6, "network")
    unmeasured = local_cluster(2, host="cpu", cores=16, measure=False).flatten().link("host0/cpu", "host1/cpu")
    assert (unmeasured.bandwidth, unmeasured.latency) == (LOOPBACK_DEFAULTS["bandwidth"], LOOPBACK_DEFAULTS["latency"])
    notes = local_cluster(2, host="cpu", cores=16, measure=False).hosts[0].profile.notes
    assert any("LOOPBACK_DEFAULTS" in line for line in notes)


def test_this_machine_detected_without_measuring_uses_the_per_core_defaults():
    machine = detect_local(measure=False).device("cpu")
    cores = cpu_limits().affinity
    rank = _rank(local_cluster(2, threads_per_rank=1, cores=cores, network=LINK, measure=False))
    share = min(1, cores / 2)
    assert rank.peak() == pytest.approx(machine.peak() * share / cores)


def test_this_machine_measured_at_the_ranks_threads():
    cluster = local_cluster(2, threads_per_rank=1, network=LINK)        # detects the CPU at 1 thread (< 1 s)
    rank = _rank(cluster)
    assert math.isfinite(rank.peak()) and rank.peak() > 0 and rank.mem_bandwidth > 0 and rank.launch_overhead > 0
    assert any("measured with 1 torch thread" in line for line in cluster.hosts[0].profile.notes)


@pytest.mark.parametrize("kwargs, names", [
    (dict(ranks=0), "ranks"),
    (dict(ranks=-2), "ranks"),
    (dict(ranks=True), "ranks"),
    (dict(ranks=2.0), "ranks"),
    (dict(ranks=257), "ranks"),
    (dict(ranks=10**6), "ranks"),
    (dict(ranks=2, threads_per_rank=0), "threads_per_rank"),
    (dict(ranks=2, cores=0), "cores"),
    (dict(ranks=2, host=42), "host"),
    (dict(ranks=2, host="cpu", network="fast"), "network"),
])
def test_bad_input_is_refused_naming_the_argument(kwargs, names):
    kwargs = {"host": "cpu", "cores": 4, "network": LINK, **kwargs}
    with pytest.raises(ProfileError, match=f"local_cluster: {names} = "):
        local_cluster(**kwargs)


def test_a_pipeline_plan_on_shared_cores_predicts_slower_stages():
    import models
    from partitioner import partition

    module, inputs = models.get("mlp", "small", device="meta")     # matmuls of 16 x 1024 x 1024: FLOP-bound
    compute = {}
    for ranks in (2, 4):                        # one core each, then half a core each: 4 ranks on 2 cores
        cluster = local_cluster(ranks, host="cpu", cores=2, network=LINK).flatten()
        plan = partition(module, inputs, cluster, objective="throughput", training=True, stages=2, micro_batches=4,
                         schedule="gpipe", model_name="mlp:small")
        assert [st["device"] for st in plan.pipeline["stages"]] == ["host0/cpu", "host1/cpu"]
        compute[ranks] = sum(st["compute_s"] for st in plan.pipeline["stages"])
    assert compute[4] == pytest.approx(2 * compute[2], rel=0.02)


def test_the_gloo_loopback_benchmark_measures_positive_finite_figures():
    link = measure_loopback(large=2**20, repeats=3, timeout_s=60)      # two spawned processes, a few seconds
    assert math.isfinite(link.latency) and link.latency > 0
    assert math.isfinite(link.bandwidth) and link.bandwidth > 0
    assert "gloo" in link.how


@pytest.mark.parametrize("kwargs", [dict(large=1000), dict(repeats=0)])
def test_the_loopback_benchmark_refuses_sizes_it_cannot_measure(kwargs):
    with pytest.raises(HetpartError, match="measure_loopback"):
        measure_loopback(**kwargs)
