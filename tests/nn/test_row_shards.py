"""QuantLinear row shards (tensor parallelism's cut): exact, complete, refused where impossible."""

from __future__ import annotations

import copy

import pytest
import torch

from sixbit.nn import QuantLinear


@pytest.mark.parametrize("fmt", ["nvfp4", "int8", "int4-g64", "int3-g64", "mxfp4"])
def test_row_shards_compute_their_rows_and_join_back_exactly(fmt):
    layer = QuantLinear.from_linear(torch.nn.Linear(128, 48), fmt, hadamard_block=64, act_mode="int8")
    down, up = torch.randn(4, 128), torch.randn(48, 4)
    layer.lowrank_down, layer.lowrank_up = down, up
    layer.add_lora("style", torch.randn(2, 128), torch.randn(48, 2), 0.5)
    x = torch.randn(7, 128)
    whole = layer(x)
    shards = [copy.deepcopy(layer) for _ in range(3)]
    for i, shard in enumerate(shards):
        shard.narrow_rows(16 * i, 16 * (i + 1))
        assert shard.out_features == 16 and shard.lowrank_up.shape == (16, 4)
    assert torch.equal(torch.cat([s(x) for s in shards], dim=-1), whole)  # each row sees the whole input
    joined = shards[0]
    names = joined.row_tensors()
    joined.set_rows({n: torch.cat([s.row_tensors()[n] for s in shards]) for n in names}, 48)
    assert torch.equal(joined(x), whole)
    assert joined.config() == layer.config()


def test_per_tensor_scales_are_kept_not_cut():
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 32), "nvfp4")
    assert "weight_global_scale" not in layer.row_tensors()
    scale = layer.weight_global_scale.clone()
    layer.narrow_rows(0, 16)
    assert torch.equal(layer.weight_global_scale, scale)


def test_bad_ranges_and_mismatched_tensors_are_refused_unchanged():
    layer = QuantLinear.from_linear(torch.nn.Linear(64, 32), "int8")
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    for start, stop in [(0, 0), (16, 8), (0, 33), (-1, 4)]:
        with pytest.raises(ValueError, match="not a range of this layer's 32 rows"):
            layer.narrow_rows(start, stop)
    with pytest.raises(ValueError, match="set_rows needs exactly"):
        layer.set_rows({"bias": layer.bias[:4]}, 4)
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())
