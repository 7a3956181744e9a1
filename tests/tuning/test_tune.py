"""sixbit.tune on a tiny CogVideoX whose layer sensitivities are built by hand.

Every tuned linear's weight is put exactly on the INT4 grid (one scale ``2^-6`` per 16 weights,
each group's largest code ±7), so INT4 g16 reproduces it bit for bit — except four layers that get
a perturbation off the grid of size 3e-2, 3e-3, 3e-4 and 3e-5: their INT4 error, hence their cost
to the output, falls by ~100× from one to the next. Stage 1 must rank exactly those four, in that
order, and find the others free.
"""

from __future__ import annotations

import json

import pytest
import torch
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny
from torch import nn

import sixbit
from sixbit import ConvertConfig, QuantConfig
from sixbit.presets import from_json_dict
from sixbit.tuning import Tuner, tune, tune_model
from sixbit.tuning.library import tuned_layers
from sixbit.tuning.search import Constraint, greedy
from sixbit.calibration.quality import PSNR_CAP, psnr_bound, psnr_of
from sixbit.tuning.sensitivity import Sensitivity

BASE = ConvertConfig(weights=QuantConfig(weight_format="int4-g16"), activations="fp")
FORMATS = ("int4-g16", "int8")
PERTURBED = {"transformer_blocks.1.ff.net.0.proj": 3e-2, "transformer_blocks.0.attn1.to_v": 3e-3,
             "transformer_blocks.1.attn1.to_q": 3e-4, "transformer_blocks.0.ff.net.2": 3e-5}


def _on_grid(shape, gen) -> torch.Tensor:
    codes = torch.randint(-7, 8, shape, generator=gen).float()
    groups = codes.reshape(shape[0], -1, 16)
    groups[..., 0] = 7.0  # every group's largest code is 7: its absmax scale is exactly 2^-6
    return groups.reshape(shape) * 2.0**-6


@pytest.fixture(scope="module")
def tiny():
    tm = build_tiny("cogvideox")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name in tuned_layers(tm.model, BASE):
            layer = tm.model.get_submodule(name)
            w = _on_grid(tuple(layer.weight.shape), gen)
            if name in PERTURBED:  # a fraction of a grid step off the grid
                w = w + PERTURBED[name] * (torch.rand(w.shape, generator=gen) - 0.5)
            layer.weight.copy_(w)
    return tm


def _run(tm):
    return lambda: sample(tm, steps=2)


@pytest.fixture(scope="module")
def tuner(tiny):
    return Tuner(tiny.model, _run(tiny), base=BASE, formats=FORMATS, progress=False)


def test_hand_built_sensitivities_are_ranked_exactly(tuner):
    library, sens = tuner.library, tuner.sensitivity
    int4 = {layer.name: sens.cost(i, [v.format for v in layer.variants].index("int4-g16"))
            for i, layer in enumerate(library.layers)}
    ranked = sorted(int4, key=int4.get, reverse=True)
    assert ranked[:4] == list(PERTURBED)  # largest perturbation first
    exact = [int4[name] for name in ranked[4:]]
    assert max(exact) < 1e-3 * int4[ranked[3]]  # on the grid: free (up to float reassociation)
    proxy = {layer.name: sens.proxy[i][[v.format for v in layer.variants].index("int4-g16")]
             for i, layer in enumerate(library.layers)}
    assert sorted(proxy, key=proxy.get, reverse=True)[:4] == list(PERTURBED)


def test_greedy_upgrades_the_most_sensitive_layers_first(tuner):
    library = tuner.library
    low = library.uniform("int4-g16")
    numel = {layer.name: layer.numel for layer in library.layers}
    # room for exactly the two most sensitive layers at 16 bits
    extra = sum(numel[n] * (16 - library.layers[0].variants[0].bits) for n in list(PERTURBED)[:2])
    budget = library.bits(low) + extra / library.total_numel + 1e-6
    report = tuner.search(max_bits=budget, generations=1, population=4)
    upgraded = {n for n, f in report.greedy["formats"].items() if f != "int4-g16"}
    assert upgraded == set(list(PERTURBED)[:2])


