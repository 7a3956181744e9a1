"""The one pre-flight check of a conversion, shared by every way in.

:func:`sixbit.convert_model` (in memory, static W8A8 included), :func:`sixbit.convert_pretrained`
(streamed from files), diffusers' ``from_pretrained(quantization_config=SixbitConfig(...))``
(quantized while loading), :func:`sixbit.tune` and :func:`sixbit.load` (through the conversion
record, which runs the same method checks) refuse a config that cannot run on a model with the
same message, before anything changes: :func:`check_convertible`. It also refuses a diffusers
model that is not a transformer (a VAE given to sixbit) and a config under which no layer would
be quantized (:func:`sixbit.builder.check_plan`: a conversion that changes nothing must not report
success). What only one way cannot do (a streamed conversion runs no generation,
``from_pretrained`` no calibration) is refused by that way, after this check (the streamed
conversion's: :func:`check_streamable`).
"""

from __future__ import annotations

import logging

from torch import nn

from .builder import check_plan
from .config import Activations, ConvertConfig
from .lora import check_no_loras
from .memory.weights import check_not_offloaded
from .methods.record import check, conversion_of, selected
from .models import spec_for
from .presets import calibration_free
from .runtime.blocks import quant_linears
from .runtime.wrapped import check_not_wrapped

logger = logging.getLogger(__name__)


def check_convertible(config: ConvertConfig, transformer: nn.Module, extra: dict | None = None, *,
                      empty: bool = False) -> dict:
    """Refuse what cannot be converted, before anything changes; the methods ``config`` (and the
    per-call ``extra`` method configs, e.g. ``{"stabilize": StabilizeConfig()}``) selects, with
    their configs.

    ``empty``: the model is built on the meta device and its weights arrive later (streamed, or
    quantized while loading); otherwise its weights must be loaded.
    """
    _check_transformer(transformer)
    spec_for(transformer)  # unsupported architectures fail here
    check_not_wrapped(transformer, "convert the model")
    check_no_loras(transformer, "convert_model")
    check_not_offloaded(transformer, "the conversion")  # it would quantize the offload's placeholders
    chosen = selected(config, extra or {})
    check(transformer, config, chosen)
    if conversion_of(transformer) is not None or quant_linears(transformer):
        raise ValueError("this model is already quantized or converted: convert a freshly loaded model")
    if not empty and any(p.device.type == "meta" for p in transformer.parameters()):
        raise ValueError(
            f"{type(transformer).__name__} has weights on the meta device (built empty): load its weights first "
            "(from_pretrained), or convert its folder with sixbit.convert_pretrained, which streams it block by block"
        )
    if config.weights is not None:  # a conversion that would quantize no layer is refused, naming why
        check_plan(transformer, config.weights)
    return chosen


def check_streamable(config, quant_config, calibration) -> None:
    """Refuse ``config`` (resolved from ``quant_config``) where a streamed conversion
    (:func:`sixbit.convert_pretrained`, which never holds the full-precision model) cannot
    calibrate it, or where ``calibration`` is missing."""
    if config.activations == Activations.STATIC:
        raise ValueError(
            "activations='static' (static W8A8) quantizes the weights itself, fitted on generations of the "
            "full-precision model in memory, which a streamed conversion never holds: choose 'w8a8', 'w4a8' or "
            "'w4a6-dynamic' (DMPQ streams), or load the model and use sixbit.convert_model"
        )
    if config.cache is not None and config.cache.needs_calibration:
        raise ValueError(
            f"the delta cache's min_psnr={config.cache.min_psnr:g} is calibrated against the full-precision model's "
            "videos, which a streamed conversion does not keep: give DeltaCacheConfig(error_budget=...) instead (1.0, the default, skips half "
            "the block calls of the shapes models), or load the model and use sixbit.convert_model"
        )
    if config.needs_calibration and not callable(calibration):
        raise ValueError(
            f"{config.calibration_reason()} needs calibration=<callable that runs generations with the transformer it "
            f"is given>; or choose a calibration-free preset ({', '.join(calibration_free())})"
        )
    if not config.needs_calibration and calibration is not None:
        logger.info("calibration is not used by %r", quant_config)


def _check_transformer(model: nn.Module) -> None:
    """Refuse a diffusers model that is not a transformer (a VAE, a UNet, a ControlNet: diffusers
    keeps its transformers in ``diffusers.models.transformers``); other models, a user's own
    included, go on to the checks of their blocks and layers."""
    module = type(model).__module__
    if module.startswith("diffusers.models.") and not module.startswith("diffusers.models.transformers."):
        raise ValueError(f"sixbit quantizes diffusers transformers only, and {type(model).__name__} is not one: "
                         "convert the pipeline's transformer (convert_model(pipe, ...) or pipe.transformer), or "
                         "give PipelineQuantizationConfig(..., components_to_quantize=['transformer'])")


__all__ = ["check_convertible", "check_streamable"]
