"""A NaN or Inf in a source weight (issue 61): every way in names the tensor — and the file, where
the weights come from one — says the source is damaged and how to get a good copy, and
changes nothing. It used to say "input contains 1 NaN/Inf value(s)" and suggest
``torch.autograd.detect_anomaly``, which finds nothing in a checkpoint."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import build_tiny

import sixbit
from sixbit.integrations.diffusers import SixbitConfig
from sixbit.nn import QuantLinear
from sixbit.streaming import convert_pretrained

LAYER = "blocks.1.ffn.net.2"


def _damaged():
    tm = build_tiny("wan")
    with torch.no_grad():
        tm.model.get_submodule(LAYER).weight[0, 3] = float("nan")
    return tm


def _quantized(model) -> bool:
    return any(isinstance(m, QuantLinear) for m in model.modules())


@pytest.mark.parametrize("convert", [lambda m: sixbit.convert_model(m, None, "w8a8"),
                                     lambda m: sixbit.quantize(m, sixbit.QuantConfig(weight_format="int8"))])
def test_in_memory_names_the_tensor_and_the_fix(convert):
    tm = _damaged()
    with pytest.raises(ValueError) as caught:
        convert(tm.model)
    message = str(caught.value)
    assert f"{LAYER}.weight holds 1 NaN/Inf value(s)" in message
    assert "reload" in message and "detect_anomaly" not in message
    assert not _quantized(tm.model)


def test_a_streamed_conversion_names_the_file(tmp_path):
    tm = _damaged()
    tm.model.save_pretrained(tmp_path / "fp")
    with pytest.raises(ValueError) as caught:
        convert_pretrained(tmp_path / "fp", "w8a8", tmp_path / "out", progress=False)
    message = str(caught.value)
    assert f"{LAYER}.weight in {tmp_path / 'fp' / 'diffusion_pytorch_model.safetensors'}" in message
    assert "download it again" in message and "detect_anomaly" not in message


def test_quantizing_while_loading_names_the_shard(tmp_path):
    tm = _damaged()
    tm.model.save_pretrained(tmp_path / "fp", max_shard_size="20KB")  # several shards and an index
    shards = sorted((tmp_path / "fp").glob("*.safetensors"))
    assert len(shards) > 1
    with pytest.raises(ValueError) as caught:
        type(tm.model).from_pretrained(tmp_path / "fp", quantization_config=SixbitConfig("w8a8"))
    message = str(caught.value)
    assert f"{LAYER}.weight in {tmp_path / 'fp'}" in message
    holder = next(p for p in shards if str(p) in message)  # the one shard that holds it
    from safetensors import safe_open
    with safe_open(str(holder), "pt") as f:
        assert f"{LAYER}.weight" in f.keys()
    assert "download it again" in message