def test_search_is_deterministic_and_respects_its_budget(tiny, tuner):
    budget = tuner.library.bits(tuner.library.uniform("int4-g16")) + 1.0
    again = Tuner(tiny.model, _run(tiny), base=BASE, formats=FORMATS, progress=False)  # nothing remembered
    a, b = (t.search(max_bits=budget, seed=7, generations=3, population=6) for t in (tuner, again))
    assert a.config.to_dict() == b.config.to_dict()
    assert [dict(h, seconds=0) for h in a.search.history] == [dict(h, seconds=0) for h in b.search.history]
    assert a.best["bits"] <= budget
    assert b.search.measured and all(bits <= budget + 1e-9 for bits, _ in b.search.measured.values())
    # the greedy assignment seeds the population: the search scores it or better, on the same scale
    # (sensitivity="blocks": predictions for both; the pick itself is then measured, greedy's is not)
    scored = max(psnr for _, psnr in a.search.measured.values())
    assert scored >= a.greedy["psnr"] - 1e-9 and (not a.greedy["measured"] or a.best["psnr"] >= a.greedy["psnr"])


def test_min_psnr_reaches_the_target_at_fewer_bits_than_int8(tuner):
    int8 = tuner.uniform["int8"]
    target = tuner.uniform["int4-g16"]["psnr"] + 10
    assert target < int8["psnr"]
    report = tuner.search(min_psnr=target, generations=3, population=6)
    assert report.best["psnr"] >= target
    assert report.best["bits"] < int8["bits"]


def test_config_round_trips_through_json_and_convert_model(tiny, tuner):
    report = tuner.search(max_bits=tuner.library.bits(tuner.library.uniform("int4-g16")) + 2.0,
                          generations=2, population=4)
    config = from_json_dict(json.loads(json.dumps(report.config.to_dict())))
    assert config.to_dict() == report.config.to_dict()
    fresh = build_tiny("cogvideox").model
    fresh.load_state_dict(tiny.model.state_dict())
    sixbit.convert_model(fresh, None, config)
    for name, fmt in report.best["formats"].items():
        layer = fresh.get_submodule(name)
        if fmt is None:
            assert type(layer) is nn.Linear
        else:
            assert layer.weight_format == fmt


def test_tuning_leaves_the_model_unchanged(tiny):
    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    modules = dict(tiny.model.named_modules())
    out = sample(tiny, steps=2)
    config = tune(tiny.model, _run(tiny), max_bits=6.0, base=BASE, formats=FORMATS, progress=False)
    assert config.weights.layer_formats
    assert dict(tiny.model.named_modules()) == modules
    assert all(torch.equal(v, tiny.model.state_dict()[k]) for k, v in before.items())
    assert torch.equal(sample(tiny, steps=2), out)
    assert sixbit.conversion_of(tiny.model) is None
    assert "forward" not in vars(tiny.model)  # the converted copies stood in only while they ran


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "exactly one of max_bits, max_bytes, min_psnr"),
    (dict(max_bits=5, min_psnr=30), "exactly one"),
    (dict(max_bits=-1), "max_bits must be a finite number > 0"),
    (dict(max_bits=5, base="balanced"), "the base config cannot be tuned"),
    (dict(max_bits=5, formats=["int9"]), "unknown format 'int9'"),
    (dict(max_bits=5, formats="int8"), "formats must be a non-empty list"),
    (dict(max_bits=5, time_budget_s=0), "time_budget_s must be"),
])
def test_bad_arguments_are_refused_before_anything_runs(tiny, kwargs, message):
    calls = []
    with pytest.raises(ValueError, match=message):
        tune_model(tiny.model, lambda: calls.append(1), **{"base": BASE, "formats": FORMATS, **kwargs})
    assert not calls


