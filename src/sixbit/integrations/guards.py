"""Checks sixbit adds to diffusers' own entry points where a converted model meets them, so that
what sixbit would refuse is refused before diffusers writes or loads anything. Installed by
:func:`sixbit.integrations.register_on_import` when diffusers imports the module that holds the
entry point; light (no torch, no backend) until a converted model is involved.

- ``DiffusionPipeline.save_pretrained`` writes the components one after another: a converted
  transformer refusing its arguments (``safe_serialization=False``, a ``max_shard_size`` that is
  no size) left ``text_encoder/``, ``tokenizer/`` and ``vae/`` written. Every converted
  component's check (its ``save_pretrained.sixbit_check``) now runs first.
"""

from __future__ import annotations

import functools
import inspect

CHECK = "sixbit_check"  # the attribute of a converted model's save_pretrained that checks a pipeline save's arguments


def guard_pipeline_save(module) -> None:
    """Wrap ``module.DiffusionPipeline.save_pretrained`` (once) as the module doc says."""
    pipeline = getattr(module, "DiffusionPipeline", None)
    save = getattr(pipeline, "save_pretrained", None)
    if save is None or getattr(save, CHECK, False):
        return
    signature = inspect.signature(save)

    @functools.wraps(save)
    def save_pretrained(self, *args, **kwargs):
        try:
            arguments = signature.bind(self, *args, **kwargs).arguments
        except TypeError:  # diffusers' own call says what is wrong
            return save(self, *args, **kwargs)
        for component in dict(getattr(self, "components", None) or {}).values():
            check = getattr(getattr(component, "save_pretrained", None), CHECK, None)
            if callable(check):
                check(arguments)
        return save(self, *args, **kwargs)

    setattr(save_pretrained, CHECK, True)
    pipeline.save_pretrained = save_pretrained
