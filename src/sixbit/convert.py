"""One call from a diffusers model to a converted one: :func:`convert_model`.

``convert_model`` resolves the config (:mod:`sixbit.presets`), checks the calibration data,
then quantizes the weights, fits and installs the runtime methods the config selects, in place.
The methods are those of the registry (:mod:`sixbit.methods.registry`), in its order; what was
done is the :class:`~sixbit.methods.record.Conversion` record, written into checkpoints by
:func:`sixbit.save` and rebuilt by :func:`sixbit.load`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .checkpoint import finish
from .builder import LayerSwap, conversion_device, moved_to, quantize, spilling
from .calibration import seeded
from .calibration.quality import as_videos
from .calibration.videos import read_videos, video_runner
from .methods.record import Conversion, conversion_of, install, remove_methods
from .memory.fast_path import check_choice
from .methods.default_precision import DefaultPrecision
from .methods.registry import methods
from .methods.stabilize import StabilizeConfig
from .models import transformer_of
from .nn.pointwise_conv import is_quantizable
from .preflight import check_convertible
from .presets import ConvertConfig, for_device, resolve
from .runtime import hooks
from .runtime.context import HOOK_NAME as STEP_HOOK_NAME
from .runtime.context import tracker_of

logger = logging.getLogger(__name__)


def calibration_runner(data, pipe, calibration_kwargs: dict) -> tuple[Callable[[], object], dict]:
    """Check ``calibration_data`` and return (run, description) without running anything.

    A callable is run under a fixed global seed (:func:`sixbit.calibration.seeded`), so a
    pipeline called without a ``generator`` repeats itself; the caller's RNG state is kept.
    """
    if callable(data):
        return seeded(data), {"source": "callable"}
    if isinstance(data, (list, tuple)):
        if not data or not all(isinstance(p, str) and p.strip() for p in data):
            raise ValueError("calibration prompts must be a non-empty list of non-empty strings")
        if pipe is None:
            raise ValueError("calibration prompts need a pipeline: pass the pipeline itself, or pipeline=pipe")
        prompts = list(data)
        batch = int(calibration_kwargs.pop("batch_size", 4))

        def run():
            return [
                pipe(prompts[i:i + batch], generator=torch.Generator().manual_seed(i), **calibration_kwargs).frames
                for i in range(0, len(prompts), batch)
            ]

        return run, {"source": "prompts", "count": len(prompts)}
    if isinstance(data, (str, os.PathLike)):
        if pipe is None:
            raise ValueError("calibration from a video folder needs a pipeline: pass the pipeline itself, or pipeline=pipe")
        videos = read_videos(data)
        return video_runner(pipe, videos, **calibration_kwargs), {"source": "videos", "count": len(videos), "folder": Path(data).name}
    raise ValueError(
        "calibration_data must be a callable that runs generations, a list of prompts (with a pipeline) "
        f"or a folder of videos/frames, got {type(data).__name__}"
    )


def _calibration(config: ConvertConfig, chosen: dict, data, pipe, calibration_kwargs: dict | None):
    """``(run, description)`` of the calibration the weights or a ``chosen`` method needs, or ``(None, None)``."""
    weights = config.weights is not None and config.weights.needs_calibration
    if not weights and not any(spec.calibrates(chosen[spec.name]) for spec in methods() if spec.name in chosen):
        if data is not None:
            logger.info("calibration_data is not used by activations=%r", config.activations)
        return None, None
    if data is None:
        raise ValueError(
            f"{config.calibration_reason()} needs calibration_data (prompts, videos or a callable); "
            "or choose a preset without calibration, e.g. 'w4a8-rtn' or 'w8a8'"
        )
    return calibration_runner(data, pipe, dict(calibration_kwargs or {}))


def _undo(model: nn.Module, swap: LayerSwap, tracked: bool) -> None:
    """Put every original layer back and remove the runtime hooks (after a failed conversion).

    ``tracked``: the model had a step tracker before the conversion; otherwise the one that
    calibration or a runtime method installed goes too. Layers go back first: that cannot fail,
    and a hook left on a discarded layer no longer matters.
    """
    swap.rollback()
    remove_methods(model)
    if not tracked:
        hooks.remove(model, STEP_HOOK_NAME)


def _quantize_and_fit(transformer: nn.Module, config: ConvertConfig, chosen: dict, run, calibration: dict | None) -> dict:
    """Quantize ``transformer``'s weights as ``config`` says, then fit each chosen method that
    needs calibration; what each method is applied with. A fit that compares with the
    full-precision model (``MethodSpec.reference``) gets its calibration videos, run first."""
    reference = None
    if config.weights is not None:
        if any(spec.reference and spec.calibrates(chosen[spec.name]) for spec in methods() if spec.name in chosen):
            logger.info("calibration generations of the full-precision model (the reference of a PSNR target)")
            reference = as_videos(run())
        logger.info("quantizing weights%s", " (GPTQ: one calibration run, then each block replays its inputs)" if config.weights.gptq else "")
        quantize(transformer, config.weights, calibration=run)
    return fit_methods(transformer, chosen, run, calibration, reference)


def fit_methods(transformer: nn.Module, chosen: dict, run, calibration: dict | None, reference=None) -> dict:
    """What each ``chosen`` method is applied with: its config, or what its fit returns
    (``run``: the calibration, ``None`` when no chosen method needs one; ``reference``: the
    full-precision model's calibration videos, ``None`` when the model is still in full precision)."""
    applied = {}
    for spec in methods():
        if spec.name not in chosen:
            continue
        if spec.fit is None:
            applied[spec.name] = chosen[spec.name]
        elif spec.reference:
            applied[spec.name] = spec.fit(transformer, chosen[spec.name], run, calibration, reference=reference)
        else:
            applied[spec.name] = spec.fit(transformer, chosen[spec.name], run, calibration)
    return applied


def convert_model(
    model,
    calibration_data=None,
    quant_config="balanced",
    stabilize_frames: bool | float = False,
    *,
    pipeline=None,
    calibration_kwargs: dict | None = None,
    layout: str | None = None,
    device: str | torch.device | None = None,
):
    """Convert a diffusers video transformer in place: quantize, calibrate, install DMPQ / cache.

    Args:
        model: the transformer (``pipe.transformer``) or the pipeline itself. It stays usable in
            its pipeline; the same object is returned, with a ``.save(path)`` method.
        calibration_data: what calibration runs on (GPTQ, ``"dynamic"`` and ``"static"``
            activations): a callable that runs generations with the model (``lambda: pipe(prompts,
            generator=torch.Generator().manual_seed(0))``: every run must generate the same
            videos); a list of prompts (with a pipeline); or a folder of videos or frame folders
            (:mod:`sixbit.calibration.videos`). About 10 varied prompts is the source recipe.
        quant_config: a preset name (``sixbit.presets.PRESETS``: ``"balanced"`` (default),
            ``"high_quality"``, ``"aggressive"``, ``"w4a8"``, ``"w8a8"``, …; trade-offs in
            BENCHMARKS.md), a JSON file (:mod:`sixbit.presets`), a ``ConvertConfig`` or a ``QuantConfig``.
        stabilize_frames: ``True`` (or a dead-zone value ≥ 0) to steady the frames
            (:mod:`sixbit.methods.stabilize`): a token's temporal mean and per-frame deviation
            multiplied apart, near-still tokens held. Less flicker, lower PSNR (BENCHMARKS.md);
            one extra GEMM on 1/F of the rows. Default ``False``.
        pipeline: the pipeline, when ``model`` is a bare transformer and calibration uses
            prompts or videos.
        calibration_kwargs: extra pipeline arguments for calibration runs (e.g.
            ``{"num_inference_steps": 20}``); ``batch_size`` (default 4) for prompt lists.
        layout: ``"auto"`` (default, or ``$SIXBIT_LAYOUT``), ``"fast"`` or ``"compact"``: what the
            model keeps resident to run fast where it first runs (:mod:`sixbit.memory.fast_path`).
        device: where the conversion computes (``"cuda"``, ``"cuda:1"``, ``"cpu"``; default: where
            the model is). The pipeline, or the bare transformer, moves there once everything is
            checked and stays (back where it was if the conversion fails). A model larger than
            the GPU streams from its folder instead (:func:`sixbit.convert_pretrained`).

    Everything is checked before the model changes; if calibration itself fails (e.g. the
    callable raises), the model is restored to what it was and the error is re-raised. Until
    then the replaced full-precision layers wait in a temporary file (``TMPDIR``), not in memory
    (:mod:`sixbit.builder.spill`): the layer objects taken out are left empty, so copy what you
    need from them (``state_dict()``) before converting.

    Example:
        >>> import sixbit
        >>> from sixbit.zoo.shapes import all_prompts, load_pipeline
        >>> pipe = load_pipeline("cogvideox")
        >>> sixbit.convert_model(pipe, all_prompts()[:4], "balanced",
        ...                      calibration_kwargs={"num_inference_steps": 8})  # doctest: +SKIP
        >>> pipe.save("6bit_model.safetensors")                                   # doctest: +SKIP
    """
    transformer = transformer_of(model)
    pipe = model if transformer is not model else pipeline
    here = next((p.device for p in transformer.parameters() if p.device.type != "meta"), torch.device("cpu"))
    device = here if device is None else conversion_device(device)
    config, hardware = for_device(resolve(quant_config), device)
    layout = check_choice(layout)
    if hardware:
        logger.info("%s", hardware)
    stabilize = StabilizeConfig.from_argument(stabilize_frames)
    chosen = check_convertible(config, transformer, {} if stabilize is None else {"stabilize": stabilize})
    run, calibration = _calibration(config, chosen, calibration_data, pipe, calibration_kwargs)
    swap = LayerSwap.watching(transformer, [name for name, m in transformer.named_modules() if is_quantizable(m)])
    tracked = tracker_of(transformer) is not None  # a step tracker the caller installed survives a rollback
    back = moved_to(model if pipe is None else pipe, device) if device != here else (lambda: None)
    try:
        with spilling():  # the replaced layers wait on disk; an error reads them back before the undo
            applied = _quantize_and_fit(transformer, config, chosen, run, calibration)
            install(transformer, config, applied, calibration, hardware)
    except BaseException:
        try:
            _undo(transformer, swap, tracked)
        except Exception:  # the original error says what went wrong; a rollback error would hide it
            logger.exception("could not fully undo the failed conversion of %s", type(transformer).__name__)
        back()
        raise
    finish(transformer, model, layout)
    return model


__all__ = ["Conversion", "DefaultPrecision", "calibration_runner", "check_convertible", "conversion_of", "convert_model",
           "fit_methods"]
