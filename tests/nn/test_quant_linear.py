import pytest
import torch
import torch.nn.functional as F

import sixbit
from sixbit import formats
from sixbit.formats import nvfp4
from sixbit.nn import ActMode, QuantLinear
from sixbit.transforms import hadamard

WEIGHT_FORMATS = ["nvfp4", "int8", "int4-g64", "mxfp6_e2m3", "fp8_e4m3"]


def _setup(fmt, block):
    lin = torch.nn.Linear(128, 48)
    x = torch.randn(3, 7, 128) * torch.exp(torch.randn(128))  # channel outliers
    layer = QuantLinear.from_linear(lin, weight_format=fmt, hadamard_block=block)
    w = lin.weight.detach()
    xr = x if block is None else hadamard.rotate(x, block)
    wr = w if block is None else hadamard.rotate(w, block)
    return lin, layer, x, xr.reshape(-1, 128), formats.get(fmt).quantize(wr).dequantize()


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("block", [None, 32])
def test_fp_mode_equals_weight_only_reference(fmt, block):
    lin, layer, x, xr, w_deq = _setup(fmt, block)
    layer.act_mode = "fp"
    ref = F.linear(xr, w_deq, lin.bias).reshape(3, 7, 48)
    torch.testing.assert_close(layer(x), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("block", [None, 32])
def test_int8_mode_equals_integer_reference(fmt, block):
    lin, layer, x, xr, w_deq = _setup(fmt, block)
    layer.act_mode = "int8"
    # independent reference: per-token / per-channel symmetric INT8, exact float64 accumulation
    sx = xr.abs().amax(-1, keepdim=True) / 127
    xq = torch.clamp(torch.round(xr / sx), -127, 127)
    sw = w_deq.abs().amax(-1, keepdim=True) / 127
    wq = torch.clamp(torch.round(w_deq / sw), -127, 127)
    acc = xq.double() @ wq.double().T
    assert acc.abs().max() < 2**31 and torch.equal(acc, acc.round())
    ref = (acc * sx.double() * sw.double().T + lin.bias.double()).float().reshape(3, 7, 48)
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("block", [None, 32])
def test_nvfp4_mode_equals_emulated_reference(fmt, block):
    lin, layer, x, xr, w_deq = _setup(fmt, block)
    layer.act_mode = "nvfp4"
    w4 = nvfp4.quantize(w_deq).dequantize() if fmt != "nvfp4" else w_deq
    ref = nvfp4.quantize(xr).dequantize().double() @ w4.double().T + lin.bias.double()
    torch.testing.assert_close(layer(x), ref.float().reshape(3, 7, 48), rtol=1e-5, atol=1e-6 * ref.abs().max().item())
    assert layer.emulated and "emulated" in repr(layer)


def test_accuracy_vs_full_precision():
    lin = torch.nn.Linear(256, 64)
    x = torch.randn(32, 256)
    ref = lin(x)

    def rel(layer, mode):
        layer.act_mode = mode
        return ((layer(x) - ref).pow(2).mean() / ref.pow(2).mean()).item()

    w8 = QuantLinear.from_linear(lin, "int8")
    w4 = QuantLinear.from_linear(lin, "nvfp4", hadamard_block=64)
    assert rel(w8, "fp") < 1e-4 and rel(w8, "int8") < 3e-4
    assert rel(w4, "fp") < 2e-2 and rel(w4, "int8") < 2e-2 and rel(w4, "nvfp4") < 4e-2
    assert rel(w4, "fp") < rel(w4, "nvfp4")


def test_packed_storage_no_fp_copy():
    layer = QuantLinear.from_linear(torch.nn.Linear(4096, 4096, bias=False), "nvfp4", hadamard_block=128)
    state = layer.state_dict()
    bits = 8 * sum(t.numel() * t.element_size() for t in state.values()) / 4096**2
    assert bits <= 4.6
    assert not any(t.numel() >= 4096 * 4096 for t in state.values())  # no unpacked weight
    assert layer.weight_nbytes() == 4096 * 4096 // 2 + 4096 * 4096 // 16 + 4


def test_mode_switch_dtype_bias_and_shapes():
    lin = torch.nn.Linear(64, 16)
    layer = QuantLinear.from_linear(lin, "nvfp4")
    x = torch.randn(2, 3, 4, 64)
    outs = {}
    for mode in ActMode:
        layer.act_mode = mode.value
        outs[mode] = layer(x)
        assert outs[mode].shape == (2, 3, 4, 16)
        assert layer(x.bfloat16()).dtype == torch.bfloat16
    assert not torch.equal(outs[ActMode.FP], outs[ActMode.NVFP4])
    assert torch.allclose(layer.bias, lin.bias)
    nobias = QuantLinear.from_linear(torch.nn.Linear(64, 16, bias=False), "int8")
    assert nobias.bias is None and torch.equal(nobias(torch.zeros(1, 64)), torch.zeros(1, 16))


def test_cache_converted_gives_same_result():
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(5, 64)
    plain = QuantLinear.from_linear(lin, "nvfp4", act_mode="int8")
    cached = QuantLinear.from_linear(lin, "nvfp4", act_mode="int8", cache_converted=True)
    assert torch.equal(plain(x), cached(x)) and torch.equal(cached(x), plain(x))
    assert "int8" in cached._converted and not plain._converted


def test_errors():
    lin = torch.nn.Linear(96, 8)
    with pytest.raises(ValueError, match="hadamard_block=32"):
        QuantLinear.from_linear(lin, "int8", hadamard_block=64)
    with pytest.raises(ValueError, match="unknown format"):
        QuantLinear.from_linear(lin, "int9")
    with pytest.raises(ValueError, match="multiple of 16"):
        QuantLinear.from_linear(torch.nn.Linear(40, 8), "nvfp4")
    layer = QuantLinear.from_linear(lin, "int8")
    with pytest.raises(ValueError, match="valid: \\['fp', 'int8', 'nvfp4'\\]"):
        layer.act_mode = "int4"
    with pytest.raises(ValueError, match="last dimension 96"):
        layer(torch.randn(2, 95))
    layer.act_mode = "int8"
    nan = torch.full((2, 96), float("nan"))
    assert torch.isnan(layer(nan)).all()  # no host sync per call: NaN propagates; the check is a debug option
    assert torch.isnan(QuantLinear.from_linear(lin, "nvfp4", act_mode="nvfp4")(nan)).all()
    sixbit.debug_checks(True)
    try:
        with pytest.raises(ValueError, match="NaN/Inf"):
            layer(nan)
    finally:
        sixbit.debug_checks(False)
    with pytest.raises(ValueError, match="nn.Linear"):
        QuantLinear.from_linear(torch.nn.Conv1d(3, 3, 1))


@pytest.mark.parametrize("fmt", ["int4", "int6"])
def test_low_bit_channel_weights_feed_the_int8_gemm_without_rerounding(fmt):
    lin = torch.nn.Linear(64, 16)
    x = torch.randn(5, 64)
    layer = QuantLinear.from_linear(lin, fmt, act_mode="int8")
    wq = formats.get(fmt).quantize(lin.weight.detach())
    sx = x.abs().amax(-1, keepdim=True) / 127
    xq = torch.clamp(torch.round(x / sx), -127, 127)
    ref = (xq.double() @ wq.values().double().T) * sx.double() * wq.scale.double().T + lin.bias.double()
    torch.testing.assert_close(layer(x), ref.float(), rtol=1e-5, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("fmt", ["nvfp4", "int4-g64", "mxfp6_e2m3", "mxfp4"])
def test_int8_operand_built_in_row_chunks_equals_whole_conversion(fmt, monkeypatch):
    from sixbit.nn import weight_views

    lin = torch.nn.Linear(128, 40)
    layer = QuantLinear.from_linear(lin, fmt, act_mode="int8")
    whole = formats.get("int8").quantize(layer.quantized_weight().dequantize())
    monkeypatch.setattr(weight_views, "CONVERT_BYTES", 7 * 4 * 128)  # 7 rows per chunk: uneven last chunk
    codes, scale = layer.int8_weight()
    assert torch.equal(codes, whole.values()) and torch.equal(scale, whole.scale.reshape(-1))
    assert layer.converted_nbytes() == 0


def test_cache_converted_keeps_a_counted_int8_copy():
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 32), "nvfp4", act_mode="int8", cache_converted=True)
    x = torch.randn(3, 64)
    y = layer(x)
    assert layer.converted_nbytes() == 32 * 64 + 4 * 32  # int8 codes + fp32 scale per row
    assert torch.equal(layer(x), y)


