"""Runtime methods compose through the precision scope: order never matters, layers are never written."""

import itertools

import pytest
import torch

import sixbit
from sixbit.convert import DefaultPrecision
from sixbit.methods.delta_cache import DeltaCacheConfig, disable_delta_cache, enable_delta_cache
from sixbit.methods.dmpq import DMPQPredictor, apply_dmpq, remove_dmpq
from sixbit.nn import ActMode, QuantLinear
from sixbit.nn.precision import Level
from fixtures.toy import ToyTransformer

TIMESTEPS = [950, 900, 850, 800, 750, 700, 650, 600]


def _model():
    torch.manual_seed(0)
    model = ToyTransformer(depth=3)
    return sixbit.quantize(model, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=32))


def _run(model, x):
    with torch.no_grad():
        return torch.stack([model(x, timestep=torch.tensor([t])) for t in TIMESTEPS])


def _layer_attributes(model):
    return {n: {k: v for k, v in m.__dict__.items() if not k.startswith("_")} | {"act_mode": m.act_mode}
            for n, m in model.named_modules() if isinstance(m, QuantLinear)}


INSTALLS = {
    "dmpq": lambda m: apply_dmpq(m, DMPQPredictor([f"blocks.{i}" for i in range(3)], [0.0] * 3, [0.0] * 3, 0.0)),
    # PDR purifies every refresh (ratio 1: any input has an outlier) so it visibly competes with DMPQ
    "cache": lambda m: enable_delta_cache(m, DeltaCacheConfig(threshold=0.5, warmup_steps=2, pdr_outlier_ratio=1.0)),
    "default": lambda m: sixbit.track_steps(m).precision.register(Level.DEFAULT, DefaultPrecision("int8")),
}


def test_installing_methods_in_any_order_gives_identical_outputs():
    x = torch.randn(1, 6, 32)
    results = []
    for order in itertools.permutations(INSTALLS):
        model = _model()
        before = _layer_attributes(model)
        methods = {name: INSTALLS[name](model) for name in order}
        out = _run(model, x)
        assert _layer_attributes(model) == before  # no method wrote onto a layer
        results.append((order, out, methods["dmpq"].report().decisions, methods["cache"].report().decisions,
                        methods["cache"].report().pdr_full_precision_calls))
    first = results[0]
    assert set(first[2].values()) == {"int8", "nvfp4"} and "skip" in first[3].values() and first[4] > 0
    for order, out, dmpq, cache, pdr in results[1:]:
        assert torch.equal(out, first[1]), order
        assert (dmpq, cache, pdr) == first[2:], order


def test_precedence_pdr_over_dmpq_over_default():
    model = _model()
    x = torch.randn(1, 6, 32)
    INSTALLS["default"](model)
    seen = []
    sixbit.track_steps(model).precision.observers.append(lambda layer, v, mode: seen.append(mode))
    _run(model, x)
    assert set(seen) == {ActMode.INT8}  # only the default speaks
    INSTALLS["dmpq"](model)
    seen.clear()
    _run(model, x)
    assert ActMode.NVFP4 in seen and ActMode.FP not in seen  # DMPQ overrides the default
    cache = INSTALLS["cache"](model)
    seen.clear()
    _run(model, x)
    assert ActMode.FP in seen and cache.report().pdr_full_precision_calls == seen.count(ActMode.FP)
    remove_dmpq(model)
    disable_delta_cache(model)
    seen.clear()
    _run(model, x)
    assert set(seen) == {ActMode.INT8}


def test_batched_cfg_whose_branches_disagree_runs_the_higher_precision():
    """A batched cond+uncond call is one GEMM per linear: when DMPQ would give its halves
    different precisions, both run the higher one (INT8); each half alone gets its own."""
    x = torch.randn(1, 6, 32)
    stable, busy = x * 50.0, x * 0.05  # Γ ≈ 0.01 vs ≈ 1: only the first is predicted cheap
    pred = DMPQPredictor([f"blocks.{i}" for i in range(3)], [1.0] * 3, [0.0] * 3, threshold=0.1)

    def modes(batch, batched):
        model = _model()
        sixbit.track_steps(model, batched_cfg=batched)
        dmpq = apply_dmpq(model, pred)
        _run(model, batch)
        return {m for (_, s, _), m in dmpq.report().decisions.items() if s > 0}

    assert modes(stable, False) == {"nvfp4"} and modes(busy, False) == {"int8"}
    assert modes(torch.cat([stable, busy]), True) == {"int8"}


def test_a_second_policy_at_one_level_is_refused():
    model = _model()
    INSTALLS["dmpq"](model)
    with pytest.raises(ValueError, match="already registered"):
        sixbit.track_steps(model).precision.register(Level.STEP, lambda layer, x: ActMode.FP)
