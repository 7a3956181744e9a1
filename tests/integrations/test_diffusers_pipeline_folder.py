"""A real diffusers pipeline (a tiny ``WanPipeline``, :mod:`tests.fixtures.tiny_pipelines`)
converted by ``sixbit convert`` or loaded with a ``PipelineQuantizationConfig``, then reloaded by
``DiffusionPipeline.from_pretrained`` — in a fresh process that imports only sixbit and diffusers
— gives the video the in-memory conversion gives, bit for bit."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sixbit
from sixbit.cli import main as cli
from sixbit.nn import QuantLinear
from tests.fixtures.tiny_pipelines import generate, tiny_wan_pipeline

TESTS = Path(__file__).resolve().parents[2]


def _reference(preset: str) -> np.ndarray:
    """The video of the tiny pipeline converted in memory with ``preset``."""
    pipe = tiny_wan_pipeline()
    sixbit.convert_model(pipe, quant_config=preset)
    return generate(pipe)


def _fresh_process_video(folder: Path, tmp_path: Path) -> np.ndarray:
    """``DiffusionPipeline.from_pretrained(folder)`` in a new interpreter: its video."""
    out = tmp_path / "video.npy"
    script = (
        "import sys, numpy as np, sixbit\n"
        "from diffusers import DiffusionPipeline\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from tests.fixtures.tiny_pipelines import generate\n"
        f"pipe = DiffusionPipeline.from_pretrained({str(folder)!r})\n"
        "pipe.set_progress_bar_config(disable=True)\n"
        "from sixbit.nn import QuantLinear\n"
        "assert any(isinstance(m, QuantLinear) for m in pipe.transformer.modules()), 'not converted'\n"
        f"np.save({str(out)!r}, generate(pipe))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize("preset", ["w8a8", "w4a8-rtn"])
def test_a_pipeline_folder_from_sixbit_convert_reloads_in_diffusers_bit_identically(preset, tmp_path, capsys):
    tiny_wan_pipeline().save_pretrained(tmp_path / "fp")
    assert cli(["convert", "--model", str(tmp_path / "fp"), "--config", preset, "-o", str(tmp_path / "q")]) == 0
    assert "DiffusionPipeline.from_pretrained" in capsys.readouterr().out  # the line that says how to use it
    video = _fresh_process_video(tmp_path / "q", tmp_path)
    assert np.array_equal(video, _reference(preset))
    assert not np.array_equal(video, generate(tiny_wan_pipeline()))  # the converted model runs, not the fp one


def test_pipeline_quantization_config_then_save_pretrained_round_trips(tmp_path):
    from diffusers import DiffusionPipeline, PipelineQuantizationConfig

    tiny_wan_pipeline().save_pretrained(tmp_path / "fp")
    quant = PipelineQuantizationConfig(quant_backend="sixbit", quant_kwargs={"preset_or_config": "w8a8"},
                                       components_to_quantize=["transformer"])
    pipe = DiffusionPipeline.from_pretrained(tmp_path / "fp", quantization_config=quant)
    pipe.set_progress_bar_config(disable=True)
    assert type(pipe.transformer.blocks[0].attn1.to_q) is QuantLinear
    video = generate(pipe)
    assert np.array_equal(video, _reference("w8a8"))
    pipe.save_pretrained(tmp_path / "q")
    assert np.array_equal(_fresh_process_video(tmp_path / "q", tmp_path), video)
