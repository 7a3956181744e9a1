"""Converted diffusers folders written block by block (issue 44): ``convert_pretrained`` into a
folder writes the folder a converted model's ``save_pretrained`` writes (same files, same
``quantization_config``: the single-file checkpoint's header, checksum included), and
``from_pretrained`` restores it bit-exactly, in a fresh process too."""

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sixbit
from sixbit import checkpoint, streaming
from sixbit.pipelines import load_pipeline
from sixbit.zoo.shapes import WEIGHTS_DIR
from fixtures.tiny_models import build_tiny, sample


def _source(tm, tmp_path, shard="8KB"):
    folder = tmp_path / "fp"
    tm.model.save_pretrained(folder, max_shard_size=shard)
    return folder


def _without_origin(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "_name_or_path"}  # where from_pretrained read it


@pytest.mark.parametrize("name, preset", [("cogvideox", "w4a8-rtn"), ("wan", "w8a8")])
def test_a_streamed_folder_is_the_folder_save_pretrained_writes(name, preset, tmp_path):
    tm = build_tiny(name)
    source = _source(tm, tmp_path)
    file = sixbit.convert_pretrained(source, preset, tmp_path / "q.safetensors", progress=False)
    folder = sixbit.convert_pretrained(source, preset, tmp_path / "q", progress=False)
    assert folder.path == tmp_path / "q" and 0 < folder.checkpoint_bytes < folder.source_bytes
    config = json.loads((folder.path / "config.json").read_text())
    assert config["quantization_config"]["checkpoint"] == checkpoint.read_header(file.path)  # same tensors and checksum

    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, None, preset)
    reference.model.save_pretrained(tmp_path / "in_memory")
    assert sorted(os.listdir(folder.path)) == sorted(os.listdir(tmp_path / "in_memory"))
    assert _without_origin(config) == _without_origin(json.loads((tmp_path / "in_memory" / "config.json").read_text()))

    restored = type(tm.model).from_pretrained(folder.path)
    loaded = sixbit.load_pretrained(file.path, source)
    r_state, l_state = restored.state_dict(), loaded.state_dict()
    assert r_state.keys() == l_state.keys() and all(torch.equal(r_state[k], l_state[k]) for k in r_state)
    assert torch.equal(sample(dataclasses.replace(tm, model=restored), 2), sample(dataclasses.replace(tm, model=loaded), 2))


