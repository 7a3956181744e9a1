"""DMPQ calibration runs must repeat, and a predictor must meet another step count (issue 22).

1. DMPQ compares re-runs: a calibration callable without a generator is seeded (each call under
   ``torch.manual_seed(0)`` in a forked RNG), and one that still differs between runs is refused.
2. The predictor keeps the calibration step count and timesteps; a run with another step count
   uses, at each step, the line of the calibration step nearest its timestep.
"""

import logging

import pytest
import torch
from fixtures.toy import ToyTransformer

import sixbit
from sixbit.calibration import seeded
from sixbit.convert import calibration_runner
from sixbit.methods.dmpq import DMPQConfig, DMPQPredictor, apply_dmpq, fit_dmpq
from sixbit.runtime import blocks
from sixbit.zoo.shapes import all_prompts, load_pipeline

TIMESTEPS = [900, 700, 500, 300]
GRID = DMPQConfig(target_bits=6.0, step_groups=2, block_groups=1)  # 2 + 2 + 1 runs


def _toy(depth=2):
    torch.manual_seed(0)
    model = ToyTransformer(depth=depth)
    return sixbit.quantize(model, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=32))


def _sample(model, x, timesteps=TIMESTEPS):
    with torch.no_grad():
        for t in timesteps:
            x = x + 0.1 * model(x, timestep=torch.tensor([t]))
    return x


def _no_hooks_left(model):
    return not list(blocks.attached(model, blocks.BlockMethod))


# ---------------------------------------------------------------- 1. repeatable calibration runs


def test_seeded_calls_repeat_and_leave_the_callers_rng_alone():
    run = seeded(lambda: torch.randn(3))
    state = torch.get_rng_state()
    first, second = run(), run()
    assert torch.equal(first, second) and torch.equal(torch.get_rng_state(), state)
    assert torch.equal(first, torch.randn(3, generator=torch.Generator().manual_seed(0)))
    assert seeded(run) is run
    # convert_model's callable calibration_data goes through the same wrapper
    run, source = calibration_runner(lambda: torch.randn(3), None, {})
    assert torch.equal(run(), first) and source == {"source": "callable"}


def test_unseeded_callable_fits_what_a_seeded_one_fits():
    model = _toy()
    unseeded = fit_dmpq(model, lambda: _sample(model, torch.randn(1, 8, 32)), GRID)
    generator = fit_dmpq(
        model, lambda: _sample(model, torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0))), GRID
    )
    assert unseeded == generator and unseeded.threshold < float("inf")


def test_nondeterministic_callable_is_refused_at_the_first_call_that_differs():
    model = _toy()
    outside = torch.Generator().manual_seed(0)  # created once: it advances from one run to the next
    calls = []

    def run():
        calls.append(len(calls))
        return _sample(model, torch.randn(1, 8, 32, generator=outside))

    with pytest.raises(ValueError, match=r"not deterministic: run 2 gave the model other inputs .*manual_seed\(0\)"):
        fit_dmpq(model, run, GRID)
    assert len(calls) == 2 and _no_hooks_left(model)
    # fewer first-step calls than the first run: refused too
    batches = iter([2, 1])

    def fewer():
        return [_sample(model, torch.ones(1, 8, 32) * (i + 1)) for i in range(next(batches))]

    with pytest.raises(ValueError, match="made 1 first-step calls of the first block where run 1 made 2"):
        fit_dmpq(model, fewer, GRID)
    assert _no_hooks_left(model)


def test_readme_callable_without_generator_on_a_shipped_pipeline():
    """The README's ``lambda: pipe(prompts, num_inference_steps=…)`` fits as if seeded; a generator
    made outside the callable is refused on the second run's first transformer call."""
    pipe = load_pipeline("cogvideox")
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=64))
    prompts, steps, config = all_prompts()[:1], 3, DMPQConfig(error_at="block")  # two runs per fit
    readme = fit_dmpq(pipe.transformer, lambda: pipe(prompts, num_inference_steps=steps), config)
    explicit = fit_dmpq(
        pipe.transformer,
        lambda: pipe(prompts, num_inference_steps=steps, generator=torch.Generator().manual_seed(0)),
        config,
    )
    assert readme == explicit
    assert readme.num_steps == steps
    pipe.scheduler.set_timesteps(steps)
    assert readme.timesteps == pytest.approx(pipe.scheduler.timesteps.tolist())
    outside = torch.Generator().manual_seed(0)
    calls = []

    def count(module, args, kwargs):
        calls.append(1)

    handle = pipe.transformer.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with pytest.raises(ValueError, match="not deterministic: run 2"):
            fit_dmpq(pipe.transformer, lambda: pipe(prompts, num_inference_steps=steps, generator=outside), config)
    finally:
        handle.remove()
    assert len(calls) == steps + 1 and _no_hooks_left(pipe.transformer)


