"""Checks sixbit adds to diffusers' own entry points where a converted model meets them, so that
what sixbit would refuse is refused before diffusers writes or loads anything. Installed by
:func:`sixbit.integrations.register_on_import` when diffusers imports the module that holds the
entry point; light (no torch, no backend) until a converted model is involved.

- ``DiffusionPipeline.save_pretrained`` writes the components one after another: a converted
  transformer refusing its arguments (``safe_serialization=False``, a ``max_shard_size`` that is
  no size) left ``text_encoder/``, ``tokenizer/`` and ``vae/`` written. Every converted
  component's check (its ``save_pretrained.sixbit_check``) now runs first.
- ``ModelMixin.from_pretrained`` of a converted folder whose ``config.json`` lost its
  ``quantization_config`` asks no quantizer: diffusers loaded the full-precision model with the
  packed layers newly initialized (random), saying only "newly initialized". diffusers has no
  public hook for a load without a quantization config, so its loader
  ``ModelMixin._load_pretrained_model``, which receives the names of the folder's tensors before
  any is read, is wrapped to refuse packed weights (:func:`packed_names`) when no quantizer
  runs. It is a private method: if a diffusers version drops it, this guard is absent and
  ``tests/integrations/test_diffusers_refusals.py`` says so.
"""

from __future__ import annotations

import functools
import inspect

CHECK = "sixbit_check"  # the attribute of a converted model's save_pretrained that checks a pipeline save's arguments


def _checked_first(function, check):
    """``function`` wrapped so that ``check(arguments)`` (its call's arguments by name) runs
    before it, marked as wrapped (:data:`CHECK`); a call that does not bind is left to
    ``function``, whose own error says what is wrong."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def checked(*args, **kwargs):
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return function(*args, **kwargs)
        check(arguments)
        return function(*args, **kwargs)

    setattr(checked, CHECK, True)
    return checked


def guard_pipeline_save(module) -> None:
    """Wrap ``module.DiffusionPipeline.save_pretrained`` (once) as the module doc says."""
    pipeline = getattr(module, "DiffusionPipeline", None)
    save = getattr(pipeline, "save_pretrained", None)
    if save is None or getattr(save, CHECK, False):
        return

    def check_components(arguments):
        for component in dict(getattr(arguments["self"], "components", None) or {}).values():
            check = getattr(getattr(component, "save_pretrained", None), CHECK, None)
            if callable(check):
                check(arguments)

    pipeline.save_pretrained = _checked_first(save, check_components)


def packed_names(names, expected=()) -> list[str]:
    """The tensor names among ``names`` that only a sixbit-converted model stores: a layer's
    packed weight codes (``<layer>.weight_codes``, every format's, where ``<layer>.weight`` is not
    stored) and runtime methods' state (``<extension>::<key>``); never one of ``expected`` (the
    model's own names)."""
    names = set(names)
    return sorted(n for n in names - set(expected) if "::" in n or (
        n.endswith(".weight_codes") and n.removesuffix("_codes") not in names))


def guard_plain_loads(module) -> None:
    """Wrap ``module.ModelMixin._load_pretrained_model`` (once) as the module doc says."""
    mixin = getattr(module, "ModelMixin", None)
    load = inspect.getattr_static(mixin, "_load_pretrained_model", None) if mixin is not None else None
    if not isinstance(load, classmethod) or getattr(load.__func__, CHECK, False):
        return

    def check_packed(arguments):
        model = arguments.get("model")
        if arguments.get("hf_quantizer") is None and model is not None:
            packed = packed_names(arguments.get("loaded_keys") or (), model.state_dict())
            if packed:
                raise ValueError(
                    f"{str(arguments.get('pretrained_model_name_or_path'))!r} holds a sixbit-converted "
                    f"{type(model).__name__} (packed weights such as {packed[0]!r}) but its config.json has no "
                    "quantization_config, so its quantized layers would load as random weights: put back the "
                    "config.json that save_pretrained (or `sixbit convert`) wrote beside these weight files, "
                    "or convert the full-precision model again")

    mixin._load_pretrained_model = classmethod(_checked_first(load.__func__, check_packed))
