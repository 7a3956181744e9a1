"""One pre-flight check for every way in (issue 59): the same config, one that cannot run on the
model, gets the same refusal from convert_model (in memory, and static W8A8), convert_pretrained
(streamed), from_pretrained(quantization_config=SixbitConfig(...)) (quantized while loading), tune,
and load (a checkpoint whose conversion record holds it), and none of them changes anything."""

import json

import pytest
import torch
from diffusers import CogVideoXTransformer3DModel
from safetensors.torch import load_file, save_file
from test_checkpoint import build, inputs
from test_lora import _peft_lora

import sixbit
from sixbit.checkpoint.file import _digest
from sixbit.config import AttentionQuantConfig, ConvertConfig, QuantConfig
from sixbit.files.safetensors import tensor_bytes

# quantized attention in blocks 5-8 of a 2-block model: every way must refuse it with the method's own words
BAD_ATTENTION = AttentionQuantConfig(blocks=(5, 9))
REFUSAL = ("blocks=(5, 9) selects none of CogVideoXTransformer3DModel's 2 blocks (0–1): choose a range within them, "
           "or blocks=None for all")


def _bad(activations="int8") -> ConvertConfig:
    weights = None if activations == "static" else QuantConfig(weight_format="int8")
    return ConvertConfig(weights=weights, activations=activations, attention=BAD_ATTENTION)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model, before) -> bool:
    after = model.state_dict()
    return set(after) == set(before) and all(torch.equal(after[k], v) for k, v in before.items())


@pytest.fixture
def folder(tmp_path):
    build(0).save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def _refusal(call) -> str:
    with pytest.raises(ValueError) as error:
        call()
    return str(error.value)


def test_convert_model_in_memory_and_static_w8a8():
    for activations in ("int8", "static"):
        model = build(0)
        before = _state(model)
        assert REFUSAL == _refusal(lambda: sixbit.convert_model(model, lambda: None, _bad(activations)))
        assert _unchanged(model, before) and sixbit.conversion_of(model) is None


def test_convert_pretrained_streamed(folder, tmp_path):
    out = tmp_path / "out"
    assert REFUSAL == _refusal(lambda: sixbit.convert_pretrained(folder, _bad(), out, progress=False))
    assert not out.exists()


def test_quantized_while_loading(folder):
    config = sixbit.SixbitConfig(_bad())
    assert REFUSAL == _refusal(lambda: CogVideoXTransformer3DModel.from_pretrained(folder, quantization_config=config))


def test_tune():
    model = build(0)
    before = _state(model)
    assert REFUSAL == _refusal(lambda: sixbit.tune(model, lambda: None, max_bits=6.0, base=_bad(), progress=False))
    assert _unchanged(model, before)


def test_load_of_a_checkpoint_whose_record_holds_it(tmp_path):
    path = sixbit.save(sixbit.convert_model(build(0), None, "w8a8"), tmp_path / "good.safetensors")
    tensors, header = load_file(path), sixbit.read_header(path)
    header["extensions"]["conversion"]["config"] = _bad().to_dict()
    header["sha256"] = _digest(((n, tensors[n].dtype, (tensor_bytes(tensors[n]),)) for n in sorted(tensors)), header)
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={"sixbit": json.dumps(header)})
    model = build(1)
    before = _state(model)
    refusal = _refusal(lambda: sixbit.load(tmp_path / "bad.safetensors", model))
    assert refusal.endswith(REFUSAL), refusal  # the file it came from may come first
    assert _unchanged(model, before) and sixbit.conversion_of(model) is None
    with torch.no_grad():
        model(**inputs())  # still the plain model


# ---- issue 61: a LoRA loaded by diffusers through PEFT (load_lora_adapter / pipe.load_lora_weights) -----
# on the full-precision model wraps its layers in PEFT's; a conversion or a load replaced what was
# under them and returned normally, after which generation failed, diffusers could not remove the
# LoRA and the checkpoint did not load. Every way in now refuses it with one message, and changes nothing.