def test_shards_fill_in_block_order_and_a_later_save_replaces_them(tmp_path):
    tm = build_tiny("wan")
    source = _source(tm, tmp_path)
    out = tmp_path / "q"
    sixbit.convert_pretrained(source, "w8a8", out, progress=False, max_shard_size="20KB")
    index = json.loads((out / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and sorted(p.name for p in out.glob("*.safetensors")) == shards
    table = json.loads((out / "config.json").read_text())["quantization_config"]["tensors"]
    assert set(index["weight_map"]) == set(table)
    first = {index["weight_map"][n] for n in table if n.startswith("blocks.0.")}
    last = {index["weight_map"][n] for n in table if n.startswith("blocks.1.")}
    assert max(first) <= min(last)  # written as the blocks came: block 0's shards before block 1's
    sharded = type(tm.model).from_pretrained(out).state_dict()

    sixbit.convert_pretrained(source, "w8a8", out, progress=False)  # one file now: the shards and index go
    assert sorted(os.listdir(out)) == ["config.json", "diffusion_pytorch_model.safetensors"]
    whole = type(tm.model).from_pretrained(out).state_dict()
    assert all(torch.equal(sharded[k], whole[k]) for k in whole)


def test_save_pretrained_writes_through_the_same_writer(tmp_path):
    """The in-memory save shards by the same rule and reloads bit-exactly."""
    tm = build_tiny("wan")
    sixbit.convert_model(tm.model, None, "w4a8-rtn")
    tm.model.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    assert len(list((tmp_path / "m").glob("*-of-*.safetensors"))) > 2
    restored = type(tm.model).from_pretrained(tmp_path / "m")
    assert torch.equal(sample(dataclasses.replace(tm, model=restored), 2), sample(tm, 2))
    with pytest.raises(ValueError, match="is not a size"):
        tm.model.save_pretrained(tmp_path / "n", max_shard_size="big")
    assert not (tmp_path / "n").exists()


def test_a_pipeline_folder_becomes_a_pipeline_folder(tmp_path):
    source = tmp_path / "wan"
    shutil.copytree(WEIGHTS_DIR / "wan", source)  # never written into: the copy is the input
    file = sixbit.convert_pretrained(source, "w8a8", tmp_path / "q.safetensors", progress=False)
    result = sixbit.convert_pretrained(source, "w8a8", tmp_path / "out", progress=False)
    out = result.path
    assert out == tmp_path / "out" and sorted(os.listdir(out)) == sorted(os.listdir(source))
    for path in source.rglob("*"):
        if path.is_file() and "transformer" not in path.parts[len(source.parts):]:
            assert (out / path.relative_to(source)).read_bytes() == path.read_bytes()
    header = json.loads((out / "transformer" / "config.json").read_text())["quantization_config"]["checkpoint"]
    assert header == checkpoint.read_header(file.path)
    assert result.checkpoint_bytes == sum(p.stat().st_size for p in (out / "transformer").glob("*.safetensors"))

    pipe = load_pipeline(str(out))
    assert sixbit.conversion_of(pipe) is not None
    restored, loaded = pipe.transformer.state_dict(), sixbit.load_pretrained(file.path, source).state_dict()
    assert all(torch.equal(restored[k], loaded[k].to(restored[k].dtype)) for k in loaded)
    frames = pipe(["a red circle moving right"], num_inference_steps=1, output_type="np").frames
    assert frames.shape[0] == 1


def test_refused_outputs_write_nothing(tmp_path):
    tm = build_tiny("wan")
    source = _source(tm, tmp_path)
    before = sorted(p.name for p in source.iterdir())
    with pytest.raises(ValueError, match="is the model folder"):
        sixbit.convert_pretrained(source, "w8a8", source, progress=False)
    with pytest.raises(ValueError, match="lies inside the model folder"):
        sixbit.convert_pretrained(source, "w8a8", source / "q", progress=False)
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ValueError, match="is a file: give the folder"):
        sixbit.convert_pretrained(source, "w8a8", tmp_path / "taken", progress=False)
    assert sorted(p.name for p in source.iterdir()) == before
    assert sorted(os.listdir(tmp_path)) == ["fp", "taken"]


def test_a_failure_mid_stream_leaves_no_folder_and_an_old_one_as_it_was(tmp_path, monkeypatch):
    source = _source(build_tiny("cogvideox"), tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text("previous")
    built, real = [], streaming.quantized_linear

    def failing(*args, **kwargs):
        built.append(1)
        if len(built) % 9 == 0:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming, "quantized_linear", failing)
    for out in (tmp_path / "new" / "nested", old):
        with pytest.raises(RuntimeError, match="disk full"):
            sixbit.convert_pretrained(source, "w8a8", out, progress=False, max_shard_size="8KB")
    # the folders it made are gone, but the finished parts wait beside each output for a resume (tests/test_resume.py)
    assert sorted(os.listdir(tmp_path)) == ["fp", "new", "old", "old.sixbit-progress"]
    assert os.listdir(tmp_path / "new") == ["nested.sixbit-progress"]
    assert os.listdir(old) == ["config.json"] and (old / "config.json").read_text() == "previous"


def test_a_streamed_folder_loads_in_a_fresh_process(tmp_path):
    tm = build_tiny("wan")
    out = sixbit.convert_pretrained(_source(tm, tmp_path), "w4a8-rtn", tmp_path / "q", progress=False).path
    expected = tmp_path / "expected.safetensors"
    from safetensors.torch import save_file

    restored = type(tm.model).from_pretrained(out)
    save_file({"video": sample(dataclasses.replace(tm, model=restored), 2)}, str(expected))
    tests = Path(__file__).parent
    code = "\n".join([
        "import dataclasses, sys, torch, sixbit, diffusers",
        f"sys.path.insert(0, {str(tests)!r})",
        "from safetensors.torch import load_file",
        "from fixtures.tiny_models import build_tiny, sample",
        "tm = build_tiny('wan')",
        f"model = diffusers.WanTransformer3DModel.from_pretrained({str(out)!r})",
        "video = sample(dataclasses.replace(tm, model=model), 2)",
        f"print(torch.equal(video, load_file({str(expected)!r})['video']), sixbit.conversion_of(model) is not None)",
    ])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == ["True", "True"]
