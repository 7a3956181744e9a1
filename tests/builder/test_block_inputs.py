"""The first block's kept inputs (``sixbit.builder.block_inputs``): replaying them block by
block gives each block exactly the inputs the generation gave it, and where they cannot stand in
for the generation the reason is named."""

import pytest
import torch

import sixbit.models as models
from sixbit.builder.block_inputs import keeping
from fixtures.toy import ToyTransformer


class _Rescaled(ToyTransformer):
    """Model code between the blocks: block 1's input is not block 0's output."""

    def forward(self, hidden_states, timestep):
        temb = (timestep.float() / 1000).reshape(-1, *[1] * (hidden_states.dim() - 1))
        for block in self.blocks:
            hidden_states = 0.5 * block(hidden_states, temb)
        return self.proj_out(hidden_states)


if "_Rescaled" not in models.registered():
    models.register_model(models.ModelSpec(name="toy-rescaled", classes=("_Rescaled",), block_lists=("blocks",),
                                           roles=((models.registry.Role.ATTENTION, r"blocks\.\d+\.proj"),)))


def _calls(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in (900, 500, 100):
            model(torch.randn(2, 5, 32, generator=g), timestep=torch.tensor([t, t]))


def test_replaying_block_by_block_gives_each_block_the_inputs_the_generation_gave_it():
    torch.manual_seed(0)
    model = ToyTransformer(dim=32, depth=3)
    seen = {i: [] for i in range(3)}
    handles = [b.register_forward_pre_hook(lambda m, a, i=i: seen[i].append(a[0].clone())) for i, b in enumerate(model.blocks)]
    with keeping(model) as kept:
        _calls(model)
    for h in handles:
        h.remove()
    assert kept.problem is None and len(kept.calls) == 3 and kept.index == 0
    assert kept.nbytes == 3 * (2 * 5 * 32 + 2) * 4  # hidden states and temb of each call, fp32
    for i in range(3):
        assert all(torch.equal(args[0], want) for (args, _), want in zip(kept.calls, seen[i]))
        kept.replay(model.blocks[i], advance=True)
    assert kept.index == 3


def test_what_cannot_stand_in_for_the_generation_is_named():
    torch.manual_seed(0)
    with keeping(ToyTransformer(dim=32, depth=3)) as kept:
        pass
    assert kept.problem == "the calibration never called the transformer"

    model = _Rescaled(dim=32, depth=3)
    with keeping(model) as kept:
        _calls(model)
    assert kept.problem == "_Rescaled changes the hidden states between its blocks" and not kept.calls

    model = ToyTransformer(dim=32, depth=3)
    with keeping(model, budget=1000) as kept:
        _calls(model)
    assert "pass 0.0 GiB" in kept.problem and not kept.calls and kept.nbytes > 1000


def test_a_failed_generation_leaves_no_hook_behind():
    model = ToyTransformer(dim=32, depth=3)
    with pytest.raises(RuntimeError, match="stop"):
        with keeping(model):
            raise RuntimeError("stop")
    assert not any(b._forward_pre_hooks or b._forward_hooks for b in model.blocks)
