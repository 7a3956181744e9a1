import dataclasses

import pytest
import torch

import sixbit
from sixbit.methods.dmpq import fit_dmpq
from sixbit.methods.dmpq.fit import _line
from sixbit.methods.dmpq import DMPQConfig, DMPQPredictor, apply_dmpq
from sixbit.runtime.blocks import relative_l1
from fixtures.tiny_models import build_tiny
from fixtures.toy import ToyTransformer

TIMESTEPS = [900, 700, 500, 300]


def _toy(depth=3):
    torch.manual_seed(0)
    model = ToyTransformer(depth=depth)
    return sixbit.quantize(model, sixbit.QuantConfig(weight_format="nvfp4", hadamard_block=32))


def _gammas(model, x, t):
    """Γ of each block for one call, computed by hand in the layers' current modes."""
    temb = torch.full((x.shape[0], 1, 1), t / 1000)
    out, h = [], x
    for block in model.blocks:
        y = h + torch.tanh(block.proj(h)) * temb
        out.append(relative_l1(y - h, h))
        h = y
    return out


def test_decisions_follow_the_predictor():
    model = _toy()
    # block 0: E = Γ (goes low when Γ ≤ 0.1); block 1: never low; block 2: always low (once Γ known)
    pred = DMPQPredictor(["blocks.0", "blocks.1", "blocks.2"], [1.0, 0.0, 0.0], [0.0, 1.0, -1.0], threshold=0.1)
    dmpq = apply_dmpq(model, pred)
    x = torch.randn(1, 8, 32)
    expected_b0 = []
    with torch.no_grad():
        prev = None
        for t in TIMESTEPS:
            for b, mode in enumerate(["int8"] * 3 if prev is None else [None, "int8", "nvfp4"]):
                if mode is not None:
                    model.blocks[b].proj.act_mode = mode
            if prev is not None:
                model.blocks[0].proj.act_mode = "nvfp4" if float(prev[0]) <= 0.1 else "int8"
                expected_b0.append(model.blocks[0].proj.act_mode.value)
            g = _gammas(model, x, t)  # what the hooks will measure on this call
            model(x, timestep=torch.tensor([t]))
            prev = g
    report = dmpq.report()
    grid = report.precision_map("cond")
    assert grid[0] == ["int8"] * 3  # no Γ_{t-1} at the first step
    assert [row[1] for row in grid] == ["int8"] * 4 and [row[2] for row in grid[1:]] == ["nvfp4"] * 3
    assert [row[0] for row in grid[1:]] == expected_b0


def test_branches_have_their_own_history_and_batches_decide_conservatively():
    model = _toy(depth=1)
    pred = DMPQPredictor(["blocks.0"], [1.0], [0.0], threshold=0.05)
    dmpq = apply_dmpq(model, pred)
    calm = torch.randn(1, 8, 32) * 100  # large input: the block barely changes it (small Γ)
    busy = torch.randn(1, 8, 32) * 0.01  # small input: tanh term dominates (large Γ)
    with torch.no_grad():
        for t in TIMESTEPS:
            model(calm, timestep=torch.tensor([t]))  # "cond"
            model(busy, timestep=torch.tensor([t]))  # "uncond"
    r = dmpq.report()
    assert [row[0] for row in r.precision_map("cond")] == ["int8", "nvfp4", "nvfp4", "nvfp4"]
    assert [row[0] for row in r.precision_map("uncond")] == ["int8"] * 4
    model._reset_stateful_cache()
    with torch.no_grad():
        for t in TIMESTEPS:
            model(torch.cat([calm, busy]), timestep=torch.tensor([t, t]))  # one busy sample forces INT8
    assert [row[0] for row in dmpq.report().precision_map("cond")] == ["int8"] * 4


def test_report_bits_and_flops():
    model = _toy(depth=2)
    dmpq = apply_dmpq(model, DMPQPredictor(["blocks.0", "blocks.1"], [0.0, 0.0], [0.0, 1.0], threshold=0.5))
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        for t in TIMESTEPS:
            model(x, timestep=torch.tensor([t, t]))
    r = dmpq.report()
    per_call = 2.0 * 16 * 32 * 32  # 16 tokens × one 32×32 linear per block
    assert r.flops == {"int8": per_call * 5, "nvfp4": per_call * 3}
    assert r.flop_share() == {"int8": 5 / 8, "nvfp4": 3 / 8}
    assert r.average_bits == pytest.approx((5 * 8 + 3 * 4.5) / 8)
    assert r.steps == [0, 1, 2, 3]


