import pytest
import torch
from torch import nn

from tiny_models import TINY_BUILDERS, TinyModel, build_tiny

NAMES = sorted(TINY_BUILDERS)


def _resolve(model: nn.Module, path: str) -> nn.Module:
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _forward(tm: TinyModel, batch: int = 2, timestep=None) -> tuple[dict, torch.Tensor]:
    kwargs = tm.inputs(batch, timestep)
    with torch.no_grad():
        out = tm.output(tm.model(**kwargs))
    return kwargs, out


@pytest.mark.parametrize("name", NAMES)
def test_forward_shape(name):
    tm = build_tiny(name)
    assert tm.name == name
    assert not tm.model.training
    assert all(p.dtype == torch.float32 for p in tm.model.parameters())
    kwargs, out = _forward(tm)
    latents = kwargs["hidden_states"]
    assert out.shape == latents.shape
    assert torch.isfinite(out).all()
    assert kwargs["timestep"].shape == (2,)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic(name):
    _, a = _forward(build_tiny(name, seed=3))
    _, b = _forward(build_tiny(name, seed=3))
    _, c = _forward(build_tiny(name, seed=4))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", NAMES)
def test_timestep_matters(name):
    tm = build_tiny(name)
    _, a = _forward(tm, timestep=torch.tensor(100))
    _, b = _forward(tm, timestep=torch.tensor(900))
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_block_lists(name):
    tm = build_tiny(name)
    assert tm.block_lists
    for path in tm.block_lists:
        blocks = _resolve(tm.model, path)
        assert isinstance(blocks, nn.ModuleList)
        assert 1 <= len(blocks) <= 2


@pytest.mark.parametrize("name", NAMES)
def test_linear_in_features_nvfp4_compatible(name):
    tm = build_tiny(name)
    linears = [m for m in tm.model.modules() if isinstance(m, nn.Linear)]
    assert linears
    assert all(m.in_features % 16 == 0 for m in linears)


def test_build_does_not_touch_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_tiny("wan", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        build_tiny("nope")
    for name in NAMES:
        assert name in str(info.value)
