"""Offloading meets the other features (issue 61): a conversion, sixbit's LoRAs, PEFT's, the layout.

The rule: refuse with the way that works, or carry the state through; never accept and drop.
- Anything that rebuilds the layers from their weights (``convert_model``, ``sixbit.quantize``,
  ``tune``, ``sixbit.load``) is refused on an offloaded model, whatever offloads it (sixbit's
  disk offload, diffusers' group offloading, accelerate's hooks), and changes nothing.
- A LoRA loaded onto a disk-offloaded model acts on every call and after ``disable()``; scale,
  switch-off and unload act too (they used to be zeroed with the group's placeholders).
- diffusers' ``fuse_lora`` / ``unfuse_lora`` of a disk-offloaded model are refused (they change
  the placeholders in place; the group files would undo them).
- The layout: ``"fast"`` under disk offload keeps operands of the real weights (they used to be
  built from the placeholders: 8 dB), and ``disable()`` gives the model back the layout it had.
- A TensorParallelWrapper of an offloaded model, and offloading a split one, are refused.
"""

import pytest
import torch

import sixbit
from sixbit import kernels
from sixbit.lora import set_loras_enabled
from sixbit.nn import QuantLinear
from sixbit.optimize import enable_memory_optimization
from sixbit.zoo.shapes import load_pipeline

PROMPT = "a red circle moving right"


def _generate(pipe):
    out = pipe(PROMPT, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt")
    return torch.as_tensor(out.frames)


def _converted(preset="w8a8", layout="compact"):
    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, None, preset, layout=layout)
    return pipe


def _disk(pipe, tmp_path):
    return enable_memory_optimization(pipe, prefetch_depth=1, onload_device="cpu", offload_device=tmp_path)


# ---- a conversion (or a checkpoint load) on an offloaded model -------------------------------------


def _offload(how, pipe, tmp_path):
    """Offload ``pipe``'s transformer as ``how`` says; returns what undoes it."""
    model = pipe.transformer
    if how == "sixbit-disk":
        return _disk(pipe, tmp_path).disable
    if how == "diffusers-memory":  # group offloading in CPU memory: nothing to undo in this diffusers
        from diffusers.hooks import apply_group_offloading

        apply_group_offloading(model, onload_device="cpu", offload_device="cpu", offload_type="block_level",
                               num_blocks_per_group=1)
        return lambda: None
    from accelerate import cpu_offload

    cpu_offload(model, execution_device="cpu")  # what mode="cpu_offload" installs, on a machine with an accelerator
    return pipe.remove_all_hooks


CONVERSIONS = {
    "convert_model": lambda pipe, path: sixbit.convert_model(pipe, None, "w8a8"),
    "quantize": lambda pipe, path: sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="int8")),
    "tune": lambda pipe, path: sixbit.tune(pipe.transformer, lambda: None, max_bits=6.0, progress=False),
    "load": lambda pipe, path: sixbit.load(path, pipe),
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The full-precision video, and a checkpoint of the converted model."""
    checkpoint = sixbit.save(_converted().transformer, tmp_path_factory.mktemp("checkpoint") / "w8a8.safetensors")
    return _generate(load_pipeline("wan")), checkpoint


@pytest.mark.parametrize("conversion, how", [*((c, "sixbit-disk") for c in CONVERSIONS),
                                             ("convert_model", "diffusers-memory"), ("convert_model", "accelerate")])
def test_a_conversion_of_an_offloaded_model_is_refused_and_changes_nothing(conversion, how, plain, tmp_path):
    """It used to quantize the disk offload's zero placeholders: a video 7.8 dB from full precision
    (w8a8 is 42 dB), still broken after disable()."""
    video, checkpoint = plain
    pipe = load_pipeline("wan")
    undo = _offload(how, pipe, tmp_path / "offload")
    with pytest.raises(ValueError) as error:
        CONVERSIONS[conversion](pipe, checkpoint)
    message = str(error.value)
    assert "weights are offloaded" in message and "disable_memory_optimization" in message
    assert "then enable it again" in message and "\n" not in message
    assert not any(isinstance(m, QuantLinear) for m in pipe.transformer.modules())
    assert sixbit.conversion_of(pipe) is None
    undo()
    assert torch.equal(_generate(pipe), video)


# ---- LoRAs on a disk-offloaded model ---------------------------------------------------------------


def _lora(model, seed=1, strength=0.3):
    """A LoRA on every block's self-attention query (quantized layers) and on one full-precision linear."""
    g = torch.Generator().manual_seed(seed)
    names = [n for n, m in model.named_modules() if isinstance(m, QuantLinear) and n.endswith("attn1.to_q")]
    names.append(next(n for n, m in model.named_modules() if type(m) is torch.nn.Linear))
    tensors = {}
    for name in names:
        layer = model.get_submodule(name)
        tensors[f"{name}.lora_A.weight"] = strength * torch.randn(4, layer.in_features, generator=g)
        tensors[f"{name}.lora_B.weight"] = strength * torch.randn(layer.out_features, 4, generator=g)
    return tensors


