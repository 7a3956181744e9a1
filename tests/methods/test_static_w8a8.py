import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

import sixbit
from sixbit.kernels.cpu import int8_matmul_backend
from sixbit.calibration.data import LayerStats
from sixbit.methods.static_w8a8.fit import fit_layer
from sixbit.formats import integer
from sixbit.nn import QuantLinear
from sixbit.runtime.context import StepInfo
from sixbit.methods.static_w8a8 import StaticActQuantizer, StaticW8A8State
from sixbit.transforms import smoothquant as sq
from fixtures.tiny_models import TINY_BUILDERS, build_tiny
from fixtures.toy import ToyTransformer

TIMESTEPS = [900, 600, 300, 100]
NAIVE = dict(smoothing="none", time_ranges=1, sigma=0.0, per_branch=False, outliers="none")
LAYERS = ["blocks.0.proj", "blocks.1.proj", "blocks.2.proj"]


def _toy(seed=0, depth=3):
    torch.manual_seed(seed)
    return ToyTransformer(depth=depth)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, 6, 32, generator=g) * 3, torch.randn(1, 6, 32, generator=g) * 0.5


def _run(model, cond, uncond, timesteps=TIMESTEPS):
    outs = []
    with torch.no_grad():
        for t in timesteps:  # context-less calls: the first of a step is "cond", the second "uncond"
            outs.append(model(cond, timestep=torch.full((1,), t)))
            outs.append(model(uncond, timestep=torch.full((1,), t)))
    return outs


def _calibrated(depth=3):
    model = _toy(depth=depth)
    cond, uncond = _inputs()
    data = sixbit.calibrate(model, lambda: _run(model, cond, uncond))
    return model, data, cond, uncond


def _quantizer(model, name):
    return model.get_submodule(name).act_quantizer


def test_static_scales_equal_direct_computation_from_stats():
    model, data, _, _ = _calibrated()
    sixbit.apply_static_w8a8(model, sixbit.StaticW8A8Config(**NAIVE), data)
    for name in LAYERS:
        expected = max(s.amax for s in data.layers[name].values()) / 127
        assert all(row[0][0] == pytest.approx(expected, rel=1e-6) for row in _quantizer(model, name)._table)

    model, data, _, _ = _calibrated()
    cfg = sixbit.StaticW8A8Config(smoothing="none", time_ranges=2, sigma=0.0, per_branch=True)
    sixbit.apply_static_w8a8(model, cfg, data)
    for name in LAYERS:
        table = _quantizer(model, name)._table
        for step in range(4):
            steps = [0, 1] if step < 2 else [2, 3]
            for slot, branch in ((1, "cond"), (2, "uncond")):
                expected = max(data.layers[name][(s, branch)].amax for s in steps) / 127
                assert table[step][slot][0] == pytest.approx(expected, rel=1e-6)


def test_tsq_divisors_and_thresholds_equal_direct_computation():
    model, data, _, _ = _calibrated()
    weights = {n: model.get_submodule(n).weight.detach().clone() for n in LAYERS}
    cfg = sixbit.StaticW8A8Config(smoothing="tsq", alpha=0.5, time_ranges=2, sigma=0.0, tsq_min_gain=0.0)
    sixbit.apply_static_w8a8(model, cfg, data)
    for name in LAYERS:
        q, stats = _quantizer(model, name), data.layers[name]
        for r, steps in enumerate(([0, 1], [2, 3])):
            a = torch.stack([stats[(s, b)].channel_amax for s in steps for b in ("cond", "uncond")]).amax(0)
            s_r = sq.smoothing_factors(a, sq.weight_channel_amax(weights[name]), 0.5)
            assert torch.allclose(q.divisors[q.range_variant[r]], s_r)
            for step in steps:
                expected = max(float((stats[(t, "cond")].channel_amax / s_r).max()) for t in steps)
                assert q.threshold[step, 1] == pytest.approx(expected, rel=1e-6)


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