@pytest.mark.parametrize("mode", ["fp", "int8", "nvfp4"])
def test_forward_traces_without_graph_breaks(mode):
    """No host synchronization in the hot path: dynamo traces each mode as one graph."""
    torch._dynamo.reset()
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 32), "nvfp4", hadamard_block=32, act_mode=mode)
    x = torch.randn(2, 5, 64)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["w8a8", "w4a8", "lora"])
def test_compiled_cpu_kernels_change_no_bit(kind, monkeypatch):
    """The INT8 path's compiled quantize and epilogue (large CPU inputs) give the eager result."""
    from sixbit.kernels import cpu

    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 48)
    if kind == "w8a8":
        layer = QuantLinear.from_linear(lin, "int8", act_mode="int8")
    else:
        layer = QuantLinear.from_linear(lin, "nvfp4", hadamard_block=32, act_mode="int8")
        layer.lowrank_up, layer.lowrank_down = torch.randn(48, 4) * 0.01, torch.randn(4, 128) * 0.01
    if kind == "lora":
        layer.add_lora("style", torch.randn(2, 128) * 0.1, torch.randn(48, 2) * 0.1)
    x = torch.randn(2, 9, 128, dtype=torch.bfloat16)
    eager, weight_only = layer(x), layer(x, "fp")
    monkeypatch.setattr(cpu, "_MIN_ELEMENTS", 0)
    monkeypatch.setattr(cpu, "_COMPILED", {})
    assert cpu.fused_cpu(x)
    assert torch.equal(layer(x), eager) and eager.dtype == torch.bfloat16
    assert torch.equal(layer(x, "fp"), weight_only)  # the weight dequantized by the compiled kernel


