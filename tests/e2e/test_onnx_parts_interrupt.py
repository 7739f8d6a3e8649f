"""Ctrl-C stops an ONNX part that would run forever: ``hetpart run`` and ``hetpart check`` on a model whose
``Loop`` has a trip count of 2^62 exit with status 130 and one line, within seconds of SIGINT.

Each test starts a real ``hetpart`` process (``--debug``, whose log says when the sessions are about
to run), waits for that line and a second more, sends SIGINT and waits at most :data:`PROMPT` s.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.onnx_parts import load_parts
from backends.onnx_parts.interrupt import Interruptible
from partitioner import partition
from tests.e2e.terminal import sigint_as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]
#: seconds from SIGINT to the exit (the interpreter's own shutdown included) on a busy 2-core machine
PROMPT = 20.0
#: seconds hetpart may take to import and load the model before it runs it, on a busy machine
STARTUP = 180.0


def endless_model(path: Path) -> Path:
    """``out = -Loop(2^62 times: acc += 1)(relu(x))``."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.ones(2, np.float32), "one")])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Loop", ["trips", "cond", "r"], ["y"], body=body, name="loop"),
             helper.make_node("Neg", ["y"], ["out"], name="neg")]
    graph = helper.make_graph(nodes, "endless", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(np.array(2**62, np.int64), "trips"),
                                           numpy_helper.from_array(np.array(True), "cond")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("endless")
    model = endless_model(root / "endless.onnx")
    plan = partition(model, devices="cpu-gpu-npu", pins={"relu": "cpu", "loop": "cuda:0", "neg": "cpu"},
                     time_limit=5)
    plan.save(root / "plan.json")
    return {"model": model, "plan": root / "plan.json", "parts": plan.emit_onnx(root / "parts", model)}


def interrupted(argv: list[str], ready: str) -> tuple[int, str]:
    """Run ``hetpart argv``, SIGINT it a second after its stderr shows ``ready``: (exit status, stderr
    after ``ready``). Fails if it is not ready within :data:`STARTUP` s or still runs :data:`PROMPT` s
    after the signal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "partitioner.cli", *argv, "--debug"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_as_from_a_terminal)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        seen, deadline = [], time.monotonic() + STARTUP
        while not seen or ready not in seen[-1]:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"hetpart {argv[0]} did not log {ready!r} within {STARTUP:.0f} s")
            assert line is not None, f"hetpart ended before {ready!r}: {''.join(seen)[-2000:]}"
            seen.append(line)
        time.sleep(1.0)  # well inside the endless run
        assert process.poll() is None
        process.send_signal(signal.SIGINT)
        after, deadline = [], time.monotonic() + PROMPT
        while (line := lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            after.append(line)
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        return process.returncode, "".join(after)
    except (queue.Empty, subprocess.TimeoutExpired):
        pytest.fail(f"hetpart {argv[0]} still ran {PROMPT:.0f} s after SIGINT: Ctrl-C does not stop a part")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow  # a hetpart process: its imports take seconds
def test_ctrl_c_stops_hetpart_run_of_an_endless_part(endless: dict[str, Path]) -> None:
    code, err = interrupted(["run", str(endless["parts"]), "--random", "--bind", "cuda:0=cpu"],
                               ready="opened 3 parts of endless")
    assert code == 130 and err == "hetpart: interrupted\n", err


@pytest.mark.slow
def test_ctrl_c_stops_hetpart_check_of_an_endless_model(endless: dict[str, Path]) -> None:
    code, err = interrupted(["check", str(endless["model"]), "--plan", str(endless["plan"]), "--bind",
                                "cuda:0=cpu", "--repeat", "1"], ready="beside the whole model")
    assert code == 130 and err == "hetpart: interrupted\n", err


def test_runs_off_the_main_thread_and_errors_pass_through(endless: dict[str, Path]) -> None:
    """A part's error still reaches the caller as an OnnxError; a call from another thread runs there."""
    parts = load_parts(endless["parts"], {"cuda:0": "cpu"})
    with pytest.raises(Exception, match="input 'x' is missing"):
        parts.run({})
    seen = []
    worker = threading.Thread(target=lambda: seen.append(Interruptible()(lambda o: threading.current_thread())))
    worker.start()
    worker.join()
    assert seen == [worker]
    assert Interruptible()(lambda options: (threading.current_thread().name, options.terminate)) == \
        ("hetpart-onnx-run", False)
