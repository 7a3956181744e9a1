"""The diffusers quantization backend: quantize while loading, converted models as diffusers
folders, reloaded by a plain ``from_pretrained`` (issue 44)."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import sixbit
from fixtures.tiny_models import TINY_BUILDERS, build_tiny, sample
from sixbit.integrations.diffusers import SixbitConfig
from sixbit.presets import calibration_free
from sixbit.nn import QuantLinear
from sixbit.zoo.shapes import load_pipeline, pipeline_class

BF16 = torch.bfloat16


def _fp_folder(tm, tmp_path, dtype=BF16):
    """The tiny model saved in ``dtype`` as a full-precision diffusers folder."""
    folder = tmp_path / "fp"
    tm.model.to(dtype).save_pretrained(folder)
    return folder


def _run(tm, model, dtype=BF16):
    """One denoising call of ``model`` on ``tm``'s inputs (in ``dtype``)."""
    kwargs = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in tm.inputs(1).items()}
    with torch.no_grad():
        return tm.output(model(**kwargs))


def _packed(model):
    return {n: m.weight_format for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("preset", ["w8a8", "w4a8-rtn", "tdc"])
def test_quantizing_while_loading_equals_convert_model(preset, tmp_path):
    tm = build_tiny("wan")
    folder = _fp_folder(tm, tmp_path)
    cls = type(tm.model)
    reference = cls.from_pretrained(folder, torch_dtype=BF16)
    with torch.no_grad():  # out of the file's mapping, as loading while quantizing keeps them: CPU kernels
        for param in reference.parameters():  # round differently on inputs at unaligned addresses
            param.data = param.data.clone()
    sixbit.convert_model(reference, quant_config=preset)
    loaded = cls.from_pretrained(folder, quantization_config=SixbitConfig(preset), torch_dtype=BF16)
    assert _packed(loaded) == _packed(reference)
    assert sixbit.conversion_of(loaded).config == sixbit.conversion_of(reference).config
    assert torch.equal(_run(tm, loaded), _run(tm, reference))
    for (name, a), b in zip(loaded.state_dict().items(), reference.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_presets_that_need_calibration_are_refused_with_the_way_to_convert_them(tmp_path):
    tm = build_tiny("wan")
    folder = _fp_folder(tm, tmp_path)
    with pytest.raises(ValueError, match=r"convert_model.*sixbit convert.*calibration-free config: \[.*'w8a8'"):
        type(tm.model).from_pretrained(folder, quantization_config=SixbitConfig("w4a16"))
    assert "w4a8-rtn" in calibration_free() and "balanced" not in calibration_free()
    rtn = type(tm.model).from_pretrained(folder, quantization_config=SixbitConfig("w4a16", gptq=False))
    assert set(_packed(rtn).values()) == {"nvfp4"}


def test_sixbit_config_overrides_and_round_trip():
    config = SixbitConfig("w8a8", activations="fp", hadamard_block=64)
    assert config.convert_config.activations == "fp" and config.convert_config.weights.hadamard_block == 64
    assert SixbitConfig.from_dict(json.loads(config.to_json_string())) == config
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['bitz'\]"):
        SixbitConfig("w8a8", bitz=4)
    with pytest.raises(ValueError, match="keeps the weights in full precision"):
        SixbitConfig("tdc", gptq=False)
    with pytest.raises(ValueError, match=r"\['gptq'\] set how weights are quantized.*weights=None"):
        SixbitConfig("w8a8", weights=None, gptq=False)  # issue 61: a raw TypeError from dataclasses.replace


@pytest.mark.parametrize("name", sorted([*TINY_BUILDERS, "sana-video"]))  # sana-video: pointwise-conv feed-forward
def test_every_architecture_quantizes_on_load_saves_and_reloads(name, tmp_path):
    tm = build_tiny(name)
    folder = _fp_folder(tm, tmp_path)
    cls = type(tm.model)
    loaded = cls.from_pretrained(folder, quantization_config=SixbitConfig("w8a8"), torch_dtype=BF16)
    assert _packed(loaded)
    expected = _run(tm, loaded)
    loaded.save_pretrained(tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "sixbit" and config["checkpoint"]["model_class"] == cls.__name__
    reloaded = cls.from_pretrained(tmp_path / "q", torch_dtype=BF16)
    assert _packed(reloaded) == _packed(loaded)
    assert torch.equal(_run(tm, reloaded), expected)


def test_a_convert_model_conversion_with_runtime_state_round_trips_through_a_sharded_folder(tmp_path):
    """Static W8A8 keeps per-time-range state outside the state_dict ("static_w8a8::…" tensors)."""
    tm = build_tiny("cogvideox")
    sixbit.convert_model(tm.model, lambda: sample(tm, 4), "w8a8-static")
    expected = sample(tm, 4)
    tm.model.save_pretrained(tmp_path / "q", max_shard_size="20KB")
    files = sorted(p.name for p in (tmp_path / "q").iterdir())
    assert "diffusion_pytorch_model.safetensors.index.json" in files and len(files) > 4
    reloaded = type(tm.model).from_pretrained(tmp_path / "q")
    assert sixbit.static_w8a8_info(reloaded) is not None
    assert sixbit.conversion_of(reloaded).config == sixbit.conversion_of(tm.model).config
    tm.model = reloaded
    assert torch.equal(sample(tm, 4), expected)
    reloaded.save_pretrained(tmp_path / "again", max_shard_size="20KB")  # a reloaded model saves again, the same
    again = json.loads((tmp_path / "again" / "config.json").read_text())["quantization_config"]
    assert again == json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]


def test_the_folder_header_is_the_single_file_checkpoint_header(tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, quant_config="w4a8-rtn")
    tm.model.save_pretrained(tmp_path / "q")
    stored = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["checkpoint"]
    assert stored == sixbit.read_header(sixbit.save(tm.model, tmp_path / "q.safetensors"))


def test_a_damaged_or_mixed_folder_is_refused(tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, quant_config="w8a8")
    cls = type(tm.model)
    tm.model.save_pretrained(tmp_path / "q", max_shard_size="20KB")
    shards = sorted((tmp_path / "q").glob("*-of-*.safetensors"))
    raw = bytearray(shards[-1].read_bytes())
    raw[-3] ^= 0x10  # one bit of the last tensor
    shards[-1].write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupted or was edited"):
        cls.from_pretrained(tmp_path / "q")
    tm.model.save_pretrained(tmp_path / "q", max_shard_size="20KB")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"]["checkpoint"]["layers"].popitem()
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="corrupted or was edited"):
        cls.from_pretrained(tmp_path / "q")


def test_torch_dtype_casts_the_full_precision_parameters_and_keeps_the_packed_ones(tmp_path):
    tm = build_tiny("cogvideox")
    sixbit.convert_model(tm.model.to(BF16), quant_config="w8a8")
    tm.model.save_pretrained(tmp_path / "q")
    reloaded = type(tm.model).from_pretrained(tmp_path / "q", torch_dtype=torch.float32)
    packed = {n for n, m in reloaded.named_modules() if isinstance(m, QuantLinear)}
    outside = {p.dtype for n, p in reloaded.named_parameters() if n.rpartition(".")[0] not in packed}
    assert outside == {torch.float32}
    stored = tm.model.state_dict()
    assert all(torch.equal(t, stored[n]) and t.dtype == stored[n].dtype
               for n, t in reloaded.state_dict().items() if n.rpartition(".")[0] in packed)
    assert torch.isfinite(_run(tm, reloaded, torch.float32)).all()


@pytest.mark.parametrize("imports", ["import torch, sixbit\nfrom diffusers import WanTransformer3DModel",
                                     "import torch\nfrom diffusers import WanTransformer3DModel\nimport sixbit"])
def test_a_fresh_process_reloads_with_plain_from_pretrained(imports, tmp_path):
    """sixbit imported before or after diffusers' model classes: the backend is known either way."""
    tm = build_tiny("wan")
    model = type(tm.model).from_pretrained(_fp_folder(tm, tmp_path), torch_dtype=BF16)
    sixbit.convert_model(model, quant_config="w8a8")
    model.save_pretrained(tmp_path / "q")
    torch.save(_run(tm, model), tmp_path / "expected.pt")
    torch.save(tm.inputs(1), tmp_path / "inputs.pt")
    script = imports + textwrap.dedent(f"""
        model = WanTransformer3DModel.from_pretrained({str(tmp_path / 'q')!r}, torch_dtype=torch.bfloat16)
        kwargs = torch.load({str(tmp_path / 'inputs.pt')!r})
        kwargs = {{k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kwargs.items()}}
        with torch.no_grad():
            out = model(**kwargs)[0]
        assert torch.equal(out, torch.load({str(tmp_path / 'expected.pt')!r})), "outputs differ"
        print("ok", type(model.hf_quantizer).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok SixbitQuantizer" in done.stdout


def test_a_converted_pipeline_saves_and_reloads_bit_identically(tmp_path):
    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, quant_config="w8a8")

    def generate(p):
        return p("a red circle moving left", num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                 output_type="pt").frames

    video = generate(pipe)
    pipe.save_pretrained(tmp_path / "pipe")
    reloaded = pipeline_class("wan").from_pretrained(tmp_path / "pipe")
    assert _packed(reloaded.transformer) == _packed(pipe.transformer)
    assert torch.equal(generate(reloaded), video)


def test_pipeline_quantization_config_quantizes_the_transformer_while_loading(tmp_path):
    from diffusers import PipelineQuantizationConfig  # diffusers 0.35 cannot import it beside transformers 5

    pipe = load_pipeline("wan")
    pipe.save_pretrained(tmp_path / "fp")
    quant = PipelineQuantizationConfig(quant_backend="sixbit", quant_kwargs={"preset_or_config": "w8a8"},
                                       components_to_quantize=["transformer"])
    loaded = pipeline_class("wan").from_pretrained(tmp_path / "fp", quantization_config=quant)
    reference = load_pipeline("wan")
    sixbit.convert_model(reference, quant_config="w8a8")
    assert _packed(loaded.transformer) == _packed(reference.transformer)
    state = reference.transformer.state_dict()
    assert all(torch.equal(t, state[n]) for n, t in loaded.transformer.state_dict().items())


def test_a_dtype_cast_of_a_loaded_quantized_model_keeps_the_packed_layers(tmp_path):
    tm = build_tiny("wan")
    folder = _fp_folder(tm, tmp_path)
    loaded = type(tm.model).from_pretrained(folder, quantization_config=SixbitConfig("w8a8"))
    packed = {n: b.dtype for n, b in loaded.named_buffers() if n.rpartition(".")[0] in _packed(loaded)}
    assert loaded.to(torch.float16) is loaded and loaded.to("cpu") is loaded
    assert {n: b.dtype for n, b in loaded.named_buffers() if n in packed} == packed
    assert loaded.proj_out.weight.dtype == torch.float16  # full precision (proj_out is not quantized)


def test_save_pretrained_refuses_what_it_cannot_write(tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, quant_config="w8a8")
    with pytest.raises(ValueError, match="upload_folder"):
        tm.model.save_pretrained(tmp_path / "q", push_to_hub=True)
    with pytest.raises(ValueError, match="safetensors only"):
        tm.model.save_pretrained(tmp_path / "q", safe_serialization=False)
    with pytest.raises(ValueError, match="max_shard_size='big' is not a size"):
        tm.model.save_pretrained(tmp_path / "q", max_shard_size="big")
    assert not (tmp_path / "q").exists()


def test_a_converted_folder_config_cannot_be_passed_to_quantize_again(tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, quant_config="w8a8")
    tm.model.save_pretrained(tmp_path / "q")
    stored = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    folder = _fp_folder(build_tiny("wan"), tmp_path)
    with pytest.raises(ValueError, match="without quantization_config"):
        type(tm.model).from_pretrained(folder, quantization_config=SixbitConfig.from_dict(stored))
    assert dataclasses.is_dataclass(SixbitConfig("w8a8").convert_config)


def test_a_method_that_cannot_run_on_the_model_is_refused_before_any_weight_loads(tmp_path, monkeypatch):
    tm = build_tiny("wan")  # 2 blocks
    folder = _fp_folder(tm, tmp_path)
    from sixbit.integrations.diffusers.quantizer import SixbitQuantizer

    arrived = []
    monkeypatch.setattr(SixbitQuantizer, "create_quantized_param", lambda self, *a, **k: arrived.append(a))
    config = SixbitConfig("w8a8", attention=sixbit.AttentionQuantConfig(blocks=(5, None)))
    with pytest.raises(ValueError, match="block"):
        type(tm.model).from_pretrained(folder, quantization_config=config)
    assert arrived == []
