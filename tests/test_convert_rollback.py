"""convert_model never leaves a model half-converted: a failure at any stage (weight quantization,
calibration and each of its runs, installing each runtime method) restores every weight, every
module and every output, removes every sixbit hook, and raises the original error only."""

import dataclasses
import importlib
import logging

import pytest
import torch

import sixbit
from sixbit.methods import registry
from sixbit.presets import resolve
from fixtures.tiny_models import build_tiny, sample

STEPS = 2


class Injected(Exception):
    """The failure a test injects: nothing else raises it."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors (see tests/models/test_every_transformer.py)
    yield
    torch.set_num_threads(threads)


def _config(preset: str):
    config = resolve(preset)
    if config.dmpq is not None:  # one grid cell: record, base, cell and refine runs, in that order;
        # NVFP4 on this CPU too (balanced maps DMPQ to INT8 where FP4 GEMMs are missing), so DMPQ runs
        config = dataclasses.replace(config, dmpq=dataclasses.replace(config.dmpq, step_groups=1, block_groups=1,
                                                                      low="nvfp4"))
    return config


def _raising(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


def _snapshot(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [(name, type(m)) for name, m in model.named_modules()],
    )


def _sixbit_hooks(model) -> list[str]:
    found = []
    for name, module in model.named_modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            found += [f"{name or '<model>'}:{hook}" for hook in registry.hooks if hook.startswith("sixbit")]
    return found


def _assert_restored(tm, snapshot, video, caplog):
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the rollback itself went fine
    state, modules = snapshot
    assert [(name, type(m)) for name, m in tm.model.named_modules()] == modules
    now = tm.model.state_dict()
    assert list(now) == list(state)
    assert all(now[k].dtype == state[k].dtype and torch.equal(now[k], state[k]) for k in state)
    assert _sixbit_hooks(tm.model) == []
    assert sixbit.conversion_of(tm.model) is None and not hasattr(tm.model, "save")
    assert torch.equal(sample(tm, STEPS), video)


def _convert_and_fail(tm, preset, stabilize=False, fail_run=None):
    """convert_model with the model's own sampling loop as calibration; ``fail_run``: the
    calibration call (1-based) that raises instead of sampling."""
    calls = []

    def run():
        calls.append(1)
        if len(calls) == fail_run:
            raise Injected(f"calibration run {fail_run}")
        return sample(tm, 4 if preset == "w8a8-static" else STEPS)

    config = _config(preset)
    with pytest.raises(Injected) as info:
        sixbit.convert_model(tm.model, run if config.needs_calibration else None, config, stabilize_frames=stabilize)
    return info.value, len(calls)


# (where, name, preset, stabilize_frames): every function convert_model calls that changes the model;
# ``where`` is a module, or "method:<name>" for the apply of a registered method
STAGES = [
    ("sixbit.convert", "quantize", "w4a8", False),
    ("sixbit.convert", "quantize", "balanced", False),
    ("sixbit.methods.static_w8a8.spec", "calibrate", "w8a8-static", False),
    ("sixbit.methods.static_w8a8.spec", "apply_static_w8a8", "w8a8-static", False),
    ("sixbit.methods.dmpq.spec", "fit_dmpq", "w4a6-dynamic", False),
    ("method:dmpq", "apply_dmpq", "balanced", True),
    ("method:stabilize", "apply_stabilizer", "balanced", True),
    ("method:cache", "enable_delta_cache", "balanced", True),
    ("method:cache", "enable_delta_cache", "tdc", False),
]


@pytest.fixture
def replace_stage():
    """``replace_stage(where, name, fn)``: the real function, replaced by ``fn`` for this test."""
    undo = []

    def replace(where, name, fn):
        if where.startswith("method:"):
            spec = registry.method(where.removeprefix("method:"))
            registry.register_method(dataclasses.replace(spec, apply=fn))
            undo.append(lambda: registry.register_method(spec))
            return spec.apply
        module = importlib.import_module(where)
        real = getattr(module, name)
        setattr(module, name, fn)
        undo.append(lambda: setattr(module, name, real))
        return real

    yield replace
    for fn in reversed(undo):
        fn()


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize(("where", "stage", "preset", "stabilize"), STAGES)
def test_a_failing_stage_restores_the_model(where, stage, preset, stabilize, when, replace_stage, caplog):
    """``before``: the stage raises instead of running; ``after``: it does its work, then raises."""
    tm = build_tiny("cogvideox")
    snapshot, video = _snapshot(tm.model), sample(tm, STEPS)
    ran = []

    def failing(*args, **kwargs):
        if when == "after":
            ran.append(real(*args, **kwargs))
        raise Injected(stage)

    real = replace_stage(where, stage, failing)
    error, _ = _convert_and_fail(tm, preset, stabilize)
    assert error.args == (stage,)
    assert len(ran) == (when == "after")
    _assert_restored(tm, snapshot, video, caplog)


@pytest.mark.parametrize(("preset", "fail_run"), [
    ("w8a8-static", 1),  # calibrate's statistics run
    ("balanced", 1),  # fit_dmpq: the run recording every block in both precisions
    ("balanced", 2),  # the INT8 base videos
    ("balanced", 3),  # the grid cell's NVFP4 videos
    ("balanced", 4),  # the refine run, DMPQ switching for real
])
def test_a_failing_calibration_run_restores_the_model(preset, fail_run, caplog):
    tm = build_tiny("cogvideox")
    snapshot, video = _snapshot(tm.model), sample(tm, STEPS)
    error, calls = _convert_and_fail(tm, preset, fail_run=fail_run)
    assert error.args == (f"calibration run {fail_run}",)
    assert calls == fail_run
    _assert_restored(tm, snapshot, video, caplog)
    # nothing is left behind that stops a later conversion
    sixbit.convert_model(tm.model, lambda: sample(tm, 4 if preset == "w8a8-static" else STEPS), _config(preset))
    assert sixbit.conversion_of(tm.model) is not None


def test_rollback_of_a_generic_model_after_quantization(replace_stage, caplog):
    """Helios has no registered metadata: the generic fallback must still find its blocks once
    every block linear is a QuantLinear, or the rollback itself fails."""
    tm = build_tiny("helios")
    assert sixbit.models.spec_for(tm.model).name == "generic"
    snapshot, video = _snapshot(tm.model), sample(tm, STEPS)
    real = registry.method("cache").apply

    def failing(model, config):
        real(model, config)
        raise Injected("enable_delta_cache")

    replace_stage("method:cache", "enable_delta_cache", failing)
    error, _ = _convert_and_fail(tm, "balanced")
    assert error.args == ("enable_delta_cache",)
    _assert_restored(tm, snapshot, video, caplog)


def test_a_step_tracker_installed_before_survives_the_rollback(monkeypatch):
    tm = build_tiny("cogvideox")
    tracker = sixbit.track_steps(tm.model)
    monkeypatch.setattr(sixbit.methods.dmpq.spec, "fit_dmpq", _raising(Injected("fit_dmpq")))
    _convert_and_fail(tm, "w4a6-dynamic")
    assert _sixbit_hooks(tm.model) == ["<model>:sixbit_step_context"]
    assert sixbit.track_steps(tm.model) is tracker


def test_an_error_while_rolling_back_is_logged_and_the_original_error_raised(caplog):
    tm = build_tiny("cogvideox")
    snapshot = _snapshot(tm.model)
    spec = registry.method("dmpq")
    registry.register_method(dataclasses.replace(
        spec, apply=_raising(Injected("apply_dmpq")), remove=_raising(RuntimeError("rollback broke"))))
    try:
        error, _ = _convert_and_fail(tm, "w4a6-dynamic")
    finally:
        registry.register_method(spec)
    assert error.args == ("apply_dmpq",)
    assert [r.exc_info[1].args for r in caplog.records if r.levelno >= logging.ERROR] == [("rollback broke",)]
    # the weights went back before the failing hook removal
    assert [(name, type(m)) for name, m in tm.model.named_modules()] == snapshot[1]