@pytest.mark.parametrize("mode", ["fp", "int8", "nvfp4"])
@pytest.mark.parametrize("lora", [False, True])
def test_activation_is_applied_after_the_linear_in_every_mode(mode, lora):
    """``activation`` gives ``gelu(layer(x))``: in INT8 mode from the epilogue (fp32, before the one
    rounding), elsewhere after the layer; with LoRAs after them and the bias."""
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 48), "int8", act_mode=mode)
    if lora:
        layer.add_lora("style", torch.randn(2, 64) * 0.1, torch.randn(48, 2) * 0.1)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2**-7)):
        x = torch.randn(2, 5, 64, dtype=dtype)
        for name, approximate in (("gelu", "none"), ("gelu-tanh", "tanh")):
            y = layer(x, activation=name)
            assert y.dtype == dtype and y.shape == (2, 5, 48)
            ref = F.gelu(layer(x).float(), approximate=approximate)
            torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        layer(x, activation="relu")


def test_layers_given_one_input_quantize_it_once(monkeypatch):
    """q, k, v of an attention take one tensor: its INT8 codes are computed once, and again after
    the tensor changes in place."""
    from sixbit import kernels

    torch.manual_seed(0)
    layers = [QuantLinear.from_linear(torch.nn.Linear(64, 32), "int8", act_mode="int8") for _ in range(3)]
    x = torch.randn(2, 5, 64)
    alone = [layer(x.clone()) for layer in layers]
    calls = []
    quantize = kernels.quantize_rows
    monkeypatch.setattr(kernels, "quantize_rows", lambda t: calls.append(t.shape) or quantize(t))
    assert all(torch.equal(layer(x), ref) for layer, ref in zip(layers, alone))
    assert len(calls) == 1
    x.mul_(2)  # an in-place change: the codes are stale
    assert torch.equal(layers[0](x), layers[0](x.clone())) and len(calls) == 3
    with torch.inference_mode():  # no version counter: never shared
        xi = torch.randn(2, 5, 64)
        for layer in layers:
            layer(xi)
    assert len(calls) == 6
    rotated = QuantLinear.from_linear(torch.nn.Linear(64, 32), "int8", hadamard_block=32, act_mode="int8")
    layers[0](x)  # x's codes remembered; a layer that rotates x first quantizes what it multiplies
    assert torch.equal(rotated(x), rotated(x.clone()))


