"""convert_model end to end on the shipped shapes pipelines: presets, calibration sources,
rollback on failure, save/load (fresh process, meta device) and frame stabilization."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

import sixbit
from sixbit.methods.stabilize.method import FrameStabilizer, _StabilizeHook
from sixbit.zoo.shapes import all_prompts, load_pipeline
from sixbit.zoo.shapes.world import render, sample_specs

STEPS = 4
CALIB = {"num_inference_steps": 3}


def generate(pipe, prompt="a red circle moving right", seed=7):
    return pipe(prompt, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(seed)).frames


@pytest.fixture(scope="module")
def fp_video():
    return generate(load_pipeline("cogvideox"))


@pytest.fixture(scope="module")
def balanced():
    """The shipped CogVideoX converted with the full method and the frame stabilizer, and its video."""
    pipe = load_pipeline("cogvideox")
    assert sixbit.convert_model(pipe, all_prompts()[:2], "balanced", stabilize_frames=True, calibration_kwargs=CALIB) is pipe
    return pipe, generate(pipe)


@pytest.mark.parametrize("preset", ["balanced", "w8a8-static", "w4a8", "aggressive", "tdc"])
def test_presets_convert_in_place_and_stay_usable(preset, fp_video, balanced):
    if preset == "balanced":
        pipe = balanced[0]
    else:
        pipe = load_pipeline("cogvideox")
        steps = {"num_inference_steps": 4} if preset == "w8a8-static" else CALIB  # its preset has 4 time ranges
        assert sixbit.convert_model(pipe, all_prompts()[:2], preset, calibration_kwargs=steps) is pipe
    conv = sixbit.conversion_of(pipe)
    assert conv.config == sixbit.presets.for_device(sixbit.presets.resolve(preset), "cpu")[0]
    video = generate(pipe)
    assert video.shape == fp_video.shape and np.isfinite(video).all()
    assert (conv.cache is not None) == (conv.config.cache is not None)
    assert conv.dmpq is None  # balanced's DMPQ needs FP4 GEMMs to pay: none on this CPU
    if preset != "tdc":
        assert sixbit.summary(pipe.transformer).bytes_after < sixbit.summary(pipe.transformer).bytes_before
    if preset == "balanced":
        assert conv.config.activations == "int8" and conv.average_act_bits() == 8.0
        assert "INT8" in conv.hardware and conv.hardware in str(sixbit.summary(pipe.transformer))
        assert conv.calibration == {"source": "prompts", "count": 2}  # GPTQ weights still calibrate


def test_transformer_alone_with_pipeline_argument_and_callable_calibration():
    pipe = load_pipeline("wan")
    calls = []

    def run():
        calls.append(1)
        return pipe(all_prompts()[:2], num_inference_steps=STEPS, generator=torch.Generator().manual_seed(0))

    assert sixbit.convert_model(pipe.transformer, run, "w4a6-dynamic") is pipe.transformer
    assert calls and sixbit.conversion_of(pipe.transformer).predictor is not None
    # DMPQ learns what NVFP4 costs the videos: a callable that returns nothing is refused, and nothing changes
    fresh = load_pipeline("wan")
    with pytest.raises(ValueError, match="return the generated videos"):
        sixbit.convert_model(fresh.transformer, lambda: fresh(all_prompts()[:1], num_inference_steps=STEPS) and None,
                             "w4a6-dynamic")
    assert sixbit.conversion_of(fresh.transformer) is None and not sixbit.runtime.blocks.quant_linears(fresh.transformer)
    with pytest.raises(ValueError, match="need a pipeline"):
        sixbit.convert_model(load_pipeline("wan").transformer, all_prompts()[:2], "balanced")


def _write_videos(folder, n=2):
    folder.mkdir()
    for i, spec in enumerate(sample_specs(n, seed=5)):
        frames = (render(spec).permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)  # (F, H, W, 3)
        if i == 0:  # a folder of frames with a caption
            sub = folder / "clip0"
            sub.mkdir()
            for k, f in enumerate(frames):
                Image.fromarray(f).resize((64, 64)).save(sub / f"{k:03d}.png")
            (folder / "clip0.txt").write_text(spec.prompt())
        else:  # GIFs at another size; resized to the pipeline's
            imgs = [Image.fromarray(f) for f in frames]
            imgs[0].save(folder / f"clip{i}.gif", save_all=True, append_images=imgs[1:])


def test_calibration_from_a_video_folder(tmp_path):
    _write_videos(tmp_path / "videos")
    from sixbit.calibration.videos import read_videos  # imported here: it ran alone only after another test imported it

    videos = read_videos(tmp_path / "videos")
    assert sorted(v.name for v in videos) == ["clip0", "clip1"]
    assert [bool(v.caption) for v in sorted(videos, key=lambda v: v.name)] == [True, False]
    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, str(tmp_path / "videos"), "w4a6-dynamic", calibration_kwargs=CALIB)
    conv = sixbit.conversion_of(pipe)
    assert conv.calibration["source"] == "videos" and conv.calibration["count"] == 2
    # the predictor was fitted on calls the video runs made: one record per block per calibration step
    assert conv.predictor.pairs and np.isfinite(generate(pipe)).all()
    # replayed along their noising path, the videos give no final-video error: one line per block
    assert conv.predictor.step_starts == [0]


def test_bad_inputs_change_nothing(tmp_path, fp_video):
    pipe = load_pipeline("cogvideox")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no videos"):
        sixbit.convert_model(pipe, str(tmp_path / "empty"), "balanced")
    with pytest.raises(ValueError, match="needs calibration_data"):
        sixbit.convert_model(pipe, None, "balanced")
    with pytest.raises(ValueError, match="unknown preset"):
        sixbit.convert_model(pipe, all_prompts()[:2], "fastest")

    def broken():
        pipe(all_prompts()[:1], num_inference_steps=STEPS)
        raise RuntimeError("calibration crashed")

    with pytest.raises(RuntimeError, match="calibration crashed"):
        sixbit.convert_model(pipe, broken, "balanced")
    assert sixbit.conversion_of(pipe) is None and not sixbit.runtime.blocks.quant_linears(pipe.transformer)
    assert np.array_equal(generate(pipe), fp_video)
    with pytest.raises(ValueError, match="stabilize_frames acts on dynamically quantized"):
        sixbit.convert_model(pipe, None, "tdc", stabilize_frames=True)
    assert sixbit.conversion_of(pipe) is None
    sixbit.convert_model(pipe, None, "w4a8-rtn")
    with pytest.raises(ValueError, match="already quantized or converted"):
        sixbit.convert_model(pipe, None, "w4a8-rtn")


FRESH = textwrap.dedent(
    """
    import sys, numpy as np, torch, sixbit
    from accelerate import init_empty_weights
    from sixbit.zoo.shapes import load_pipeline
    path, expected, meta = sys.argv[1], np.load(sys.argv[2]), sys.argv[3] == "meta"
    pipe = load_pipeline("cogvideox")
    if meta:  # rebuild the transformer with empty weights, then load everything from the file
        with init_empty_weights():
            pipe.transformer = type(pipe.transformer).from_config(pipe.transformer.config)
    sixbit.load(path, pipe)
    conv = sixbit.conversion_of(pipe)
    assert conv.hardware and conv.cache is not None and conv.stabilizer is not None
    video = pipe("a red circle moving right", num_inference_steps=4, generator=torch.Generator().manual_seed(7)).frames
    print("BIT-EXACT" if np.array_equal(video, expected) else f"DIFFERENT {np.abs(video - expected).max()}")
    """
)


@pytest.mark.parametrize("meta", ["fresh", "meta"])
def test_save_and_load_in_a_fresh_process_bit_exact(tmp_path, meta, balanced):
    pipe, expected = balanced
    path = pipe.save(tmp_path / "6bit_model.safetensors")
    header = sixbit.read_header(path)
    assert "INT8" in header["extensions"]["conversion"]["hardware"]  # balanced as it runs on this CPU
    np.save(tmp_path / "expected.npy", expected)
    proc = subprocess.run([sys.executable, "-c", FRESH, str(path), str(tmp_path / "expected.npy"), meta],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BIT-EXACT" in proc.stdout, proc.stdout


@pytest.mark.parametrize("arch", ["cogvideox", "wan"])
def test_stabilizer_acts_on_both_layouts(arch):
    pipe = load_pipeline(arch)
    sixbit.convert_model(pipe, None, "w4a8-rtn", stabilize_frames=True)
    stab = sixbit.conversion_of(pipe).stabilizer
    video = generate(pipe)
    assert np.isfinite(video).all() and stab.stabilized_calls > 0
    # CogVideoX's joint attention/FF see [text, video] rows, Wan's cross-attention K/V text only
    assert stab.plain_calls > 0 if arch == "wan" else stab.stabilized_calls >= stab.plain_calls


def _stabilized_layer(layer, frames, per_frame, deadzone=0.0):
    from diffusers.hooks import HookRegistry

    state = FrameStabilizer(text_tokens="first", deadzone=deadzone)
    state.grid = (frames, per_frame)
    HookRegistry.check_if_exists_or_initialize(layer).register_hook(_StabilizeHook(state), "stab")
    return state


def test_stabilizer_arithmetic_and_flicker_property():
    torch.manual_seed(0)
    frames, per_frame, text, c = 4, 16, 3, 64
    linear = torch.nn.Linear(c, 32)
    plain = sixbit.QuantLinear.from_linear(linear, weight_format="int8", act_mode="int8")
    stab = sixbit.QuantLinear.from_linear(linear, weight_format="int8", act_mode="int8")
    _stabilized_layer(stab, frames, per_frame)
    still = torch.randn(1, 1, per_frame, c) * 3
    video = (still + 0.02 * torch.randn(1, frames, per_frame, c)).reshape(1, frames * per_frame, c)
    x = torch.cat([torch.randn(1, text, c), video], dim=1)
    y = stab(x)
    # the text rows are multiplied as usual; the video rows are L(mean) + L(deviation) - bias
    assert torch.equal(y[:, :text], plain(x[:, :text]))
    v = video.reshape(1, frames, per_frame, c)
    m = v.mean(1)
    expected = plain(m).unsqueeze(1) + (plain((v - m.unsqueeze(1)).reshape(1, -1, c)) - linear.bias).reshape(1, frames, per_frame, -1)
    torch.testing.assert_close(y[:, text:], expected.reshape(1, frames * per_frame, -1), rtol=0, atol=1e-5)
    # rounding error that varies from frame to frame (what the eye sees as flicker) shrinks
    exact = linear(x)[:, text:].reshape(frames, per_frame, -1).detach()

    def frame_jitter(out):
        err = out[:, text:].reshape(frames, per_frame, -1).detach() - exact
        return (err - err.mean(0)).abs().mean().item()

    assert frame_jitter(y) < 0.5 * frame_jitter(plain(x))


def test_stabilizer_dead_zone_holds_near_still_tokens():
    torch.manual_seed(1)
    frames, per_frame, c = 4, 8, 32
    layer = sixbit.QuantLinear.from_linear(torch.nn.Linear(c, 16), weight_format="int8", act_mode="int8")
    _stabilized_layer(layer, frames, per_frame, deadzone=0.1)
    base = torch.randn(1, 1, per_frame, c)
    shift = torch.zeros(1, frames, per_frame, c)
    shift[:, :, :4] = 0.01 * torch.randn(1, frames, 4, c)  # tokens 0-3 barely change: held still
    shift[:, :, 4:] = 1.0 * torch.randn(1, frames, 4, c)   # tokens 4-7 move
    y = layer((base + shift).reshape(1, frames * per_frame, c)).reshape(frames, per_frame, -1)
    assert all(torch.equal(y[f, :4], y[0, :4]) for f in range(frames))
    assert not torch.equal(y[1, 4:], y[0, 4:])


def test_stabilize_frames_values(tmp_path):
    pipe = load_pipeline("wan")
    with pytest.raises(ValueError, match="stabilize_frames must be"):
        sixbit.convert_model(pipe, None, "w4a8-rtn", stabilize_frames=-1)
    sixbit.convert_model(pipe, None, "w4a8-rtn", stabilize_frames=0.2)
    assert sixbit.conversion_of(pipe).stabilizer.deadzone == 0.2
    path = pipe.save(tmp_path / "m.safetensors")
    assert sixbit.read_header(path)["extensions"]["conversion"]["stabilize_frames"] == 0.2
