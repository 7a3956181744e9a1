"""``sixbit.memory.fast_path``: the layout a converted model runs with is chosen per device, by default.

The suite runs with ``SIXBIT_LAYOUT=compact`` (conftest); these tests ask for each choice.
"""

import dataclasses

import pytest
import torch

import sixbit
from sixbit import kernels
from sixbit.memory import fast_path as layout
from sixbit.models.roles import Role
from sixbit.nn import QuantLinear
from sixbit.presets import resolve
from fixtures.tiny_models import build_tiny, sample

SHAPES = [(64, 32, "gemm"), (64, 64, "gemm"), (32, 16, "weight_only"), (32, 32, "static")]


def _converted(choice, preset="w4a8-rtn", seed=0):
    tm = build_tiny("wan", seed)
    sixbit.convert_model(tm.model, None, preset, layout=choice)
    return tm


def _kept(model) -> int:
    return sum(m.converted_nbytes() for m in model.modules() if isinstance(m, QuantLinear))


def test_kept_bytes_counts_codes_and_scales_per_kind_of_layer():
    assert layout.kept_bytes(SHAPES, "cpu") == 64 * 36 + 64 * 68 + 32 * 16
    assert layout.kept_bytes(SHAPES, "cuda") == 64 * 36 + 64 * 68  # weight-only layers unpack on CPUs only
    int8 = [(64, 32, "int8")]  # INT8 weights: packed on AMX CPUs only, read as stored elsewhere
    assert layout.kept_bytes(int8, "cpu") == (64 * 36 if kernels.amx_int8() else 0)
    assert layout.kept_bytes(int8, "cuda") == 0


def test_decide_keeps_operands_where_they_fit_and_says_why_not(monkeypatch):
    monkeypatch.setattr(layout, "free_memory", lambda device: 10**9)
    # INT8 copies of 4-bit weights ("gemm") pay on AMX CPUs only: elsewhere the layers that keep
    # something on a CPU are weight-only ones (NVFP4 values unpacked)
    shapes = SHAPES if kernels.amx_int8() else [s for s in SHAPES if s[2] != "gemm"]
    fast = layout.decide(shapes, "cpu", "auto")
    assert fast.kept and fast.name == "fast" and fast.fold == kernels.amx_int8()
    assert fast.kept_bytes == layout.kept_bytes(shapes, "cpu") > 0 and "layout fast" in fast.describe()
    monkeypatch.setattr(layout, "free_memory", lambda device: 2 * layout.kept_bytes(shapes, "cpu") - 2)
    tight = layout.decide(shapes, "cpu", "auto")
    assert not tight.kept and "half of the" in tight.reason and "layout compact (asked: auto)" in tight.describe()
    assert layout.decide(SHAPES, "cpu", "fast").kept  # asked: kept whatever the free memory
    offloaded = layout.decide(SHAPES, "cpu", "auto", offloaded="block offloading on the model")
    assert not offloaded.kept and "offloaded" in offloaded.reason
    assert not layout.decide(SHAPES, "cpu", "compact").kept


def test_a_bad_choice_is_refused_before_the_model_changes(monkeypatch):
    tm = build_tiny("wan")
    with pytest.raises(ValueError, match="layout must be one of auto, fast, compact"):
        sixbit.convert_model(tm.model, None, "w8a8", layout="fastest")
    assert not any(isinstance(m, QuantLinear) for m in tm.model.modules())
    monkeypatch.setenv(layout.ENVIRONMENT, "speed")
    with pytest.raises(ValueError, match=r"\$SIXBIT_LAYOUT must be one of"):
        sixbit.convert_model(tm.model, None, "w8a8")


def test_without_amx_auto_keeps_no_int8_copies_of_4bit_weights_and_says_why():
    if kernels.amx_int8():
        pytest.skip("an AMX CPU keeps them (test_auto_lays_out_at_the_first_call_what_keep_int8_weights_keeps)")
    decided = layout.decide([(64, 32, "gemm")], "cpu", "auto")
    assert not decided.kept and "do not pay on a CPU without AMX-INT8" in decided.reason
    tm = _converted("auto")  # w4a8-rtn: 4-bit weights multiplied in INT8
    video = sample(tm, 2)
    decided = sixbit.layout_of(tm.model)
    assert not decided.kept and _kept(tm.model) == 0 and decided.kept_bytes > 0  # what "fast" would hold
    assert decided.describe() in sixbit.summary(tm.model).notes and "layout='fast' keeps them" in decided.reason
    assert torch.equal(video, sample(_converted("compact"), 2))  # what it runs: the compact layout


def _weight_only_4bit():
    """4-bit weights multiplied in full precision: what auto keeps on every CPU kind (NVFP4 values unpacked)."""
    config = resolve("w4a8-rtn")
    return dataclasses.replace(config, activations="fp", weights=dataclasses.replace(
        config.weights, weight_only_roles=[r.value for r in Role]))


