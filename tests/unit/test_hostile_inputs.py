"""Hostile and careless inputs: each case ends in a sentence naming the input and the fix, an
untouched file, or a correct run, and no payload ever runs (a marker file never appears).

One section per group of issue 11: names that would run as code, non-regular and unwritable
outputs, terminal escapes, plans that lie about their graph or contradict themselves, inputs as
the user passes them, other input sizes (the dynamic-shape runs are in
``tests/e2e/test_dynamic_shapes.py``), values never checked, tracebacks, sizes, poor messages,
the model's mode in training, and ``emit_source``'s weights.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

import models
from backends.torch.check import check_plan
from cost_models.profiles import load_profile, load_profile_text
from partitioner import CaptureError, HetpartError, Plan, PlanMismatch, ProfileError, partition
from partitioner.cli import main
from partitioner.files import write_atomic
from partitioner.frontends.names import check_graph_targets
from partitioner.plan import PlanFormatError

BIND = {"cuda:0": "cpu", "npu:0": "cpu"}
CLI_BIND = ("--bind", "cuda:0=cpu", "--bind", "npu:0=cpu")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str) -> str:
    """The command failed with one ``hetpart: error:`` sentence and no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("hetpart: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def payload(marker: Path) -> str:
    """A name that, pasted between quotes into code, writes ``marker`` (no dots: fx splits on them)."""
    code = f"open({str(marker)!r}, 'w').write('ran')"
    return 'x"+str(exec(' + "+".join(f"chr({ord(c)})" for c in code) + '))+"'


@pytest.fixture(scope="module")
def mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return models.get("mlp", "tiny")


@pytest.fixture(scope="module")
def spread_plan(mlp: tuple[nn.Module, tuple]) -> Plan:
    """mlp:tiny over three devices, with transfers between them."""
    model, inputs = mlp
    return partition(model, inputs, "cpu-gpu-npu", pins={"linear_1": "cuda:0", "linear_2": "npu:0"},
                     time_limit=10, model_name="mlp:tiny")


@pytest.fixture
def plan_file(spread_plan: Plan, tmp_path: Path) -> Path:
    return spread_plan.save(tmp_path / "plan.json")


# --------------------------------------------------------------------------------------------
# 1. Names torch.fx writes into code
# --------------------------------------------------------------------------------------------


class _Constant(nn.Module):
    """A plain tensor attribute (a constant torch.export lifts) under a given name."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.lin = nn.Linear(4, 4)
        setattr(self, name, torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + getattr(self, self.name)


def test_a_tensor_attribute_name_never_runs_as_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    model, x = _Constant(payload(marker)), torch.randn(2, 4)
    plan = partition(model, (x,), "cpu-gpu-npu", pins={"linear": "cuda:0"}, time_limit=10)
    with pytest.raises(CaptureError, match=r"tensor attribute 'x\"\+str\(exec.*plan\.emit refuses it.*"
                                           r"emit_source"):
        plan.emit(model, BIND)
    with pytest.raises(CaptureError, match="tensor attribute"):
        check_plan(plan, model, (x,), BIND)
    path = plan.emit_source(tmp_path / "safe.py", model, BIND)  # quotes every name: it runs, correctly
    namespace: dict = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)  # noqa: S102 - the file under test
    torch.testing.assert_close(namespace["build"](model)(x), model(x))
    assert not marker.exists()


class _Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        setattr(self, "class", nn.Linear(4, 4))
        self.register_buffer("lambda", torch.ones(4))
        self.register_parameter("import", nn.Parameter(torch.full((4,), 0.5)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, "class")(x) * getattr(self, "import") + getattr(self, "lambda")


def test_keyword_names_get_a_sentence_not_a_syntax_error(tmp_path: Path) -> None:
    model, x = _Keywords(), torch.randn(2, 4)
    with pytest.raises(CaptureError, match=r"parameter 'import': it is a Python keyword.*capture='symbolic_trace' "
                                           r"refuses it.*capture='export'"):
        partition(model, (x,), "cpu", capture="symbolic_trace")
    plan = partition(model, (x,), "cpu", time_limit=10)  # export never writes the names as code
    with pytest.raises(CaptureError, match="parameter 'import': it is a Python keyword"):
        plan.emit(model)
    del model.__dict__["_parameters"]["import"]  # the other keywords are named as well
    model.register_parameter("ok", nn.Parameter(torch.ones(4)))
    with pytest.raises(CaptureError, match="buffer 'lambda': it is a Python keyword"):
        from backends.torch.module import emit_module
        emit_module(plan, model)
    model = _Keywords()
    path = plan.emit_source(tmp_path / "kw.py", model)
    namespace: dict = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)  # noqa: S102
    torch.testing.assert_close(namespace["build"](model)(x), model(x))


def test_symbolic_trace_of_a_payload_name_is_refused_before_tracing(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    model = _Constant(payload(marker))
    with pytest.raises(CaptureError, match="tensor attribute.*capture='symbolic_trace' refuses it"):
        partition(model, (torch.randn(2, 4),), "cpu", capture="symbolic_trace")
    assert not marker.exists()


def test_the_last_guard_sees_graph_targets_that_bypassed_the_model_check(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    target = next(n for n in gm.graph.nodes if n.op == "call_module")
    target.target = payload(marker)  # as a renamed attribute would reach it; not recompiled
    with pytest.raises(CaptureError, match="graph attribute 'x\"\\+str.*plan.emit refuses"):
        check_graph_targets(gm, "plan.emit")
    assert not marker.exists()


# --------------------------------------------------------------------------------------------
# 2. Outputs: never replace what is not a regular file; check before the work
# --------------------------------------------------------------------------------------------


def test_force_never_replaces_a_fifo_a_symlink_or_a_folder(spread_plan: Plan, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    real = tmp_path / "real.json"
    real.write_text("keep me\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    for target, kind in ((fifo, "a FIFO"), (link, "a symbolic link"), (folder, "a folder")):
        with pytest.raises(HetpartError, match=f"{target.name} is {kind}, not a regular file"):
            spread_plan.save(target, force=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_text() == "keep me\n"
    assert folder.is_dir() and not any(folder.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temporary file left"


def test_cli_refuses_a_fifo_output_before_capturing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    code, _, err = run(capsys, "plan", "mlp", "-o", str(fifo), "--force")
    assert "is a FIFO, not a regular file" in one_error(code, err)
    assert "capturing" not in err  # refused before any work
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_path_under_a_file_fails_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    code, _, err = run(capsys, "plan", "mlp", "-o", str(existing / "plan.json"))
    assert f"{existing} is a file, not a folder" in one_error(code, err)
    assert "capturing" not in err
    code, _, err = run(capsys, "plan", "mlp", "-o", "")
    assert "-o is empty" in one_error(code, err)
    code, _, err = run(capsys, "report", str(existing), "--format", "png", "-o", str(existing / "charts"))
    assert "is not a folder" in one_error(code, err)


def test_a_fifo_given_as_a_plan_or_profile_is_refused_not_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan, profile = tmp_path / "plan.json", tmp_path / "host.toml"
    os.mkfifo(plan)
    os.mkfifo(profile)  # reading either would block forever
    code, _, err = run(capsys, "report", str(plan), "-o", str(tmp_path / "r.html"))
    assert f"{plan} is a FIFO, not a regular file: give the plan file itself" in one_error(code, err)
    code, _, err = run(capsys, "plan", "mlp", "--devices", str(profile))
    assert f"{profile} is a FIFO, not a regular file: give the profile itself" in one_error(code, err)


def test_devices_write_leaves_a_users_tmp_file_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "x.toml"
    mine = tmp_path / "x.toml.tmp"
    mine.write_text("my notes\n")
    code, out, err = run(capsys, "devices", "cpu-gpu-npu", "--write", str(target))
    assert code == 0, err
    assert mine.read_text() == "my notes\n"
    assert load_profile(target) == load_profile("cpu-gpu-npu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.toml", "x.toml.tmp"]


def test_writes_are_synced_before_and_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:  # observes the real call; the write is the real one
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomic(tmp_path / "out.txt", b"data")
    assert synced == ["file", "folder"]
    assert (tmp_path / "out.txt").read_bytes() == b"data"


# --------------------------------------------------------------------------------------------
# 3. Terminal escapes
# --------------------------------------------------------------------------------------------


def test_escape_sequences_in_names_never_reach_the_terminal(
        spread_plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "mlp\x1b[2J\x1b]0;owned\x07\u202e"
    d = spread_plan.to_dict()
    d["model"]["name"] = hostile
    d["devices"]["name"] = "cpu\x1b[31m"
    plan = Plan.from_dict(d, "hostile.json")
    summary = plan.summary()
    assert "\x1b" not in summary and "\x07" not in summary and "\u202e" not in summary
    assert "mlp\\x1b[2J\\x1b]0;owned\\x07\\u202e" in summary
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(d))
    code, out, err = run(capsys, "emit", "mlp:tiny", "--plan", str(path), "-o", str(tmp_path / "e.py"), *CLI_BIND)
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "\\x1b[2J" in out


# --------------------------------------------------------------------------------------------
# 4. Plans that lie about their graph or contradict themselves
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["missing", "extra", "renamed"])
def test_a_copied_fingerprint_does_not_make_a_plan_fit(spread_plan: Plan, mlp: tuple, change: str) -> None:
    model, _ = mlp
    d = spread_plan.to_dict()
    if change == "renamed":
        d = json.loads(json.dumps(d).replace('"relu_1"', '"relu_9"'))
    else:
        op = "relu_1" if change == "missing" else "relu_7"
        fields = (d["placement"], d["model"]["modules"], d["predicted"]["per_op_s"],
                  d["predicted"]["per_op_device_s"], d["model"]["op_bytes"])
        for field in fields:
            if change == "missing":
                field.pop(op)
            else:  # (an extra op owning no parameters: the memory recorded stays what it needs)
                field[op] = [0, 0] if field is d["model"]["op_bytes"] else next(iter(field.values()))
        d["schedule"] = [o for o in d["schedule"] if o != op] + ([op] if change == "extra" else [])
        d["model"]["edges"] = [e for e in d["model"]["edges"] if op not in e[:2]]
        # the edit is made consistent, so that loading the file passes: the copies left go where a
        # remaining edge needs them
        needed = {(u, d["placement"][u], d["placement"][v]) for u, v, _ in d["model"]["edges"]}
        d["transfers"] = [t for t in d["transfers"] if (t["tensor"].split(".")[0], t["from"], t["to"]) in needed]
        d["model"]["op_count"] = len(d["placement"])
    plan = Plan.from_dict(d, "edited.json")
    assert plan.fingerprint == spread_plan.fingerprint
    names = {"missing": "ops only in the graph: relu_1", "extra": "ops only in the plan: relu_7",
             "renamed": "ops only in the plan: relu_9"}
    with pytest.raises(PlanMismatch, match=f"carries the fingerprint of model .* but not its ops(.|\\n)*"
                                           f"{names[change]}"):
        plan.emit(model, BIND)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["memory"]["cuda:0"].update(used=d["memory"]["cuda:0"]["capacity"] + 1),
     r'memory\["cuda:0"\]\.used: .* over the capacity'),
    (lambda d: d["memory"]["cpu"].update(capacity=1000),
     r'memory\["cpu"\]\.capacity: 1,000 bytes, but the plan\'s devices section gives cpu'),
    (lambda d: d["transfers"][0].update({"from": "npu:0"}),
     r"transfers\[0\]\.from: 'npu:0', but .* runs on 'cpu'; the transfers contradict the placement"),
    (lambda d: d["transfers"][0].update(to="cpu", **{"from": "cuda:0"}),
     r"transfers\[0\]\.from: 'cuda:0'"),
    (lambda d: d.update(schedule=d["schedule"][1:]), r"schedule: lists 4 of the 5 placed ops"),
], ids=["over-capacity", "capacity-not-profile", "transfer-source", "transfer-destination", "schedule"])
def test_a_plan_contradicting_itself_is_refused_naming_the_field(
        spread_plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, message: str) -> None:
    d = spread_plan.to_dict()
    edit(d)
    with pytest.raises(PlanFormatError, match=message):
        Plan.from_dict(d, "edited.json")
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    code, out, err = run(capsys, "explain", str(path), "linear")
    one_error(code, err)
    assert "fits" not in out


# --------------------------------------------------------------------------------------------
# 5. Inputs as the user passes them
# --------------------------------------------------------------------------------------------


class _Optional(nn.Module):
    """A plain tensor attribute, a None positional input and a number, like WhisperModel's call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = torch.full((4,), 2.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, k: int = 1) -> torch.Tensor:
        y = self.lin(x) * self.scale * k
        return y if mask is None else y * mask


def test_inputs_are_recorded_as_passed_and_emit_needs_no_example(tmp_path: Path) -> None:
    model, x = _Optional(), torch.randn(2, 4)
    plan = Plan.load(partition(model, (x, None, 3), "cpu-gpu-npu", pins={"linear": "cuda:0"},
                               time_limit=10).save(tmp_path / "p.json"))
    assert [(s.kind, s.shape, s.value) for s in plan.inputs] == [("tensor", (2, 4), None), ("none", (), None),
                                                                  ("int", (), 3)]
    emitted = plan.emit(model, BIND)  # no example_inputs: the recorded ones re-capture the model
    torch.testing.assert_close(emitted(x, None, 3), model(x, None, 3))
    with pytest.raises(HetpartError, match=r"input 1 \(mask\) is a tensor of shape \(2, 4\), and the plan was "
                                           r"made with None there"):
        emitted(x, torch.ones(2, 4), 3)


def test_plans_written_before_inputs_had_kinds_still_load(spread_plan: Plan, mlp: tuple) -> None:
    d = spread_plan.to_dict()
    assert d["model"]["inputs"] == [{"shape": [8, 64], "dtype": "float32"}]  # the old spelling, unchanged
    plan = Plan.from_dict(d)
    model, inputs = mlp
    torch.testing.assert_close(plan.emit(model, BIND)(*inputs), model(*inputs))
    d["model"]["inputs"] = [{"shape": [8, 64], "dtype": "none"}]
    with pytest.raises(PlanFormatError, match=r'model\.inputs\[0\]\.dtype: "none" is not a tensor dtype'):
        Plan.from_dict(d, "old.json")


# --------------------------------------------------------------------------------------------
# 7. Values never checked
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (("--pin", "linear=cpu", "--pin", "linear=cuda:0"), "--pin 'linear' is given twice (linear=cpu and linear=cuda:0)"),
    (("--memory", "cuda:0=2GB", "--memory", "cuda:0=3GB"), "--memory 'cuda:0' is given twice"),
    (("--time-limit", "0"), "--time-limit 0.0: expected seconds above 0"),
    (("--time-limit", "-5"), "--time-limit -5.0: expected seconds above 0"),
    (("--time-limit", "nan"), "--time-limit nan: expected seconds above 0"),
    (("--time-limit", "inf"), "--time-limit inf: expected seconds above 0"),
    (("--gap", "-0.1"), "--gap -0.1: expected a relative optimality gap from 0"),
    (("--gap", "nan"), "--gap nan: expected a relative optimality gap"),
    (("--gap", "1"), "--gap 1.0: expected a relative optimality gap"),
    (("--memory", "cuda:0=1.5"), "'1.5' is not valid (not a whole number of bytes"),
])
def test_bad_values_name_the_flag_and_the_range(capsys: pytest.CaptureFixture[str], flags, message: str) -> None:
    code, _, err = run(capsys, "plan", "mlp", *flags)
    assert message in one_error(code, err)
    assert "capturing" not in err or "--memory" in flags  # checked before the capture


