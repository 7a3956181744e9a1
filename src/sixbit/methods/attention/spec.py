"""Registers the ``attention`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""


from ...config.attention import AttentionQuantConfig
from ..registry import MethodSpec, register_method
from .method import (
    apply_attention_quant,
    attention_quant_of,
    check_attention,
    remove_attention_quant,
)

SPEC = register_method(MethodSpec(
    name="attention",
    config_type=AttentionQuantConfig,
    order=50,
    attribute="attention",
    apply=apply_attention_quant,
    remove=remove_attention_quant,
    check=lambda model, config, convert_config: check_attention(model, config, convert_config),  # no processors, or blocks past the model
    installed=lambda model: getattr(attention_quant_of(model), "config", None),
    sequence_parallel="quantized attention (ConvertConfig.attention) does not run sequence-parallel yet",
    attention_kernel=True,
))
