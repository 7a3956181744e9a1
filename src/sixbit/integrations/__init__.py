"""sixbit inside other libraries: :mod:`sixbit.integrations.diffusers` (the quantization backend).

``import sixbit`` loads neither torch nor diffusers, yet diffusers must know the backend
``"sixbit"`` before it reads a converted folder's ``config.json``. So :func:`register_on_import`
(run by ``import sixbit``) waits for diffusers' (and transformers') quantizer tables to be
imported and adds two light entries to them. They import the real backend only when used:
``from_pretrained`` of a sixbit folder, ``PipelineQuantizationConfig(quant_backend="sixbit")``.
Importing :mod:`sixbit.integrations.diffusers` replaces them by the real classes. Likewise,
once :mod:`sixbit.checkpoint` is imported, every converted diffusers transformer gets a
``save_pretrained`` that writes a converted folder and diffusers' LoRA methods
(:func:`sixbit.checkpoint.register_save_method`), and diffusers' entry points that a converted
model meets get sixbit's checks (:mod:`.guards`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

BACKEND = "sixbit"


def _backend():
    return importlib.import_module(f"{__name__}.diffusers")


class SixbitConfigEntry:
    """Stands for :class:`sixbit.SixbitConfig` in the tables until the backend is imported."""

    def __new__(cls, *args, **kwargs):
        return _backend().SixbitConfig(*args, **kwargs)

    @classmethod
    def from_dict(cls, *args, **kwargs):
        return _backend().SixbitConfig.from_dict(*args, **kwargs)


class SixbitQuantizerEntry:
    """Stands for :class:`~sixbit.integrations.diffusers.SixbitQuantizer` likewise."""

    def __new__(cls, *args, **kwargs):
        return _backend().SixbitQuantizer(*args, **kwargs)


def _diffusers_tables(module) -> None:
    module.AUTO_QUANTIZER_MAPPING.setdefault(BACKEND, SixbitQuantizerEntry)
    module.AUTO_QUANTIZATION_CONFIG_MAPPING.setdefault(BACKEND, SixbitConfigEntry)


class NotADiffusersTransformer:
    """Stands in transformers' quantizer table: sixbit quantizes diffusers transformers only, so a
    transformers model given the sixbit config (a pipeline's text encoder, when
    ``PipelineQuantizationConfig`` names it or names no component) is refused with the fix, where
    transformers said "Unknown quantization type"."""

    def __new__(cls, *args, **kwargs):
        raise ValueError("sixbit quantizes diffusers transformers only, and a transformers model (a pipeline's text "
                         "encoder) is not one: give PipelineQuantizationConfig(..., components_to_quantize=['transformer'])")


def _transformers_tables(module) -> None:
    # diffusers' PipelineQuantizationConfig(quant_backend=...) also looks the backend up here
    module.AUTO_QUANTIZATION_CONFIG_MAPPING.setdefault(BACKEND, SixbitConfigEntry)
    module.AUTO_QUANTIZER_MAPPING.setdefault(BACKEND, NotADiffusersTransformer)


def _attach_save_pretrained(transformer) -> None:
    if hasattr(transformer, "save_config") and hasattr(transformer, "to_json_string"):  # a diffusers model
        _backend().attach_save_pretrained(transformer)


def _attach_lora_methods(transformer) -> None:
    importlib.import_module(f"{__name__}.diffusers.lora").attach_diffusers_methods(transformer)


def _checkpoint(module) -> None:
    # every converted or loaded transformer gets a save_pretrained that writes a converted folder,
    # and diffusers' LoRA entry points routed to sixbit.lora
    module.register_save_method(_attach_save_pretrained)
    module.register_save_method(_attach_lora_methods)


def _pipelines(module) -> None:
    importlib.import_module(f"{__name__}.guards").guard_pipeline_save(module)


def _models(module) -> None:
    importlib.import_module(f"{__name__}.guards").guard_plain_loads(module)


_TABLES = {"diffusers.quantizers.auto": _diffusers_tables, "transformers.quantizers.auto": _transformers_tables,
           "sixbit.checkpoint": _checkpoint, "diffusers.pipelines.pipeline_utils": _pipelines,
           "diffusers.models.modeling_utils": _models}


class _ThenRegister(importlib.abc.Loader):
    """A module's own loader, then the registration once the module has run."""

    def __init__(self, loader, after):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name):  # get_source, get_filename…: the wrapped loader's
        return getattr(self.loader, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the quantizer tables' modules."""

    def find_spec(self, fullname, path, target=None):
        after = _TABLES.get(fullname)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRegister(spec.loader, after)
                return spec
        return None


def register_on_import() -> None:
    """Add the backend to the tables already imported, and to the others when they are."""
    for name, after in _TABLES.items():
        if name in sys.modules:
            after(sys.modules[name])
    if not any(isinstance(finder, _WhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported())
