"""The ONNX project's own backend test data, split into parts, against the outputs stored beside it.

The ``onnx`` wheel ships model folders (``onnx/backend/test/data/``: ``simple``,
``pytorch-converted``, ``pytorch-operator``, and the ``light`` ResNet-50, DenseNet-121, VGG-19, ...
with their expected outputs) and generates ~1,900 single-operator ``node`` cases in memory
(``onnx.backend.test.loader``). Every model and case that onnxruntime runs correctly as one
session (its outputs equal the expected ones under the case's rtol/atol, onnx's own comparison)
is imported, its ops split in topological order into a first half on ``cpu`` and a second half on
``cuda:0`` (bound to the CPU provider), so it runs as ≥ 2 parts wherever it has ≥ 2 ops, and the
chained part sessions must give the expected outputs too. Cases onnxruntime fails whole are
counted as skipped. Run with ``-s`` to see the counts.
"""

from __future__ import annotations

import collections
import glob
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner

from backends.onnx_parts import build_parts
from backends.onnx_parts.providers import CPU, session_options
from cost_models.profiles import load_profile
from partitioner import Plan, from_onnx
from partitioner.solvers.problem import Placement, Problem, Solution, Status

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "light")
#: fewer cases than this running whole means the data or onnxruntime changed: look before trusting a pass
MIN_RAN = {"node": 1500, "simple": 15, "pytorch-converted": 55, "pytorch-operator": 20, "light": 9}

Case = tuple[str, onnx.ModelProto, list[tuple[list[Any], list[Any]]], float, float]


def cases(kind: str) -> Iterator[Case]:
    """(name, model, [(inputs, expected outputs)], rtol, atol) of every case of one kind."""
    if kind == "node":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # onnx's generators overflow casts on purpose
            node_cases = load_model_tests(kind="node")
        for c in node_cases:
            yield c.name, c.model, c.data_sets, c.rtol, c.atol
    elif kind == "light":
        yield from _light()
    else:
        for c in load_model_tests(kind=kind):
            model = onnx.load(os.path.join(c.model_dir, "model.onnx"))
            sets = []
            for folder in sorted(glob.glob(os.path.join(c.model_dir, "test_data_set*"))):
                count = lambda what: len(glob.glob(os.path.join(folder, f"{what}_*.pb")))  # noqa: E731
                ins = [_proto(os.path.join(folder, f"input_{i}.pb"), model.graph.input[i].type)
                       for i in range(count("input"))]
                outs = [_proto(os.path.join(folder, f"output_{i}.pb"), model.graph.output[i].type)
                        for i in range(count("output"))]
                sets.append((ins, outs))
            yield c.name, model, sets, c.rtol, c.atol


def _light() -> Iterator[Case]:
    """The light models with onnx's runner's input (arange / size, shaped) and their stored output."""
    from onnx.backend.test.case.model import collect_testcases

    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for c in collect_testcases():
        path = os.path.join(folder, f"light_{c.model_name}.onnx")
        if not os.path.exists(path):
            continue
        model = onnx.load(path)
        weights = {t.name for t in model.graph.initializer}
        x = next(i for i in model.graph.input if i.name not in weights)
        shape = tuple(d.dim_value for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        want = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, f"light_{c.model_name}_output_0.pb")))
        yield c.model_name, model, [([(np.arange(n).reshape(shape) / n).astype(np.float32)], [want])], c.rtol, c.atol


def _proto(path: str, t: onnx.TypeProto) -> Any:
    data = open(path, "rb").read()  # noqa: SIM115 - small files
    for field, proto, convert in (("sequence_type", onnx.SequenceProto, numpy_helper.to_list),
                                  ("optional_type", onnx.OptionalProto, numpy_helper.to_optional)):
        if t.HasField(field):
            message = proto()
            message.ParseFromString(data)
            return convert(message)
    return numpy_helper.to_array(onnx.load_tensor_from_string(data))


def _feeds(model: onnx.ModelProto, inputs: list[Any]) -> dict[str, Any]:
    weights = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in weights]
    return dict(zip(names, [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in inputs]))


def _expected(outputs: list[Any]) -> list[Any]:
    return [numpy_helper.to_array(o) if isinstance(o, onnx.TensorProto) else o for o in outputs]


def _equal(want: list[Any], got: list[Any], rtol: float, atol: float) -> bool:
    try:
        Runner.assert_similar_outputs(want, got, rtol, atol)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def _runs_whole(model: onnx.ModelProto, sets: list, rtol: float, atol: float) -> bool:
    try:
        session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=[CPU])
        return all(_equal(_expected(outs), session.run(None, _feeds(model, ins)), rtol, atol) for ins, outs in sets)
    except Exception:  # noqa: BLE001 - any failure of onnxruntime on the whole model makes the case a skip
        return False


def _halves(name: str, model: onnx.ModelProto, sets: list) -> tuple[Any, int]:
    """The case's parts (first half of the ops on cpu, second on cuda:0 bound to the CPU provider)."""
    feeds = _feeds(model, sets[0][0])
    shapes = {k: np.asarray(v).shape for k, v in feeds.items() if isinstance(v, np.ndarray)}
    graph = from_onnx(model, shapes, name=name)
    problem = Problem(graph, load_profile("h200-host"))
    half = len(problem.nodes) // 2
    placement = Placement({n: "cpu" if k < half else "cuda:0" for k, n in enumerate(problem.nodes)})
    plan = Plan.from_solution(problem, Solution("halves", placement, Status.HEURISTIC), capture="onnx")
    parts = build_parts(plan, graph, {"cuda:0": "cpu"})
    return parts, len(parts.manifest.parts)


@pytest.mark.parametrize("kind", KINDS)
def test_every_case_onnxruntime_runs_whole_also_runs_split(kind: str) -> None:
    counts: collections.Counter[str] = collections.Counter()
    failures = []
    for name, model, sets, rtol, atol in cases(kind):
        if not _runs_whole(model, sets, rtol, atol):
            counts["skipped: onnxruntime fails whole"] += 1
            continue
        counts["ran"] += 1
        try:
            parts, n = _halves(name, model, sets)
            counts["split into >= 2 parts" if n >= 2 else "one part (one op)" if n else "no op"] += 1
            good = all(_equal(_expected(outs), [parts.run(_feeds(model, ins))[o.name] for o in model.graph.output],
                              rtol, atol) for ins, outs in sets)
        except Exception as exc:  # noqa: BLE001 - every failure is listed below, with its message
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if good:
            counts["passed"] += 1
        else:
            failures.append(f"{name}: outputs differ from the expected ones")
    print(f"\nONNX backend test data, {kind}: {dict(counts)}")
    assert counts["ran"] >= MIN_RAN[kind], dict(counts)
    assert not failures, f"{len(failures)} of {counts['ran']} failed:\n" + "\n".join(failures[:20])
