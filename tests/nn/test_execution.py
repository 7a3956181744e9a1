"""The execution table: which path a call takes for which layer, mode and device, and that
``forward``, ``execution()`` and ``sixbit.kernels.available()`` all follow that one decision."""

import pytest
import torch

from sixbit import kernels
from sixbit.formats import integer
from sixbit.kernels import cuda
from sixbit.kernels.paths import Capabilities, Operands, Path, select
from sixbit.methods.static_w8a8 import StaticActQuantizer, StaticW8A8State
from sixbit.nn import QuantLinear, execution
from sixbit.nn.precision import ActMode
from sixbit.runtime.context import StepInfo

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _caps(fused=False, weight4=False, fp4=False):
    return Capabilities(lambda d: fused, lambda d: weight4, lambda d: fp4)


@pytest.mark.parametrize("mode,device,ops,caps,path", [
    ("fp", CPU, Operands(), _caps(), Path.FP),
    ("fp", CPU, Operands(unpacked=True), _caps(), Path.FP_UNPACKED),
    ("fp", CUDA, Operands(weight4=True, dense=True), _caps(weight4=True), Path.FP_DENSE),  # a kept dense copy first
    ("fp", CUDA, Operands(weight4=True, unpacked=True), _caps(weight4=True), Path.W4A16),
    ("fp", CUDA, Operands(weight4=False), _caps(weight4=True), Path.FP),  # a weight the kernel cannot read
    ("int8", CPU, Operands(), _caps(), Path.INT8),
    ("int8", CUDA, Operands(), _caps(fused=True), Path.INT8_FUSED),
    ("int8", CUDA, Operands(plain_input=False), _caps(fused=True), Path.INT8),  # divisor or branch first
    ("int8", CPU, Operands(packed=True), _caps(), Path.INT8_PACKED),
    ("int8", CPU, Operands(packed=True, folded=True), _caps(), Path.INT8_FOLDED),
    ("int8", CUDA, Operands(packed=True, folded=True), _caps(), Path.INT8),  # packed operands serve CPUs only
    ("int8", CUDA, Operands(static_input=True), _caps(fused=True), Path.INT8_STATIC),
    ("int8", CPU, Operands(static_input=True, packed=True), _caps(), Path.INT8_STATIC),
    ("nvfp4", CPU, Operands(), _caps(), Path.NVFP4_EMULATED),
    ("nvfp4", CUDA, Operands(), _caps(fp4=True), Path.NVFP4),
])
def test_select_chooses_the_path_of_each_mode_device_and_layer(mode, device, ops, caps, path):
    assert select(mode, device, ops, caps) is path
    assert select(ActMode(mode), device, ops, caps) is path


def test_select_names_an_unknown_mode():
    with pytest.raises(ValueError, match="unknown activation mode 'fp8'"):
        select("fp8", CPU, Operands(), _caps())


def _static_layer():
    state = StaticW8A8State([500.0], [(0, 0)], per_branch=False, config={})
    w = integer.quantize(torch.randn(48, 64), bits=8)
    q = StaticActQuantizer(state, torch.ones(1, 64), [w], torch.full((1, 3), 1.0), torch.full((1, 3), 5.0),
                           [127], [0])
    state.select(StepInfo(0, 500.0, "cond", 0, 0))
    layer = QuantLinear(w, "int8", act_mode="int8")
    q.attach(layer)
    return layer


def _layers():
    torch.manual_seed(0)
    plain = QuantLinear.from_linear(torch.nn.Linear(64, 48), "int8", act_mode="int8")
    rotated = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4", hadamard_block=32, act_mode="int8")
    branch = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4", act_mode="int8")
    branch.lowrank_up, branch.lowrank_down = torch.randn(48, 4) * 0.1, torch.randn(4, 64) * 0.1
    divided = QuantLinear.from_linear(torch.nn.Linear(64, 48), "int8", act_mode="int8",
                                      input_divisor=torch.rand(64) + 0.5)
    modulation = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4")
    modulation.weight_only = True
    unpacked = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4")
    unpacked.unpack_nvfp4()
    dense = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4", hadamard_block=32, act_mode="int8")
    dense.keep_dense(torch.float32)
    return {"plain": plain, "rotated": rotated, "branch": branch, "divided": divided, "modulation": modulation,
            "unpacked": unpacked, "dense": dense, "static": _static_layer()}


