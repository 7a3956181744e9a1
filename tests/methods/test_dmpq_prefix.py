"""DMPQ's video-cost runs reuse the base run's first steps (``sixbit.methods.dmpq.prefix``):
the same predictor as running every cell in full, with fewer block computations, and a full run
wherever the reuse cannot stand in for one."""

import logging

import pytest
import torch
from fixtures.toy import RescaledToy, ToyTransformer

import sixbit
import sixbit.methods.dmpq.fit as dmpq_fit
from sixbit.methods.dmpq import DMPQConfig, fit_dmpq
from sixbit.runtime import blocks

TIMESTEPS = [900, 700, 500, 300, 100]
GRID = DMPQConfig(target_bits=6.0, error_at="video", step_groups=3, block_groups=2)  # a cell per step × block range


def _model(cls=ToyTransformer):
    torch.manual_seed(0)
    return sixbit.quantize(cls(depth=3), sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=32))


def _run(model, stray_after: int | None = None):
    """Two generations per run (the cost map's runs hold several); ``stray_after``: from that
    run on, the sampler moves the latents after the second step (a run that repeats only its
    first step)."""
    runs = []

    def run():
        runs.append(1)
        videos = []
        for seed in (1, 2):
            x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                for i, t in enumerate(TIMESTEPS):
                    x = x + 0.1 * model(x, timestep=torch.tensor([t, t]))
                    if stray_after is not None and len(runs) > stray_after and i == 1:
                        x = x + 0.01
            videos.append(x)
        return videos
    return run


def _fit(model, run, monkeypatch, reuse: bool):
    computed = []
    handles = [b.proj.register_forward_pre_hook(lambda m, a: computed.append(1)) for b in model.blocks]
    if not reuse:  # no memory for the recording: every cell runs in full
        monkeypatch.setattr(dmpq_fit, "total_memory", lambda device: 0)
    try:
        return fit_dmpq(model, run, GRID), len(computed)
    finally:
        for h in handles:
            h.remove()
        monkeypatch.undo()


def test_reusing_the_base_runs_first_steps_fits_the_same_predictor_with_less_work(monkeypatch):
    model = _model()
    reused, work = _fit(model, _run(model), monkeypatch, reuse=True)
    full, full_work = _fit(model, _run(model), monkeypatch, reuse=False)
    assert (reused.alpha, reused.beta, reused.threshold) == (full.alpha, full.beta, full.threshold)
    # the cells of steps [1, 2], [3] and [4] (each for 2 block groups) skip 1, 3 and 4 steps of each
    # of the run's 2 generations, every one of the 3 blocks
    assert full_work - work == (1 + 3 + 4) * 2 * 2 * 3
    assert not list(blocks.attached(model, blocks.BlockMethod))
    # the INT8 copies kept while fitting (converted once, not per call) are gone
    assert all(m.converted_nbytes() == 0 and not m.cache_converted for m in blocks.quant_linears(model))


def test_a_run_that_strays_after_its_first_steps_runs_its_cells_in_full(monkeypatch, caplog):
    model = _model()
    full, _ = _fit(model, _run(model, stray_after=2), monkeypatch, reuse=False)
    with caplog.at_level(logging.WARNING, logger="sixbit.methods.dmpq.fit"):
        reused, _ = _fit(model, _run(model, stray_after=2), monkeypatch, reuse=True)
    assert "differs from the base run's; this and every later cell run in full" in caplog.text
    assert (reused.alpha, reused.beta, reused.threshold) == (full.alpha, full.beta, full.threshold)


def test_a_model_with_code_between_its_blocks_runs_every_cell_in_full(monkeypatch, caplog):
    model = _model(RescaledToy)
    with caplog.at_level(logging.INFO, logger="sixbit.methods.dmpq.fit"):
        _, work = _fit(model, _run(model), monkeypatch, reuse=True)
    assert "every cell runs in full (RescaledToy changes the hidden states between its blocks)" in caplog.text
    _, full_work = _fit(model, _run(model), monkeypatch, reuse=False)
    assert work == full_work
