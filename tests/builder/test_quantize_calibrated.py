"""``sixbit.quantize`` with the weight algorithms, on the toy transformer: GPTQ block by block
from calibration runs, the low-rank branch (bytes, save/load), weight-only layers."""

import copy

import pytest
import torch
from torch import nn

import sixbit
from sixbit import QuantConfig
from sixbit.nn import QuantLinear, precision
from sixbit.nn.precision import ActMode, Level
from fixtures.toy import ToyTransformer

TIMESTEPS = [900, 600, 300]


MIX = torch.randn(6, 32, generator=torch.Generator().manual_seed(42))  # inputs live near a 6-dim subspace


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 24, 6, generator=g) @ MIX + 0.05 * torch.randn(2, 24, 32, generator=g)


def _run(model, seed=0, log=None):
    def run():
        if log is not None:
            log.append(1)
        with torch.no_grad():
            return [model(_inputs(seed + i), timestep=torch.tensor([t, t])) for i, t in enumerate(TIMESTEPS)]
    return run


def _error(model, reference):
    out = _run(model, seed=100)()
    return sum(float((o - r).square().sum()) for o, r in zip(out, reference))


def _toy():
    torch.manual_seed(0)
    return ToyTransformer(dim=32, depth=3)


@pytest.mark.parametrize("kept", [True, False], ids=["replayed", "run per block"])
def test_gptq_calibrates_once_and_beats_round_to_nearest(kept, monkeypatch):
    """The calibration runs once and each block replays the first block's kept inputs; where
    they cannot be kept (here: over the memory budget) it runs once per block instead."""
    if not kept:
        monkeypatch.setattr("sixbit.builder.in_memory.default_budget", lambda model: 0)
    reference = _run(_toy(), seed=100)()
    errors = {}
    for hadamard in (None, 16):  # GPTQ's Hessian must follow the rotation into the stored space
        for name, kw in {"rtn": {}, "mse": {"scale_rule": "mse"}, "gptq": {"scale_rule": "mse", "gptq": True}}.items():
            model, calls = _toy(), []
            sixbit.quantize(model, QuantConfig(weight_format="int4-g16", hadamard_block=hadamard,
                                               role_formats={"output": "int4-g16"}, **kw),
                            calibration=_run(model, log=calls), progress=False)
            runs = (1 if kept else 3) if kw.get("gptq") else 0  # run per block: block 0 with proj_out, then 1 and 2
            assert len(calls) == runs
            errors[name, hadamard] = _error(model, reference)
        assert errors["mse", hadamard] < errors["rtn", hadamard]
        assert errors["gptq", hadamard] < 0.5 * errors["mse", hadamard]  # on held-out inputs of the same kind


def test_replayed_calibration_matches_the_block_inputs_a_rerun_would_see():
    """With full-precision calibration inputs, a replay of the kept inputs gives each block the
    inputs a fresh generation would: the converted weights are the same either way."""
    def codes(monkeypatch_budget):
        model = _toy()
        with pytest.MonkeyPatch.context() as mp:
            if monkeypatch_budget:
                mp.setattr("sixbit.builder.in_memory.default_budget", lambda model: 0)
            sixbit.quantize(model, QuantConfig(weight_format="int4-g16", gptq=True, calibration_inputs="full_precision"),
                            calibration=_run(model), progress=False)
        return {n: m.quantized_weight().tensors() for n, m in model.named_modules() if isinstance(m, QuantLinear)}

    replayed, rerun = codes(False), codes(True)
    assert replayed.keys() == rerun.keys() and len(replayed) == 3
    for name in replayed:
        for key, value in replayed[name].items():
            torch.testing.assert_close(value.float(), rerun[name][key].float(), rtol=0, atol=0, msg=f"{name}.{key}")