STEPS = {  # what is done to the loaded LoRA before the calls compared
    "loaded": lambda pipe: None,
    "scaled": lambda pipe: sixbit.set_lora_scale(pipe, 0.5),
    "switched off": lambda pipe: set_loras_enabled(pipe, False),
    "unloaded": lambda pipe: sixbit.unload_lora(pipe),
}


@pytest.mark.parametrize("lora_first, step", [*((False, step) for step in STEPS), (True, "loaded"), (True, "unloaded")],
                         ids=lambda value: {False: "offload-then-lora", True: "lora-then-offload"}.get(value, value))
def test_a_lora_acts_on_every_call_of_a_disk_offloaded_model_and_after_disable(lora_first, step, tmp_path):
    """A LoRA loaded after the disk offload used to act on the first transformer call only: its
    factors were zeroed with the group's placeholders and never read back (not in the group's
    file), so from the second call on the video equalled the LoRA-free one, also after disable(),
    while sixbit.loras() still listed it."""
    reference = _converted()
    base = _generate(reference)
    sixbit.load_lora(reference, _lora(reference.transformer))
    STEPS[step](reference)
    expected = _generate(reference)
    assert not torch.equal(expected, base) or step in ("switched off", "unloaded")

    pipe = _converted()
    if lora_first:
        sixbit.load_lora(pipe, _lora(pipe.transformer))
    memory = _disk(pipe, tmp_path)
    if not lora_first:
        sixbit.load_lora(pipe, _lora(pipe.transformer))
    STEPS[step](pipe)
    assert torch.equal(_generate(pipe), expected) and torch.equal(_generate(pipe), expected)
    memory.disable()
    assert torch.equal(_generate(pipe), expected)
    assert sixbit.loras(pipe) == ([] if step == "unloaded" else ["default"])


def _peft_loader(folder):
    """A PEFT LoRA on the self-attention queries, saved by diffusers; returns what loads it."""
    import copy

    from peft import LoraConfig

    maker = copy.deepcopy(load_pipeline("wan").transformer)
    maker.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=["to_q"]))
    g = torch.Generator().manual_seed(0)
    for name, p in maker.named_parameters():
        if "lora_" in name:
            p.data = (0.1 if "lora_B" in name else p.shape[1] ** -0.5) * torch.randn(p.shape, generator=g)
    maker.save_lora_adapter(folder, weight_name="lora.safetensors")
    return lambda pipe: pipe.transformer.load_lora_adapter(folder, weight_name="lora.safetensors", prefix=None,
                                                           adapter_name="x")


def test_a_peft_lora_loaded_onto_a_disk_offloaded_model_acts_on_every_call(tmp_path):
    """diffusers' ``load_lora_adapter`` on a full-precision model: PEFT's factors, parameters its
    blocks gained after the group files were written, used to be zeroed with the placeholders."""
    load = _peft_loader(tmp_path / "lora")
    reference = load_pipeline("wan")
    base = _generate(reference)
    load(reference)
    expected = _generate(reference)
    assert not torch.equal(expected, base)
    pipe = load_pipeline("wan")
    memory = _disk(pipe, tmp_path / "offload")
    load(pipe)
    assert torch.equal(_generate(pipe), expected) and torch.equal(_generate(pipe), expected)
    memory.disable()
    assert torch.equal(_generate(pipe), expected)


@pytest.mark.parametrize("safe_fusing", [False, True])
def test_fusing_a_peft_lora_into_a_disk_offloaded_model_is_refused(safe_fusing, tmp_path):
    """fuse_lora adds the LoRA to the weights in place: on the offloaded groups' placeholders, and
    the group files, written once, never see it. It used to raise a raw "more than one element of
    the written-to tensor" after fusing the resident groups, or (safe_fusing) drop the LoRA silently."""
    load = _peft_loader(tmp_path / "lora")
    reference = load_pipeline("wan")
    load(reference)
    expected = _generate(reference)
    pipe = load_pipeline("wan")
    load(pipe)
    memory = _disk(pipe, tmp_path / "offload")
    _generate(pipe)  # some groups resident, the others on placeholders
    for fuse in (pipe.transformer.fuse_lora, pipe.transformer.unfuse_lora):
        with pytest.raises(ValueError, match=r"offloaded.*disable_memory_optimization\(pipe\) first.*then enable it again"):
            fuse(safe_fusing=safe_fusing) if fuse == pipe.transformer.fuse_lora else fuse()
    assert torch.equal(_generate(pipe), expected)  # nothing was fused
    memory.disable()
    pipe.transformer.fuse_lora(safe_fusing=safe_fusing)  # the way that works
    torch.testing.assert_close(_generate(pipe), expected, rtol=0, atol=1e-4)


# ---- the layout under offloading -------------------------------------------------------------------


def _kept(model) -> int:
    return sum(m.converted_nbytes() for m in model.modules() if isinstance(m, QuantLinear))