# ---------------------------------------------------------------- 2. another step count


def _map(dmpq):
    return [row[0] for row in dmpq.report().precision_map()]


def test_predictor_keeps_its_step_count_and_old_dicts_still_load():
    pred = DMPQPredictor(["a"], [[0.0, 0.0]], [[1.0, -1.0]], 0.0, step_starts=[0, 2], num_steps=4, timesteps=TIMESTEPS)
    data = pred.to_dict()
    assert data["num_steps"] == 4 and data["timesteps"] == [900.0, 700.0, 500.0, 300.0]
    assert DMPQPredictor.from_dict(data) == pred
    old = {k: v for k, v in data.items() if k not in ("num_steps", "timesteps")}
    assert DMPQPredictor.from_dict(old).num_steps is None and DMPQPredictor.from_dict(old).timesteps is None
    with pytest.raises(ValueError, match="3 timesteps for num_steps=4"):
        DMPQPredictor(["a"], [0.0], [0.0], 0.0, num_steps=4, timesteps=[900, 700, 500])
    with pytest.raises(ValueError, match="num_steps must be an integer"):
        DMPQPredictor(["a"], [0.0], [0.0], 0.0, num_steps=0)
    # the calibration schedule maps onto itself; other timesteps onto the nearest calibration step
    assert [pred.fitted_step(s, t) for s, t in enumerate(TIMESTEPS)] == [0, 1, 2, 3]
    assert [pred.fitted_step(s, t) for s, t in enumerate(range(900, 100, -100))] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [pred.fitted_step(s, t) for s, t in enumerate([900, 500])] == [0, 2]


def test_another_step_count_meets_the_step_ranges_at_their_timesteps(caplog):
    model = _toy(depth=1)
    # steps 0-1 of the calibration (t ≥ 700): never NVFP4; steps 2-3 (t ≤ 500): always (once Γ is known)
    fitted = DMPQPredictor(["blocks.0"], [[0.0, 0.0]], [[1.0, -1.0]], 0.0, step_starts=[0, 2], num_steps=4,
                           timesteps=TIMESTEPS)
    eight = list(range(900, 100, -100))
    dmpq = apply_dmpq(model, fitted)
    with caplog.at_level(logging.INFO, logger="sixbit.methods.dmpq.method"):
        _sample(model, torch.randn(1, 8, 32), TIMESTEPS)
        assert _map(dmpq) == ["int8", "int8", "nvfp4", "nvfp4"] and not caplog.records
        model._reset_stateful_cache()
        _sample(model, torch.randn(1, 8, 32), eight)
        _sample(model, torch.randn(1, 8, 32), eight)
    assert _map(dmpq) == ["int8"] * 4 + ["nvfp4"] * 4  # by timestep: t ≤ 500 is the NVFP4 range
    assert len(caplog.records) == 1 and "calibrated with 4 steps" in caplog.text
    # a predictor without timesteps (saved before they were kept) applies step indices as they are
    old = DMPQPredictor.from_dict({k: v for k, v in fitted.to_dict().items() if k != "timesteps"})
    caplog.clear()
    dmpq = apply_dmpq(model, old)
    with caplog.at_level(logging.WARNING, logger="sixbit.methods.dmpq.method"):
        _sample(model, torch.randn(1, 8, 32), eight)
        _sample(model, torch.randn(1, 8, 32), eight)
    assert _map(dmpq) == ["int8"] * 2 + ["nvfp4"] * 6
    assert len(caplog.records) == 1 and "calibrated with 4 steps and this run has another step schedule" in caplog.text


def test_a_single_step_calibration_is_refused_not_fitted_to_nan():
    model = _toy()
    with pytest.raises(ValueError, match="at least 2 steps"):
        fit_dmpq(model, lambda: _sample(model, torch.randn(1, 8, 32), timesteps=[900]), GRID)
    assert _no_hooks_left(model)
