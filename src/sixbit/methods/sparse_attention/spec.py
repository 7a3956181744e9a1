"""Registers the ``sparse_attention`` method in :mod:`sixbit.methods.registry`: how a conversion
chooses, installs and stores it (its config, in the conversion's ``methods``)."""

from ...config.sparse_attention import SparseAttentionConfig
from ..registry import MethodSpec, register_method
from .method import (
    NAME,
    apply_sparse_attention,
    check_sparse_attention,
    describe_sparse_attention,
    remove_sparse_attention,
    sparse_attention_of,
)

SPEC = register_method(MethodSpec(
    name=NAME,
    config_type=SparseAttentionConfig,
    order=55,  # after quantized attention's slot; the two are refused together
    apply=apply_sparse_attention,
    remove=remove_sparse_attention,
    check=lambda model, config, convert_config: check_sparse_attention(model, convert_config),
    installed=lambda model: getattr(sparse_attention_of(model), "config", None),
    sequence_parallel="sparse attention places its windows on the whole token grid and does not follow a sequence "
                      "split yet",
    attention_kernel=True,
    describe=describe_sparse_attention,
))
