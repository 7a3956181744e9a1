"""cache-dit's DBCache as a bench peer, through cache-dit itself, on both shipped pipelines (4 steps)."""

import sys

import numpy as np
import pytest
import torch

from sixbit.bench.counting import WorkCounter
from sixbit.bench.harness import BenchSettings, _Runner
from sixbit.bench.methods import BenchContext, resolve
from sixbit.eval.metrics import psnr
from sixbit.zoo.shapes.judge import generate_heldout
from sixbit.runtime import track_steps
from sixbit.zoo.shapes import load_pipeline

PAIRS = [("a red circle moving right", 3)]
STEPS = 4  # warm-up max(2, round(0.8)) = 2: steps 2 and 3 may be cached


def _generate(pipe):
    videos, _ = generate_heldout(pipe, PAIRS, STEPS, 4.0)
    return videos


@pytest.mark.parametrize("arch, name", [("wan", "dbcache-ts1-0.8"), ("cogvideox", "dbcache-0.8")])
def test_dbcache_skips_blocks_and_resets_per_generation(arch, name):
    cache_dit = pytest.importorskip("cache_dit")
    fp_pipe = load_pipeline(arch)
    reference = _generate(fp_pipe)

    pipe = load_pipeline(arch)
    method, value = resolve(name)
    note = method.apply(pipe, BenchContext(arch, STEPS, 4.0, None, 0), value)
    assert method.family == "cache-dit" and "F1B0" in note and "MC3" in note
    track_steps(pipe.transformer)
    counter = WorkCounter(pipe.transformer)
    with torch.no_grad(), counter:
        first = _generate(pipe)
    counter.remove()

    # cache-dit's own statistics: step 2's residual diff is under 0.8 (measured: over 0.7 on cogvideox,
    # over 0.6 on wan), step 3's (≈ 1) is not
    stats = cache_dit.summary(pipe, logging=False)[0]
    per_branch = arch == "wan"  # two transformer calls per step, told apart by call parity
    assert stats.cached_steps == [2]
    assert stats.cfg_cached_steps == ([2] if per_branch else [])
    # the bench's counter sees the same: blocks 1..3 of step 2 never called, in each CFG call
    totals = counter.totals()
    calls = STEPS * (2 if per_branch else 1)
    blocks = len(pipe.transformer.blocks if per_branch else pipe.transformer.transformer_blocks)
    assert totals.block_calls == calls * blocks
    assert totals.blocks_skipped == (2 if per_branch else 1) * (blocks - 1)
    _, grid = counter.grid()
    assert grid[2] == ["fp"] + ["skip"] * (blocks - 1) and "skip" not in grid[1] + grid[3]

    assert np.isfinite(first).all()
    assert psnr(first[0], reference[0]) > 15  # one of four steps replayed: close-ish, not equal
    # a second generation starts from a fresh cache state: the same video, the same cached steps
    second = _generate(pipe)
    np.testing.assert_array_equal(first, second)
    assert cache_dit.summary(pipe, logging=False)[0].cached_steps == [2]
    # cache-dit wraps __call__ on the pipeline's class: our pipeline has its own, the FP one is untouched
    assert type(pipe) is not type(fp_pipe) and isinstance(pipe, type(fp_pipe))
    assert not getattr(type(fp_pipe), "_is_cached", False)
    np.testing.assert_array_equal(_generate(fp_pipe), reference)


def test_missing_cache_dit_is_reported_not_dropped(monkeypatch):
    monkeypatch.setitem(sys.modules, "cache_dit", None)  # `import cache_dit` raises ImportError
    method, _ = resolve("dbcache-ts2-0.1")
    assert "cache_dit" in method.unavailable() and "[bench]" in method.unavailable()
    runner = _Runner(BenchSettings("shapes-wan", ["dbcache-ts2-0.1"], prompts=1, steps=2))
    row, videos, _ = runner.measure("dbcache-ts2-0.1", None)
    assert row["status"] == "could not run" and "cache_dit" in row["note"] and videos is None


def test_zero_threshold_is_an_error():
    pytest.importorskip("cache_dit")
    ctx = BenchContext("wan", STEPS, 4.0, None, 0)
    method, value = resolve("dbcache-0")
    with pytest.raises(ValueError, match="threshold must be > 0"):
        method.apply(load_pipeline("wan"), ctx, value)
