"""Generation plans: plan_generation's record (both phases, shared homes, certificate, baselines), its
file, its summary, the CLI's ``hetpart plan --generate``, and the inputs it refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from partitioner import GenerationPlan, Plan, PlanFormatError, partition, plan_generation
from partitioner.cli import main as cli_main
from partitioner.errors import CaptureError, HetpartError
from partitioner.frontends.decode_step import decode_step, phase_inputs
from partitioner.options import OptionError
from partitioner.plan.generation import param_homes

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=128)
MEDIUM = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, vocab_size=32000)


@pytest.fixture(scope="module")
def tiny() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


@pytest.fixture(scope="module")
def medium_plan() -> GenerationPlan:
    """A 4-layer bf16 Llama on the meta device, the GPU capped below its weights: the phases differ."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**MEDIUM)).to(torch.bfloat16).eval()
    return plan_generation(model, "h200-host", memory={"cuda:0": "150MB"}, prompt_tokens=256, new_tokens=32,
                           time_limit=30)


def test_the_phases_share_every_home_and_differ_where_it_pays(medium_plan: GenerationPlan) -> None:
    gen = medium_plan
    assert param_homes(gen.prefill) == param_homes(gen.decode)
    assert gen.prefill.weights and not gen.decode.weights  # prefill streams host weights in, decode computes there
    differ = gen.phase_difference()
    assert differ and all("streamed" in pre and dec == "cpu" for _, pre, dec in differ)
    cache = [op for op, names in gen.decode.param_names.items() if any("cache" in n for n in names)]
    assert cache and not any(op in gen.decode.weights or op in gen.prefill.weights for op in cache)
    assert gen.request["max_context"] == 256 + 32
    p = gen.predicted
    assert p["request_s"] == pytest.approx(p["prefill_s"] + 31 * p["decode_s"])
    assert p["decode_tokens_per_s"] == pytest.approx(1 / p["decode_s"])
    assert gen.solver.status in ("optimal", "within gap")
    assert gen.solver.bound is not None and gen.solver.bound <= gen.solver.objective * (1 + 1e-9)
    assert set(gen.baselines) == {"llama.cpp --fit", "greedy", "one placement"}
    for name, row in gen.baselines.items():
        if row["feasible"]:
            assert p["request_s"] <= row["request_s"] * (1 + 1e-9), name
    assert gen.baselines["one placement"]["request_s"] > p["request_s"]  # two phases beat one here
    assert not gen.baselines["greedy"]["feasible"] and "cuda:0" in gen.baselines["greedy"]["note"]


def test_the_file_round_trips_and_a_single_plan_reader_names_it(medium_plan: GenerationPlan, tmp_path) -> None:
    path = medium_plan.save(tmp_path / "gen.json")
    again = GenerationPlan.load(path)
    assert again == medium_plan
    with pytest.raises(HetpartError, match="exists"):
        medium_plan.save(path)
    with pytest.raises(PlanFormatError, match="generation plan .* GenerationPlan.load"):
        Plan.load(path)
    single = tmp_path / "single.json"
    single.write_text(medium_plan.decode.to_json())
    with pytest.raises(PlanFormatError, match="one forward pass, not a generation plan"):
        GenerationPlan.load(single)


def test_phases_that_disagree_on_a_home_are_refused(medium_plan: GenerationPlan, tiny: LlamaForCausalLM) -> None:
    step = decode_step(tiny, batch=1, max_context=16)
    with torch.no_grad():
        pre = partition(step, phase_inputs(step, 8), "h200-host", pins={"inner.model.model.layers.1*": "cuda:0"},
                        streaming=False, time_limit=10)
        dec = partition(step, phase_inputs(step, 1, start=8), "h200-host", pins={"*": "cpu"}, time_limit=10)
    with pytest.raises(PlanFormatError, match=r"parameter inner\.model\.model\.layers\.1\..* lives on cuda:0 in the "
                                              r"prefill and on cpu in the decode step"):
        GenerationPlan.from_phases(pre, dec, prompt_tokens=8, new_tokens=8)
    d = medium_plan.to_dict()
    d["request"]["new_tokens"] = 10_000
    with pytest.raises(PlanFormatError, match="exceed max_context"):
        GenerationPlan.from_dict(d)


def test_summary_shows_both_phases_and_the_baselines(medium_plan: GenerationPlan) -> None:
    text = medium_plan.summary()
    for words in ("prompt 256 tokens, 32 new", "prefill", "decode", "tokens/s", "memory cuda:0",
                  "use the weights of", "baseline llama.cpp --fit", "baseline one placement"):
        assert words in text, words


