"""Corruption sweep: every command that reads a plan or a profile, on files damaged on purpose.

From one valid plan (``mlp:tiny`` on ``cpu-gpu-npu``, spread over the three devices with a
streamed weight, so every section is filled) and one valid profile (``cpu-gpu-npu``), it writes

* truncations at 10 %, 20 %, ..., 90 % of the file;
* every field deleted, one at a time (every key of every object down to three levels, and the
  first entry of each longer map or list);
* every such field's value replaced by each value of a wrong type (a string, a number, ``null``,
  a list, an object; the value's own type is skipped), one file per replacement;

and runs ``hetpart report``, ``hetpart emit`` and ``hetpart check`` on each plan and ``hetpart
plan`` on each profile, in this process (``partitioner.cli.main``). Each run is one of:

* ``error``      exit status 2 with one ``hetpart: error: ...`` sentence;
* ``traceback``  any exception escaping the command, or another exit status (must be 0);
* ``check failed`` ``hetpart check`` ran the plan and found outputs that differ (must be 0);
* ``accepted``   exit status 0. A profile that still parses after truncation at a line boundary
  is valid TOML and planned for (TOML has no end marker; the count is reported). An accepted plan
  is *harmless* when everything ``emit`` uses (fingerprint, placement, weights, schedule, stream
  mode, capture, inputs, training, devices, batch section, 16-bit ops, and each fallback plan it still holds)
  equals the original's and ``check`` passed; otherwise it is a *silent success* (must be 0).

    python bench/corruption_sweep.py [--out DIR] [--show N] [--run-accepted N] [--variant V] [--only FIELDS]

``--variant`` picks the valid plan: ``placed`` (the default above), ``live`` (the same model planned on
``detect:cpu-gpu-npu`` with ``--fallbacks 0.5``: the probe and fallbacks sections, and the fallback
plan's own fields), or ``batch`` (``hetpart fit`` of a training step, global batch 8 in micro-batches
of 4: the batch section; ``check`` then compares accumulated gradients with full-batch ones), or
``precision`` (planned with ``--precision cuda:0=bf16,npu:0=bf16,cpu=fp32``: the precision section,
whose ops decide the casts ``emit`` inserts and the tolerance ``check`` holds), or ``placement``: the
``placed`` plan with no damage but its placement edited, every op moved to every other device and
everything else (memory, transfers) left as recorded; every such file must be refused (0 accepted):
the placement no longer implies the memory and copies the plan records.

It prints the counts per command and kind of damage, and the first ``--show`` error messages.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRONG_VALUES: tuple[Any, ...] = ("x", 1.5, None, [], {})
MODEL = "mlp:tiny"
BIND = ("--bind", "cuda:0=cpu", "--bind", "npu:0=cpu")


@dataclass(frozen=True)
class Damaged:
    """One damaged file: what was done to it and its text."""

    kind: str      # "truncated" | "deleted" | "wrong type" | "moved"
    what: str      # "40%", "solver.gap", "placement.linear <- null"
    text: str


@dataclass(frozen=True)
class Run:
    """One command on one damaged file."""

    command: str
    damage: Damaged
    outcome: str   # "error" | "traceback" | "harmless" | "silent success" | "accepted"
    message: str


# --------------------------------------------------------------------------------------------
# Damage
# --------------------------------------------------------------------------------------------


def _under(field: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``field`` (``a.b.0``) is one of ``prefixes`` or lies under one."""
    return any(field == p or field.startswith(p + ".") for p in prefixes)


