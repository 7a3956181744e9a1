"""Tuned layers the calibration run never calls (issue 61): stage 1 cannot measure them, so the
search must not hand them its cheapest format for free. They keep the base config's format (what
an untuned conversion gives them), are counted in the bytes, and are named in a warning, the
report's notes and the tuned config's description."""

from __future__ import annotations

import logging

import pytest
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny
from torch import nn

import sixbit
from sixbit import ConvertConfig, QuantConfig
from sixbit.tuning import Tuner
from sixbit.calibration.quality import psnr_of

# the base's format is not the cheapest candidate: a layer given the cheapest unmeasured shows
BASE = ConvertConfig(weights=QuantConfig(weight_format="int8"), activations="fp")
FORMATS = ("int4-g16", "int8")
NEVER_RUN = "transformer_blocks.0.attn1.add_k_proj"  # an attention linear CogVideoX's processor never calls


def _with_a_layer_never_run(seed: int = 0):
    tm = build_tiny("cogvideox", seed=seed)
    tm.model.transformer_blocks[0].attn1.add_k_proj = nn.Linear(32, 32)
    return tm


@pytest.fixture(scope="module")
def tiny():
    return _with_a_layer_never_run()


@pytest.fixture(scope="module")
def tuner(tiny):
    return Tuner(tiny.model, lambda: sample(tiny, steps=1), base=BASE, formats=FORMATS, progress=False)


def test_a_layer_never_run_keeps_the_base_format_and_is_said(tiny, tuner, caplog):
    with caplog.at_level(logging.WARNING, logger="sixbit.tuning"):
        again = Tuner(tiny.model, lambda: sample(tiny, steps=1), base=BASE, formats=FORMATS, progress=False)
    assert f"1 of the 13 tuned layers never ran on the calibration run ({NEVER_RUN})" in caplog.text
    assert "int8" in caplog.text and again.notes == tuner.notes
    budget = tuner.library.bits(tuner.library.uniform("int4-g16")) + 0.01  # it buys int4 only
    report = tuner.search(max_bits=budget, generations=1, population=4)
    assert NEVER_RUN not in report.layers and NEVER_RUN not in report.best["formats"]
    assert report.unmeasured == {NEVER_RUN: "int8"}
    assert set(report.best["formats"].values()) == {"int4-g16"}
    assert "never ran on the calibration run" in report.summary()
    assert "1 layer unmeasured" in report.config.description

    fresh = _with_a_layer_never_run()
    fresh.model.load_state_dict(tiny.model.state_dict())
    sixbit.convert_model(fresh.model, None, report.config)
    assert fresh.model.get_submodule(NEVER_RUN).weight_format == "int8"  # not the cheapest, int4-g16
    # the PSNR reported is what the tuned config converts to (the layer it did not measure does not run)
    assert psnr_of(tuner.evaluator.error(sample(fresh, steps=1))) == pytest.approx(report.best["psnr"], abs=1e-9)


def test_the_bytes_count_a_layer_never_run_at_its_format(tuner):
    """The transformer's bytes under an assignment hold the unmeasured layer at int8, not 16 bits."""
    library = tuner.library
    genome = library.uniform("int4-g16")
    with_int8 = library.bytes(genome)
    assert NEVER_RUN in library.fixed
    assert with_int8 == tuner.plan.other_bytes + 32 * 32 + int(
        sum(layer.numel * layer.variants[0].bits / 8 for layer in library.layers))
