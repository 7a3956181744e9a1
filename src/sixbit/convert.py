"""One call from a diffusers model to a converted one: :func:`convert_model`.

``convert_model`` resolves the config (:mod:`sixbit.presets`), checks the calibration data,
then quantizes, calibrates and installs the runtime methods the config names, in place. The
conversion (config, fitted DMPQ predictor, cache settings, frame stabilizer, quantized
attention) is remembered per
model, written into checkpoints by :func:`sixbit.save` and rebuilt by :func:`sixbit.load`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import checkpoint
from .api import quantize
from .calibration import calibrate, seeded
from .calibration.videos import read_videos, video_runner
from .lora import attach_diffusers_methods
from .methods.attention import (
    AttentionQuantState,
    apply_attention_quant,
    attention_modules,
    remove_attention_quant,
)
from .methods.delta_cache import DeltaCache, disable_delta_cache, enable_delta_cache
from .methods.dmpq import DMPQ, DMPQPredictor, apply_dmpq, fit_dmpq, remove_dmpq
from .methods.stabilize import (
    DEFAULT_DEADZONE,
    FrameStabilizer,
    apply_stabilizer,
    remove_stabilizer,
)
from .methods.static_w8a8 import apply_static_w8a8
from .models import iter_blocks
from .models.registry import spec_for
from .nn import QuantLinear
from .nn.precision import ACT_BITS, ActMode, Level, act_mode, average_bits
from .presets import ConvertConfig, for_device, resolve
from .runtime import hooks
from .runtime.blocks import quant_linears
from .runtime.context import HOOK_NAME as STEP_HOOK_NAME
from .runtime.context import track_steps, tracker_of

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Conversion:
    """What :func:`convert_model` did to a model (``sixbit.conversion_of(model)``).

    Attributes:
        config: the resolved :class:`~sixbit.presets.ConvertConfig`.
        calibration: where calibration came from (``{"source": ..., "count": ...}``), or ``None``.
        predictor: the fitted DMPQ predictor (``activations="dynamic"``).
        dmpq: the installed DMPQ method (``.report()``: precision map, average bits).
        cache: the installed delta cache (``.report()``: skip map, skip share, cache bytes).
        stabilizer: the frame stabilizer (``stabilize_frames=True``).
        attention: the installed quantized attention (``config.attention``): its ``path``
            (real or emulated on this device) and counts of quantized calls.
        default: the configured activation precision's policy (``"int8"``, ``"nvfp4"``, ``"fp"``).
        hardware: what the preset's intent became on the device it was converted on
            (:func:`sixbit.presets.for_device`), or ``None`` when it runs as configured.
    """

    config: ConvertConfig
    calibration: dict | None = None
    predictor: DMPQPredictor | None = None
    dmpq: DMPQ | None = None
    cache: DeltaCache | None = None
    stabilizer: FrameStabilizer | None = None
    attention: AttentionQuantState | None = None
    default: DefaultPrecision | None = None
    hardware: str | None = None

    def average_act_bits(self) -> float:
        """GEMM-FLOP-weighted activation bits of the last run under DMPQ (PDR's full-precision
        refreshes counted at 16 bits), else the configured width."""
        if self.dmpq is not None:
            flops = defaultdict(float, self.dmpq.report().flops)
            if self.cache is not None:
                for mode, f in self.cache.report().pdr_flops.items():
                    flops[mode] -= f
                    flops[ActMode.FP.value] += f
            return average_bits(flops)
        if self.config.activations == "static":
            bits = self.config.static.act_bits
            return float(sum(bits) / len(bits)) if isinstance(bits, (list, tuple)) else float(bits)
        return ACT_BITS[ActMode(self.config.activations)]


class DefaultPrecision:
    """Precision policy of a conversion's fixed activations: every quantized linear runs at ``mode``
    unless a method of higher precedence (PDR) decides otherwise."""

    def __init__(self, mode: ActMode | str):
        self.mode = act_mode(mode)

    def __call__(self, layer: nn.Module, x) -> ActMode:
        return self.mode


_CONVERSIONS: weakref.WeakKeyDictionary[nn.Module, Conversion] = weakref.WeakKeyDictionary()


def _transformer_of(model_or_pipe) -> tuple[nn.Module, Any]:
    """(transformer, pipeline or None) of what the user passed."""
    if isinstance(model_or_pipe, nn.Module):
        return model_or_pipe, None
    transformer = getattr(model_or_pipe, "transformer", None)
    if isinstance(transformer, nn.Module):
        return transformer, model_or_pipe
    raise ValueError(
        f"expected a diffusers transformer (nn.Module) or a pipeline with a .transformer, got {type(model_or_pipe).__name__}"
    )


def conversion_of(model_or_pipe) -> Conversion | None:
    """The :class:`Conversion` of a converted model (or of a pipeline's transformer), else ``None``."""
    transformer, _ = _transformer_of(model_or_pipe)
    return _CONVERSIONS.get(transformer)


def _calibration_runner(data, pipe, calibration_kwargs: dict) -> tuple[Callable[[], object], dict]:
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


def _deadzone(stabilize_frames) -> float | None:
    """The stabilizer's dead zone for ``stabilize_frames`` (``None``: no stabilizer)."""
    if stabilize_frames is False or stabilize_frames is None:
        return None
    if stabilize_frames is True:
        return DEFAULT_DEADZONE
    if isinstance(stabilize_frames, (int, float)) and stabilize_frames >= 0:
        return float(stabilize_frames)
    raise ValueError(f"stabilize_frames must be True, False or a dead zone ≥ 0, got {stabilize_frames!r}")


def _install(model: nn.Module, config: ConvertConfig, predictor: DMPQPredictor | None, deadzone: float | None,
             calibration: dict | None, hardware: str | None = None) -> Conversion:
    """Install the runtime methods of an already quantized model and remember the conversion."""
    conversion = Conversion(config, calibration, predictor, hardware=hardware)
    _CONVERSIONS[model] = conversion  # first: a failure below is undone through it
    if config.activations in ("int8", "nvfp4", "fp"):
        conversion.default = DefaultPrecision(config.activations)
        track_steps(model).precision.register(Level.DEFAULT, conversion.default)
    if predictor is not None:
        conversion.dmpq = apply_dmpq(model, predictor)
    if deadzone is not None:
        conversion.stabilizer = apply_stabilizer(model, deadzone)
    if config.cache is not None:
        conversion.cache = enable_delta_cache(model, config.cache)
    if config.attention is not None:
        conversion.attention = apply_attention_quant(model, config.attention)
    return conversion


def _remove_methods(model: nn.Module) -> None:
    """Remove every runtime method a conversion installs, and forget the conversion."""
    conversion = _CONVERSIONS.pop(model, None)
    disable_delta_cache(model)
    remove_dmpq(model)
    remove_stabilizer(model)
    remove_attention_quant(model)
    if conversion is not None and conversion.default is not None:
        track_steps(model).precision.unregister(conversion.default)


def _undo(model: nn.Module, originals: dict[str, nn.Module], tracked: bool) -> None:
    """Put every original layer back and remove the runtime hooks (after a failed conversion).

    ``tracked``: the model had a step tracker before the conversion; otherwise the one that
    calibration or a runtime method installed goes too. Layers go back first: that cannot fail,
    and a hook left on a discarded layer no longer matters.
    """
    modules = dict(model.named_modules())
    for name, layer in originals.items():
        parent, _, child = name.rpartition(".")
        current = modules.get(name)
        if current is not layer:
            setattr(modules[parent] if parent else model, child, layer)
    _remove_methods(model)
    if not tracked:
        hooks.remove(model, STEP_HOOK_NAME)


def _check(config: ConvertConfig, transformer: nn.Module, deadzone: float | None, converted_ok: bool = False) -> None:
    """Refuse what cannot be converted, before anything changes (``converted_ok``: the model may
    already be quantized, as when a checkpoint is loaded into it)."""
    spec = spec_for(transformer)  # unsupported architectures fail here
    if config.attention is not None:
        attention_modules(transformer)  # a model without attention processors fails here
    if deadzone is not None and config.activations not in ("int8", "nvfp4", "dynamic"):
        raise ValueError(
            f"stabilize_frames acts on dynamically quantized activations, which activations={config.activations!r} "
            "does not have: choose a preset with int8, nvfp4 or dynamic activations (e.g. 'balanced')"
        )
    if deadzone is not None and spec.video_grid is None:
        raise ValueError(f"stabilize_frames is not available for {type(transformer).__name__}: its token grid is unknown")
    if converted_ok:
        return
    if _CONVERSIONS.get(transformer) is not None or quant_linears(transformer):
        raise ValueError("this model is already quantized or converted: convert a freshly loaded model")
    if any(p.device.type == "meta" for p in transformer.parameters()):
        raise ValueError(
            f"{type(transformer).__name__} has weights on the meta device (built empty): load its weights first "
            "(from_pretrained), or convert its folder with sixbit.convert_pretrained, which streams it block by block"
        )


def _quantize_and_fit(transformer: nn.Module, config: ConvertConfig, run, calibration: dict | None):
    """Quantize ``transformer`` as ``config`` says and fit what needs calibration; the DMPQ
    predictor (or ``None``)."""
    if config.activations == "static":
        logger.info("calibrating static W8A8 ranges")
        apply_static_w8a8(transformer, config.static, calibrate(transformer, run))
        return None
    if config.weights is not None:
        logger.info("quantizing weights%s", " (GPTQ: one calibration run per block)" if config.weights.gptq else "")
        quantize(transformer, config.weights, calibration=run)
    if config.activations != "dynamic":
        return None
    logger.info("fitting the DMPQ predictor")
    dmpq = config.dmpq
    if calibration["source"] == "videos" and dmpq.error_at == "video":
        logger.warning(
            "calibration videos are replayed along their noising path, so no error reaches a final "
            "video: DMPQ is fitted to the blocks' output error (error_at='block')"
        )
        dmpq = dataclasses.replace(dmpq, error_at="block")
    return fit_dmpq(transformer, run, dmpq)


def convert_model(
    model,
    calibration_data=None,
    quant_config="balanced",
    stabilize_frames: bool | float = False,
    *,
    pipeline=None,
    calibration_kwargs: dict | None = None,
):
    """Convert a diffusers video transformer in place: quantize, calibrate, install DMPQ / cache.

    Args:
        model: the transformer (``pipe.transformer``) or the pipeline itself. It stays usable in
            its pipeline; the same object is returned, with a ``.save(path)`` method.
        calibration_data: what calibration runs on (needed by ``"dynamic"`` and ``"static"``
            activations, e.g. the ``"balanced"`` preset): a callable that runs generations with
            the model (``lambda: pipe(prompts, generator=torch.Generator().manual_seed(0))``: every
            run must generate the same videos); a list of prompts (with a pipeline); or a
            folder of videos or frame folders (:mod:`sixbit.calibration.videos`; encoded with
            the pipeline's VAE where it has one). More and more varied data fits better; the
            source recipe is about 10 varied prompts.
        quant_config: a preset name (``sixbit.presets.PRESETS``: ``"balanced"`` (default),
            ``"high_quality"``, ``"aggressive"``, ``"w8a8-static"``, ``"w4a6-dynamic"``,
            ``"w4a8"``, ``"w4a4"``, ``"w4a16"``, ``"w8a8"``, ``"tdc"``; measured trade-offs in
            BENCHMARKS.md), a path to a JSON file (full schema or the short seed shape, see
            :mod:`sixbit.presets`), a ``ConvertConfig`` or a ``QuantConfig``.
        stabilize_frames: ``True`` (or a dead-zone value ≥ 0) to steady the frames
            (:mod:`sixbit.methods.stabilize`): each quantized linear multiplies a video token's
            temporal mean and its per-frame deviation separately, and treats tokens that barely
            change as still. Less flicker, lower PSNR vs the full-precision video (measured in
            BENCHMARKS.md); one extra GEMM on 1/F of the rows. Default ``False``.
        pipeline: the pipeline, when ``model`` is a bare transformer and calibration uses
            prompts or videos.
        calibration_kwargs: extra pipeline arguments for calibration runs (e.g.
            ``{"num_inference_steps": 20}``); ``batch_size`` (default 4) for prompt lists.

    Everything is checked before the model changes; if calibration itself fails (e.g. the
    callable raises), the model is restored to what it was and the error is re-raised.

    Example:
        >>> import sixbit
        >>> from sixbit.zoo.shapes import all_prompts, load_pipeline
        >>> pipe = load_pipeline("cogvideox")
        >>> sixbit.convert_model(pipe, all_prompts()[:4], "balanced",
        ...                      calibration_kwargs={"num_inference_steps": 8})  # doctest: +SKIP
        >>> pipe.save("6bit_model.safetensors")                                   # doctest: +SKIP
    """
    transformer, pipe = _transformer_of(model)
    device = next((p.device for p in transformer.parameters() if p.device.type != "meta"), torch.device("cpu"))
    config, hardware = for_device(resolve(quant_config), device)
    if hardware:
        logger.info("%s", hardware)
    pipe = pipe if pipe is not None else pipeline
    deadzone = _deadzone(stabilize_frames)
    _check(config, transformer, deadzone)
    run, calibration = None, None
    if config.needs_calibration:
        if calibration_data is None:
            raise ValueError(
                f"{config.calibration_reason()} needs calibration_data (prompts, videos or a callable); "
                "or choose a preset without calibration, e.g. 'w4a8-rtn' or 'w8a8'"
            )
        run, calibration = _calibration_runner(calibration_data, pipe, dict(calibration_kwargs or {}))
    elif calibration_data is not None:
        logger.info("calibration_data is not used by activations=%r", config.activations)
    originals = {name: m for name, m in transformer.named_modules() if isinstance(m, nn.Linear)}
    tracked = tracker_of(transformer) is not None  # a step tracker the caller installed survives a rollback
    try:
        predictor = _quantize_and_fit(transformer, config, run, calibration)
        _install(transformer, config, predictor, deadzone, calibration, hardware)
    except BaseException:
        try:
            _undo(transformer, originals, tracked)
        except Exception:  # the original error says what went wrong; a rollback error would hide it
            logger.exception("could not fully undo the failed conversion of %s", type(transformer).__name__)
        raise
    checkpoint.attach_save(transformer)
    attach_diffusers_methods(transformer)
    if pipe is not None and model is pipe:
        checkpoint.attach_save(pipe)
    return model


def _export(model: nn.Module):
    conversion = _CONVERSIONS.get(model)
    return None if conversion is None else conversion_state(conversion)


def conversion_state(conversion: Conversion) -> tuple[dict, dict]:
    """The checkpoint extension's ``(meta, tensors)`` for ``conversion``."""
    meta = {
        "version": 1,
        "config": conversion.config.to_dict(),
        "calibration": conversion.calibration,
        "predictor": None if conversion.predictor is None else conversion.predictor.to_dict(),
        "stabilize_frames": None if conversion.stabilizer is None else conversion.stabilizer.deadzone,
        "hardware": conversion.hardware,
    }
    return meta, {}


def _prepare(model: nn.Module, modules: dict[str, nn.Module], meta: dict, tensors: dict[str, torch.Tensor]):
    """Check a stored conversion against the model it will be installed on; the installer."""
    if meta.get("version") != 1:
        raise ValueError(f"unsupported conversion state version {meta.get('version')!r}")
    try:
        config = ConvertConfig.from_dict(meta["config"])
        predictor = DMPQPredictor.from_dict(meta["predictor"]) if meta.get("predictor") else None
    except (KeyError, TypeError) as e:
        raise ValueError(f"the conversion state is incomplete or malformed: {e}") from None
    deadzone, calibration, hardware = meta.get("stabilize_frames"), meta.get("calibration"), meta.get("hardware")
    if deadzone is not None and (isinstance(deadzone, bool) or not isinstance(deadzone, (int, float)) or not deadzone >= 0):
        raise ValueError(f"the conversion state has an invalid stabilize_frames value {deadzone!r}")
    malformed = [key for key, value, kind in (("calibration", calibration, dict), ("hardware", hardware, str))
                 if value is not None and not isinstance(value, kind)]
    if malformed:
        raise ValueError(f"the conversion state's {' and '.join(malformed)} entry is malformed")
    if config.activations == "dynamic" and predictor is None:
        raise ValueError('the conversion has activations="dynamic" but no DMPQ predictor')
    if predictor is not None or config.cache is not None or deadzone is not None or config.attention is not None:
        _check(config, model, deadzone, converted_ok=True)
    if predictor is not None:
        found = list(iter_blocks(model))
        if len(predictor.blocks) != len(found):
            raise ValueError(f"the DMPQ predictor covers {len(predictor.blocks)} blocks but the model has {len(found)}")
        for _, name, _, _ in found:
            if not any(isinstance(m, QuantLinear) for n, m in modules.items() if n.startswith(f"{name}.")):
                raise ValueError(f"the conversion runs DMPQ, but block {name!r} has no quantized layer in the checkpoint")

    def install() -> None:
        _install(model, config, predictor, deadzone, calibration, hardware)
        attach_diffusers_methods(model)

    return install


EXTENSION = checkpoint.CheckpointExtension("conversion", _export, _prepare, clear=_remove_methods)

__all__ = ["Conversion", "DefaultPrecision", "conversion_of", "convert_model"]
