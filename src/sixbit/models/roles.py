"""The jobs a linear layer does in a video DiT, as the model metadata names them.

A role is the model-side name of a layer's job (:class:`~sixbit.models.ModelSpec` assigns one
to each linear); configs choose quantization formats per role, so they import it from here.
"""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    """What a linear layer does in a video DiT; quantization formats are chosen per role."""

    ATTENTION = "attention"  # q/k/v/out projections, including joint-attention context ones
    FEEDFORWARD = "feedforward"  # MLP up/down projections
    MODULATION = "modulation"  # adaLN / norm projections from the timestep embedding
    EMBEDDING = "embedding"  # patch / timestep / text / caption embedders, token refiners
    OUTPUT = "output"  # final norm modulation and projection to the latent space
    OTHER = "other"  # anything the model metadata does not classify
