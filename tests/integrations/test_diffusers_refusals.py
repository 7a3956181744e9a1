"""What the diffusers backend refuses, before anything changes or is written (issue 61): a
non-transformer component given to sixbit, a hand-written quantization_config with a wrong key,
a max_shard_size that is no size, a pipeline save its converted transformer cannot take."""

import json

import pytest
import torch

import sixbit
from fixtures.tiny_models import build_tiny
from sixbit.integrations.diffusers import SixbitConfig
from tests.fixtures.tiny_pipelines import tiny_wan_pipeline


@pytest.fixture(scope="module")
def fp_pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp") / "pipe"
    tiny_wan_pipeline().save_pretrained(folder)
    return folder


def _pipeline_quantization(components):
    from diffusers import PipelineQuantizationConfig

    return PipelineQuantizationConfig(quant_backend="sixbit", quant_kwargs={"preset_or_config": "w8a8"},
                                      components_to_quantize=components)


@pytest.mark.parametrize("component", ["vae", "text_encoder"])
def test_a_component_other_than_the_transformer_is_refused_with_the_fix(component, fp_pipeline_folder):
    from diffusers import DiffusionPipeline

    with pytest.raises(ValueError) as info:
        DiffusionPipeline.from_pretrained(fp_pipeline_folder, quantization_config=_pipeline_quantization([component]))
    message = str(info.value)
    assert "sixbit quantizes diffusers transformers only" in message, message
    assert "components_to_quantize=['transformer']" in message, message


def test_a_vae_converted_in_memory_is_refused_as_not_a_transformer():
    pipe = tiny_wan_pipeline()
    before = {k: v.clone() for k, v in pipe.vae.state_dict().items()}
    with pytest.raises(ValueError, match=r"sixbit quantizes diffusers transformers only.*AutoencoderKLWan"):
        sixbit.convert_model(pipe.vae, None, "w8a8")
    assert all(torch.equal(before[k], v) for k, v in pipe.vae.state_dict().items())


def test_a_hand_written_quantization_config_names_its_unknown_key(tmp_path):
    with pytest.raises(ValueError) as info:
        SixbitConfig.from_dict({"quant_method": "sixbit", "preset": "w8a8"})
    message = str(info.value)
    assert "unknown key(s) ['preset']" in message and "'preset_or_config'" in message, message
    assert "damaged" not in message
    # keys that are settings of the conversion are taken, as SixbitConfig(...) takes them
    config = SixbitConfig.from_dict({"quant_method": "sixbit", "preset_or_config": "w8a8", "gptq": False})
    assert config == SixbitConfig("w8a8", gptq=False)
    # and from_pretrained(quantization_config=<that dict>) quantizes as the SixbitConfig does
    tm = build_tiny("wan")
    tm.model.save_pretrained(tmp_path / "fp")
    loaded = type(tm.model).from_pretrained(tmp_path / "fp", quantization_config={"quant_method": "sixbit",
                                                                                 "preset_or_config": "w8a8"})
    assert isinstance(loaded.blocks[0].attn1.to_q, sixbit.QuantLinear)


def test_a_converted_folders_config_json_with_a_wrong_key_names_it(tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, None, "w8a8")
    tm.model.save_pretrained(tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization_config"]["chekpoint"] = config["quantization_config"].pop("checkpoint")
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['chekpoint'\] \(did you mean 'checkpoint'\?\)"):
        type(tm.model).from_pretrained(tmp_path / "q")


@pytest.mark.parametrize("size", [0, -5, "0MB", "0.0001KB", True])
def test_a_shard_size_that_is_no_size_is_refused_before_anything_is_written(size, tmp_path):
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, None, "w8a8")
    with pytest.raises(ValueError, match=r"max_shard_size=.* give a positive size"):
        tm.model.save_pretrained(tmp_path / "q", max_shard_size=size)
    assert not (tmp_path / "q").exists()


@pytest.fixture(scope="module")
def converted_pipelines(fp_pipeline_folder):
    from diffusers import DiffusionPipeline

    in_memory = tiny_wan_pipeline()
    sixbit.convert_model(in_memory, None, "w8a8")
    loaded = DiffusionPipeline.from_pretrained(fp_pipeline_folder, quantization_config=_pipeline_quantization(["transformer"]))
    return {"convert_model": in_memory, "PipelineQuantizationConfig": loaded}


@pytest.mark.parametrize("made_by", ["convert_model", "PipelineQuantizationConfig"])
@pytest.mark.parametrize(("arguments", "refusal"), [({"safe_serialization": False}, "safetensors only"),
                                                    ({"max_shard_size": "0MB"}, "give a positive size")])
def test_a_pipeline_save_its_transformer_refuses_writes_nothing(made_by, arguments, refusal, converted_pipelines,
                                                                tmp_path):
    with pytest.raises(ValueError, match=refusal):
        converted_pipelines[made_by].save_pretrained(tmp_path / "pipe", **arguments)
    assert not (tmp_path / "pipe").exists()  # not text_encoder/, tokenizer/ or vae/ either
    converted_pipelines[made_by].save_pretrained(tmp_path / "pipe")  # the same pipeline saves as it is
    assert (tmp_path / "pipe" / "transformer" / "config.json").is_file()


@pytest.mark.parametrize("shards", ["10GB", "20KB"])
def test_a_converted_folder_whose_config_json_lost_its_quantization_config_is_refused(shards, tmp_path, capsys):
    """The packed layers would load as random weights with only diffusers' "newly initialized"."""
    from sixbit.cli import main as cli

    tm = build_tiny("wan")
    cls = type(tm.model)
    tm.model.save_pretrained(tmp_path / "fp")
    sixbit.convert_model(tm.model, None, "w8a8")
    tm.model.save_pretrained(tmp_path / "q", max_shard_size=shards)
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    fix = "put back the config.json that save_pretrained (or `sixbit convert`) wrote beside these weight files"
    with pytest.raises(ValueError, match=r"holds a sixbit-converted WanTransformer3DModel \(packed weights such as "
                                         r"'blocks\.0\..*\.weight_codes'\) but its config\.json has no quantization_config"):
        cls.from_pretrained(tmp_path / "q")
    assert cli(["info", str(tmp_path / "q")]) != 0
    assert fix in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"is a folder: sixbit.load reads the .safetensors file sixbit.save writes"):
        sixbit.load(tmp_path / "q", build_tiny("wan").model)
    assert not isinstance(cls.from_pretrained(tmp_path / "fp").blocks[0].attn1.to_q, sixbit.QuantLinear)


def test_the_plain_load_guard_is_installed_in_a_process_that_imports_sixbit_first(tmp_path):
    """diffusers' loader is wrapped when diffusers imports it (a private method: a diffusers
    version without it shows here)."""
    import subprocess
    import sys

    script = ("import sixbit\nfrom diffusers.models.modeling_utils import ModelMixin\n"
              "print(getattr(ModelMixin._load_pretrained_model, 'sixbit_check', False))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("True")