def test_bf16_inputs_are_rotated_inside_the_quantization(monkeypatch):
    """A bf16 input of a rotating INT8 layer: one bf16 GEMM by the ±1 matrix, 1/√b in the token
    scales, the branch on the unrotated input with its down factor rotated — the fp32 rotation's
    result up to bf16 rounding, and q, k, v share the rotated codes."""
    from sixbit import kernels

    torch.manual_seed(0)
    assert torch.equal(hadamard.rotate_unnormalized(torch.eye(32), 32), (hadamard.hadamard_matrix(32) * 32 ** 0.5).round())
    x = torch.randn(2, 9, 128) * torch.exp(torch.randn(128))
    torch.testing.assert_close(hadamard.rotate_unnormalized(x, 32) / 32 ** 0.5, hadamard.rotate(x, 32))
    layers = []
    for _ in range(3):
        layer = QuantLinear.from_linear(torch.nn.Linear(128, 48), "nvfp4", hadamard_block=32, act_mode="int8")
        layer.lowrank_up, layer.lowrank_down = torch.randn(48, 4) * 0.1, torch.randn(4, 128) * 0.1
        layers.append(layer.to(torch.bfloat16))
    xb = x.bfloat16()
    calls = []
    quantize = kernels.quantize_rows
    monkeypatch.setattr(kernels, "quantize_rows", lambda t: calls.append(t.dtype) or quantize(t))
    late = [layer(xb) for layer in layers]
    assert calls == [torch.bfloat16]  # one quantization of the bf16 rotation for the three layers
    monkeypatch.setattr(QuantLinear, "_late_rotation", lambda *args: False)
    early = [layer(xb) for layer in layers]
    assert calls[1:] == [torch.float32] * 3
    for a, b in zip(late, early):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=0.02, atol=0.02 * b.abs().max().item())


@pytest.mark.skipif(not __import__("sixbit.kernels", fromlist=["amx_int8"]).amx_int8(), reason="no AMX INT8 on this CPU")
def test_kept_int8_adds_the_branch_to_the_gemm_output_and_scales_in_place(monkeypatch):
    """Kept INT8 on AMX, bf16: the low-rank branch goes into the packed GEMM's output (divided by
    the token scales) and the epilogue writes in place — the unkept path's result up to bf16 rounding."""
    from sixbit import kernels

    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 48), "nvfp4", hadamard_block=32, act_mode="int8")
    layer.lowrank_up, layer.lowrank_down = torch.randn(48, 4), torch.randn(4, 128) * 0.1
    layer = layer.to(torch.bfloat16)
    x = (torch.randn(2, 9, 128) * torch.exp(torch.randn(128))).bfloat16()
    plain = layer(x).float()
    without_branch = plain - F.linear(F.linear(x.float(), layer.lowrank_down.float()), layer.lowrank_up.float())
    sixbit.keep_int8_weights(torch.nn.Sequential(layer), fold=False)
    assert layer._packed is not None and not layer._folded
    flags = []
    epilogue = kernels.scale_epilogue
    monkeypatch.setattr(kernels, "scale_epilogue", lambda *a, **k: flags.append(k.get("inplace")) or epilogue(*a, **k))
    kept = layer(x).float()
    assert flags == [True]
    tol = 0.01 * plain.abs().max().item()
    torch.testing.assert_close(kept, plain, rtol=0.02, atol=tol)
    assert (kept - without_branch).abs().max() > 10 * tol  # the branch is there