def test_a_run_that_returns_no_videos_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="must return them"):
        tune(tiny.model, lambda: [sample(tiny, steps=1), None][1], max_bits=7, base=BASE, formats=FORMATS, progress=False)
    assert not any(type(m).__name__ == "QuantLinear" for m in tiny.model.modules())


def test_a_budget_below_every_assignment_is_refused(tuner):
    with pytest.raises(ValueError, match="below the fewest bits"):
        tuner.search(max_bits=1.0)


def test_max_bytes_is_respected(tuner):
    library = tuner.library
    low, high = (library.bytes(library.uniform(f)) for f in ("int4-g16", "int8"))
    budget = (low + high) // 2
    report = tuner.search(max_bytes=budget, generations=2, population=4)
    assert report.best["bytes"] <= budget < report.uniform["int8"]["bytes"]
    assert all(library.bytes(g) <= budget for g in report.search.measured)


def test_an_unrepeatable_run_is_refused(tiny):
    calls = iter(range(1000))  # every run adds another offset: no two runs agree
    with pytest.raises(ValueError, match="different videos"):
        Tuner(tiny.model, lambda: sample(tiny, steps=1) + next(calls), base=BASE, formats=FORMATS, progress=False)


def test_a_run_that_never_calls_the_tuned_model_is_refused(tiny):
    """Issue 48: a callable generating with another model scored 100 dB for every assignment, and
    the tuner picked the fewest bits for every layer without a word."""
    other = build_tiny("cogvideox", seed=1)
    with pytest.raises(ValueError, match="never called the tuned model's layers"):
        Tuner(tiny.model, lambda: sample(other, steps=1), base=BASE, formats=FORMATS, progress=False)
    assert not any(type(m).__name__ == "QuantLinear" for m in tiny.model.modules())


def test_videos_that_do_not_depend_on_the_tuned_layers_are_refused(tiny):
    """The model runs, but the videos returned come from elsewhere: no layer changes them."""
    other = build_tiny("cogvideox", seed=1)

    def run():
        sample(tiny, steps=1)
        return sample(other, steps=1)

    with pytest.raises(ValueError, match="do not change when any tuned layer is quantized"):
        Tuner(tiny.model, run, base=BASE, formats=FORMATS, progress=False)


def test_an_unreachable_psnr_is_said_so(tuner, caplog):
    report = tuner.search(min_psnr=150, generations=1, population=4)  # above even all-16-bit's cap
    assert "NOT reached" in report.config.description and "no assignment reached 150.00 dB" in caplog.text


@pytest.fixture(scope="module")
def gptq_tuner(tiny):
    base = ConvertConfig(weights=QuantConfig(weight_format="int4-g16", gptq=True, scale_rule="mse",
                                             role_formats={"modulation": "int4-g16"}), activations="fp")
    return Tuner(tiny.model, _run(tiny), base=base, formats=FORMATS, progress=False)


def test_full_precision_calibration_converts_to_exactly_the_videos_the_search_measured(tiny, gptq_tuner):
    """With GPTQ in the base, ``convert_model`` with ``calibration_inputs="full_precision"`` builds
    the very candidates the search ran (and the base's modulation layers, which the search ran
    quantized too): the converted model generates the measured videos bit for bit."""
    tuner = gptq_tuner
    assert tuner.library.fixed and all(".norm" in name for name in tuner.library.fixed)
    assert float(tuner.sensitivity.base.min()) > 0  # the fixed layers' own error, under every assignment
    genome = tuner.library.uniform("int4-g16")
    assert torch.equal(tuner.converted_error(tuner.library.formats(genome), "full_precision"), tuner.evaluator(genome))
    assert not torch.equal(tuner.converted_error(tuner.library.formats(genome), "quantized"), tuner.evaluator(genome))


