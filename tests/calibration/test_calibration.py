import math

import pytest
import torch

import sixbit
from sixbit.calibration import TAIL_QUANTILES, CalibrationData
from fixtures.tiny_models import TINY_BUILDERS, build_tiny
from fixtures.toy import ToyTransformer

TIMESTEPS = [900, 600, 300]


def _loop(model, inputs, cfg=True):
    def run():
        for t in TIMESTEPS:
            for x in inputs[: 2 if cfg else 1]:
                model(x, timestep=torch.full((x.shape[0],), t))
    return run


def _direct(model, x, t):
    """Block inputs and outputs of one call, by hand."""
    temb = torch.full((x.shape[0], 1, 1), t / 1000)
    ins, outs = [], []
    h = x
    for block in model.blocks:
        ins.append(h)
        h = h + torch.tanh(block.proj(h)) * temb
        outs.append(h)
    return ins, outs


def test_statistics_equal_direct_computation():
    torch.manual_seed(0)
    model = ToyTransformer()
    cond, uncond = torch.randn(1, 6, 32) * 3, torch.randn(1, 6, 32)
    data = sixbit.calibrate(model, _loop(model, [cond, uncond]))
    assert data.steps == [0, 1, 2] and data.branches == ["cond", "uncond"] and data.generations == 1
    assert data.timesteps == {0: 900.0, 1: 600.0, 2: 300.0}
    assert set(data.layers) == {"blocks.0.proj", "blocks.1.proj", "blocks.2.proj"}  # proj_out is output
    with torch.no_grad():
        for step, t in enumerate(TIMESTEPS):
            for branch, x in (("cond", cond), ("uncond", uncond)):
                ins, outs = _direct(model, x, t)
                for i, (xi, yi) in enumerate(zip(ins, outs)):
                    s = data.layers[f"blocks.{i}.proj"][(step, branch)]
                    a = xi.abs().reshape(-1, 32)
                    assert torch.equal(s.channel_amax, a.amax(0))
                    assert s.amax == pytest.approx(float(a.max()))
                    assert s.mean_abs == pytest.approx(float(a.mean()), rel=1e-6)
                    assert s.std == pytest.approx(float(xi.pow(2).mean().sqrt()), rel=1e-6)
                    assert s.tail(0.999) == pytest.approx(float(torch.quantile(a.reshape(-1), 0.999)), rel=1e-6)
                    b = data.blocks[f"blocks.{i}"][(step, branch)]
                    assert b.gamma == pytest.approx(float((yi - xi).abs().sum() / xi.abs().sum()), rel=1e-5)
                    if step == 0:
                        assert math.isnan(b.delta_change)
                    else:
                        pins, pouts = _direct(model, x, TIMESTEPS[step - 1])
                        prev = pouts[i] - pins[i]
                        expected = (yi - xi - prev).abs().sum() / prev.abs().sum()
                        assert b.delta_change == pytest.approx(float(expected), rel=1e-4)


def test_batched_cfg_is_split_into_branches_and_generations_pool():
    torch.manual_seed(0)
    model = ToyTransformer()
    uncond, cond = torch.randn(1, 6, 32), torch.randn(1, 6, 32) * 5
    both = torch.cat([uncond, cond])

    def run():
        for _ in range(2):  # two generations: maxima pool, means average
            for t in TIMESTEPS:
                model(both, timestep=torch.full((2,), t))

    data = sixbit.calibrate(model, run, batched_cfg=True)
    assert data.generations == 2 and data.branches == ["cond", "uncond"]
    s_cond, s_uncond = data.layers["blocks.0.proj"][(0, "cond")], data.layers["blocks.0.proj"][(0, "uncond")]
    assert s_cond.amax == pytest.approx(float(cond.abs().max()))
    assert s_uncond.amax == pytest.approx(float(uncond.abs().max()))
    assert s_cond.calls == 2 and s_cond.count == 2 * cond.numel()


def test_save_load_round_trip_and_errors(tmp_path):
    model = ToyTransformer()
    data = sixbit.calibrate(model, _loop(model, [torch.randn(1, 4, 32), torch.randn(1, 4, 32)]))
    path = data.save(tmp_path / "calib.safetensors")
    back = CalibrationData.load(path)
    assert back.timesteps == data.timesteps and back.generations == data.generations
    for name, per in data.layers.items():
        for key, s in per.items():
            b = back.layers[name][key]
            assert torch.equal(b.channel_amax, s.channel_amax)
            assert (b.amax, b.count, b.calls, b.tail_sum) == (s.amax, s.count, s.calls, s.tail_sum)
    for name, per in data.blocks.items():
        for key, s in per.items():
            assert back.blocks[name][key].gamma == s.gamma
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        CalibrationData.load(bad)
    with pytest.raises(ValueError, match="nothing"):
        sixbit.calibrate(model, lambda: None)


def test_hooks_are_removed_and_memory_is_bounded():
    model = ToyTransformer()
    data = sixbit.calibrate(model, _loop(model, [torch.randn(1, 4, 32)] * 2))
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    for per in data.layers.values():
        for s in per.values():
            assert s.channel_amax.shape == (32,)  # one value per input channel, never activations
    assert len(TAIL_QUANTILES) == len(next(iter(next(iter(data.layers.values())).values())).tail_sum)


@pytest.mark.parametrize("name", sorted(TINY_BUILDERS))
def test_every_architecture(name):
    tm = build_tiny(name)

    def run():
        for t in (900, 100):
            for _ in range(2):
                tm.model(**tm.inputs(1, torch.tensor(t)))

    data = sixbit.calibrate(tm.model, run)
    n_blocks = sum(len(tm.model.get_submodule(p)) for p in tm.block_lists)
    assert len(data.blocks) == n_blocks
    assert data.steps == [0, 1] and data.branches == ["cond", "uncond"]
    assert all(len(per) == 4 for per in data.layers.values())
    assert all(0 < s.gamma < 10 for per in data.blocks.values() for s in per.values())
