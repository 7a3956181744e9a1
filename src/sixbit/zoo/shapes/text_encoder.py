"""A tiny text encoder for the shapes world: one learned embedding per vocabulary word.

Tokenization is by the fixed vocabulary of :mod:`sixbit.zoo.shapes.world` (lower-cased, split on
whitespace). Token id 0 is padding; every prompt is padded to ``max_length`` tokens, so the empty
prompt ``""`` (all padding) is the unconditional embedding used for classifier-free guidance.
An unknown word raises ``ValueError`` listing the vocabulary: a silent "unknown" token would make
the model generate something unrelated to what was asked.

The encoder is a diffusers ``ModelMixin`` + ``ConfigMixin`` so that pipelines save and load it
with ``save_pretrained`` / ``from_pretrained`` like any other component.

Example:
    >>> enc = ShapesTextEncoder()
    >>> enc.encode(["a red circle moving right", ""]).shape
    torch.Size([2, 10, 64])
"""

from __future__ import annotations

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from .world import VOCABULARY


class ShapesTextEncoder(ModelMixin, ConfigMixin):
    """Word + position embeddings followed by a LayerNorm.

    Args:
        vocabulary (list[str], default: the shapes world vocabulary): known words; id ``i + 1``.
        embed_dim (int, default 64): width of each token embedding (the transformer's text dim).
        max_length (int, default 10): tokens per prompt; longer prompts raise ``ValueError``.
    """

    @register_to_config
    def __init__(self, vocabulary: list[str] | None = None, embed_dim: int = 64, max_length: int = 10):
        super().__init__()
        vocabulary = list(VOCABULARY if vocabulary is None else vocabulary)
        self.register_to_config(vocabulary=vocabulary)
        self._ids = {w: i + 1 for i, w in enumerate(vocabulary)}
        self.token_embedding = nn.Embedding(len(vocabulary) + 1, embed_dim)
        self.position_embedding = nn.Parameter(torch.zeros(max_length, embed_dim))
        self.norm = nn.LayerNorm(embed_dim)
        nn.init.normal_(self.token_embedding.weight, std=1.0)

    @property
    def vocabulary(self) -> list[str]:
        return list(self.config.vocabulary)

    def tokenize(self, prompts: str | list[str]) -> torch.Tensor:
        """Map prompts to a (B, max_length) LongTensor of token ids (0 = padding)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        max_length = self.config.max_length
        rows = []
        for prompt in prompts:
            words = prompt.lower().split()
            unknown = [w for w in words if w not in self._ids]
            if unknown:
                raise ValueError(
                    f"unknown word(s) {unknown} in prompt {prompt!r}; the shapes models only know "
                    f"the vocabulary {self.vocabulary}"
                )
            if len(words) > max_length:
                raise ValueError(f"prompt {prompt!r} has {len(words)} words; at most {max_length} are allowed")
            rows.append([self._ids[w] for w in words] + [0] * (max_length - len(words)))
        return torch.tensor(rows, dtype=torch.long, device=self.position_embedding.device)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids -> (B, L, embed_dim) embeddings."""
        h = self.token_embedding(input_ids) + self.position_embedding[: input_ids.shape[1]]
        return self.norm(h)

    def encode(self, prompts: str | list[str]) -> torch.Tensor:
        """Tokenize and embed: ``encode(["a red circle moving right"])`` -> (1, max_length, embed_dim)."""
        return self(self.tokenize(prompts))
