"""``sixbit.tune_pretrained``: the tuning streamed from a model's files, one block in memory, gives the
in-memory tuning's stage 1, fit and pick, to the bit."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny

from sixbit import ConvertConfig, QuantConfig
from sixbit.builder import ShardedModel
from sixbit.models import iter_blocks
from sixbit import tune_pretrained
from sixbit.tuning import Tuner

BASE = ConvertConfig(weights=QuantConfig(weight_format="int4-g16", gptq=True, scale_rule="mse"), activations="fp")
FORMATS = ("int4-g16", "int8")


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("cogvideox")


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "model"
    tiny.model.save_pretrained(path, max_shard_size="8KB")  # several shards
    return path


def _calibration(tiny):
    def calibration(transformer):
        run = copy.copy(tiny)
        run.model = transformer
        return sample(run, steps=2)
    return calibration


def _resident_blocks(sharded: ShardedModel) -> int:
    """Blocks with any of the model's own tensors in memory (a swapped-in candidate's are not)."""
    net, loaded = sharded.net, set()
    for key, owner in sharded.owners.items():
        module = net.get_submodule(key.rpartition(".")[0])
        if module is owner() and getattr(module, key.rpartition(".")[2]).device.type != "meta":
            loaded.add(key)
    return sum(any(key.startswith(name + ".") for key in loaded) for _, name, _, _ in iter_blocks(sharded.net))


def test_streamed_tune_is_the_in_memory_tune(tiny, folder, monkeypatch):
    in_memory = Tuner(tiny.model, lambda: sample(tiny, steps=2), base=BASE, formats=FORMATS, progress=False)
    expected = in_memory.search(max_bits=6)
    assert expected.best["calibration_inputs"] == "full_precision"  # what the streamed tuning measures

    resident, load = [], ShardedModel.load

    def counted(self, keys):
        load(self, keys)
        resident.append(_resident_blocks(self))

    monkeypatch.setattr(ShardedModel, "load", counted)
    streamed = tune_pretrained(folder, _calibration(tiny), max_bits=6, base=BASE, formats=FORMATS, progress=False)
    assert max(resident) == 1 and len(resident) > 20  # one block at a time, read again for every run

    assert streamed.mode == "blocks"
    blocks = len(list(iter_blocks(tiny.model)))
    assert len(streamed.block_seconds) == len(expected.block_seconds) == blocks and min(streamed.block_seconds) > 0
    for row, row_expected in zip(streamed.sensitivity.mse, expected.sensitivity.mse, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(row, row_expected, strict=True))
    assert streamed.sensitivity.proxy == expected.sensitivity.proxy
    assert streamed.fit.factors == expected.fit.factors and streamed.fit.points == expected.fit.points
    assert streamed.best == expected.best and streamed.uniform == expected.uniform
    assert streamed.config.to_dict() == expected.config.to_dict()


def test_streamed_tune_refuses_bad_arguments_before_reading_a_file(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match="calibration must be a callable"):
        tune_pretrained(missing, ["a prompt"], max_bits=5)
    with pytest.raises(ValueError, match="exactly one"):
        tune_pretrained(missing, lambda t: None, max_bits=5, min_psnr=30)
