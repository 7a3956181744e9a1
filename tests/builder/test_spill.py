"""The replaced full-precision layers wait on disk during a conversion (:mod:`sixbit.builder.spill`):
their memory is released block by block, an error reads every value back into the same tensor
objects, and nothing is spilled where it would not leave memory."""

import pytest
import torch

import sixbit
from sixbit.builder import spill, spilling
from sixbit.builder import in_memory
from sixbit.config import QuantConfig
from fixtures.tiny_models import build_tiny


class Injected(Exception):
    """The failure a test injects: nothing else raises it."""


def _linears(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_quantizing_releases_each_replaced_layer_once_its_block_is_built(monkeypatch):
    tm = build_tiny("wan")
    originals = _linears(tm.model)
    seen = []
    real = in_memory._Layers.layer

    def layer(self, name, original, stats):
        seen.append({n: m.weight.numel() for n, m in originals.items()})  # what is resident as each layer starts
        return real(self, name, original, stats)

    monkeypatch.setattr(in_memory._Layers, "layer", layer)
    with spilling():
        sixbit.quantize(tm.model, QuantConfig(weight_format="int8"), progress=False)
    replaced = [n for n in originals if not isinstance(tm.model.get_submodule(n), torch.nn.Linear)]
    block0 = [n for n in replaced if n.startswith("blocks.0.")]
    assert block0
    last = seen[-1]  # building the last layer: block 0's originals are on disk
    assert all(last[n] == 0 for n in block0)
    assert all(seen[0][n] > 0 for n in replaced)  # nothing left memory before its block was built


def test_an_error_reads_every_spilled_tensor_back_into_the_same_objects(monkeypatch):
    tm = build_tiny("cogvideox")
    params = {name: p for name, p in tm.model.named_parameters()}
    values = {name: p.detach().clone() for name, p in params.items()}
    plan = list(sixbit.builder.plan_layers(tm.model, QuantConfig(weight_format="int8")))
    real = in_memory._Layers.layer

    def layer(self, name, original, stats):
        if name == plan[-1]:
            assert spill.active().bytes > 0  # the earlier blocks' layers are spilled
            raise Injected
        return real(self, name, original, stats)

    monkeypatch.setattr(in_memory._Layers, "layer", layer)
    with pytest.raises(Injected), spilling():
        sixbit.quantize(tm.model, QuantConfig(weight_format="int8"), progress=False)
    now = dict(tm.model.named_parameters())
    assert list(now) == list(params)
    assert all(now[n] is params[n] and torch.equal(now[n], values[n]) for n in params)
    assert spill.active() is None


def test_a_tensor_still_used_in_the_model_is_never_spilled():
    tm = build_tiny("wan")
    layer_name = next(n for n in _linears(tm.model) if n.startswith("blocks.0."))
    original = tm.model.get_submodule(layer_name)
    assert original.bias is not None
    bias_bytes = original.bias.nbytes
    parent, _, child = layer_name.rpartition(".")
    shared = torch.nn.Linear(original.in_features, original.out_features, bias=False)
    shared.weight = original.weight  # tied: the model still uses it after the swap
    with spilling() as kept:
        setattr(tm.model.get_submodule(parent), child, shared)
        kept.keep([original], tm.model)
        assert original.weight.numel() > 0  # tied, so it stays in memory
        assert original.bias.numel() == 0 and kept.bytes == bias_bytes


def test_nested_scopes_share_one_spill_and_a_directory_in_memory_spills_nothing(monkeypatch):
    with spilling() as outer:
        with spilling() as inner:
            assert inner is outer is spill.active()
        assert spill.active() is outer
    assert spill.active() is None
    monkeypatch.setattr(spill, "_filesystem", lambda path: "tmpfs")
    spill._disk_directory.cache_clear()
    try:
        with spilling() as kept:
            assert kept is None and spill.active() is None
    finally:
        monkeypatch.undo()
        spill._disk_directory.cache_clear()