def test_a_tiny_model_plans_and_phase_plans_made_by_hand_join(tiny: LlamaForCausalLM) -> None:
    gen = plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, time_limit=20)
    assert gen.solver.status == "optimal"
    step = decode_step(tiny, batch=1, max_context=16)
    with torch.no_grad():
        pre = partition(step, phase_inputs(step, 8), "h200-host", streaming=False, time_limit=10)
        dec = partition(step, phase_inputs(step, 1, start=8), "h200-host", streaming=False, time_limit=10)
    joined = GenerationPlan.from_phases(pre, dec, prompt_tokens=8, new_tokens=8)
    assert joined.solver.status == "heuristic" and joined.request["max_context"] == 16


def test_a_baseline_can_be_the_plan(medium_plan: GenerationPlan) -> None:
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**MEDIUM)).to(torch.bfloat16).eval()
    fit = plan_generation(model, "h200-host", memory={"cuda:0": "150MB"}, prompt_tokens=256, new_tokens=32,
                          solver="llama.cpp --fit")
    assert fit.solver.name == "llama.cpp --fit" and fit.solver.status == "heuristic"
    assert fit.predicted["request_s"] == pytest.approx(medium_plan.baselines["llama.cpp --fit"]["request_s"])
    with pytest.raises(HetpartError, match="no routed experts"):
        plan_generation(model, "h200-host", prompt_tokens=256, new_tokens=32, solver="llama.cpp -ot exps=CPU")


def test_what_generation_refuses(tiny: LlamaForCausalLM) -> None:
    with pytest.raises(CaptureError, match="128 positions .* context of 200 tokens"):
        plan_generation(tiny, "h200-host", prompt_tokens=150, new_tokens=50)
    with pytest.raises(CaptureError, match="not a causal language model"):
        plan_generation(torch.nn.Linear(4, 4), "h200-host", prompt_tokens=8, new_tokens=8)
    with pytest.raises(HetpartError, match="call partitioner.plan_generation"):
        partition(tiny, (torch.zeros(1, 8, dtype=torch.long),), "h200-host", generate=True)
    with pytest.raises(HetpartError, match="does not combine with training"):
        plan_generation(tiny, "h200-host", training=True)
    with pytest.raises(OptionError, match="prompt_tokens"):
        plan_generation(tiny, "h200-host", prompt_tokens=0)
    with pytest.raises(OptionError, match="generation_objective"):
        plan_generation(tiny, "h200-host", generation_objective="fast")