def _with_peft_lora(tmp_path, seed=0):
    model = build(seed)
    lora = _peft_lora(model, tmp_path / "lora", strength=0.5)
    model.load_lora_adapter(tmp_path / "lora", weight_name=lora.name, prefix=None, adapter_name="style")
    return model


PEFT_REFUSAL = r"replaces layers PEFT has wrapped for LoRA\(s\) \[.style.\].*fuse_lora\(\).*unload_lora_weights\(\).*load_lora_weights"


@pytest.mark.parametrize("way", ["convert_model", "static_w8a8", "tune", "quantize", "load"])
def test_a_peft_lora_is_refused_by_every_way_in_and_nothing_changes(tmp_path, way):
    path = sixbit.save(sixbit.convert_model(build(0), None, "w8a8"), tmp_path / "w8a8.safetensors")
    model = _with_peft_lora(tmp_path)
    before = _state(model)
    with torch.no_grad():
        video = model(**inputs()).sample
    calls = {"convert_model": lambda: sixbit.convert_model(model, None, "w8a8"),
             "static_w8a8": lambda: sixbit.convert_model(model, lambda: None, ConvertConfig(weights=None, activations="static")),
             "tune": lambda: sixbit.tune(model, lambda: None, max_bits=6.0, progress=False),
             "quantize": lambda: sixbit.quantize(model, QuantConfig(weight_format="int8"), progress=False),
             "load": lambda: sixbit.load(path, model)}
    with pytest.raises(ValueError, match=PEFT_REFUSAL):
        calls[way]()
    assert _unchanged(model, before) and sixbit.conversion_of(model) is None
    with torch.no_grad():
        assert torch.equal(model(**inputs()).sample, video)  # the LoRA still runs, through PEFT
    model.unload_lora()  # and diffusers still removes it
    assert not any(type(m).__module__.startswith("peft.") for m in model.modules())


def test_the_ways_the_peft_refusal_names_work(tmp_path):
    """Fused into the weights (then PEFT's layers removed), or loaded after the conversion."""
    model = _with_peft_lora(tmp_path)
    model.fuse_lora()
    model.unload_lora()
    sixbit.convert_model(model, None, "w8a8")
    converted = sixbit.convert_model(build(0), None, "w8a8")
    converted.load_lora_adapter(tmp_path / "lora", weight_name="lora.safetensors", prefix=None, adapter_name="style")
    assert sixbit.loras(converted) == ["style"]
    with torch.no_grad():
        fused, late = model(**inputs()).sample, converted(**inputs()).sample
    assert (fused - late).abs().max() < 0.05 * fused.abs().max()  # the same LoRA, either way


def test_a_sixbit_lora_on_the_full_precision_model_is_refused_by_quantize(tmp_path):
    """convert_model refused it already; sixbit.quantize replaced the layers and the LoRA stopped acting."""
    model = build(0)
    lora = _peft_lora(model, tmp_path, strength=0.5)
    sixbit.load_lora(model, lora, adapter_name="style")
    before = _state(model)
    with pytest.raises(ValueError, match=r"sixbit.quantize replaces the layers that LoRA\(s\) \['style'\]"):
        sixbit.quantize(model, QuantConfig(weight_format="int8"), progress=False)
    assert _unchanged(model, before) and not any(isinstance(m, sixbit.nn.QuantLinear) for m in model.modules())


def test_a_sixbit_lora_onto_a_model_with_a_peft_lora_names_peft(tmp_path):
    """Before: "'...to_q': Linear, not a linear layer (was it made for another model?)"."""
    model = _with_peft_lora(tmp_path)
    with pytest.raises(ValueError, match=r"LoRA\(s\) \['style'\] are loaded through PEFT .*unload_lora_weights"):
        sixbit.load_lora(model, tmp_path / "lora" / "lora.safetensors", adapter_name="second")
    assert sixbit.loras(model) == []


