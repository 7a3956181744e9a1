"""The first block's kept inputs (``sixbit.builder.block_inputs``): replaying them block by
block gives each block exactly the inputs the generation gave it, and where they cannot stand in
for the generation the reason is named."""

import pytest
import torch

from sixbit.builder.block_inputs import keeping
from sixbit.kernels.paths import Path
from sixbit.nn import QuantLinear
from sixbit.nn.execution import plan
from sixbit.nn.precision import ActMode
from fixtures.toy import RescaledToy, ToyTransformer


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

    model = RescaledToy(dim=32, depth=3)
    with keeping(model) as kept:
        _calls(model)
    assert kept.problem == "RescaledToy changes the hidden states between its blocks" and not kept.calls

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


def test_a_quantized_block_replays_through_dense_copies_that_are_dropped_after():
    """A replay multiplies each quantized layer by the dense weight of its full-precision calls
    (rotation and branch folded in), for the replay only: the same outputs as the layer's own
    full-precision path, to fp32 rounding, and no kept copy afterwards."""
    torch.manual_seed(0)
    model = ToyTransformer(dim=32, depth=2)
    with keeping(model) as kept:
        _calls(model)
    block = model.blocks[0]
    block.proj = QuantLinear.from_linear(block.proj, "nvfp4", hadamard_block=16)
    block.proj.lowrank_up, block.proj.lowrank_down = torch.randn(32, 2) * 0.1, torch.randn(2, 32) * 0.1
    with torch.no_grad():
        want = [block(*args, **kwargs) for args, kwargs in kept.calls]
    paths = []
    block.proj.register_forward_pre_hook(lambda m, a: paths.append(plan(m, ActMode.FP, a[0].device)))
    kept.replay(block, advance=True)
    assert paths == [Path.FP_DENSE] * 3
    for (args, _), w in zip(kept.calls, want):
        torch.testing.assert_close(args[0], w, rtol=1e-5, atol=1e-6)
    assert block.proj.converted_nbytes() == 0 and plan(block.proj, ActMode.FP, torch.device("cpu")) is Path.FP
