import pytest
import torch
from diffusers.hooks.hooks import CacheContext

from sixbit.runtime import BATCHED, track_steps, tracker_of
from fixtures.tiny_models import build_tiny
from fixtures.toy import ToyTransformer

TIMESTEPS = [999, 750, 500, 250]


def _infos(model, tracker, calls):
    out = []
    for t, kwargs in calls:
        model(torch.randn(2, 5, 32), timestep=torch.tensor([t, t]), **kwargs)
        out.append((tracker.info.generation, tracker.info.step, tracker.info.branch))
    return out


def test_plain_loop_two_calls_per_step_and_restart():
    model = ToyTransformer()
    tracker = track_steps(model)
    seen = _infos(model, tracker, [(t, {}) for t in TIMESTEPS for _ in range(2)] * 2)
    expected = [(g, s, b) for g in (0, 1) for s in range(4) for b in ("cond", "uncond")]
    assert seen == expected
    assert tracker.info.timestep == 250.0


def test_plain_loop_no_cfg_and_batched_cfg():
    model = ToyTransformer()
    tracker = track_steps(model)
    assert _infos(model, tracker, [(t, {}) for t in TIMESTEPS]) == [(0, s, "cond") for s in range(4)]
    track_steps(model, batched_cfg=True)
    tracker.new_generation()
    seen = _infos(model, tracker, [(t, {}) for t in TIMESTEPS])
    assert [b for *_, b in seen] == [BATCHED] * 4 and [s for _, s, _ in seen] == [0, 1, 2, 3]
    assert tracker.info.batch_branches(4) == ["uncond", "uncond", "cond", "cond"]
    with pytest.raises(ValueError, match="even batch"):
        tracker.info.batch_branches(3)


def test_explicit_branch_in_plain_loop():
    model = ToyTransformer()
    tracker = track_steps(model)
    x = torch.randn(1, 4, 32)
    with tracker.branch("uncond"):
        model(x, timestep=torch.tensor([999]))
    assert tracker.info.branch == "uncond"
    with tracker.branch("cond"):
        model(x, timestep=torch.tensor([999]))
    assert (tracker.info.step, tracker.info.branch) == (0, "cond")


def test_diffusers_cache_context_names_and_step_index():
    model = ToyTransformer()
    tracker = track_steps(model)
    x = torch.randn(1, 4, 32)
    seen = []
    for gen in range(2):
        for i, t in enumerate(TIMESTEPS):
            for name in ("cond", "uncond"):
                with model.cache_context(name, step_index=i):
                    model(x, timestep=torch.tensor([t]))
                seen.append((tracker.info.generation, tracker.info.step, tracker.info.branch))
    assert seen == [(g, s, b) for g in (0, 1) for s in range(4) for b in ("cond", "uncond")]
    with model.cache_context(BATCHED):
        model(torch.randn(2, 4, 32), timestep=torch.tensor([999, 999]))
    assert tracker.info.branch == BATCHED and tracker.info.generation == 2


def test_repeated_branch_at_one_timestep_is_a_new_generation():
    model = ToyTransformer()
    tracker = track_steps(model)
    x = torch.randn(1, 4, 32)
    for _ in range(2):  # one-step generations: same timestep every run
        with model.cache_context("cond"):
            model(x, timestep=torch.tensor([999]))
    assert tracker.info.generation == 1 and tracker.info.step == 0


def test_state_per_branch_and_reset():
    model = ToyTransformer()
    tracker = track_steps(model)
    owner = object()
    x = torch.randn(1, 4, 32)
    model(x, timestep=torch.tensor([999]))
    cond = tracker.state(owner, dict)
    cond["seen"] = 1
    model(x, timestep=torch.tensor([999]))
    assert tracker.info.branch == "uncond" and tracker.state(owner, dict) == {}
    assert tracker.state(owner, dict, branch="cond") is cond
    model._reset_stateful_cache()  # what a diffusers pipeline does at the end of __call__
    assert tracker.info is None
    model(x, timestep=torch.tensor([500]))
    assert tracker.state(owner, dict, branch="cond") == {}


def test_install_once_and_errors():
    model = ToyTransformer()
    assert tracker_of(model) is None
    tracker = track_steps(model)
    assert track_steps(model) is tracker and tracker_of(model) is tracker
    with pytest.raises(ValueError, match="timestep"):
        model(torch.randn(1, 4, 32), None)
    with pytest.raises(RuntimeError, match="no transformer call"):
        tracker.new_generation() or tracker.state(object(), dict)


@pytest.mark.parametrize("name", ["cogvideox", "wan", "hunyuanvideo", "ltx", "mochi", "allegro", "latte"])
def test_every_architecture_reports_steps(name):
    tm = build_tiny(name)
    tracker = track_steps(tm.model)
    seen = []
    with torch.no_grad():
        for t in (900, 100):
            for _ in range(2):
                tm.model(**tm.inputs(1, torch.tensor(t)))
                seen.append((tracker.info.step, tracker.info.branch, tracker.info.timestep))
    assert seen == [(0, "cond", 900.0), (0, "uncond", 900.0), (1, "cond", 100.0), (1, "uncond", 100.0)]


def test_context_object_is_the_diffusers_one():
    # the tracker reads diffusers' CacheContext; a plain object with the same fields also works
    tracker = track_steps(ToyTransformer())
    info = tracker.observe(999.0, CacheContext("cond", step_index=0))
    assert (info.step, info.branch) == (0, "cond")