def test_cli_plan_generate_writes_a_generation_plan(tmp_path, capsys) -> None:
    folder = tmp_path / "llama"
    folder.mkdir()
    LlamaConfig(**TINY).save_pretrained(folder)
    out = tmp_path / "gen.json"
    code = cli_main(["plan", str(folder), "--generate", "--prompt-tokens", "8", "--new-tokens", "8", "--batch", "2",
                     "--time-limit", "20", "-o", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "generation plan for" in text and "batch 2" in text and "wrote" in text
    gen = GenerationPlan.load(out)
    assert gen.batch == 2 and gen.prompt_tokens == 8
    assert dataclasses.asdict(gen.solver)["status"] in ("optimal", "within gap")
    code = cli_main(["plan", str(folder), "--generate", "--format", "csv", "-o", str(tmp_path / "x.csv")])
    assert code != 0
    assert "a generation plan has two" in capsys.readouterr().err


@pytest.fixture(scope="module")
def packed_plan(tiny: LlamaForCausalLM) -> GenerationPlan:
    """The tiny Llama with int8 weights, its second layer pinned to cuda:0: packed weights on both devices."""
    return plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, time_limit=20,
                           pins={"inner.model.model.layers.1*": "cuda:0"}, precision={"weights": "int8"})


def test_a_packed_plan_records_each_phase_precision_and_reads_it_back(packed_plan: GenerationPlan, tmp_path) -> None:
    from partitioner.plan.generation import stored_forms

    gen = packed_plan
    section = gen.precision
    assert section["setting"] == {"weights": "int8"}
    for phase in ("prefill", "decode"):
        weights = section[phase]["weights"]
        assert weights and set(weights.values()) == {"int8"}
        assert {getattr(gen, phase).placement[op] for op in weights} == {"cpu", "cuda:0"}
        assert set(section[phase]["weight_bytes"]) == set(weights)
    forms = stored_forms(gen.decode)
    assert forms == stored_forms(gen.prefill)
    assert forms["inner.model.model.layers.0.self_attn.q_proj.weight"] == "float32+int8"
    assert forms["inner.model.model.layers.0.input_layernorm.weight"] == "float32"
    again = GenerationPlan.load(gen.save(tmp_path / "packed.json"))
    assert again == gen and again.precision == gen.precision
    text = gen.summary()
    assert "precision          weights=int8" in text
    n = len(section["decode"]["weights"])
    assert text.count(f"{n} int8 (") == 2, text  # the packed weights row: the same count in both phases


def test_phases_whose_stored_forms_or_settings_differ_are_refused(packed_plan: GenerationPlan) -> None:
    d = packed_plan.to_dict()
    section = d["phases"]["decode"]["precision"]
    op = next(iter(section["weights"]))  # the decode step's copy of one weight in int4 (fewer bytes: it fits)
    section["weights"][op] = "int4"
    section["weight_bytes"][op] = section["weight_bytes"][op] // 2
    with pytest.raises(PlanFormatError, match=r"is stored as float32\+int8 in the prefill and as float32\+int4 in the "
                                              r"decode step .* one stored copy serves both phases"):
        GenerationPlan.from_dict(d)
    d = packed_plan.to_dict()
    d["phases"]["decode"]["precision"]["setting"] = {"weights": "auto"}
    with pytest.raises(PlanFormatError, match="planned with precision .* plan both phases together"):
        GenerationPlan.from_dict(d)


def test_what_generation_with_precision_refuses(tiny: LlamaForCausalLM) -> None:
    from cost_models.precision import PrecisionError

    with pytest.raises(PrecisionError, match="no device of profile 't4-flexgen' has a int8"):
        plan_generation(tiny, "t4-flexgen", prompt_tokens=8, new_tokens=8, precision={"weights": "int8"})
    with pytest.raises(PrecisionError, match="cpu has no float8 weight-only kernel.*int8, int4"):
        plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, precision={"weights": {"cpu": "fp8"}})
    with pytest.raises(PrecisionError, match="not a weight dtype"):
        plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, precision={"weights": "int3"})
    with pytest.raises(PrecisionError, match="latency and throughput objectives"):
        plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, precision="auto", objective="makespan")
    with pytest.raises(PrecisionError, match="max_error is planned for single plans.*drop max_error"):
        plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8,
                        precision={"weights": "auto", "max_error": 0.01})
    with pytest.raises(HetpartError, match="does not combine with training|training=True"):
        plan_generation(tiny, "h200-host", prompt_tokens=8, new_tokens=8, precision={"weights": "int8"},
                        training=True)


def test_cli_plan_generate_with_precision(tmp_path, capsys) -> None:
    folder = tmp_path / "llama"
    folder.mkdir()
    LlamaConfig(**TINY).save_pretrained(folder)
    out = tmp_path / "gen.json"
    code = cli_main(["plan", str(folder), "--generate", "--prompt-tokens", "8", "--new-tokens", "8",
                     "--precision", "weights=int4", "--time-limit", "20", "-o", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "precision          weights=int4" in text and " int4 (" in text
    gen = GenerationPlan.load(out)
    assert set(gen.precision["decode"]["weights"].values()) == {"int4"}
    code = cli_main(["plan", str(folder), "--generate", "--precision", "weights=int9"])
    assert code != 0
    assert "not a weight dtype" in capsys.readouterr().err


@pytest.mark.parametrize("precision", [{"cuda:0": "bf16"}, {"weights": "int8"}])
def test_baselines_place_the_same_precision_with_one_stored_form(tiny: LlamaForCausalLM, precision) -> None:
    """llama.cpp's op offload streams host weights in prefill (>= 32 tokens) and accelerate streams
    offloaded ones: with precision they stream the form the host holds, packed weights stay
    resident, and a weight the other phase cannot store alike is computed where it lives, so
    both baselines fit (each weight one stored form) and the plan is no slower than either."""
    gen = plan_generation(tiny, "h200-host", memory={"cuda:0": "200KB"}, prompt_tokens=32, new_tokens=8,
                          time_limit=20, precision=precision)
    for name in ("llama.cpp --fit", "greedy"):
        row = gen.baselines[name]
        assert row["feasible"], (name, row["note"])
        assert gen.predicted["request_s"] <= row["request_s"] * (1 + 1e-9), name