REDUCTIONS = {"amax", "amin", "max", "min", "aminmax", "quantile", "sort", "topk", "std", "var"}


def test_no_min_max_is_computed_while_generating():
    model, data, cond, uncond = _calibrated()
    dynamic = _toy()
    sixbit.quantize(dynamic, sixbit.QuantConfig(weight_format="int8", act_mode="int8"))
    # the integer GEMM ran: torch._int_mm, or its exact float64 twin where oneDNN reaches no VNNI (AVX2)
    gemm = "_int_mm" if int8_matmul_backend("cpu", 2, 64, 64) == "torch._int_mm" else "mm"
    for preset in ("w8a8-static", "w8a8-static-clip", "w8a8-static-mp"):
        m = _toy()
        sixbit.apply_static_w8a8(m, sixbit.StaticW8A8Config.preset(preset), data)
        with _OpLog() as log:
            _run(m, cond, uncond)
        assert gemm in log.ops and not (log.ops & REDUCTIONS), log.ops & REDUCTIONS
    with _OpLog() as log:  # the check sees the dynamic path's per-token abs-max
        _run(dynamic, cond, uncond)
    assert log.ops & REDUCTIONS


def test_branch_scales_follow_the_branch_including_batched_halves(monkeypatch):
    model, data, cond, uncond = _calibrated()
    cfg = sixbit.StaticW8A8Config(smoothing="none", time_ranges=1, sigma=0.0, per_branch=True)
    sixbit.apply_static_w8a8(model, cfg, data)
    seen = []
    original = StaticActQuantizer.quantize_input

    def spy(self, x):
        parts = original(self, x)
        if self is _quantizer(model, "blocks.0.proj"):
            seen.append(parts[0][1])
        return parts

    monkeypatch.setattr(StaticActQuantizer, "quantize_input", spy)
    table = _quantizer(model, "blocks.0.proj")._table[0]
    assert table[1][0] != pytest.approx(table[2][0])  # cond inputs are 6× larger
    sixbit.track_steps(model).new_generation()
    with torch.no_grad():
        y_cond = model(cond, timestep=torch.full((1,), 880))  # nearest calibrated step: 0
        y_uncond = model(uncond, timestep=torch.full((1,), 880))
        assert seen == [table[1][0], table[2][0]]
        tracker = sixbit.track_steps(model, batched_cfg=True)
        tracker.new_generation()
        y_both = model(torch.cat([uncond, cond]), timestep=torch.full((2,), 880))
    rows = seen[-1].reshape(-1).tolist()
    assert rows == pytest.approx([table[2][0]] * 6 + [table[1][0]] * 6)  # 6 tokens per sample
    assert torch.allclose(y_both[0], y_uncond[0], atol=1e-6) and torch.allclose(y_both[1], y_cond[0], atol=1e-6)
    tracker.batched_cfg = False


def test_runtime_step_is_matched_to_the_nearest_calibrated_timestep_and_state_resets():
    model, data, cond, _ = _calibrated()
    sixbit.apply_static_w8a8(model, sixbit.StaticW8A8Config(time_ranges=2), data)
    q = _quantizer(model, "blocks.1.proj")
    tracker = sixbit.track_steps(model)
    tracker.new_generation()
    with torch.no_grad():
        model(cond, timestep=torch.full((1,), 580))
    assert q._state.selection == (1, 1)  # step 1 (600), branch cond
    tracker.new_generation()
    assert q._state.selection is None
    with pytest.raises(ValueError, match="outside a tracked transformer call"):
        model.blocks[1].proj(cond)


def _quantizer_by_hand(side_bits):
    state = StaticW8A8State([500.0], [(0, 0)], per_branch=False, config={})
    w = integer.quantize(torch.randn(4, 8), bits=8)
    q = StaticActQuantizer(state, torch.ones(1, 8), [w], torch.full((1, 3), 1.0), torch.full((1, 3), 5.0),
                           [127], [0], side_bits=side_bits)
    state.select(StepInfo(0, 500.0, "cond", 0, 0))
    return q, w


