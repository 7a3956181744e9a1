"""``sixbit.optimize`` under hostile use (issue 22): a deleted offload folder, typos and files as
offload targets, an accelerator this torch lacks — and saving a disk-offloaded model.

The rule tested throughout: a model whose offloaded weights are gone never computes on its zero
placeholders (every call fails with one clear message), and bad arguments raise a ``ValueError``
naming the argument before anything changes.
"""

import os
import shutil

import pytest
import torch

import sixbit
from sixbit.models import iter_blocks
from sixbit.optimize import (
    HOOK_NAME,
    OffloadedWeightsLost,
    disable_memory_optimization,
    enable_memory_optimization,
    offload_problem,
    resident_weights,
)
from sixbit.zoo.shapes import load_pipeline

PROMPT = "a red circle moving right"


def _pipe():
    pipe = load_pipeline("wan")  # 4 blocks: 4 groups of 1
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="nvfp4"))  # packed buffers travel too
    return pipe


def _generate(pipe):
    out = pipe(PROMPT, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt")
    return torch.as_tensor(out.frames)


def _hooked(model) -> int:
    return sum(getattr(b, "_diffusers_hook", None) is not None and b._diffusers_hook.get_hook(HOOK_NAME) is not None
               for _, _, b, _ in iter_blocks(model))


@pytest.fixture(scope="module")
def reference():
    pipe = _pipe()
    return _generate(pipe), {k: v.clone() for k, v in pipe.transformer.state_dict().items()}


def _offloaded(tmp_path):
    pipe = _pipe()
    memory = enable_memory_optimization(pipe, prefetch_depth=1, onload_device="cpu", offload_device=tmp_path)
    return pipe, memory


@pytest.mark.parametrize("how", ["deleted", "emptied"])
def test_deleted_offload_folder_fails_clearly_on_every_call_and_in_disable(how, tmp_path, reference):
    pipe, memory = _offloaded(tmp_path)
    model = pipe.transformer
    assert torch.equal(_generate(pipe), reference[0])
    folder = memory._folder
    if how == "deleted":
        shutil.rmtree(folder)
    else:
        for path in folder.iterdir():
            path.unlink()

    problem = offload_problem(model)
    assert problem is not None and "offloaded weights are gone" in problem and str(folder) in problem
    for _ in range(2):  # never garbage: the first and every later call fail with the same message
        with pytest.raises(OffloadedWeightsLost, match="offloaded weights are gone") as error:
            _generate(pipe)
        assert str(folder) in str(error.value) and "reload the model" in str(error.value)
    with pytest.raises(OffloadedWeightsLost, match="reload the model"):
        memory.disable()
    # disable() failed: the model stays marked broken and still refuses to compute
    assert _hooked(model) == 4 and offload_problem(model) is not None
    with pytest.raises(OffloadedWeightsLost):
        _generate(pipe)
    with pytest.raises(OffloadedWeightsLost):
        disable_memory_optimization(pipe)
    with pytest.raises(ValueError, match="offloaded weights are gone"), resident_weights(model):
        pass
    with pytest.raises(ValueError, match="offloaded weights are gone"):  # never the zeros under a valid checksum
        sixbit.save(model, tmp_path / "zeros.safetensors")
    assert not (tmp_path / "zeros.safetensors").exists()
    with pytest.raises(OffloadedWeightsLost):  # re-enabling would write the placeholders to disk
        enable_memory_optimization(pipe, prefetch_depth=1, onload_device="cpu", offload_device=tmp_path)
    assert _hooked(model) == 4


def test_a_failed_prefetch_breaks_the_model(tmp_path, reference):
    """Only the file of a group the background thread prefetches is gone: the load fails on that
    thread, and the call fails when the group is entered."""
    pipe, memory = _offloaded(tmp_path)
    _generate(pipe)
    scheduler = memory._scheduler
    victim = next(g for g, state in enumerate(scheduler.state) if state == "offloaded")
    os.unlink(scheduler.groups[victim].safetensors_file_path)
    with pytest.raises(OffloadedWeightsLost, match="is missing"):
        _generate(pipe)
    with pytest.raises(OffloadedWeightsLost):
        _generate(pipe)


def test_truncated_offload_file_is_reported_unreadable(tmp_path):
    pipe, memory = _offloaded(tmp_path)
    for path in memory._folder.iterdir():
        path.write_bytes(b"not safetensors")
    with pytest.raises(OffloadedWeightsLost, match="unreadable"):
        _generate(pipe)


def test_disable_restores_once_the_files_are_back(tmp_path, reference):
    pipe, memory = _offloaded(tmp_path)
    _generate(pipe)
    moved = tmp_path / "moved"
    shutil.move(memory._folder, moved)
    with pytest.raises(OffloadedWeightsLost):
        _generate(pipe)
    with pytest.raises(OffloadedWeightsLost):
        memory.disable()
    shutil.move(moved, memory._folder)
    memory.disable()  # every file readable again: the weights come back, the hooks go
    model = pipe.transformer
    assert _hooked(model) == 0 and offload_problem(model) is None
    assert all(torch.equal(reference[1][k], v) for k, v in model.state_dict().items())
    assert torch.equal(_generate(pipe), reference[0])


def test_saving_a_healthy_offloaded_model_writes_the_real_weights(tmp_path, reference):
    """state_dict() of a disk-offloaded model hands out the zero placeholders of the offloaded
    groups (so a save would write zeros under a valid checksum); inside resident_weights() every
    weight is real, and afterwards the prefetch window holds again."""
    pipe, memory = _offloaded(tmp_path / "offload")
    model = pipe.transformer
    _generate(pipe)
    placeholders = [k for k, v in model.state_dict().items() if not torch.equal(v, reference[1][k])]
    assert placeholders and "offloaded to disk" in offload_problem(model) and "resident_weights" in offload_problem(model)

    with resident_weights(model):
        assert offload_problem(model) is None
        assert all(torch.equal(reference[1][k], v) for k, v in model.state_dict().items())
    path = sixbit.save(model, tmp_path / "wan.safetensors")  # reads the weights back the same way
    assert offload_problem(model) is not None  # offloaded again: memory stays bounded
    assert sum(state == "resident" for state in memory._scheduler.state) <= 2
    assert torch.equal(_generate(pipe), reference[0])

    fresh = load_pipeline("wan")
    sixbit.load(path, fresh.transformer)
    assert torch.equal(_generate(fresh), reference[0])
    memory.disable()
    assert offload_problem(model) is None


def test_offload_problem_and_resident_weights_on_plain_models():
    model = load_pipeline("wan").transformer
    assert offload_problem(model) is None
    with resident_weights(model):
        pass
    meta = load_pipeline("wan").transformer.to("meta")
    assert "meta device" in offload_problem(meta)
    with pytest.raises(ValueError, match="meta device"), resident_weights(meta):
        pass
    with pytest.raises(ValueError, match="offload_problem needs a diffusers pipeline"):
        offload_problem("model")


def _bad_targets(tmp_path):
    afile = tmp_path / "weights.bin"
    afile.write_bytes(b"x")
    return afile


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"offload_device": "cpu0"}, r"offload_device='cpu0' is neither a device nor a folder path.*'\./cpu0'"),
        ({"offload_device": "gpu"}, "offload_device='gpu' is neither a device nor a folder"),
        ({"offload_device": "FILE"}, "is an existing file, not a folder"),
        ({"offload_device": "PATH_FILE"}, "is an existing file, not a folder"),
        ({"offload_device": "FILE/sub"}, "cannot be created as a folder"),
        ({"onload_device": "meta", "offload_device": "DIR"}, "onload_device='meta'"),
    ],
)
def test_offload_targets_that_are_typos_or_files_are_refused(kwargs, message, tmp_path):
    afile = _bad_targets(tmp_path)
    subst = {"FILE": str(afile), "PATH_FILE": afile, "FILE/sub": str(afile) + "/sub", "DIR": str(tmp_path / "d")}
    kwargs = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    pipe = load_pipeline("wan")
    before = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        enable_memory_optimization(pipe, **kwargs)
    assert _hooked(pipe.transformer) == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]
    assert all(torch.equal(before[k], v) for k, v in pipe.transformer.state_dict().items())