def test_report_survives_the_pipeline_reset_and_plots(tmp_path):
    model = _toy(depth=2)
    dmpq = apply_dmpq(model, DMPQPredictor(["blocks.0", "blocks.1"], [0.0, 0.0], [0.0, 0.0], threshold=1.0))
    with torch.no_grad():
        for t in TIMESTEPS:
            model(torch.randn(1, 4, 32), timestep=torch.tensor([t]))
    model._reset_stateful_cache()
    r = dmpq.report()
    assert len(r.decisions) == 8
    from sixbit.eval import plots

    path = plots.plot_precision_map(r, tmp_path / "map.png")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


def test_fit_line_threshold_and_target_bits():
    alpha, beta = _line(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 3.0, 5.0]))
    assert (alpha, beta) == pytest.approx((2.0, 1.0))
    assert _line(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 4.0])) == (0.0, 3.0)
    model = _toy()

    def run():
        for _ in range(2):
            for t in TIMESTEPS:
                model(torch.randn(1, 8, 32), timestep=torch.tensor([t]))

    lo = fit_dmpq(model, run, DMPQConfig(target_bits=8.0, error_at="block"))
    hi = fit_dmpq(model, run, DMPQConfig(target_bits=4.5, error_at="block"))
    mid = fit_dmpq(model, run, DMPQConfig(target_bits=6.5, error_at="block"))
    assert len(lo.alpha) == 3 and lo.step_starts == [0] and -1 <= lo.pearson_r <= 1
    assert hi.threshold == float("inf")  # step 0 is always INT8: 4.5 bits is out of reach
    assert lo.threshold < mid.threshold < hi.threshold
    assert fit_dmpq(model, run, DMPQConfig(threshold=0.3, error_at="block")).threshold == 0.3


def test_video_target_learns_which_steps_reach_the_output():
    """Only the last call's output is returned, so NVFP4 at steps 1-2 costs the "video" nothing."""
    model = _toy(depth=2)
    x = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0))

    def run():
        with torch.no_grad():
            return [model(x, timestep=torch.tensor([t])) for t in TIMESTEPS][-1]

    # target: NVFP4 on half the FLOPs = two of the four steps in both blocks
    config = DMPQConfig(target_bits=6.25, step_groups=3, block_groups=2)
    pred = fit_dmpq(model, run, config)
    assert pred.step_starts == [0, 2, 3] and len(pred.alpha[0]) == 3
    assert pred.beta[0][:2] == pred.alpha[0][:2] == [0.0, 0.0]  # steps 1 and 2 cost nothing, exactly
    for layer in (b.proj for b in model.blocks):
        layer.act_mode = "int8"
    int8_output = run()
    dmpq = apply_dmpq(model, pred)
    output = run()
    assert dmpq.report().precision_map() == [["int8"] * 2, ["nvfp4"] * 2, ["nvfp4"] * 2, ["int8"] * 2]
    assert torch.equal(output, int8_output)
    # fitted to the block outputs instead, the line cannot tell steps that reach the output
    block_fit = fit_dmpq(model, run, dataclasses.replace(config, error_at="block"))
    assert block_fit.step_starts == [0]


def test_video_target_needs_videos_from_the_run():
    model = _toy(depth=2)
    for layer in (b.proj for b in model.blocks):
        layer.act_mode = "int8"

    def run():
        for t in TIMESTEPS:
            model(torch.randn(1, 8, 32), timestep=torch.tensor([t]))

    with pytest.raises(ValueError, match="return the generated videos"):
        fit_dmpq(model, run)
    assert all(b.proj.act_mode.value == "int8" for b in model.blocks)
    sizes = iter(range(1, 100))

    def changing():
        return [model(torch.zeros(1, next(sizes), 32), timestep=torch.tensor([t])) for t in TIMESTEPS][-1]

    with pytest.raises(ValueError, match="same videos"):
        fit_dmpq(model, changing)