def test_outliers_clipped_or_kept_in_a_side_path():
    x = torch.tensor([[0.5, -0.25, 3.0, -5.0, 0.0, 1.0, 0.9, -1.2]])
    q, w = _quantizer_by_hand(side_bits=None)
    (codes, scale), = q.quantize_input(x)
    assert scale == pytest.approx(1 / 127)
    assert codes.tolist() == [[64, -32, 127, -127, 0, 127, 114, -127]]  # clipped at ±1 (round half even)
    q, w = _quantizer_by_hand(side_bits=6)
    (codes2, scale2), (side, side_scale) = q.quantize_input(x)
    assert torch.equal(codes2, codes)
    assert side_scale == pytest.approx(4 / 31)  # (amax − T) / 31
    assert side.tolist() == [[0, 0, round(2 / (4 / 31)), -31, 0, 0, 0, round(-0.2 / (4 / 31))]]
    recon = codes2.float() * scale2 + side.float() * side_scale
    assert (recon - x).abs().max() <= 0.5 / 127 + 0.5 * 4 / 31 + 1e-6
    # The layer multiplies both parts with the int8 GEMM and sums them.
    layer = QuantLinear(w, "int8", act_mode="int8")
    layer.act_quantizer = q
    expected = (codes2.float() @ w.values().float().T * scale2 + side.float() @ w.values().float().T * side_scale)
    assert torch.allclose(layer(x), expected * w.scale.reshape(1, -1), atol=1e-5)
    assert "side path" in layer.execution()


def test_k_sigma_threshold_from_stats():
    x = torch.randn(64, 16)
    x[0, 0] = 40.0
    stats = LayerStats(torch.zeros(16))
    stats.update(x)
    fit = fit_layer(torch.randn(8, 16), {(0, "cond"): stats}, [0], [(0, 0)], smoothing="none", sigma=0.0,
                    k_sigma=3.0, per_branch=False)
    rms = float(x.pow(2).mean().sqrt())
    assert fit.threshold[0, 0] == pytest.approx(3 * rms, rel=1e-5)
    assert fit.amax[0, 0] == pytest.approx(40.0)


def test_mixed_precision_config_and_validation():
    model, data, _, _ = _calibrated(depth=3)
    cfg = sixbit.StaticW8A8Config.preset("w8a8-static-mp", weight_bits={"attention": 6})
    sixbit.apply_static_w8a8(model, cfg, data)
    assert [model.get_submodule(n).weight_format for n in LAYERS] == ["int8", "int6", "int8"]  # boundary blocks 8
    assert _quantizer(model, "blocks.1.proj").qmax == [127, 31, 31, 127]  # A8 first/last range, A6 between
    assert _quantizer(model, "blocks.0.proj").qmax == [127] * 4
    assert "W6A6/8" in model.get_submodule("blocks.1.proj").execution()

    tiny = build_tiny("cogvideox")
    t_data = sixbit.calibrate(tiny.model, lambda: [tiny.model(**tiny.inputs(1, torch.tensor([t]))) for t in TIMESTEPS])
    sixbit.apply_static_w8a8(tiny.model, sixbit.StaticW8A8Config.preset("w8a8-static-mp", boundary_blocks=0), t_data)
    formats = {n: m.weight_format for n, m in tiny.model.named_modules() if isinstance(m, QuantLinear)}
    assert formats["transformer_blocks.0.attn1.to_q"] == "int8" and formats["transformer_blocks.1.ff.net.2"] == "int6"

    with pytest.raises(ValueError) as err:
        sixbit.StaticW8A8Config(smoothing="fancy", act_bits=[8, 9], k_sigma=-1, weight_bits={"mlp": 8})
    for text in ("smoothing='fancy'", "act_bits", "k_sigma", "unknown role 'mlp'"):
        assert text in str(err.value)
    with pytest.raises(ValueError, match="unknown static W8A8 preset"):
        sixbit.StaticW8A8Config.preset("w4a4")