def test_full_precision_calibration_inputs_build_each_layer_whatever_the_others_are():
    """With ``calibration_inputs="full_precision"`` the last block's GPTQ sees the unchanged model's
    inputs: its weights are the same whether the blocks before it are quantized or not, and the
    model ends with every planned layer swapped in. Sequentially (the default) they differ."""
    last = "blocks.2.proj"

    def last_codes(inputs, only_last):
        model = _toy()
        cfg = QuantConfig(weight_format="int4-g16", gptq=True, calibration_inputs=inputs,
                          include=[last] if only_last else [])
        sixbit.quantize(model, cfg, calibration=_run(model), progress=False)
        assert all(isinstance(model.get_submodule(f"blocks.{i}.proj"), QuantLinear) != (only_last and i < 2)
                   for i in range(3))
        return torch.cat([t.flatten().float() for t in model.get_submodule(last).quantized_weight().tensors().values()])

    assert torch.equal(last_codes("full_precision", True), last_codes("full_precision", False))
    assert not torch.equal(last_codes("quantized", True), last_codes("quantized", False))
    with pytest.raises(ValueError, match="calibration_inputs='fp' is not one of"):
        QuantConfig(calibration_inputs="fp")


def test_gptq_needs_calibration_and_a_failed_run_changes_nothing():
    model = _toy()
    with pytest.raises(ValueError, match="needs calibration"):
        sixbit.quantize(model, QuantConfig(gptq=True))
    calls = []

    def flaky(module, args):  # block 1 fails once the calibration run is over: in its replay, after block 0 is built
        calls.append(1)
        if len(calls) > len(TIMESTEPS):
            raise RuntimeError("calibration died")

    before = {n: m for n, m in model.named_modules()}
    handle = model.blocks[1].register_forward_pre_hook(flaky)
    with pytest.raises(RuntimeError, match="calibration died"):
        sixbit.quantize(model, QuantConfig(gptq=True, role_formats={"output": "nvfp4"}), calibration=_run(model),
                        progress=False)
    handle.remove()
    assert {n: m for n, m in model.named_modules()} == before  # block 0's swapped layers went back
    assert not any(isinstance(m, QuantLinear) for m in model.modules())


def test_lowrank_branch_bytes_output_and_checkpoint(tmp_path):
    model = _toy()
    reference = _run(_toy(), seed=100)()
    sixbit.quantize(model, QuantConfig(weight_format="nvfp4", lowrank_rank=4, scale_rule="mse"), progress=False)
    layer = model.blocks[0].proj
    assert layer.lowrank_rank == 4 and layer.lowrank_up.dtype == torch.float16
    packed = layer.quantized_weight().nbytes
    assert layer.weight_nbytes() == packed + 2 * 4 * (32 + 32)  # fp16 up (32×4) and down (4×32)
    rows = {r.name: r for r in sixbit.summary(model).layers}
    assert rows["blocks.0.proj"].bytes_after == layer.weight_nbytes()
    # the branch adds (x·downᵀ)·upᵀ to the quantized product
    x = torch.randn(5, 32)
    plain = torch.nn.functional.linear(x, layer.quantized_weight().dequantize(), layer.bias)
    branch = (x @ layer.lowrank_down.float().T) @ layer.lowrank_up.float().T
    assert torch.allclose(layer(x), plain + branch, atol=1e-5)
    # and it helps: the same weights without the branch err more
    plain_model = _toy()
    sixbit.quantize(plain_model, QuantConfig(weight_format="nvfp4", scale_rule="mse"), progress=False)
    assert _error(model, reference) < _error(plain_model, reference)
    # save / load into a fresh full-precision model: bit-exact
    path = sixbit.save(model, tmp_path / "m.safetensors")
    fresh = ToyTransformer(dim=32, depth=3)
    sixbit.load(path, fresh)
    assert fresh.blocks[0].proj.lowrank_rank == 4
    for a, b in zip(_run(model, seed=7)(), _run(fresh, seed=7)()):
        assert torch.equal(a, b)


def test_a_corrupted_branch_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model = _toy()
    sixbit.quantize(model, QuantConfig(weight_format="nvfp4", lowrank_rank=4), progress=False)
    path = sixbit.save(model, tmp_path / "m.safetensors")
    header = sixbit.checkpoint.read_header(path)
    header["layers"]["blocks.0.proj"]["lowrank_rank"] = 5
    import json

    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    meta["sixbit"] = json.dumps(header)
    save_file(tensors, str(tmp_path / "bad.safetensors"), meta)
    fresh = ToyTransformer(dim=32, depth=3)
    with pytest.raises(ValueError, match="checksum"):  # a hand edit of the header
        sixbit.load(tmp_path / "bad.safetensors", fresh)
    from sixbit.files.safetensors import tensor_bytes
    from sixbit.checkpoint.file import _digest

    # the same edit with the checksum recomputed: the branch check itself refuses it
    header["sha256"] = _digest(((n, tensors[n].dtype, (tensor_bytes(tensors[n]),)) for n in sorted(tensors)), header)
    meta["sixbit"] = json.dumps(header)
    save_file(tensors, str(tmp_path / "bad.safetensors"), meta)
    with pytest.raises(ValueError, match="rank-5 low-rank branch"):
        sixbit.load(tmp_path / "bad.safetensors", fresh)
    assert not any(isinstance(m, QuantLinear) for m in fresh.modules())


