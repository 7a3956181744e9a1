"""sixbit as a diffusers quantization backend.

``import sixbit`` registers the backend ``"sixbit"`` with diffusers (and with transformers when
it is installed, which diffusers' ``PipelineQuantizationConfig`` asks for), so that:

- ``XTransformer3DModel.from_pretrained(folder, quantization_config=SixbitConfig("w8a8"))``
  quantizes while loading (:mod:`.quantizer`);
- ``PipelineQuantizationConfig(quant_backend="sixbit", quant_kwargs={"preset_or_config": "w8a8"},
  components_to_quantize=["transformer"])`` does the same inside ``DiffusionPipeline.from_pretrained``;
- every converted transformer's ``save_pretrained`` writes a diffusers folder (:mod:`.folder`)
  that a plain ``from_pretrained(folder)`` restores in any process that imported sixbit.

diffusers has no plugin entry point: third-party backends add themselves to its
``AUTO_QUANTIZER_MAPPING`` / ``AUTO_QUANTIZATION_CONFIG_MAPPING``, as done here.
"""

from __future__ import annotations

import sys
import types

from diffusers.quantizers import auto

from .config import SixbitConfig
from .folder import check_pipeline_save, save_folder
from .quantizer import SixbitQuantizer
from .. import BACKEND
from ..guards import CHECK


def attach_save_pretrained(transformer) -> None:
    """Give a converted diffusers transformer a ``save_pretrained`` that writes a converted folder
    (:func:`sixbit.integrations.register_on_import` calls it for diffusers models only)."""

    def save_pretrained(self, save_directory, is_main_process=True, safe_serialization=True, variant=None,
                        max_shard_size="10GB", push_to_hub=False, **kwargs):
        """Write this converted model as a diffusers folder (:func:`sixbit.integrations.diffusers.folder.save_folder`)."""
        return save_folder(self, save_directory, is_main_process=is_main_process,
                           safe_serialization=safe_serialization, variant=variant,
                           max_shard_size=max_shard_size, push_to_hub=push_to_hub, **kwargs)

    setattr(save_pretrained, CHECK, check_pipeline_save)  # a pipeline's save checks this before it writes anything
    transformer.save_pretrained = types.MethodType(save_pretrained, transformer)


def register() -> None:
    """Make ``"sixbit"`` a quantization backend of diffusers (and of transformers' table, if it is
    imported: diffusers' ``PipelineQuantizationConfig`` looks there too), replacing the light
    entries :func:`sixbit.integrations.register_on_import` put there."""
    auto.AUTO_QUANTIZER_MAPPING[BACKEND] = SixbitQuantizer
    auto.AUTO_QUANTIZATION_CONFIG_MAPPING[BACKEND] = SixbitConfig
    transformers_auto = sys.modules.get("transformers.quantizers.auto")
    if transformers_auto is not None:
        transformers_auto.AUTO_QUANTIZATION_CONFIG_MAPPING[BACKEND] = SixbitConfig


register()

__all__ = ["BACKEND", "SixbitConfig", "SixbitQuantizer", "attach_save_pretrained", "register", "save_folder"]