@pytest.mark.parametrize("kwargs, message", [
    ({"time_limit": 0}, "time_limit 0: expected seconds above 0"),
    ({"time_limit": float("nan")}, "time_limit nan"),
    ({"gap": float("inf")}, "gap inf: expected a relative optimality gap"),
    ({"gap": -1}, "gap -1"),
])
def test_partition_checks_its_limits(mlp: tuple, kwargs: dict, message: str) -> None:
    model, inputs = mlp
    with pytest.raises(HetpartError, match=message.replace("(", r"\(")):
        partition(model, inputs, "cpu", **kwargs)


_CPU = 'kind = "cpu"\npeak_flops = 1e12\nmem_bandwidth = "20GB/s"\nlaunch_overhead = "2us"\n'


@pytest.mark.parametrize("field, message", [
    ('memory = 80.5\n', r'devices\.cpu\.memory: 80\.5 is not valid \(not a whole number of bytes; did you '
                        r'mean "80\.5GB"\?'),
    ('memory = "64GiB"\nmem_bandwidth_x = 1\n', r"devices\.cpu\.mem_bandwidth_x: unknown field"),
])
def test_profile_memory_values_are_whole_bytes(field: str, message: str) -> None:
    with pytest.raises(ProfileError, match=f"bad.toml: {message}"):
        load_profile_text(f"[devices.cpu]\n{field}{_CPU}", "bad.toml")


