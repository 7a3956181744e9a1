"""Model metadata: block lists, block I/O and linear-layer roles, registered per architecture."""

from . import diffusers_models  # noqa: F401  (registers the diffusers video transformers)
from .registry import (
    DEFAULT_ROLES,
    BlockIO,
    ModelSpec,
    block_index_of,
    iter_blocks,
    register_model,
    registered,
    spec_for,
    swap_layers,
    transformer_of,
)
from .roles import Role

__all__ = [
    "DEFAULT_ROLES",
    "BlockIO",
    "ModelSpec",
    "Role",
    "block_index_of",
    "iter_blocks",
    "register_model",
    "registered",
    "spec_for",
    "swap_layers",
    "transformer_of",
]
