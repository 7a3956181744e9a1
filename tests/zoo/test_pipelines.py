"""Both shapes pipelines on tiny randomly initialised transformers (one block each)."""

import os
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import BaseState, StateManager

from sixbit.zoo.shapes import make_pipeline
from sixbit.zoo.shapes.world import HEIGHT, NUM_FRAMES, WIDTH

ARCHS = ["cogvideox", "wan"]
PROMPTS = ["a red circle moving right", "a blue square moving up"]


@pytest.fixture(scope="module", params=ARCHS)
def pipe(request):
    p = make_pipeline(request.param, seed=0, num_layers=1)
    p.set_progress_bar_config(disable=True)
    p.arch = request.param
    return p


def _run(pipe, seed=0, **kw):
    kw.setdefault("num_inference_steps", 3)
    return pipe(PROMPTS, generator=torch.Generator().manual_seed(seed), **kw).frames


def test_fixed_seed_is_deterministic_and_seeds_differ(pipe):
    a, b, c = _run(pipe, 0), _run(pipe, 0), _run(pipe, 1)
    assert a.shape == (2, NUM_FRAMES, HEIGHT, WIDTH, 3) and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).mean() > 0.01


def test_output_types(pipe):
    pt = _run(pipe, output_type="pt")
    pil = _run(pipe, output_type="pil")
    assert pt.shape == (2, NUM_FRAMES, 3, HEIGHT, WIDTH)
    assert len(pil) == 2 and len(pil[0]) == NUM_FRAMES and isinstance(pil[0][0], PIL.Image.Image)
    np.testing.assert_allclose(pt.permute(0, 1, 3, 4, 2).numpy(), _run(pipe), atol=0)
    assert pipe(PROMPTS[0], num_inference_steps=2, num_videos_per_prompt=3).frames.shape[0] == 3


def test_bad_inputs_raise(pipe):
    with pytest.raises(ValueError, match="vocabulary"):
        pipe("a purple circle moving right", num_inference_steps=1)
    with pytest.raises(ValueError, match="output_type"):
        pipe(PROMPTS, num_inference_steps=1, output_type="gif")
    with pytest.raises(ValueError, match="num_inference_steps"):
        pipe(PROMPTS, num_inference_steps=0)


def test_a_longer_or_larger_video_is_made_and_a_size_the_model_cannot_take_is_refused(pipe):
    frames = _run(pipe, num_inference_steps=1, num_frames=4 * NUM_FRAMES).shape[1]
    assert frames == 4 * NUM_FRAMES
    if pipe.arch == "wan":  # its rotary embedding reaches 2x the trained size; CogVideoX's stops at it
        assert _run(pipe, num_inference_steps=1, height=2 * HEIGHT, width=2 * WIDTH).shape[2:4] == (2 * HEIGHT, 2 * WIDTH)
    for bad in (dict(num_frames=NUM_FRAMES + 1), dict(height=6), dict(width=1024), dict(num_frames=0)):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=.*multiples of"):
            pipe(PROMPTS, num_inference_steps=1, **bad)
    with pytest.raises(ValueError, match="latents have shape"):  # given noise must have the asked size
        pipe(PROMPTS, num_inference_steps=1, num_frames=2 * NUM_FRAMES, latents=_run(pipe, output_type="pt"))


def test_callback_on_step_end_sees_and_replaces_latents(pipe):
    seen = []

    def zero_last(p, i, t, kw):
        seen.append((i, float(t), kw["latents"].shape))
        return {"latents": torch.zeros_like(kw["latents"])} if i == 2 else {}

    frames = _run(pipe, callback_on_step_end=zero_last)
    assert [s[0] for s in seen] == [0, 1, 2]
    assert seen[0][1] > seen[1][1] > seen[2][1]  # timesteps decrease from noise to data
    np.testing.assert_allclose(frames, 0.5)  # zero latents in [-1, 1] are mid-gray


class _State(BaseState):
    def reset(self):
        pass


class _Recorder(ModelHook):
    """Records (context name, step, batch) for every transformer call, as a cache hook would see it."""

    _is_stateful = True

    def __init__(self):
        super().__init__()
        self.state_manager = StateManager(_State)
        self.calls = []

    def reset_state(self, module):  # diffusers resets stateful hooks after each generation
        return module

    def pre_forward(self, module, *args, **kwargs):
        ctx = self.state_manager.context
        self.calls.append((ctx.name, ctx.step_index, kwargs["hidden_states"].shape[0]))
        return args, kwargs


def test_cfg_branch_calls_and_cache_context():
    for arch in ARCHS:
        p = make_pipeline(arch, seed=0, num_layers=1)
        p.set_progress_bar_config(disable=True)
        rec = _Recorder()
        HookRegistry.check_if_exists_or_initialize(p.transformer).register_hook(rec, "recorder")
        p(PROMPTS, num_inference_steps=2, guidance_scale=3.0)
        if arch == "cogvideox":  # both branches batched in one call
            assert rec.calls == [("cond_uncond", 0, 4), ("cond_uncond", 1, 4)]
        else:  # one call per branch, as diffusers' Wan pipeline
            assert rec.calls == [("cond", 0, 2), ("uncond", 0, 2), ("cond", 1, 2), ("uncond", 1, 2)]
        rec.calls.clear()
        p(PROMPTS, num_inference_steps=2, guidance_scale=1.0)  # no guidance: conditional branch only
        assert [c[2] for c in rec.calls] == [2, 2] and rec.calls[0][0] in ("cond", "cond_uncond")


def test_guidance_changes_the_result(pipe):
    assert np.abs(_run(pipe, guidance_scale=1.0) - _run(pipe, guidance_scale=6.0)).mean() > 1e-4


def test_a_stochastic_scheduler_draws_its_step_noise_from_the_callers_generators(pipe):
    deterministic = pipe.scheduler
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(deterministic.config, stochastic_sampling=True)
    try:
        gens = lambda: [torch.Generator().manual_seed(s) for s in (0, 1)]  # noqa: E731
        a = pipe(PROMPTS, num_inference_steps=3, generator=gens()).frames
        torch.manual_seed(123)  # the global RNG plays no part
        b = pipe(PROMPTS, num_inference_steps=3, generator=gens()).frames
        # each video's step noise comes from its own generator: alone, the second is the same video
        alone = pipe(PROMPTS[1:], num_inference_steps=3, generator=gens()[1:]).frames
    finally:
        pipe.scheduler = deterministic
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(alone[0], a[1], atol=1e-5)
    assert np.abs(a - pipe(PROMPTS, num_inference_steps=3, generator=gens()).frames).mean() > 1e-3


def test_save_pretrained_then_from_pretrained_in_a_fresh_process(tmp_path):
    # Both architectures in one child process: one interpreter start-up instead of two.
    code = ["import numpy as np, torch", "from sixbit.zoo.shapes import load_pipeline"]
    for arch in ARCHS:
        p = make_pipeline(arch, seed=1, num_layers=1)
        p.set_progress_bar_config(disable=True)
        folder = tmp_path / arch
        p.save_pretrained(folder)
        np.save(folder / "expected.npy", _run(p, seed=3))
        code += [
            f"p = load_pipeline({arch!r}, path={str(folder)!r})",
            f"out = p({PROMPTS!r}, num_inference_steps=3, generator=torch.Generator().manual_seed(3)).frames",
            f"np.testing.assert_array_equal(out, np.load({str(folder / 'expected.npy')!r}))",
            f"print('same', {arch!r})",
        ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["same", "cogvideox", "same", "wan"]
