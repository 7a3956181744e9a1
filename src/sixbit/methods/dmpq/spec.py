"""Registers the ``dmpq`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from torch import nn

from ...config.dmpq import DMPQConfig
from ...models import iter_blocks
from ...nn import QuantLinear
from ...runtime import blocks
from ..registry import MethodSpec, register_method
from .fit import VIDEO_TARGETS, fit_dmpq
from .method import (
    DMPQ,
    DMPQPredictor,
    apply_dmpq,
    remove_dmpq,
)

logger = logging.getLogger(__name__)


def _fit(model: nn.Module, config: DMPQConfig, run: Callable[[], object], calibration: dict | None) -> DMPQPredictor:
    """The predictor of a conversion. Calibration videos are replayed along their noising path,
    so no error reaches a final video: there the fit measures the blocks' output error."""
    logger.info("fitting the DMPQ predictor")
    if calibration is not None and calibration.get("source") == "videos" and config.error_at in VIDEO_TARGETS:
        logger.warning(
            "calibration videos are replayed along their noising path, so no error reaches a final "
            "video: DMPQ is fitted to the blocks' output error (error_at='block')"
        )
        config = dataclasses.replace(config, error_at="block")
    return fit_dmpq(model, run, config)


def _load(value: dict, model: nn.Module, modules: dict[str, nn.Module]) -> DMPQPredictor:
    """A stored predictor, checked against the blocks of ``model`` once the file's layers are in."""
    predictor = DMPQPredictor.from_dict(value)
    found = list(iter_blocks(model))
    if len(predictor.blocks) != len(found):
        raise ValueError(f"the DMPQ predictor covers {len(predictor.blocks)} blocks but the model has {len(found)}")
    for _, name, _, _ in found:
        if not any(isinstance(m, QuantLinear) for n, m in modules.items() if n.startswith(f"{name}.")):
            raise ValueError(f"the conversion runs DMPQ, but block {name!r} has no quantized layer in the checkpoint")
    return predictor


SPEC = register_method(MethodSpec(
    name="dmpq",
    config_type=DMPQConfig,
    order=20,
    attribute="dmpq",
    apply=apply_dmpq,
    remove=remove_dmpq,
    needs_calibration=True,
    fit=_fit,
    fitted="predictor",
    state_key="predictor",
    dump=lambda predictor: predictor.to_dict(),
    load=_load,
    installed=lambda model: getattr(next(blocks.attached(model, DMPQ), None), "policy", None),
    chunkable="this model's DMPQ picks NVFP4 or INT8 per block and step with one scale over all of a call's "
              "tokens: chunks would change the video",
))
