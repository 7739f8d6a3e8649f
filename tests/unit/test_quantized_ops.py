"""backends.torch.quantized_ops: torch's int8 / int4 kernels on CPU against the float math they stand for.

Each case packs a random normal weight with ``pack_weight`` and checks the kernel's output against
``F.linear`` with the dequantized weight (the kernel computes what the pack means) and with the
float weight (the quantization error is small), for 1, 2 and 17 rows of float32 and bfloat16 input.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.fx
import torch.nn.functional as F

from backends.torch import quantized_ops as qo
from partitioner.errors import HetpartError

SHAPES = [(256, 512), (96, 160)]          # [out, in]; 160 takes int4 groups of 32
ROWS = (1, 2, 17)
X_DTYPES = (torch.float32, torch.bfloat16)
QUANTIZATION_ERROR = {"int8": 2e-2, "int4": 0.15}
REPO = Path(__file__).resolve().parents[2]


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


def packed(out_features: int, in_features: int, dtype: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    return weight, bias, qo.pack_weight(weight, dtype, "cpu")


def call(dtype: str, x: torch.Tensor, tensors: dict[str, torch.Tensor], bias=None) -> torch.Tensor:
    kwargs = {"group": qo.int4_group(x.shape[-1])} if dtype == "int4" else {}
    with torch.no_grad():
        return qo.LINEAR[dtype](x, *tensors.values(), bias, **kwargs)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_equals_dequantized_weight_and_is_close_to_float(dtype, shape):
    weight, bias, tensors = packed(*shape, dtype)
    back = qo.dequantized(tensors, dtype, shape)
    assert back.dtype == torch.float32 and tuple(back.shape) == shape
    for rows in ROWS:
        for x_dtype in X_DTYPES:
            x = torch.randn(rows, shape[1]).to(x_dtype)
            y = call(dtype, x, tensors, bias)
            assert y.dtype == x_dtype and tuple(y.shape) == (rows, shape[0])
            assert relative_error(y, F.linear(x.float(), back, bias)) < 1e-2, (rows, x_dtype)
            assert relative_error(y, F.linear(x.float(), weight, bias)) < QUANTIZATION_ERROR[dtype], (rows, x_dtype)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_three_dimensional_input_keeps_its_leading_shape(dtype):
    weight, bias, tensors = packed(96, 160, dtype)
    x = torch.randn(2, 5, 160)
    y = call(dtype, x, tensors, bias)
    assert tuple(y.shape) == (2, 5, 96) and y.dtype == torch.float32
    ref = F.linear(x, qo.dequantized(tensors, dtype, (96, 160)), bias)
    assert relative_error(y, ref) < 1e-2


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("shape", SHAPES + [(16, 32), (48, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_packed_bytes_are_the_nbytes_of_the_packed_tensors(dtype, shape):
    tensors = qo.pack_weight(torch.randn(*shape), dtype, "cpu")
    assert qo.packed_bytes(*shape, dtype) == sum(t.nbytes for t in tensors.values())


def test_packed_bytes_by_formula():
    assert qo.packed_bytes(8192, 4096, "int8") == 8192 * 4096 + 8192 * 2
    assert qo.packed_bytes(8192, 4096, "int4") == 8192 * 4096 // 2 + (4096 // 128) * 8192 * 4
    assert qo.packed_bytes(8192, 4096, "float8") == 8192 * 4096 + 8192 * 4
    with pytest.raises(HetpartError, match="int4"):
        qo.packed_bytes(16, 100, "int4")


def test_packed_tensors_have_the_documented_names_and_dtypes():
    int8 = qo.pack_weight(torch.randn(96, 160, dtype=torch.bfloat16), "int8", torch.device("cpu"))
    assert list(int8) == ["qweight", "scales"]
    assert (int8["qweight"].dtype, int8["scales"].dtype) == (torch.int8, torch.bfloat16)
    int4 = qo.pack_weight(torch.randn(96, 160, dtype=torch.float16), "int4", "cpu")
    assert list(int4) == ["qweight", "scales_and_zeros"]
    assert tuple(int4["scales_and_zeros"].shape) == (160 // 32, 96, 2)


def test_int4_group_is_the_largest_dividing_group():
    assert [qo.int4_group(k) for k in (4096, 192, 160, 100, 0)] == [128, 64, 32, None, None]


def test_can_quantize_gives_reasons():
    assert qo.can_quantize((256, 512), "int8") is None
    assert qo.can_quantize((96, 160), "int4") is None
    assert qo.can_quantize((96, 160), "float8") is None
    assert "2-D" in qo.can_quantize((512,), "int8")
    assert qo.can_quantize((256, 100), "int4") == ("int4 needs in_features divisible by 32 and out_features by 16 "
                                                   "(this weight is 256x100)")
    assert "out_features by 16 (this weight is 24x64)" in qo.can_quantize((24, 64), "int4")
    assert "int8 needs in_features divisible by 16 (this weight is 24x100)" in qo.can_quantize((24, 100), "int8")
    assert "unknown weight dtype 'int2'" in qo.can_quantize((16, 32), "int2")


def test_pack_weight_refuses_what_it_cannot_quantize():
    with pytest.raises(HetpartError, match=r"shape \(256, 100\) to int4: .*divisible by 32"):
        qo.pack_weight(torch.randn(256, 100), "int4", "cpu")
    with pytest.raises(HetpartError, match=r"shape \(512,\) to int8: .*2-D"):
        qo.pack_weight(torch.randn(512), "int8", "cpu")
    with pytest.raises(HetpartError, match="not a float weight"):
        qo.pack_weight(torch.ones(16, 32, dtype=torch.int64), "int8", "cpu")


def test_float8_on_cpu_names_float8_and_cuda():
    with pytest.raises(HetpartError, match=r"float8.*CUDA.*sm_89.*int8 or int4"):
        qo.pack_weight(torch.randn(16, 32), "float8", "cpu")


def test_linear_float8_scales_each_row():
    weight, bias = torch.randn(16, 32), torch.randn(16)
    scales = weight.abs().amax(dim=1) / torch.finfo(torch.float8_e4m3fn).max
    tensors = {"qweight": (weight / scales[:, None]).to(torch.float8_e4m3fn), "scales": scales}
    x = torch.randn(3, 4, 32, dtype=torch.bfloat16)
    y = call("float8", x, tensors, bias)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (3, 4, 16)
    back = qo.dequantized(tensors, "float8", (16, 32))
    assert relative_error(y, F.linear(x.float(), back, bias)) < 1e-2
    assert relative_error(y, F.linear(x.float(), weight, bias)) < 0.1


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_an_input_that_needs_grad_is_refused(dtype):
    _, _, tensors = packed(16, 32, dtype)
    x = torch.randn(2, 32, requires_grad=True)
    kwargs = {"group": 32} if dtype == "int4" else {}
    with pytest.raises(HetpartError, match="quantized weights are for inference"):
        qo.LINEAR[dtype](x, *tensors.values(), **kwargs)
    assert call(dtype, x, tensors).shape == (2, 16)          # under no_grad it runs


def test_an_input_of_the_wrong_width_is_refused():
    _, _, tensors = packed(16, 32, "int8")
    with pytest.raises(HetpartError, match=r"\(2, 64\).*32 in_features"):
        call("int8", torch.randn(2, 64), tensors)


def test_a_graph_module_calls_the_linear_by_its_qualified_name():
    _, bias, tensors = packed(96, 160, "int8")
    root = torch.nn.Module()
    for name, tensor in tensors.items():
        root.register_buffer(name, tensor)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    args = [graph.get_attr(name) for name in tensors]
    graph.output(graph.call_function(qo.linear_int8, (x, *args, None)))
    gm = torch.fx.GraphModule(root, graph)
    assert "linear_int8" in gm.code
    x = torch.randn(4, 160)
    with torch.no_grad():
        assert torch.equal(gm(x), call("int8", x, tensors))


def test_import_is_lazy_and_packing_is_quiet():
    script = ("import sys, torch\n"
              "from backends.torch import quantized_ops as qo\n"
              "assert 'torchao' not in sys.modules, 'importing quantized_ops imported torchao'\n"
              "qo.pack_weight(torch.randn(16, 32), 'int4', 'cpu')\n"
              "assert 'torchao' in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Failed to load" not in run.stderr and "Enum subclass" not in run.stderr, run.stderr
