"""A toy transformer whose every statistic can be computed by hand in a test."""

import torch
from diffusers.models.cache_utils import CacheMixin
from torch import nn

import sixbit.models as models


class ToyBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, temb):
        return hidden_states + torch.tanh(self.proj(hidden_states)) * temb


class ToyTransformer(nn.Module, CacheMixin):
    """Residual ``tanh(Linear)`` blocks scaled by the timestep; ``cache_context`` as in diffusers."""

    def __init__(self, dim=32, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList(ToyBlock(dim) for _ in range(depth))
        self.proj_out = nn.Linear(dim, dim)

    def forward(self, hidden_states, timestep):
        temb = (timestep.float() / 1000).reshape(-1, *[1] * (hidden_states.dim() - 1))
        for block in self.blocks:
            hidden_states = block(hidden_states, temb)
        return self.proj_out(hidden_states)


if "ToyTransformer" not in models.registered():
    models.register_model(
        models.ModelSpec(
            name="toy",
            classes=("ToyTransformer",),
            block_lists=("blocks",),
            roles=((models.registry.Role.ATTENTION, r"blocks\.\d+\.proj"),),
        )
    )
