"""Streamed conversion from a diffusers model folder and loading into a meta-device model.

A streamed conversion must write the very checkpoint an in-memory conversion writes (same
tensors, same header, same checksum) and the model loaded from it on the meta device must
sample bit-exactly like the in-memory converted one. Peak memory at real sizes is measured by
``benchmarks/bench_real_size.py``, not here.
"""

import copy
import dataclasses
import gc
import json
import os

import pytest
import torch

import sixbit
from sixbit import checkpoint, streaming
from sixbit.builder.block_inputs import BlockInputs
from sixbit.presets import resolve
from sixbit.cli import main
from sixbit.models import iter_blocks
from fixtures.tiny_models import build_tiny, sample


def _folder(tm, tmp_path, shard="8KB", dtype=None):
    model = tm.model if dtype is None else copy.deepcopy(tm.model).to(dtype)
    folder = tmp_path / "model"
    model.save_pretrained(folder, max_shard_size=shard)
    return folder


@pytest.mark.parametrize("name", ["cogvideox", "wan", "sana-video"])  # sana-video: pointwise-conv feed-forward
@pytest.mark.parametrize("preset", ["w4a8-rtn", "w8a8"])
def test_streamed_conversion_writes_the_in_memory_checkpoint(name, preset, tmp_path):
    tm = build_tiny(name)
    folder = _folder(tm, tmp_path)
    assert len(list(folder.glob("*.safetensors"))) > 3  # really sharded
    result = sixbit.convert_pretrained(folder, preset, tmp_path / "streamed.safetensors", progress=False)
    assert result.model_class == type(tm.model).__name__
    assert list(result.part_seconds) == ["outside blocks"] + [name for _, name, _, _ in iter_blocks(tm.model)]

    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, None, preset)
    in_memory = sixbit.save(reference.model, tmp_path / "in_memory.safetensors")
    assert checkpoint.read_header(result.path) == checkpoint.read_header(in_memory)  # the checksum covers every tensor

    loaded = sixbit.load_pretrained(result.path, folder)
    assert all(t.device.type == "cpu" for t in loaded.state_dict().values())
    assert sixbit.conversion_of(loaded).config == sixbit.conversion_of(reference.model).config
    assert torch.equal(sample(dataclasses.replace(tm, model=loaded), 2), sample(reference, 2))


def test_a_pipeline_folder_and_bf16_shards(tmp_path):
    """A pipeline folder's transformer/ is found; bf16 weights stay bf16 in the checkpoint (as
    an in-memory conversion of the bf16 model keeps them) and a model built on the meta device
    (fp32 parameters) takes them as they are."""
    model = build_tiny("cogvideox").model.to(torch.bfloat16)
    model.save_pretrained(tmp_path / "pipe" / "transformer", max_shard_size="8KB")
    (tmp_path / "pipe" / "model_index.json").write_text("{}")
    result = sixbit.convert_pretrained(tmp_path / "pipe", "w8a8", tmp_path / "q.safetensors", progress=False)
    sixbit.convert_model(model, None, "w8a8")
    assert checkpoint.read_header(result.path) == checkpoint.read_header(sixbit.save(model, tmp_path / "m.safetensors"))
    loaded = sixbit.load_pretrained(result.path, tmp_path / "pipe")
    fp = {t.dtype for n, t in loaded.state_dict().items() if not n.rpartition(".")[2].startswith("weight_")}
    assert fp == {torch.bfloat16}


