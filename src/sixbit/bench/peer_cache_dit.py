"""cache-dit's DBCache (``pip install cache-dit``) as a peer of ``sixbit bench``, run through
cache-dit's own code: :func:`cache_dit.enable_cache` with a ``BlockAdapter``, ``DBCacheConfig``
and ``TaylorSeerCalibratorConfig``. Nothing of its method is reimplemented here.

Names (all with ``-VALUE`` = ``residual_diff_threshold``, default 0.12 as cache-dit's CLI):

====================  ==  ==  =========================  ===========================
name                  Fn  Bn  calibrator                 max_continuous_cached_steps
====================  ==  ==  =========================  ===========================
``dbcache``           1   0   none (replays residuals)   3
``dbcache-ts1``       1   0   TaylorSeer, order 1        3
``dbcache-ts2``       1   0   TaylorSeer, order 2        3
``dbcache-f1b1``      1   1   none                       3
``dbcache-f1b1-ts1``  1   1   TaylorSeer, order 1        3
``dbcache-nocap``     1   0   none                       -1 (no cap)
====================  ==  ==  =========================  ===========================

F1B0, threshold 0.12 and at most 3 cached steps in a row are the defaults of cache-dit's own
command line (``DBCacheConfig``'s dataclass defaults, F8B0 at 0.08 with no cap, are sized for models of
dozens of blocks: our shipped transformers have 4, so F8 would compute every block).
``max_warmup_steps`` is the delta cache's warm-up rule, ``max(2, round(0.2 × steps))`` (4 at 20
steps), so both caches start skipping at the same step; cache-dit's own default of 8 is sized
for 28–50-step schedules and would leave nothing to skip in short runs.

What cache-dit needs that the shipped pipelines (and diffusers' own hooks) do not give it:

* **A pipeline it knows by class name.** ``enable_cache(pipe)`` looks adapters up by the
  pipeline's class-name prefix (``CogVideoX…``, ``Wan…``); ``ShapesCogVideoXPipeline`` and
  ``ShapesWanPipeline`` match none and are refused. Its registry does know the *transformers*
  (``CogVideoXTransformer3DModel``: ``transformer_blocks``, ``ForwardPattern.Pattern_0``, blocks
  return ``(hidden, text)``; ``WanTransformer3DModel``: ``blocks``, ``Pattern_2``, blocks return
  ``hidden`` only): :func:`apply_dbcache` takes those from cache-dit's registry and binds them to
  our pipeline in a ``BlockAdapter``.
* **The CFG layout, as call parity.** cache-dit ignores diffusers' ``cache_context("cond")`` /
  ``("uncond")`` names the pipelines pass: with ``enable_separate_cfg=True`` it takes even
  transformer calls as the conditional branch and odd ones as the unconditional
  (``cfg_compute_first=False``), so it needs exactly two calls per step, conditional first (the
  Wan pipeline's order), and ``enable_separate_cfg=False`` when guidance is off (one call per
  step) or batched in one call (CogVideoX). Set here from the architecture and the guidance scale.
* **Where a generation starts.** Its per-generation state (step counter, cached steps, residual
  buffers, TaylorSeer derivatives) is reset by a wrapper cache-dit puts around the pipeline
  class's ``__call__``, *on the class*: every other pipeline of that class in the process would
  go through it too (and a second ``enable_cache`` nests a second wrapper). The harness keeps
  an FP pipeline of the same class, so :func:`apply_dbcache` first gives the cached pipeline a
  subclass of its own. Without a pipeline (transformer-only, a plain sampling loop) cache-dit
  needs ``num_inference_steps`` in its config, or it never resets (a second generation keeps
  counting steps and caches against the first's residuals). Even with it, cache-dit 1.5.3
  resets one transformer call late (it checks before advancing its step counter): on the shipped
  CogVideoX at 4 steps, two generations are seen as steps ``0 1 2 3 4 0 1 2``, so every
  generation after the first runs its first step in the old state and the rest shifted by one;
  with per-branch CFG the call parity flips too, swapping the two branches' caches. The
  pipeline-bound reset used here has neither problem (tested: a second generation gives the
  same video and the same cached steps).
* Step indices it counts itself (transformer calls), not the ``step_index`` diffusers'
  ``CacheContext`` carries.

Skipped blocks are never called (cache-dit swaps the block list for its own loop during the
forward), which the bench's work counter counts as skips.
"""

from __future__ import annotations

import dataclasses

#: cache-dit's command-line default threshold (``--rdt``).
DEFAULT_THRESHOLD = 0.12

#: Our shipped pipelines' CFG layout: True = one transformer call per branch (Wan),
#: False = both branches batched in one call (CogVideoX).
PER_BRANCH_CFG = {"cogvideox": False, "wan": True}


