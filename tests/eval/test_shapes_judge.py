"""The analytic judge: right on every clean render, and it notices what is wrong."""

import itertools

import numpy as np
import PIL.Image
import pytest
import torch

from sixbit.zoo.shapes.judge import adherence, as_frames, judge_video
from sixbit.zoo.shapes.world import (
    BACKGROUNDS, COLORS, DIRECTIONS, HEIGHT, NUM_FRAMES, SHAPES, WIDTH, VideoSpec, render, sample_specs,
)


def _truth(spec):
    return spec.color, spec.shape, spec.direction


def test_judge_is_right_on_every_attribute_combination_and_background():
    wrong = []
    for i, (c, s, d, b) in enumerate(itertools.product(COLORS, SHAPES, DIRECTIONS, BACKGROUNDS)):
        spec = sample_specs(1, seed=1000 + i, color=c, shape=s, direction=d, background=b)[0]
        v = judge_video(render(spec))
        if (v.color, v.shape, v.direction) != _truth(spec) or v.detected_frames != NUM_FRAMES:
            wrong.append((spec, str(v)))
    assert not wrong


def test_judge_is_right_on_random_renders_and_they_do_not_flicker():
    specs = sample_specs(60, seed=2024)
    report = adherence([render(s) for s in specs], [s.prompt(with_background=True) for s in specs])
    assert report.accuracy == {"color": 1.0, "shape": 1.0, "direction": 1.0, "all": 1.0}
    assert report.flicker == 0.0 and not report.failures()


def test_extreme_sizes_and_speeds_are_judged_right():
    for shape, size, speed in itertools.product(SHAPES, (9.0, 12.0), (1.5, 2.0)):
        for direction in DIRECTIONS:
            spec = VideoSpec("green", shape, direction, "textured", "checker", size, speed,
                             x0=16.0 - DIRECTIONS[direction][0] * 7 * speed / 2,
                             y0=16.0 - DIRECTIONS[direction][1] * 7 * speed / 2, gray=0.5, gray2=0.3)
            assert (judge_video(render(spec)).shape, judge_video(render(spec)).direction) == (shape, direction)


def test_accepts_every_video_layout():
    spec = sample_specs(1, seed=4)[0]
    video = render(spec)  # (F, 3, H, W) torch in [0, 1]
    hwc = video.permute(0, 2, 3, 1).numpy()
    u8 = np.round(hwc * 255).astype(np.uint8)
    pil = [PIL.Image.fromarray(f) for f in u8]
    verdicts = [judge_video(v) for v in (video, hwc, u8, pil, video.numpy())]
    assert {(v.color, v.shape, v.direction) for v in verdicts} == {_truth(spec)}
    assert as_frames(u8).shape == (NUM_FRAMES, HEIGHT, WIDTH, 3)
    with pytest.raises(ValueError, match="4 dimensions"):
        as_frames(np.zeros((HEIGHT, WIDTH, 3)))


def test_no_object_and_no_motion():
    gray = np.full((NUM_FRAMES, HEIGHT, WIDTH, 3), 0.4)
    v = judge_video(gray)
    assert (v.detected_frames, v.color, v.shape, v.direction) == (0, "none", "none", "none")
    assert not any(v.matches("a red circle moving right").values())
    still = render(VideoSpec("red", "square", "right", speed=0.0))
    v = judge_video(still)
    assert (v.color, v.shape, v.direction) == ("red", "square", "none")


def test_flicker_measures_background_change_not_object_motion():
    spec = sample_specs(1, seed=9, background="textured")[0]
    clean = render(spec)
    assert judge_video(clean).flicker == 0.0
    # Brightness shimmer of +-0.05 on alternate frames: every background pixel changes by 0.1.
    shimmer = clean + torch.tensor([0.05, -0.05] * (NUM_FRAMES // 2)).view(-1, 1, 1, 1)
    f = judge_video(shimmer.clamp(0, 1)).flicker
    assert 0.08 < f <= 0.1 + 1e-6
    noisy = (clean + 0.02 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    assert 0 < judge_video(noisy).flicker < f


def test_adherence_counts_each_attribute_separately():
    specs = [VideoSpec("red", "circle", "right"), VideoSpec("blue", "square", "up")]
    videos = [render(s) for s in specs]
    prompts = ["a red circle moving left", "a green square moving up"]  # one direction, one color wrong
    report = adherence(videos, prompts)
    assert report.accuracy == {"color": 0.5, "shape": 1.0, "direction": 0.5, "all": 0.0}
    assert report.n == 2 and len(report.failures()) == 2
    assert "color 50.0%" in str(report)
    with pytest.raises(ValueError, match="one prompt per video"):
        adherence(videos, prompts[:1])