@pytest.fixture(scope="module")
def w4a8():
    """``w4a8-rtn`` (whose "fast" layout keeps INT8 copies on every CPU kind): its video in each layout."""
    return {layout: _generate(_converted("w4a8-rtn", layout)) for layout in ("fast", "compact")}


@pytest.mark.parametrize("how", ["layout", "keep_int8_weights"])
def test_fast_operands_under_disk_offload_are_made_from_the_real_weights(how, w4a8, tmp_path):
    """They used to be built, at the first call, from the offloaded groups' zero placeholders: the
    video landed 8 dB from full precision (w4a8 is 29 dB), also after disable()."""
    pipe = _converted("w4a8-rtn", "fast" if how == "layout" else "compact")
    memory = _disk(pipe, tmp_path)
    if how == "keep_int8_weights":
        sixbit.keep_int8_weights(pipe)
    assert torch.equal(_generate(pipe), w4a8["fast"]) and sixbit.layout_of(pipe).name == "fast"
    assert memory._scheduler.stats.max_resident_groups == 2  # the groups went back to disk
    memory.disable()
    assert torch.equal(_generate(pipe), w4a8["fast"])


@pytest.mark.parametrize("called_first", [False, True], ids=["offload-then-call", "call-then-offload"])
def test_disable_gives_auto_back_the_layout_it_had(called_first, w4a8, tmp_path):
    """layout="auto" runs "compact" while the weights are offloaded (kept operands would undo the
    saving), however the calls and the offload come; disable() used to leave it compact."""
    pipe = _converted("w4a8-rtn", "auto")
    alone = "fast" if kernels.amx_int8() else "compact"  # without AMX, auto keeps no copies of 4-bit weights
    if called_first:
        assert torch.equal(_generate(pipe), w4a8[alone]) and (_kept(pipe.transformer) > 0) == (alone == "fast")
    memory = _disk(pipe, tmp_path)
    assert torch.equal(_generate(pipe), w4a8["compact"])
    layout = sixbit.layout_of(pipe)
    assert layout.name == "compact" and "offloaded" in layout.reason and _kept(pipe.transformer) == 0
    memory.disable()
    assert torch.equal(_generate(pipe), w4a8[alone])
    layout = sixbit.layout_of(pipe)  # decided again: the offloading is no longer the reason
    assert layout.name == alone and "offloaded" not in layout.reason and (_kept(pipe.transformer) > 0) == (alone == "fast")


def test_a_layout_asked_for_stays_through_offloading(w4a8, tmp_path):
    """"compact" asked for (and keep_int8_weights' choice) is the user's: offloading changes only "auto"."""
    pipe = _converted("w4a8-rtn", "compact")
    memory = _disk(pipe, tmp_path)
    assert torch.equal(_generate(pipe), w4a8["compact"])
    memory.disable()
    assert torch.equal(_generate(pipe), w4a8["compact"]) and sixbit.layout_of(pipe).name == "compact"


# ---- a TensorParallelWrapper ------------------------------------------------------------------------


def test_wrapping_an_offloaded_model_is_refused_before_any_worker_starts(plain, tmp_path):
    """It used to fail with a raw "cannot pickle '_thread.RLock' object" (the offload's hooks)."""
    from sixbit.parallel import TensorParallelWrapper

    pipe = load_pipeline("wan")
    memory = _disk(pipe, tmp_path)
    with pytest.raises(ValueError, match=r"weights are offloaded .*disable_memory_optimization\(pipe\).*TensorParallel"):
        TensorParallelWrapper(pipe, device_ids=["cpu", "cpu"])
    assert torch.equal(_generate(pipe), plain[0])
    memory.disable()


def test_offloading_a_model_split_by_a_tensor_parallel_wrapper_is_refused(tmp_path):
    """Its workers (or row shards) hold the weights: an offload of the caller's copy would be
    accepted and change nothing they run. A stand-in wrapper with workers: starting real ones
    takes a minute on the test machine."""
    from types import SimpleNamespace

    from sixbit.runtime.wrapped import mark, unmark

    pipe = load_pipeline("wan")
    mark(pipe.transformer, SimpleNamespace(driver=object(), shards=None, world=2))  # worker processes
    with pytest.raises(ValueError, match=r"worker processes.*wrapper\.close\(\)"):
        enable_memory_optimization(pipe, onload_device="cpu", offload_device=tmp_path)
    unmark(pipe.transformer)
    mark(pipe.transformer, SimpleNamespace(driver=None, shards=object()))  # torchrun's row shards
    with pytest.raises(ValueError, match=r"split by a TensorParallelWrapper.*close\(\) the wrapper"):
        enable_memory_optimization(pipe, onload_device="cpu", offload_device=tmp_path)
    assert not list(tmp_path.iterdir())
    enable_memory_optimization(pipe, mode="none").disable()  # tiling alone reaches nothing the shards hold
    unmark(pipe.transformer)