def test_predictor_step_ranges_round_trip_and_validate():
    pred = DMPQPredictor(["a", "b"], [[1.0, 0.0], [0.5, 2.0]], [[0.0, 1.0], [0.0, 0.0]], 0.5, step_starts=[0, 3])
    assert DMPQPredictor.from_dict(pred.to_dict()) == pred
    g = torch.tensor([0.2])
    assert [float(pred.predict(0, g, s)) for s in (1, 2, 3, 9)] == pytest.approx([0.2, 0.2, 1.0, 1.0])
    g = torch.tensor([0.3])
    assert pred.choose(1, g, 1).value == "nvfp4" and pred.choose(1, g, 5).value == "int8"
    assert DMPQPredictor(["a"], [2.0], [1.0], 0.1).alpha == [[2.0]]  # one number: one range
    with pytest.raises(ValueError, match="one value per block and step range"):
        DMPQPredictor(["a"], [[1.0]], [[0.0]], 0.5, step_starts=[0, 3])
    with pytest.raises(ValueError, match="must start at 0"):
        DMPQPredictor(["a"], [[1.0, 1.0]], [[0.0, 0.0]], 0.5, step_starts=[2, 3])
    with pytest.raises(ValueError, match="error_at"):
        DMPQConfig(error_at="final")
    with pytest.raises(ValueError, match="step_groups"):
        DMPQConfig(step_groups=0)


def test_fit_restores_modes_and_validates():
    model = _toy()
    for layer in (b.proj for b in model.blocks):
        layer.act_mode = "int8"
    fit_dmpq(model, lambda: [model(torch.randn(1, 4, 32), timestep=torch.tensor([t])) for t in (500, 400)],
             DMPQConfig(error_at="block"))
    assert all(b.proj.act_mode.value == "int8" for b in model.blocks)
    with pytest.raises(ValueError, match="quantized"):
        fit_dmpq(ToyTransformer(), lambda: None)
    with pytest.raises(ValueError, match="QuantLinear"):
        apply_dmpq(ToyTransformer(depth=3), DMPQPredictor(["a", "b", "c"], [0] * 3, [0] * 3, 1.0))
    with pytest.raises(ValueError, match="another model"):
        apply_dmpq(model, DMPQPredictor(["a"], [0], [0], 1.0))
    with pytest.raises(ValueError, match="target_bits"):
        DMPQConfig(target_bits=3)


@pytest.mark.parametrize("name", ["cogvideox", "wan", "hunyuanvideo"])
def test_tiny_architectures_end_to_end(name):
    tm = build_tiny(name)
    sixbit.quantize(tm.model, sixbit.QuantConfig(hadamard_block=128))

    def run():
        return [tm.model(**tm.inputs(2, torch.tensor(t))).sample for t in (900, 600, 300) for _ in range(2)]

    pred = fit_dmpq(tm.model, run)
    dmpq = apply_dmpq(tm.model, pred)
    with torch.no_grad():
        run()
    r = dmpq.report()
    assert set(r.flop_share()) <= {"int8", "nvfp4"} and 4.5 <= r.average_bits <= 8
    assert all(m == "int8" for m in r.precision_map("cond")[0])


def test_random_assignment_baseline():
    from sixbit.methods.dmpq import RandomAssignment

    def share(low_share, seed):
        model = _toy(depth=3)
        dmpq = apply_dmpq(model, RandomAssignment(low_share, seed))
        with torch.no_grad():
            for t in range(1000, 0, -50):
                model(torch.randn(1, 4, 32), timestep=torch.tensor([t]))
        r = dmpq.report()
        assert all(m == "int8" for m in r.precision_map()[0])  # no Γ yet: INT8, as DMPQ
        return r.flop_share().get("nvfp4", 0.0), r.precision_map()

    assert share(0.0, 0)[0] == 0.0 and share(1.0, 0)[0] == pytest.approx(19 / 20)
    half, grid_a = share(0.5, 1)
    assert 0.3 < half < 0.65
    assert share(0.5, 1)[1] == grid_a and share(0.5, 2)[1] != grid_a  # seeded
    with pytest.raises(ValueError, match="low_share"):
        RandomAssignment(1.5)


def test_refined_threshold_meets_target_bits_on_calibration_runs():
    model = _toy(depth=4)
    xs = [torch.randn(1, 8, 32) * s for s in (0.3, 1.0, 3.0)]

    def run():
        return [model(x, timestep=torch.tensor([t])) for x in xs for t in range(1000, 0, -50)]

    pred = fit_dmpq(model, run, DMPQConfig(target_bits=6.0))
    tracker = sixbit.runtime.tracker_of(model)
    listeners = len(tracker._listeners)
    dmpq = apply_dmpq(model, pred)
    with torch.no_grad():
        run()
    bits = dmpq.report().average_bits
    assert 5.8 <= bits <= 6.0 + 1e-9  # one 1/240 of the FLOPs per decision: the target is met closely
    sixbit.methods.dmpq.remove_dmpq(model)
    assert len(tracker._listeners) == listeners  # no listener left behind
