"""diffusers' own features on converted transformers, for the three ways to get one (issue 44):

- ``convert_model``: a full-precision ``from_pretrained`` converted in memory (no ``hf_quantizer``);
- ``quantization_config``: ``from_pretrained(folder, quantization_config=SixbitConfig("w8a8"))``;
- ``saved folder``: ``save_pretrained`` of the first, then a plain ``from_pretrained``.

Each feature works (the output is the one without it, or it acts as diffusers documents) or is
refused with one line naming the fix. A tiny random Wan (2 blocks) keeps the file fast; a feature
that needs a pipeline gets the shapes pipeline around it (only its transformer is called).

CPU GEMMs round differently by a weight's memory alignment (a 16-byte-aligned copy of the same
weight can differ in the last bit), so models loaded differently are never compared bit for bit:
each check compares one model with and without the feature.

What needs an accelerator is checked here as far as a CPU allows: ``enable_model_cpu_offload``
runs with ``device="cpu"`` (hooks and moves, nothing gained); ``enable_sequential_cpu_offload``
installs and takes the packed weights off the model, but accelerate's hooks fail on a CPU
execution device for every model (full precision included), so running it is left to the
accelerator test at the end.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo as dynamo
from diffusers import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig, WanTransformer3DModel
from diffusers.hooks.group_offloading import GroupOffloadingHook
from diffusers.loaders import WanLoraLoaderMixin

import sixbit
from sixbit.nn import QuantLinear
from sixbit.methods.delta_cache import DeltaCache
from sixbit.runtime import blocks, hooks
from sixbit.zoo.shapes import make_pipeline, pipeline_class
from fixtures.tiny_models import build_tiny
from test_lora import _peft_lora

KINDS = ["convert_model", "quantization_config", "saved folder"]
TIMESTEPS = (900.0, 300.0)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("wan")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny):
    root = tmp_path_factory.mktemp("models")
    tiny.model.save_pretrained(root / "fp")
    _convert(root / "fp").save_pretrained(root / "converted")
    return root


def _convert(fp_folder, preset="w8a8", torch_dtype=None):
    model = WanTransformer3DModel.from_pretrained(fp_folder, torch_dtype=torch_dtype)
    sixbit.convert_model(model, None, preset)
    return model


def _make(kind: str, folders, preset: str = "w8a8", torch_dtype=None):
    """A fresh converted transformer of ``kind``."""
    if kind == "convert_model":
        return _convert(folders / "fp", preset, torch_dtype)
    if kind == "quantization_config":
        return WanTransformer3DModel.from_pretrained(folders / "fp", quantization_config=sixbit.SixbitConfig(preset),
                                                     torch_dtype=torch_dtype)
    return WanTransformer3DModel.from_pretrained(folders / "converted", torch_dtype=torch_dtype)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def _call(tiny, model, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """One transformer call on fixed inputs (in ``dtype``, on ``device``); the output in fp32 on the CPU."""
    inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device)
              for k, v in tiny.inputs(1, 500.0).items()}
    with torch.no_grad():
        return model(**inputs)[0].float().cpu()


def _loop(tiny, model, state=None) -> torch.Tensor:
    """Two CFG steps inside diffusers' cache contexts (as diffusers' Wan pipeline calls them)."""
    x = tiny.latents(1)
    with torch.no_grad():
        for i, t in enumerate(TIMESTEPS):
            if state is not None:
                state["t"] = t
            preds = []
            for branch, negative in (("cond", False), ("uncond", True)):
                with model.cache_context(branch):
                    preds.append(tiny.output(model(**tiny.inputs(1, t, latents=x, negative=negative))))
            pred = preds[1] + 4.0 * (preds[0] - preds[1])
            x = x + ((TIMESTEPS[i + 1] if i + 1 < len(TIMESTEPS) else 0.0) - t) / 1000.0 * pred
    return x


def _pipe(model):
    """The shapes Wan pipeline around ``model`` (only ``pipe.transformer`` is called)."""
    pipe = make_pipeline("wan", transformer=model)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _dtypes(model) -> dict[str, torch.dtype]:
    return {n: t.dtype for n, t in model.state_dict().items()}


def _packed(model) -> set[str]:
    return {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, QuantLinear) for k in m.state_dict()}


@pytest.mark.parametrize("torch_dtype", [None, torch.bfloat16])
def test_the_three_kinds_hold_the_same_conversion(folders, torch_dtype):
    """Same tensors and dtypes: with ``torch_dtype``, the modules Wan keeps in fp32
    (``_keep_in_fp32_modules``) stay fp32 whichever way the model was made. (The folder was
    converted from fp32 weights: its packed layers keep that conversion's tensors, fp32 biases
    included; the rest takes ``torch_dtype`` as the others do.)"""
    models = {k: _make(k, folders, torch_dtype=torch_dtype) for k in KINDS}
    states = {k: m.state_dict() for k, m in models.items()}
    first, packed = states["convert_model"], _packed(models["convert_model"])
    assert all(s.keys() == first.keys() for s in states.values())
    assert all(s[n].dtype == first[n].dtype for s in states.values() for n in first if n not in packed)
    same = KINDS if torch_dtype is None else KINDS[:2]  # quantizing while loading is convert_model, bit for bit
    assert all(torch.equal(states[k][n], first[n]) for k in same for n in first)
    if torch_dtype is not None:
        assert first["condition_embedder.time_embedder.linear_1.weight"].dtype == torch.float32  # kept in fp32
        assert first["proj_out.weight"].dtype == torch_dtype
    assert getattr(models["convert_model"], "hf_quantizer", None) is None
    assert all(models[k].is_quantized and models[k].hf_quantizer is not None for k in KINDS[1:])


# ---- offloading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offload_type", ["block_level", "leaf_level", "block_level to disk"])
def test_group_offload(kind, offload_type, folders, tiny, tmp_path):
    """diffusers' group offloading moves ``QuantLinear``'s packed buffers with the parameters; to a
    folder they make the round trip through safetensors, in packed form."""
    model = _make(kind, folders)
    reference = _call(tiny, model)
    disk = offload_type.endswith("to disk")
    model.enable_group_offload(onload_device=torch.device("cpu"), offload_type=offload_type.split()[0],
                               num_blocks_per_group=1 if offload_type != "leaf_level" else None,
                               offload_to_disk_path=str(tmp_path) if disk else None)
    assert any(isinstance(h, GroupOffloadingHook) for m in model.modules() for h in hooks.hooks_of(m))
    out = _call(tiny, model)
    if not disk:
        assert torch.equal(out, reference)
        return
    # read back from files: the same bits, in fresh (differently aligned) memory
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    from safetensors import safe_open

    dtypes = set()
    for path in tmp_path.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:  # a file this test's offload wrote
            dtypes |= {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 — safe_open is not iterable
    assert "U8" in dtypes  # the INT8 codes travel packed (as stored: bytes), not dequantized


def test_model_cpu_offload(kind, folders, tiny):
    """Whole-model offload moves the converted transformer with ``.to(device)`` when it is called
    (accelerate copies the weights even from the CPU to the CPU: fresh memory, so a full-precision
    model's output moves in the last bit too)."""
    pipe = _pipe(_make(kind, folders))
    reference = _call(tiny, pipe.transformer)
    if not torch.accelerator.is_available():
        with pytest.raises(RuntimeError, match="requires accelerator"):  # diffusers' own refusal, for every model
            pipe.enable_model_cpu_offload()
    pipe.enable_model_cpu_offload(device="cpu")
    assert hasattr(pipe.transformer, "_hf_hook")
    torch.testing.assert_close(_call(tiny, pipe.transformer), reference, rtol=1e-5, atol=1e-5)
    pipe.remove_all_hooks()


def test_sequential_cpu_offload_takes_the_packed_weights(kind, folders):
    """Each leaf's tensors leave the model (meta) for accelerate's weights map, packed buffers
    included (Wan has a parameter of its own, so diffusers offloads buffers too)."""
    pipe = _pipe(_make(kind, folders))
    pipe.enable_sequential_cpu_offload(device="cpu")
    layers = [m for m in pipe.transformer.modules() if isinstance(m, QuantLinear)]
    assert layers and all(b.device.type == "meta" for m in layers for n, b in m.named_buffers()
                          if n.startswith("weight_"))
    pipe.remove_all_hooks()


@pytest.mark.skipif(not torch.accelerator.is_available(), reason="CPU offload needs an accelerator to onload to")
@pytest.mark.parametrize("mode", ["enable_model_cpu_offload", "enable_sequential_cpu_offload"])
def test_cpu_offload_to_the_accelerator_matches(kind, mode, folders, tiny):
    device = torch.accelerator.current_accelerator()
    reference = _call(tiny, _make(kind, folders).to(device), device=device)
    pipe = _pipe(_make(kind, folders))
    getattr(pipe, mode)(device=device)
    torch.testing.assert_close(_call(tiny, pipe.transformer, device=device), reference, rtol=1e-4, atol=1e-4)


# ---- LoRA -----------------------------------------------------------------------------------------------------


class _LoraPipeline(WanLoraLoaderMixin, pipeline_class("wan")):
    """The shapes pipeline with diffusers' Wan LoRA loader (as ``WanPipeline`` has it)."""


def test_lora_through_the_pipeline(kind, folders, tiny, tmp_path):
    model = _make(kind, folders)
    lora = _peft_lora(WanTransformer3DModel.from_pretrained(folders / "fp"), tmp_path, strength=0.5)
    pipe = _LoraPipeline(**_pipe(model).components)
    reference = _call(tiny, model)
    pipe.load_lora_weights(tmp_path, weight_name=lora.name, adapter_name="x")
    assert sixbit.loras(pipe.transformer) == ["x"] and pipe.get_list_adapters() == {"transformer": ["x"]}
    with_lora = _call(tiny, model)
    assert not torch.allclose(with_lora, reference, atol=1e-3)
    pipe.set_adapters("x", 0.0)
    assert torch.equal(_call(tiny, model), reference) and model.active_adapters() == []
    pipe.set_adapters(["x"], [1.0])
    assert torch.equal(_call(tiny, model), with_lora) and model.active_adapters() == ["x"]
    pipe.disable_lora()
    assert torch.equal(_call(tiny, model), reference)
    pipe.enable_lora()
    assert torch.equal(_call(tiny, model), with_lora)
    with pytest.raises(ValueError, match="side branches.*keep running unfused.*full-precision model"):
        pipe.fuse_lora()
    assert torch.equal(_call(tiny, model), with_lora)  # refused: nothing changed
    pipe.unfuse_lora()  # nothing was fused: changes nothing
    with pytest.raises(ValueError, match="keep the LoRA file"):
        model.save_lora_adapter(tmp_path / "out", adapter_name="x")
    pipe.delete_adapters("x")
    assert sixbit.loras(pipe.transformer) == [] and torch.equal(_call(tiny, model), reference)
    pipe.fuse_lora()  # no LoRA: nothing to fuse, nothing refused


def test_a_lora_loaded_while_loras_are_off_waits_for_enable(folders, tiny, tmp_path):
    model = _make("convert_model", folders)
    lora = _peft_lora(WanTransformer3DModel.from_pretrained(folders / "fp"), tmp_path, strength=0.5)
    reference = _call(tiny, model)
    model.disable_lora()
    model.load_lora_adapter(tmp_path, weight_name=lora.name, prefix=None, adapter_name="x")
    assert torch.equal(_call(tiny, model), reference) and model.active_adapters() == []
    sixbit.set_lora_scale(model, 0.5)  # kept for when LoRAs are on again
    assert torch.equal(_call(tiny, model), reference)
    model.enable_lora()
    assert model.active_adapters() == ["x"] and model.get_submodule("blocks.0.attn1.to_q").loras == {"x": 0.5 * 2.0}
    with pytest.raises(ValueError, match="hotswap=True is not supported"):
        model.load_lora_adapter(tmp_path, weight_name=lora.name, prefix=None, adapter_name="x", hotswap=True)


# ---- torch.compile, gradient checkpointing ----------------------------------------------------------------


def test_compile_matches_eager(kind, folders, tiny):
    """Dynamo with the ``"eager"`` backend, as ``tests/test_compile.py``: the same kernels run."""
    model = _make(kind, folders)
    eager = _call(tiny, model)
    dynamo.reset()
    assert torch.equal(_call(tiny, torch.compile(model, backend="eager")), eager)


def test_gradient_checkpointing_leaves_inference_alone(kind, folders, tiny):
    model = _make(kind, folders)
    reference = _call(tiny, model)
    model.enable_gradient_checkpointing()
    assert model.is_gradient_checkpointing
    assert torch.equal(_call(tiny, model), reference)
    inputs = tiny.inputs(1, 500.0)
    with torch.enable_grad():  # the checkpointed path: the same blocks, recomputed only for a backward pass
        assert torch.equal(model(**inputs)[0].detach(), reference)


# ---- caches ---------------------------------------------------------------------------------------------------


def test_diffusers_caches_run_on_converted_models(kind, folders, tiny):
    model = _make(kind, folders)
    reference = _loop(tiny, model)
    model.enable_cache(FirstBlockCacheConfig(threshold=0.0))  # never reuses: the same computation
    assert torch.equal(_loop(tiny, model), reference)
    model.disable_cache()
    model.enable_cache(FirstBlockCacheConfig(threshold=1e9))  # always reuses after the first step
    cached = _loop(tiny, model)
    assert torch.isfinite(cached).all() and not torch.equal(cached, reference)
    model.disable_cache()
    state = {}
    model.enable_cache(PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2,
                                                       spatial_attention_timestep_skip_range=(0, 1000),
                                                       current_timestep_callback=lambda: state["t"]))
    broadcast = _loop(tiny, model, state)
    assert torch.isfinite(broadcast).all() and not torch.equal(broadcast, reference)