def test_refusals_change_nothing(tmp_path):
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    out = tmp_path / "out.safetensors"
    with pytest.raises(ValueError, match="needs calibration="):
        sixbit.convert_pretrained(folder, "w4a8", out, progress=False)
    with pytest.raises(ValueError, match="neither a diffusers model folder"):
        sixbit.convert_pretrained(tmp_path / "nowhere", "w8a8", out, progress=False)
    index = next(folder.glob("*.index.json"))
    data = json.loads(index.read_text())
    first = sorted(data["weight_map"])[0]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((folder / "config.json").read_text())
    (bad / index.name).write_text(json.dumps({"weight_map": {**data["weight_map"], first: "gone.safetensors"}}))
    with pytest.raises(ValueError, match="not in the folder"):
        sixbit.convert_pretrained(bad, "w8a8", out, progress=False)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    (pickled / "diffusion_pytorch_model.bin").write_bytes(b"\x80")
    with pytest.raises(ValueError, match="pickle files, which sixbit never loads"):
        sixbit.convert_pretrained(pickled, "w8a8", out, progress=False)
    other = tmp_path / "other"
    build_tiny("wan", seed=0).model.save_pretrained(other)
    config = json.loads((other / "config.json").read_text())
    config["num_layers"] = 3  # the shards hold 2 blocks
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not fit its config.json"):
        sixbit.convert_pretrained(other, "w8a8", out, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["bad", "model", "other", "pickled"]  # nothing written


def test_a_failure_mid_stream_leaves_no_file(tmp_path, monkeypatch):
    tm = build_tiny("cogvideox")
    folder = _folder(tm, tmp_path)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"previous")
    built = []

    def failing(*args, **kwargs):
        built.append(1)
        if len(built) > 8:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    real = streaming.quantized_linear
    monkeypatch.setattr(streaming, "quantized_linear", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        sixbit.convert_pretrained(folder, "w8a8", out, progress=False)
    assert out.read_bytes() == b"previous"
    progress = "out.safetensors.sixbit-progress"  # the finished parts, for a resume (tests/test_resume.py)
    assert sorted(os.listdir(tmp_path)) == ["model", "out.safetensors", progress]
    assert not [f for f in os.listdir(tmp_path / progress) if f.startswith(".")]  # no temporary file left


def test_cli_streams_a_model_folder_into_a_model_folder_or_a_file(tmp_path, capsys):
    folder = _folder(build_tiny("wan"), tmp_path)
    out = tmp_path / "q.safetensors"
    assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "streaming" in text and "wrote" in text
    assert checkpoint.read_header(out)["model_class"] == "WanTransformer3DModel"
    assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(tmp_path / "q")]) == 0
    assert "WanTransformer3DModel.from_pretrained" in capsys.readouterr().out
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization_config"]["checkpoint"] == checkpoint.read_header(out)


def test_the_conversion_device_is_checked_before_anything_changes(tmp_path, capsys):
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    out = tmp_path / "out.safetensors"
    before = {k: v.clone() for k, v in tm.model.state_dict().items()}
    for device, message in [("tpu", "runs on 'cpu' or a CUDA device"), ("cuda:64", "CUDA device")]:
        with pytest.raises(ValueError, match=message):
            sixbit.convert_pretrained(folder, "w8a8", out, device=device, progress=False)
        with pytest.raises(ValueError, match=message):
            sixbit.convert_model(tm.model, None, "w8a8", device=device)
        assert main(["convert", "--model", str(folder), "--config", "w8a8", "-o", str(out), "--device", device]) != 0
        assert message.split("'")[0] in capsys.readouterr().err
    assert not out.exists() and sixbit.conversion_of(tm.model) is None
    assert all(torch.equal(v, before[k]) for k, v in tm.model.state_dict().items())


def test_a_streamed_gptq_conversion_computes_on_its_device(tmp_path):
    """Every part is read onto ``device`` (the construction-time buffers join it) and the
    calibration gets the transformer there; the checkpoint is the default device's, bit for bit."""
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    seen = []

    def calibration(transformer):
        seen.append({t.device.type for t in [*transformer.parameters(), *transformer.buffers()]} - {"meta"})
        return sample(dataclasses.replace(tm, model=transformer), 1)  # one step: where it runs is what counts

    default = sixbit.convert_pretrained(folder, "w4a8", tmp_path / "a.safetensors", calibration, progress=False)
    here = sixbit.convert_pretrained(folder, "w4a8", tmp_path / "b.safetensors", calibration, device="cpu",
                                     progress=False)
    assert seen == [{sixbit.builder.conversion_device().type}, {"cpu"}]
    if sixbit.builder.conversion_device().type == "cpu":
        assert checkpoint.read_header(default.path) == checkpoint.read_header(here.path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_conversion_on_the_gpu_gives_the_cpu_one_to_its_rounding(tmp_path):
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    cpu = sixbit.convert_pretrained(folder, "w8a8", tmp_path / "cpu.safetensors", device="cpu", progress=False)
    gpu = sixbit.convert_pretrained(folder, "w8a8", tmp_path / "gpu.safetensors", device="cuda", progress=False)
    want = sample(dataclasses.replace(tm, model=sixbit.load_pretrained(cpu.path, folder)), 2)
    got = sample(dataclasses.replace(tm, model=sixbit.load_pretrained(gpu.path, folder)), 2)
    assert float((got - want).norm() / want.norm()) < 1e-2
    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, None, "w8a8", device="cuda")
    assert {t.device.type for t in reference.model.state_dict().values()} == {"cuda"}