def test_folding_keeps_the_fp_path_and_refuses_bad_inputs():
    model, data, cond, uncond = _calibrated()
    fp = _run(model, cond, uncond)
    q = _toy()
    sixbit.apply_static_w8a8(q, sixbit.StaticW8A8Config(smoothing="asq", alpha=0.5), data)
    for n in LAYERS:
        q.get_submodule(n).act_mode = "fp"  # weight-only: x / s times the folded INT8 weight
    for a, b in zip(_run(q, cond, uncond), fp):
        assert (a - b).pow(2).mean() < 1e-4 * b.pow(2).mean()
    with pytest.raises(ValueError, match="already QuantLinear"):
        sixbit.apply_static_w8a8(q, sixbit.StaticW8A8Config(), data)
    with pytest.raises(ValueError, match="CalibrationData"):
        sixbit.apply_static_w8a8(_toy(), sixbit.StaticW8A8Config(), None)


def test_range_parameters_and_tsq_memory_report():
    model, data, _, _ = _calibrated()
    sixbit.apply_static_w8a8(model, sixbit.StaticW8A8Config(time_ranges=2, tsq_min_gain=0.0, alpha=0.5), data)
    info = sixbit.static_w8a8_info(model)
    assert info.ranges == [(0, 1), (2, 3)]
    # Block 0 sees the same inputs at every step: one smoothing vector, one weight stored.
    assert [info.layers[n]["variants"] for n in LAYERS] == [1, 2, 2]
    assert info.extra_weight_bytes == sum(model.get_submodule(n).weight_nbytes() for n in LAYERS[1:])
    params = sixbit.range_parameters(model, 1)
    q = _quantizer(model, "blocks.1.proj")
    p = params["blocks.1.proj"]
    assert p["steps"] == [2, 3] and p["act_bits"] == 8
    assert torch.equal(p["divisor"], q.divisors[1]) and p["weight_codes"].dtype == torch.int8
    assert torch.allclose(p["act_scale"], torch.tensor([[c[0] for c in q._table[s]] for s in (2, 3)]))
    with pytest.raises(ValueError, match="range_index"):
        sixbit.range_parameters(model, 2)
    shared = _toy()
    sixbit.apply_static_w8a8(shared, sixbit.StaticW8A8Config(time_ranges=2, tsq_min_gain=1.0), data)
    assert sixbit.static_w8a8_info(shared).extra_weight_bytes == 0  # nothing differs enough: one weight


@pytest.mark.parametrize("name", sorted(TINY_BUILDERS))
def test_every_tiny_architecture_runs(name):
    tiny = build_tiny(name)
    calls = [(t, torch.Generator().manual_seed(t)) for t in (900, 500)]

    def run():
        outs = []
        with torch.no_grad():
            for t, _ in calls:
                for _ in range(2):  # cond, uncond
                    outs.append(tiny.output(tiny.model(**tiny.inputs(1, torch.tensor([t])))))
        return outs

    data = sixbit.calibrate(tiny.model, run)
    ref = run()
    sixbit.apply_static_w8a8(tiny.model, sixbit.StaticW8A8Config(time_ranges=2, outliers="side"), data)
    out = run()
    assert any(isinstance(m.act_quantizer, StaticActQuantizer) for m in tiny.model.modules() if isinstance(m, QuantLinear))
    for a, b in zip(out, ref):
        assert torch.isfinite(a).all()
        assert (a - b).pow(2).mean() < 0.01 * b.pow(2).mean()


CHILD = textwrap.dedent(
    """
    import sys, torch, sixbit
    from safetensors.torch import load_file
    sys.path.insert(0, {tests!r})
    from fixtures.tiny_models import build_tiny
    tiny = build_tiny("cogvideox")
    sixbit.load({ckpt!r}, tiny.model)
    sixbit.track_steps(tiny.model, batched_cfg=True)
    expected = load_file({outs!r})
    with torch.no_grad():
        for i, t in enumerate({timesteps!r}):
            out = tiny.output(tiny.model(**tiny.inputs(2, torch.tensor([t, t]))))
            assert torch.equal(out, expected[f"out{{i}}"]), i
    p = sixbit.range_parameters(tiny.model, 1)["transformer_blocks.1.attn1.to_q"]
    assert torch.equal(p["divisor"], expected["divisor"]) and torch.equal(p["act_scale"], expected["act_scale"])
    print("OK")
    """
)