@pytest.mark.parametrize("key, value, message", [
    ("mem_bandwidth", "1e-10", r"mem_bandwidth: 1e-10 bytes/s is outside the range hetpart can cost "
                               r"\(1000 to 1e\+16 bytes/s\)"),
    ("mem_bandwidth", '"1e300TB/s"', r"mem_bandwidth: '1e300TB/s' is outside the range"),
    ("launch_overhead", "1e9", r"launch_overhead: 1e\+09 s is outside the range hetpart can cost \(0 to 10 s\)"),
    ("peak_flops", "1e30", r"peak_flops\.float32: 1e\+30 FLOP/s is outside the range"),
    ("memory", '"2EiB"', r"memory: '2EiB' is not valid|memory: '2EiB' is outside"),
])
def test_extreme_profile_values_name_the_file_the_field_and_the_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, message: str) -> None:
    fields = {"kind": '"cpu"', "memory": '"64GiB"', "peak_flops": "1e12", "mem_bandwidth": '"20GB/s"',
              "launch_overhead": '"2us"', key: value}
    path = tmp_path / "extreme.toml"
    path.write_text("[devices.cpu]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items()))
    code, _, err = run(capsys, "plan", "mlp", "--devices", str(path))
    line = one_error(code, err)
    assert str(path) in line and f"devices.cpu.{key}" in line
    assert re.search(message, line), line
    assert "capturing" not in err


# --------------------------------------------------------------------------------------------
# 8. Sentences instead of tracebacks
# --------------------------------------------------------------------------------------------


MODEL_FILES = {
    "syntax.py:factory": ("import torch\ndef factory(:\n", "'syntax.py' line 2: syntax error"),
    "imports.py:factory": ("import torch\nimport hetpart_missing_pkg\n",
                           "importing 'imports.py' failed: ModuleNotFoundError: No module named "
                           "'hetpart_missing_pkg' (imports.py line 2)"),
    "raises.py:factory": ("def factory():\n    raise ValueError('size must be positive')\n",
                          "the factory 'raises.py:factory' raised ValueError: size must be positive "
                          "(raises.py line 2)"),
    "pair.py:factory": ("import torch\ndef factory():\n    return 'model', (torch.ones(2),)\n",
                        "must return (module, example_inputs), e.g. return Model(), (torch.randn(2, 16),); it "
                        "returned a pair whose first item is a str, not an nn.Module"),
    "noop.py:factory": ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
                        "def factory():\n    return M(), (torch.ones(2),)\n",
                        "'noop:factory' has no operations to place"),
}