def test_a_folder_saved_with_a_peft_lora_loaded_names_peft_when_streamed(tmp_path):
    """diffusers' save_pretrained writes PEFT's wrapped names (``to_q.base_layer.weight``,
    ``to_q.lora_A.style.weight``); the streamed conversion said only "do not fit its config.json"."""
    _with_peft_lora(tmp_path).save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match=r"saved with a PEFT LoRA loaded \(e.g. 'transformer_blocks.0.attn1.to_k.base_"
                                         r"layer.bias'\).*fuse_lora\(\).*unload_lora\(\)"):
        sixbit.convert_pretrained(tmp_path / "model", "w8a8", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# A conversion that would quantize nothing (issue 61: a custom model whose linear names match no
# role "converted" to w8a8 with 0 of its 7 layers quantized, and no warning).
class _Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x):
        return self.lin2(self.lin1(x))


class UnnamedRolesNet(torch.nn.Module):
    """Linears named like no role sixbit knows: all 'other'."""

    def __init__(self, width=32, blocks=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(width) for _ in range(blocks)])
        self.head = torch.nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _quantized(model):
    return sum(isinstance(m, sixbit.QuantLinear) for m in model.modules())


def test_a_model_whose_linears_have_no_role_the_config_quantizes_is_refused_with_the_fixes():
    model = UnnamedRolesNet()
    before = _state(model)
    refusal = ("none of UnnamedRolesNet's 7 linear layers has a role this config quantizes (['attention', "
               "'feedforward', 'modulation']): sixbit reads their roles as {'other': 7} ('other': a name it does "
               "not recognize, e.g. 'blocks.0.lin1'); register the model's roles")
    assert _refusal(lambda: sixbit.convert_model(model, None, "w8a8")).startswith(refusal)
    assert _refusal(lambda: sixbit.quantize(model, QuantConfig(weight_format="int8"))).startswith("none of")
    assert _unchanged(model, before) and sixbit.conversion_of(model) is None
    # the fix the refusal names quantizes them
    weights = QuantConfig(weight_format="int8", role_formats={"other": "int8"})
    sixbit.convert_model(model, None, ConvertConfig(weights=weights, activations="int8"))
    assert _quantized(model) == 7


def test_include_patterns_that_leave_no_layer_and_formats_that_fit_none_are_refused():
    model = build(0)
    weights = QuantConfig(weight_format="int8", include=[r"blocks\..*"])  # CogVideoX's are transformer_blocks
    assert _refusal(lambda: sixbit.convert_model(model, None, ConvertConfig(weights=weights, activations="int8"))).startswith(
        r"QuantConfig include=['blocks\\..*'] and exclude=[] leave none of CogVideoXTransformer3DModel's linear layers")
    narrow = UnnamedRolesNet(width=24)  # NVFP4's 16-element blocks do not divide 24
    weights = QuantConfig(weight_format="nvfp4", role_formats={"other": "nvfp4"})
    assert _refusal(lambda: sixbit.convert_model(narrow, None, ConvertConfig(weights=weights, activations="int8"))).startswith(
        "no layer of UnnamedRolesNet fits the formats this config gives them: e.g. 'blocks.0.lin1' has in_features=24, "
        "not a multiple of nvfp4's block 16")
    assert sixbit.conversion_of(model) is None and sixbit.conversion_of(narrow) is None


def test_boundary_blocks_that_keep_every_layer_warn_and_convert(caplog):
    """high_quality keeps the first and last block in full precision: on a 2-block model that is
    every layer it quantizes. What the config asks for, so a warning that names the setting."""
    model = build(0)
    with caplog.at_level("WARNING", logger="sixbit"):
        sixbit.convert_model(model, None, "high_quality")
    assert "CogVideoXTransformer3DModel has 2 blocks, and boundary_blocks=1 keeps the first and last 1" in caplog.text
    assert "set boundary_blocks=0" in caplog.text
    assert sixbit.conversion_of(model) is not None