def test_save_load_round_trip_in_a_fresh_process(tmp_path):
    tiny = build_tiny("cogvideox")
    tracker = sixbit.track_steps(tiny.model, batched_cfg=True)  # [uncond, cond] in one batch

    def run():
        with torch.no_grad():
            return [tiny.output(tiny.model(**tiny.inputs(2, torch.tensor([t, t])))) for t in TIMESTEPS]

    data = sixbit.calibrate(tiny.model, run)
    cfg = sixbit.StaticW8A8Config.preset("w8a8-static", time_ranges=2, outliers="side", tsq_min_gain=0.0)
    sixbit.apply_static_w8a8(tiny.model, cfg, data)
    outs = run()
    p = sixbit.range_parameters(tiny.model, 1)["transformer_blocks.1.attn1.to_q"]
    ckpt = sixbit.save(tiny.model, tmp_path / "static.safetensors")
    header = sixbit.read_header(ckpt)
    assert header["extensions"]["static_w8a8"]["ranges"] == [[0, 1], [2, 3]]
    assert any(k.startswith("static_w8a8::") and "/w1_codes" in k for k in _keys(ckpt))  # TSQ copies stored
    save_file({**{f"out{i}": o.contiguous() for i, o in enumerate(outs)}, "divisor": p["divisor"].contiguous(),
               "act_scale": p["act_scale"].contiguous()}, str(tmp_path / "outs.safetensors"))
    tracker.batched_cfg = False
    code = CHILD.format(tests=os.path.dirname(os.path.dirname(__file__)), ckpt=str(ckpt),
                        outs=str(tmp_path / "outs.safetensors"), timesteps=TIMESTEPS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def _keys(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def test_checkpoint_with_an_unknown_extension_is_refused(tmp_path, monkeypatch):
    model, data, _, _ = _calibrated()
    sixbit.apply_static_w8a8(model, sixbit.StaticW8A8Config(time_ranges=2), data)
    ckpt = sixbit.save(model, tmp_path / "m.safetensors")
    from sixbit.checkpoint import file as checkpoint_file
    from sixbit.checkpoint import restore as checkpoint_restore
    from sixbit.methods.registry import extensions

    known = extensions()
    for module in (checkpoint_file, checkpoint_restore):  # a sixbit without the method: saving and restoring
        monkeypatch.setattr(module, "extensions", lambda: {k: v for k, v in known.items() if k != "static_w8a8"})
    fresh = _toy()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match="static_w8a8"):
        sixbit.load(ckpt, fresh)
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
    assert json.dumps(sixbit.read_header(ckpt)["extensions"]["static_w8a8"]["config"])


def test_static_w8a8_selects_layers_as_every_conversion_does():
    """Issue 59: one layer selection (sixbit.builder.selected_layers) for plan_layers and static
    W8A8, so the same include / exclude / boundary_blocks pick the same linears."""
    from sixbit.builder import plan_layers
    from sixbit.config import QuantConfig
    from sixbit.methods.static_w8a8.method import _plan

    model, data, _, _ = _calibrated()
    patterns = dict(include=(r"blocks\..*",), exclude=(r"blocks\.1\..*",))
    static = _plan(model, sixbit.StaticW8A8Config(**NAIVE, **patterns, boundary_blocks=1), data)
    weights = plan_layers(model, QuantConfig(weight_format="int8", **patterns))
    assert set(static) == set(weights) == {"blocks.0.proj", "blocks.2.proj"}
    assert all(boundary for _, boundary in static.values())  # blocks 0 and 2 of 3: one block from an end