@pytest.mark.parametrize("config", [FirstBlockCacheConfig(threshold=0.1),
                                    PyramidAttentionBroadcastConfig(current_timestep_callback=lambda: 500)],
                         ids=["first block cache", "pyramid attention broadcast"])
def test_a_diffusers_cache_and_the_delta_cache_are_refused_together(kind, config, folders, tiny):
    message = r"diffusers' cache .*Config \(enable_cache\) and sixbit's delta cache.*model.disable_cache\(\)"
    model = _make(kind, folders)
    model.enable_cache(config)
    with pytest.raises(ValueError, match=message):
        sixbit.enable_delta_cache(model, sixbit.DeltaCacheConfig())
    assert not list(blocks.attached(model, DeltaCache))  # refused before anything was attached
    model.disable_cache()
    sixbit.enable_delta_cache(model, sixbit.DeltaCacheConfig())
    model.enable_cache(config)  # diffusers cannot be stopped here: the first call refuses
    with pytest.raises(ValueError, match=message):
        _loop(tiny, model, {"t": 500.0})
    model.disable_cache()
    assert torch.isfinite(_loop(tiny, model)).all()


def test_a_conversion_with_the_delta_cache_refuses_a_diffusers_cache(folders):
    model = WanTransformer3DModel.from_pretrained(folders / "fp")
    model.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    with pytest.raises(ValueError, match="FirstBlockCacheConfig"):
        sixbit.convert_model(model, None, "tdc")
    assert not [m for m in model.modules() if isinstance(m, QuantLinear)]  # refused before anything changed


