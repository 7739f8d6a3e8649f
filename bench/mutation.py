"""Mutation testing: do the tests fail when a critical line is wrong?

Applies the one-line mutants of ``bench/mutants.toml`` (solvers, evaluate, cost model, coarsening,
code generation, the plan file, check) one at a time to a temporary copy of the repository (the
files git tracks or would track; never the working tree itself), runs each mutant's tests there
with a time limit, and prints one table: mutant, killed or survived, by which test, seconds; then
the score (killed / mutants) and every survivor with its note. A mutant killed by a timeout counts
as killed. Before the mutants, the union of their tests runs on the unmutated copy: a failure
there is reported and stops the run (a kill must be the mutant's doing).

Every mutant's ``original`` must occur exactly once in its file; one that does not (the code
moved) is reported as ``stale`` and counts against the score until the list is updated.

    python bench/mutation.py                        # every mutant (tens of minutes on 2 cores)
    python bench/mutation.py --only codegen-copy-per-tensor --only cost-roofline-min
    python bench/mutation.py --list                 # the mutants, without running anything
    python bench/mutation.py --timeout 300 --skip-baseline

Not part of CI: a developer's tool. Grow the list with each bug found (the bug as a mutant, and
the test that kills it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "bench" / "mutants.toml"


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One line (or snippet) of one file, replaced."""

    id: str
    origin: str            # "issue-10" or "own"
    file: str              # relative to the repository root
    original: str          # occurs exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest node ids
    note: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str           # "killed", "survived", "stale", "error"
    by: str                # the first failing test, "timeout", or why it is stale / an error
    seconds: float


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    """The mutants of ``path`` (see the comment at its top)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, entry in enumerate(data.get("mutant", [])):
        missing = [k for k in ("id", "origin", "file", "original", "mutated", "tests", "note") if k not in entry]
        if missing:
            raise SystemExit(f"{path}: mutant {i} ({entry.get('id', '?')}) lacks {', '.join(missing)}")
        out.append(Mutant(entry["id"], entry["origin"], entry["file"], entry["original"], entry["mutated"],
                          tuple(entry["tests"]), entry["note"]))
    ids = [m.id for m in out]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise SystemExit(f"{path}: mutant ids appear twice: {', '.join(twice)}")
    return out


def copy_tree(root: Path, dest: Path) -> None:
    """The files git tracks, plus untracked ones it does not ignore, copied under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_tests(tree: Path, tests: Sequence[str], timeout: float) -> tuple[int | None, str, float]:
    """pytest on ``tests`` inside ``tree`` (its packages first on the path); (exit code or None on
    timeout, output, seconds)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return None, output, time.perf_counter() - start
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def first_failure(output: str) -> str:
    match = _FAILED.search(output)
    return match.group(1) if match else "(no test named: see pytest's output)"


def apply(tree: Path, mutant: Mutant) -> str | None:
    """Write the mutant into ``tree``; the original text, or None when the mutant is stale."""
    path = tree / mutant.file
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    if text.count(mutant.original) != 1:
        return None
    path.write_text(text.replace(mutant.original, mutant.mutated), encoding="utf-8")
    return text


def run_mutant(tree: Path, mutant: Mutant, timeout: float) -> Outcome:
    original = apply(tree, mutant)
    if original is None:
        return Outcome(mutant, "stale", "original text not found exactly once", 0.0)
    try:
        code, output, seconds = run_tests(tree, mutant.tests, timeout)
    finally:
        (tree / mutant.file).write_text(original, encoding="utf-8")
    if code is None:
        return Outcome(mutant, "killed", f"timeout after {timeout:.0f} s", seconds)
    if code == 0:
        return Outcome(mutant, "survived", "-", seconds)
    if code in (1, 2):  # tests failed, or collection failed on the mutant (an import error is a kill)
        return Outcome(mutant, "killed", first_failure(output), seconds)
    return Outcome(mutant, "error", f"pytest exit {code}: {output.strip().splitlines()[-1:]}", seconds)


def table(outcomes: Sequence[Outcome]) -> list[str]:
    rows = [["mutant", "origin", "result", "killed by", "seconds"]]
    rows += [[o.mutant.id, o.mutant.origin, o.verdict, o.by, f"{o.seconds:.0f}"] for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="run this mutant (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests (default 600)")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the tests on the unmutated copy")
    args = parser.parse_args(argv)
    mutants = load_mutants()
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"no mutant called {', '.join(unknown)} (see --list)")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:<44} {m.origin:<9} {m.file}: {m.note}")
        return 0
    with tempfile.TemporaryDirectory(prefix="hetpart-mutation-") as folder:
        tree = Path(folder)
        copy_tree(ROOT, tree)
        if not args.skip_baseline:
            tests = sorted({t for m in mutants for t in m.tests})
            code, output, seconds = run_tests(tree, tests, args.timeout * 2)
            print(f"baseline: {len(tests)} test selections on the unmutated tree, {seconds:.0f} s: "
                  f"{'pass' if code == 0 else 'FAIL'}", flush=True)
            if code != 0:
                print(output[-3000:])
                return 2
        outcomes = []
        for m in mutants:
            outcome = run_mutant(tree, m, args.timeout)
            outcomes.append(outcome)
            print(f"  {m.id}: {outcome.verdict} ({outcome.by}, {outcome.seconds:.0f} s)", flush=True)
    print()
    print("\n".join(table(outcomes)))
    killed = sum(o.verdict == "killed" for o in outcomes)
    print(f"\nscore: {killed} of {len(outcomes)} killed ({killed / max(1, len(outcomes)):.0%})")
    for o in outcomes:
        if o.verdict != "killed":
            print(f"  {o.verdict}: {o.mutant.id} ({o.mutant.file}): {o.mutant.note}")
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