def test_auto_lays_out_at_the_first_call_what_keep_int8_weights_keeps():
    # AMX CPUs keep the INT8 operands of w4a8; every CPU keeps the unpacked values of weight-only 4-bit layers
    preset = "w4a8-rtn" if kernels.amx_int8() else _weight_only_4bit()
    tm = _converted("auto", preset)
    assert sixbit.layout_of(tm.model) is None and _kept(tm.model) == 0  # nothing built before a call
    planned = layout.planned(tm.model)
    assert planned.kept and planned.device == torch.device("cpu")
    assert "at its first call there" in "\n".join(sixbit.summary(tm.model).notes)
    video = sample(tm, 2)
    decided = sixbit.layout_of(tm.model)
    assert decided.kept and decided.fold == kernels.amx_int8() and decided.kept_bytes == _kept(tm.model) > 0
    summary = sixbit.summary(tm.model)
    assert summary.converted_bytes == decided.kept_bytes and decided.describe() in summary.notes

    by_hand = _converted("compact", preset)  # the same weights, laid out by the explicit call
    sixbit.keep_int8_weights(by_hand.model)
    assert torch.equal(sample(by_hand, 2), video)
    assert sixbit.layout_of(by_hand.model).kept and "keep_int8_weights" in sixbit.layout_of(by_hand.model).reason


def test_compact_keeps_only_the_stored_weights_and_keeps_their_numerics():
    compact = _converted("compact")
    video = sample(compact, 2)
    assert _kept(compact.model) == 0 and not sixbit.layout_of(compact.model).kept
    assert sixbit.layout_of(compact.model).kept_bytes > 0  # what "fast" would have cost, reported
    fast = _converted("fast")
    fast_video = sample(fast, 2)
    assert _kept(fast.model) > 0
    rel = ((fast_video - video).norm() / video.norm()).item()
    assert 0 < rel < 0.05 if kernels.amx_int8() else rel < 1e-5  # folding: quantization noise; else rounding


def test_asking_again_replaces_the_layout_and_an_explicit_call_sticks():
    tm = _converted("fast")
    sample(tm, 1)
    assert _kept(tm.model) > 0
    layout.attach(tm.model, "compact")
    sample(tm, 1)
    assert _kept(tm.model) == 0 and not sixbit.layout_of(tm.model).kept
    sixbit.keep_int8_weights(tm.model)  # by hand: later calls on the same device leave it
    sample(tm, 1)
    assert _kept(tm.model) > 0 and sixbit.layout_of(tm.model).choice == "fast"


def test_every_loading_path_lays_out_the_model(tmp_path, monkeypatch):
    tm = _converted("compact", "w8a8")
    file = sixbit.save(tm.model, tmp_path / "m.safetensors")
    tm.model.save_pretrained(tmp_path / "folder")
    loaded = build_tiny("wan")
    sixbit.load(file, loaded.model, layout="fast")
    planned = layout.planned(loaded.model)
    sample(loaded, 1)
    decided = sixbit.layout_of(loaded.model)
    assert decided.kept and decided.kept_bytes == planned.kept_bytes == _kept(loaded.model)  # as decided, so done
    if kernels.amx_int8():  # w8a8's INT8 weights packed for the AMX kernel
        assert _kept(loaded.model) > 0 and "AMX" in decided.reason
    else:  # the INT8 GEMM reads them as stored: nothing to keep, and said so
        assert _kept(loaded.model) == 0 and decided.reason.startswith("nothing to keep on cpu (")
    monkeypatch.setenv(layout.ENVIRONMENT, "auto")  # from_pretrained takes the default
    restored = type(tm.model).from_pretrained(tmp_path / "folder")
    assert sixbit.layout_of(restored) is None
    sample(dataclasses.replace(tm, model=restored), 1)
    assert sixbit.layout_of(restored).choice == "auto" and sixbit.layout_of(restored).device.type == "cpu"


def test_a_model_with_nothing_quantized_gets_no_layout():
    tm = build_tiny("wan")
    layout.attach(tm.model, "fast")
    sample(tm, 1)
    assert layout.planned(tm.model) is None and sixbit.layout_of(tm.model) is None


def test_a_call_on_another_device_decides_again():
    tm = _converted("compact")
    sample(tm, 1)
    elsewhere = dataclasses.replace(sixbit.layout_of(tm.model), device=torch.device("cuda", 0))
    layout._LAYOUTS[tm.model] = elsewhere  # as if the last calls ran on a GPU
    sample(tm, 1)
    assert sixbit.layout_of(tm.model) is not elsewhere and sixbit.layout_of(tm.model).device.type == "cpu"


def test_int8_weight_only_layers_keep_nothing_and_the_plan_says_so():
    """w8a8's modulation layers hold INT8 weights, weight-only: nothing is kept for them, so the
    planned bytes are the kept ones and, off AMX, the reason is that there is nothing to keep
    (it named NVFP4 values, which a w8a8 model has none of, and counted N·K bytes per layer)."""
    tm = build_tiny("cogvideox")
    sixbit.convert_model(tm.model, None, "w8a8", layout="fast")
    assert any(m.weight_only for m in tm.model.modules() if isinstance(m, QuantLinear))
    planned = layout.planned(tm.model)
    sample(tm, 1)
    decided = sixbit.layout_of(tm.model)
    assert decided.kept_bytes == planned.kept_bytes == _kept(tm.model)
    assert "NVFP4" not in decided.reason
    if not kernels.amx_int8():
        assert decided.kept_bytes == 0 and decided.reason.startswith("nothing to keep on cpu (")