@pytest.mark.parametrize("switches", [(False, False, False), (True, True, True)])
def test_forward_and_execution_follow_the_plan(switches, monkeypatch):
    """Every layer kind × mode, with the CUDA switches off and (emulated here) on: the path
    ``forward`` runs is ``plan``'s, and ``execution()`` describes that path."""
    fused, weight4, fp4 = switches
    monkeypatch.setattr(kernels, "fused_int8", lambda device: fused)
    monkeypatch.setattr(kernels, "weight4_fused", lambda device: weight4)
    monkeypatch.setattr(kernels, "fp4_supported", lambda device: fp4)
    monkeypatch.setattr(kernels, "weight4_linear", kernels.weight4_linear_reference)
    monkeypatch.setattr(kernels, "nvfp4_linear", lambda x, w, dtype, scale=None: kernels.nvfp4_linear_reference(x, w, dtype))
    ran = []
    run = execution.run
    monkeypatch.setattr(execution, "run", lambda layer, path, *a: ran.append(path) or run(layer, path, *a))
    words = {Path.INT8_FUSED: "Triton fused", Path.INT8_STATIC: "static W8A8", Path.W4A16: "Triton dequantize",
             Path.NVFP4: "real, torch._scaled_mm FP4", Path.NVFP4_EMULATED: "emulated",
             Path.INT8: "int8 (real" if kernels.int8_matmul_backend(CPU, 4, 64, 64) == "torch._int_mm" else "int8 (emulated",
             Path.FP_DENSE: "a kept dense copy"}
    x = torch.randn(2, 3, 64)
    seen = set()
    for name, layer in _layers().items():
        for mode in ActMode:
            planned = execution.plan(layer, mode, CPU)
            layer(x, mode)
            assert ran.pop() is planned, (name, mode)
            if not layer.weight_only:
                assert layer.execution(mode) == execution.describe(layer, planned, CPU)
                assert words.get(planned, "") in layer.execution(mode), (name, mode, planned)
            seen.add(planned)
    if fused:
        assert seen == {Path.INT8_FUSED, Path.INT8, Path.INT8_STATIC, Path.W4A16, Path.FP, Path.FP_DENSE, Path.NVFP4}
    else:
        assert seen == {Path.INT8, Path.INT8_STATIC, Path.FP, Path.FP_UNPACKED, Path.FP_DENSE, Path.NVFP4_EMULATED}


def test_weight_only_layers_report_their_fp_path_whatever_the_mode(monkeypatch):
    layer = _layers()["modulation"]
    assert layer.execution("int8") == layer.execution("nvfp4") == "fp (weight-only layer: dequantize + matmul)"
    monkeypatch.setattr(kernels, "weight4_fused", lambda device: True)
    assert layer.execution() == "fp (weight-only layer: Triton dequantize-in-the-GEMM)"


def test_kept_packed_operands_take_the_cpu_paths(monkeypatch):
    """``pack_int8`` (here with the AMX kernel replaced by its reference twin): INT8 calls on CPU
    take the packed path, folded where the rotation was folded in; other modes keep theirs."""
    monkeypatch.setattr(kernels, "pack_int8_weight", lambda codes: codes.contiguous())
    monkeypatch.setattr(kernels, "packed_int8_matmul", kernels.packed_int8_matmul_reference)
    layers = _layers()
    layers["plain"].pack_int8()
    layers["rotated"].pack_int8(fold=True)
    layers["divided"].pack_int8(fold=True)  # a divided input is packed as stored
    assert execution.plan(layers["plain"], ActMode.INT8, CPU) is Path.INT8_PACKED
    assert execution.plan(layers["rotated"], ActMode.INT8, CPU) is Path.INT8_FOLDED
    assert execution.plan(layers["divided"], ActMode.INT8, CPU) is Path.INT8_PACKED
    assert execution.plan(layers["rotated"], ActMode.FP, CPU) is Path.FP
    assert "folded in" in layers["rotated"].execution() and "AMX" in layers["plain"].execution()
    x = torch.randn(4, 64)
    before = layers["plain"](x)
    layers["plain"].drop_converted()
    assert execution.plan(layers["plain"], ActMode.INT8, CPU) is Path.INT8
    torch.testing.assert_close(layers["plain"](x), before, rtol=1e-6, atol=1e-6)  # scale multiplies reordered