@pytest.mark.parametrize("sequential_db", [+1.0, -1.0])
def test_the_pick_takes_the_better_calibration_inputs_and_reports_the_converted_psnr(tiny, gptq_tuner, monkeypatch,
                                                                                    sequential_db):
    """The search's pick (and, where it was measured, the greedy one: under ``sensitivity="blocks"``
    it is predicted) is converted with GPTQ on the quantized blocks' outputs too; the tuned config
    takes the better of the two, and its PSNR is what the config converts to."""
    tuner = gptq_tuner
    monkeypatch.setattr(tuner, "_sequential", {})  # nothing remembered from real conversions
    monkeypatch.setattr(tuner, "converted_error", lambda formats, inputs: tuner.evaluator(
        tuple(next(i for i, v in enumerate(layer.variants) if v.format == formats[layer.name])
              for layer in tuner.library.layers)) * 10 ** (-sequential_db / 10))
    report = tuner.search(max_bits=6.0, generations=2, population=4)
    measured = tuner.evaluator.psnr(report.search.best)
    expected = "quantized" if sequential_db > 0 else "full_precision"
    for found in [report.best] + ([report.greedy] if report.greedy["measured"] else []):
        assert found["calibration_inputs"] == expected
    assert report.config.weights.calibration_inputs == expected
    assert report.best["psnr"] == pytest.approx(measured + max(sequential_db, 0))
    assert f"{report.best['psnr']:.2f} dB on the calibration videos" in report.config.description
    assert f"calibrated on {expected.replace('_', '-')} inputs" in report.config.description


def test_the_tuned_config_converts_to_the_reported_psnr(tiny, gptq_tuner):
    report = gptq_tuner.search(max_bits=6.0, generations=2, population=4)
    fresh = build_tiny("cogvideox")
    fresh.model.load_state_dict(tiny.model.state_dict())
    sixbit.convert_model(fresh.model, _run(fresh), from_json_dict(report.config.to_dict()))
    assert psnr_of(gptq_tuner.evaluator.error(_run(fresh)())) == report.best["psnr"]
    assert 20 < report.best["psnr"] < PSNR_CAP


def _videos(*psnrs: float) -> torch.Tensor:
    """Per-video MSEs of videos with these PSNRs (dB)."""
    return torch.tensor([10 ** (-p / 10) for p in psnrs], dtype=torch.float64)


def test_min_psnr_is_checked_against_the_mean_minus_one_standard_error(tuner, monkeypatch):
    """Two calibration videos at 30 and 40 dB: mean 35 dB, SD 7.07, SE 5 dB — a 34 dB target is
    met on the mean but not on its lower bound; one video has no margin."""
    spread, alone = _videos(30, 40), _videos(35)
    assert psnr_of(spread) == pytest.approx(35) and psnr_bound(spread) == pytest.approx(30)
    assert psnr_bound(alone) == psnr_of(alone) == pytest.approx(35)
    target = Constraint(min_psnr=34)
    assert target.psnr(spread) == pytest.approx(30) and target.psnr(alone) == pytest.approx(35)
    assert Constraint(max_bits=5).psnr(spread) == pytest.approx(35)  # budgets maximize the mean

    # the search's feasibility: only the first layer costs anything; its lowest format alone
    # gives those videos (feasible on the mean), its next one 40 dB on both (feasible on the bound)
    library = tuner.library
    for first, reached in ((spread, 1), (alone, 0)):
        zero = torch.zeros_like(first)
        mse = [[zero] * len(layer.variants) for layer in library.layers]
        mse[0] = [first, _videos(*[40] * len(first)), zero][: len(library.layers[0].variants)]
        sens = Sensitivity(mse, [[0.0] * len(row) for row in mse], float("nan"), 0.0)
        assert greedy(library, sens, target)[0] == reached  # upgraded only when the bound misses

    # the search's pick and the warning: every assignment's videos at 30 and 40 dB
    monkeypatch.setattr(type(tuner.evaluator), "__call__", lambda self, genome: spread)
    report = tuner.search(min_psnr=34, generations=1, population=4)
    assert report.best["psnr"] == pytest.approx(35) and report.best["psnr_bound"] == pytest.approx(30)
    assert "NOT reached" in report.config.description
    assert "mean − 1 SE 30.00 dB" in report.summary()
