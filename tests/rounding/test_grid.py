"""Scale search: the packed result is what the format makes with those scales, and never worse
than absmax in (weighted) squared error."""

import pytest
import torch

from sixbit.formats import integer, nvfp4
from sixbit.rounding.grid import grid_for, supports

FORMATS = ["nvfp4", "int4", "int4-g64", "int8", "int3-g32"]


def _err(q, w, importance=None):
    e = (q.dequantize() - w) ** 2
    return float((e if importance is None else e * importance).sum())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", range(3))
def test_mse_search_never_worse_than_absmax(fmt, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, 128, generator=g) * torch.rand(48, 1, generator=g) * 3
    w[3, :16] = 0  # an all-zero block
    w[5, 7] = 40.0  # an outlier
    importance = torch.rand(128, generator=g) ** 4
    cols = torch.arange(128)
    for imp in (importance, None):
        absmax, mse = grid_for(w, fmt, "absmax", imp), grid_for(w, fmt, "mse", imp)
        q0, q1 = absmax.pack(absmax.round(w, cols)), mse.pack(mse.round(w, cols))
        assert _err(q1, w, imp) <= _err(q0, w, imp)
    if fmt != "int8":  # at 8 bits absmax is already the best scale of most rows
        assert _err(q1, w) < _err(q0, w)  # and on random data the search strictly helps


def test_four_six_rule_never_worse_than_absmax():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    g0, g1 = grid_for(w, "nvfp4", "absmax"), grid_for(w, "nvfp4", "4/6")
    cols = torch.arange(64)
    assert _err(g1.pack(g1.round(w, cols)), w) <= _err(g0.pack(g0.round(w, cols)), w)
    chosen = g1.scales.float() * g1.global_scale
    amax = w.reshape(32, 4, 16).abs().amax(-1)
    six = (amax / 6 / g1.global_scale).to(torch.float8_e4m3fn).float() * g1.global_scale
    four = (amax / 4 / g1.global_scale).to(torch.float8_e4m3fn).float() * g1.global_scale
    assert bool(((chosen == six) | (chosen == four)).all())  # one of the two rules, per block


@pytest.mark.parametrize("fmt", FORMATS)
def test_absmax_grid_is_the_format_itself(fmt):
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    grid = grid_for(w, fmt, "absmax")
    packed = grid.pack(grid.round(w, torch.arange(64)))
    ref = nvfp4.quantize(w) if fmt == "nvfp4" else __import__("sixbit").formats.get(fmt).quantize(w)
    for name, t in ref.tensors().items():
        assert torch.equal(packed.tensors()[name].view(torch.uint8) if t.dtype == torch.float8_e4m3fn else packed.tensors()[name],
                           t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t), name


def test_rounded_values_pack_back_exactly():
    """GPTQ rounds column by column and packs at the end: the packed weight must decode to exactly
    the values it rounded to, in any column order."""
    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(2))
    for fmt in ("nvfp4", "int4-g32"):
        grid = grid_for(w, fmt, "mse")
        perm = torch.randperm(96, generator=torch.Generator().manual_seed(3))
        q = torch.empty_like(w)
        q[:, perm] = grid.round(w[:, perm], perm)
        assert torch.equal(grid.pack(q).dequantize(), q)


def test_fixed_scales_are_checked():
    w = torch.randn(4, 32)
    q = nvfp4.quantize(w)
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4.quantize(w, scales=q.scales)
    with pytest.raises(ValueError, match="float8_e4m3fn of shape"):
        nvfp4.quantize(w, global_scale=q.global_scale, scales=q.scales[:, :1])
    with pytest.raises(ValueError, match="positive values of shape"):
        integer.quantize(w, 4, scale=torch.zeros(4, 1))
    with pytest.raises(ValueError, match="symmetric integers only"):
        integer.quantize(w, 4, symmetric=False, scale=torch.ones(4, 1))


def test_unsupported_formats_and_rules_are_refused():
    assert supports("nvfp4") and supports("int4-g64") and not supports("int4-asym") and not supports("mxfp4")
    with pytest.raises(ValueError, match="not 'mxfp4'"):
        grid_for(torch.randn(4, 32), "mxfp4", "mse")
    with pytest.raises(ValueError, match="unknown scale rule"):
        grid_for(torch.randn(4, 32), "nvfp4", "best")
    with pytest.raises(ValueError, match="for NVFP4"):
        grid_for(torch.randn(4, 32), "int4", "4/6")


@pytest.mark.parametrize("fmt", ["nvfp4", "int4", "int4-g64"])
def test_rows_round_each_column_as_round_does(fmt):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(24, 128, generator=g)
    grid = grid_for(w, fmt, "mse")
    cols = torch.randperm(128, generator=g)[:40]
    rounder = grid.rows(cols)
    for j in range(len(cols)):
        assert torch.equal(rounder(j, w[:, cols[j]].contiguous()), grid.round(w[:, cols[j:j + 1]], cols[j:j + 1])[:, 0])


@pytest.mark.parametrize("fmt", ["nvfp4", "int4-g64"])
def test_the_compiled_search_picks_scales_as_good_as_the_reference(fmt, monkeypatch):
    from sixbit.kernels import cpu

    g = torch.Generator().manual_seed(4)
    w = torch.randn(512, 2048, generator=g) * 0.02  # 1 M elements: the compiled kernels
    importance = torch.rand(2048, generator=g) + 0.1
    fast = grid_for(w, fmt, "mse", importance)
    monkeypatch.setattr(cpu, "_MIN_ELEMENTS", 1 << 40)  # every weight small: the reference
    reference = grid_for(w, fmt, "mse", importance)
    pack = lambda grid: grid.pack(grid.round(w, torch.arange(w.shape[1])))  # noqa: E731
    scales = (lambda grid: grid.scales.float()) if fmt == "nvfp4" else (lambda grid: grid.scale)  # noqa: E731
    differ = float((scales(fast) != scales(reference)).float().mean())
    assert differ < 1e-3 and (differ == 0 or cpu.cpu_ops_compiling())  # only near-ties may go the other way
    assert _err(pack(fast), w, importance) == pytest.approx(_err(pack(reference), w, importance), rel=1e-6)
