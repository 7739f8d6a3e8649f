"""Damaged plans and profiles through every command that reads them: 0 tracebacks, 0 silent successes.

Runs ``bench/corruption_sweep.py`` (truncations at every 10 %, every field deleted, every field
given values of wrong types) in this process; emit and check run on the first few damaged plans
that load (the bench script runs them on all). The live, batch and precision plans have their own
sections damaged here (``--only``); the bench script damages every field of them too.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sweep_module():
    spec = importlib.util.spec_from_file_location("corruption_sweep", ROOT / "bench" / "corruption_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_no_damaged_file_gives_a_traceback_or_a_silent_success(tmp_path: Path) -> None:
    sweep = _sweep_module()
    runs = sweep.run_sweep(tmp_path, run_accepted=3)
    outcomes = Counter(r.outcome for r in runs)
    bad = [f"{r.command} {r.damage.kind} {r.damage.what}: {r.outcome}: {r.message}" for r in runs
           if r.outcome in ("traceback", "silent success", "check failed")]
    assert not bad, "\n".join(bad[:10])
    assert outcomes["error"] > 1500, outcomes  # most damage is refused with a sentence
    kinds = Counter(r.damage.kind for r in runs if r.command == "report")
    assert kinds["truncated"] == 9 and kinds["deleted"] > 100 and kinds["wrong type"] > 400, kinds
    for r in runs:
        if r.damage.kind == "truncated" and r.command != "plan":
            assert r.outcome == "error" and "truncated" in r.message, r  # a cut JSON file is called truncated
        if r.outcome == "error":
            assert r.message.startswith("hetpart: error: ") and "Traceback" not in r.message
    accepted_plans = {r.damage.what for r in runs if r.command == "report" and r.outcome == "harmless"}
    essential = ("placement", "schedule", "model.fingerprint", "weights", "devices.cpu", "model.op_count")
    for what in accepted_plans:  # only optional or descriptive fields may go missing unnoticed
        assert not any(what == e or what.startswith(e + ".") for e in essential), what


def test_damaged_live_batch_and_precision_plans_are_refused_or_harmless(tmp_path: Path) -> None:
    """The optional sections too: a plan with a probe and a fallback plan (damaged down into the
    fallback plan), a hetpart fit plan with a batch section, and a plan with 16-bit ops."""
    sweep = _sweep_module()
    sections = {"live": "fallbacks.0.plan.placement", "batch": "batch.micro_batch", "precision": "precision.ops"}
    own = {"live": ("probe", "fallbacks"), "batch": ("batch",), "precision": ("precision",)}
    for variant, section in sections.items():
        (tmp_path / variant).mkdir()
        # the fields every plan has are damaged by the test above; here, the variant's own sections
        runs = sweep.run_sweep(tmp_path / variant, run_accepted=2, variant=variant, only=own[variant])
        assert {r.damage.what.split(".")[0].split(" ")[0] for r in runs if r.damage.kind != "truncated"} \
            == set(own[variant]), variant
        bad = [f"{r.command} {r.damage.kind} {r.damage.what}: {r.outcome}: {r.message}" for r in runs
               if r.outcome in ("traceback", "silent success", "check failed")]
        assert not bad, "\n".join(bad[:10])
        damaged = {r.damage.what for r in runs}
        assert section in damaged, variant
        assert all(r.outcome == "error" for r in runs if r.damage.what == section), variant


def test_every_op_moved_to_every_other_device_is_refused(tmp_path: Path) -> None:
    """The placement edited alone (memory and transfers as recorded): 0 accepted by report, emit or check."""
    sweep = _sweep_module()
    runs = sweep.run_sweep(tmp_path, variant="placement")
    moved = {r.damage.what for r in runs}
    assert len(moved) == 10 and 'placement.linear <- "cuda:0"' in moved, moved  # mlp:tiny: 5 ops x 2 other devices
    assert {r.command for r in runs} == {"report", "emit", "check"} and {r.damage.kind for r in runs} == {"moved"}
    accepted = [f"{r.command} {r.damage.what}: {r.outcome}" for r in runs if r.outcome != "error"]
    assert not accepted, "\n".join(accepted)
    for r in runs:  # each names the section the edit contradicts, and the fix
        assert r.message.startswith("hetpart: error: ") and "re-plan" in r.message, r
        assert "memory[" in r.message or "transfers" in r.message, r