@pytest.mark.parametrize("name", ["cogvideox", "wan", "sana-video"])
def test_streamed_gptq_matches_the_in_memory_first_block_and_stays_close(name, tmp_path, monkeypatch):
    """Block 0's Hessians come from the same full-precision calls in both conversions, so its
    layers are bit-identical; later blocks see the full-precision trajectory (streamed) instead
    of the re-run one (in memory): close, not equal. The last block's outputs feed nothing, so
    it is not replayed to advance them."""
    tm = build_tiny(name)
    folder = _folder(tm, tmp_path)
    runs, advanced = [], []
    replay = BlockInputs.replay
    monkeypatch.setattr(BlockInputs, "replay", lambda self, block, advance: advanced.append(advance) or replay(self, block, advance))

    def calibration(transformer):
        runs.append(transformer)
        return sample(dataclasses.replace(tm, model=transformer), 2)

    result = sixbit.convert_pretrained(folder, "w4a8", tmp_path / "s.safetensors", calibration, progress=False)
    assert len(runs) == 1 and "calibration runs" in result.part_seconds
    assert advanced.count(True) == len(list(iter_blocks(tm.model))) - 1
    streamed = sixbit.load_pretrained(result.path, folder)
    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, lambda: sample(reference, 2), "w4a8")
    (_, first, _, _), *_ = iter_blocks(reference.model)
    s_state, r_state = streamed.state_dict(), reference.model.state_dict()
    block0 = [k for k in r_state if k.startswith(f"{first}.")]
    assert block0 and all(torch.equal(s_state[k], r_state[k]) for k in block0)
    fp = sample(tm, 2)
    err = lambda out: float((out - fp).norm() / fp.norm())  # noqa: E731
    e_streamed, e_memory = err(sample(dataclasses.replace(tm, model=streamed), 2)), err(sample(reference, 2))
    assert e_streamed < 2 * e_memory + 0.01, (e_streamed, e_memory)


def test_streamed_gptq_on_full_precision_inputs_is_the_in_memory_conversion(tmp_path, monkeypatch):
    """``calibration_inputs="full_precision"``: each block's Hessians and the next block's inputs
    come from one replay of the full-precision block, streamed as in memory: every block is
    bit-identical to the in-memory conversion's, and no quantized block is replayed."""
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    w4a8 = resolve("w4a8")
    config = dataclasses.replace(w4a8, weights=dataclasses.replace(w4a8.weights, calibration_inputs="full_precision"))
    replays = []
    replay = BlockInputs.replay
    monkeypatch.setattr(BlockInputs, "replay", lambda self, block, advance: replays.append(advance) or replay(self, block, advance))
    result = sixbit.convert_pretrained(folder, config, tmp_path / "s.safetensors",
                                       lambda t: sample(dataclasses.replace(tm, model=t), 2), progress=False)
    blocks = len(list(iter_blocks(tm.model)))
    assert replays == [True] * (blocks - 1) + [False]  # one replay per block; the last one's outputs feed nothing
    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, lambda: sample(reference, 2), config)
    s_state, r_state = sixbit.load_pretrained(result.path, folder).state_dict(), reference.model.state_dict()
    assert s_state.keys() == r_state.keys() and all(torch.equal(s_state[k], r_state[k]) for k in r_state)


