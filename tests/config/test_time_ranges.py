import math

import pytest
import torch

from sixbit.config import time_ranges as tr


def test_group_steps_counts_per_step_and_explicit():
    assert tr.group_steps(20, 4) == [(0, 4), (5, 9), (10, 14), (15, 19)]
    assert tr.group_steps(10, 3) == [(0, 3), (4, 6), (7, 9)]  # the longer ranges first
    assert tr.group_steps(3, 1) == [(0, 2)]
    assert tr.group_steps(3, "per_step") == [(0, 0), (1, 1), (2, 2)]
    assert tr.group_steps(5, [(0, 1), (2, 4)]) == [(0, 1), (2, 4)]
    assert tr.range_of_steps([(0, 1), (2, 4)]) == [0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    "ranges, match",
    [(0, "1…5"), (6, "1…5"), ([(0, 1), (3, 4)], "gaps"), ([(0, 2), (2, 4)], "overlaps"), ([(0, 3)], "5 steps"),
     ("weekly", "count")],
)
def test_group_steps_rejects_bad_ranges(ranges, match):
    with pytest.raises(ValueError, match=match):
        tr.group_steps(5, ranges)


def test_gaussian_weights_by_hand():
    w = tr.gaussian_weights(3, 1.0)
    e1, e2 = math.exp(-0.5), math.exp(-2.0)
    assert w[0].tolist() == pytest.approx([1 / (1 + e1 + e2), e1 / (1 + e1 + e2), e2 / (1 + e1 + e2)])
    assert w[1].tolist() == pytest.approx([e1 / (1 + 2 * e1), 1 / (1 + 2 * e1), e1 / (1 + 2 * e1)])
    assert torch.equal(tr.gaussian_weights(4, 0.0), torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="sigma"):
        tr.gaussian_weights(3, -1.0)


def test_gaussian_smooth_keeps_constants_and_spreads_a_peak():
    const = torch.full((4, 2, 3), 7.0)
    assert torch.allclose(tr.gaussian_smooth(const, 1.5), const)
    peak = torch.tensor([0.0, 3.0, 0.0])
    e1 = math.exp(-0.5)
    expected = [3 * e1 / (1 + e1 + math.exp(-2)), 3 / (1 + 2 * e1), 3 * e1 / (1 + e1 + math.exp(-2))]
    assert tr.gaussian_smooth(peak, 1.0).tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.equal(tr.gaussian_smooth(peak, 0.0), peak)


def test_interpolation_between_range_centres():
    # Ranges of 5 steps: centres 2 and 7; step 4 is 2/5 of the way from range 0 to range 1.
    w = tr.interpolation_weights([(0, 4), (5, 9)])
    assert w[:3] == [(0, 0, 0.0)] * 3
    assert w[4] == (0, 1, pytest.approx(0.4))
    assert w[5] == (0, 1, pytest.approx(0.6))
    assert w[7:] == [(1, 1, 0.0)] * 3
    assert tr.interpolation_weights([(0, 4), (5, 9)], interpolate=False) == [(0, 0, 0.0)] * 5 + [(1, 1, 0.0)] * 5
    assert tr.interpolation_weights([(0, 1), (2, 3)]) == [(0, 0, 0.0), (0, 1, 0.25), (0, 1, 0.75), (1, 1, 0.0)]


def test_nearest_step():
    ts = [999.0, 750.0, 500.0]
    assert tr.nearest_step(ts, 999.0) == 0
    assert tr.nearest_step(ts, 620.0) == 2  # 120 from 500, 130 from 750
    assert tr.nearest_step(ts, 625.0) == 1  # a tie goes to the earlier step
    assert tr.nearest_step(ts, 0.0) == 2