# ---- device and dtype moves -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cast", ["to(bfloat16)", "half()", "pipe.to(bfloat16)"])
def test_dtype_casts_keep_packed_layers_and_cast_the_rest(kind, cast, folders, tiny):
    """The same on every kind: full-precision parameters take the dtype, every tensor of a
    ``QuantLinear`` keeps its stored dtype (what ``torch_dtype=`` does at load), and ``.float()``
    goes back. diffusers' refusal for quantized models is lifted for sixbit's."""
    model = _make(kind, folders)
    reference, before = _call(tiny, model), _dtypes(model)
    model.to("cpu")
    assert torch.equal(_call(tiny, model), reference)
    dtype = torch.float16 if cast == "half()" else torch.bfloat16
    if cast == "pipe.to(bfloat16)":
        _pipe(model).to(dtype=dtype)
    else:
        assert (model.half() if cast == "half()" else model.to(dtype)) is model
    after, packed = _dtypes(model), _packed(model)
    assert all(after[n] == before[n] for n in packed)
    assert {after[n] for n in after if n not in packed and before[n].is_floating_point} == {dtype}
    low = _call(tiny, model, dtype)
    torch.testing.assert_close(low, reference, rtol=0.1, atol=0.05 * reference.abs().max().item())
    model.float()
    assert _dtypes(model) == before
    assert getattr(model, "is_quantized", False) == (kind != "convert_model")  # the flag itself stays


def test_an_nvfp4_layer_keeps_its_fp8_scales_through_half(folders, tiny):
    """The case that made casts matter: ``.half()`` used to turn NVFP4's FP8 block scales into fp16."""
    model = _convert(folders / "fp", "w4a8-rtn")
    reference = _call(tiny, model)
    scales = {n: t.dtype for n, t in model.state_dict().items() if n.endswith("weight_scales")}
    assert set(scales.values()) == {torch.float8_e4m3fn}
    model.half()
    assert {n: t.dtype for n, t in model.state_dict().items() if n.endswith("weight_scales")} == scales
    torch.testing.assert_close(_call(tiny, model, torch.float16), reference, rtol=0.1,
                               atol=0.05 * reference.abs().max().item())