@pytest.mark.parametrize("name", ["wan", "cogvideox"])
def test_streamed_dmpq_is_the_in_memory_conversion(name, tmp_path):
    """``"w4a6-dynamic"`` streams: the blocks are converted one at a time, then the converted model
    is loaded and DMPQ fitted on its generations. The checkpoint is the in-memory conversion's (same
    header, checksum and predictor), and it samples like it, to the bit."""
    tm = build_tiny(name)
    folder = _folder(tm, tmp_path)
    runs = []

    def calibration(transformer):
        runs.append(transformer)
        return sample(dataclasses.replace(tm, model=transformer), 2)

    result = sixbit.convert_pretrained(folder, "w4a6-dynamic", tmp_path / "s.safetensors", calibration, progress=False)
    assert "fitting methods" in result.part_seconds and len(runs) > 3  # the weights' calibration, then DMPQ's
    assert all(t is runs[-1] for t in runs[1:]) and runs[0] is not runs[-1]  # DMPQ's runs: the converted model
    reference = copy.deepcopy(tm)
    sixbit.convert_model(reference.model, lambda: sample(reference, 2), "w4a6-dynamic")
    in_memory = sixbit.save(reference.model, tmp_path / "in_memory.safetensors")
    assert checkpoint.read_header(result.path) == checkpoint.read_header(in_memory)  # the checksum covers every tensor
    loaded = sixbit.load_pretrained(result.path, folder)
    assert sixbit.conversion_of(loaded).predictor.to_dict() == sixbit.conversion_of(reference.model).predictor.to_dict()
    assert torch.equal(sample(dataclasses.replace(tm, model=loaded), 2), sample(reference, 2))
    assert not (tmp_path / "s.safetensors.sixbit-progress").exists()  # the fit's file went with the progress folder


def test_streamed_dmpq_into_a_folder_reloads_with_from_pretrained(tmp_path):
    """Into a diffusers folder, the fitted predictor travels with the weights: diffusers'
    ``from_pretrained`` gives the model the single-file checkpoint gives, to the bit."""
    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    calibration = lambda t: sample(dataclasses.replace(tm, model=t), 2)  # noqa: E731
    file = sixbit.convert_pretrained(folder, "w4a6-dynamic", tmp_path / "s.safetensors", calibration, progress=False)
    out = sixbit.convert_pretrained(folder, "w4a6-dynamic", tmp_path / "converted", calibration, progress=False)
    reloaded = type(tm.model).from_pretrained(out.path)
    assert sixbit.conversion_of(reloaded).predictor is not None
    assert torch.equal(sample(dataclasses.replace(tm, model=reloaded), 2),
                       sample(dataclasses.replace(tm, model=sixbit.load_pretrained(file.path, folder)), 2))


def test_a_streamed_dmpq_fit_interrupted_resumes_from_the_converted_blocks(tmp_path, monkeypatch, capsys):
    """Interrupted while DMPQ is fitted, the conversion run again verifies every converted part,
    converts none again and fits DMPQ anew (its progress bar names the stage): the same checkpoint
    as an uninterrupted run's."""
    from sixbit.methods.dmpq import spec

    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    calibration = lambda t: sample(dataclasses.replace(tm, model=t), 2)  # noqa: E731
    whole = sixbit.convert_pretrained(folder, "w4a6-dynamic", tmp_path / "whole.safetensors", calibration, progress=False)
    fit = spec.fit_dmpq

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(spec, "fit_dmpq", interrupted)
    out = tmp_path / "out.safetensors"
    with pytest.raises(KeyboardInterrupt):
        sixbit.convert_pretrained(folder, "w4a6-dynamic", out, calibration, progress=False)
    assert not out.exists() and (tmp_path / "out.safetensors.sixbit-progress").is_dir()
    monkeypatch.setattr(spec, "fit_dmpq", fit)
    capsys.readouterr()
    resumed = sixbit.convert_pretrained(folder, "w4a6-dynamic", out, calibration)
    assert "fitting dmpq on the converted model" in capsys.readouterr().err
    assert resumed.resumed_parts == len(list(iter_blocks(tm.model))) + 1  # every block and the layers outside them
    assert list(resumed.part_seconds) == ["fitting methods"]
    assert checkpoint.read_header(out) == checkpoint.read_header(whole.path)


def test_streamed_calibration_refuses_what_it_cannot_replay(tmp_path):
    tm = build_tiny("hunyuanvideo")  # dual-stream then single-stream blocks: model code between the lists
    folder = _folder(tm, tmp_path)
    ran = []
    with pytest.raises(ValueError, match="block lists"):
        sixbit.convert_pretrained(folder, "w4a8", tmp_path / "o.safetensors",
                                  lambda t: ran.append(sample(dataclasses.replace(tm, model=t), 1)), progress=False)
    assert not ran  # refused before any generation
    with pytest.raises(ValueError, match="needs calibration="):
        sixbit.convert_pretrained(folder, "w4a8", tmp_path / "o.safetensors", progress=False)
    with pytest.raises(ValueError, match="static W8A8.*choose 'w8a8', 'w4a8' or 'w4a6-dynamic'"):
        sixbit.convert_pretrained(folder, "w8a8-static", tmp_path / "o.safetensors", progress=False)
    assert not (tmp_path / "o.safetensors").exists()


