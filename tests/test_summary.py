"""``sixbit.summary`` counts every byte a converted model holds."""

import torch

import sixbit
from sixbit.formats import Quantized
from sixbit.nn import QuantLinear
from fixtures.toy import ToyTransformer

TIMESTEPS = [900, 700, 500, 300]


def _held_bytes(model):
    """Walk every tensor the modules reference (parameters, buffers, tensor attributes, kept
    converted weights) and add up their storages, each once."""
    tensors = []
    for module in model.modules():
        tensors += [t for t in module._parameters.values() if t is not None]
        tensors += [t for t in module._buffers.values() if t is not None]
        tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        for q in getattr(module, "_converted", {}).values():
            assert isinstance(q, Quantized)
            tensors += list(q.tensors().values())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _run(model):
    with torch.no_grad():
        for t in TIMESTEPS:
            model(torch.randn(1, 6, 32), timestep=torch.tensor([t]))


def test_summary_counts_static_variants_and_converted_copies():
    torch.manual_seed(0)
    model = ToyTransformer(depth=2)
    data = sixbit.calibrate(model, lambda: _run(model))
    config = sixbit.StaticW8A8Config(time_ranges=2, tsq_min_gain=0.0, sigma=0.0)
    sixbit.apply_static_w8a8(model, config, data)
    assert sixbit.static_w8a8_info(model).extra_weight_bytes > 0  # TSQ keeps a second weight variant
    model.proj_out = QuantLinear.from_linear(model.proj_out, "nvfp4", act_mode="int8", cache_converted=True)
    _run(model)
    s = sixbit.summary(model)
    assert s.converted_bytes == model.proj_out.converted_nbytes() > 0
    assert s.total_bytes == _held_bytes(model)
    assert s.tensor_bytes > s.bytes_after  # biases, static scales and extra variants beyond the packed weights
    assert "all tensors the model holds" in str(s)


def test_static_layers_hold_variant_zero_once():
    torch.manual_seed(0)
    model = ToyTransformer(depth=2)
    data = sixbit.calibrate(model, lambda: _run(model))
    sixbit.apply_static_w8a8(model, sixbit.StaticW8A8Config(time_ranges=1), data)
    layer = model.blocks[0].proj
    q = layer.act_quantizer
    assert q.extra_codes.shape[0] == 0  # one range, one variant: the layer's own packed weight only
    codes, scale = q.variant(0, layer)
    assert codes.untyped_storage().data_ptr() == layer.weight_codes.untyped_storage().data_ptr()


def test_keep_int8_weights_builds_counted_copies_and_changes_no_result():
    from sixbit.kernels import amx_int8

    torch.manual_seed(0)
    model = sixbit.quantize(ToyTransformer(depth=2), sixbit.QuantConfig(weight_format="nvfp4", act_mode="int8"))
    x = torch.randn(1, 6, 32)
    before = model(x, timestep=torch.tensor([500]))
    layers = [m for m in model.modules() if isinstance(m, QuantLinear) and not m.weight_only]
    extra = sixbit.keep_int8_weights(model)
    assert extra == sum(m.out_features * (m.in_features + 4) for m in layers) > 0  # int8 codes + an fp32 scale per row
    assert all((m._packed is not None) == amx_int8() for m in layers)
    assert sixbit.summary(model).converted_bytes == extra
    after = model(x, timestep=torch.tensor([500]))
    if amx_int8():  # the two fp32 scale multiplies in the other order
        torch.testing.assert_close(after, before, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(after, before)
    assert sixbit.keep_int8_weights(model, enabled=False) == 0 and sixbit.summary(model).converted_bytes == 0
    assert torch.equal(model(x, timestep=torch.tensor([500])), before)


def test_packed_int8_layers_are_dropped_when_moved_or_cut():
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 32), "int8", act_mode="int8")
    from sixbit.kernels import amx_int8

    assert sixbit.keep_int8_weights(torch.nn.Sequential(layer)) == (32 * (64 + 4) if amx_int8() else 0)
    layer.to(torch.float32)
    assert layer.converted_nbytes() == 0


def test_keep_int8_weights_takes_a_pipeline():
    """Issue 48: keep_int8_weights(pipe) raised AttributeError; every other entry point takes pipelines."""
    from sixbit.zoo.shapes import load_pipeline

    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, "w4a8-rtn")
    extra = sixbit.keep_int8_weights(pipe)
    assert extra > 0 and sixbit.summary(pipe.transformer).converted_bytes == extra


def test_summary_of_a_pipeline_is_its_transformers():
    """Issue 61: ``sixbit.summary(pipe)`` raised a raw AttributeError; it summarises the
    transformer every other entry point takes from a pipeline."""
    from fixtures.tiny_pipelines import tiny_wan_pipeline

    pipe = tiny_wan_pipeline()
    sixbit.convert_model(pipe, None, "w8a8")
    s = sixbit.summary(pipe)
    assert s.layers == sixbit.summary(pipe.transformer).layers
    assert s.model == f"{type(pipe).__name__}.transformer ({type(pipe.transformer).__name__})"
    assert str(s).startswith(f"sixbit summary of {s.model}")


def test_summary_of_something_else_says_what_it_takes():
    import pytest

    with pytest.raises(ValueError, match="pass the pipeline or pipe.transformer"):
        sixbit.summary("a string")
