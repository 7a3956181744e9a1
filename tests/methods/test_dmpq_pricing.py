"""DMPQ's cost map priced per step range (``error_at="steps"``) against the per-cell map (``"video"``)."""

import pytest
import torch
from fixtures.toy import ToyTransformer

import sixbit
from sixbit.methods.dmpq import DMPQConfig, apply_dmpq, fit_dmpq

TIMESTEPS = [900, 750, 600, 450, 300, 150]


def _sampler(depth=4):
    """A toy model in an Euler-like loop whose every step amplifies what came before: an error
    made at an early step is carried, grown, through all the later ones, so it costs the final
    "video" more than the same error made late."""
    torch.manual_seed(0)
    model = sixbit.quantize(ToyTransformer(depth=depth), sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=32))
    x0 = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    calls = []

    def run():
        calls.append(1)
        x = x0
        with torch.no_grad():
            for t in TIMESTEPS:
                x = 1.5 * x + 0.1 * model(x, timestep=torch.tensor([t]))
        return x

    return model, run, calls


@pytest.mark.parametrize("error_at, runs", [("steps", 2 + 3 + 1), ("video", 2 + 3 * 2 + 1)])
def test_calibration_runs_per_pricing(error_at, runs):
    model, run, calls = _sampler()
    fit_dmpq(model, run, DMPQConfig(error_at=error_at, step_groups=3, block_groups=2))
    assert len(calls) == runs  # probe, base, one per step range (or per cell), refine


def test_step_pricing_is_the_grid_with_one_block_range():
    model, run, _ = _sampler()
    steps = fit_dmpq(model, run, DMPQConfig(error_at="steps", step_groups=3, block_groups=4))
    grid = fit_dmpq(model, run, DMPQConfig(error_at="video", step_groups=3, block_groups=1))
    assert steps == grid


def test_early_steps_priced_above_late_ones_where_errors_grow():
    model, run, _ = _sampler()
    pred = fit_dmpq(model, run, DMPQConfig(error_at="steps", step_groups=3, target_bits=6.25))
    assert pred.step_starts == [0, 3, 5]
    dmpq = apply_dmpq(model, pred)
    run()
    # NVFP4 on half the FLOPs: the three last steps, whose errors are carried through fewer steps
    assert dmpq.report().precision_map() == [["int8"] * 4] * 3 + [["nvfp4"] * 4] * 3


def test_steps_pricing_validates():
    with pytest.raises(ValueError, match='"video", "steps" or "block"'):
        DMPQConfig(error_at="cell")