def test_a_loaded_model_generates_with_block_offloading(tmp_path):
    """A model loaded onto the meta device works with block offloading to disk: the blocks wait
    in a folder and are loaded (prefetched) as they compute; the video does not change."""
    from sixbit.optimize import enable_memory_optimization

    tm = build_tiny("wan")
    folder = _folder(tm, tmp_path)
    result = sixbit.convert_pretrained(folder, "w4a8-rtn", tmp_path / "q.safetensors", progress=False)
    loaded = dataclasses.replace(tm, model=sixbit.load_pretrained(result.path, folder))
    reference = sample(loaded, 2)
    enable_memory_optimization(loaded.model, prefetch_depth=1, offload_device=tmp_path / "offload")
    assert torch.equal(sample(loaded, 2), reference)


def test_streamed_conversion_refines_the_branches_on_the_kept_calls(tmp_path):
    tm = build_tiny("cogvideox")
    folder = _folder(tm, tmp_path)
    w4a8 = resolve("w4a8")  # with a rank-2 branch: at width 32 the preset's 0.5 bit buys none
    base = dataclasses.replace(w4a8, weights=dataclasses.replace(w4a8.weights, lowrank_bits=0.0, lowrank_max_rank=0,
                                                                 lowrank_rank=2))
    refined_config = dataclasses.replace(base, weights=dataclasses.replace(base.weights, refine_steps=30))

    def calibration(transformer):  # one step: two kept calls per block to refine on
        return sample(dataclasses.replace(tm, model=transformer), 1)

    plain = sixbit.convert_pretrained(folder, base, tmp_path / "plain.safetensors", calibration, progress=False)
    refined = sixbit.convert_pretrained(folder, refined_config, tmp_path / "refined.safetensors", calibration, progress=False)
    p_state = sixbit.load_pretrained(plain.path, folder).state_dict()
    r_state = sixbit.load_pretrained(refined.path, folder).state_dict()
    branches = [k for k in p_state if "lowrank_" in k]
    assert branches and any(not torch.equal(p_state[k], r_state[k]) for k in branches)
    # block 0 saw the same inputs in both: its codes and scales are untouched (later blocks see the refined outputs)
    block0 = [k for k in p_state if k.startswith("transformer_blocks.0.") and "lowrank_" not in k]
    assert block0 and all(torch.equal(p_state[k], r_state[k]) for k in block0)


def _live_cpu_bytes() -> int:
    """Bytes of every CPU tensor storage alive (each counted once). Tensors without memory of their
    own (the fake tensors an earlier test's torch.compile may leave to the garbage collector) are
    not counted."""
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor) or obj.device.type != "cpu":
            continue
        try:
            ptr = obj.untyped_storage().data_ptr()
        except RuntimeError:  # FakeTensor, FunctionalTensor: no data pointer, no memory
            continue
        if ptr not in seen:
            seen.add(ptr)
            total += obj.untyped_storage().nbytes()
    return total


def test_each_block_is_freed_once_written(tmp_path, monkeypatch):
    """One block resident: after each block is written, what the conversion holds is what it held
    before the first block, not one more full-precision block per block."""
    tm = build_tiny("cogvideox")
    folder = _folder(tm, tmp_path)
    block = sum(t.numel() * t.element_size() for t in next(iter(iter_blocks(tm.model)))[2].state_dict().values())
    del tm
    held, real = {}, streaming._StreamedParts.built

    def built(self, part, layers, swap):
        real(self, part, layers, swap)
        held[part.name] = _live_cpu_bytes()

    monkeypatch.setattr(streaming._StreamedParts, "built", built)
    sixbit.convert_pretrained(folder, "w8a8", tmp_path / "q.safetensors", progress=False)
    first, *later = held.values()
    assert len(later) == 2 and all(h < first + block / 2 for h in later), (held, block)
