"""bench/mutants.toml stays applicable: code moves under the mutants (merges, refactors), and a
mutant whose line no longer occurs exactly once would be reported "stale" by bench/mutation.py
instead of testing anything. This keeps the list honest between mutation runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mutation_module():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "bench" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_exactly_one_place_and_names_tests_that_exist() -> None:
    mutants = _mutation_module().load_mutants()
    assert len(mutants) >= 26  # the sixteen of issue 10 and at least ten of our own
    stale = [m.id for m in mutants if (ROOT / m.file).read_text(encoding="utf-8").count(m.original) != 1]
    assert not stale, f"mutants whose original text is not found exactly once: {stale}"
    assert all(m.original != m.mutated for m in mutants)
    missing = [t for m in mutants for t in m.tests if not (ROOT / t.split("::")[0]).exists()]
    assert not missing, f"mutants name tests that do not exist: {missing}"


def test_the_mutants_cover_every_backend_and_the_precision_live_and_batching_code() -> None:
    mutants = _mutation_module().load_mutants()
    assert sum(m.origin == "issue-36" for m in mutants) >= 25
    files = {m.file for m in mutants}
    for place in ("backends/torch/", "backends/onnx_parts/", "backends/pipeline/", "backends/compile/",
                  "backends/binding.py", "backends/compare.py", "backends/strict_devices.py",
                  "cost_models/precision.py", "backends/torch/live.py", "partitioner/plan/live.py",
                  "partitioner/fallbacks.py", "partitioner/batching.py"):
        assert any(f.startswith(place) for f in files), f"no mutant in {place}"
