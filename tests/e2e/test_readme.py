"""The README's examples run as written.

Every ```python block of README.md runs in a fresh temporary folder, as a user would paste it into
a file there. Every command line of its "Other commands" list runs too, in order, in one fresh
folder (later lines read the files earlier ones write), except the lines :data:`NOT_RUN` names with
the reason; a new line in the README either runs here or is added there with its reason. The first
line runs through the installed console script, the rest through its entry point in one interpreter.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

#: README command lines that do not run here, with why (placeholders a user fills in).
NOT_RUN = {
    "hetpart plan path/to/model.py:factory --devices my-machine.toml":
        "placeholder paths: the user's own model file and profile",
}


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def _other_commands(text: str) -> list[str]:
    """The command lines of the ```sh block that follows "Other commands:" (comments dropped)."""
    match = re.search(r"^Other commands:\n+```sh\n(.*?)^```", text, flags=re.S | re.M)
    assert match, "README.md has no 'Other commands:' block"
    lines = []
    for line in match.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            lines.append(shlex.join(words))
    return lines


def _hetpart() -> list[str]:
    """The installed ``hetpart`` console script beside this interpreter (``-m`` when absent)."""
    script = Path(sys.executable).with_name("hetpart")
    return [str(script)] if script.exists() else [sys.executable, "-m", "partitioner.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # as a user has it: hetpart is installed, the checkout is not on the path
    return env


def test_the_readme_has_examples() -> None:
    text = README.read_text(encoding="utf-8")
    assert _python_blocks(text), "README.md has no ```python example"
    assert len(_other_commands(text)) >= 8


@pytest.mark.parametrize("index", range(len(_python_blocks(README.read_text(encoding="utf-8")))))
def test_python_example_runs_in_a_fresh_folder(index: int, tmp_path: Path) -> None:
    code = _python_blocks(README.read_text(encoding="utf-8"))[index]
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"README python block {index} failed:\n{done.stdout}\n{done.stderr}"


#: Runs command lines read from stdin, in order, through the console script's entry point
#: (``partitioner.cli.main``) in one interpreter: torch and hetpart are imported once, not per line.
RUNNER = """
import shlex, sys
from partitioner.cli import main
for line in sys.stdin.read().splitlines():
    print(f"$ {line}", file=sys.stderr, flush=True)
    code = main(shlex.split(line)[1:])
    if code:
        sys.exit(f"README command failed with exit status {code}: {line}")
"""


def test_other_commands_run_as_written(tmp_path: Path) -> None:
    """The first line through the installed ``hetpart`` script, then every line in order in one
    interpreter through the script's entry point."""
    commands = _other_commands(README.read_text(encoding="utf-8"))
    assert set(NOT_RUN) <= set(commands), f"NOT_RUN names lines the README no longer has: {set(NOT_RUN) - set(commands)}"
    run = [line for line in commands if line not in NOT_RUN]
    for line in run:
        assert shlex.split(line)[0] == "hetpart", f"README command {line!r} does not start with hetpart"
    done = subprocess.run(_hetpart() + shlex.split(run[0])[1:], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"README command failed: {run[0]}\n{done.stdout}\n{done.stderr}"
    done = subprocess.run([sys.executable, "-c", RUNNER], input="\n".join(run[1:]), cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    assert done.stderr.count("$ hetpart ") == len(run) - 1
    for written in ("local.toml", "plan.json", "device_map.json", "ops.csv", "partitioned.py", "report.html"):
        assert (tmp_path / written).is_file(), f"a README command should have written {written}"
