"""The procedural shapes world: determinism, vocabulary, prompts and what the renders contain."""

import numpy as np
import pytest
import torch

from sixbit.zoo.shapes import world
from sixbit.zoo.shapes.world import (
    COLORS, DIRECTIONS, HELDOUT_PAIRS, NUM_FRAMES, SHAPES, VOCABULARY, VideoSpec,
    all_prompts, parse_prompt, render, sample_specs,
)


def test_world_size_and_attribute_counts_meet_the_spec():
    assert NUM_FRAMES >= 8 and world.HEIGHT >= 32 and world.WIDTH >= 32
    assert len(COLORS) >= 4 and set(SHAPES) == {"circle", "square", "triangle"}
    assert {"left", "right", "up", "down"} <= set(DIRECTIONS)
    assert set(world.BACKGROUNDS) == {"plain", "textured"}


def test_sample_specs_is_deterministic_from_the_seed():
    assert sample_specs(20, seed=7) == sample_specs(20, seed=7)
    assert sample_specs(20, seed=7) != sample_specs(20, seed=8)
    assert torch.equal(render(sample_specs(3, seed=1)), render(sample_specs(3, seed=1)))


def test_specs_cover_every_attribute_value():
    specs = sample_specs(400, seed=0)
    assert {s.color for s in specs} == set(COLORS)
    assert {s.shape for s in specs} == set(SHAPES)
    assert {s.direction for s in specs} == set(DIRECTIONS)
    assert {s.background for s in specs} == set(world.BACKGROUNDS)


def test_size_range_is_drawn_and_checked():
    specs = sample_specs(200, seed=1, size_range=(13.0, 16.0))
    assert 13.0 <= min(s.size for s in specs) and max(s.size for s in specs) <= 16.0
    # The largest allowed object, on its longest travel, still never touches the border pixels.
    video = render(sample_specs(100, seed=2, size_range=(16.0, 16.0))).numpy()
    sat = video.max(axis=2) - video.min(axis=2)  # (B, F, H, W)
    assert sat[..., 0, :].max() == sat[..., -1, :].max() == sat[..., 0].max() == sat[..., -1].max() == 0
    for bad in ((0.0, 10.0), (12.0, 9.0), (13.0, 17.0)):
        with pytest.raises(ValueError, match="size_range"):
            sample_specs(1, seed=0, size_range=bad)


def test_jitter_keeps_trajectories_around_the_center():
    # Every allowed size leaves room for a centered trajectory, so clipping only moves it closer.
    for jitter in (0.0, 3.0):
        specs = sample_specs(100, seed=3, size_range=(9.0, 16.0), jitter=jitter)
        for spec in specs:
            c = spec.centers()
            assert (np.abs((c[0] + c[-1]) / 2 - world.WIDTH / 2) <= jitter + 1e-9).all()
            assert (c - spec.size / 2 >= 1 - 1e-9).all() and (c + spec.size / 2 <= world.WIDTH - 1 + 1e-9).all()
        assert jitter == 0 or len({round(s.x0 + s.y0, 3) for s in specs}) > 50
    assert sample_specs(5, seed=1) == sample_specs(5, seed=1, size_range=world.SIZE_RANGE, jitter=world.JITTER)
    with pytest.raises(ValueError, match="jitter"):
        sample_specs(1, seed=0, jitter=-1.0)


def test_render_shape_range_and_fixed_attributes():
    specs = sample_specs(4, seed=3, color="blue", shape="triangle")
    video = render(specs)
    assert video.shape == (4, NUM_FRAMES, 3, world.HEIGHT, world.WIDTH)
    assert video.dtype == torch.float32 and video.min() >= 0 and video.max() <= 1
    assert all(s.color == "blue" and s.shape == "triangle" for s in specs)
    assert render(specs[0]).shape == (NUM_FRAMES, 3, world.HEIGHT, world.WIDTH)


@pytest.mark.parametrize("background", ["plain", "textured"])
def test_backgrounds_are_gray_and_objects_saturated(background):
    for spec in sample_specs(12, seed=5, background=background):
        video = render(spec).numpy()
        sat = video.max(axis=1) - video.min(axis=1)  # (F, H, W)
        # Pixels far from the object are exactly gray; the object's core is strongly saturated.
        assert np.isclose(np.sort(sat, axis=None)[: sat.size // 2], 0).all()
        assert sat.max() >= 0.6
        if background == "textured":
            assert len(np.unique(np.round(video[0][:, sat[0] == 0], 6))) >= 2


def test_object_stays_inside_the_frame_and_moves_along_its_direction():
    for spec in sample_specs(50, seed=11):
        video = render(spec).numpy()
        sat = video.max(axis=1) - video.min(axis=1)
        # The object never touches the border pixels, and its box keeps a 1 px margin.
        assert sat[:, 0].max() == sat[:, -1].max() == sat[:, :, 0].max() == sat[:, :, -1].max() == 0
        dx, dy = DIRECTIONS[spec.direction]
        c = spec.centers()
        assert (c - spec.size / 2 >= 1 - 1e-9).all()
        assert (c[:, 0] + spec.size / 2 <= world.WIDTH - 1 + 1e-9).all()
        assert (c[:, 1] + spec.size / 2 <= world.HEIGHT - 1 + 1e-9).all()
        np.testing.assert_allclose(c[-1] - c[0], np.array([dx, dy]) * spec.speed * (NUM_FRAMES - 1))


def test_prompts_and_vocabulary():
    prompts = all_prompts()
    assert len(prompts) == len(set(prompts)) == len(COLORS) * len(SHAPES) * len(DIRECTIONS)
    assert all(w in VOCABULARY for p in prompts for w in p.split())
    spec = VideoSpec("red", "circle", "right", background="textured")
    assert spec.prompt() == "a red circle moving right"
    assert spec.prompt(with_background=True) == "a red circle moving right on a textured background"
    assert all(w in VOCABULARY for w in spec.prompt(with_background=True).split())
    assert len(HELDOUT_PAIRS) == 48 and {p for p, _ in HELDOUT_PAIRS} == set(prompts)
    assert min(s for _, s in HELDOUT_PAIRS) >= 10_000


def test_parse_prompt_and_its_errors():
    assert parse_prompt("A Green square moving up on a plain background") == {
        "color": "green", "shape": "square", "direction": "up", "background": "plain"}
    with pytest.raises(ValueError, match="vocabulary"):
        parse_prompt("a purple circle moving right")
    with pytest.raises(ValueError, match="shape"):
        parse_prompt("a red moving right")
    with pytest.raises(ValueError, match="color"):
        VideoSpec("purple", "circle", "left")


def test_heldout_pairs_spread_over_all_prompts():
    from sixbit.zoo.shapes import HELDOUT_PAIRS, heldout_pairs

    assert heldout_pairs(48) == list(HELDOUT_PAIRS)
    four = heldout_pairs(4)
    assert four == [HELDOUT_PAIRS[i] for i in (0, 12, 24, 36)]
    assert len({p.split()[1] for p, _ in four}) == 4  # one pair per color
    with pytest.raises(ValueError, match="1…48"):
        heldout_pairs(49)