@dataclasses.dataclass(frozen=True)
class DBCacheVariant:
    """One registered cache-dit configuration (see the module docstring's table)."""

    name: str
    description: str
    fn: int = 1
    bn: int = 0
    taylorseer_order: int = 0  # 0: no calibrator
    max_continuous_cached_steps: int = 3  # -1: no cap


VARIANTS = (
    DBCacheVariant("dbcache", "cache-dit DBCache F1B0, ≤ 3 cached steps in a row"),
    DBCacheVariant("dbcache-ts1", "cache-dit DBCache F1B0 + TaylorSeer order 1, ≤ 3 in a row", taylorseer_order=1),
    DBCacheVariant("dbcache-ts2", "cache-dit DBCache F1B0 + TaylorSeer order 2, ≤ 3 in a row", taylorseer_order=2),
    DBCacheVariant("dbcache-f1b1", "cache-dit DBCache F1B1 (last block always computed), ≤ 3 in a row", bn=1),
    DBCacheVariant("dbcache-f1b1-ts1", "cache-dit DBCache F1B1 + TaylorSeer order 1, ≤ 3 in a row", bn=1,
                   taylorseer_order=1),
    DBCacheVariant("dbcache-nocap", "cache-dit DBCache F1B0, no cap on cached steps in a row",
                   max_continuous_cached_steps=-1),
)


def warmup_steps(steps: int) -> int:
    """Steps always computed first: the delta cache's default rule, ``max(warmup_steps,
    round(warmup_fraction × steps))`` (2 and 0.2)."""
    from ..methods.delta_cache import DeltaCacheConfig

    defaults = DeltaCacheConfig()
    return max(defaults.warmup_steps, round(defaults.warmup_fraction * steps))


def _own_class(pipe) -> None:
    """Give ``pipe`` a subclass of its own, so that cache-dit's wrapper of ``__call__`` (set on
    the class) reaches this pipeline only. Same name and module: saving and logging unchanged."""
    cls = type(pipe)
    pipe.__class__ = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})


def apply_dbcache(pipe, ctx, value, variant: DBCacheVariant) -> str:
    """Install cache-dit's DBCache on ``pipe`` (a shapes pipeline) as ``variant`` says.

    ``value``: ``residual_diff_threshold`` (default :data:`DEFAULT_THRESHOLD`); larger skips more.
    Returns the note for the tables (cache-dit's own summary of the config).
    """
    import cache_dit
    from cache_dit import (
        BlockAdapter,
        BlockAdapterRegister,
        DBCacheConfig,
        TaylorSeerCalibratorConfig,
    )

    threshold = DEFAULT_THRESHOLD if value is None else float(value)
    if threshold <= 0:
        raise ValueError(f"{variant.name}-{value:g}: the threshold must be > 0 (cache-dit never caches at 0); "
                         f"e.g. {variant.name}-{DEFAULT_THRESHOLD}")
    if ctx.arch not in PER_BRANCH_CFG:
        raise ValueError(f"{variant.name} knows the CFG layout of {sorted(PER_BRANCH_CFG)}, not {ctx.arch!r}")
    transformer = pipe.transformer
    # cache-dit's own adapter for this transformer class: which blocks, what they return
    known = BlockAdapterRegister.get_adapter(transformer, skip_post_init=True)
    if known is None:
        raise ValueError(f"cache-dit has no adapter for {type(transformer).__name__}")
    blocks = known.blocks
    if variant.fn + variant.bn > len(blocks):
        raise ValueError(f"{variant.name}: Fn + Bn = {variant.fn + variant.bn} compute blocks, "
                         f"but {type(transformer).__name__} has {len(blocks)}")
    separate_cfg = PER_BRANCH_CFG[ctx.arch] and ctx.guidance > 1  # guidance ≤ 1: one call per step
    config = DBCacheConfig(
        Fn_compute_blocks=variant.fn, Bn_compute_blocks=variant.bn, residual_diff_threshold=threshold,
        max_warmup_steps=warmup_steps(ctx.steps), max_continuous_cached_steps=variant.max_continuous_cached_steps,
        enable_separate_cfg=separate_cfg, cfg_compute_first=False,  # the Wan pipeline calls cond, then uncond
    )
    calibrator = (TaylorSeerCalibratorConfig(taylorseer_order=variant.taylorseer_order)
                  if variant.taylorseer_order else None)
    _own_class(pipe)
    cache_dit.enable_cache(
        BlockAdapter(pipe=pipe, transformer=transformer, blocks=blocks, forward_pattern=known.forward_pattern,
                     has_separate_cfg=separate_cfg),
        cache_config=config, calibrator_config=calibrator,
    )
    note = f"{config.strify()}" + (f" + {calibrator.strify(details=True)}" if calibrator else "")
    return f"{note}; cache-dit {cache_dit.__version__}, reset per pipeline call"