def truncations(text: str) -> Iterator[Damaged]:
    """The file cut at every 10 % of its length."""
    for tenth in range(1, 10):
        yield Damaged("truncated", f"{tenth * 10}%", text[: len(text) * tenth // 10])


def field_paths(value: Any, depth: int = 3, prefix: tuple = ()) -> Iterator[tuple]:
    """Paths of the fields to damage: every key down to ``depth``, the first entry of longer ones."""
    if depth == 0:
        return
    if isinstance(value, dict):
        keys = list(value)
        for key in keys if len(keys) <= 20 else keys[:1]:
            yield (*prefix, key)
            yield from field_paths(value[key], depth - 1, (*prefix, key))
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from field_paths(value[0], depth - 1, (*prefix, 0))


def _parent(tree: Any, path: tuple) -> Any:
    for key in path[:-1]:
        tree = tree[key]
    return tree


def deletions_and_wrong_types(tree: Any, dump: Any) -> Iterator[Damaged]:
    """Each field deleted, then each field replaced by values of other types (``dump`` writes text)."""
    for path in field_paths(tree):
        name = ".".join(map(str, path))
        damaged = copy.deepcopy(tree)
        parent = _parent(damaged, path)
        del parent[path[-1]]
        yield Damaged("deleted", name, dump(damaged))
    for path in field_paths(tree):
        name = ".".join(map(str, path))
        original = _parent(tree, path)[path[-1]]
        for wrong in WRONG_VALUES:
            if type(wrong) is type(original) or (isinstance(original, (int, float)) and isinstance(wrong, float)
                                                 and not isinstance(original, bool)):
                continue
            damaged = copy.deepcopy(tree)
            _parent(damaged, path)[path[-1]] = wrong
            text = dump(damaged)
            if text is not None:
                yield Damaged("wrong type", f"{name} <- {json.dumps(wrong)}", text)


def moves(tree: Any) -> Iterator[Damaged]:
    """Every op moved to every other device of the plan, nothing else changed (memory, transfers and
    the rest left as recorded): what a hand edit of the placement alone gives."""
    devices = list(tree["devices"]["devices"])  # DeviceSet.to_dict(): {name: device}
    for op, device in tree["placement"].items():
        for other in devices:
            if other != device:
                damaged = copy.deepcopy(tree)
                damaged["placement"][op] = other
                yield Damaged("moved", f"placement.{op} <- {json.dumps(other)}", json.dumps(damaged, indent=1))


def toml_text(tree: dict) -> str | None:
    """A profile tree as TOML (None when a value has no TOML spelling, e.g. null)."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if v is None:
            raise ValueError("null")
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }"

    try:
        for key, v in tree.items():
            if key not in ("devices", "links"):
                lines.append(f"{json.dumps(key)} = {value(v)}")
        devices = tree.get("devices", {})
        if not isinstance(devices, dict):
            lines.append(f"devices = {value(devices)}")
        else:
            for name, table in devices.items():
                if isinstance(table, dict):
                    lines.append(f"[devices.{json.dumps(name)}]")
                    lines += [f"{json.dumps(k)} = {value(v)}" for k, v in table.items()]
                else:
                    lines.append(f"devices.{json.dumps(name)} = {value(table)}")
        links = tree.get("links", [])
        if not isinstance(links, list) or not all(isinstance(x, dict) for x in links):
            lines.insert(0, f"links = {value(links)}")
        else:
            for link in links:
                lines.append("[[links]]")
                lines += [f"{json.dumps(k)} = {value(v)}" for k, v in link.items()]
    except ValueError:
        return None
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Running the commands
# --------------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> tuple[int | None, str, str]:
    """``hetpart ARGV`` in this process: (status or None for an escaped exception, stdout, stderr)."""
    from partitioner.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # noqa: BLE001 - this is what the sweep counts
            return None, out.getvalue(), f"{type(exc).__name__}: {exc}"
    return code, out.getvalue(), err.getvalue()


def _emit_fields(plan: Any) -> tuple:
    """What decides the module ``emit`` builds: the graph it checks, where each op runs and where
    its weights live, the issue order, the capture and mode, the devices it binds. (Recorded
    inputs only re-capture the model when no example inputs are given; the commands pass them.)"""
    return (plan.fingerprint, dict(plan.placement), dict(plan.weights), plan.schedule, plan.stream_mode,
            plan.capture, plan.training, plan.devices.names(),
            {k: v for k, v in plan.batch.items() if k != "step_s"},  # step_s: a prediction, like predicted
            dict(plan.precision.get("ops", {})))  # the casts emit inserts (the cast count is a prediction)


def _harmless(damaged: Any, original: Any) -> bool:
    """Everything a command (or ``emit_live``) would run from ``damaged`` is ``original``'s: its own
    fields, and each fallback plan it still holds (a fallback deleted whole is never run: the plan
    reads as one made without it, which emit and check do not use either)."""
    kept = {f.fraction: _emit_fields(f.plan) for f in original.fallbacks}
    return _emit_fields(damaged) == _emit_fields(original) and all(
        kept.get(f.fraction) == _emit_fields(f.plan) for f in damaged.fallbacks)


def _outcome(code: int | None, err: str, accepted: str) -> tuple[str, str]:
    lines = err.strip().splitlines()
    if code is None:
        return "traceback", err
    said = [line for line in lines if line.startswith("hetpart: error: ")]
    if code == 2 and said and "Traceback" not in err:
        return "error", said[0]
    if code == 0:
        return accepted, ""
    if code == 1:
        return "check failed", err.strip()[-300:]
    return "traceback", f"exit {code}: {err.strip()[-300:]}"


def sweep_plans(folder: Path, plan_text: str, run_accepted: int | None = None,
                only: tuple[str, ...] | None = None, moved: bool = False) -> list[Run]:
    """report, emit and check on every damaged plan; with ``run_accepted``, emit and check run on
    only that many of the plans ``report`` loads (they all load like the first: a quicker sweep);
    with ``only``, the truncations and the damage to those fields (and what lies under them); with
    ``moved``, only the placement edits of :func:`moves` (each must be refused: none is harmless)."""
    from partitioner.plan import Plan

    original = Plan.from_json(plan_text)
    tree = json.loads(plan_text)
    damaged = [*moves(tree)] if moved else \
        [*truncations(plan_text), *deletions_and_wrong_types(tree, lambda t: json.dumps(t, indent=1))]
    if tree.get("fallbacks") and not moved:  # the first fallback plan, damaged three levels down in its own right
        def embedded(inner: Any) -> str:
            whole = copy.deepcopy(tree)
            whole["fallbacks"][0]["plan"] = inner
            return json.dumps(whole, indent=1)

        damaged += [dataclasses.replace(d, what=f"fallbacks.0.plan.{d.what}")
                    for d in deletions_and_wrong_types(tree["fallbacks"][0]["plan"], embedded)]
    if only is not None:
        damaged = [d for d in damaged if d.kind == "truncated" or _under(d.what.split(" <- ")[0], only)]
    runs = []
    loaded = 0
    for i, d in enumerate(damaged):
        path = folder / f"plan-{i:03d}.json"
        path.write_text(d.text, encoding="utf-8")
        report = _cli(["report", str(path), "-o", str(folder / "r.html"), "--force"])
        loaded += report[0] == 0
        skip = report[0] == 0 and run_accepted is not None and loaded > run_accepted \
            and _harmless(Plan.load(path), original)  # a plan whose fields changed always goes on to emit
        for command, argv in (("report", None),
                              ("emit", ["emit", MODEL, "--plan", str(path), "-o", str(folder / "e.py"),
                                        "--force", *BIND]),
                              ("check", ["check", MODEL, "--plan", str(path), "--repeat", "1", *BIND])):
            if skip and command != "report":
                continue
            code, _, err = report if argv is None else _cli(argv)
            outcome, message = _outcome(code, err, "accepted")
            if outcome == "accepted":
                same = _harmless(Plan.load(path), original)
                outcome = "harmless" if same else "silent success"
                message = "" if same else "emit ran a plan whose placement fields changed"
            runs.append(Run(command, d, outcome, message))
        mine = {r.command: r for r in runs[-3:] if r.damage is d}
        if "emit" in mine and mine["report"].outcome == "silent success" and mine["emit"].outcome == "error":
            # report runs nothing; a plan emit refuses is not run silently by anything (e.g. a batch
            # section deleted whole: the rest reads as a plan at the micro-batch, which emit refuses)
            runs[runs.index(mine["report"])] = Run("report", d, "accepted", "emit refuses it")
    return runs


def sweep_profiles(folder: Path, profile_path: Path) -> list[Run]:
    """plan on every damaged profile (a short time limit: only loading is under test)."""
    import tomllib

    text = profile_path.read_text(encoding="utf-8")
    damaged = [*truncations(text), *deletions_and_wrong_types(tomllib.loads(text), toml_text)]
    runs = []
    for i, d in enumerate(damaged):
        path = folder / f"profile-{i:03d}.toml"
        path.write_text(d.text, encoding="utf-8")
        code, _, err = _cli(["plan", MODEL, "--devices", str(path), "--time-limit", "5"])
        outcome, message = _outcome(code, err, "accepted")
        runs.append(Run("plan", d, outcome, message))
    return runs


VARIANTS = ("placed", "live", "batch", "precision", "placement")


def valid_plan_text(folder: Path, variant: str = "placed") -> str:
    """The plan every damaged plan starts from: three devices, a streamed weight, transfers (and, by
    ``variant``, fallback plans and a probe, a batch section, or a precision section)."""
    path = folder / "valid-plan.json"
    variant = "placed" if variant == "placement" else variant  # the placement variant moves the placed plan's ops
    pins = ["--pin", "linear_1=cuda:0", "--pin", "linear_2=npu:0"]
    argv = {"placed": ["plan", MODEL, "--devices", "cpu-gpu-npu", *pins],
            "live": ["plan", MODEL, "--devices", "detect:cpu-gpu-npu", "--fallbacks", "0.5", *pins],
            "batch": ["fit", MODEL, "--devices", "cpu-gpu-npu", "--training", "--global-batch", "8",
                      "--micro-batch", "4", *pins],
            "precision": ["plan", MODEL, "--devices", "cpu-gpu-npu", "--precision",
                          "cuda:0=bf16,npu:0=bf16,cpu=fp32", *pins]}[variant]
    code, _, err = _cli([*argv, "--time-limit", "10", "-o", str(path), "--force"])
    if code != 0:
        raise RuntimeError(f"the valid plan could not be made: {err}")
    return path.read_text(encoding="utf-8")


def run_sweep(folder: Path, run_accepted: int | None = None, variant: str = "placed",
              only: tuple[str, ...] | None = None) -> list[Run]:
    """The whole sweep in ``folder``: damaged plans and profiles, every command on each (see
    :func:`sweep_plans` for ``run_accepted`` and ``only``; profiles only with the ``placed`` variant)."""
    from cost_models.profiles import builtin_profile_path

    plans = sweep_plans(folder, valid_plan_text(folder, variant), run_accepted, only, moved=variant == "placement")
    return plans if variant != "placed" else [*plans, *sweep_profiles(folder, builtin_profile_path("cpu-gpu-npu"))]


def table(runs: list[Run]) -> str:
    counts = Counter((r.command, r.damage.kind, r.outcome) for r in runs)
    outcomes = ("error", "harmless", "accepted", "silent success", "check failed", "traceback")
    lines = [f"{'command':<8} {'damage':<11} {'files':>5} " + " ".join(f"{o:>14}" for o in outcomes)]
    for command in ("report", "emit", "check", "plan"):
        for kind in ("truncated", "deleted", "wrong type", "moved"):
            row = [counts[(command, kind, o)] for o in outcomes]
            if sum(row):
                lines.append(f"{command:<8} {kind:<11} {sum(row):>5} " + " ".join(f"{n:>14}" for n in row))
    total = [sum(n for (c, k, oo), n in counts.items() if oo == o) for o in outcomes]
    lines.append(f"{'all':<8} {'':<11} {len(runs):>5} " + " ".join(f"{n:>14}" for n in total))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the damaged files (default: a temporary one)")
    parser.add_argument("--show", type=int, default=5, help="print this many error messages as samples")
    parser.add_argument("--run-accepted", type=int, default=None, metavar="N",
                        help="run emit and check on only N of the damaged plans that load (default: all)")
    parser.add_argument("--variant", choices=VARIANTS, default="placed",
                        help="the valid plan damaged: placed (default), live (probe, fallbacks), batch, precision, "
                             "or placement (the placed plan's ops moved to every other device, nothing else)")
    parser.add_argument("--only", default=None, metavar="FIELD[,FIELD]",
                        help="damage only these fields of the plan and what lies under them (e.g. precision), "
                             "besides the truncations (default: every field)")
    args = parser.parse_args(argv)
    only = tuple(f.strip() for f in args.only.split(",") if f.strip()) if args.only else None
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        runs = run_sweep(folder, args.run_accepted, args.variant, only)
    print(table(runs))
    accepted = sorted({r.damage.what for r in runs if r.outcome in ("harmless", "accepted")})
    print(f"\naccepted without error ({len(accepted)}): {', '.join(accepted)}")
    for r in [r for r in runs if r.outcome == "error"][: args.show]:
        print(f"  {r.command} {r.damage.kind} {r.damage.what}: {r.message}")
    bad = [r for r in runs if r.outcome in ("traceback", "silent success", "check failed")]
    for r in bad:
        print(f"BAD {r.command} {r.damage.kind} {r.damage.what}: {r.outcome}: {r.message}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