def test_input_quantizer_slot_routes_int8_calls_to_the_static_path():
    layer = _static_layer()
    assert execution.is_static(layer) and isinstance(execution.input_quantizer(layer), StaticActQuantizer)
    assert execution.plan(layer, ActMode.INT8, CPU) is Path.INT8_STATIC
    assert execution.plan(layer, ActMode.FP, CPU) is Path.FP  # other precisions ignore it
    assert not layer.reads_token_codes()
    with pytest.raises(ValueError, match="static activation scales"):
        layer.narrow_rows(0, 16)
    execution.set_input_quantizer(layer, None)
    assert not execution.is_static(layer) and execution.plan(layer, ActMode.INT8, CPU) is Path.INT8


@pytest.mark.parametrize("on", [False, True])
def test_available_answers_with_the_plan_of_a_plain_layer(on, monkeypatch):
    caps = _caps(on, on, on)
    monkeypatch.setattr(cuda, "CAPABILITIES", caps)
    for name in ("fused_int8", "weight4_fused", "fp4_supported"):
        monkeypatch.setattr(kernels, name, getattr(caps, name))
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 48), "nvfp4")
    paths = kernels.available("cpu")
    assert ("Triton fused" in paths["int8"]) == (execution.plan(layer, ActMode.INT8, CPU) is Path.INT8_FUSED) == on
    assert paths["nvfp4"].startswith("real") == (execution.plan(layer, ActMode.NVFP4, CPU) is Path.NVFP4) == on
    assert paths["w4a16"].startswith("real") == (execution.plan(layer, ActMode.FP, CPU) is Path.W4A16) == on


@pytest.mark.parametrize("kind", ["rotated", "branch", "divided", "rotated with a branch"])
def test_a_kept_dense_copy_computes_what_the_full_precision_path_does(kind):
    """``keep_dense`` folds the rotation, the input divisor and the low-rank branch into one
    weight: a full-precision call is then one GEMM, with the same output to fp32 rounding; its
    bytes are counted, and dropping it (or moving the layer) brings the dequantizing path back."""
    torch.manual_seed(0)
    layer = _layers()["branch" if kind == "branch" else "divided" if kind == "divided" else "rotated"]
    if kind == "rotated with a branch":
        layer.lowrank_up, layer.lowrank_down = torch.randn(48, 4) * 0.1, torch.randn(4, 64) * 0.1
    x = torch.randn(2, 5, 64)
    want = layer(x, "fp")
    before = layer.converted_nbytes()
    layer.keep_dense(torch.float32)
    assert execution.plan(layer, ActMode.FP, CPU) is Path.FP_DENSE
    assert execution.plan(layer, ActMode.INT8, CPU) is not Path.FP_DENSE  # only full-precision calls use it
    assert layer.converted_nbytes() == before + 48 * 64 * 4
    got = layer(x, "fp")
    assert got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert layer(x.bfloat16(), "fp").dtype == torch.bfloat16  # a copy of another dtype follows the input's
    layer.keep_dense(None)
    assert execution.plan(layer, ActMode.FP, CPU) is Path.FP and layer.converted_nbytes() == before
    layer.keep_dense(torch.bfloat16)
    layer.to("cpu")
    assert execution.plan(layer, ActMode.FP, CPU) is Path.FP  # a move drops kept copies
