"""Offline refinement of the low-rank branches against the full-precision block outputs."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny

import sixbit
from sixbit import QuantConfig
from sixbit.models import iter_blocks
from sixbit.nn import QuantLinear
from sixbit.runtime.blocks import quant_linears
from sixbit.rounding import refine

RECIPE = dict(weight_format="nvfp4", lowrank_rank=2)


def _quantized_block(tm, index: int = 1):
    """Block ``index`` of a tiny CogVideoX quantized with a rank-2 branch, its full-precision
    layers, and the calls recorded while the model sampled."""
    _, name, block, _ = list(iter_blocks(tm.model))[index]
    # the attention and feed-forward linears (the norms' modulation linears stay in full precision)
    originals = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear) and not n.startswith("norm")}
    with refine.recording(tm.model, index, max_calls=4) as recorder:
        sample(tm, steps=3)
    sixbit.quantize(tm.model, QuantConfig(**RECIPE, include=[rf"{name}\..*"]), progress=False)
    return name, block, originals, recorder


def test_refinement_lowers_the_block_error_and_changes_only_the_branches():
    tm = build_tiny("cogvideox")
    name, block, originals, recorder = _quantized_block(tm)
    assert recorder.seen == 6 and len(recorder.calls) == 4  # 3 steps × 2 CFG calls, a sample of 4 kept
    layers = {n: block.get_submodule(n) for n in originals}
    before = {n: {k: v.clone() for k, v in q.state_dict().items()} for n, q in layers.items()}
    modes = {n: q.act_mode for n, q in layers.items()}
    result = refine.refine_block(name, block, originals, recorder.calls, iterations=60)
    assert result.kept and result.error_after < result.error_before and result.layers == len(layers)
    for n, q in layers.items():
        assert block.get_submodule(n) is q and q.act_mode == modes[n]
        for key, value in q.state_dict().items():
            if key.startswith("lowrank_"):
                assert value.dtype == before[n][key].dtype and not torch.equal(value, before[n][key])
            else:
                assert torch.equal(value, before[n][key])  # codes, scales, bias untouched


def test_no_improvement_keeps_the_branches_as_they_were():
    tm = build_tiny("cogvideox")
    name, block, originals, recorder = _quantized_block(tm)
    layers = {n: block.get_submodule(n) for n in originals}
    before = {n: (q.lowrank_down.clone(), q.lowrank_up.clone()) for n, q in layers.items()}
    result = refine.refine_block(name, block, originals, recorder.calls, iterations=0)
    assert not result.kept and result.error_after == result.error_before
    for n, q in layers.items():
        assert torch.equal(q.lowrank_down, before[n][0]) and torch.equal(q.lowrank_up, before[n][1])
        assert not q.lowrank_down.requires_grad


def test_quantize_refines_block_by_block_and_records_nothing_after():
    tm = build_tiny("cogvideox")
    ref = sample(tm, steps=3)
    plain = build_tiny("cogvideox")
    sixbit.quantize(plain.model, QuantConfig(**RECIPE, gptq=True), calibration=lambda: sample(plain, steps=3), progress=False)
    sixbit.quantize(tm.model, QuantConfig(**RECIPE, gptq=True, refine_steps=40),
                    calibration=lambda: sample(tm, steps=3), progress=False)
    assert all(getattr(b, "_diffusers_hook", None) is None or b._diffusers_hook.get_hook("sixbit_blocks") is None
               for _, _, b, _ in iter_blocks(tm.model))
    err = float((sample(tm, steps=3) - ref).pow(2).mean())
    err_plain = float((sample(plain, steps=3) - ref).pow(2).mean())
    assert err < err_plain  # each block kept only a lower output error: the whole model follows here
    assert all(isinstance(q, QuantLinear) for q in quant_linears(tm.model))


@pytest.mark.parametrize("kwargs, message", [
    (dict(refine_steps=10), "refine_steps refines the low-rank branches"),
    (dict(refine_steps=-1, lowrank_rank=2), "refine_steps must be an integer ≥ 0"),
    (dict(refine_calls=0), "refine_calls must be an integer ≥ 1"),
])
def test_refine_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        QuantConfig(**kwargs)


def test_refinement_needs_calibration():
    assert QuantConfig(lowrank_rank=2, refine_steps=10).needs_calibration
    with pytest.raises(ValueError, match="needs calibration"):
        sixbit.quantize(build_tiny("cogvideox").model, QuantConfig(lowrank_rank=2, refine_steps=10))