def test_weight_only_layers_multiply_in_full_precision():
    model = _toy()
    sixbit.quantize(model, QuantConfig(weight_format="nvfp4", act_mode="int8",
                                       role_formats={"output": "int4-g16"}), progress=False)
    out, block = model.proj_out, model.blocks[0].proj
    assert out.weight_only and not block.weight_only  # "output" is a weight-only role by default
    scope = precision.PrecisionScope()
    scope.register(Level.STEP, lambda layer, x: ActMode.NVFP4)
    x = torch.randn(3, 32)
    with precision.active(scope):
        assert precision.decide(out, x) is ActMode.FP and precision.decide(block, x) is ActMode.NVFP4
        y = out(x)
    assert torch.equal(y, torch.nn.functional.linear(x, out.quantized_weight().dequantize(), out.bias))
    assert "weight-only" in out.execution()


def test_config_checks_the_new_fields():
    with pytest.raises(ValueError) as e:
        QuantConfig(scale_rule="best", gptq="yes", gptq_damp=2, lowrank_rank=-1, weight_only_roles=["adaln"])
    for part in ("scale_rule='best'", "gptq must be", "gptq_damp", "lowrank_rank", "unknown role 'adaln'"):
        assert part in str(e.value)
    with pytest.raises(ValueError, match="not both"):
        QuantConfig(lowrank_rank=4, lowrank_bits=0.5)
    cfg = QuantConfig(lowrank_bits=0.5)
    assert cfg.lowrank_rank_for(1920, 1920) == 30 and cfg.lowrank_rank_for(192, 192) == 3
    capped = QuantConfig(lowrank_bits=0.5, lowrank_max_rank=16)  # the W4 presets' rule
    assert capped.lowrank_rank_for(1920, 1920) == 16 and capped.lowrank_rank_for(192, 192) == 3
    with pytest.raises(ValueError, match="lowrank_max_rank"):
        QuantConfig(lowrank_bits=0.5, lowrank_max_rank=-2)
    assert QuantConfig(lowrank_rank=20).lowrank_rank_for(32, 32) == 0  # wider than half the layer: none
    assert QuantConfig(gptq=True).needs_calibration and not QuantConfig(scale_rule="mse").needs_calibration


def test_smoothing_before_the_split_is_exact_and_saved(tmp_path):
    """SVDQuant's smoothing: W·diag(s) is stored, inputs are divided by s; without quantization
    error that is the same function, so the quantized model stays close and reloads bit-exactly."""
    model = _toy()
    model.blocks[1].proj.weight.data[:, 3] *= 30  # an input channel the weight leans on
    reference = _run(copy.deepcopy(model), seed=100)()
    calls = []
    sixbit.quantize(model, QuantConfig(weight_format="nvfp4", hadamard_block=16, lowrank_rank=4, smooth_alpha=0.5),
                    calibration=_run(model, log=calls), progress=False)
    assert len(calls) == 1  # smoothing's activation ranges: from the calibration run, replayed block by block
    layer = model.blocks[1].proj
    assert layer.input_divisor is not None and layer.hadamard_block is None  # smoothing replaces the rotation
    assert _error(model, reference) < 0.05 * sum(float(r.square().sum()) for r in reference)
    path = sixbit.save(model, tmp_path / "m.safetensors")
    fresh = ToyTransformer(dim=32, depth=3)
    sixbit.load(path, fresh)
    for a, b in zip(_run(model, seed=7)(), _run(fresh, seed=7)()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="set lowrank_rank or lowrank_bits"):
        QuantConfig(smooth_alpha=0.5)
    with pytest.raises(ValueError, match="smooth_alpha must be"):
        QuantConfig(lowrank_rank=4, smooth_alpha=1.5)
    assert QuantConfig(lowrank_rank=4, smooth_alpha=0.5).needs_calibration