def test_large_rotations_reuse_one_buffer(monkeypatch):
    from sixbit.nn import int8_inputs

    x = torch.randn(40, 256).bfloat16()
    want = int8_inputs._quantize_rows(x, 128)
    monkeypatch.setattr(int8_inputs.kernels, "fused_cpu", lambda t, numel=None: True)  # x counts as large
    monkeypatch.setattr(int8_inputs, "_SCRATCH", __import__("threading").local())
    got = int8_inputs._quantize_rows(x, 128)
    buffer = int8_inputs._SCRATCH.buf
    assert all(map(torch.equal, got, want)) and buffer.numel() == x.numel()
    assert all(map(torch.equal, int8_inputs._quantize_rows(x[:20], 128), (want[0][:20], want[1][:20])))
    assert int8_inputs._SCRATCH.buf is buffer  # a smaller input reuses it


@pytest.mark.skipif(not __import__("sixbit.kernels", fromlist=["amx_int8"]).amx_int8(), reason="no AMX INT8 on this CPU")
def test_folded_kept_int8_is_the_plain_int8_product_with_the_folded_weight():
    """``fold=True`` packs the INT8 rounding of ``(W_q + U·D)·H``: an INT8 call quantizes the input
    unrotated and multiplies once, no branch — exactly the reference product with that weight; the
    result stays within quantization noise of the unfolded layer, and other modes still use the
    stored weight and branch."""
    from sixbit import kernels

    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 48), "nvfp4", hadamard_block=32, act_mode="int8")
    layer.lowrank_up, layer.lowrank_down = torch.randn(48, 4), torch.randn(4, 128) * 0.1
    x = torch.randn(2, 9, 128) * torch.exp(torch.randn(128) * 0.5)
    plain, fp = layer(x), layer(x, mode=ActMode.FP)
    sixbit.keep_int8_weights(torch.nn.Sequential(layer))  # fold=True is the default
    assert layer._folded and "folded" in layer.execution()
    w = layer.quantized_weight().dequantize() + layer.lowrank_up @ layer.lowrank_down
    w_codes, w_scale = kernels.quantize_rows_reference(hadamard.rotate(w, 32))
    x_codes, x_scale = kernels.quantize_rows_reference(x.reshape(-1, 128))
    acc = kernels.packed_int8_matmul_reference(x_codes, w_codes, w_scale.reshape(-1))
    want = kernels.scale_epilogue_reference(acc, x_scale, None, None, layer.bias, torch.float32).reshape(2, 9, 48)
    assert torch.equal(layer(x), want)
    torch.testing.assert_close(layer(x), plain, rtol=0.05, atol=0.02 * plain.abs().max().item())
    assert torch.equal(layer(x, mode=ActMode.FP), fp)
    sixbit.keep_int8_weights(torch.nn.Sequential(layer), enabled=False)
    assert not layer._folded and torch.equal(layer(x), plain)
    divided = QuantLinear.from_linear(torch.nn.Linear(128, 48), "nvfp4", act_mode="int8", input_divisor=torch.rand(128) + 0.5)
    divided.lowrank_up, divided.lowrank_down = torch.randn(48, 4), torch.randn(4, 128) * 0.1
    sixbit.keep_int8_weights(torch.nn.Sequential(divided))
    assert divided._packed is not None and not divided._folded  # a divided input is packed as stored


def test_kept_weight_only_nvfp4_layers_dequantize_from_unpacked_values(monkeypatch):
    from sixbit import kernels

    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 96), "nvfp4")
    int8_layer = QuantLinear.from_linear(torch.nn.Linear(64, 96), "int8")
    layer.weight_only = int8_layer.weight_only = True  # as a modulation layer is built
    x = torch.randn(3, 64)
    before = layer(x)
    extra = sixbit.keep_int8_weights(torch.nn.Sequential(layer, int8_layer))
    assert extra == 96 * 64 and layer._unpacked is not None and int8_layer._unpacked is None
    calls = []
    unpacked = kernels.nvfp4_unpacked_dequantize
    monkeypatch.setattr(kernels, "nvfp4_unpacked_dequantize", lambda *a: calls.append(1) or unpacked(*a))
    assert torch.equal(layer(x), before) and calls == [1]
    assert sixbit.keep_int8_weights(torch.nn.Sequential(layer), enabled=False) == 0 and layer._unpacked is None