@pytest.mark.parametrize("value, where", [("./cpu0", "cpu0"), ("offload/", "offload"), ("~/offload", "home/offload"),
                                          ("existing", "existing"), ("new/deeper", "new/deeper")])
def test_folder_rule_accepts_paths(value, where, tmp_path, monkeypatch):
    """A string with a separator, a leading . or ~, or naming an existing directory is a folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "existing").mkdir()
    memory = enable_memory_optimization(load_pipeline("wan").transformer, onload_device="cpu", offload_device=value)
    try:
        assert "disk" in memory.offload and memory._folder.parent == tmp_path / where
    finally:
        memory.disable()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_cuda_onload_without_cuda_is_a_clear_value_error(device, tmp_path):
    pipe = load_pipeline("wan")
    with pytest.raises(ValueError, match=r"onload_device='cuda(:0)?'.*(no CUDA|no cuda device)"):
        enable_memory_optimization(pipe, onload_device=device, offload_device=tmp_path)
    assert _hooked(pipe.transformer) == 0 and not list(tmp_path.iterdir())


def test_a_transient_load_failure_is_raised_as_is_and_the_next_call_reloads(tmp_path, reference, monkeypatch):
    """Not every failed load is a lost folder (out of memory on the onload device, …): it is raised
    unchanged, the model is not marked broken, and the next call loads the group again instead of
    computing on its placeholders."""
    from sixbit.memory import offload

    pipe, memory = _offloaded(tmp_path)
    _generate(pipe)
    real_load = offload.load_group
    failures = []

    def flaky(group):
        if not failures:
            failures.append(group)
            raise RuntimeError("simulated: out of memory")
        real_load(group)

    monkeypatch.setattr(offload, "load_group", flaky)
    with pytest.raises(RuntimeError, match="simulated") as error:
        _generate(pipe)
    assert not isinstance(error.value, OffloadedWeightsLost) and memory._scheduler.lost is None
    assert torch.equal(_generate(pipe), reference[0])
    memory.disable()
