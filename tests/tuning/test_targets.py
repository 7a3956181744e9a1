"""A tuning run's arguments refused before anything runs (issue 48): budgets below every
assignment the candidate formats allow, a search too small to work, formats that fit none of the
tuned layers; and the layers a format fits only in part, named with the reason."""

from __future__ import annotations

import logging

import pytest
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny

from sixbit import ConvertConfig, QuantConfig
from sixbit.presets import resolve
from sixbit.tuning import DEFAULT_FORMATS, tune_model
from sixbit.tuning.library import build_library, plan_candidates

BASE = ConvertConfig(weights=QuantConfig(weight_format="int4-g16"), activations="fp")
FORMATS = ("int4-g16", "int8")


class Ran(Exception):
    """Raised by the calibration run: the arguments got as far as running the model."""


def _ran():
    raise Ran


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("cogvideox")  # tuned layers: in_features 32 (10 of them) and 128 (2)


@pytest.mark.parametrize("arch", ["cogvideox", "wan", "sana-video"])  # sana-video: convs quantized as linears
@pytest.mark.parametrize("base", [BASE, resolve("w4a8"), ConvertConfig(
    weights=QuantConfig(weight_format="int4-g16", lowrank_rank=4, role_formats={"modulation": "int4-g16"}),
    activations="int8")])
def test_the_plan_knows_the_bits_and_bytes_the_library_builds(arch, base):
    """What the up-front checks judge by (shapes only) is exactly what stage 1 measures."""
    model = build_tiny(arch).model
    candidates = tuple(dict.fromkeys([*DEFAULT_FORMATS, "int4-g16", "mxfp4", "int8-asym", None]))
    plan = plan_candidates(model, base, candidates)
    library = build_library(model, base, candidates, {}, progress=False)
    assert {layer.name: {v.format: v.bits for v in layer.variants} for layer in library.layers} == plan.bits
    lowest = tuple(0 for _ in library.layers)
    assert plan.fewest_bits() == library.bits(lowest) and plan.fewest_bytes() == library.bytes(lowest)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_bits=1), "max_bits=1 is below the fewest bits the candidate formats allow: 6.00 bits per weight with "
                       "every tuned layer in its smallest candidate (int4-g16 × 12); give max_bits ≥ 6.00, or a "
                       "smaller format in formats"),
    (dict(max_bytes=1000), "max_bytes=1000 (0.00 MiB) is below the fewest bytes the candidate formats allow: 86560 "
                           "(0.08 MiB) with every tuned layer in its smallest candidate (int4-g16 × 12); give "
                           "max_bytes ≥ 86560"),
    (dict(max_bits=8, population=2), "population must be a whole number from 4 to 1000 (the search keeps 2 elites "
                                     "and breeds the rest from tournaments of 3), got 2"),
    (dict(max_bits=8, generations=0), "generations must be a whole number from 1 to 1000, got 0"),
    (dict(max_bits=8, seed=0.5), "seed must be a whole number"),
])
def test_a_budget_or_search_size_that_cannot_work_is_refused_before_anything_runs(tiny, kwargs, message):
    """Issue 48: these were refused only after stage 1 (a calibration run per layer and format)."""
    calls = []
    with pytest.raises(ValueError) as e:
        tune_model(tiny.model, lambda: calls.append(1), base=BASE, formats=FORMATS, progress=False, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not calls


@pytest.mark.parametrize("smallest", [dict(max_bits=6.0), dict(max_bytes=86560)])
def test_the_smallest_budget_named_is_accepted(tiny, smallest):
    with pytest.raises(Ran):  # past every check: the first calibration run
        tune_model(tiny.model, _ran, base=BASE, formats=FORMATS, progress=False, **smallest)


def test_a_format_that_fits_no_tuned_layer_is_refused_naming_a_group_that_fits(tiny):
    with pytest.raises(ValueError) as e:
        tune_model(tiny.model, _ran, max_bits=8, base=BASE, formats=["int4-g256", "int8"], progress=False)
    assert str(e.value) == ("formats: 'int4-g256' fits none of the 12 tuned layers: its block of 256 weights divides "
                            "none of their in_features (32, 128); use e.g. 'int4-g32' or drop it")


def test_a_budget_below_what_layers_without_a_fitting_format_cost_says_why(tiny):
    """Issue 48: ``formats=["int4-g256"]`` gave 12.18 bits without a word on the layers it did not fit."""
    with pytest.raises(ValueError) as e:
        tune_model(tiny.model, _ran, max_bits=5, base=BASE, formats=["int4-g64"], progress=False)
    assert ("(16-bit × 10, int4-g64 × 2); 10 of the 12 layers fit no quantized candidate (in_features 32: not a "
            "multiple of their blocks) and count 16 bits; give max_bits ≥ 12.17, or a format that fits them in "
            "formats") in str(e.value)


@pytest.mark.parametrize("formats, instead", [
    (["int4-g64"], "no other format fits them: they stay 16-bit"),
    (["int4-g64", "int8"], "they choose among the other formats"),
])
def test_a_format_that_fits_some_layers_names_the_others_before_anything_runs(tiny, caplog, formats, instead):
    with caplog.at_level(logging.WARNING, logger="sixbit"), pytest.raises(Ran):
        tune_model(tiny.model, _ran, min_psnr=30, base=BASE, formats=formats, progress=False)
    assert (f"format 'int4-g64' fits 2 of the 12 tuned layers: 10 have in_features (32) that are not a multiple of "
            f"its block of 64 weights (transformer_blocks.0.attn1.to_q, transformer_blocks.0.attn1.to_k, "
            f"transformer_blocks.0.attn1.to_v and 7 more); {instead}") in caplog.text


def test_the_report_summary_repeats_what_a_format_did_not_fit(tiny):
    report = tune_model(tiny.model, lambda: sample(tiny, steps=1), max_bits=12, base=BASE,
                        formats=["int4-g64", "int8"], population=4, generations=1, progress=False)
    assert report.notes and f"note: {report.notes[0]}" in report.summary()
    assert "format 'int4-g64' fits 2 of the 12 tuned layers" in report.notes[0]
