"""``hetpart launch PLAN`` prints commands to paste: every value from the command line or the plan
is shell-quoted in a command and escaped in a ``#`` comment, so a newline or a control character
in the plan's path, the model spec or the master address cannot run anything; a master address
that is not a host name or an IP address is refused with one line. The printed text is run by a
real bash with ``torchrun`` defined as a function that records its arguments."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import models
from backends.pipeline.launch import check_master_addr, shell_line, torchrun_commands
from partitioner import Plan, partition
from partitioner.cli import main as cli_main
from partitioner.errors import HetpartError

HOSTILE = "p\ntouch PWNED #\x1b[2J$(touch PWNED2)'\t\\.json"


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    """mlp:tiny in 2 stages on 4x-cpu-host, saved under a path no shell should take as it is."""
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "4x-cpu-host", objective="throughput", stages=2, solver="pipeline-dp",
                     model_name="mlp:tiny")
    path = tmp_path_factory.mktemp("plans") / HOSTILE
    plan.save(path)
    return path


def _run_in_bash(text: str, cwd) -> list[list[str]]:
    """Run ``text`` in bash with ``torchrun`` recording each call's arguments; returns the calls."""
    script = 'n=0; torchrun() { n=$((n + 1)); printf "%s\\0" "$@" > "call$n"; }\n' + text
    done = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    calls = sorted(cwd.glob("call*"), key=lambda p: int(p.name[4:]))
    return [call.read_bytes().decode().split("\0")[:-1] for call in calls]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_pasting_the_printed_commands_runs_torchrun_with_exactly_these_arguments(plan_path, tmp_path, capsys):
    model = "mlp:tiny\n; touch PWNED3"
    assert cli_main(["launch", str(plan_path), "--model", model, "--master-addr", "node0.cluster"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.startswith(("# ", "torchrun ")) for line in lines), out
    assert "p\\x0atouch PWNED #\\x1b[2J" in lines[0]              # the path, escaped in the comment
    calls = _run_in_bash(out, tmp_path)
    assert not list(tmp_path.glob("PWNED*"))                        # nothing but torchrun ran
    assert len(calls) == 2
    for node_rank, argv in enumerate(calls):
        assert argv[argv.index("backends.pipeline") + 1] == str(plan_path)
        assert argv[argv.index("--model") + 1] == model
        assert argv[argv.index("--node-rank") + 1] == str(node_rank)
        assert argv[argv.index("--master-addr") + 1] == "node0.cluster"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_shell_line_round_trips_every_character_through_bash(tmp_path):
    words = ["torchrun", "", "a b", "it's", "\\", "$HOME", "`id`", "x\ny", "\x00z"[1:], "\x1b]0;t\x07", "\u202eabc",
             "tab\there", "\r", "\x7f", "ümlaut"]
    calls = _run_in_bash(shell_line(words), tmp_path)
    assert calls == [words[1:]]
    assert "\n" not in shell_line(words) and "\x1b" not in shell_line(words)


@pytest.mark.parametrize("addr", ["h0\necho PWNED", "a b", "", "-x", "a;b", "\x1b[2Jh", "a..b", "h0 ", "x" * 254])
def test_a_master_address_that_is_not_a_host_or_an_ip_is_refused(plan_path, addr, capsys):
    assert cli_main(["launch", str(plan_path), f"--master-addr={addr}"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("hetpart: error: --master-addr") and "e.g. --master-addr" in err
    with pytest.raises(HetpartError, match="not a host name or IP address"):
        torchrun_commands(Plan.load(plan_path), ["plan.json"], master_addr=addr)


@pytest.mark.parametrize("addr", ["10.0.0.1", "::1", "[fe80::1]", "node0.cluster", "HOST0_ADDRESS", "n-1.x_y"])
def test_host_names_and_addresses_are_taken(addr):
    assert check_master_addr(addr) == addr


@pytest.mark.parametrize("port", [0, 65536, -1])
def test_a_master_port_outside_the_tcp_range_is_refused(plan_path, port, capsys):
    assert cli_main(["launch", str(plan_path), "--master-port", str(port)]) == 2
    assert "--master-port" in capsys.readouterr().err
