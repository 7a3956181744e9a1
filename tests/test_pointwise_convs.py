"""Pointwise convs are quantized wherever linears are (issue 48): Sana-Video's feed-forward is two
1×1 convs around a depthwise one, and ``w8a8`` left them in full precision (1.28× smaller at real
size in bf16). Converted, saved and loaded like linears; depthwise and wider kernels stay as
they are. (The streamed conversion writes the same checkpoint: tests/test_pretrained.py.)"""

import dataclasses

import pytest
import torch
from torch import nn

import sixbit
from sixbit import checkpoint
from sixbit.nn import QuantPointwiseConv
from sixbit.nn.pointwise_conv import is_pointwise_conv
from fixtures.tiny_models import sample
from fixtures.tiny_other_models import sana_video


def _convs(model: nn.Module) -> dict[str, str]:
    """Every conv of ``model``: ``{name: "quantized" / "pointwise" / "other"}``."""
    kinds = {}
    for name, m in model.named_modules():
        if isinstance(m, QuantPointwiseConv):
            kinds[name] = "quantized"
        elif isinstance(m, nn.modules.conv._ConvNd):
            kinds[name] = "pointwise" if is_pointwise_conv(m) else "other"
    return kinds


def test_w8a8_quantizes_sana_videos_pointwise_convs_and_makes_it_1_8x_smaller():
    """4 blocks of width 64, fp32: enough for the blocks to outweigh the embeddings as at real size
    (before pointwise convs were quantized: 1.34× here)."""
    tm = sana_video(heads=4, layers=4)
    fp = sample(tm, 2)
    before = sixbit.summary(tm.model).tensor_bytes
    convs = _convs(tm.model)
    assert sorted(convs.values()).count("pointwise") == 8  # conv_inverted and conv_point of each block

    sixbit.convert_model(tm.model, None, "w8a8")
    after = sixbit.summary(tm.model).tensor_bytes
    assert before / after >= 1.8, before / after
    converted = _convs(tm.model)
    assert {n for n, k in converted.items() if k == "quantized"} == {n for n, k in convs.items() if k == "pointwise"}
    # depthwise 3×3, temporal (3, 1) and the patch embedding stay in full precision
    assert {n.rsplit(".", 1)[-1] for n, k in converted.items() if k == "other"} == {
        "conv_depth", "conv_temp", "patch_embedding"}
    error = float((sample(tm, 2) - fp).norm() / fp.norm())
    assert error < 0.05, error


def test_a_converted_sana_video_saves_and_loads_bit_exactly(tmp_path):
    tm = sana_video()
    sixbit.convert_model(tm.model, None, "w8a8")
    video = sample(tm, 2)
    path = sixbit.save(tm.model, tmp_path / "sana.safetensors")
    layers = checkpoint.read_header(path)["layers"]
    kinds = {name: cfg.get("kind") for name, cfg in layers.items()}
    assert {n for n, k in kinds.items() if k == "pointwise_conv2d"} == {
        n for n, k in _convs(tm.model).items() if k == "quantized"}
    assert all(k is None for n, k in kinds.items() if ".ff." not in n)  # linears' entries are as before

    fresh = sana_video(seed=1)  # other weights: everything must come from the file
    sixbit.load(path, fresh.model)
    saved, loaded = tm.model.state_dict(), fresh.model.state_dict()
    assert saved.keys() == loaded.keys()
    assert all(saved[k].dtype == loaded[k].dtype and torch.equal(saved[k], loaded[k]) for k in saved)
    assert all(type(fresh.model.get_submodule(n)) is QuantPointwiseConv for n in kinds if kinds[n])
    assert torch.equal(sample(dataclasses.replace(tm, model=fresh.model), 2), video)


def test_a_file_whose_conv_is_a_linear_in_the_model_is_refused_unchanged(tmp_path):
    tm = sana_video()
    sixbit.convert_model(tm.model, None, "w8a8")
    path = sixbit.save(tm.model, tmp_path / "sana.safetensors")
    other = sana_video(seed=1).model
    other.transformer_blocks[0].ff.conv_point = linear = nn.Linear(80, 32, bias=False)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match=r"ff\.conv_point.*pointwise_conv2d.*Linear \(linear\)"):
        sixbit.load(path, other)
    assert other.transformer_blocks[0].ff.conv_point is linear
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in state.items())


def test_quantize_takes_pointwise_convs_by_name_and_pattern():
    model = sana_video().model
    config = sixbit.QuantConfig(weight_format="int8", exclude=[r".*\.conv_point"],
                                layer_formats={"transformer_blocks.1.ff.conv_inverted": "nvfp4"})
    sixbit.quantize(model, config, progress=False)
    kinds = _convs(model)
    quantized = {n for n, k in kinds.items() if k == "quantized"}
    assert quantized == {f"transformer_blocks.{i}.ff.conv_inverted" for i in (0, 1)}
    assert model.transformer_blocks[1].ff.conv_inverted.weight_format == "nvfp4"
    assert sixbit.summary(model).by_format()["fp"]["layers"] == 6 + 2  # outside linears + the excluded convs


def test_a_failed_calibrated_conversion_puts_the_convs_back():
    tm = sana_video()
    originals = dict(tm.model.named_modules())
    calls = []

    def calibration():
        calls.append(1)
        if len(calls) == 2:  # block 0 is quantized by now
            raise RuntimeError("interrupted")
        return sample(tm, 1)

    with pytest.raises(RuntimeError, match="interrupted"):
        sixbit.convert_model(tm.model, calibration, "w4a8")
    assert all(m is originals[n] for n, m in tm.model.named_modules())