@pytest.mark.parametrize("spec", sorted(MODEL_FILES))
def test_model_files_that_fail_get_a_sentence(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.chdir(tmp_path)
    text, message = MODEL_FILES[spec]
    Path(spec.partition(":")[0]).write_text(text)
    code, _, err = run(capsys, "plan", spec, "--devices", "cpu")
    assert message in one_error(code, err)


def test_a_factory_may_look_itself_up_in_sys_modules(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("selfref.py").write_text("import sys, torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                                  "        return x * 2\ndef factory():\n    assert sys.modules[__name__].M is M\n"
                                  "    return M(), (torch.ones(2),)\n")
    code, out, err = run(capsys, "inspect", "selfref.py:factory", "--devices", "cpu")
    assert code == 0, err


@pytest.mark.parametrize("name, text, message", [
    ("deep.json", "[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ("digits.json", '{"format_version": ' + "9" * 5000 + "}", "a number in the file is too long to read"),
])
def test_pathological_plan_files_get_a_sentence(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    for argv in (("report", str(path), "-o", str(tmp_path / "r.html")), ("explain", str(path), "x"),
                 ("emit", "mlp", "--plan", str(path), "-o", str(tmp_path / "e.py"))):
        code, _, err = run(capsys, *argv)
        line = one_error(code, err)
        assert str(path) in line and message in line
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "e.py").exists()


@pytest.mark.parametrize("text, message", [
    ("x = " + "[" * 200_000 + "]" * 200_000 + "\n", "nested too deeply"),
    ("name = " + "9" * 5000 + "\n", "a number in the file is too long to read"),
])
def test_pathological_profiles_get_a_sentence(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    code, _, err = run(capsys, "devices", str(path))
    line = one_error(code, err)
    assert str(path) in line and message in line


def test_a_dollar_in_a_name_draws_literally_in_the_png_report(
        spread_plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = spread_plan.to_dict()
    d["model"]["name"] = "a$b_{x$ \\frac"
    path = tmp_path / "dollar.json"
    path.write_text(json.dumps(d))
    code, _, err = run(capsys, "report", str(path), "--format", "png", "-o", str(tmp_path / "charts"))
    assert code == 0, err
    assert (tmp_path / "charts" / "gantt.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------------------------
# 9. Sizes
# --------------------------------------------------------------------------------------------


def _many_devices(n: int) -> str:
    lines = ['[devices.cpu]', 'kind = "cpu"', 'memory = "64GiB"', "peak_flops = 1e12", 'mem_bandwidth = "20GB/s"',
             'launch_overhead = "2us"']
    for i in range(n - 1):
        lines += [f'[devices."cuda:{i}"]', 'kind = "gpu"', 'memory = "80GB"', "peak_flops = 5e13",
                  'mem_bandwidth = "2TB/s"', 'launch_overhead = "8us"']
    for i in range(n - 1):
        lines += ["[[links]]", f'between = ["cpu", "cuda:{i}"]', 'bandwidth = "25GB/s"', 'latency = "10us"']
    return "\n".join(lines) + "\n"


def test_ten_thousand_devices_are_refused_with_a_sentence(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text(_many_devices(10_000))
    with pytest.raises(ProfileError, match=r"huge.toml: devices: 10,000 devices, over the 256 a profile may list"):
        load_profile(path)


def test_an_ilp_too_large_to_build_is_refused_with_its_size(mlp: tuple) -> None:
    model, inputs = mlp
    profile = load_profile_text(_many_devices(200), "wide.toml")
    with pytest.raises(HetpartError, match=r"the ILP for 'MLP' would have about 159,200 transfer terms "
                                           r"\(4 edges x 200 devices x 199 others\).*--solver heft"):
        partition(model, inputs, profile)


# --------------------------------------------------------------------------------------------
# 10. Messages that name what the user did
# --------------------------------------------------------------------------------------------


def test_conflicting_pins_under_aligned_modules_name_both_pins_and_the_module() -> None:
    model, inputs = models.get("gpt", "tiny", device="meta")
    with pytest.raises(HetpartError, match=r"pins 'blocks\.0\.attn\*'=cuda:0 and 'blocks\.0\.mlp\*'=cpu both match "
                                           r"module 'blocks\.0' \(\d+ ops kept together"):
        partition(model, inputs, "h200-host", align_modules=["Block"],
                  pins={"blocks.0.attn*": "cuda:0", "blocks.0.mlp*": "cpu"})


# --------------------------------------------------------------------------------------------
# 11. plan --training and check --training capture the same mode
# --------------------------------------------------------------------------------------------


def test_an_eval_mode_factory_plans_and_checks_in_train_mode(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bn.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = torch.nn.Linear(4, 4)\n        self.bn = torch.nn.BatchNorm1d(4)\n"
        "    def forward(self, x):\n        return self.bn(self.lin(x)).relu()\n"
        "def factory():\n    torch.manual_seed(0)\n    return M().eval(), (torch.randn(8, 4),)\n")
    code, _, err = run(capsys, "plan", "bn.py:factory", "--devices", "cpu-gpu-npu", "--training",
                       "--pin", "linear=cuda:0", "-o", "plan.json")
    assert code == 0, err
    code, out, err = run(capsys, "check", "bn.py:factory", "--plan", "plan.json", "--training", "--repeat", "1",
                         *CLI_BIND)
    assert code == 0, err
    assert "passed" in out
    norm = nn.BatchNorm1d(4).eval()  # the caller's modules keep their mode after a training plan
    partition(nn.Sequential(nn.Linear(4, 4), norm), (torch.randn(8, 4),), "cpu", training=True, time_limit=10)
    assert not norm.training


# --------------------------------------------------------------------------------------------
# 12. emit_source's build() loads the weights
# --------------------------------------------------------------------------------------------


def test_build_loads_the_weights_from_the_model_or_a_file(spread_plan: Plan, mlp: tuple, tmp_path: Path) -> None:
    model, inputs = mlp
    path = spread_plan.emit_source(tmp_path / "placed.py", model, BIND)
    text = path.read_text(encoding="utf-8")
    assert "module = build(model)" in text and "never run it unloaded" in text
    namespace: dict = {}
    exec(compile(text, str(path), "exec"), namespace)  # noqa: S102 - the generated file under test
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'weights'"):
        namespace["build"]()
    torch.testing.assert_close(namespace["build"](model)(*inputs), model(*inputs))
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.testing.assert_close(namespace["build"](str(tmp_path / "weights.pt"))(*inputs), model(*inputs))
    torch.testing.assert_close(namespace["build"](model.state_dict())(*inputs), model(*inputs))
